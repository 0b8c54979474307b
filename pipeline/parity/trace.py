"""Connector call traces: plain picklable events, appended as they happen.

Each vLLM process (scheduler, each worker) writes its own file. An event's
kind is the name of the connector method it records (get_num_new_matched_tokens,
wait_for_layer_load, ...; "init" for the construction), its fields that
method's arguments and its return value (ret). Every event carries the segment
(scenario) it belongs to: the driver names the current segment in a control
file, read by the recorder at each step. Traces are recorded afresh by each
parity run; none is kept in the repository.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

SEGMENT_FILE = "segment"


def plain_request(request) -> dict[str, Any]:
    return {
        "request_id": request.request_id,
        "all_token_ids": list(request.all_token_ids),
        "num_prompt_tokens": request.num_prompt_tokens,
        "cache_salt": request.cache_salt,
    }


def plain_scheduler_output(so) -> dict[str, Any]:
    cached = so.scheduled_cached_reqs
    return {
        "new": [(r.req_id, list(r.block_ids[0]), r.num_computed_tokens) for r in so.scheduled_new_reqs],
        "cached_req_ids": list(cached.req_ids),
        # vLLM 0.34 has no such list: it sends a resumed request again as a new one.
        "resumed": sorted(getattr(cached, "resumed_req_ids", ())),
        "new_block_ids": [None if b is None else list(b[0]) for b in cached.new_block_ids],
        "num_computed_tokens": list(cached.num_computed_tokens),
        "num_scheduled_tokens": dict(so.num_scheduled_tokens),
        "finished_req_ids": sorted(so.finished_req_ids),
    }


def plain_metadata(meta) -> dict[str, Any]:
    """Either implementation's connector metadata as comparable plain data."""

    def op(o):
        return tuple(o) if isinstance(o, tuple) else tuple(o.__dict__.values())

    def async_load(a):
        req_id, loads = (a[0], a[1]) if isinstance(a, tuple) else (a.req_id, a.loads)
        return (req_id, [op(o) for o in loads])

    return {
        "loads": [op(o) for o in meta.loads],
        "async_loads": [async_load(a) for a in getattr(meta, "async_loads", [])],
        "saves": [op(o) for o in meta.saves],
        "awaiting_free": list(meta.awaiting_free),
        "stage_blocks": list(meta.stage_blocks),
        "stage_rows": list(getattr(meta, "stage_rows", [])),
        "writeback_blocks": list(meta.writeback_blocks),
        "writeback_rows": list(getattr(meta, "writeback_rows", [])),
    }


def plain_worker_meta(wm) -> dict[str, list[int]] | None:
    if wm is None:
        return None
    fields = ("saved", "failed_saves", "loaded", "failed_loads", "quarantined")
    return {k: list(getattr(wm, k)) for k in fields}


class TraceWriter:
    def __init__(self, directory: Path, name: str):
        self.directory = directory
        self.path = directory / f"{name}.trace"
        self.path.touch()
        self._segment = ""

    def refresh_segment(self) -> None:
        try:
            self._segment = (self.directory / SEGMENT_FILE).read_text().strip()
        except FileNotFoundError:
            self._segment = ""

    def add(self, kind: str, **fields: Any) -> None:
        # Opened per event: the connector has no close call vLLM always makes,
        # and an in-process engine outlives no file it leaves open.
        with self.path.open("ab") as f:
            pickle.dump({"kind": kind, "segment": self._segment, **fields}, f)


def read_trace(path: Path) -> list[dict[str, Any]]:
    events = []
    with open(path, "rb") as f:
        while True:
            try:
                events.append(pickle.load(f))
            except EOFError:
                return events


def read_traces(directory: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The scheduler's and the worker's trace of one recorded session (a
    folder holding exactly one of each)."""
    sched = sorted(directory.glob("scheduler-*.trace"))
    workers = sorted(directory.glob("worker-*.trace"))
    if len(sched) != 1 or len(workers) != 1:
        raise SystemExit(
            f"{directory}: expected one scheduler and one worker trace, found {len(sched)} and {len(workers)}"
        )
    return read_trace(sched[0]), read_trace(workers[0])


def writer_from_env(name: str) -> TraceWriter:
    directory = Path(os.environ["ACTIVEKV_RECORD_DIR"])
    return TraceWriter(directory, f"{name}-{os.getpid()}")
