"""Host preparation: what a fresh Debian build host needs beyond Python.

Runs only what is missing, echoes every command, and says what to install by
hand where it cannot (not root, not Debian).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from pipeline.container import ContainerRuntime
from pipeline.errors import HostPreparationError
from pipeline.paths import LOGS_DIR

APT_LOCK = Path(tempfile.gettempdir()) / "activekv-apt.lock"  # every checkout's runs on this host


def under_ci() -> bool:
    """Whether this run is CI's (`.ci/run` exports CI=true): there every test
    and tool has what it needs, so a skip or a weaker fallback is a failure."""
    return os.environ.get("CI") == "true"


def dpkg_says_installed(status: str) -> bool:
    """Whether dpkg-query's `${Status}` output (one line per architecture)
    says the package is installed. A status is three words: wanted, error
    flag, state; only the state `installed` is usable. `unknown ok
    not-installed`, `deinstall ok config-files`, `install reinstreq
    half-installed`, `install ok unpacked`... are not."""
    return any(
        len(words := line.split()) == 3 and words[1] == "ok" and words[2] == "installed" for line in status.splitlines()
    )


def package_installed(package: str) -> bool:
    probe = subprocess.run(["dpkg-query", "-W", "-f=${Status}\\n", package], capture_output=True, text=True)
    return probe.returncode == 0 and dpkg_says_installed(probe.stdout)


def ensure_debian_packages(packages: Sequence[str]) -> None:
    """Install the Debian packages that are missing (needs root and apt-get)."""
    if shutil.which("dpkg-query") is None or shutil.which("apt-get") is None:
        missing = list(packages)
    else:
        missing = [p for p in packages if not package_installed(p)]
    if not missing:
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise HostPreparationError(
            f"this host lacks {', '.join(missing)}; install them (Debian: "
            f"apt-get install {' '.join(missing)}) or run as root on Debian"
        )
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    # One apt-get at a time from our processes (the tests session prepares
    # images and installs beside each other): a second would fail on dpkg's
    # lock. Under ours, what the first installed is no longer missing.
    with open(APT_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        missing = [p for p in missing if not package_installed(p)]
        if not missing:
            return
        for cmd in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", *missing]):
            print("+", " ".join(cmd), flush=True)
            subprocess.run(cmd, check=True, env=env)


def start_daemon(cmd: Sequence[str], log: Path) -> int:
    """Start a service that outlives this process and return its pid.

    The shell that starts it exits at once, so the service is not our child:
    nothing is left for us to reap, and no Popen object is dropped while the
    service still runs (pytest turns that ResourceWarning into an error).
    """
    print("+", " ".join(cmd), f">> {log} 2>&1 &", flush=True)
    started = subprocess.run(
        ["sh", "-c", '"$@" >>"$0" 2>&1 </dev/null & echo $!', str(log), *cmd],
        capture_output=True,
        text=True,
        start_new_session=True,
    )
    if started.returncode != 0 or not started.stdout.strip().isdigit():
        raise HostPreparationError(f"could not start {cmd[0]}: {started.stderr.strip()}")
    return int(started.stdout)


def running(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie waiting to be reaped is not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def _runtime_answers(runtime: str, *, quiet: bool = False) -> bool:
    if not quiet:
        print("+", runtime, "info", flush=True)
    probe = subprocess.run([runtime, "info"], capture_output=True, text=True)
    return probe.returncode == 0


def ensure_container_runtime(runtime: str, *, log_dir: Path, wait_s: float = 60.0) -> None:
    """Make `runtime` (docker or podman) usable: install it where it is missing
    and, for docker, start a daemon without a bridge (containers and builds use
    the host's network). A pid file left by a killed daemon is cleared first."""
    if runtime == "podman":
        ensure_debian_packages(["podman"])
        return
    if shutil.which(runtime) and _runtime_answers(runtime):
        return
    ensure_debian_packages(["docker.io"])
    if _runtime_answers(runtime):
        return
    if os.geteuid() != 0:
        raise HostPreparationError(
            "docker is installed but no daemon answers; start dockerd (as root: "
            "dockerd --bridge=none --iptables=false) or run this as root"
        )
    pid_file = Path("/var/run/docker.pid")
    if pid_file.exists():
        stale = pid_file.read_text().strip()
        if not (stale.isdigit() and Path(f"/proc/{stale}").exists()):
            print(f"+ rm {pid_file}  # left by a daemon that is gone (pid {stale})", flush=True)
            pid_file.unlink()
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / "dockerd.log"
    cmd = ["dockerd", "--bridge=none", "--iptables=false", "--ip6tables=false"]
    start_daemon(cmd, log)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if _runtime_answers(runtime, quiet=True):
            return
        time.sleep(0.5)
    raise HostPreparationError(f"dockerd did not answer within {wait_s:.0f} s; its log is {log}")


def prepared_runtime(name: str) -> ContainerRuntime:
    """The container runtime `name` (release.toml's container_engine), made
    usable on this host first (ensure_container_runtime; dockerd's log in
    build/logs)."""
    ensure_container_runtime(name, log_dir=LOGS_DIR)
    return ContainerRuntime(name=name)
