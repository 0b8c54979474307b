"""What each connector method costs per call on a step that moves no block,
for the reference and the native engine (outside vLLM, vLLM's config classes).
A no-op Python call is printed beside them: the floor of any call.

    python -m bench.calls [--repeats 5] [--number 100000]
"""

from __future__ import annotations

import argparse
import timeit

from pipeline.vllm_driver import llm as h
from pipeline.parity.replay import scheduler_output_from_plain
from pipeline.vllm_driver.standalone import kv_cache_config, kv_caches, make_pair

NO_REQUESTS = {
    "cached_req_ids": [],
    "resumed": [],
    "new_block_ids": [],
    "num_computed_tokens": [],
    "new": [],
    "num_scheduled_tokens": {},
    "finished_req_ids": [],
}


def idle_calls(impl: str) -> dict:
    """The calls vLLM makes on a step that moves nothing, on a fresh pair."""
    cfg = kv_cache_config()
    sched, worker = make_pair(impl, {}, cfg)
    worker.register_kv_caches(kv_caches(cfg))
    so = scheduler_output_from_plain(NO_REQUESTS)
    meta = sched.build_connector_meta(so)
    worker.bind_connector_metadata(meta)
    calls = {
        "build_connector_meta": lambda: sched.build_connector_meta(so),
        "bind_connector_metadata": lambda: worker.bind_connector_metadata(meta),
        "start_load_kv": lambda: worker.start_load_kv(None),
        "wait_for_save": worker.wait_for_save,
        "get_finished": lambda: worker.get_finished(set()),
        "get_block_ids_with_load_errors": worker.get_block_ids_with_load_errors,
        "build_connector_worker_meta": worker.build_connector_worker_meta,
        "get_kv_connector_stats": worker.get_kv_connector_stats,
    }
    # Only where the engine has them (the reference has neither).
    if hasattr(worker, "has_layer_work"):
        calls["has_layer_work"] = worker.has_layer_work
    if hasattr(sched, "has_pending_push_work"):
        calls["has_pending_push_work"] = sched.has_pending_push_work
    return calls


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.calls")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--number", type=int, default=100_000)
    args = parser.parse_args()
    h.reference_on_path()

    def per_call_ns(fn) -> float:
        return 1e9 * min(timeit.repeat(fn, number=args.number, repeat=args.repeats)) / args.number

    table = {impl: {name: per_call_ns(fn) for name, fn in idle_calls(impl).items()} for impl in ("reference", "native")}
    floor = per_call_ns(lambda: None)
    print(
        f"per call on a step that moves no block (best of {args.repeats} x {args.number}); "
        f"a no-op Python call: {floor:.0f} ns"
    )
    print(f"  {'method':32}{'reference':>11}{'native':>9}")
    for name in table["native"]:
        ref = table["reference"].get(name)
        print(f"  {name:32}{'-' if ref is None else f'{ref:.0f} ns':>11}{table['native'][name]:6.0f} ns")


if __name__ == "__main__":
    main()
