"""The pre-commit hooks run the linters at the versions the tests session
pins: a commit checked there passes the lint phase, and the other way round."""

import re

from pipeline.paths import ROOT


def test_pre_commit_hooks_pin_what_the_lint_phase_installs():
    pinned = dict(
        line.split("==")
        for line in (ROOT / "packaging" / "lint-requirements.txt").read_text().splitlines()
        if "==" in line and not line.startswith("#")
    )
    hooks = re.findall(r'"([a-z-]+)==([0-9.]+)"', (ROOT / ".pre-commit-config.yaml").read_text())
    assert set(pinned) == {"ruff", "clang-format", "lizard"}
    assert hooks and all(pinned[name] == version for name, version in hooks)
    assert {name for name, _ in hooks} == set(pinned)
