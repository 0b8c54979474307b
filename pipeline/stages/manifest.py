"""Stage: manifest. The signed record of a release, assembled from the stage
records (build.json, audit.json, patch.json, runtime.json, parity.json).

It refuses to assemble unless every target's audit passed and every gating
parity cell passed: a manifest exists only for a releasable build. The
manifest is checked against release_manifest/schema.json (the release's
format, file names included: pipeline/release_format.py), an SBOM (CycloneDX
JSON) of the wheels and images is written beside it, and the manifest is
signed with an Ed25519 key (detached signature, base64, in <manifest>.sig;
the key's handling is pipeline/signing.py). pipeline/verify.py checks a
published release against a pinned key.
"""

from __future__ import annotations

import base64
import datetime
import json
import uuid
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import quote

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from pipeline import provenance, signing
from pipeline.artifacts import gate_problem, inputs_digest, refuse_links, wheel_differences
from pipeline.config import Profile
from pipeline.container import ContainerRuntime
from pipeline.digest import sha256_of
from pipeline.errors import ManifestError
from pipeline.paths import MANIFEST_DIR, RELEASE_DIR, VLLM_DIR, relative
from pipeline.release_format import (
    FINGERPRINT_FILE,
    PROJECT,
    PUBLIC_KEY_FILE,
    SBOM_FORMAT,
    SCHEMA_ID,
    WHEEL_KINDS,
    check_schema,
    manifest_name,
    sbom_name,
    wheel_name,
)
from pipeline.run import Run
from pipeline.source import engine_version


def _read(path: Path, what: str) -> dict:
    if not path.is_file():
        raise ManifestError(f"{relative(path)}: missing; run the {what} stage first")
    return json.loads(path.read_text())


def _file_artifact(kind: str, target: str, path: Path) -> dict:
    refuse_links([path], kind, ManifestError)
    entry = {"kind": kind, "target": target, "file": path.name, "sha256": sha256_of(path), "size": path.stat().st_size}
    if path.suffix == ".whl":
        parts = wheel_name(path.name, ManifestError)
        entry["python_tag"], entry["platform_tag"] = parts.python_tag, parts.platform_tag
    return entry


def assemble(
    *,
    version: str,
    profile: str,
    targets: list[str],
    release_dir: Path,
    vllm_dir: Path,
    out: Path,
    parity_records: Mapping[str, Path] = {},
    image_packages: Mapping[str, list] = {},
) -> dict:
    """The manifest dict (and the SBOM file in `out`); raises ManifestError
    when a stage record is missing or says the release must not be made.
    Each target's parity record is release_dir/<target>/parity.json unless
    parity_records names another file."""
    artifacts, audits, torch, vllm, compilers, bases = [], {}, {}, {}, {}, []
    parity_cells, parity_targets = [], {}
    series_sha = None
    commit = dirty = None
    for target in targets:
        tdir = release_dir / target
        build = _read(tdir / "build.json", f"build (--target {target})")
        audit = _read(tdir / "audit.json", f"audit (--target {target})")
        runtime = _read(tdir / "runtime.json", f"runtime-image (--target {target})")
        _check_audit(target, audit)
        if commit not in (None, build["commit"]):
            raise ManifestError(f"target {target} was built from {build['commit']}, another from {commit}")
        commit, dirty = build["commit"], bool(dirty) or build["tree_dirty"]
        audits[target] = {"passed": True, "findings": 0, "load_checked": audit["load_checked"]}
        torch[target] = build["torch"]
        compilers[target] = build["compiler"]
        bases += [build["builder_image"], runtime["base"]]
        patch = _patch_record(target, vllm_dir, runtime)
        vllm[target] = f"{patch['distribution']}=={patch['local_version']}"
        series_sha = patch["series"]["sha256"]
        target_artifacts = _target_artifacts(target, tdir, vllm_dir, audit, runtime, patch, version, commit)
        artifacts += target_artifacts
        shipped = [a for a in target_artifacts if a["kind"] in WHEEL_KINDS]
        parity = _read(parity_records.get(target, tdir / "parity.json"), f"parity (--target {target})")
        _check_parity(target, parity, shipped)
        parity_targets[target] = _parity_summary(parity)
        parity_cells += [
            {"target": target, **{k: c[k] for k in ("mode", "scenario", "gating", "result")}} for c in parity["cells"]
        ]
    sbom = write_sbom(out / sbom_name(version), version, artifacts, image_packages)
    artifacts.append(_file_artifact("sbom", "all", sbom))
    manifest = {
        "schema": SCHEMA_ID,
        "version": version,
        "commit": commit,
        "tree_dirty": bool(dirty),
        "build_time": datetime.datetime.now(datetime.UTC).replace(microsecond=0).isoformat(),
        "profile": profile,
        "artifacts": artifacts,
        "versions": {
            "engine": version,
            "torch": torch,
            "vllm": vllm,
            "patch_series_sha256": series_sha,
            "base_images": [dict(b) for b in {json.dumps(b, sort_keys=True): b for b in bases}.values()],
            "compilers": compilers,
        },
        "audit": audits,
        "parity": {"passed": True, "targets": parity_targets, "cells": parity_cells},
        "sbom": {"file": sbom.name, "sha256": sha256_of(sbom), "format": SBOM_FORMAT},
    }
    check_schema(manifest)
    return manifest


