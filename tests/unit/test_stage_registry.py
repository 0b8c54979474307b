"""The stages' registry: every module of pipeline/stages/ is a stage it runs
(or a tool it offers), and the release's order is the documented one."""

from __future__ import annotations

import pkgutil

from pipeline import stages
from pipeline.stages import registry


def test_every_stage_module_is_registered_and_every_registered_stage_has_its_module():
    modules = {m.name for m in pkgutil.iter_modules(stages.__path__)} - {"registry"}
    registered = {s.execute.__module__.rsplit(".", 1)[1] for s in (*registry.RELEASE, *registry.TOOLS)}
    assert modules == registered
    assert all(s.execute.__name__ == "execute" for s in (*registry.RELEASE, *registry.TOOLS))


def test_a_release_runs_the_stages_in_the_documented_order():
    assert [s.name for s in registry.RELEASE] == [
        "check-tree", "build", "audit", "patch-vllm", "parity", "runtime-image", "manifest", "publish"]
    assert " → ".join(s.name for s in registry.RELEASE) in registry.__doc__
