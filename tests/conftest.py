"""Shared set-up: the reference connector on the import path, figures reported
at the end of the run."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pipeline.harness.vllm_harness import reference_on_path  # noqa: E402
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


@pytest.fixture(scope="session")
def cache_dir() -> Path:
    path = Path(os.environ.get("ACTIVEKV_TEST_CACHE", TEST_CACHE))
    path.mkdir(parents=True, exist_ok=True)
    return path
