"""The GitHub Actions workflow in ci/github-actions is valid YAML with the
structure Actions requires, and runs only nox sessions and targets that exist."""

from __future__ import annotations

import re

import yaml

from pipeline import config
from pipeline.paths import ROOT

WORKFLOW = ROOT / "ci" / "github-actions" / "release.yml"


def load() -> dict:
    data = yaml.safe_load(WORKFLOW.read_text())
    data["on"] = data.pop(True, data.get("on"))  # YAML 1.1 reads a bare `on` as true
    return data


def test_workflow_has_the_structure_actions_requires():
    wf = load()
    assert wf["name"] and wf["jobs"]
    assert wf["on"]["push"]["tags"] == ["v*"]
    for name, job in wf["jobs"].items():
        assert "runs-on" in job, name
        assert job["steps"], name
        for step in job["steps"]:
            assert ("uses" in step) != ("run" in step), f"{name}: a step needs exactly one of uses/run"
            if "uses" in step:
                assert re.fullmatch(r"[\w.-]+/[\w.-]+@v\d+", step["uses"]), step["uses"]
        for need in job.get("needs", []):
            assert need in wf["jobs"], f"{name} needs unknown job {need}"


def test_workflow_runs_real_sessions_targets_and_publishes_only_on_tags():
    wf = load()
    noxfile = (ROOT / "noxfile.py").read_text()
    sessions = {name or func for name, func in
                re.findall(r'@nox\.session\((?:name="([\w-]+)")?[^)]*\)\s*\ndef (\w+)', noxfile)}
    assert {"tests", "audit", "release", "patch-vllm"} <= sessions
    runs = [s["run"] for job in wf["jobs"].values() for s in job["steps"] if "run" in s]
    used = {m for r in runs for m in re.findall(r"run-nox -s ([\w-]+)", r)}
    assert used and used <= sessions, used - sessions
    targets = {t["target"] for t in wf["jobs"]["build"]["strategy"]["matrix"]["include"]}
    assert targets == set(config.load(environ={}).targets)
    release = wf["jobs"]["release"]
    assert release["if"] == "startsWith(github.ref, 'refs/tags/v')"
    assert any("secrets.ACTIVEKV_SIGNING_KEY" in str(s.get("env", "")) for s in release["steps"])
    assert any("-s release" in s.get("run", "") and "--key" in s.get("run", "") for s in release["steps"])


def test_the_compiler_caches_it_keeps_are_where_the_pipeline_puts_them():
    # The pipeline's caches under ACTIVEKV_CACHE (pipeline/paths.py): a cache
    # step that saves another folder keeps nothing, and every run compiles cold.
    from pipeline.paths import CCACHE_DIR, HOST_CACHE, HOST_CCACHE_DIR

    wf = load()
    assert "ACTIVEKV_CACHE" in wf["env"]
    kept = {f"${{{{ env.ACTIVEKV_CACHE }}}}/{d.relative_to(HOST_CACHE)}" for d in (CCACHE_DIR, HOST_CCACHE_DIR)}
    for name, job in wf["jobs"].items():
        for step in job["steps"]:
            if step.get("uses", "").startswith("actions/cache@"):
                paths = {line.strip() for line in step["with"]["path"].splitlines() if line.strip()}
                assert paths and paths <= kept, f"{name}: caches {paths - kept}, not the pipeline's {kept}"
