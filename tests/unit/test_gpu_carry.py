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
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    return carried_bytes([REPO / os.fsdecode(name) for name in listed if name])


def run(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    env = {
        **{k: v for k, v in os.environ.items() if k != "LMCACHE"},
        "STAGE": str(tmp_path / "stage"),
        "PINS": str(tmp_path / "pins.toml"),
        **env,
    }
    return subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, check=False)


def packed(tmp_path: Path, pin_the_wheel: bool = True, **env: str) -> Path:
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
    done = run(
        tmp_path,
        "pack",
        str(tmp_path / "carry"),
        DOWNLOADED=str(download),
        GOOGLETEST_SRC=str(gtest),
        CARRY_LIMIT=str(limit),
        MIN_PIECE="1",
        **env,
    )
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
    assert sorted(p.name for p in (carry / "c0").iterdir()) == ["googletest", "payload.sha256", "piece.00", "pieces"]
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
    refused = run(
        tmp_path,
        "pack",
        str(carry),
        DOWNLOADED=str(tmp_path / "download"),
        GOOGLETEST_SRC=str(tmp_path / "googletest"),
        MIN_PIECE="1",
    )
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
    assert (stage / "deps" / "dep-1.0-py3-none-any.whl").read_bytes() == (
        tmp_path / "download" / "deps" / "dep-1.0-py3-none-any.whl"
    ).read_bytes()
    assert f"--vllm {stage}/{WHEEL} --deps {stage}/deps" in joined.stdout
    assert "already joined" in take(tmp_path, last).stdout
    assert f"--vllm {stage}/{WHEEL}" in run(tmp_path, "where").stdout


def test_a_c0_of_another_archive_starts_the_stage_over(tmp_path):
    stage = tmp_path / "stage"
    packed(tmp_path)
    for n in (0, 1):
        assert take(tmp_path, n).returncode == 0
    packed(tmp_path)  # another archive: its wheel's bytes are new
    assert take(tmp_path, 0).returncode == 0
    assert (stage / "piece.00").exists() and not (stage / "piece.01").exists(), "pieces of another archive were kept"


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


# Another vLLM than 0.26.0 (VLLM_VERSION or --vllm-version): its pinned wheel,
# its list of wheels, its patch series, and (0.34.0) a torch of its own.

CHECK = REPO / "ci" / "gpu-vllm-check.sh"
WHEEL_34 = "vllm-0.34.0-cp38-abi3-manylinux_2_28_x86_64.whl"
TORCH_214_SHA256 = "fecffb58f51fd643d213acd68da21cc3fc19bea05a3bc64b4ee55128f47a4963"


def packed_34(tmp_path: Path) -> Path:
    """`pack` for vLLM 0.34.0 (VLLM_VERSION), from a download of 40 KiB and a
    distributions file that pins 0.26.0's wheel and 0.34.0's."""
    download = tmp_path / "download"
    (download / "deps").mkdir(parents=True, exist_ok=True)
    (download / "deps" / "torch-2.14.0-cp312-cp312-manylinux_2_28_x86_64.whl").write_bytes(os.urandom(10 << 10))
    wheel = os.urandom(30 << 10)
    (download / WHEEL_34).write_bytes(wheel)
    gtest = tmp_path / "googletest"
    gtest.mkdir(exist_ok=True)
    (gtest / "CMakeLists.txt").write_text("project(googletest)\n")
    (tmp_path / "pins.toml").write_text(
        f'[[distribution]]\nname = "vllm"\nversion = "0.26.0"\nfile = "{WHEEL}"\nsha256 = "{"0" * 64}"\n\n'
        f'[[distribution]]\nname = "vllm"\nversion = "0.34.0"\nfile = "{WHEEL_34}"\n'
        f'sha256 = "{hashlib.sha256(wheel).hexdigest()}"\n'
    )
    limit = tree_bytes() + (6 << 20) + PIECE
    done = run(
        tmp_path,
        "pack",
        str(tmp_path / "carry"),
        DOWNLOADED=str(download),
        GOOGLETEST_SRC=str(gtest),
        CARRY_LIMIT=str(limit),
        MIN_PIECE="1",
        SPARE_MIB="6",
        VLLM_VERSION="0.34.0",
    )
    assert done.returncode == 0, done.stderr
    assert f"VLLM_VERSION=0.34.0 ci/gpu-carry.sh take N {tmp_path}/carry" in done.stdout
    assert "6 MiB to spare" in done.stdout
    return tmp_path / "carry"


