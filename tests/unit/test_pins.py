"""The torch and vLLM pins agree wherever they must be written: release.toml
says what the cpu target builds against and ships with, and the cpu
constraints (what the tests' environment, the runtime image and an operator
install) pin the same versions. The tests' requirements pin nothing: they
name packages and take every version from the constraints."""

from __future__ import annotations

from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from pipeline import config
from pipeline.paths import ROOT, relative

CONSTRAINTS = ROOT / "packaging" / "cpu" / "constraints.txt"
TEST_REQUIREMENTS = ROOT / "packaging" / "cpu" / "requirements-tests.txt"


def requirements(path: Path) -> list[Requirement]:
    lines = [line.strip() for line in path.read_text().splitlines()]
    return [Requirement(line) for line in lines if line and not line.startswith("#")]


def pins(path: Path) -> dict[str, str]:
    """Each package's version, as the file pins it with ==."""
    pinned = {}
    for r in requirements(path):
        (spec,) = r.specifier
        assert spec.operator == "==", f"{relative(path)}: {r} is not pinned with =="
        pinned[canonicalize_name(r.name)] = spec.version
    return pinned


def test_the_cpu_constraints_pin_release_tomls_torch_and_vllm():
    cpu = config.load(environ={}).target("cpu")
    pinned = pins(CONSTRAINTS)
    for name, version, key in [
        ("torch", cpu.torch, "torch"),
        (cpu.vllm_distribution, cpu.vllm_version, "vllm_version"),
    ]:
        assert pinned.get(canonicalize_name(name)) == version, (
            f"release.toml [targets.cpu] {key} says {name} {version}, {relative(CONSTRAINTS)} pins "
            f"{pinned.get(canonicalize_name(name), 'nothing')}: change them together"
        )


def test_the_tests_requirements_take_their_versions_from_the_constraints():
    pinned = pins(CONSTRAINTS)
    for r in requirements(TEST_REQUIREMENTS):
        assert not r.specifier, f"{relative(TEST_REQUIREMENTS)}: {r} pins a version; {relative(CONSTRAINTS)} holds it"
        assert canonicalize_name(r.name) in pinned, f"{relative(CONSTRAINTS)} pins no {r.name}"
