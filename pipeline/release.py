"""The release-level stages: the tree check, the runtime image, the manifest,
publishing and verification. Each reads the records earlier stages wrote."""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path

from pipeline import build, manifest, provenance, publish, runtime_image, signing
from pipeline.config import ROOT, Profile, ReleaseConfig, Target
from pipeline.container import ContainerRuntime
from pipeline.errors import DirtyTreeError, PipelineError
from pipeline.patch_vllm import OUT_DIR as VLLM_DIR

RELEASE_DIR = build.RELEASE_DIR
MANIFEST_DIR = RELEASE_DIR / "manifest"
DEFAULT_KEY = ROOT / ".cache" / "signing" / "activekv-release-key.pem"


def engine_version() -> str:
    return tomllib.loads((ROOT / "engine" / "pyproject.toml").read_text())["project"]["version"]


def check_tree(*, allow_dirty: bool, root: Path = ROOT) -> None:
    changes = build.tree_changes(root)
    if changes and not allow_dirty:
        raise DirtyTreeError(
            f"the working tree has {len(changes)} uncommitted change(s) (first: {changes[0].strip()}); "
            f"a release is made from a commit. Commit or stash them, or pass --allow-dirty "
            f"(the manifest then records tree_dirty: true)")


def vllm_wheel_for(target: Target, cfg: ReleaseConfig) -> Path:
    folder = VLLM_DIR / f"{target.vllm_distribution}-{cfg.vllm_version}"
    record = folder / "patch.json"
    if not record.is_file():
        raise PipelineError(f"no patched vLLM for target {target.name} in {folder}: run the "
                            f"patch-vllm stage first")
    return folder / json.loads(record.read_text())["patched"]["file"]


def audited_wheels(target: Target) -> list[Path]:
    """The wheels the payload audit passed (what ships), not whatever lies in the folder."""
    record = build.target_dir(target) / "audit.json"
    if not record.is_file():
        raise PipelineError(f"{record.relative_to(ROOT)}: missing; run the audit stage first")
    audit = json.loads(record.read_text())
    if not audit.get("passed"):
        raise PipelineError(f"target {target.name}: the payload audit did not pass; no runtime image")
    return [build.target_dir(target) / "wheels" / w["file"] for w in audit["wheels"]]


def make_runtime_image(runtime: ContainerRuntime, target: Target, cfg: ReleaseConfig) -> dict:
    out = build.target_dir(target)
    launcher = build.build_launcher(runtime, target)
    return runtime_image.build_runtime_image(
        runtime, target, version=engine_version(), commit=build.git("rev-parse", "HEAD"),
        engine_wheels=audited_wheels(target), vllm_wheel=vllm_wheel_for(target, cfg),
        launcher=launcher, out=out)


def signing_key(path: str | None):
    """The user's Ed25519 key (--key or ACTIVEKV_SIGNING_KEY; its passphrase
    from ACTIVEKV_SIGNING_KEY_PASSPHRASE or the terminal), else a local key
    made once for this checkout (fine for local destinations only)."""
    given = path or os.environ.get("ACTIVEKV_SIGNING_KEY")
    if given:
        return signing.load_private_key(Path(given))
    if DEFAULT_KEY.is_file():
        return signing.load_private_key(DEFAULT_KEY)
    print(f"note: no signing key given (--key or ACTIVEKV_SIGNING_KEY); made a local one at "
          f"{DEFAULT_KEY.relative_to(ROOT)}. Use your own key for any shared destination.", flush=True)
    return signing.generate_key(DEFAULT_KEY)


def image_packages(runtime: ContainerRuntime, ref: str) -> list[dict]:
    out = runtime.run("run", "--rm", "--network=host", "--entrypoint", "python", ref,
                     "-m", "pip", "list", "--format", "json", capture=True)
    return json.loads(out.stdout)


def make_manifest(runtime: ContainerRuntime, profile: Profile, cfg: ReleaseConfig, key_path: str | None
                  ) -> Path:
    version = engine_version()
    packages = {}
    for name in profile.targets:
        image = json.loads((RELEASE_DIR / name / "runtime.json").read_text()) \
            if (RELEASE_DIR / name / "runtime.json").is_file() else None
        if image:
            packages[name] = image_packages(runtime, image["ref"])
    data = manifest.assemble(version=version, profile=profile.name, targets=list(profile.targets),
                             release_dir=RELEASE_DIR, vllm_dir=VLLM_DIR,
                             out=MANIFEST_DIR, image_packages=packages)
    key = signing_key(key_path)
    # The operator's files (requirements, constraints, signed provenance), listed before signing.
    provenance.add_operator_files(data, MANIFEST_DIR, key, release_dir=RELEASE_DIR)
    path, _, _ = manifest.write_signed(data, MANIFEST_DIR, key)
    fingerprint = signing.fingerprint(key)
    print(f"pin this fingerprint: {fingerprint} (the release key's; record it where operators read "
          f"it, not beside the release: they check with python -m pipeline verify MANIFEST "
          f"--fingerprint {fingerprint} ...; also in "
          f"{(MANIFEST_DIR / manifest.FINGERPRINT_FILE).relative_to(ROOT)})", flush=True)
    return path


def destinations(profile: Profile, runtime: ContainerRuntime) -> publish.Destinations:
    registry = publish.ensure_local_registry() if profile.registry == "local" else profile.registry
    return publish.Destinations(index=publish.make_index(profile.index),
                                registry=publish.Registry(registry, runtime),
                                manifests=ROOT / profile.manifests)


def artifact_dirs() -> list[Path]:
    return [RELEASE_DIR, VLLM_DIR, MANIFEST_DIR]


def latest_manifest() -> Path:
    path = MANIFEST_DIR / f"activekv-{engine_version()}.manifest.json"
    if not path.is_file():
        raise PipelineError(f"{path.relative_to(ROOT)}: missing; run the manifest stage first")
    return path