def test_a_pack_for_034_says_its_version_in_c0_and_is_taken_and_joined_as_034(tmp_path):
    carry, stage = packed_34(tmp_path), tmp_path / "stage"
    names = folders(carry)
    assert len(names) >= 5, "40 KiB in calls of 8 KiB"
    assert (carry / "c0" / "vllm-version").read_text().strip() == "0.34.0"
    for name in names:
        assert carried_bytes(list((carry / name).rglob("*"))) <= PIECE, f"{name} passes a call"
    first = run(tmp_path, "--vllm-version", "0.34.0", "take", "0", str(carry))  # the flag, as the variable
    assert first.returncode == 0, first.stderr
    assert "the host's torch stack and CUDA libraries" in first.stdout, "taking c0 probes the host"
    for n in range(1, len(names)):
        taken = run(tmp_path, "take", str(n), str(carry), VLLM_VERSION="0.34.0")
        assert taken.returncode == 0, taken.stderr
    assert (stage / WHEEL_34).read_bytes() == (tmp_path / "download" / WHEEL_34).read_bytes()
    assert (stage / "deps" / "torch-2.14.0-cp312-cp312-manylinux_2_28_x86_64.whl").exists()
    assert (
        f"ci/gpu-vllm-check.sh --vllm-version 0.34.0 --engine-source --vllm {stage}/{WHEEL_34} "
        f"--deps {stage}/deps" in taken.stdout
    )
    assert f"--vllm {stage}/{WHEEL_34}" in run(tmp_path, "where", VLLM_VERSION="0.34.0").stdout


def test_a_034_c0_taken_as_026_is_refused_and_stays_where_it_was_carried(tmp_path):
    carry = packed_34(tmp_path)
    refused = take(tmp_path, 0)  # no VLLM_VERSION: 0.26.0
    assert refused.returncode == 3
    assert f"{carry}/c0 was packed for vLLM 0.34.0, not 0.26.0: take it with VLLM_VERSION=0.34.0" in refused.stderr
    assert (carry / "c0" / "piece.00").exists() and not (tmp_path / "stage").exists()


def test_a_piece_of_a_staged_034_archive_taken_as_026_is_refused(tmp_path):
    carry = packed_34(tmp_path)
    assert run(tmp_path, "take", "0", str(carry), VLLM_VERSION="0.34.0").returncode == 0
    refused = take(tmp_path, 1)
    assert refused.returncode == 3
    assert "holds the archive of vLLM 0.34.0, not 0.26.0: take with VLLM_VERSION=0.34.0" in refused.stderr
    assert (carry / "c1" / "piece.01").exists()


def test_a_version_without_a_pin_is_said(tmp_path):
    packed(tmp_path)
    unread = run(tmp_path, "take", "0", str(tmp_path / "carry"), VLLM_VERSION="0.99.0")
    assert unread.returncode == 3
    assert f"no vllm 0.99.0 file read from {tmp_path}/pins.toml" in unread.stderr


def test_the_probe_needs_no_pin(tmp_path):
    probed = run(tmp_path, "probe", PINS=str(tmp_path / "no-such-pins.toml"))
    assert probed.returncode == 0, probed.stderr
    assert "the host's torch stack and CUDA libraries (pip show):" in probed.stdout


