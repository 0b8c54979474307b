"""The release's stages, in order: the one registry of what a release does.

    check-tree → build → audit → patch-vllm → parity → runtime-image → manifest → publish

`python -m pipeline release` runs them all, stopping at the first failure;
`python -m pipeline STAGE` runs one (each reads the records the stages before
it wrote). The noxfile only wires sessions to these commands. A run holds the
checkout's pipeline lock (pipeline/lock.py) from start to end.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from pathlib import Path

from pipeline import build, config, parity_gate, release
from pipeline.config import ROOT, Profile, ReleaseConfig, Target
from pipeline.container import ContainerRuntime
from pipeline.host import ensure_container_runtime


@dataclasses.dataclass(frozen=True, kw_only=True)
class Options:
    """What a run was asked for (the command line's flags)."""

    allow_dirty: bool = False
    key: str | None = None
    static_only: bool = False
    vllm: str | None = None
    rebase: bool = False
    no_verify: bool = False
    parity_evidence: Mapping[str, Path] = dataclasses.field(default_factory=dict)


class Run:
    """One run of stages: the release config, the profile, its targets, the
    options, and the container runtime (started once, when a stage needs it)."""

    def __init__(self, cfg: ReleaseConfig, profile: Profile, targets: list[Target], options: Options) -> None:
        self.cfg = cfg
        self.profile = profile
        self.targets = targets
        self.options = options
        self._runtime: ContainerRuntime | None = None

    @property
    def runtime(self) -> ContainerRuntime:
        if self._runtime is None:
            ensure_container_runtime(self.cfg.container_engine, log_dir=ROOT / "build" / "logs")
            self._runtime = ContainerRuntime(name=self.cfg.container_engine)
        return self._runtime


def say(message: str) -> None:
    print(message, flush=True)


# --- the stages -------------------------------------------------------------------

def check_tree(run: Run) -> None:
    release.check_tree(allow_dirty=run.options.allow_dirty)
    say("the working tree is clean" if not build.tree_changes() else "dirty tree allowed "
        "(recorded in the manifest: tree_dirty true)")


def build_wheels(run: Run) -> None:
    for target in run.targets:
        record = build.build(run.runtime, target)
        say(f"{target.name}: built {', '.join(w['file'] for w in record['wheels'])} in {record['seconds']} s")


def audit_wheels(run: Run) -> None:
    from pipeline import audit

    for target in run.targets:
        out = build.target_dir(target)
        audit.audit(None if run.options.static_only else run.runtime, target, out / "wheels", out / "audit.json")
        say(f"{target.name}: payload audit passed ({out / 'audit.json'})"
            + (" (static rules only: the manifest stage will refuse this audit)" if run.options.static_only else ""))


def patch_vllm(run: Run) -> None:
    from pipeline import patch_vllm as pv

    version = run.options.vllm or run.cfg.vllm_version
    for target in run.targets:
        dist = target.vllm_distribution
        if run.options.rebase:
            report = pv.rebase(dist, version)
            for h in report:
                where = f"{h.file}:{h.line}" if h.line else h.file
                say(f"{'ok    ' if h.ok else 'FAILED'} {h.patch} hunk {h.hunk} {where}: {h.detail}")
            failed = [h for h in report if not h.ok]
            if failed:
                raise pv.PatchError(f"{len(failed)} hunk(s) of the nearest series do not apply "
                                    f"to {dist} {version} (listed above)")
            say(f"every patch applies exactly to {dist} {version}: copy the series to "
                f"patches/vllm/{version}/ and re-pin")
            continue
        record = pv.patch_vllm(dist, version, epoch=int(build.source_date_epoch()))
        out = pv.OUT_DIR / f"{dist}-{version}"
        say(f"{target.name}: {record['patched']['file']} ({out})")
        if run.options.no_verify:
            continue
        if target.name != "cpu":
            say(f"{target.name}: not verified here: running vLLM for this target needs its "
                f"accelerator; verify with --target cpu on this host")
            continue
        wheels = sorted((build.target_dir(target) / "wheels").glob("*.whl"))
        outcome = pv.verify(record, out, wheels, ROOT / "packaging" / "cpu" / "constraints.txt")
        record["verified"] = outcome
        (out / "patch.json").write_text(json.dumps(record, indent=2) + "\n")
        say(f"{target.name}: verified: {outcome['vllm']} generated with ActiveKV, "
            f"{outcome['cached_tokens']} tokens from the host store")


def parity(run: Run) -> None:
    for target in run.targets:
        record = parity_gate.run_parity(target, build.target_dir(target), release.vllm_wheel_for(target, run.cfg),
                                        evidence=run.options.parity_evidence.get(target.name))
        gating = [c for c in record["cells"] if c["gating"]]
        say(f"{target.name}: parity gate passed ({len(gating)} gating cells, {record['source']}) on "
            + ", ".join(w["file"] for w in record["wheels"]))


def runtime_image(run: Run) -> None:
    for target in run.targets:
        r = release.make_runtime_image(run.runtime, target, run.cfg)
        say(f"{target.name}: {r['ref']} ({r['id']})")


def manifest(run: Run) -> None:
    path = release.make_manifest(run.runtime, run.profile, run.cfg, run.options.key)
    say(f"signed manifest: {path.relative_to(ROOT)}")


def publish(run: Run) -> None:
    from pipeline import publish as pub

    record = pub.publish(release.latest_manifest(), artifact_dirs=release.artifact_dirs(),
                         dest=release.destinations(run.profile, run.runtime))
    say(f"published {record['version']}: {len(record['wheels'])} wheel(s), {len(record['images'])} image(s), "
        f"{record['skipped']} already there; manifest {record['manifest']}")


def images(run: Run) -> None:
    from pipeline import images as img

    for target in run.targets:
        for ref, image in (img.builder_image(run.runtime, target), img.runtime_base_image(run.runtime, target)):
            say(f"{target.name}: {ref} ({image})")


@dataclasses.dataclass(frozen=True)
class Stage:
    name: str
    summary: str
    run: Callable[[Run], None]


RELEASE: tuple[Stage, ...] = (
    Stage("check-tree", "refuse uncommitted changes (--allow-dirty records them)", check_tree),
    Stage("build", "engine wheels in each target's builder container", build_wheels),
    Stage("audit", "the payload audit, with the load check in the runtime base", audit_wheels),
    Stage("patch-vllm", "the patch series applied to the target's vLLM, verified", patch_vllm),
    Stage("parity", "the parity gate on the shipped wheels (or evidence for them)", parity),
    Stage("runtime-image", "the image operators pull", runtime_image),
    Stage("manifest", "the signed manifest, SBOM and provenance", manifest),
    Stage("publish", "wheels, images, then the manifest", publish),
)
# Not part of a release: made on demand by the stages that need them.
TOOLS: tuple[Stage, ...] = (Stage("images", "the targets' builder and runtime base images", images),)
BY_NAME = {s.name: s for s in (*RELEASE, *TOOLS)}


def run_release(run: Run) -> None:
    """Every stage in order; the first failure stops the release (its error
    propagates), so nothing after it, publishing included, happens."""
    for i, stage in enumerate(RELEASE, 1):
        say(f"\n=== stage {i}/{len(RELEASE)}: {stage.name}: {stage.summary}")
        stage.run(run)
    say(f"\nrelease done: profile {run.profile.name}, targets {', '.join(t.name for t in run.targets)}")


def make_run(*, profile: str | None, targets: list[str] | None, python: list[str] | None,
             options: Options, cfg: ReleaseConfig | None = None) -> Run:
    from pipeline.errors import ConfigError

    cfg = cfg or config.load()
    name = profile or cfg.default_profile
    if name not in cfg.profiles:
        raise ConfigError(f"no profile {name!r}; profiles: {', '.join(cfg.profiles)}")
    chosen = [cfg.target(n) for n in (targets or cfg.profiles[name].targets)]
    if python:
        for t in chosen:
            unknown = sorted(set(python) - set(t.python))
            if unknown:
                raise ConfigError(f"--python {unknown[0]}: target {t.name} builds "
                                  f"{', '.join(t.python)} (release.toml [targets.{t.name}] python)")
        chosen = [dataclasses.replace(t, python=tuple(python)) for t in chosen]
    unknown = sorted(set(options.parity_evidence) - {t.name for t in chosen})
    if unknown:
        raise ConfigError(f"--parity-evidence {unknown[0]}=...: {unknown[0]} is not a target of this run "
                          f"({', '.join(t.name for t in chosen)})")
    return Run(cfg, cfg.profiles[name], chosen, options)
