"""Container tests: the release pipeline's real stages with a real container
engine (docker, started by host preparation where it is not running). The cpu
target's wheels are built once per test run and shared."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from pipeline import audit, build, config
from pipeline.config import ROOT, Target
from pipeline.container import ContainerEngine
from pipeline.host import ensure_container_engine


@dataclasses.dataclass(frozen=True)
class BuiltTarget:
    engine: ContainerEngine
    target: Target
    out: Path
    record: dict

    @property
    def wheel(self) -> Path:
        (wheel,) = sorted((self.out / "wheels").glob("*.whl"))
        return wheel


@pytest.fixture(scope="session")
def engine() -> ContainerEngine:
    cfg = config.load()
    ensure_container_engine(cfg.container_engine, log_dir=ROOT / "build" / "logs")
    engine = ContainerEngine(name=cfg.container_engine)
    drop_loopback_registry_tags(engine)
    return engine


def drop_loopback_registry_tags(engine: ContainerEngine) -> None:
    """Tags of earlier runs' loopback registries (an interrupted run's
    pushes and pulls): each keeps a runtime image of GBs alive on a CI host
    that keeps its images between runs."""
    for ref in engine.references():
        if re.match(r"127\.0\.0\.1:\d+/activekv-", ref):
            engine.remove_image(ref)


@pytest.fixture(scope="session")
def cpu_built(engine: ContainerEngine, tmp_path_factory: pytest.TempPathFactory) -> BuiltTarget:
    """The cpu target built by the build stage (in its builder container)."""
    target = config.load().target("cpu")
    out = tmp_path_factory.mktemp("release-cpu")
    record = build.build(engine, target, out=out)
    return BuiltTarget(engine=engine, target=target, out=out, record=record)


@pytest.fixture(scope="session")
def policy() -> audit.Policy:
    return audit.load_policy()