def requirement_lines(path: Path) -> list[str]:
    return [line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]


def test_the_026_list_pins_every_wheel_by_hash_and_carries_what_vllm_serve_imports():
    listed = REPO / "packaging" / "cuda" / "gpu-vllm-requirements.txt"
    pinned = {}
    for line in requirement_lines(listed):
        name, rest = line.split("==", 1)
        version, hashed = rest.split(" --hash=sha256:")
        assert len(hashed) == 64 and int(hashed, 16) >= 0, line
        assert name not in pinned, f"{name} twice"
        pinned[name] = (version, hashed)
    machine = {
        line.split("==")[0].lower().replace("_", "-")
        for line in requirement_lines(REPO / "packaging" / "cuda" / "gpu-machine-packages.txt")
    }
    assert not set(pinned) & machine, "shadows the machine's"
    # The OpenAI server (`vllm serve`), at the 0.34.0 list's wheels.
    served = {"uvicorn", "httptools", "websockets", "python-multipart", "model-hosting-container-standards", "jmespath"}
    assert served <= set(pinned)
    newer = {}
    for line in requirement_lines(listed.parent / "gpu-vllm-0.34.0-requirements.txt"):
        if not line.startswith("-r "):
            name, rest = line.split("==", 1)
            newer[name] = tuple(rest.split(" --hash=sha256:"))
    assert {name: pinned[name] for name in served} == {name: newer[name] for name in served}


def test_the_034_list_pins_every_wheel_by_hash_and_reads_the_torch_cuda_list():
    listed = REPO / "packaging" / "cuda" / "gpu-vllm-0.34.0-requirements.txt"
    lines = requirement_lines(listed)
    included = [line.split()[1] for line in lines if line.startswith("-r ")]
    assert included == ["gpu-torch-2.14-cuda-libs.txt"]
    pins = [line for line in lines if not line.startswith("-r ")]
    pins += requirement_lines(listed.parent / included[0])
    pinned = {}
    for line in pins:
        name, rest = line.split("==", 1)
        version, hashed = rest.split(" --hash=sha256:")
        assert len(hashed) == 64 and int(hashed, 16) >= 0, line
        assert name not in pinned, f"{name} twice"
        pinned[name] = (version, hashed)
    assert pinned["torch"] == ("2.14.0", TORCH_214_SHA256)
    assert pinned["triton"][0] == "3.8.0" and pinned["torchvision"][0] == "0.29.0"
    assert pinned["xgrammar"][0] == "0.2.8" and pinned["apache-tvm-ffi"][0] == "0.1.11"
    assert pinned["nvidia-nccl-cu13"][0] == "2.30.7"
    assert "vllm" not in pinned, "vLLM's wheel travels by its pin, not by the list"


