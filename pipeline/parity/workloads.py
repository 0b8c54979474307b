"""The parity scenarios: vLLM workloads, one segment (cell) each.

Scenarios that share a connector configuration run in one vLLM session, in
order; a cell's replay therefore starts from the state its session left.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..vllm_driver import llm as h
from ..vllm_driver.tiny_model import STREAMING_LAYERS
from .trace import SEGMENT_FILE

BS = h.BLOCK_SIZE


@dataclass(frozen=True)
class Session:
    name: str
    extra_config: dict
    scenarios: list[tuple[str, Callable]]
    num_layers: int | None = None  # the tiny model's (None: its default)
    llm_options: dict = field(default_factory=dict)  # make_llm's keyword arguments

    @property
    def streams(self) -> bool:
        return "streaming" in self.extra_config

    def cell_names(self) -> list[str]:
        """The replay cells of these scenarios, recorded in one vLLM: each, and without
        streaming (which has vLLM capture piecewise graphs only), the same
        scenario under a full CUDA graph."""
        names = [name for name, _ in self.scenarios]
        return names if self.streams else names + [full_graph_cell(n) for n in names]


def full_graph_cell(scenario: str) -> str:
    return f"{scenario}, full CUDA graph"


def _tokens(seed: int, n: int) -> list[int]:
    return h.random_tokens(random.Random(seed), n)


# -- default store ---------------------------------------------------------------
P1 = _tokens(101, 5 * BS + 3)


def miss(llm):
    h.generate(llm, [P1])


def full_hit(llm):
    h.flush_device_cache(llm)
    h.generate(llm, [P1])


def partial_hit(llm):
    h.flush_device_cache(llm)
    h.generate(llm, [P1[: 3 * BS] + _tokens(102, 2 * BS + 5)])


def salt_isolation(llm):
    h.flush_device_cache(llm)
    h.generate(llm, [P1], salt="tenant-b")
    h.flush_device_cache(llm)
    h.generate(llm, [P1], salt="tenant-b")
    h.generate(llm, [P1])


def mixed_batch(llm):
    shared = _tokens(103, 4 * BS)
    batch = [shared + _tokens(104 + i, n) for i, n in enumerate((5, 40, 150, 1))]
    batch += [_tokens(110 + i, n) for i, n in enumerate((17, 300, 3 * BS, 2 * BS + 1))]
    h.generate(llm, batch)
    h.flush_device_cache(llm)
    h.generate(llm, batch)


def long_prompt(llm):
    prompt = _tokens(120, 2048 + 9)
    h.generate(llm, [prompt])
    h.flush_device_cache(llm)
    h.generate(llm, [prompt])


def aborted_request(llm):
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    prompt = _tokens(121, 12 * BS + 4)
    engine = llm.llm_engine
    engine.add_request(
        "aborted-0",
        TokensPrompt(prompt_token_ids=prompt),
        SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True),
    )
    for _ in range(4):  # prefill and a few decode steps, then abort mid-flight
        engine.step()
    engine.abort_request(["aborted-0"])
    while engine.has_unfinished_requests():
        engine.step()
    h.flush_device_cache(llm)
    h.generate(llm, [prompt])


def preemption_and_resume(llm):
    # Two long requests decoding together need more device blocks than vLLM
    # has (NUM_DEVICE_BLOCKS): one is preempted and later resumed.
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    prompts = [_tokens(130 + i, 1100) for i in range(2)]
    params = SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True)
    h.flush_device_cache(llm)
    llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)


def many_running(llm):
    # A serving-sized batch: 48 requests decoding together, half sharing a prefix.
    shared = _tokens(122, 2 * BS)
    prompts = [shared + _tokens(123 + i, 40) if i % 2 else _tokens(123 + i, 100) for i in range(48)]
    h.flush_device_cache(llm)
    h.generate(llm, prompts)


# -- small store ------------------------------------------------------------------
def eviction_under_pressure(llm):
    p = [_tokens(140 + i, 4 * BS + 1) for i in range(3)]
    for prompt in (p[0], p[1], p[0], p[2], p[0], p[1]):
        h.flush_device_cache(llm)
        h.generate(llm, [prompt])


# -- admission policy -------------------------------------------------------------
def store_threshold(llm):
    prompt = _tokens(150, 4 * BS + 1)
    for _ in range(3):
        h.flush_device_cache(llm)
        h.generate(llm, [prompt])


def per_request_cap(llm):
    prompt = _tokens(151, 10 * BS + 1)
    for _ in range(3):
        h.flush_device_cache(llm)
        h.generate(llm, [prompt])


def decode_blocks(llm):
    prompt = _tokens(152, 2 * BS + 20)
    first = h.generate(llm, [prompt])[0]
    h.flush_device_cache(llm)
    h.generate(llm, [prompt])
    h.flush_device_cache(llm)
    h.generate(llm, [prompt + list(first.tokens) + _tokens(153, 5)])


# -- layer streaming: the deep tiny model in a budget that holds 1/8 of the context --
def streaming_long_context(llm):
    h.flush_device_cache(llm)
    h.generate(llm, [_tokens(160, h.STREAMING_CONTEXT - h.MAX_TOKENS)])


def streaming_prefix_hit(llm):
    # The context's blocks come back from the host store into the ring.
    h.flush_device_cache(llm)
    h.generate(llm, [_tokens(160, h.STREAMING_CONTEXT - h.MAX_TOKENS)])


def streaming_preemption(llm):
    # Two requests that together need more blocks than streaming holds: one
    # is preempted, then resumed (recomputed, or reloaded from the host store).
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    h.flush_device_cache(llm)
    prompts = [_tokens(161 + i, h.STREAMING_CONTEXT // 2 - 200) for i in range(2)]
    params = SamplingParams(max_tokens=400, temperature=0.0, ignore_eos=True)
    llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)


def streaming_many(llm):
    shared = _tokens(163, BS)
    prompts = [shared + _tokens(164 + i, 20) if i % 2 else _tokens(164 + i, 40) for i in range(48)]
    h.flush_device_cache(llm)
    h.generate(llm, prompts)


def streaming_abort(llm):
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    h.flush_device_cache(llm)
    engine = llm.llm_engine
    engine.add_request(
        "aborted-streaming",
        TokensPrompt(prompt_token_ids=_tokens(165, 30 * BS + 7)),
        SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True),
    )
    engine.add_request(
        "beside-it",
        TokensPrompt(prompt_token_ids=_tokens(166, 10 * BS)),
        SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True),
    )
    for _ in range(3):  # its prefill and a few decode steps, each staging its layers
        engine.step()
    engine.abort_request(["aborted-streaming"])
    while engine.has_unfinished_requests():
        engine.step()


def streaming_fragmented_homes(llm):
    # Ten requests of 1-5 blocks that finish at different steps leave the free
    # home rows in pieces (extents are 8 rows at this cache's size); then a
    # request of 20 blocks takes its rows from what is free, and its decode
    # outgrows that extent, crossing two block boundaries.
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    h.flush_device_cache(llm)
    engine = llm.llm_engine
    for i in range(10):
        engine.add_request(
            f"fragment-{i}",
            TokensPrompt(prompt_token_ids=_tokens(170 + i, (1 + i % 5) * BS + 3)),
            SamplingParams(max_tokens=1 + 7 * (i % 4), temperature=0.0, ignore_eos=True),
        )
    while engine.has_unfinished_requests():
        engine.step()
    params = SamplingParams(max_tokens=BS + 10, temperature=0.0, ignore_eos=True)
    llm.generate([TokensPrompt(prompt_token_ids=_tokens(185, 20 * BS - 5))], params, use_tqdm=False)


def sessions(mode: str) -> list[Session]:
    return store_sessions(mode) + streaming_sessions(mode)


def store_sessions(mode: str) -> list[Session]:
    one_block = h.exact_block_bytes()
    return [
        Session(
            "default",
            {"mode": mode},
            [
                ("miss", miss),
                ("full hit", full_hit),
                ("partial hit", partial_hit),
                ("salt isolation", salt_isolation),
                ("mixed batch", mixed_batch),
                ("prompt of 2k tokens", long_prompt),
                ("aborted request", aborted_request),
                ("preemption and resume", preemption_and_resume),
                ("48 requests running", many_running),
            ],
        ),
        # Hits of two blocks or more load while vLLM parks their request
        # (WAITING_FOR_REMOTE_KVS): the same hits as the default session's.
        Session(
            "async-loads",
            {"mode": mode, "async_load_min_tokens": 2 * BS},
            [
                ("async loads: miss", miss),
                ("async loads: full hit", full_hit),
                ("async loads: partial hit", partial_hit),
                ("async loads: mixed batch", mixed_batch),
                ("async loads: preemption and resume", preemption_and_resume),
            ],
        ),
        Session(
            "small-store",
            {"mode": mode, "capacity_bytes": 8 * one_block},
            [
                ("eviction under pressure", eviction_under_pressure),
            ],
        ),
        Session(
            "policy",
            {
                "mode": mode,
                "store_threshold": 2,
                "max_bytes_per_request": 6 * one_block,
                "store_blocks": "prompt_and_decode",
            },
            [
                ("store threshold", store_threshold),
                ("per-request cap", per_request_cap),
                ("decode-block saving", decode_blocks),
            ],
        ),
    ]


def streaming_sessions(mode: str) -> list[Session]:
    streaming_options = {
        "kv_cache_bytes": h.streaming_budget_bytes(STREAMING_LAYERS),
        "max_model_len": h.STREAMING_CONTEXT,
    }
    return [
        Session(
            "streaming",
            {"mode": mode, "streaming": h.STREAMING},
            [
                ("streaming: context 8x the budget", streaming_long_context),
                ("streaming: prefix hit from the host store", streaming_prefix_hit),
                ("streaming: preemption and resume", streaming_preemption),
                ("streaming: 48 requests", streaming_many),
                ("streaming: aborted while staging", streaming_abort),
                ("streaming: fragmented homes", streaming_fragmented_homes),
            ],
            num_layers=STREAMING_LAYERS,
            llm_options=streaming_options,
        ),
        # The homes as int8 + scales: their bytes, and every staged block's
        # decode, must be the reference's.
        Session(
            "streaming-compressed-homes",
            {"mode": mode, "streaming": {**h.STREAMING, "homes": "compressed"}},
            [
                ("streaming, compressed homes: context 8x the budget", streaming_long_context),
                ("streaming, compressed homes: prefix hit from the host store", streaming_prefix_hit),
                ("streaming, compressed homes: preemption and resume", streaming_preemption),
                ("streaming, compressed homes: aborted while staging", streaming_abort),
                ("streaming, compressed homes: fragmented homes", streaming_fragmented_homes),
            ],
            num_layers=STREAMING_LAYERS,
            llm_options=streaming_options,
        ),
    ]


def record_session(model_path: Path, session: Session, directory: Path) -> None:
    """Run the session's scenarios in vLLM with the recorder; traces land in `directory`."""
    import os

    directory.mkdir(parents=True, exist_ok=True)
    os.environ["ACTIVEKV_RECORD_DIR"] = str(directory)
    (directory / SEGMENT_FILE).write_text("")
    llm = h.make_llm(model_path, session.extra_config, connector=h.RECORDER, **session.llm_options)
    try:
        for name, workload in session.scenarios:
            (directory / SEGMENT_FILE).write_text(name)
            workload(llm)
    finally:
        h.shutdown(llm)
