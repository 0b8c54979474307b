"""What every GPU benchmark of vLLM here shares: the Llama-3-8B-geometry
model, the LLM as each engine is made, the timed calls, the bus's peak."""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

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


def kv_bytes(tokens: int) -> int:
    """KV bytes of a prompt's whole blocks (every layer): what a host hit moves."""
    return (tokens - 1) // BLOCK * BLOCK * KV_BYTES_PER_TOKEN_LAYER * LLAMA3_8B["num_hidden_layers"]
