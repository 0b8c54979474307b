"""Processes sharing one GPU start and stop their vLLMs one at a time where
the driver is given a lock file (the parity harness's jobs are)."""

import fcntl
from pathlib import Path

import pytest

from pipeline.vllm_driver import llm as h


def held_elsewhere(path) -> bool:
    with open(path, "a") as other:
        try:
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(other, fcntl.LOCK_UN)
        return False


def test_the_lock_is_held_while_vllm_starts_or_stops_and_given_back_after(tmp_path, monkeypatch):
    lock = tmp_path / "vllm-start.lock"
    monkeypatch.setenv(h.START_LOCK_ENV, str(lock))
    with h.gpu_memory_settling():
        assert held_elsewhere(lock)
    assert not held_elsewhere(lock)


def test_given_back_when_the_start_fails(tmp_path, monkeypatch):
    lock = tmp_path / "vllm-start.lock"
    monkeypatch.setenv(h.START_LOCK_ENV, str(lock))
    with pytest.raises(RuntimeError), h.gpu_memory_settling():
        raise RuntimeError("Engine core initialization failed")
    assert not held_elsewhere(lock)


def test_no_lock_file_without_the_setting(tmp_path, monkeypatch):
    monkeypatch.delenv(h.START_LOCK_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    with h.gpu_memory_settling():
        pass
    assert list(tmp_path.iterdir()) == []


WAITER = """
import sys, time
from pipeline.vllm_driver import llm as h
with h.gpu_memory_settling(stopping=sys.argv[1] == "stop"):
    with open(sys.argv[2], "a") as order:
        order.write(sys.argv[1] + "\\n")
    time.sleep(0.1)
"""


def test_a_stop_goes_before_the_starts_waiting(tmp_path, monkeypatch):
    import os
    import subprocess
    import sys
    import time

    from pipeline.paths import ROOT

    lock, order = tmp_path / "vllm-start.lock", tmp_path / "order"
    env = {**os.environ, h.START_LOCK_ENV: str(lock), "PYTHONPATH": str(ROOT)}
    with open(lock, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # a vLLM starting
        waiters = [
            subprocess.Popen([sys.executable, "-c", WAITER, kind, str(order)], env=env)
            for kind in ("start", "start", "start", "stop", "start")
        ]
        deadline = time.monotonic() + 30
        while not any(Path(f"{lock}.stops").glob("*")):  # the stop says it waits
            assert time.monotonic() < deadline, "the stop never said it waits"
            time.sleep(0.05)
        time.sleep(1.0)  # the starts wait at the lock too
        fcntl.flock(held, fcntl.LOCK_UN)
    for w in waiters:
        assert w.wait(timeout=60) == 0
    assert order.read_text().split() == ["stop", "start", "start", "start", "start"]


def test_a_stop_that_died_waiting_holds_no_start_back(tmp_path, monkeypatch):
    lock = tmp_path / "vllm-start.lock"
    monkeypatch.setenv(h.START_LOCK_ENV, str(lock))
    stops = Path(f"{lock}.stops")
    stops.mkdir()
    (stops / "999999999").touch()  # no such process
    with h.gpu_memory_settling():
        assert held_elsewhere(lock)
    assert list(stops.iterdir()) == []


def test_on_a_gpu_a_count_of_blocks_is_given_its_bytes_so_vllm_skips_its_memory_profiling():
    layers = 6
    counted = {"num_gpu_blocks_override": 40, "tensor_parallel_size": 2}
    given = h.with_block_bytes(counted, num_layers=layers)
    assert given["num_gpu_blocks_override"] == 40
    assert given["kv_cache_memory_bytes"] == 40 * layers * h.layer_block_bytes(2)
    assert h.profiles_memory(counted) and not h.profiles_memory(given)
    # Bytes already given, or vLLM sizing the cache itself (the extensible KV cache's tests): unchanged.
    assert h.with_block_bytes({"kv_cache_memory_bytes": 123}, num_layers=layers) == {"kv_cache_memory_bytes": 123}
    sized_by_vllm = {"gpu_memory_utilization": 0.1}
    assert h.with_block_bytes(sized_by_vllm, num_layers=layers) == sized_by_vllm
    assert h.profiles_memory(sized_by_vllm)


def test_a_start_that_does_not_profile_does_not_wait_for_the_lock(tmp_path, monkeypatch):
    """A fake vLLM module records what _llm starts it with and whether the
    lock was held elsewhere meanwhile; the real one is not imported."""
    import sys
    import types

    lock = tmp_path / "vllm-start.lock"
    monkeypatch.setenv(h.START_LOCK_ENV, str(lock))
    started = []
    vllm = types.ModuleType("vllm")
    vllm.LLM = lambda **args: started.append(args) or "llm"
    platforms = types.ModuleType("vllm.platforms")
    platforms.current_platform = types.SimpleNamespace(is_cuda_alike=lambda: True)
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.platforms", platforms)
    import threading

    with open(lock, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another job's vLLM profiling
        start = threading.Thread(target=h._llm, args=(tmp_path, {}, None, 64, None, 1))
        start.start()
        start.join(timeout=10)
        waited = start.is_alive()
    start.join()
    assert not waited, "the start waited for the lock"
    assert started[0]["num_gpu_blocks_override"] == h.NUM_DEVICE_BLOCKS
    assert started[0]["kv_cache_memory_bytes"] > 0
