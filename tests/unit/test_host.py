"""Host preparation: a started daemon is not our child and outlives its
starter; a package is installed only when dpkg says its state is `installed`."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time

import pytest

from pipeline.host import dpkg_says_installed, package_installed, running, start_daemon


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


# Status lines as dpkg-query -W -f='${Status}\n' prints them (dpkg's three
# words: wanted, error flag, state).
NOT_INSTALLED = [
    "unknown ok not-installed",
    "deinstall ok config-files",
    "install reinstreq half-installed",
    "install ok unpacked",
    "install ok half-configured",
    "purge ok not-installed",
    "",
]


@pytest.mark.parametrize("status", NOT_INSTALLED)
def test_a_package_dpkg_knows_but_has_not_installed_is_missing(status):
    assert not dpkg_says_installed(status)


@pytest.mark.parametrize(
    "status", ["install ok installed", "hold ok installed", "unknown ok not-installed\ninstall ok installed"]
)
def test_an_installed_package_is_installed(status):
    assert dpkg_says_installed(status)


@pytest.mark.skipif(shutil.which("dpkg-query") is None, reason="not a Debian host")
def test_this_hosts_dpkg_agrees_for_dpkg_itself_and_a_package_it_never_installed():
    assert package_installed("dpkg")
    known = subprocess.run(
        ["dpkg-query", "-W", "-f=${Status}|${Package}\\n", "*"], capture_output=True, text=True
    ).stdout.splitlines()
    never = [line.split("|")[1] for line in known if line.startswith("unknown ok not-installed|")]
    if never:  # what fooled the old check: dpkg answers 0 with "not-installed"
        assert not package_installed(never[0])
    assert not package_installed("activekv-no-such-package")
