"""Container tests: the release pipeline's real stages with a real container
runtime (docker, started by host preparation where it is not running). The cpu
target's wheels are built once per test run and shared."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from pipeline import config, source
from pipeline.audit.policy import Policy, load_policy
from pipeline.config import Target
from pipeline.container import ContainerRuntime
from pipeline.host import prepared_runtime
from pipeline.stages import build, patch_vllm


@dataclasses.dataclass(frozen=True)
class BuiltTarget:
    runtime: ContainerRuntime
    target: Target
    out: Path
    record: dict

    @property
    def wheel(self) -> Path:
        (wheel,) = sorted((self.out / "wheels").glob("*.whl"))
        return wheel


@pytest.fixture(scope="session")
def runtime() -> ContainerRuntime:
    cfg = config.load()
    runtime = prepared_runtime(cfg.container_engine)
    drop_loopback_registry_tags(runtime)
    return runtime


def drop_loopback_registry_tags(runtime: ContainerRuntime) -> None:
    """Tags of earlier runs' loopback registries (an interrupted run's
    pushes and pulls): each keeps a runtime image of GBs alive on a CI host
    that keeps its images between runs."""
    for ref in runtime.references():
        if re.match(r"127\.0\.0\.1:\d+/activekv-", ref):
            runtime.remove_image(ref)


@pytest.fixture(scope="session")
def cpu_built(runtime: ContainerRuntime, tmp_path_factory: pytest.TempPathFactory) -> BuiltTarget:
    """The cpu target built by the build stage (in its builder container)."""
    target = config.load().target("cpu")
    out = tmp_path_factory.mktemp("release-cpu")
    record = build.build(runtime, target, out=out)
    return BuiltTarget(runtime=runtime, target=target, out=out, record=record)


@pytest.fixture(scope="session")
def patched_cpu_vllm(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    """The patch-vllm stage's record and folder for the cpu target's vLLM, made
    once for the patch stage's tests and the release's later stages."""
    target = config.load().target("cpu")
    out_root = tmp_path_factory.mktemp("vllm")
    record = patch_vllm.patch_vllm(
        target.vllm_distribution, target.vllm_version, out_root=out_root, epoch=int(source.source_date_epoch())
    )
    return record, out_root / f"{target.vllm_distribution}-{target.vllm_version}"


@pytest.fixture(scope="session")
def policy() -> Policy:
    return load_policy()
