"""The release's stages, in order: the one registry of what a release does.

    check-tree → build → audit → patch-vllm → parity → runtime-image → manifest → publish

`python -m pipeline release` runs them all, stopping at the first failure;
`python -m pipeline STAGE` runs one (each reads the records the stages before
it wrote). Each stage is a module of pipeline/stages/ whose `run_stage(run)`
this registry calls. The noxfile only wires sessions to these commands. A run
holds the checkout's pipeline lock (pipeline/lock.py) from start to end.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path

from pipeline import config
from pipeline.config import Profile, ReleaseConfig, Target
from pipeline.container import ContainerRuntime
from pipeline.errors import ConfigError
from pipeline.host import prepared_runtime
from pipeline.stages import (audit, build, check_tree, images, manifest, parity_gate, patch_vllm, publish,
                             runtime_image)


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
            self._runtime = prepared_runtime(self.cfg.container_engine)
        return self._runtime

    @staticmethod
    def say(message: str) -> None:
        print(message, flush=True)


@dataclasses.dataclass(frozen=True)
class Stage:
    name: str
    summary: str
    run: Callable[[Run], None]


RELEASE: tuple[Stage, ...] = (
    Stage("check-tree", "refuse uncommitted changes (--allow-dirty records them)", check_tree.run_stage),
    Stage("build", "engine wheels in each target's builder container", build.run_stage),
    Stage("audit", "the payload audit, with the load check in the runtime base", audit.run_stage),
    Stage("patch-vllm", "the patch series applied to the target's vLLM, verified", patch_vllm.run_stage),
    Stage("parity", "the parity gate on the shipped wheels (or evidence for them)", parity_gate.run_stage),
    Stage("runtime-image", "the image operators pull", runtime_image.run_stage),
    Stage("manifest", "the signed manifest, SBOM and provenance", manifest.run_stage),
    Stage("publish", "wheels, images, then the manifest", publish.run_stage),
)
# Not part of a release: made on demand by the stages that need them.
TOOLS: tuple[Stage, ...] = (Stage("images", "the targets' builder and runtime base images", images.run_stage),)
BY_NAME = {s.name: s for s in (*RELEASE, *TOOLS)}


def run_release(run: Run) -> None:
    """Every stage in order; the first failure stops the release (its error
    propagates), so nothing after it, publishing included, happens."""
    for i, stage in enumerate(RELEASE, 1):
        run.say(f"\n=== stage {i}/{len(RELEASE)}: {stage.name}: {stage.summary}")
        stage.run(run)
    run.say(f"\nrelease done: profile {run.profile.name}, targets {', '.join(t.name for t in run.targets)}")


def make_run(*, profile: str | None, targets: list[str] | None, python: list[str] | None,
             options: Options, cfg: ReleaseConfig | None = None) -> Run:
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
