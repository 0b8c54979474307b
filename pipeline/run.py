"""One run of the release's stages: what the command line asked for
(Options) and what the stages share while they run (Run).

It imports no stage, so every stage takes a Run without importing the
registry (pipeline/stages/registry.py), the one module that imports them all.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path

from pipeline import config
from pipeline.config import Profile, ReleaseConfig, Target
from pipeline.container import ContainerRuntime
from pipeline.errors import ConfigError
from pipeline.host import prepared_runtime


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
    # parity on a host with the target's accelerator: (engine wheel, patched
    # vLLM wheel) to run the gate on, and where its record goes.
    parity_wheels: tuple[Path, Path] | None = None
    parity_out: Path | None = None
    parity_jobs: int = 1


class Run:
    """One run of stages: the release config, the profile, its targets, the
    options, and the container runtime (started once, when a stage needs it)."""

    def __init__(self, cfg: ReleaseConfig, profile: Profile, targets: list[Target], options: Options) -> None:
        self.cfg = cfg
        self.profile = profile
        self.targets = targets
        self.options = options
        self._runtime: ContainerRuntime | None = None
        # What the stages made for the release engineer, as (what, where):
        # the published wheels, the image, the manifest. A release's last
        # lines name them (pipeline/stages/registry.py).
        self.outputs: list[tuple[str, str]] = []

    @classmethod
    def create(
        cls,
        *,
        profile: str | None,
        targets: list[str] | None,
        python: list[str] | None,
        options: Options,
        cfg: ReleaseConfig | None = None,
    ) -> Run:
        """The run the command line asks for: the profile (release.toml's
        default when None), its targets or those named, narrowed to the
        Python versions named. ConfigError for a profile, target or Python
        version release.toml lacks, or for evidence of a target not in the run."""
        cfg = cfg or config.load()
        name = profile or cfg.default_profile
        if name not in cfg.profiles:
            raise ConfigError(f"no profile {name!r}; profiles: {', '.join(cfg.profiles)}")
        chosen = [cfg.target(n) for n in (targets or cfg.profiles[name].targets)]
        if python:
            for t in chosen:
                unknown = sorted(set(python) - set(t.python))
                if unknown:
                    raise ConfigError(
                        f"--python {unknown[0]}: target {t.name} builds "
                        f"{', '.join(t.python)} (release.toml [targets.{t.name}] python)"
                    )
            chosen = [dataclasses.replace(t, python=tuple(python)) for t in chosen]
        unknown = sorted(set(options.parity_evidence) - {t.name for t in chosen})
        if unknown:
            raise ConfigError(
                f"--parity-evidence {unknown[0]}=...: {unknown[0]} is not a target of this run "
                f"({', '.join(t.name for t in chosen)})"
            )
        return cls(cfg, cfg.profiles[name], chosen, options)

    @property
    def runtime(self) -> ContainerRuntime:
        if self._runtime is None:
            self._runtime = prepared_runtime(self.cfg.container_engine)
        return self._runtime

    @staticmethod
    def say(message: str) -> None:
        print(message, flush=True)

    def output(self, what: str, where: str) -> None:
        """Record one output of the run (`what` it is, `where` it is), named
        again when the release ends."""
        self.outputs.append((what, where))