def fake_python(tmp_path: Path) -> Path:
    """A `python` that logs each call (with PYTHONPATH and the cuDNN switch) and
    does what the check needs of it: pip --target and zipfile -e make their
    folder (the deps folder with a torch in it where FAKE_TORCH is set), the
    probe for the machine's CUDA libraries names FAKE_NVIDIA, the carried
    torch's report says its cuDNN is older."""
    script = tmp_path / "python"
    script.write_text(r"""#!/usr/bin/env bash
skip=${PYTORCH_SKIP_CUDNN_COMPATIBILITY_CHECK:-}
sampler=${VLLM_USE_FLASHINFER_SAMPLER:-}
echo "PYTHONPATH=${PYTHONPATH:-} SKIP=$skip CMAKE=${SKBUILD_CMAKE_DEFINE:-} SAMPLER=$sampler :: $*" >> "$FAKE_LOG"
args=("$@")
if [[ $1 == -m && $2 == pip ]]; then
  for ((i = 0; i < ${#args[@]}; i++)); do [[ ${args[i]} == --target ]] && target=${args[i + 1]}; done
  [[ -n ${target:-} ]] || exit 0
  mkdir -p "$target"
  if [[ $target == */deps.tmp && -n ${FAKE_TORCH:-} ]]; then
    mkdir -p "$target/torch" "$target/torch-2.14.0.dist-info" "$target/nvidia/nccl"
  elif [[ $target == */lmcache.tmp ]]; then
    mkdir -p "$target/lmcache" "$target/tests"  # cufile-python's stray top-level tests
  elif [[ $target == */engine.tmp ]]; then
    mkdir -p "$target/activekv-0.1.0.dist-info"
    echo "Requires-Dist: torch==${FAKE_BUILT_AGAINST:-2.14.0}" > "$target/activekv-0.1.0.dist-info/METADATA"
  fi
elif [[ $1 == -m && $2 == zipfile ]]; then
  mkdir -p "$5"
elif [[ $1 == -c && $2 == *'"nvidia"'* ]]; then
  echo "$FAKE_NVIDIA"
elif [[ $1 == -c && $2 == *CUDNN_OLDER* ]]; then
  echo "torch 2.14.0"; echo "CUDNN_OLDER"
fi
""")
    script.chmod(0o755)
    machine = tmp_path / "machine" / "nvidia"
    for lib in ("cu13", "cudnn", "nccl"):
        (machine / lib).mkdir(parents=True)
    series = tmp_path / "patches" / "0.34.0" / "series"
    series.parent.mkdir(parents=True)
    series.write_text("# no patch: the check's order is under test, not the series\n")
    (tmp_path / "patches" / "0.26.0").mkdir()
    (tmp_path / "patches" / "0.26.0" / "series").write_text("# none\n")
    return script


def check(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    env = {
        **{k: v for k, v in os.environ.items() if k != "LMCACHE"},
        "PYTHON": str(tmp_path / "python"),
        "FAKE_LOG": str(tmp_path / "log"),
        "FAKE_NVIDIA": str(tmp_path / "machine" / "nvidia"),
        "PATCHES": str(tmp_path / "patches"),
        "WORK": str(tmp_path / "work"),
        "PYTHONPATH": "",
        **env,
    }
    env.pop("PYTORCH_SKIP_CUDNN_COMPATIBILITY_CHECK", None)
    return subprocess.run(["bash", str(CHECK), *args], env=env, capture_output=True, text=True, check=False)


def logged(tmp_path: Path, marker: str) -> str:
    return next(line for line in (tmp_path / "log").read_text().splitlines() if marker in line)


def test_a_carried_torch_comes_first_before_the_engine_is_built_and_for_the_tests(tmp_path):
    fake_python(tmp_path)
    work = tmp_path / "work"
    done = check(
        tmp_path,
        "--vllm-version",
        "0.34.0",
        "--engine-source",
        "--vllm",
        str(tmp_path / "vllm-patched.whl"),
        "--deps",
        str(tmp_path / "wheels"),
        "--",
        "-k",
        "streaming",
        FAKE_TORCH="1",
        PYTHONPATH="/outer",
    )
    assert done.returncode == 0, done.stderr
    built = logged(tmp_path, f"--target {work}/engine.tmp ./engine")
    assert built.startswith(f"PYTHONPATH={work}/deps:/outer "), built
    assert f"CMAKE=Torch_DIR={work}/deps/torch/share/cmake/Torch " in built
    assert "built against torch 2.14.0" in done.stdout
    tests = logged(tmp_path, "-m pytest -m gpu tests/gpu")
    assert tests.startswith(f"PYTHONPATH={work}/engine:{work}/vllm:{work}/deps:{REPO}:/outer SKIP=1 "), tests
    assert tests.endswith("-k streaming")
    installed = logged(tmp_path, f"--target {work}/deps.tmp")
    assert "-r packaging/cuda/gpu-vllm-0.34.0-requirements.txt" in installed
    links = work / "deps" / "nvidia"
    assert (links / "cu13").resolve() == (tmp_path / "machine" / "nvidia" / "cu13").resolve()
    assert not (links / "nccl").is_symlink(), "the carried NCCL stays"
    assert (work / "vllm-version").read_text().strip() == "0.34.0"


def test_an_engine_built_against_another_torch_is_refused(tmp_path):
    fake_python(tmp_path)
    refused = check(
        tmp_path,
        "--vllm-version",
        "0.34.0",
        "--engine-source",
        "--vllm",
        str(tmp_path / "vllm-patched.whl"),
        "--deps",
        str(tmp_path / "wheels"),
        FAKE_TORCH="1",
        FAKE_BUILT_AGAINST="2.11.0+cu130",
    )
    assert refused.returncode == 3
    assert "the engine was built against torch 2.11.0+cu130, not the carried 2.14.0" in refused.stderr
    assert not (tmp_path / "work" / "engine").exists()


def test_without_a_carried_torch_the_engine_builds_on_the_machines(tmp_path):
    fake_python(tmp_path)
    done = check(
        tmp_path, "--engine-source", "--vllm", str(tmp_path / "vllm-patched.whl"), "--deps", str(tmp_path / "wheels")
    )
    assert done.returncode == 0, done.stderr
    built = logged(tmp_path, "./engine")
    assert built.startswith("PYTHONPATH= SKIP= CMAKE= "), built
    assert "-r packaging/cuda/gpu-vllm-requirements.txt" in logged(tmp_path, "deps.tmp")
    assert not (tmp_path / "work" / "deps" / "nvidia").exists()


def test_a_work_folder_of_another_version_is_refused(tmp_path):
    fake_python(tmp_path)
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "vllm-version").write_text("0.26.0\n")
    refused = check(tmp_path, "--vllm-version", "0.34.0", "--engine-source", "--vllm", "x.whl", "--deps", "wheels")
    assert refused.returncode == 3
    assert "holds the installs for vLLM 0.26.0, not 0.34.0" in refused.stderr


