"""The stages' registry: every module of pipeline/stages/ is a release stage it
runs (the tools it offers live outside it), and the release's order is the
documented one."""

from __future__ import annotations

import pkgutil

from pipeline import stages
from pipeline.stages import registry


def test_every_stage_module_is_registered_and_every_registered_stage_has_its_module():
    modules = {f"pipeline.stages.{m.name}" for m in pkgutil.iter_modules(stages.__path__)} - {
        "pipeline.stages.registry"
    }
    assert {s.execute.__module__ for s in registry.RELEASE} == modules
    assert not {s.execute.__module__ for s in registry.TOOLS} & modules  # a tool is no stage
    assert all(s.execute.__name__ == "execute" for s in (*registry.RELEASE, *registry.TOOLS))


def test_a_release_runs_the_stages_in_the_documented_order():
    assert [s.name for s in registry.RELEASE] == [
        "check-tree",
        "build",
        "audit",
        "patch-vllm",
        "parity",
        "runtime-image",
        "manifest",
        "publish",
    ]
    assert " → ".join(s.name for s in registry.RELEASE) in registry.__doc__
