"""ci/gpu-carry.sh on the GPU host's side: pieces are staged in order, a
machine that went back is named as such, and a joined wheel that is not the
pinned one is refused and not left behind as the wheel."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "ci" / "gpu-carry.sh"
WHEEL = "vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl"


def packed(tmp_path: Path, pieces: int) -> Path:
    """A carry folder as `pack` leaves it, with pieces of bytes that are not the wheel."""
    carry = tmp_path / "carry"
    (carry / "c0" / "deps").mkdir(parents=True)
    (carry / "c0" / "googletest").mkdir()
    (carry / "c0" / "pieces").write_text(f"{pieces}\n")
    for n in range(1, pieces + 1):
        (carry / f"c{n}").mkdir()
        (carry / f"c{n}" / f"piece.{n - 1:02d}").write_bytes(os.urandom(1000))
    return carry


def take(carry: Path, stage: Path, n: int) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "STAGE": str(stage)}
    return subprocess.run(
        ["bash", str(SCRIPT), "take", str(n), str(carry)], env=env, capture_output=True, text=True, check=False
    )


def test_pieces_are_staged_in_order_and_a_wheel_of_other_bytes_is_refused(tmp_path):
    carry, stage = packed(tmp_path, 3), tmp_path / "stage"
    assert take(carry, stage, 0).returncode == 0
    assert sorted(p.name for p in stage.iterdir()) == ["deps", "googletest", "pieces"]

    skipped = take(carry, stage, 2)
    assert skipped.returncode == 4
    assert f"carry {carry}/c1 next" in skipped.stderr
    assert (carry / "c2" / "piece.01").exists(), "a refused piece stays where it was carried"

    first = take(carry, stage, 1)
    assert first.returncode == 0 and "1 of 3 pieces" in first.stdout
    assert take(carry, stage, 2).returncode == 0

    joined = take(carry, stage, 3)
    assert joined.returncode == 5
    assert "is not the pinned wheel" in joined.stderr
    assert not (stage / WHEEL).exists() and not (stage / f"{WHEEL}.part").exists()


def test_a_piece_on_a_machine_that_went_back_says_to_carry_c0_again(tmp_path):
    carry, stage = packed(tmp_path, 2), tmp_path / "stage"
    went_back = take(carry, stage, 1)
    assert went_back.returncode == 4
    assert f"the machine went back; carry {carry}/c0 again" in went_back.stderr


def test_a_folder_not_carried_is_named(tmp_path):
    carry, stage = packed(tmp_path, 1), tmp_path / "stage"
    missing = take(carry, stage, 5)
    assert missing.returncode == 3
    assert f"{carry}/c5 is not here" in missing.stderr