def test_the_check_says_a_version_has_no_list_or_no_series(tmp_path):
    fake_python(tmp_path)
    unlisted = check(tmp_path, "--vllm-version", "0.99.0", "--engine-source", "--vllm", "x.whl", "--deps", "wheels")
    assert unlisted.returncode == 3
    assert "packaging/cuda/gpu-vllm-0.99.0-requirements.txt is missing" in unlisted.stderr
    shutil.rmtree(tmp_path / "patches" / "0.34.0")
    unpatched = check(tmp_path, "--engine-source", "--vllm", "x.whl", "--deps", "wheels", VLLM_VERSION="0.34.0")
    assert unpatched.returncode == 3
    assert f"no patch series for vLLM 0.34.0: {tmp_path}/patches/0.34.0/series is missing" in unpatched.stderr
    assert not (tmp_path / "log").exists(), "nothing was installed"


def test_fetch_downloads_the_versions_list(tmp_path):
    fake_python(tmp_path)
    assert check(tmp_path, "--vllm-version", "0.34.0", "--fetch", str(tmp_path / "dl")).returncode == 0
    assert "--require-hashes -r packaging/cuda/gpu-vllm-0.34.0-requirements.txt -d " in logged(tmp_path, "download")
    (tmp_path / "log").unlink()
    assert check(tmp_path, "--fetch", str(tmp_path / "dl")).returncode == 0
    assert "-r packaging/cuda/gpu-vllm-requirements.txt -d " in logged(tmp_path, "download")


def release_download(tmp_path: Path) -> Path:
    """A download holding deps/ and an empty release/, GoogleTest, and a
    distributions file (PINS) whose pinned wheel is not there."""
    download = tmp_path / "download"
    (download / "deps").mkdir(parents=True)
    (download / "deps" / "dep-1.0-py3-none-any.whl").write_bytes(os.urandom(10 << 10))
    (download / "release").mkdir()
    (tmp_path / "googletest").mkdir()
    (tmp_path / "googletest" / "CMakeLists.txt").write_text("project(googletest)\n")
    (tmp_path / "pins.toml").write_text(
        f'[[distribution]]\nname = "vllm"\nversion = "0.26.0"\nfile = "{WHEEL}"\nsha256 = "{"0" * 64}"\n'
    )
    return download


