"""ActiveKV inside vLLM on a CUDA GPU, beside vLLM's own CPU offloading, on a
Llama-3-8B-geometry model with random weights made on the device (vLLM's
load_format="dummy": 32 layers, 32 query heads, 8 KV heads of 128, bf16).

    python -m bench.gpu_vllm ttft      [--lengths 8192,32768,131072] [--out FILE.json]
    python -m bench.gpu_vllm streaming [--budgets-gib 4,16] [--contexts 32768,131072]
                                                [--homes exact,compressed] [--resident-layers R]
                                                [--async-scheduling on|off] [--settle off,on] [--repeats 3]
                                                [--out FILE.json]
    python -m bench.gpu_vllm decode    [--lengths 8192,32768,131072] [--out FILE.json]
    python -m bench.gpu_vllm restart   [--lengths 32768,131072] [--store-dir /dev/shm] [--out FILE.json]

Run by ci/gpu-vllm-check.sh's environment (its PYTHONPATH), in vLLM's
default mode (compiled, FULL_AND_PIECEWISE CUDA graphs; PIECEWISE for a
connector that asks, as ActiveKV does only with layer streaming).

ttft: for each prompt length, in one process and one engine after another:
plain vLLM (recompute; its own GPU prefix hit; a miss), ActiveKV exact and
compressed (from the host store after vLLM's prefix cache is reset; a miss,
which also stores), vLLM's OffloadingConnector (from its CPU tier after the
reset). Each figure is the median of --repeats generate() calls for one token.
The bound of a host-store hit: its KV bytes over the pinned host->device peak
measured in the same run, plus the same request's GPU prefix hit.

streaming: decode step time with layer streaming in a device KV budget, from
the time of generate(N tokens) minus generate(1 token) on the same prompt
(both after a first generate(1) that settles what the prefill left in flight:
without it the 32k step read below the bus's own time, docs/benchmarks/history.md
2026-12-04 evening), the median of --repeats such pairs (each pair's step is
reported too), against the bus bound (the streamed bytes of a step, exact or
compressed as the homes hold them, over the same peak) and plain vLLM's
decode step with all KV on the device (a median alike). --contexts 0: the
longest context the budget serves.
--async-scheduling: vLLM's async scheduling on or off (its own choice unless
given; each run reports what it ran with). With it vLLM queues a step while
the last one runs, which the engine's stagings use by default (write-backs
settle across steps: a step's first layers cross during the last step's last
ones; ACTIVEKV_SETTLE_ACROSS_STEPS=0 in the environment settles them on the
host each step). --settle off,on: one LLM with it off and one with it on, side
by side (each run reports which; the environment's setting otherwise).

restart: the first request after a restart, with the host store in a file
(store_path): one vLLM with ActiveKV exact serves each prompt once (a miss:
recomputed, and stored), is shut down, and a new vLLM on the same file serves
the same prompts (each its first request for that prompt: from the file),
then a prompt nobody stored (recompute). Start times of both say what the
restart's reopen costs (every sealed slot verified). The worker's start-up line
says whether the file's mapping is pinned for the device.

decode: what a connector costs each decode step with all KV on the device
(no streaming): for each engine, the step time from generate(N) minus
generate(1) on a prompt vLLM holds (so prefill is its GPU hit), after the
miss that stored it. Each engine's CUDA graph mode is reported with it;
plain-piecewise (plain vLLM forced to PIECEWISE) shows what the mode alone
costs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pipeline.vllm_driver.llm import shutdown

GIB = 1 << 30
LLAMA3_8B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 128256,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 1 << 21,
    "rope_theta": 500000.0,
    "rms_norm_eps": 1e-5,
    "torch_dtype": "bfloat16",
    "bos_token_id": 1,
    "eos_token_id": 2,
    "tie_word_embeddings": False,
}
BLOCK = 16  # tokens a block: vLLM's default on CUDA before 0.34 (64 since); --block-size
KV_BYTES_PER_TOKEN_LAYER = 2 * 8 * 128 * 2  # K and V, 8 heads of 128, bf16
CAPTURE_SIZES = [1, 2, 4, 8, 16, 32]


def model_dir() -> Path:
    path = Path(tempfile.gettempdir()) / "activekv-llama3-8b-geometry"
    path.mkdir(exist_ok=True)
    (path / "config.json").write_text(json.dumps(LLAMA3_8B))
    return path


def pinned_peak_gbps() -> float:
    """Pinned host->device GB/s for 1 GiB, best of 5 (the bus's bound here)."""
    import torch

    host = torch.empty(GIB, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(GIB, dtype=torch.uint8, device="cuda")
    best = 0.0
    for _ in range(5):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        dev.copy_(host, non_blocking=True)
        torch.cuda.synchronize()
        best = max(best, GIB / (time.perf_counter() - t0) / 1e9)
    del host, dev
    return best


EAGER = os.environ.get("ACTIVEKV_BENCH_EAGER") == "1"  # vLLM's eager mode instead of its default


def make_llm(
    connector: str | None,
    extra: dict | None,
    *,
    max_model_len: int,
    kv_cache_bytes: int | None = None,
    cudagraph_mode: str | None = None,
    async_scheduling: bool | None = None,
):
    from vllm import LLM
    from vllm.config import KVTransferConfig

    kw: dict[str, Any] = {}
    if connector:
        kw["kv_transfer_config"] = KVTransferConfig(
            kv_connector=connector, kv_role="kv_both", kv_connector_extra_config=extra or {}
        )
    if kv_cache_bytes:
        kw["kv_cache_memory_bytes"] = kv_cache_bytes
    if async_scheduling is not None:
        kw["async_scheduling"] = async_scheduling
    # gpu_memory_utilization set: vLLM 0.34's extensible KV cache otherwise
    # takes the whole device, leaving no room for a connector's own buffers.
    return LLM(
        model=str(model_dir()),
        load_format="dummy",
        skip_tokenizer_init=True,
        dtype="bfloat16",
        max_model_len=max_model_len,
        gpu_memory_utilization=0.85,
        block_size=BLOCK,
        enable_prefix_caching=True,
        seed=0,
        disable_log_stats=connector is None,
        max_num_batched_tokens=8192,
        **(
            {"enforce_eager": True}
            if EAGER
            else {
                "compilation_config": {
                    "cudagraph_capture_sizes": CAPTURE_SIZES,
                    **({"cudagraph_mode": cudagraph_mode} if cudagraph_mode else {}),
                }
            }
        ),
        **kw,
    )


def timed_generate(llm, prompt: list[int], salt: str, max_tokens: int = 1) -> float:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    t0 = time.perf_counter()
    llm.generate(
        [TokensPrompt(prompt_token_ids=prompt, cache_salt=salt)],
        SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, detokenize=False),
        use_tqdm=False,
    )
    return time.perf_counter() - t0


def decode_steps(
    llm, prompt: list[int], salt: str, decode_tokens: int, repeats: int
) -> tuple[list[float], list[float]]:
    """`repeats` pairs of generate(1) and generate(decode_tokens) on a prompt
    the engine already holds: each pair's generate(1) time and its decode step
    (the difference over decode_tokens - 1)."""
    ones, steps = [], []
    for _ in range(repeats):
        ones.append(timed_generate(llm, prompt, salt, 1))
        many = timed_generate(llm, prompt, salt, decode_tokens)
        steps.append((many - ones[-1]) / (decode_tokens - 1))
    return ones, steps


def prompt_of(n: int, seed: int) -> list[int]:
    import random

    rng = random.Random(seed)
    return [rng.randrange(10, 128000) for _ in range(n)]


def cudagraph_mode(llm) -> str:
    return llm.llm_engine.vllm_config.compilation_config.cudagraph_mode.name


def median_ms(xs: list[float]) -> float:
    return round(1000 * statistics.median(xs), 2)


ENGINES = {
    "plain": (None, None),
    # Plain vLLM in the graph mode a connector with per-layer hooks runs:
    # what the mode alone costs a decode step (`decode`).
    "plain-piecewise": (None, None),
    "activekv-exact": ("ActiveKVHostConnector", {"mode": "exact", "capacity_bytes": 32 * GIB}),
    "activekv-compressed": ("ActiveKVHostConnector", {"mode": "compressed", "capacity_bytes": 32 * GIB}),
    "vllm-offloading": ("OffloadingConnector", {"cpu_bytes_to_use": 32 * GIB}),
}


def ttft(lengths: list[int], repeats: int, engines: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "peak_h2d_gbps": round(pinned_peak_gbps(), 2),
        "lengths": lengths,
        "repeats": repeats,
        "engines": {},
    }
    max_len = max(lengths) + 64
    for name in engines:
        connector, extra = ENGINES[name]
        t0 = time.perf_counter()
        llm = make_llm(connector, extra, max_model_len=max_len)
        row: dict[str, Any] = {
            "start_s": round(time.perf_counter() - t0, 1),
            "cudagraph_mode": cudagraph_mode(llm),
            "by_length": {},
        }
        print(f"{name}: started in {row['start_s']} s, {row['cudagraph_mode']}", flush=True)
        timed_generate(llm, prompt_of(2048, 0), "warm-up")
        for n in lengths:
            prompt = prompt_of(n, n)
            cell: dict[str, Any] = {}
            # A miss: a fresh salt each time (with a connector it also stores).
            cell["miss_ms"] = median_ms([timed_generate(llm, prompt, f"miss-{n}-{i}") for i in range(repeats)])
            # vLLM's own GPU prefix hit on the last miss's blocks.
            cell["gpu_hit_ms"] = median_ms(
                [timed_generate(llm, prompt, f"miss-{n}-{repeats - 1}") for _ in range(repeats)]
            )
            if connector:
                hits = []
                for _ in range(repeats):
                    llm.reset_prefix_cache()
                    hits.append(timed_generate(llm, prompt, f"miss-{n}-{repeats - 1}"))
                cell["host_hit_ms"] = median_ms(hits)
            row["by_length"][str(n)] = cell
            print(f"  {name} {n}: {cell}", flush=True)
        out["engines"][name] = row
        shutdown(llm)
    peak = out["peak_h2d_gbps"] * 1e9
    for n in lengths:
        kv = (n - 1) // BLOCK * BLOCK * KV_BYTES_PER_TOKEN_LAYER * LLAMA3_8B["num_hidden_layers"]
        gpu_hit = out["engines"].get("plain", {}).get("by_length", {}).get(str(n), {}).get("gpu_hit_ms")
        out.setdefault("bounds", {})[str(n)] = {
            "kv_bytes": kv,
            "bus_ms": round(1000 * kv / peak, 2),
            "host_hit_bound_ms": None if gpu_hit is None else round(1000 * kv / peak + gpu_hit, 2),
        }
    return out


# Resident layers per budget: the homes of the streamed layers hold every
# device block (blocks x streamed layers x page of host memory, plus the
# rows' slack), and the GPU machine has 128 GiB: both budgets then hold 16384
# blocks (262,144 tokens). --resident-layers overrides (R = 0 for the longest
# contexts: a 5.5 GiB budget then holds 45,056 blocks, 720k tokens, whose
# exact homes take 93.5 GiB).
STREAMING_GEOMETRY = {4: {"resident_layers": 2, "ring_size": 2}, 16: {"resident_layers": 14, "ring_size": 2}}


def home_bytes(homes: str) -> int:
    """Host bytes of one layer's block in the homes, as the codec lays them out."""
    import torch

    from pipeline.vllm_driver import llm as h

    h.reference_on_path()
    from activekv_reference.codec import layer_bytes

    return layer_bytes(homes, BLOCK * KV_BYTES_PER_TOKEN_LAYER // 2, torch.bfloat16, LLAMA3_8B["head_dim"])


def streaming(
    budgets_gib: list[float],
    contexts: list[int],
    decode_tokens: int,
    repeats: int,
    homes: list[str],
    resident_layers: int | None = None,
    with_plain: bool = True,
    async_scheduling: bool | None = None,
    settle: list[bool] | None = None,
) -> dict[str, Any]:
    out: dict[str, Any] = {"peak_h2d_gbps": round(pinned_peak_gbps(), 2), "runs": []}
    settings = settle or [os.environ.get("ACTIVEKV_SETTLE_ACROSS_STEPS") != "0"]
    peak = out["peak_h2d_gbps"] * 1e9
    layers = LLAMA3_8B["num_hidden_layers"]
    page = BLOCK * KV_BYTES_PER_TOKEN_LAYER
    for budget in budgets_gib:
        geometry = dict(STREAMING_GEOMETRY.get(budget, {"resident_layers": 0, "ring_size": 2}))
        if resident_layers is not None:
            geometry["resident_layers"] = resident_layers
        budget_bytes = int(budget * GIB)
        regions = geometry["resident_layers"] + geometry["ring_size"]
        expected_blocks = budget_bytes // (regions * page)
        longest = (expected_blocks - 2) * BLOCK
        max_len = max(contexts) + decode_tokens + 64 if 0 not in contexts else longest
        for kind, settled in [(k, on) for k in homes for on in settings]:
            config = {**geometry, "homes": kind}
            block_bytes = home_bytes(kind)
            # Read by each worker at start-up (vLLM's engine process inherits it).
            os.environ["ACTIVEKV_SETTLE_ACROSS_STEPS"] = "1" if settled else "0"
            t0 = time.perf_counter()
            llm = make_llm(
                "ActiveKVHostConnector",
                {"streaming": config, "capacity_bytes": 1 * GIB},
                max_model_len=max_len,
                kv_cache_bytes=budget_bytes,
                async_scheduling=async_scheduling,
            )
            start_s = round(time.perf_counter() - t0, 1)
            blocks = llm.llm_engine.vllm_config.cache_config.num_gpu_blocks
            plain_blocks = budget_bytes // (layers * page)
            for n in contexts:
                if n == 0:  # the longest context the budget serves
                    n = (blocks - 2) * BLOCK - decode_tokens
                prompt = prompt_of(n - decode_tokens, 7 + n)
                first = timed_generate(llm, prompt, f"s{n}", 1)  # prefill (+ 1 token)
                first_hit = timed_generate(llm, prompt, f"s{n}", 1)  # settles the prefill's leftovers
                ones, steps = decode_steps(llm, prompt, f"s{n}", decode_tokens, repeats)  # prefix hits
                one, step = statistics.median(ones), statistics.median(steps)
                streamed = (layers - geometry["resident_layers"]) * -(-n // BLOCK) * block_bytes
                measured = {
                    "budget_gib": budget,
                    **config,
                    "context": n,
                    "start_s": start_s,
                    "device_blocks": blocks,
                    "serves_tokens": (blocks - 1) * BLOCK,
                    "plain_serves_tokens": (plain_blocks - 1) * BLOCK,
                    "cudagraph_mode": cudagraph_mode(llm),
                    "async_scheduling": bool(llm.llm_engine.vllm_config.scheduler_config.async_scheduling),
                    "settle_across_steps": settled,
                    # The A/B against ATen's operations turns compressed homes' fused
                    # kernels off; kernels that failed to compile show only in the
                    # worker's start-up line.
                    "fused_codec_turned_off": os.environ.get("ACTIVEKV_FUSED_CODEC") == "0",
                    "prefill_s": round(first, 2),
                    "first_hit_ms": round(1000 * first_hit, 2),
                    "hit_ms": round(1000 * one, 2),
                    "decode_step_ms": round(1000 * step, 2),
                    "decode_step_samples_ms": [round(1000 * x, 2) for x in steps],
                    "tokens_per_s": round(1 / step, 2),
                    "bus_bound_ms": round(1000 * streamed / peak, 2),
                }
                measured["x_bound"] = round(measured["decode_step_ms"] / measured["bus_bound_ms"], 3)
                out["runs"].append(measured)
                print(json.dumps(measured), flush=True)
            shutdown(llm)
    # Plain vLLM's decode step with all KV on the device, at the same contexts.
    plain_contexts = [n for n in contexts if n] if with_plain else []
    if not plain_contexts:  # the longest contexts only: plain vLLM cannot hold them
        return out
    llm = make_llm(
        None, None, max_model_len=max(plain_contexts) + decode_tokens + 64, async_scheduling=async_scheduling
    )
    for n in plain_contexts:
        prompt = prompt_of(n - decode_tokens, 7 + n)
        timed_generate(llm, prompt, "p", 1)
        _, steps = decode_steps(llm, prompt, "p", decode_tokens, repeats)  # as ActiveKV's: a median
        out.setdefault("plain_decode_step_ms", {})[str(n)] = round(1000 * statistics.median(steps), 2)
    out["plain_cudagraph_mode"] = cudagraph_mode(llm)
    shutdown(llm)
    print(json.dumps({"plain_decode_step_ms": out["plain_decode_step_ms"]}), flush=True)
    return out


def decode(lengths: list[int], repeats: int, engines: list[str], decode_tokens: int) -> dict[str, Any]:
    out: dict[str, Any] = {"lengths": lengths, "repeats": repeats, "decode_tokens": decode_tokens, "engines": {}}
    for name in engines:
        connector, extra = ENGINES[name]
        llm = make_llm(
            connector,
            extra,
            max_model_len=max(lengths) + decode_tokens + 64,
            cudagraph_mode="PIECEWISE" if name == "plain-piecewise" else None,
        )
        row: dict[str, Any] = {"cudagraph_mode": cudagraph_mode(llm), "decode_step_ms": {}}
        timed_generate(llm, prompt_of(2048, 0), "warm-up", decode_tokens)
        for n in lengths:
            prompt = prompt_of(n - decode_tokens, 11 + n)
            timed_generate(llm, prompt, f"d{n}", 1)  # the miss: prefill (and, with a connector, its save)
            _, steps = decode_steps(llm, prompt, f"d{n}", decode_tokens, repeats)
            row["decode_step_ms"][str(n)] = median_ms(steps)
        print(f"  {name}: {row}", flush=True)
        out["engines"][name] = row
        shutdown(llm)
    plain = out["engines"].get("plain", {}).get("decode_step_ms", {})
    for name, row in out["engines"].items():
        if plain and name != "plain":
            row["x_plain"] = {n: round(ms / plain[n], 3) for n, ms in row["decode_step_ms"].items()}
    return out


def restart(lengths: list[int], store_dir: str) -> dict[str, Any]:
    path = Path(store_dir) / "activekv-bench-restart-store"
    for stale in (path, Path(f"{path}.index")):
        stale.unlink(missing_ok=True)
    # Room for every prompt twice (the restarted vLLM stores the prompts nobody
    # stored too) and the warm-ups: no eviction, so every hit is whole.
    capacity = 2 * sum(lengths) * KV_BYTES_PER_TOKEN_LAYER * LLAMA3_8B["num_hidden_layers"] + GIB
    extra = {"mode": "exact", "capacity_bytes": capacity, "store_path": str(path)}
    max_len = max(lengths) + 64
    out: dict[str, Any] = {
        "peak_h2d_gbps": round(pinned_peak_gbps(), 2),
        "lengths": lengths,
        "capacity_gib": round(capacity / GIB, 2),
        "store": str(path),
        "by_length": {},
    }
    t0 = time.perf_counter()
    llm = make_llm("ActiveKVHostConnector", extra, max_model_len=max_len)
    out["first_start_s"] = round(time.perf_counter() - t0, 1)
    try:
        timed_generate(llm, prompt_of(2048, 0), "warm-up")
        for n in lengths:
            out["by_length"][str(n)] = {
                "recompute_ms": round(1000 * timed_generate(llm, prompt_of(n, n), "restart"), 1)
            }
    finally:
        shutdown(llm)
    t0 = time.perf_counter()
    llm = make_llm("ActiveKVHostConnector", extra, max_model_len=max_len)
    out["restart_s"] = round(time.perf_counter() - t0, 1)
    try:
        timed_generate(llm, prompt_of(2048, 1), "warm-up")  # not stored before: a recompute
        for n in lengths:
            cell = out["by_length"][str(n)]
            cell["from_store_ms"] = round(1000 * timed_generate(llm, prompt_of(n, n), "restart"), 1)
            cell["recompute_after_restart_ms"] = round(1000 * timed_generate(llm, prompt_of(n, n + 1), "restart"), 1)
            kv = (n - 1) // BLOCK * BLOCK * KV_BYTES_PER_TOKEN_LAYER * LLAMA3_8B["num_hidden_layers"]
            cell["kv_gib"] = round(kv / GIB, 2)
            cell["x_faster"] = round(cell["recompute_ms"] / cell["from_store_ms"], 2)
            print(f"  restart {n}: {cell}", flush=True)
    finally:
        shutdown(llm)
    for stale in (path, Path(f"{path}.index")):
        stale.unlink(missing_ok=True)
    return out


def main(argv: list[str] | None = None) -> int:
    global BLOCK
    parser = argparse.ArgumentParser(
        prog="python -m bench.gpu_vllm",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("what", choices=["ttft", "streaming", "decode", "restart"])
    parser.add_argument("--lengths", default="8192,32768,131072")
    parser.add_argument("--engines", default=",".join(e for e in ENGINES if e != "plain-piecewise"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--budgets-gib", default="4,16")
    parser.add_argument("--homes", default="exact", help="exact,compressed: streaming's homes, one LLM each")
    parser.add_argument("--resident-layers", type=int, help="streaming's R for every budget")
    parser.add_argument(
        "--no-plain",
        action="store_true",
        help="streaming: leave out plain vLLM's decode step with all KV on the device",
    )
    parser.add_argument("--contexts", default="32768,131072", help="0 for the longest context the budget serves")
    parser.add_argument("--decode-tokens", type=int, default=17)
    parser.add_argument(
        "--async-scheduling",
        choices=["on", "off"],
        help="streaming: vLLM's async scheduling (its own choice unless given)",
    )
    parser.add_argument(
        "--settle",
        help="streaming: off,on: write-backs settling across steps, "
        "an LLM each (ACTIVEKV_SETTLE_ACROSS_STEPS otherwise)",
    )
    parser.add_argument("--store-dir", default="/dev/shm", help="restart: where the store file goes")
    parser.add_argument("--block-size", type=int, default=BLOCK, help="tokens a KV block, every engine")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    BLOCK = args.block_size
    if args.repeats < 1:
        parser.error(f"--repeats {args.repeats}: at least 1")
    if args.settle and set(args.settle.split(",")) - {"on", "off"}:
        parser.error(f"--settle {args.settle}: a comma-separated list of on and off")
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    if args.what == "ttft":
        result = ttft([int(x) for x in args.lengths.split(",")], args.repeats, args.engines.split(","))
    elif args.what == "restart":
        result = restart([int(x) for x in args.lengths.split(",")], args.store_dir)
    elif args.what == "decode":
        result = decode(
            [int(x) for x in args.lengths.split(",")], args.repeats, args.engines.split(","), args.decode_tokens
        )
    else:
        result = streaming(
            [float(x) for x in args.budgets_gib.split(",")],
            [int(x) for x in args.contexts.split(",")],
            args.decode_tokens,
            args.repeats,
            args.homes.split(","),
            args.resident_layers,
            not args.no_plain,
            None if args.async_scheduling is None else args.async_scheduling == "on",
            [x == "on" for x in args.settle.split(",")] if args.settle else None,
        )
    import torch
    import vllm

    result["eager"], result["block_size"] = EAGER, BLOCK
    result["machine"] = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "vllm": vllm.__version__}
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
