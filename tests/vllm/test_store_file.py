"""The host store in a file (store_path): a restarted vLLM serves prefixes
from it on its first request, bit for bit vLLM's own prefix hit; a file of
another configuration, or a path it cannot use, stops the start with a line
that names the file and what to do (a file a live vLLM holds is shared:
test_shared_store.py). Native engine only (the reference keeps
its store in process memory and refuses the key)."""

from __future__ import annotations

import random

import pytest

from pipeline.vllm_driver import comparison
from pipeline.vllm_driver import llm as h

pytestmark = pytest.mark.vllm


def store_llm(model, path, **extra):
    return h.make_llm(model, {"mode": "exact", "store_path": str(path), **extra}, connector="native")


def test_a_restarted_vllm_serves_the_prefix_from_the_store_file(tiny_model, tmp_path, figures):
    path = tmp_path / "store"
    prompt = h.random_tokens(random.Random(240), 10 * h.BLOCK_SIZE + 5)
    reusable = h.reusable_tokens(len(prompt))
    llm = store_llm(tiny_model, path)
    try:
        first = h.generate(llm, [prompt])[0]
        other_tenant = h.generate(llm, [prompt], salt="tenant-b")[0]
        # The oracle: vLLM's own prefix hit on the KV the store took.
        own_hits = h.own_prefix_hits(llm, [prompt])
    finally:
        h.shutdown(llm)
    assert first.num_cached_tokens == 0 and other_tenant.num_cached_tokens == 0

    llm = store_llm(tiny_model, path)  # a new process state: only the file remembers
    try:
        with h.TelemetryDelta(llm) as delta:
            again = h.generate(llm, [prompt])[0]
        with h.TelemetryDelta(llm) as unsalted:
            h.generate(llm, [h.random_tokens(random.Random(241), 4 * h.BLOCK_SIZE)])
        with h.TelemetryDelta(llm) as salted:
            tenant = h.generate(llm, [prompt], salt="tenant-b")[0]
        with h.TelemetryDelta(llm) as third:
            stranger = h.generate(llm, [prompt], salt="tenant-c")[0]
    finally:
        h.shutdown(llm)
    assert delta["hit_tokens"] == reusable, "the restarted vLLM did not find the prefix in the file"
    assert again.num_cached_tokens == reusable
    assert delta["bytes_to_device"] == delta["loaded_blocks"] * h.exact_block_bytes()
    figures.extend(f"store file restart: {note}" for note in comparison.check_reloads([again], own_hits))
    assert again.tokens == first.tokens
    assert unsalted["hit_tokens"] == 0
    # cache_salt holds across the restart: each tenant finds its own blocks only.
    assert salted["hit_tokens"] == reusable and tenant.tokens == other_tenant.tokens
    assert third["hit_tokens"] == 0 and stranger.num_cached_tokens == 0
    figures.append(
        f"store file restart: {reusable} of {len(prompt)} prompt tokens from the file on "
        "the first request, bit for bit vLLM's own prefix hit"
    )


def test_a_store_file_of_another_configuration_is_refused_and_kept(tiny_model, tmp_path, capfd):
    path = tmp_path / "store"
    llm = store_llm(tiny_model, path)
    h.generate(llm, [h.random_tokens(random.Random(242), 3 * h.BLOCK_SIZE)])
    h.shutdown(llm)
    before = path.read_bytes()
    with pytest.raises(Exception) as raised:
        store_llm(tiny_model, path, mode="compressed")
    err = capfd.readouterr().err + str(raised.value)
    assert f"ActiveKV store file {path}" in err and "mode=exact" in err and "mode=compressed" in err, err[-3000:]
    assert path.read_bytes() == before, "a refused start changed the store file"


@pytest.mark.parametrize(
    "where, says",
    [
        ("missing/store", "its directory does not exist"),
        ("a-directory", "cannot be opened for reading and writing"),
        ("not-a-store", "is not an ActiveKV store"),
    ],
)
def test_a_store_path_it_cannot_use_stops_the_start_naming_it(tiny_model, tmp_path, capfd, where, says):
    path = tmp_path / where
    if where == "a-directory":
        path.mkdir()
    elif where == "not-a-store":
        path.write_bytes(b"something else")
    with pytest.raises(Exception) as raised:
        store_llm(tiny_model, path)
    err = capfd.readouterr().err + str(raised.value)
    assert f"ActiveKV store file {path}: {says}" in err and "store_path" in err, err[-3000:]
    if where == "not-a-store":
        assert path.read_bytes() == b"something else", "a refused start changed the file"