def pack_release(tmp_path: Path, download: Path) -> subprocess.CompletedProcess[str]:
    return run(
        tmp_path,
        "pack",
        str(tmp_path / "carry"),
        DOWNLOADED=str(download),
        GOOGLETEST_SRC=str(tmp_path / "googletest"),
        CARRY_LIMIT=str(tree_bytes() + (2 << 20) + PIECE),
        MIN_PIECE="1",
        RELEASE="1",
    )


def test_a_release_is_carried_instead_of_the_pinned_wheel_and_named_for_the_checks(tmp_path):
    """RELEASE=1: the release's patched vLLM and engine wheels travel in the
    archive (the pinned pristine wheel stays behind), and `where` names them."""
    release = release_download(tmp_path) / "release"
    patched = "vllm-0.26.0+activekv.2-cp38-abi3-manylinux_2_28_x86_64.whl"
    engine = "activekv-0.1.0+cu130-cp312-cp312-manylinux_2_34_x86_64.whl"
    (release / patched).write_bytes(os.urandom(20 << 10))
    (release / engine).write_bytes(os.urandom(4 << 10))
    done = pack_release(tmp_path, release.parent)
    assert done.returncode == 0, done.stderr
    for n in range(len(folders(tmp_path / "carry"))):
        taken = take(tmp_path, n)
        assert taken.returncode == 0, taken.stderr
    stage = tmp_path / "stage"
    assert (stage / "release" / patched).read_bytes() == (release / patched).read_bytes()
    assert not (stage / WHEEL).exists()
    assert f"--engine {stage}/release/{engine} --vllm {stage}/release/{patched}" in taken.stdout


def test_a_release_pack_without_a_patched_vllm_is_refused(tmp_path):
    refused = pack_release(tmp_path, release_download(tmp_path))
    assert refused.returncode == 3
    assert "a patched vLLM wheel" in refused.stderr and not (tmp_path / "carry").exists()


# LMCACHE=1: LMCache's wheels (packaging/cuda/gpu-lmcache-requirements.txt) with
# vLLM 0.26.0's, for the served benchmark's `lmcache` engine.

LMCACHE_LIST = REPO / "packaging" / "cuda" / "gpu-lmcache-requirements.txt"
LMCACHE_WHEEL = "lmcache-0.5.3-cp312-cp312-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl"


def pack_lmcache(tmp_path: Path, with_its_wheel: bool = True, **env: str) -> subprocess.CompletedProcess[str]:
    """`pack` with LMCACHE=1 from a download whose deps/ holds LMCache's wheel
    beside vLLM's dependencies (or not), the wheel pinned."""
    download = tmp_path / "download"
    (download / "deps").mkdir(parents=True)
    (download / "deps" / "dep-1.0-py3-none-any.whl").write_bytes(os.urandom(10 << 10))
    if with_its_wheel:
        (download / "deps" / LMCACHE_WHEEL).write_bytes(os.urandom(6 << 10))
    wheel = os.urandom(24 << 10)
    (download / WHEEL).write_bytes(wheel)
    (tmp_path / "googletest").mkdir()
    (tmp_path / "googletest" / "CMakeLists.txt").write_text("project(googletest)\n")
    (tmp_path / "pins.toml").write_text(
        f'[[distribution]]\nname = "vllm"\nversion = "0.26.0"\nfile = "{WHEEL}"\n'
        f'sha256 = "{hashlib.sha256(wheel).hexdigest()}"\n'
    )
    return run(
        tmp_path,
        "pack",
        str(tmp_path / "carry"),
        DOWNLOADED=str(download),
        GOOGLETEST_SRC=str(tmp_path / "googletest"),
        CARRY_LIMIT=str(tree_bytes() + (2 << 20) + PIECE),
        MIN_PIECE="1",
        **{"LMCACHE": "1", **env},
    )


