"""Stage: runtime-image. The image operators pull: the target's runtime base,
the patched vLLM wheel, the engine wheels and the native launcher
(activekv-serve, its entry point, which this stage compiles in the target's
builder from the engine's source); serves vLLM with ActiveKV on.

Labelled with the release version and the manifest's inputs digest (the hash
of every wheel it holds and the commit, which the manifest records too), so an
image and a manifest can be matched without trusting either's name.
Writes build/release/<target>/runtime.json.
"""

from __future__ import annotations

import email.parser
import json
import shutil
import zipfile
from pathlib import Path, PurePosixPath

from pipeline.artifacts import audited_wheels, inputs_digest, patched_wheel_for, refuse_links
from pipeline.config import ReleaseConfig, Target
from pipeline.container import Container, ContainerRuntime
from pipeline.digest import sha256_of
from pipeline.errors import BuildError, ImageError
from pipeline.images import builder_image, runtime_base_image, runtime_dependencies_image
from pipeline.paths import CCACHE_DIR, IMAGES_DIR, ROOT, target_dir
from pipeline.run import Run
from pipeline.runtime_pins import load_overrides, overrides_file
from pipeline.source import ENGINE, commit, engine_version, snapshot_source, source_date_epoch

DOCKERFILES = {"cpu": ROOT / "docker" / "runtime-cpu.Dockerfile", "cuda": ROOT / "docker" / "runtime-cuda.Dockerfile"}
# cpu: versions, constraining pip's resolution; cuda: every distribution by
# its hash (pipeline/runtime_pins.py), installed as it is.
CONSTRAINTS = {
    "cpu": ROOT / "packaging" / "cpu" / "constraints.txt",
    "cuda": ROOT / "packaging" / "cuda" / "constraints.txt",
}
# Room for pip's scratch files and the image's metadata, beside what
# build_space counts.
BUILD_HEADROOM = 2**30


def image_name(target: Target) -> str:
    return f"activekv-runtime-{target.name}"


def build_runtime_image(
    runtime: ContainerRuntime,
    target: Target,
    *,
    version: str,
    commit: str,
    engine_wheels: list[Path],
    vllm_wheel: Path,
    launcher: Path,
    out: Path,
) -> dict:
    if target.name not in DOCKERFILES:
        raise ImageError(
            f"target {target.name}: no runtime image recipe (docker/runtime-"
            f"{target.name}.Dockerfile) and no pinned runtime environment yet"
        )
    if not engine_wheels:
        raise ImageError(f"target {target.name}: no engine wheel: run the build stage first")
    refuse_links([*engine_wheels, vllm_wheel], "wheel", ImageError)
    refuse_links([launcher], "launcher", ImageError)
    base_ref, base_id = runtime_base_image(runtime, target)
    requirements = IMAGES_DIR / f"vllm-requirements-{target.name}.txt"
    requirements.parent.mkdir(parents=True, exist_ok=True)
    requirements.write_text(wheel_requirements(vllm_wheel))
    dependencies_ref, dependencies_id = runtime_dependencies_image(
        runtime, target, requirements, CONSTRAINTS[target.name]
    )
    wheels = [*engine_wheels, vllm_wheel]
    digest = inputs_digest(version, commit, [*wheels, launcher])
    ref = f"activekv/{image_name(target)}:{version}"
    previous = runtime.image_id(ref)
    # Earlier builds left untagged (an interrupted run): their layers are GBs.
    runtime.prune_untagged(f"org.opencontainers.image.title={image_name(target)}")
    ctx = IMAGES_DIR / f"context-runtime-{target.name}"
    shutil.rmtree(ctx, ignore_errors=True)
    (ctx / "wheels").mkdir(parents=True)
    for w in wheels:
        shutil.copy2(w, ctx / "wheels" / w.name)
    (ctx / "launcher").mkdir()
    shutil.copy2(launcher, ctx / "launcher" / "activekv-serve")
    try:
        image_id = runtime.build_image(
            tag=ref,
            context=ctx,
            dockerfile=DOCKERFILES[target.name],
            needs_free=build_space(wheels, launcher),
            build_args={
                "RUNTIME_DEPENDENCIES": dependencies_ref,
                "BROKEN_BESIDE_TORCH": " ".join(target.broken_beside_torch),
                **pip_check_allowed(target),
                "RELEASE_VERSION": version,
                "MANIFEST_INPUTS": digest,
            },
        )
    finally:
        shutil.rmtree(ctx)
    if previous is not None and previous != image_id:
        runtime.remove_image(previous)  # the same version's last build: now untagged, GBs
    record = {
        "stage": "runtime-image",
        "target": target.name,
        "ref": ref,
        "id": image_id,
        "version": version,
        "inputs_digest": digest,
        "base": {"ref": base_ref, "id": base_id},
        "dependencies": {"ref": dependencies_ref, "id": dependencies_id},
        "wheels": sorted(w.name for w in wheels),
        "launcher": {"file": launcher.name, "sha256": sha256_of(launcher)},
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "runtime.json").write_text(json.dumps(record, indent=2) + "\n")
    return record


