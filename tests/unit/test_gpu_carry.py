"""ci/gpu-carry.sh on the GPU host's side: pieces are staged in order, a
folder taken twice changes nothing, a machine that went back is named as such,
the joined archive is kept only when it is the one packed, and its wheel only
when it is the pinned one."""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import tarfile
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "ci" / "gpu-carry.sh"
WHEEL = "vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl"


def packed(tmp_path: Path, pieces: int, pin_the_wheel: bool = False) -> Path:
    """A carry folder as `pack` leaves it (an archive of deps/ and the wheel,
    split into `pieces`), and a distributions file (PINS) that pins the
    archive's wheel or other bytes."""
    carry = tmp_path / "carry"
    (carry / "c0" / "googletest").mkdir(parents=True)
    (carry / "c0" / "pieces").write_text(f"{pieces}\n")
    wheel = os.urandom(3000)
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        for name, data in (("deps/dep-1.0-py3-none-any.whl", b"dep"), (WHEEL, wheel)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    payload = archive.getvalue()
    (carry / "c0" / "payload.sha256").write_text(hashlib.sha256(payload).hexdigest() + "\n")
    size = -(-len(payload) // pieces)
    for n in range(1, pieces + 1):
        (carry / f"c{n}").mkdir()
        (carry / f"c{n}" / f"piece.{n - 1:02d}").write_bytes(payload[(n - 1) * size:n * size])
    sha256 = hashlib.sha256(wheel if pin_the_wheel else b"other bytes").hexdigest()
    (tmp_path / "pins.toml").write_text(
        f'[[distribution]]\nname = "vllm"\nversion = "0.26.0"\nfile = "{WHEEL}"\nsha256 = "{sha256}"\n')
    return carry


def run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "STAGE": str(tmp_path / "stage"), "PINS": str(tmp_path / "pins.toml")}
    return subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, check=False)


def take(tmp_path: Path, n: int) -> subprocess.CompletedProcess[str]:
    return run(tmp_path, "take", str(n), str(tmp_path / "carry"))


def test_pieces_are_staged_in_order_and_the_pinned_wheel_is_unpacked(tmp_path):
    carry, stage = packed(tmp_path, 3, pin_the_wheel=True), tmp_path / "stage"
    assert take(tmp_path, 0).returncode == 0
    assert sorted(p.name for p in stage.iterdir()) == ["googletest", "payload.sha256", "pieces"]

    skipped = take(tmp_path, 2)
    assert skipped.returncode == 4
    assert f"carry {carry}/c1 next" in skipped.stderr
    assert (carry / "c2" / "piece.01").exists(), "a refused piece stays where it was carried"

    first = take(tmp_path, 1)
    assert first.returncode == 0 and "1 of 3 pieces" in first.stdout
    again = take(tmp_path, 1)
    assert again.returncode == 0 and "taken already" in again.stdout
    assert take(tmp_path, 0).returncode == 0 and (stage / "piece.00").exists(), "c0 again wiped the stage"
    assert take(tmp_path, 2).returncode == 0

    joined = take(tmp_path, 3)
    assert joined.returncode == 0, joined.stderr
    assert sorted(p.name for p in stage.iterdir()) == ["deps", "googletest", "payload.sha256", "pieces", WHEEL]
    assert (stage / "deps" / "dep-1.0-py3-none-any.whl").read_bytes() == b"dep"
    assert f"--vllm {stage}/{WHEEL} --deps {stage}/deps" in joined.stdout
    assert "already joined" in take(tmp_path, 3).stdout
    assert f"--vllm {stage}/{WHEEL}" in run(tmp_path, "where").stdout


def test_a_wheel_of_other_bytes_is_refused_and_not_left_as_the_wheel(tmp_path):
    packed(tmp_path, 2)
    for n in (0, 1):
        assert take(tmp_path, n).returncode == 0
    refused = take(tmp_path, 2)
    assert refused.returncode == 5
    assert f"the archive's {WHEEL} is not the wheel" in refused.stderr
    stage = tmp_path / "stage"
    assert not (stage / WHEEL).exists() and not (stage / "deps").exists() and not (stage / "unpacked").exists()


def test_an_archive_that_is_not_the_one_packed_is_refused_and_nothing_unpacked(tmp_path):
    carry = packed(tmp_path, 2, pin_the_wheel=True)
    piece = carry / "c2" / "piece.01"
    piece.write_bytes(piece.read_bytes()[:-1] + b"x")  # a byte changed on the way
    for n in (0, 1):
        assert take(tmp_path, n).returncode == 0
    refused = take(tmp_path, 2)
    assert refused.returncode == 5
    assert "the joined archive is not the one packed" in refused.stderr
    stage = tmp_path / "stage"
    assert not (stage / WHEEL).exists() and not (stage / "payload.tar").exists() and not (stage / "deps").exists()


def test_a_pin_that_cannot_be_read_is_said_and_nothing_is_joined(tmp_path):
    packed(tmp_path, 1, pin_the_wheel=True)
    (tmp_path / "pins.toml").write_text('[[distribution]]\nname = "vllm"\nversion = "0.25.0"\n')
    unread = take(tmp_path, 0)
    assert unread.returncode == 3
    assert f"no vllm 0.26.0 file read from {tmp_path}/pins.toml" in unread.stderr
    assert not (tmp_path / "stage").exists()


def test_a_piece_on_a_machine_that_went_back_says_to_carry_c0_again(tmp_path):
    carry = packed(tmp_path, 2)
    went_back = take(tmp_path, 1)
    assert went_back.returncode == 4
    assert f"the machine went back; carry {carry}/c0 again" in went_back.stderr


def test_a_folder_not_carried_is_named(tmp_path):
    carry = packed(tmp_path, 1)
    missing = take(tmp_path, 5)
    assert missing.returncode == 3
    assert f"{carry}/c5 is not here" in missing.stderr