def test_lmcache_wheels_travel_in_deps_and_where_names_the_check_with_lmcache(tmp_path):
    packed_now = pack_lmcache(tmp_path)
    assert packed_now.returncode == 0, packed_now.stderr
    assert "packed vLLM 0.26.0 and LMCache's wheels" in packed_now.stdout
    carry, stage = tmp_path / "carry", tmp_path / "stage"
    assert (carry / "c0" / "carries-lmcache").exists()
    for name in folders(carry):
        assert carried_bytes(list((carry / name).rglob("*"))) <= PIECE, f"{name} passes a call"
    for n in range(len(folders(carry))):  # taken without the switch: c0 says it
        taken = take(tmp_path, n)
        assert taken.returncode == 0, taken.stderr
    assert (stage / "deps" / LMCACHE_WHEEL).read_bytes() == (
        tmp_path / "download" / "deps" / LMCACHE_WHEEL
    ).read_bytes()
    assert (stage / WHEEL).exists()
    check_line = (
        f"LMCACHE=1 ci/gpu-vllm-check.sh --vllm-version 0.26.0 --engine-source --vllm {stage}/{WHEEL} "
        f"--deps {stage}/deps"
    )
    assert check_line in taken.stdout
    assert check_line in run(tmp_path, "where").stdout


def test_a_plain_pack_says_no_lmcache_and_lmcache_0_is_plain(tmp_path):
    carry = packed(tmp_path, LMCACHE="0")
    assert not (carry / "c0" / "carries-lmcache").exists()
    for n in range(len(folders(carry))):
        taken = take(tmp_path, n)
    assert taken.returncode == 0, taken.stderr
    assert "\nci/gpu-vllm-check.sh --vllm-version 0.26.0 --engine-source" in taken.stdout
    assert "LMCACHE" not in taken.stdout


def test_lmcache_pack_without_its_wheel_is_refused_and_nothing_packed(tmp_path):
    refused = pack_lmcache(tmp_path, with_its_wheel=False)
    assert refused.returncode == 3
    assert f"LMCACHE: no {tmp_path}/download/deps/lmcache-0.5.3-*.whl" in refused.stderr
    assert not (tmp_path / "carry").exists() and not (tmp_path / "carry.new").exists()


def test_lmcache_take_of_a_pack_without_it_is_refused(tmp_path):
    carry = packed(tmp_path)
    refused = run(tmp_path, "take", "0", str(carry), LMCACHE="1")
    assert refused.returncode == 3
    assert f"{carry}/c0 was packed without LMCache's wheels: pack again with LMCACHE=1" in refused.stderr
    assert (carry / "c0" / "piece.00").exists() and not (tmp_path / "stage").exists()


def test_lmcache_with_another_vllm_is_refused_by_both_scripts(tmp_path):
    fake_python(tmp_path)
    for args, env in (
        (["--vllm-version", "0.34.0", "--fetch", str(tmp_path / "dl")], {}),
        (["--fetch", str(tmp_path / "dl")], {"VLLM_VERSION": "0.34.0"}),
        (["--vllm-version", "0.34.0", "--engine-source", "--vllm", "x.whl", "--deps", "wheels"], {}),
    ):
        refused = check(tmp_path, *args, LMCACHE="1", **env)
        assert refused.returncode == 3
        assert (
            "LMCACHE=1: LMCache's wheels (packaging/cuda/gpu-lmcache-requirements.txt) are resolved for "
            "vLLM 0.26.0 only, not 0.34.0" in refused.stderr
        )
    assert not (tmp_path / "log").exists(), "nothing was fetched or installed"
    refused = run(tmp_path, "--vllm-version", "0.34.0", "pack", str(tmp_path / "carry"), LMCACHE="1")
    assert refused.returncode == 3
    assert "travel with vLLM 0.26.0 only, not 0.34.0" in refused.stderr and not (tmp_path / "carry").exists()


