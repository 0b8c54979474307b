"""One pipeline run per checkout at a time.

Two runs in one checkout would write the same build/ folders (wheels,
records, the manifest) under each other. A stage that writes takes an
exclusive lock on build/pipeline.lock for its whole run; a second run
refuses at once, naming the first. The kernel drops the lock when its
holder exits, however it exits, so a killed run leaves nothing stale.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from pipeline.errors import BusyError
from pipeline.paths import LOCK_FILE, relative

# ci/run-nox takes the lock before nox re-makes a session's venv and names
# itself (its pid, which nox keeps: it is exec'd) under this name; nox closes
# inherited descriptors, so its stages recognise the holder as their ancestor.
HOLDER_ENV = "ACTIVEKV_PIPELINE_LOCK_HOLDER"


def acquire(command: str, path: Path = LOCK_FILE) -> int | None:
    """Take the checkout's pipeline lock for `command` (what the holder runs,
    shown to a second run) and return its descriptor: closing it releases the
    lock. None: the ci/run-nox run that started us holds it for us. Raises
    BusyError while another run holds it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        ours, who = _held_by_our_ancestor(fd), _holder(fd)
        os.close(fd)
        if ours:
            return None
        raise BusyError(
            f"another pipeline run is using this checkout: {who}. Wait for it "
            f"to finish or stop it; two runs would overwrite each other's build "
            f"outputs ({relative(path)})"
        ) from None
    holder = {"pid": os.getpid(), "command": command, "started": _now()}
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(holder) + "\n").encode(), 0)
    return fd


@contextlib.contextmanager
def pipeline_lock(command: str, path: Path = LOCK_FILE) -> Iterator[None]:
    """Hold the checkout's pipeline lock (see acquire) while inside."""
    fd = acquire(command, path)
    try:
        yield
    finally:
        if fd is not None:
            os.ftruncate(fd, 0)
            os.close(fd)  # closing the descriptor releases the lock


def _held_by_our_ancestor(fd: int) -> bool:
    """Whether the lock's holder is the ci/run-nox run that started this
    process: it named itself in HOLDER_ENV and in the file, and it is one of
    our ancestors (a stale or copied variable names no ancestor)."""
    named = os.environ.get(HOLDER_ENV, "")
    try:
        holder = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except ValueError:
        return False
    if not named.isdigit() or holder.get("pid") != int(named):
        return False
    pid = os.getppid()
    while pid > 1:
        if pid == int(named):
            return True
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            return False
    return False


def _now() -> str:
    return datetime.datetime.now().astimezone().replace(microsecond=0).isoformat()


def _holder(fd: int) -> str:
    try:
        holder = json.loads(os.pread(fd, 4096, 0) or b"{}")
        return f"pid {holder['pid']} ({holder['command']}, started {holder['started']})"
    except (ValueError, KeyError, TypeError):
        return "a run that has not yet said who it is"


def command_line() -> str:
    return "python -m pipeline " + " ".join(sys.argv[1:])
