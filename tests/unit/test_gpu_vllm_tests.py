"""ci/gpu-vllm-tests.sh: its groups, taken together, are every test of
tests/gpu, each once, with the mode each group names; an unknown group is
refused before anything runs. Collection only (PYTEST_ADDOPTS), so no GPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "ci" / "gpu-vllm-tests.sh"
GROUPS = ["compiled-head128", "compiled-head32", "eager-head128", "eager-head32", "once"]


def node_ids(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("tests/gpu/")]


def run_script(tmp_path: Path, *groups: str) -> subprocess.CompletedProcess[str]:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    (work / "env.sh").write_text("")
    env = {
        **os.environ,
        # The script's `python3` is this interpreter, with pytest.
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "PYTEST_ADDOPTS": "--collect-only -qq",  # with the script's -v: node ids
        "OUT": str(tmp_path / "out"),
        "WORK": str(work),
        "JOBS": "5",
        "STAGGER_S": "0",  # the starts' spacing is for a card's memory; collection needs none
    }
    env.pop("ACTIVEKV_GPU_MODES", None)
    return subprocess.run(
        ["bash", str(SCRIPT), *groups], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )


def test_the_groups_are_every_gpu_test_once(tmp_path):
    got = run_script(tmp_path)
    assert got.returncode == 0, got.stdout + got.stderr
    per_group = {g: node_ids((tmp_path / "out" / f"tests-{g}.txt").read_text()) for g in GROUPS}
    everything = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-m", "gpu", "tests/gpu", "--collect-only", "-q"],
        cwd=REPO,
        env={k: v for k, v in os.environ.items() if k != "ACTIVEKV_GPU_MODES"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    together = [n for ids in per_group.values() for n in ids]
    assert sorted(together) == sorted(node_ids(everything))
    for group in GROUPS[:4]:
        assert per_group[group] and all(f"[{group}" in n for n in per_group[group]), group
    assert per_group["once"] and not any("head32" in n or "head128" in n for n in per_group["once"])
    for group in GROUPS:
        assert f"{group}: " in got.stdout


def test_an_unknown_group_is_refused_before_anything_runs(tmp_path):
    got = run_script(tmp_path, "eager-head32", "eager-head64")
    assert got.returncode == 2
    assert "unknown group eager-head64" in got.stderr
    assert not (tmp_path / "out").exists()