def test_lmcache_is_fetched_with_vllms_list_installed_apart_and_on_the_path_after_vllms_deps(tmp_path):
    fake_python(tmp_path)
    assert check(tmp_path, "--fetch", str(tmp_path / "dl"), LMCACHE="1").returncode == 0
    assert (
        "--require-hashes -r packaging/cuda/gpu-vllm-requirements.txt "
        "-r packaging/cuda/gpu-lmcache-requirements.txt -d " in logged(tmp_path, "download")
    )
    (tmp_path / "log").unlink()
    work = tmp_path / "work"
    done = check(
        tmp_path,
        "--engine-source",
        "--vllm",
        str(tmp_path / "vllm-patched.whl"),
        "--deps",
        str(tmp_path / "wheels"),
        LMCACHE="1",
        PYTHONPATH="/outer",
    )
    assert done.returncode == 0, done.stderr
    assert "-r packaging/cuda/gpu-vllm-requirements.txt" in logged(tmp_path, f"--target {work}/deps.tmp")
    installed = logged(tmp_path, f"--target {work}/lmcache.tmp")
    assert (
        f"--find-links {tmp_path}/wheels --require-hashes -r packaging/cuda/gpu-lmcache-requirements.txt" in installed
    )
    assert (work / "lmcache" / "lmcache").is_dir() and not (work / "lmcache" / "tests").exists()
    path = f"{work}/engine:{work}/vllm:{work}/deps:{work}/lmcache:{REPO}:/outer"
    assert logged(tmp_path, "-m pytest -m gpu tests/gpu").startswith(f"PYTHONPATH={path} "), "the tests' path"
    log = (tmp_path / "log").read_text()
    assert "compiled ops" in log and log.index("LMCacheConnectorV1Impl") < log.index("-m pytest -m gpu"), (
        "the connector and its compiled ops are checked before the tests"
    )
    # Later commands there (the served benchmark, the parity gate) source the same environment.
    assert f"source {work}/env.sh" in done.stdout
    assert f"export PYTHONPATH={path}\n" in (work / "env.sh").read_text(), "the path kept for the served benchmark"
    # No vLLM there compiles FlashInfer's sampler at start-up (minutes on a fresh machine).
    assert " SAMPLER=0 :: " in logged(tmp_path, "-m pytest -m gpu tests/gpu")
    assert "export VLLM_USE_FLASHINFER_SAMPLER=0\n" in (work / "env.sh").read_text()


def test_the_lmcache_list_pins_by_hash_only_what_the_machine_and_vllms_list_lack():
    def names(path: Path) -> set[str]:
        return {line.split("==")[0].lower().replace("_", "-") for line in requirement_lines(path)}

    lines = requirement_lines(LMCACHE_LIST)
    for line in lines:
        name, rest = line.split("==", 1)
        version, hashed = rest.split(" --hash=sha256:")
        assert len(hashed) == 64 and int(hashed, 16) >= 0, line
    assert "lmcache==0.5.3 --hash=sha256:" in "\n".join(lines)
    listed = names(LMCACHE_LIST)
    assert len(listed) == len(lines), "a name twice"
    machine = names(REPO / "packaging" / "cuda" / "gpu-machine-packages.txt")
    vllms = names(REPO / "packaging" / "cuda" / "gpu-vllm-requirements.txt")
    assert not listed & machine, "shadows the machine's (numpy, protobuf, ...)"
    assert not listed & vllms, "twice with vLLM 0.26.0's list"
    assert {"aiofile", "caio"} <= listed and "uvicorn" in vllms, "the in-process connector imports them"
