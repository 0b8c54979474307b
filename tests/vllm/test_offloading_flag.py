"""vLLM's own flag pair for a KV tier, `--kv-offloading-backend activekv
--kv-offloading-size GiB` (patch 0003): it configures ActiveKV's host store
as `native` configures vLLM's OffloadingConnector, and that store then serves
a prefix vLLM evicted, bit for bit plain vLLM's answer."""

from __future__ import annotations

import random
import shlex
from pathlib import Path

import pytest

from pipeline.vllm_driver import llm as h

pytestmark = pytest.mark.vllm

SIZE_GIB = 0.25


def readme_quick_start_line() -> list[str]:
    """The README quick start's `vllm serve` line, its flags after MODEL."""
    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    quick = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    (line,) = [x.strip() for x in quick.splitlines() if x.strip().startswith("vllm serve MODEL")]
    return shlex.split(line)[3:]


def test_the_command_line_takes_the_backend_as_the_readme_writes_it():
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    args = parser.parse_args(readme_quick_start_line())
    assert args.kv_offloading_backend == "activekv" and args.kv_offloading_size > 0
    config = EngineArgs.from_cli_args(args)
    assert (config.kv_offloading_backend, config.kv_offloading_size) == ("activekv", args.kv_offloading_size)
    with pytest.raises(SystemExit):  # the Literal still refuses what it does not name
        parser.parse_args(["--kv-offloading-backend", "activekvx", "--kv-offloading-size", "1"])


@pytest.fixture(scope="module")
def flag_llm(tiny_model):
    llm = h.make_llm(
        tiny_model,
        connector=None,
        llm_args={"kv_offloading_backend": "activekv", "kv_offloading_size": SIZE_GIB, "disable_log_stats": False},
    )
    yield llm
    h.shutdown(llm)


def test_the_flag_pair_configures_the_host_store(flag_llm):
    config = flag_llm.llm_engine.vllm_config
    transfer = config.kv_transfer_config
    assert (transfer.kv_connector, transfer.kv_role) == ("ActiveKVHostConnector", "kv_both")
    # vLLM's size is the total over the workers; capacity_bytes is a worker's.
    assert (
        transfer.kv_connector_extra_config["capacity_bytes"]
        == int(SIZE_GIB * (1 << 30)) // config.parallel_config.world_size
    )


def test_a_prefix_vllm_evicted_comes_back_from_the_flag_configured_store(flag_llm, plain):
    rng = random.Random(7)
    prompt = h.random_tokens(rng, 8 * h.BLOCK_SIZE + 3)
    filler = h.random_tokens(rng, h.MAX_MODEL_LEN - h.MAX_TOKENS)  # needs every device block
    first = h.generate(flag_llm, [prompt])[0]
    h.generate(flag_llm, [filler])
    with h.TelemetryDelta(flag_llm) as delta:
        again = h.generate(flag_llm, [prompt])[0]
    reusable = h.reusable_tokens(len(prompt))
    assert delta["hit_tokens"] == reusable
    assert again.num_cached_tokens == reusable
    (plain_hit,) = plain([prompt], prefix_hit=True)
    assert again.tokens == first.tokens == plain_hit.tokens