# -- a save storm killed with kill -9, then a restart ------------------------------

STORM_PROMPTS = [h.random_tokens(random.Random(300 + i), (3 + i % 5) * h.BLOCK_SIZE + 3) for i in range(24)]
# A store of 24 blocks for prompts of 3-7 blocks each: the storm evicts, so
# kills land mid-save and mid-eviction (a slot rewritten for another block).
STORM_STORE_BLOCKS = 24
STORM = """
import sys
from pipeline.vllm_driver import llm as h
from tests.vllm.test_store_file import STORM_PROMPTS, store_llm
from pathlib import Path
llm = store_llm(Path(sys.argv[1]), Path(sys.argv[2]), capacity_bytes=int(sys.argv[3]))
i = int(sys.argv[4])
while True:
    h.generate(llm, [STORM_PROMPTS[i % len(STORM_PROMPTS)]])
    print("done", i % len(STORM_PROMPTS), flush=True)
    i += 1
"""


def test_kill_9_during_a_save_storm_then_a_restart_serves_only_verified_blocks(tiny_model, tmp_path, figures):
    import os
    import signal
    import subprocess
    import sys
    import time

    path = tmp_path / "store"
    capacity = STORM_STORE_BLOCKS * h.exact_block_bytes()
    # The oracles, in the same kind of engine: each prompt's answer with vLLM's
    # own prefix hit (the shapes of a whole reload), and its cold answer.
    llm = h.make_llm(tiny_model, {"mode": "exact"}, connector="native")
    try:
        oracle = {}
        for prompt in STORM_PROMPTS:
            cold = h.generate(llm, [prompt])[0]
            oracle[tuple(prompt)] = (cold, h.own_prefix_hits(llm, [prompt]))
    finally:
        h.shutdown(llm)
    rng = random.Random(7)
    last = 0
    for kill in range(3):
        child = subprocess.Popen(
            [sys.executable, "-c", STORM, str(tiny_model), str(path), str(capacity), str(8 * kill)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=dict(os.environ, **h.SAME_THREADS),
        )
        try:
            done, before_kill = 0, 3 + rng.randrange(4)
            while done < before_kill:  # some requests complete, then a kill at a random point
                line = child.stdout.readline()  # vLLM's own log lines come here too
                assert line, "the storm's vLLM stopped by itself"
                if line.startswith("done "):
                    done += 1
                    last = int(line.split()[1])
            time.sleep(rng.uniform(0, 0.05))
            child.send_signal(signal.SIGKILL)
        finally:
            child.kill()
            child.wait()
            child.stdout.close()
    llm = store_llm(tiny_model, path, capacity_bytes=capacity)
    served = hits = full = 0
    # Newest first: the store holds the last prompts the storm saved, and a
    # miss here saves and evicts the oldest.
    newest_first = [STORM_PROMPTS[(last - i) % len(STORM_PROMPTS)] for i in range(len(STORM_PROMPTS))]
    try:
        for prompt in newest_first:
            with h.TelemetryDelta(llm) as delta:
                got = h.generate(llm, [prompt])[0]
            cold, own_hits = oracle[tuple(prompt)]
            # A block served with torn or stale bytes changes the answer. The
            # logprobs are compared where the shapes are a prefix hit's (every
            # reusable block from the file); a partial hit recomputes more
            # tokens, whose bf16 sums round otherwise.
            what = f"prompt of {len(prompt)} tokens, {delta['hit_tokens']} from the file"
            assert got.tokens == cold.tokens, f"{what}: other tokens after the restart"
            if delta["hit_tokens"] == h.reusable_tokens(len(prompt)):
                full += 1
                notes = comparison.check_reloads([got], own_hits)  # raises where the bits differ
                assert not notes, f"{what}: no bit-for-bit oracle: {notes}"
            served += delta["loaded_blocks"]
            hits += delta["hit_tokens"] > 0
    finally:
        h.shutdown(llm)
    assert full > 0, "no prompt came back whole from the killed storm's file"
    figures.append(
        f"store file after 3 kill -9 during a save storm: {served} blocks served from the file "
        f"over {hits} of {len(STORM_PROMPTS)} prompts ({full} whole, bit for bit vLLM's own "
        "prefix hit), every answer's tokens the cold run's"
    )
