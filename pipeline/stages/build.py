"""Stage: build. The engine's wheels for one target, built by cibuildwheel in
the target's builder image and repaired there by auditwheel.

Input: the engine's source (the files git tracks or would track under
engine/, so a build never picks up local build folders), copied into
build/release/<target>/source. Output: build/release/<target>/wheels/*.whl and
build.json (what was built, from which commit, with which image). The build
is reproducible: SOURCE_DATE_EPOCH is the commit's time, the source path in
the container is fixed, and the compiler cache is keyed on content.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
import time
from pathlib import Path

from pipeline.config import Target
from pipeline.container import ContainerRuntime, echo_run
from pipeline.errors import BuildError
from pipeline.images import builder_image
from pipeline.paths import CCACHE_DIR, ccache_env, target_dir
from pipeline.run import Run
from pipeline.release_format import PROJECT as DISTRIBUTION
from pipeline.source import ENGINE, commit, engine_version, snapshot_source, source_date_epoch, tree_changes


def repair_command(target: Target) -> str:
    excludes = " ".join(f"--exclude {shlex.quote(lib)}" for lib in target.provided_libraries)
    return f"auditwheel repair --plat {target.platform_tag} {excludes} --wheel-dir {{dest_dir}} {{wheel}}"


def cibuildwheel_env(target: Target, image: str, epoch: str, *, use_cache: bool = True) -> dict[str, str]:
    build_env = {
        "SOURCE_DATE_EPOCH": epoch,
        # The wheels' version: the release's with the target's label (0.1.0+cu130).
        "ACTIVEKV_LOCAL_VERSION": target.local_version,
        "ACTIVEKV_WERROR": "ON",
        **ccache_env("/ccache", "/project"),
        # Offline and without isolation: the builder image holds exactly the
        # build tools and torch this target pins.
        "PIP_NO_INDEX": "1",
        "MAKEFLAGS": f"-j{os.cpu_count() or 1}",
    }
    if not use_cache:
        build_env["CCACHE_DISABLE"] = "1"
    return {
        "CIBW_PLATFORM": "linux",
        "CIBW_ARCHS": "x86_64",
        "CIBW_BUILD": " ".join(f"{tag}-manylinux_x86_64" for tag in target.cpython_tags),
        "CIBW_MANYLINUX_X86_64_IMAGE": image,
        "CIBW_CONTAINER_ENGINE": (f"docker; create_args: --network host --volume {CCACHE_DIR}:/ccache"),
        "CIBW_BUILD_FRONTEND": "pip; args: --no-build-isolation",
        # A fixed build folder: nothing in the wheel depends on a random path.
        "CIBW_CONFIG_SETTINGS": "build-dir=/tmp/activekv-build",
        "CIBW_ENVIRONMENT": " ".join(f"{k}={shlex.quote(v)}" for k, v in build_env.items()),
        "CIBW_ENVIRONMENT_PASS_LINUX": "",
        "CIBW_REPAIR_WHEEL_COMMAND_LINUX": repair_command(target),
        "CIBW_BUILD_VERBOSITY": "1",
        "CIBW_TEST_SKIP": "*",
        "SOURCE_DATE_EPOCH": epoch,
    }


def expected_wheels(target: Target, release: str) -> list[str]:
    """The file names the build must make: one wheel per Python version, of
    the release's version with the target's local label."""
    version = target.wheel_version(release)
    return sorted(f"{DISTRIBUTION}-{version}-{tag}-{tag}-{target.platform_tag}.whl" for tag in target.cpython_tags)


def build(runtime: ContainerRuntime, target: Target, *, out: Path | None = None, use_cache: bool = True) -> dict:
    """Build and repair the target's wheels into `out` (default
    build/release/<target>); returns the stage record. use_cache=False
    compiles everything (the reproducibility test's second build)."""
    out = (out or target_dir(target.name)).resolve()  # cibuildwheel runs in the source folder
    image_ref, image_id = builder_image(runtime, target)
    source = out / "source"
    files = snapshot_source(source)
    changes = tree_changes()  # what the snapshot took that HEAD does not hold
    wheels = out / "wheels"
    staging = out / "wheels.partial"  # a failed build leaves earlier wheels intact
    shutil.rmtree(staging, ignore_errors=True)
    CCACHE_DIR.mkdir(parents=True, exist_ok=True)
    epoch = source_date_epoch()
    env = dict(os.environ, **cibuildwheel_env(target, image_ref, epoch, use_cache=use_cache))
    if runtime.name == "podman":
        env["CIBW_CONTAINER_ENGINE"] = env["CIBW_CONTAINER_ENGINE"].replace("docker;", "podman;", 1)
    started = time.monotonic()
    result = echo_run(
        [sys.executable, "-m", "cibuildwheel", "--output-dir", staging, ENGINE], env=env, cwd=source, check=False
    )
    if result.returncode != 0:
        raise BuildError(
            f"target {target.name}: cibuildwheel failed (exit {result.returncode}); "
            f"its output is above. Earlier wheels in {wheels} are untouched."
        )
    built = sorted(staging.glob("*.whl"))
    expected = expected_wheels(target, engine_version())
    if sorted(w.name for w in built) != expected:
        raise BuildError(
            f"target {target.name}: expected {', '.join(expected)} "
            f"(python {', '.join(target.python)}, version {target.wheel_version(engine_version())}), "
            f"got {[w.name for w in built]}"
        )
    shutil.rmtree(wheels, ignore_errors=True)
    staging.rename(wheels)
    compiler = runtime.run_in_image(image_ref, "c++", "--version").splitlines()[0]
    record = {
        "stage": "build",
        "target": target.name,
        "commit": commit(),
        # Untracked files count: the snapshot above builds them too.
        "tree_dirty": bool(changes),
        "tree_changes": changes[:20],
        "source_date_epoch": int(epoch),
        "builder_image": {"ref": image_ref, "id": image_id},
        "compiler": compiler,
        "torch": target.torch,
        "version": target.wheel_version(engine_version()),
        "platform_tag": target.platform_tag,
        "source_files": len(files),
        "seconds": round(time.monotonic() - started, 1),
        "wheels": [{"file": w.name, "size": w.stat().st_size} for w in sorted(wheels.glob("*.whl"))],
    }
    (out / "build.json").write_text(json.dumps(record, indent=2) + "\n")
    return record


def execute(run: Run) -> None:
    for target in run.targets:
        record = build(run.runtime, target)
        run.say(f"{target.name}: built {', '.join(w['file'] for w in record['wheels'])} in {record['seconds']} s")
