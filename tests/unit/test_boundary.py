"""The retention audit labels every hunk of the vLLM series as a contract; an
unlabelled or non-contract hunk is a violation. The census finds every method
vLLM calls native, and would flag a Python one."""

from __future__ import annotations

import shutil

import pytest

from pipeline import boundary
from pipeline.patch_series import PATCHES_DIR


@pytest.mark.parametrize("version", ["0.26.0", "0.32.0", "0.34.0"])
def test_every_hunk_of_each_series_is_a_cited_contract(version):
    rows, violations = boundary.retention(version)
    assert violations == []
    assert rows and all(r["label"] == "contract" and r["cite"] for r in rows)
    assert all(r["version"] == version and f"(vLLM {version}" in r["cite"] for r in rows)
    assert sum(r["python_lines"] for r in rows) > 0


def test_the_audit_covers_every_version_the_targets_name():
    from packaging.version import Version

    from pipeline import config
    from pipeline.patch_series import supported_versions

    cfg = config.load(environ={})
    named = sorted({t.vllm_version for t in cfg.targets.values()}, key=Version)
    assert boundary.release_versions(cfg) == named
    assert {"0.26.0", "0.32.0"} <= set(named) and set(named) <= set(supported_versions())


def test_a_label_of_another_version_does_not_count(tmp_path):
    path = labels_copy(tmp_path, lambda t: t.replace('version = "0.26.0"', 'version = "0.25.0"'))
    rows, violations = boundary.retention("0.26.0", path)
    assert len(violations) == len(rows) == 13
    assert all("no label for vLLM 0.26.0" in v for v in violations)
    _, violations = boundary.retention("0.32.0", path)
    assert violations == []


def labels_copy(tmp_path, edit):
    path = tmp_path / "retention.toml"
    path.write_text(edit(boundary.LABELS.read_text()))
    return path


def test_an_unlabelled_hunk_is_a_violation(tmp_path):
    text = boundary.LABELS.read_text()
    first, _, rest = text.partition("[[hunk]]")
    kept = "[[hunk]]".join(["", *rest.split("[[hunk]]")[1:]])  # drop the first entry
    path = tmp_path / "retention.toml"
    path.write_text(first + kept)
    _, violations = boundary.retention("0.32.0", path)
    assert len(violations) == 1 and "no label" in violations[0] and "base.py hunk 1" in violations[0]


def test_a_convenience_hunk_is_a_violation(tmp_path):
    path = labels_copy(tmp_path, lambda t: t.replace('label = "contract"', 'label = "convenience"', 1))
    _, violations = boundary.retention("0.32.0", path)
    assert violations == [
        "0001-connector-has-layer-work.patch vllm/distributed/kv_transfer/kv_connector/v1/base.py "
        "hunk 1: labelled convenience; port it"
    ]


def test_hunks_are_read_per_file(tmp_path):
    patches = tmp_path / "patches"
    shutil.copytree(PATCHES_DIR / "0.32.0", patches / "0.32.0")
    rows, _ = boundary.retention("0.32.0", patches_dir=patches)
    assert [(r["patch"][:4], r["file"].rsplit("/", 1)[1], r["hunk"]) for r in rows] == [
        ("0001", "base.py", 1),
        ("0001", "kv_transfer_utils.py", 1),
        ("0002", "base.py", 1),
        ("0002", "kv_transfer_utils.py", 1),
        ("0002", "attention.py", 1),
        ("0002", "attention.py", 2),
        ("0002", "kv_cache_utils.py", 1),
        ("0002", "kv_cache_utils.py", 2),
        ("0002", "kv_cache_utils.py", 3),
        ("0003", "cache.py", 1),
        ("0003", "cache.py", 2),
        ("0003", "vllm.py", 1),
    ]
    shutil.copytree(PATCHES_DIR / "0.26.0", patches / "0.26.0")
    rows, _ = boundary.retention("0.26.0", patches_dir=patches)
    assert [(r["patch"][:4], r["file"].rsplit("/", 1)[1], r["hunk"]) for r in rows] == [
        ("0001", "base.py", 1),
        ("0001", "kv_transfer_utils.py", 1),
        ("0002", "base.py", 1),
        ("0002", "kv_transfer_utils.py", 1),
        ("0002", "attention.py", 1),
        ("0002", "attention.py", 2),
        ("0002", "kv_cache_utils.py", 1),
        ("0002", "kv_cache_utils.py", 2),
        ("0002", "kv_cache_utils.py", 3),
        ("0002", "kv_cache_utils.py", 4),
        ("0003", "cache.py", 1),
        ("0003", "cache.py", 2),
        ("0003", "vllm.py", 1),
    ]
    shutil.copytree(PATCHES_DIR / "0.34.0", patches / "0.34.0")
    rows, _ = boundary.retention("0.34.0", patches_dir=patches)
    assert [(r["patch"][:4], r["file"].rsplit("/", 1)[1], r["hunk"]) for r in rows] == [
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


def test_census_finds_every_vllm_facing_method_native():
    rows, violations = boundary.census()
    assert violations == []
    names = {r["where"] for r in rows}
    for method in (
        "start_load_kv",
        "wait_for_layer_load",
        "save_kv_layer",
        "wait_for_save",
        "get_finished",
        "build_connector_meta",
        "has_layer_work",
    ):
        assert f"ActiveKVHostConnector.{method}" in names
    assert any(n.startswith("entry point activekv:register") for n in names)


def test_census_would_flag_a_python_method():
    def in_python(self):
        return None

    assert not boundary.is_native(in_python)
    assert not boundary.is_native(property(in_python))
    assert boundary.is_native(len)
