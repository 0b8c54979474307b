"""Host services: a started daemon is not our child and outlives its starter."""

from __future__ import annotations

import os
import signal
import time

from pipeline.host import running, start_daemon


def test_daemon_is_not_our_child_and_writes_its_log(tmp_path):
    log = tmp_path / "daemon.log"
    pid = start_daemon(["sh", "-c", "echo started; exec sleep 30"], log)
    try:
        assert running(pid)
        # Not our child: waiting on it is refused, so nothing is left to reap.
        try:
            os.waitpid(pid, os.WNOHANG)
            raise AssertionError(f"pid {pid} is our child")
        except ChildProcessError:
            pass
        for _ in range(50):
            if log.read_text() == "started\n":
                break
            time.sleep(0.1)
        assert log.read_text() == "started\n"
    finally:
        os.kill(pid, signal.SIGTERM)
    for _ in range(50):
        if not running(pid):
            break
        time.sleep(0.1)
    assert not running(pid)


def test_a_daemon_that_exits_is_not_running(tmp_path):
    pid = start_daemon(["true"], tmp_path / "log")
    for _ in range(50):
        if not running(pid):
            break
        time.sleep(0.1)
    assert not running(pid)
