"""Layer streaming's CPU copy thread in real vLLM.

vLLM's CPU worker binds its forward's OpenMP threads to its cores when it
runs in a process of its own (`vllm serve`), leaving a core to its engine
core; there ActiveKV's copies run on a thread of their own beside the forward
(StreamingTuning::cpu_copy_thread). The tests' in-process engines are not
bound, so this runs a child whose forward is bound to one CPU (the benchmark's
--forward-cpus), once with the copy thread (ACTIVEKV_CPU_COPY_THREAD=all: every
step, however short) and once without (=0): the tokens and logprobs must be
bitwise the same, and the worker's start-up line must say where the copies ran."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from bench import runs
from pipeline.vllm_driver import llm as h

pytestmark = pytest.mark.vllm

CHILD = r"""
import json, os, sys
from pipeline.vllm_driver import llm as h
from pipeline.vllm_driver.tiny_model import STREAMING_LAYERS
from tests.vllm.conftest import STREAMING_PROMPT

h.reference_on_path()
out = {}
for side, setting in (("thread", "all"), ("inline", "0")):
    os.environ["ACTIVEKV_CPU_COPY_THREAD"] = setting  # read as the streamer starts
    llm = h.make_llm(sys.argv[1], {"streaming": h.STREAMING}, connector="native",
                     kv_cache_bytes=h.streaming_budget_bytes(STREAMING_LAYERS),
                     max_model_len=h.STREAMING_CONTEXT)
    try:
        with h.TelemetryDelta(llm) as moved:
            got = h.generate(llm, [STREAMING_PROMPT])
    finally:
        h.shutdown(llm)
    out[side] = {"tokens": got[0].tokens, "top": got[0].top,
                 "staged": moved["streamed_bytes_to_device"]}
print("RESULT " + json.dumps(out), flush=True)
"""


def test_copies_on_a_thread_beside_a_bound_forward_are_bitwise_the_forwards_own(deep_model, figures):
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("one CPU: none beside the forward's for a copy thread")
    env = dict(os.environ, **h.SAME_THREADS, **runs.forward_binding(str(cpus[0])))
    env.pop("ACTIVEKV_CPU_COPY_THREAD", None)
    child = subprocess.run(
        [sys.executable, "-c", CHILD, str(deep_model)],
        env=env,
        text=True,
        capture_output=True,
        timeout=600,
        check=False,
    )
    log = child.stdout + child.stderr
    assert child.returncode == 0, log[-3000:]
    result = json.loads(next(line for line in child.stdout.splitlines() if line.startswith("RESULT "))[7:])
    thread, inline = result["thread"], result["inline"]
    lines = [line for line in log.splitlines() if "ActiveKV layer streaming (rank 0): " in line]
    assert any(", on a copy thread on CPUs " in line for line in lines), lines
    # Not on the forward's CPU.
    assert not any(f"on a copy thread on CPUs {cpus[0]}," in line for line in lines), lines
    assert any(line.endswith("one copy per run of home rows and blocks") for line in lines), lines  # =0
    assert thread["staged"] == inline["staged"] > 0
    assert thread["tokens"] == inline["tokens"]
    assert thread["top"] == inline["top"], "the copy thread's run differs in its logprobs"
    figures.append(
        f"CPU copy thread beside a forward bound to CPU {cpus[0]}: "
        f"{len(thread['tokens'])} tokens and their logprobs bitwise the forward's own copies'"
    )