def _target_artifacts(
    target: str, tdir: Path, vllm_dir: Path, audit: dict, runtime: dict, patch: dict, version: str, commit: str
) -> list[dict]:
    """One target's artifacts, each file checked against the stage record
    that vouched for it: the engine wheels, the patched vLLM and its patch,
    the launcher, the runtime image."""
    artifacts = []
    for w in audit["wheels"]:
        path = tdir / "wheels" / w["file"]
        if not path.is_file() or sha256_of(path) != w["sha256"]:
            raise ManifestError(f"{path}: not the wheel the audit passed (missing or changed since)")
        artifacts.append(_file_artifact("engine-wheel", target, path))
    pdir = vllm_dir / f"{patch['distribution']}-{patch['version']}"
    artifacts.append(_file_artifact("vllm-wheel", target, pdir / patch["patched"]["file"]))
    artifacts.append(_file_artifact("vllm-patch", target, pdir / patch["combined_patch"]["file"]))
    launcher = tdir / "launcher" / runtime["launcher"]["file"]
    if not launcher.is_file() or sha256_of(launcher) != runtime["launcher"]["sha256"]:
        raise ManifestError(f"{launcher}: not the launcher in the runtime image (missing or changed)")
    artifacts.append(_file_artifact("launcher", target, launcher))
    # The image holds exactly the audited wheels, the patched vLLM and this
    # launcher: its inputs digest (also its label) is recomputed from them.
    shipped_files = [tdir / "wheels" / w["file"] for w in audit["wheels"]]
    shipped_files += [pdir / patch["patched"]["file"], launcher]
    artifacts.append(_image_artifact(target, runtime, version, commit, shipped_files))
    return artifacts


def _check_audit(target: str, audit: dict) -> None:
    if not audit["passed"]:
        raise ManifestError(f"target {target}: the payload audit did not pass; no manifest")
    if not audit["load_checked"]:
        raise ManifestError(
            f"target {target}: the payload audit skipped the load check "
            f"(--static-only); a release needs the full audit: run the audit "
            f"stage without --static-only"
        )


def _patch_record(target: str, vllm_dir: Path, runtime: dict) -> dict:
    """The patch-vllm stage's record of the vLLM wheel in the target's runtime image."""
    patch_records = [json.loads(p.read_text()) for p in sorted(vllm_dir.glob("*/patch.json"))]
    patch = next((r for r in patch_records if r["patched"]["file"] in runtime["wheels"]), None)
    if patch is None:
        raise ManifestError(
            f"target {target}: no patch.json for the vLLM wheel in its runtime image; run the patch-vllm stage first"
        )
    return patch


def _image_artifact(target: str, runtime: dict, version: str, commit: str, shipped_files: list[Path]) -> dict:
    """The runtime image's entry, once its inputs digest (also its label) is
    recomputed from exactly the files to be published."""
    if inputs_digest(runtime.get("version", version), commit, shipped_files) != runtime["inputs_digest"]:
        raise ManifestError(
            f"target {target}: the runtime image {runtime['ref']} was built from other "
            f"wheels or another launcher than those audited and to be published; run "
            f"the runtime-image stage again"
        )
    return {
        "kind": "image",
        "target": target,
        "ref": runtime["ref"],
        "digest": runtime["id"],
        "inputs_digest": runtime["inputs_digest"],
    }


def _parity_summary(parity: dict) -> dict:
    return {
        "source": parity.get("source", "unknown"),
        "python": parity.get("python"),
        "wheels": [{"file": w["file"], "sha256": w["sha256"]} for w in parity["wheels"]],
        "units": parity.get("units", {}),
    }


def _check_parity(target: str, parity: dict, shipped: list[dict]) -> None:
    """The target's parity record passed and ran exactly the wheels that
    will be published (by sha256): a gate run on other bytes proves nothing."""
    if parity.get("stage") != "parity" or parity.get("target") != target:
        raise ManifestError(
            f"target {target}: its parity record is not the parity stage's record for "
            f"{target}; run `python -m pipeline parity --target {target}`"
        )
    if problem := gate_problem(parity):
        raise ManifestError(f"target {target}: the parity gate failed ({problem}); nothing is released")
    ran = parity.get("wheels")
    differences = wheel_differences(ran if isinstance(ran, list) else [], shipped)
    if differences:
        raise ManifestError(
            f"target {target}: its parity record ({parity.get('source', 'unknown source')}) is for other "
            f"wheels than those to be published: {'; '.join(differences)}; run the parity stage again on "
            f"the published wheels"
        )


