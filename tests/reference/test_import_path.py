"""The reference the tests run is the checkout's reference/ (REFERENCE_DIR),
the folder the parity harness and the parity stage put on PYTHONPATH: not a
copy installed elsewhere."""
from __future__ import annotations

from pathlib import Path

import activekv_reference

from pipeline.paths import REFERENCE_DIR


def test_the_reference_is_imported_from_the_checkouts_reference_folder():
    assert Path(activekv_reference.__file__).resolve().is_relative_to(REFERENCE_DIR / "activekv_reference")
