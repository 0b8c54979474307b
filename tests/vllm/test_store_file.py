"""The host store in a file (store_path): a restarted vLLM serves prefixes
from it on its first request, bit for bit vLLM's own prefix hit; a file of
another configuration, or a path it cannot use, stops the start with a line
that names the file and what to do. Native engine only (the reference keeps
its store in process memory and refuses the key)."""

from __future__ import annotations

import random

import pytest

from pipeline.harness import vllm_harness as h

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
    figures.extend(f"store file restart: {note}" for note in h.check_reloads([again], own_hits))
    assert again.tokens == first.tokens
    assert unsalted["hit_tokens"] == 0
    # cache_salt holds across the restart: each tenant finds its own blocks only.
    assert salted["hit_tokens"] == reusable and tenant.tokens == other_tenant.tokens
    assert third["hit_tokens"] == 0 and stranger.num_cached_tokens == 0
    figures.append(f"store file restart: {reusable} of {len(prompt)} prompt tokens from the file on "
                   "the first request, bit for bit vLLM's own prefix hit")


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


@pytest.mark.parametrize("where, says", [
    ("missing/store", "its directory does not exist"),
    ("held", "is in use by another running process"),
])
def test_a_store_path_it_cannot_use_stops_the_start_naming_it(tiny_model, tmp_path, capfd, where, says):
    import fcntl

    path = tmp_path / where
    holder = None
    if where == "held":  # another process's lock: this one's flock is refused the same way
        holder = open(path, "wb")
        fcntl.flock(holder, fcntl.LOCK_EX)
    try:
        with pytest.raises(Exception) as raised:
            store_llm(tiny_model, path)
    finally:
        if holder:
            holder.close()
    err = capfd.readouterr().err + str(raised.value)
    assert f"ActiveKV store file {path}: {says}" in err and "store_path" in err, err[-3000:]