def write_sbom(path: Path, version: str, artifacts: list[dict], image_packages: Mapping[str, list]) -> Path:
    """A CycloneDX 1.5 SBOM: each wheel, each image and the Python packages
    installed in it (pip's list, read from the image)."""
    components = []
    for a in artifacts:
        if a["kind"] in WHEEL_KINDS:
            parts = wheel_name(a["file"], ManifestError)
            components.append(
                {
                    "type": "library",
                    "name": parts.project,
                    "version": parts.version,
                    "purl": f"pkg:pypi/{parts.project}@{quote(parts.version)}",
                    "hashes": [{"alg": "SHA-256", "content": a["sha256"]}],
                    "bom-ref": a["file"],
                }
            )
        elif a["kind"] == "image":
            inside = [
                {
                    "type": "library",
                    "name": p["name"],
                    "version": p["version"],
                    "purl": f"pkg:pypi/{p['name'].lower()}@{p['version']}",
                }
                for p in image_packages.get(a["target"], [])
            ]
            components.append(
                {
                    "type": "container",
                    "name": a["ref"],
                    "version": version,
                    "hashes": [{"alg": "SHA-256", "content": a["digest"].removeprefix("sha256:")}],
                    "bom-ref": a["ref"],
                    "components": inside,
                }
            )
    bom = {
        "bomFormat": "CycloneDX",
        "specVersion": "1.5",
        "serialNumber": f"urn:uuid:{uuid.uuid5(uuid.NAMESPACE_URL, f'{PROJECT}/{version}')}",
        "version": 1,
        "metadata": {"component": {"type": "application", "name": PROJECT, "version": version}},
        "components": components,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(bom, indent=2, sort_keys=True) + "\n")
    return path


# --- signing ---------------------------------------------------------------------

# The key functions live in pipeline/signing.py; these names stay for callers.
generate_key = signing.generate_key
load_private_key = signing.load_private_key
public_pem = signing.public_pem


def write_signed(manifest: dict, out: Path, key: Ed25519PrivateKey) -> tuple[Path, Path, Path]:
    """manifest JSON, its detached signature and the public key, in `out`;
    the key's fingerprint (what operators pin) goes beside them as a record
    of the stage: it is printed by the release and never published as a
    trust root."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / manifest_name(manifest["version"])
    data = (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()
    path.write_bytes(data)
    sig = path.with_name(path.name + ".sig")
    sig.write_text(base64.b64encode(key.sign(data)).decode() + "\n")
    pub = out / PUBLIC_KEY_FILE
    pub.write_bytes(public_pem(key))
    (out / FINGERPRINT_FILE).write_text(signing.fingerprint(key) + "\n")
    return path, sig, pub


def make_manifest(runtime: ContainerRuntime, profile: Profile, key_path: str | None) -> Path:
    """The stage: the manifest assembled from the stage records of the
    profile's targets (with each runtime image's installed packages), the
    operator's files added, signed; returns the manifest's path."""
    version = engine_version()
    packages = {}
    for name in profile.targets:
        image = RELEASE_DIR / name / "runtime.json"
        if image.is_file():
            packages[name] = runtime.installed_packages(json.loads(image.read_text())["ref"])
    data = assemble(
        version=version,
        profile=profile.name,
        targets=list(profile.targets),
        release_dir=RELEASE_DIR,
        vllm_dir=VLLM_DIR,
        out=MANIFEST_DIR,
        image_packages=packages,
    )
    key = signing.signing_key(key_path)
    # The operator's files (requirements, constraints, signed provenance), listed before signing.
    provenance.add_operator_files(data, MANIFEST_DIR, key, release_dir=RELEASE_DIR)
    path, _, _ = write_signed(data, MANIFEST_DIR, key)
    fingerprint = signing.fingerprint(key)
    print(
        f"pin this fingerprint: {fingerprint} (the release key's; record it where operators read "
        f"it, not beside the release: they check with python -m pipeline verify MANIFEST "
        f"--fingerprint {fingerprint} ...; also in "
        f"{relative(MANIFEST_DIR / FINGERPRINT_FILE)})",
        flush=True,
    )
    return path


def execute(run: Run) -> None:
    path = make_manifest(run.runtime, run.profile, run.options.key)
    run.say(f"signed manifest: {relative(path)}")
    run.output(
        "signing key", f"{(MANIFEST_DIR / FINGERPRINT_FILE).read_text().strip()} (the fingerprint operators pin)"
    )
