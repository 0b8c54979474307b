"""Drives real vLLM offline with token-id prompts and reads ActiveKV telemetry.

Shared by the tests and the parity harness.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import random
import sys
from collections.abc import Sequence
from typing import Any

from .tiny_model import CONFIG, FIRST_TOKEN, VOCAB, head_size

BLOCK_SIZE = 32  # the CPU backend wants a multiple of 32
MAX_MODEL_LEN = 2304
# One more than a max_model_len request needs (vLLM keeps one null block):
# any request of max_model_len tokens pushes everything else out.
NUM_DEVICE_BLOCKS = MAX_MODEL_LEN // BLOCK_SIZE + 1
MAX_TOKENS = 16
# The two implementations of the connector under test: the Python reference,
# loaded by module path, and the native engine, loaded by the name its wheel's
# vllm.general_plugins entry point registers.
CONNECTORS = {
    "reference": {"kv_connector": "ActiveKVReferenceConnector",
                  "kv_connector_module_path": "activekv_reference"},
    "native": {"kv_connector": "ActiveKVConnector"},
}
# The reference wrapped by the parity recorder (not an implementation under test).
RECORDER = {"kv_connector": "RecordingReferenceConnector",
            "kv_connector_module_path": "pipeline.parity.recorder"}
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def reference_on_path() -> None:
    """Put the reference (never installed) and this repo on the import path of
    this process and of the vLLM processes it starts."""
    paths = [os.path.join(ROOT, "engine", "reference"), ROOT]
    for p in reversed(paths):
        if p not in sys.path:
            sys.path.insert(0, p)
    current = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = os.pathsep.join([*paths, *([current] if current else [])])


@dataclasses.dataclass(frozen=True)
class Result:
    tokens: tuple[int, ...]
    num_cached_tokens: int


def make_llm(
    model_path,
    extra_config: dict[str, Any] | None = None,
    *,
    connector: str | dict | None,
    tensor_parallel_size: int = 1,
):
    """An LLM on the tiny model with the named connector (None: without ActiveKV).

    vLLM keeps its metrics in one process-wide registry that every LLM with
    stats enabled resets: only the connector LLM made last has readable
    telemetry. The baseline (connector=None) runs with stats off, so it can
    live beside one connector LLM.
    """
    from vllm import LLM
    from vllm.config import KVTransferConfig

    kwargs = {}
    if connector is not None:
        kwargs["kv_transfer_config"] = KVTransferConfig(
            **(CONNECTORS[connector] if isinstance(connector, str) else connector),
            kv_role="kv_both",
            kv_connector_extra_config=extra_config or {},
        )
    return LLM(
        model=str(model_path),
        skip_tokenizer_init=True,
        dtype="bfloat16",
        block_size=BLOCK_SIZE,
        max_model_len=MAX_MODEL_LEN,
        num_gpu_blocks_override=NUM_DEVICE_BLOCKS,
        gpu_memory_utilization=0.3,
        enforce_eager=True,
        disable_log_stats=connector is None,  # ActiveKV telemetry reaches us through the metrics
        seed=0,
        tensor_parallel_size=tensor_parallel_size,
        **kwargs,
    )


def shutdown(llm) -> None:
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()


def generate(llm, prompts: Sequence[Sequence[int]], *, salt: str | None = None) -> list[Result]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    inputs = []
    for p in prompts:
        prompt = TokensPrompt(prompt_token_ids=list(p))
        if salt is not None:
            prompt["cache_salt"] = salt
        inputs.append(prompt)
    outputs = llm.generate(inputs, params, use_tqdm=False)
    return [Result(tuple(o.outputs[0].token_ids), o.num_cached_tokens) for o in outputs]


def telemetry(llm) -> dict[str, float]:
    """ActiveKV's counters since the LLM started, from vLLM's metrics."""
    prefix = "vllm:activekv_"
    return {m.name[len(prefix) :]: m.value for m in llm.get_metrics() if m.name.startswith(prefix)}


class TelemetryDelta:
    """Counters moved by the code run inside ``with``."""

    def __init__(self, llm):
        self.llm = llm
        self.delta: dict[str, float] = {}

    def __enter__(self) -> dict[str, float]:
        self._before = telemetry(self.llm)
        return self.delta

    def __exit__(self, *exc) -> None:
        after = telemetry(self.llm)
        self.delta.update({k: v - self._before.get(k, 0) for k, v in after.items()})


def random_tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(FIRST_TOKEN, VOCAB) for _ in range(n)]


def flush_device_cache(llm) -> None:
    """Drop vLLM's own prefix cache (the host store is kept)."""
    if not llm.reset_prefix_cache():
        raise RuntimeError("vLLM refused to reset its prefix cache")


def exact_block_bytes() -> int:
    """Host bytes of one block in exact mode: K and V of every layer, bf16."""
    per_layer = 2 * BLOCK_SIZE * CONFIG["num_key_value_heads"] * head_size() * 2
    return CONFIG["num_hidden_layers"] * per_layer


def reusable_tokens(prompt_len: int) -> int:
    """Tokens of a prompt a prefix cache can serve: full blocks, never the last token."""
    return (prompt_len - 1) // BLOCK_SIZE * BLOCK_SIZE