def build_space(wheels: list[Path], launcher: Path) -> int:
    """Free space the runtime image's own layers need while they are built
    (its dependencies are an image of their own, built before): the wheels
    and the launcher twice (the build context the runtime takes in, and the
    COPY layer) and the wheels' unpacked files twice (the RUN step's
    container and the layer committed from it), plus BUILD_HEADROOM."""
    packed = sum(w.stat().st_size for w in wheels) + launcher.stat().st_size
    unpacked = 0
    for w in wheels:
        with zipfile.ZipFile(w) as z:
            unpacked += sum(i.file_size for i in z.infolist())
    return 2 * packed + 2 * unpacked + BUILD_HEADROOM


def pip_check_allowed(target: Target) -> dict[str, str]:
    """PIP_CHECK_ALLOWED for a target whose pins differ from vLLM's on purpose
    (packaging/<target>/overrides.toml): an ERE matching exactly pip check's
    line for each such pin (none where there is no such file)."""
    overrides = load_overrides(overrides_file(target.name))
    if not overrides:
        return {}

    def ere(s):  # names, versions: letters, digits, '.', '-', '_', '+'
        return s.replace(".", "\\.").replace("+", "\\+")

    lines = [
        f"has requirement {ere(o['name'])}=={ere(o['pinned'])}, but you have {ere(o['name'])} {ere(o['instead'])}\\.$"
        for o in overrides.values()
    ]
    return {"PIP_CHECK_ALLOWED": "|".join(lines)}


def wheel_requirements(wheel: Path) -> str:
    """The wheel's Requires-Dist lines as a requirements file (PEP 508 lines,
    markers kept: an extra's lines do not apply). The patch series changes
    vLLM's code, not its requirements, so this file, and the image layer that
    installs it, stays the same from commit to commit while the patched
    wheel's bytes (its build epoch) do not."""
    with zipfile.ZipFile(wheel) as zf:
        (metadata,) = [n for n in zf.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
        message = email.parser.Parser().parsestr(zf.read(metadata).decode())
    lines = message.get_all("Requires-Dist") or []
    if not lines:
        raise ImageError(f"{wheel.name}: its METADATA names no requirements (Requires-Dist); is it vLLM's wheel?")
    return "".join(f"{line}\n" for line in lines)


def build_launcher(runtime: ContainerRuntime, target: Target, *, out: Path | None = None) -> Path:
    """activekv-serve, compiled in the target's builder container against the
    CPython of its first Python version; returns the binary's path
    (build/release/<target>/launcher/activekv-serve)."""
    out = (out or target_dir(target.name)).resolve()
    image_ref, _ = builder_image(runtime, target)
    source = out / "launcher-source"
    snapshot_source(source)
    CCACHE_DIR.mkdir(parents=True, exist_ok=True)
    tag = target.cpython_tags[0]
    py_bin = f"/opt/python/{tag}-{tag}/bin"
    env = {
        "PATH": f"{py_bin}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "CCACHE_DIR": "/ccache",
        "CCACHE_BASEDIR": "/project",
        "SOURCE_DATE_EPOCH": source_date_epoch(),
    }
    binary = out / "launcher" / "activekv-serve"
    with Container(
        runtime=runtime, image=image_ref, volumes=[(source, "/project"), (CCACHE_DIR, "/ccache")], env=env
    ) as c:
        # The builder's own CMake definitions for the engine (the cuda builder's
        # ACTIVEKV_TORCH_CMAKE=OFF: it has no CUDA toolkit), as its wheel builds get them.
        image_defines = c.call(["sh", "-c", 'printf %s "${SKBUILD_CMAKE_DEFINE:-}"'], capture=True).stdout
        defines = [f"-D{d}" for d in image_defines.split(";") if d.strip()]
        configure = c.call(
            [
                "cmake",
                "-S",
                f"/project/{ENGINE}",
                "-B",
                "/tmp/launcher",
                "-G",
                "Ninja",
                "-DCMAKE_BUILD_TYPE=Release",
                "-DACTIVEKV_BUILD_PYTHON=OFF",
                "-DACTIVEKV_BUILD_LAUNCHER=ON",
                "-DACTIVEKV_WERROR=ON",
                *defines,
                "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache",
                f"-DPython_EXECUTABLE={py_bin}/python",
            ],
            check=False,
        )
        built = (
            configure.returncode == 0
            and c.call(["cmake", "--build", "/tmp/launcher", "--target", "activekv-serve"], check=False).returncode == 0
        )
        if not built:
            raise BuildError(f"target {target.name}: building activekv-serve failed (output above)")
        if binary.exists():
            binary.unlink()
        c.copy_out(PurePosixPath("/tmp/launcher/activekv-serve"), binary)
    shutil.rmtree(source)
    return binary


def make_runtime_image(runtime: ContainerRuntime, target: Target, cfg: ReleaseConfig) -> dict:
    """The stage for one target: the launcher built, then the image from the
    audited wheels and the patched vLLM."""
    launcher = build_launcher(runtime, target)
    return build_runtime_image(
        runtime,
        target,
        version=engine_version(),
        commit=commit(),
        engine_wheels=audited_wheels(target),
        vllm_wheel=patched_wheel_for(target),
        launcher=launcher,
        out=target_dir(target.name),
    )


def execute(run: Run) -> None:
    for target in run.targets:
        r = make_runtime_image(run.runtime, target, run.cfg)
        run.say(f"{target.name}: {r['ref']} ({r['id']})")
