"""The GitHub Actions workflow in ci/github-actions is valid YAML with the
structure Actions requires, and runs only nox sessions and targets that exist;
a release tag must name the package's version (ci/release_tag.py); root steps
run setup-python's Python; the release keeps what it publishes as artifacts."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys

import yaml

from pipeline import config, source
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
    sessions = {
        name or func for name, func in re.findall(r'@nox\.session\((?:name="([\w-]+)")?[^)]*\)\s*\ndef (\w+)', noxfile)
    }
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


def steps_running(job: dict) -> list[str]:
    return [s["run"] for s in job["steps"] if "run" in s]


def test_a_tag_that_is_not_the_package_version_is_refused_before_the_release():
    wf = load()
    tag = wf["jobs"]["release-tag"]
    assert tag["if"] == wf["jobs"]["release"]["if"] == "startsWith(github.ref, 'refs/tags/v')"
    assert "release-tag" in wf["jobs"]["release"]["needs"]
    assert any(re.fullmatch(r'python3? ci/release_tag\.py "\$GITHUB_REF_NAME"', r) for r in steps_running(tag))


def load_release_tag():
    spec = importlib.util.spec_from_file_location("release_tag_under_test", ROOT / "ci" / "release_tag.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_tag_check_reads_the_version_the_wheels_carry(tmp_path):
    release_tag = load_release_tag()
    version = source.engine_version()
    assert release_tag.problem(f"v{version}") is None
    found = release_tag.problem("v99.0.0")
    assert found is not None and "'v99.0.0'" in found and f"version {version}" in found
    assert release_tag.problem(version) is not None  # the v is part of the tag
    # engine/pyproject.toml is where the version comes from (another checkout, another version).
    (tmp_path / "engine").mkdir()
    project = (ROOT / "engine" / "pyproject.toml").read_text()
    (tmp_path / "engine" / "pyproject.toml").write_text(project.replace(f'release = "{version}"', 'release = "7.1.2"'))
    assert source.engine_version(tmp_path) == "7.1.2"
    assert release_tag.problem("v7.1.2", tmp_path) is None
    assert "version 7.1.2" in release_tag.problem(f"v{version}", tmp_path)


def test_the_tag_check_fails_the_job_with_an_annotation_naming_both():
    version = source.engine_version()
    script = [sys.executable, str(ROOT / "ci" / "release_tag.py")]
    env = {**os.environ, "GITHUB_ACTIONS": "true"}
    good = subprocess.run([*script, f"v{version}"], capture_output=True, text=True, env=env, timeout=60)
    assert good.returncode == 0, good.stderr
    bad = subprocess.run([*script, "v0.0.1"], capture_output=True, text=True, env=env, timeout=60)
    assert bad.returncode == 1
    assert bad.stdout.startswith(
        f"::error title=release tag::the tag 'v0.0.1' does not name the package's version {version}"
    )
    assert "error: the tag 'v0.0.1'" in bad.stderr


def test_root_steps_run_the_python_setup_python_installed():
    # sudo resets PATH: a bare `sudo python3` is the runner's system Python, not setup-python's 3.11.
    wf = load()
    for name, job in wf["jobs"].items():
        for run in steps_running(job):
            for line in run.splitlines():
                if "run-nox" in line:
                    assert line.startswith('sudo -E "${{ env.pythonLocation }}/bin/python" ci/run-nox '), line
                assert not re.search(r"sudo( -E)? python", line), f"{name}: {line}"


def test_the_release_keeps_its_wheels_images_and_manifests_as_artifacts():
    release = load()["jobs"]["release"]
    uploads = {
        s["with"]["name"]: s["with"]["path"]
        for s in release["steps"]
        if s.get("uses", "").startswith("actions/upload-artifact@")
    }
    kept = "\n".join(uploads.values())
    assert "build/release/*/wheels/*.whl" in kept  # the engine wheels (pipeline/paths.py target_dir)
    assert "build/vllm/*/*.whl" in kept  # the patched vLLM (pipeline/paths.py VLLM_DIR)
    assert "build/release/manifest/" in kept and "build/publish/manifests/" in kept
    saved = "\n".join(steps_running(release))
    assert "docker save" in saved and "build/release/*/runtime.json" in saved
    assert "${{ runner.temp }}/activekv-images/" in kept and "$RUNNER_TEMP/activekv-images/" in saved
    # Each kept path is where the pipeline writes it.
    from pipeline.paths import MANIFEST_DIR, PUBLISH_MANIFESTS, RELEASE_DIR, VLLM_DIR, relative

    for folder in (RELEASE_DIR, VLLM_DIR, MANIFEST_DIR, PUBLISH_MANIFESTS):
        assert relative(folder) in kept
    publish_step = next(i for i, s in enumerate(release["steps"]) if "-s release" in s.get("run", ""))
    assert all(
        i > publish_step
        for i, s in enumerate(release["steps"])
        if s.get("uses", "").startswith("actions/upload-artifact@")
    )
