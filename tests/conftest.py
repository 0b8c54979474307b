"""Shared set-up: the reference connector on the import path, figures reported
at the end of the run, and under CI (CI=true) a run that skipped a test fails."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pipeline.vllm_driver.llm import reference_on_path  # noqa: E402
from pipeline.host import under_ci  # noqa: E402
from pipeline.paths import TEST_CACHE  # noqa: E402

# vLLM's engine and worker processes import the reference connector by module
# path, so they need it on PYTHONPATH as well as this process on sys.path.
reference_on_path()

_FIGURES: list[str] = []


@pytest.fixture(scope="session")
def figures():
    """Append lines to print in the summary (measured figures, agreements)."""
    return _FIGURES


def pytest_terminal_summary(terminalreporter):
    if _FIGURES:
        terminalreporter.section("ActiveKV figures")
        for line in _FIGURES:
            terminalreporter.write_line(line)
    if under_ci() and terminalreporter.stats.get("skipped"):
        terminalreporter.section("skipped under CI")
        for report in terminalreporter.stats["skipped"]:
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
            terminalreporter.write_line(f"{report.nodeid}: {reason}")


def pytest_sessionfinish(session, exitstatus):
    """CI's hosts give every test what it needs (a clean clone, root, docker):
    there a skip hides a test that did not run, so the run fails."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = len(reporter.stats.get("skipped", [])) if reporter else 0
    if under_ci() and skipped and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(scope="session")
def cache_dir() -> Path:
    path = Path(os.environ.get("ACTIVEKV_TEST_CACHE", TEST_CACHE))
    path.mkdir(parents=True, exist_ok=True)
    return path
