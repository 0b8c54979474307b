"""Where the reference comes from: the tests run the checkout's reference/
(REFERENCE_DIR), the folder the parity harness and the parity stage put on
PYTHONPATH, not a copy installed elsewhere; an environment that installs it
instead (reference/pyproject.toml) gets that package and nothing else."""

from __future__ import annotations

import tomllib
from pathlib import Path

import activekv_reference

from pipeline.paths import REFERENCE_DIR


def test_the_reference_is_imported_from_the_checkouts_reference_folder():
    assert Path(activekv_reference.__file__).resolve().is_relative_to(REFERENCE_DIR / "activekv_reference")


def test_installing_the_reference_gives_its_package_and_no_dependency():
    """A dependency would let pip replace the environment's patched vLLM or its torch."""
    project = tomllib.loads((REFERENCE_DIR / "pyproject.toml").read_text())
    assert project["tool"]["setuptools"]["packages"] == [activekv_reference.__name__]
    assert project["project"]["dependencies"] == []
