"""ci/gpu-carry.sh: `pack` (from a ready download, no network) splits one
archive into pieces that fit a call beside the tree, c0 carrying GoogleTest
and the first; on the GPU host's side `take` stages them in order, a folder
taken twice changes nothing, a machine that went back is named as such, the
joined archive is kept only when it is the one packed, and its wheel only when
it is the pinned one."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "ci" / "gpu-carry.sh"
WHEEL = "vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl"
PIECE = 8 << 10  # bytes a call carries beside the tree, in these tests


def carried_bytes(paths: list[Path]) -> int:
    """A file as tar carries it: a 512-byte header, contents in 512-byte blocks."""
    return sum(512 + -(-p.stat().st_size // 512) * 512 for p in paths if p.is_file())


def tree_bytes() -> int:
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=REPO, capture_output=True, check=True).stdout.split(b"\0")
    return carried_bytes([REPO / os.fsdecode(name) for name in listed if name])


def run(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "STAGE": str(tmp_path / "stage"), "PINS": str(tmp_path / "pins.toml"), **env}
    return subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, check=False)


def packed(tmp_path: Path, pin_the_wheel: bool = True) -> Path:
    """`pack` run on a download of 40 KiB (deps/ and the wheel), with calls of
    PIECE bytes beside the tree, and a distributions file (PINS) that pins the
    wheel or other bytes."""
    download = tmp_path / "download"  # made again by a second call: new bytes
    (download / "deps").mkdir(parents=True, exist_ok=True)
    (download / "deps" / "dep-1.0-py3-none-any.whl").write_bytes(os.urandom(10 << 10))
    wheel = os.urandom(30 << 10)
    (download / WHEEL).write_bytes(wheel)
    gtest = tmp_path / "googletest"
    gtest.mkdir(exist_ok=True)
    (gtest / "CMakeLists.txt").write_text("project(googletest)\n")
    sha256 = hashlib.sha256(wheel).hexdigest()
    pins = tmp_path / "pins.toml"
    pins.write_text(f'[[distribution]]\nname = "vllm"\nversion = "0.26.0"\nfile = "{WHEEL}"\nsha256 = "{sha256}"\n')
    limit = tree_bytes() + (2 << 20) + PIECE
    done = run(tmp_path, "pack", str(tmp_path / "carry"), DOWNLOADED=str(download), GOOGLETEST_SRC=str(gtest),
               CARRY_LIMIT=str(limit), MIN_PIECE="1")
    assert done.returncode == 0, done.stderr
    if not pin_the_wheel:
        pins.write_text(pins.read_text().replace(sha256, hashlib.sha256(b"other bytes").hexdigest()))
    return tmp_path / "carry"


def take(tmp_path: Path, n: int) -> subprocess.CompletedProcess[str]:
    return run(tmp_path, "take", str(n), str(tmp_path / "carry"))


def folders(carry: Path) -> list[str]:
    return sorted((p.name for p in carry.iterdir()), key=lambda name: int(name[1:]))


def test_pack_fills_each_call_and_c0_carries_googletest_and_the_first_piece(tmp_path):
    carry = packed(tmp_path)
    names = folders(carry)
    assert len(names) >= 5, "40 KiB in calls of 8 KiB"
    assert names == [f"c{n}" for n in range(len(names))]
    assert sorted(p.name for p in (carry / "c0").iterdir()) == ["googletest", "payload.sha256", "piece.00",
                                                               "pieces"]
    assert (carry / "c0" / "pieces").read_text().strip() == str(len(names))
    for name in names:
        assert carried_bytes(list((carry / name).rglob("*"))) <= PIECE, f"{name} passes a call"
    joined = b"".join((carry / name / f"piece.{int(name[1:]):02d}").read_bytes() for name in names)
    assert hashlib.sha256(joined).hexdigest() == (carry / "c0" / "payload.sha256").read_text().strip()
    assert not (carry / "payload.tar").exists() and (tmp_path / "download" / WHEEL).exists()


def test_a_wheel_other_than_the_pinned_one_is_not_packed_and_the_last_pack_stays(tmp_path):
    carry = packed(tmp_path)
    before = {p.relative_to(carry): p.read_bytes() for p in carry.rglob("*") if p.is_file()}
    (tmp_path / "download" / WHEEL).write_bytes(b"not vllm")
    refused = run(tmp_path, "pack", str(carry), DOWNLOADED=str(tmp_path / "download"),
                  GOOGLETEST_SRC=str(tmp_path / "googletest"), MIN_PIECE="1")
    assert refused.returncode == 3
    assert f"{tmp_path}/download/{WHEEL} is not the wheel" in refused.stderr
    assert {p.relative_to(carry): p.read_bytes() for p in carry.rglob("*") if p.is_file()} == before
    assert not (tmp_path / "carry.new").exists()


def test_pieces_are_staged_in_order_and_the_pinned_wheel_is_unpacked(tmp_path):
    carry, stage = packed(tmp_path), tmp_path / "stage"
    last = len(folders(carry)) - 1
    shutil.copytree(carry / "c0", tmp_path / "c0-again")
    assert take(tmp_path, 0).returncode == 0
    assert sorted(p.name for p in stage.iterdir()) == ["googletest", "payload.sha256", "piece.00", "pieces"]

    skipped = take(tmp_path, 2)
    assert skipped.returncode == 4
    assert f"carry {carry}/c1 next" in skipped.stderr
    assert (carry / "c2" / "piece.02").exists(), "a refused piece stays where it was carried"

    first = take(tmp_path, 1)
    assert first.returncode == 0 and f"2 of {last + 1} pieces" in first.stdout
    assert "taken already" in take(tmp_path, 1).stdout
    assert "taken already" in take(tmp_path, 0).stdout
    (tmp_path / "c0-again").rename(carry / "c0")  # the same c0, carried again
    again = take(tmp_path, 0)
    assert again.returncode == 0 and "taken already (the same archive)" in again.stdout
    assert (stage / "piece.01").exists(), "the same c0 again kept the stage"
    for n in range(2, last):
        assert take(tmp_path, n).returncode == 0

    joined = take(tmp_path, last)
    assert joined.returncode == 0, joined.stderr
    assert sorted(p.name for p in stage.iterdir()) == ["deps", "googletest", "payload.sha256", "pieces", WHEEL]
    assert (stage / WHEEL).read_bytes() == (tmp_path / "download" / WHEEL).read_bytes()
    assert (stage / "deps" / "dep-1.0-py3-none-any.whl").read_bytes() == \
        (tmp_path / "download" / "deps" / "dep-1.0-py3-none-any.whl").read_bytes()
    assert f"--vllm {stage}/{WHEEL} --deps {stage}/deps" in joined.stdout
    assert "already joined" in take(tmp_path, last).stdout
    assert f"--vllm {stage}/{WHEEL}" in run(tmp_path, "where").stdout


def test_a_c0_of_another_archive_starts_the_stage_over(tmp_path):
    carry, stage = packed(tmp_path), tmp_path / "stage"
    for n in (0, 1):
        assert take(tmp_path, n).returncode == 0
    packed(tmp_path)  # another archive: its wheel's bytes are new
    assert take(tmp_path, 0).returncode == 0
    assert (stage / "piece.00").exists() and not (stage / "piece.01").exists(), \
        "pieces of another archive were kept"


def test_a_wheel_of_other_bytes_is_refused_and_not_left_as_the_wheel(tmp_path):
    carry, stage = packed(tmp_path, pin_the_wheel=False), tmp_path / "stage"
    last = len(folders(carry)) - 1
    for n in range(last):
        assert take(tmp_path, n).returncode == 0
    refused = take(tmp_path, last)
    assert refused.returncode == 5
    assert f"the archive's {WHEEL} is not the wheel" in refused.stderr
    assert not (stage / WHEEL).exists() and not (stage / "deps").exists() and not (stage / "unpacked").exists()


def test_an_archive_that_is_not_the_one_packed_is_refused_and_nothing_unpacked(tmp_path):
    carry, stage = packed(tmp_path), tmp_path / "stage"
    last = len(folders(carry)) - 1
    piece = carry / "c1" / "piece.01"
    piece.write_bytes(b"x" + piece.read_bytes()[1:])  # a byte changed on the way
    for n in range(last):
        assert take(tmp_path, n).returncode == 0
    refused = take(tmp_path, last)
    assert refused.returncode == 5
    assert "the joined archive is not the one packed" in refused.stderr
    assert not (stage / WHEEL).exists() and not (stage / "payload.tar").exists() and not (stage / "deps").exists()
    assert not list(stage.glob("piece.*")), "pieces of a bad archive were kept"


def test_a_c0_without_the_archive_sha256_is_refused(tmp_path):
    carry = packed(tmp_path)
    (carry / "c0" / "payload.sha256").unlink()
    refused = take(tmp_path, 0)
    assert refused.returncode == 3
    assert "pack again" in refused.stderr
    assert not (tmp_path / "stage").exists()


def test_a_pin_that_cannot_be_read_is_said_and_nothing_is_joined(tmp_path):
    packed(tmp_path)
    (tmp_path / "pins.toml").write_text('[[distribution]]\nname = "vllm"\nversion = "0.25.0"\n')
    unread = take(tmp_path, 0)
    assert unread.returncode == 3
    assert f"no vllm 0.26.0 file read from {tmp_path}/pins.toml" in unread.stderr
    assert not (tmp_path / "stage").exists()


def test_a_piece_on_a_machine_that_went_back_says_to_carry_c0_again(tmp_path):
    carry = packed(tmp_path)
    went_back = take(tmp_path, 1)
    assert went_back.returncode == 4
    assert f"the machine went back; carry {carry}/c0 again" in went_back.stderr


def test_a_folder_not_carried_is_named(tmp_path):
    carry = packed(tmp_path)
    assert take(tmp_path, 0).returncode == 0
    missing = take(tmp_path, 40)
    assert missing.returncode == 3
    assert f"{carry}/c40 is not here" in missing.stderr
