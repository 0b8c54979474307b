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
