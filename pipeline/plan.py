"""A release's plan, said before any stage runs: the version, the profile,
each target with the vLLM and torch it ships for and how its parity gate is
met, and every destination (the package index, the registry, the manifests
folder) with the key that signs. `python -m pipeline plan` prints it with the
checks that cost nothing (the flags, the signing key, the working tree); the
release prints it first (pipeline/stages/registry.py)."""

from __future__ import annotations

from collections.abc import Sequence

from pipeline import signing, source
from pipeline.paths import LOCAL_REGISTRY_DIR, ROOT, relative
from pipeline.run import Run
from pipeline.stages.parity_gate import RUNS_HERE
from pipeline.publishing.registry import LOCAL_REGISTRY_ADDR
from pipeline.stages.runtime_image import image_name


def index_location(spec: str) -> str:
    """Where release.toml's `index` puts the wheels, and how pip reads it."""
    if spec.startswith(("http://", "https://")):
        return f"{spec} (a package index taking uploads; pip install --index-url {spec.rstrip('/')}/simple/)"
    return f"{spec} (a directory index; pip install --index-url file://{(ROOT / spec).resolve()})"


def registry_location(spec: str) -> str:
    """Where release.toml's `registry` puts the images."""
    if spec == "local":
        return (
            f"{LOCAL_REGISTRY_ADDR} (local: the registry the pipeline runs, storing under "
            f"{relative(LOCAL_REGISTRY_DIR)})"
        )
    return spec


def parity_source(run: Run, target: str, vllm_distribution: str, accelerator: str) -> str:
    evidence = run.options.parity_evidence.get(target)
    if evidence is not None:
        return f"evidence {relative(evidence)} (--parity-evidence), checked against the shipped wheels"
    if vllm_distribution in RUNS_HERE:
        return "run here on the shipped wheels"
    return (
        f"needs --parity-evidence {target}=FILE from a host with a {accelerator} device; "
        f"without it the release stops at the parity stage"
    )


def describe(run: Run, stages: Sequence[str], *, version: str | None = None) -> list[str]:
    """The plan's lines. Raises SigningKeyError for a given key that cannot
    sign (signing.key_in_use): refused before any stage."""
    version = version or source.engine_version()
    profile = run.profile
    key, identity = signing.key_in_use(run.options.key)
    lines = [
        f"release plan: activekv {version}, profile {profile.name}"
        + (f" ({profile.description})" if profile.description else ""),
        f"  stages:     {' → '.join(stages)}",
    ]
    for t in run.targets:
        lines.append(
            f"  target {t.name}: {t.vllm_distribution} {t.vllm_version} on torch {t.torch}, "
            f"CPython {', '.join(t.python)}, {t.platform_tag}; engine wheels "
            f"activekv {t.wheel_version(version)}"
        )
        lines.append(f"    parity:   {parity_source(run, t.name, t.vllm_distribution, t.accelerator)}")
        registry = LOCAL_REGISTRY_ADDR if profile.registry == "local" else profile.registry
        lines.append(f"    image:    {registry}/{image_name(t)}:{version}")
    lines += [
        f"  index:      {index_location(profile.index)}",
        f"  registry:   {registry_location(profile.registry)}",
        f"  manifests:  {profile.manifests}",
        f"  signing:    {key}; {identity}",
    ]
    if run.options.allow_dirty:
        lines.append("  tree:       uncommitted changes allowed (--allow-dirty; the manifest records tree_dirty)")
    return lines
