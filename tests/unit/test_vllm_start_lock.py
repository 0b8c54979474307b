"""Processes sharing one GPU start and stop their vLLMs one at a time where
the driver is given a lock file (the parity harness's jobs are)."""

import fcntl

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
