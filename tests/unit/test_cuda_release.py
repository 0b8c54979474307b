"""The CUDA release's pieces that need no container or GPU: the engine wheels'
local version labels (set by the build-time provider, parsed with packaging
wherever a wheel's name is read, served apart by one index), the hash-pinned
runtime environment, and the parity evidence a GPU host makes (its wheels
named on the command line, refused when they are not the target's)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import urllib.parse
import zipfile
from pathlib import Path

import pytest

from pipeline import config, runtime_pins
from pipeline.errors import ConfigError, ParityError, PipelineError, PublishError
from pipeline.paths import ROOT
from pipeline.release_format import wheel_name
from pipeline.publishing import index as package_index
from pipeline.stages import build, parity_gate

CFG = config.load(environ={})
CUDA = CFG.target("cuda")
CUDA_WHEEL = "activekv-0.1.0+cu130-cp312-cp312-manylinux_2_34_x86_64.whl"
VLLM_WHEEL = "vllm-0.34.0+activekv.1-cp38-abi3-manylinux_2_28_x86_64.whl"


# --- file names ------------------------------------------------------------------


def provider():
    path = ROOT / "packaging" / "build_support" / "engine_version.py"
    spec = importlib.util.spec_from_file_location("engine_version_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_build_time_provider_adds_the_label_the_build_stage_passes(monkeypatch):
    version = provider()
    monkeypatch.delenv(version.LABEL, raising=False)
    assert version.dynamic_metadata({"field": "version", "release": "0.1.0"}, {}) == {"version": "0.1.0"}
    monkeypatch.setenv(version.LABEL, "cu130.torch2.11")
    assert version.dynamic_metadata({"release": "0.1.0"}, {}) == {"version": "0.1.0+cu130.torch2.11"}
    monkeypatch.setenv(version.LABEL, "cu-130")
    with pytest.raises(RuntimeError, match="'cu-130' is not a PEP 440 local version label"):
        version.dynamic_metadata({"release": "0.1.0"}, {})
    # The build stage sets exactly the target's label.
    env = build.cibuildwheel_env(CUDA, "img", "1")["CIBW_ENVIRONMENT"]
    assert f"{version.LABEL}=cu130" in env.split()


def test_every_target_builds_wheels_of_its_own_names():
    names = {name: build.expected_wheels(t, "0.1.0") for name, t in CFG.targets.items()}
    assert names["cpu"] == ["activekv-0.1.0+cpu-cp311-cp311-manylinux_2_34_x86_64.whl"]
    assert names["cuda"] == [CUDA_WHEEL]
    assert names["cuda-vllm0.26"] == ["activekv-0.1.0+cu130.torch2.11-cp312-cp312-manylinux_2_34_x86_64.whl"]
    every = [n for ns in names.values() for n in ns]
    assert len(set(every)) == len(every)
    for n in every:  # what packaging reads back is what release.toml says
        parts = wheel_name(n)
        assert parts.project == "activekv" and parts.version.startswith("0.1.0+")


def test_a_name_that_is_not_a_wheels_is_refused_with_the_callers_error():
    with pytest.raises(PublishError, match="activekv-0.1.0.whl: not a wheel's file name"):
        wheel_name("activekv-0.1.0.whl", PublishError)
    assert wheel_name(VLLM_WHEEL).project == "vllm" and wheel_name(VLLM_WHEEL).version == "0.34.0+activekv.1"


def test_one_directory_index_holds_both_targets_wheels_and_pip_reads_the_labelled_links(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    index = package_index.DirectoryIndex(tmp_path / "simple")
    for name in (CUDA_WHEEL, "activekv-0.1.0+cpu-cp311-cp311-manylinux_2_34_x86_64.whl"):
        parts = wheel_name(name)
        with zipfile.ZipFile(wheels / name, "w") as zf:
            info = f"activekv-{parts.version}.dist-info"
            zf.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: activekv\nVersion: {parts.version}\n")
            zf.writestr(
                f"{info}/WHEEL",
                f"Wheel-Version: 1.0\nRoot-Is-Purelib: false\n"
                f"Tag: {parts.python_tag}-{parts.abi_tag}-{parts.platform_tag}\n",
            )
            zf.writestr(f"{info}/RECORD", "")
        index.upload(wheels / name)
    cuda_sha = hashlib.sha256((wheels / CUDA_WHEEL).read_bytes()).hexdigest()
    page = (tmp_path / "simple" / "activekv" / "index.html").read_text()
    # '+' quoted in the href, as torch's index writes it; the text is the file's name.
    assert f'href="{urllib.parse.quote(CUDA_WHEEL)}#sha256={cuda_sha}"' in page
    assert "activekv-0.1.0%2Bcu130-cp312" in page and f">{CUDA_WHEEL}<" in page
    assert index.existing(CUDA_WHEEL) == cuda_sha
    # pip, given the index, finds the cuda wheel by its labelled version (a dry run for cp312 Linux).
    found = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--isolated",
            "--only-binary=:all:",
            "--python-version",
            "3.12",
            "--platform",
            "manylinux_2_34_x86_64",
            "--dest",
            str(tmp_path / "got"),
            "--index-url",
            (tmp_path / "simple").as_uri(),
            "activekv==0.1.0+cu130",
        ],
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("PIP_")},
    )
    assert found.returncode == 0, found.stderr
    assert hashlib.sha256((tmp_path / "got" / CUDA_WHEEL).read_bytes()).hexdigest() == cuda_sha


# --- the hash-pinned runtime environment -------------------------------------------


def test_the_cuda_constraints_pin_every_distribution_by_hash_at_release_tomls_torch():
    pins = runtime_pins.parse((ROOT / "packaging" / "cuda" / "constraints.txt").read_text())
    assert pins["torch"][0] == CUDA.torch
    # torch 2.14.0 cp312 as PyPI publishes it (design.md), and its CUDA 13 libraries.
    assert pins["torch"][1] == ("fecffb58f51fd643d213acd68da21cc3fc19bea05a3bc64b4ee55128f47a4963",)
    assert pins["nvidia-nccl-cu13"][0] == "2.30.7" and pins["cuda-toolkit"][0] == "13.0.3.0"
    assert "vllm" not in pins  # the patched vLLM is the release's own, pinned in its requirements file
    for name, o in runtime_pins.load_overrides(runtime_pins.overrides_file("cuda")).items():
        assert pins[name][0] == o["instead"]
    assert all(len(hashes) >= 1 for _, hashes in pins.values())


def test_a_line_without_a_hash_is_refused():
    with pytest.raises(ValueError, match="line 2: not name==version --hash"):
        runtime_pins.parse("# header\nnumpy==2.4.1\n")


def fake_vllm(path: Path, requires: list[str]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(
            "vllm-0.34.0.dist-info/METADATA",
            "Metadata-Version: 2.1\nName: vllm\nVersion: 0.34.0\n" + "".join(f"Requires-Dist: {r}\n" for r in requires),
        )
    return path


def test_the_resolution_takes_vllms_requirements_with_the_overrides_in_place(tmp_path):
    wheel = fake_vllm(
        tmp_path / "vllm.whl", ["numpy", "flashinfer-python==0.7.3", 'xgrammar==0.2.8; platform_machine == "x86_64"']
    )
    overrides = {"flashinfer-python": {"name": "flashinfer-python", "pinned": "0.7.3", "instead": "0.7.4", "why": "w"}}
    assert runtime_pins.requirements(wheel, "2.14.0", overrides) == [
        "numpy",
        "flashinfer-python==0.7.4",
        'xgrammar==0.2.8; platform_machine == "x86_64"',
        "torch==2.14.0",
    ]
    # An override that no longer matches vLLM's pin (or a pin vLLM dropped) is refused by name.
    moved = fake_vllm(tmp_path / "moved.whl", ["flashinfer-python==0.7.5"])
    with pytest.raises(ConfigError, match="override of flashinfer-python.*no longer applies"):
        runtime_pins.requirements(moved, "2.14.0", overrides)
    with pytest.raises(ConfigError, match="does not require it"):
        runtime_pins.requirements(fake_vllm(tmp_path / "none.whl", ["numpy"]), "2.14.0", overrides)


# --- parity on the GPU host: the wheels named there --------------------------------


def wheel_file(folder: Path, name: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(folder / name, "w") as zf:
        zf.writestr("x", name)
    return folder / name


def test_the_gpu_host_takes_only_the_targets_engine_and_patched_vllm_wheels(tmp_path):
    engine, vllm = wheel_file(tmp_path, CUDA_WHEEL), wheel_file(tmp_path, VLLM_WHEEL)
    given = parity_gate.given_wheels(CUDA, engine, vllm)
    assert [(w["kind"], w["file"]) for w in given] == [("engine-wheel", CUDA_WHEEL), ("vllm-wheel", VLLM_WHEEL)]
    assert given[0]["sha256"] == hashlib.sha256(engine.read_bytes()).hexdigest()
    old = wheel_file(tmp_path, "activekv-0.1.0+cu130.torch2.11-cp312-cp312-manylinux_2_34_x86_64.whl")
    with pytest.raises(ParityError, match="not an engine wheel of target cuda.*\\+cu130-"):
        parity_gate.given_wheels(CUDA, old, vllm)
    pristine = wheel_file(tmp_path, "vllm-0.34.0-cp38-abi3-manylinux_2_28_x86_64.whl")
    with pytest.raises(ParityError, match="not the patched vllm 0.34.0 of target cuda"):
        parity_gate.given_wheels(CUDA, engine, pristine)
    with pytest.raises(ParityError, match="not the patched vllm 0.34.0"):
        parity_gate.given_wheels(
            CUDA, engine, wheel_file(tmp_path, "vllm-0.26.0+activekv.2-cp38-abi3-manylinux_2_28_x86_64.whl")
        )
    with pytest.raises(ParityError, match="no such file"):
        parity_gate.given_wheels(CUDA, tmp_path / "gone.whl", vllm)


def test_the_release_host_refuses_cuda_without_evidence_naming_the_gpu_hosts_command(tmp_path):
    from tests.unit.test_release_checks import make_wheel, write_json

    cuda_dir = tmp_path / "cuda"
    engine = make_wheel(cuda_dir / "wheels" / CUDA_WHEEL, {"activekv.so": b"x"})
    vllm = make_wheel(tmp_path / "vllm" / VLLM_WHEEL, {"vllm/__init__.py": b""})
    write_json(
        cuda_dir / "audit.json",
        {"passed": True, "wheels": [{"file": CUDA_WHEEL, "sha256": hashlib.sha256(engine.read_bytes()).hexdigest()}]},
    )
    with pytest.raises(ParityError) as refused:
        parity_gate.run_parity(CUDA, cuda_dir, vllm)
    said = str(refused.value)
    assert "not skipped" in said and "--parity-evidence cuda=FILE" in said
    assert (
        f"--target cuda --engine-wheel WHEEL --vllm-wheel WHEEL` with these same wheels ({CUDA_WHEEL}, "
        f"{VLLM_WHEEL})" in said
    )
    # Evidence the GPU host wrote for an earlier build of the engine wheel: refused, naming both hashes.
    evidence = tmp_path / "gpu-parity.json"
    write_json(
        evidence,
        {
            "stage": "parity",
            "target": "cuda",
            "cells": [],
            "wheels": [
                {"kind": "engine-wheel", "file": CUDA_WHEEL, "sha256": "1" * 64},
                {"kind": "vllm-wheel", "file": VLLM_WHEEL, "sha256": hashlib.sha256(vllm.read_bytes()).hexdigest()},
            ],
        },
    )
    with pytest.raises(ParityError) as refused:
        parity_gate.run_parity(CUDA, cuda_dir, vllm, evidence=evidence)
    assert (
        f"target cuda: {evidence} is parity evidence for other wheels than those that ship: {CUDA_WHEEL} "
        f"ran as sha256 {'1' * 64}, ships as sha256 {hashlib.sha256(engine.read_bytes()).hexdigest()}"
    ) in str(refused.value)
    assert not (cuda_dir / "parity.json").exists()


def test_the_gpu_hosts_flags_go_together_with_the_parity_stage(tmp_path):
    from pipeline.__main__ import options, parse

    engine, vllm = wheel_file(tmp_path, CUDA_WHEEL), wheel_file(tmp_path, VLLM_WHEEL)
    ok = options(
        parse(
            [
                "parity",
                "--target",
                "cuda",
                "--engine-wheel",
                str(engine),
                "--vllm-wheel",
                str(vllm),
                "--out",
                str(tmp_path / "p.json"),
            ]
        )
    )
    assert ok.parity_wheels == (engine.resolve(), vllm.resolve()) and ok.parity_out == tmp_path / "p.json"
    for argv in (
        ["parity", "--engine-wheel", str(engine)],
        ["release", "--engine-wheel", str(engine), "--vllm-wheel", str(vllm)],
        ["parity", "--out", "x.json"],
    ):
        with pytest.raises(ConfigError):
            options(parse(argv))
    with pytest.raises(ConfigError, match="--vllm-wheel .*nowhere.whl: not a file"):
        options(parse(["parity", "--engine-wheel", str(engine), "--vllm-wheel", str(tmp_path / "nowhere.whl")]))
    assert issubclass(ConfigError, PipelineError)


def test_a_manifest_of_both_targets_lists_each_engine_wheel_under_its_own_name():
    from pipeline import provenance

    text = provenance.requirements_text(
        "0.1.0",
        "cuda",
        [{"file": CUDA_WHEEL, "sha256": "a" * 64}, {"file": VLLM_WHEEL, "sha256": "b" * 64}],
        hashed_constraints=True,
    )
    assert f"activekv==0.1.0+cu130 --hash=sha256:{'a' * 64}" in text
    assert f"vllm==0.34.0+activekv.1 --hash=sha256:{'b' * 64}" in text
    assert (
        "pip install --require-hashes --no-deps -r activekv-0.1.0-cuda-requirements.txt "
        "-r activekv-0.1.0-cuda-constraints.txt"
    ) in text
    assert json.dumps  # (the manifest's own checks are test_release_checks')


def test_the_pins_are_resolved_by_a_python_of_the_targets_version():
    """pip reads requirements' markers from the Python it runs in: vLLM's
    `six` and `setuptools<81` (python_version > "3.11") are in the cuda pins
    only because a 3.12 pip resolved them; another Python is refused."""
    pins = runtime_pins.parse((ROOT / "packaging" / "cuda" / "constraints.txt").read_text())
    assert "six" in pins
    from packaging.version import Version

    assert Version("78.1.1") <= Version(pins["setuptools"][0]) < Version("81")
    with pytest.raises(
        ConfigError, match=f"no CPython 3.99 to resolve with .*it is {sys.version_info.major}.{sys.version_info.minor}"
    ):
        runtime_pins.interpreter("3.99", Path(sys.executable))
