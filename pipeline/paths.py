"""The build tree's layout: every folder and file the pipeline, the tests and
the sessions write under build/ and .cache/, named once; and the reference,
which they import from the checkout. Standard library only (ci/run-nox and the
parity harness import it before anything is installed).

    build/release/<target>/   a target's stage outputs and records: source/,
                              wheels/, build.json, audit.json, parity/,
                              parity.json, launcher/, runtime.json
    build/release/manifest/   the signed manifest, SBOM, provenance
    build/vllm/<dist>-<ver>/  the patched vLLM wheel, its patch and patch.json
    build/images/             image build contexts
    build/publish/            the default profile's local destinations
    build/pipeline.lock       one pipeline run per checkout
    .cache/                   kept between runs of this checkout: the tests'
                              models, the local signing key
    ~/.cache/activekv/        kept between runs and checkouts of this host
                              (HOST_CACHE): what is keyed on content alone,
                              the compiler caches, the pinned vLLM downloads,
                              the tests' dependency venvs
"""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build"
CACHE = ROOT / ".cache"
# The Python reference (reference/activekv_reference), put on the import path
# by the tests, the parity harness and the parity stage: never installed there.
REFERENCE_DIR = ROOT / "reference"

# --- what the release's stages write -------------------------------------------
RELEASE_DIR = BUILD / "release"
MANIFEST_DIR = RELEASE_DIR / "manifest"
VLLM_DIR = BUILD / "vllm"
VLLM_VERIFY_VENV = VLLM_DIR / "verify-venv"
IMAGES_DIR = BUILD / "images"
LOCK_FILE = BUILD / "pipeline.lock"
LOGS_DIR = BUILD / "logs"
# The default profile's destinations (release.toml [profiles.default]).
PUBLISH_DIR = BUILD / "publish"
PUBLISH_INDEX = PUBLISH_DIR / "simple"
PUBLISH_MANIFESTS = PUBLISH_DIR / "manifests"
LOCAL_REGISTRY_DIR = PUBLISH_DIR / "registry"

# --- what the test, parity, boundary and bench sessions write --------------------
# scikit-build-core's build folder for the engine installed into a session
# (the test session's C++ tests are built there too).
ENGINE_BUILD_DIR = BUILD / "engine"
PARITY_DIR = BUILD / "parity"
BOUNDARY_REPORT = BUILD / "boundary" / "boundary.json"
BENCH_BUILD_DIR = BUILD / "bench-build"

# --- caches, kept between runs -----------------------------------------------------
# Keyed on content (a compile's inputs, a pinned sha256, the hash of what a venv
# installs), so every checkout of the host shares them: a fresh clone compiles
# nothing that an earlier one compiled. ACTIVEKV_CACHE moves them (a rebuild
# that must start empty points it at a new folder).
HOST_CACHE = Path(
    os.environ.get("ACTIVEKV_CACHE") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "activekv"
)
CCACHE_DIR = HOST_CACHE / "ccache"  # the builders' compiles (in containers)
HOST_CCACHE_DIR = HOST_CACHE / "ccache-host"  # the sessions' engine builds on this host
VLLM_DOWNLOADS = HOST_CACHE / "vllm-downloads"
DEPENDENCY_CACHE = HOST_CACHE / "test-dependencies"


def ccache_env(cache_dir: str, basedir: str) -> dict[str, str]:
    """ccache as the engine's compiler launcher, with paths under `basedir`
    hashed relative to it: every checkout (or mount) of the source shares the
    cache in `cache_dir`."""
    return {
        "CCACHE_DIR": cache_dir,
        "CCACHE_BASEDIR": basedir,
        "CCACHE_NOHASHDIR": "1",
        "CMAKE_CXX_COMPILER_LAUNCHER": "ccache",
    }


TEST_CACHE = CACHE / "tests"  # the tiny model and other fixtures (ACTIVEKV_TEST_CACHE overrides)
SIGNING_KEY = CACHE / "signing" / "activekv-release-key.pem"


def target_dir(target: str, *, root: Path = ROOT) -> Path:
    """build/release/<target> of the checkout at `root` (another for a rebuild's clone)."""
    return root / RELEASE_DIR.relative_to(ROOT) / target


def relative(path: Path) -> str:
    """`path` as messages and command lines show it: relative to the checkout
    when it lies inside it."""
    return str(path.relative_to(ROOT)) if path.is_absolute() and path.is_relative_to(ROOT) else str(path)
