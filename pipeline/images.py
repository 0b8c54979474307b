"""The base, builder and runtime-base images of a target. Not a stage of the
release: the build, audit and runtime-image stages make what they need of
them, and the registry offers them as the `images` tool
(`python -m pipeline images`).

Images are named by a hash of everything that goes into them (Dockerfile,
build arguments, copied files), so an unchanged image is reused and a changed
input makes a new one. A debootstrap base is made once per suite and mirror.
Every image's id is recorded for the release manifest.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from pipeline.config import DebootstrapBase, PulledBase, Target
from pipeline.container import ContainerRuntime, echo_run
from pipeline.errors import ImageError
from pipeline.host import ensure_debian_packages
from pipeline.paths import IMAGES_DIR, ROOT
from pipeline.run import Run

DOCKER_DIR = ROOT / "docker"
BUILDER_REQUIREMENTS = ROOT / "packaging" / "builder-requirements.txt"


def _digest(*parts: bytes | str) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode() if isinstance(p, str) else p)
        h.update(b"\0")
    return h.hexdigest()[:16]


def base_image(runtime: ContainerRuntime, target: Target) -> tuple[str, str]:
    """(reference, image id) of the target's builder base."""
    base = target.builder_base
    if isinstance(base, PulledBase):
        try:
            return base.image, runtime.pull(base.image)
        except ImageError:
            raise ImageError(
                f"target {target.name}: could not get the builder base image {base.image} "
                f"(the pull failed: see above). Provide it by loading it here "
                f"({runtime.name} load -i <file>, the file made where it can be pulled: "
                f"{runtime.name} pull {base.image} && {runtime.name} save -o <file> {base.image}), "
                f"or point builder_base in release.toml [targets.{target.name}] at a registry "
                f"this host reaches. Building the {target.name} builder also needs the "
                f"package indexes its Dockerfile ({target.builder_dockerfile.name}) names."
            ) from None
    return debootstrap_base(runtime, base)


@contextlib.contextmanager
def _one_maker(name: str) -> Iterator[None]:
    """One maker of an image at a time (the tests session makes them in the
    background; two runs on one host): a second waits, then finds the image
    the first made. The kernel drops the lock when its holder exits, however
    it exits."""
    IMAGES_DIR.mkdir(parents=True, exist_ok=True)
    with (IMAGES_DIR / f"{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def debootstrap_base(runtime: ContainerRuntime, base: DebootstrapBase) -> tuple[str, str]:
    with _one_maker(f"debian-{base.suite}"):
        return _debootstrap_base(runtime, base)


def _debootstrap_base(runtime: ContainerRuntime, base: DebootstrapBase) -> tuple[str, str]:
    ref = f"activekv/debian:{base.suite}-{_digest(base.suite, base.mirror)}"
    if (image := runtime.image_id(ref)) is not None:
        return ref, image
    ensure_debian_packages(["debootstrap"])
    rootfs = IMAGES_DIR / f"rootfs-{base.suite}"
    if rootfs.exists():  # a half-made root from an interrupted run
        shutil.rmtree(rootfs)
    rootfs.parent.mkdir(parents=True, exist_ok=True)
    try:
        echo_run(["debootstrap", "--variant=minbase", "--include=ca-certificates", base.suite, rootfs, base.mirror])
    except subprocess.CalledProcessError:
        raise ImageError(f"debootstrap of {base.suite} from {base.mirror} failed (output above)") from None
    print(f"+ tar -C {rootfs} -c . | {runtime.name} import - {ref}", flush=True)
    # As a context manager, so the pipe's read end is closed (an unclosed one
    # is a ResourceWarning: an error under the tests' warning filter).
    with subprocess.Popen(["tar", "-C", str(rootfs), "--numeric-owner", "-c", "."], stdout=subprocess.PIPE) as tar:
        imported = subprocess.run([runtime.name, "import", "-", ref], stdin=tar.stdout, capture_output=True, text=True)
    shutil.rmtree(rootfs)
    if imported.returncode != 0 or tar.returncode != 0:
        raise ImageError(f"importing the {base.suite} root as {ref} failed: {imported.stderr.strip()}")
    image = runtime.image_id(ref)
    assert image is not None
    return ref, image


def _inputs(target: Target, files: dict[str, Path]) -> dict[str, Path | None]:
    """What goes into a build context, by its path there: the target's local
    wheelhouse, the CA bundle (None: an empty file) and `files`."""
    inputs: dict[str, Path | None] = {}
    for links in target.find_links:
        for wheel in sorted(links.glob("*.whl")):
            inputs[f"wheelhouse/{wheel.name}"] = wheel
    inputs["ca-bundle.crt"] = target.ca_bundle
    inputs.update(files)
    return inputs


def _context(name: str, target: Target, inputs: dict[str, Path | None]) -> Path:
    """A fresh build context holding `inputs`."""
    ctx = IMAGES_DIR / f"context-{name}-{target.name}"
    if ctx.exists():
        shutil.rmtree(ctx)
    (ctx / "wheelhouse").mkdir(parents=True)
    for dest, src in inputs.items():
        if src is None:
            (ctx / dest).write_text("")
        else:
            shutil.copy2(src, ctx / dest)
    return ctx


def _fingerprint(inputs: dict[str, Path | None], dockerfile: Path, args: dict[str, str]) -> str:
    """Hash of what decides an image: taken from the inputs where they lie, so
    an image that exists costs no copy of the wheelhouse."""
    parts: list[bytes | str] = [dockerfile.read_bytes(), json.dumps(args, sort_keys=True)]
    for dest, src in sorted(inputs.items()):
        if src is None:
            parts += [f"{dest}:0", b""]
        elif src.suffix == ".whl":
            # Wheels by name and size: hashing a GB of torch on every run is slow.
            parts.append(f"{dest}:{src.stat().st_size}")
        else:
            parts += [f"{dest}:{src.stat().st_size}", src.read_bytes()]
    return _digest(*parts)


# Our builder and runtime-base images carry it (naming their base), and the
# runtime images inherit it.
BASE_LABEL = "org.activekv.base"


def drop_superseded(runtime: ContainerRuntime, repository: str, *, keep: str) -> None:
    """Remove this repository's other tags: each is an image of inputs that
    changed since (a few GB each, and CI hosts keep them between runs)."""
    for ref in runtime.references(repository):
        if ref != keep:
            runtime.remove_image(ref)


def _image(
    runtime: ContainerRuntime,
    target: Target,
    name: str,
    dockerfile: Path,
    files: dict[str, Path],
    extra_args: dict[str, str],
    *,
    on: tuple[str, str] | None = None,
) -> tuple[str, str]:
    """The image `name` of the target, built where missing, tagged by the
    hash of its inputs. On the target's base (Debian, with the target's
    wheelhouse and CA bundle in the context), or `on` another image of ours
    (reference, id), with `files` and `extra_args` alone."""
    base_ref, base_id = on or base_image(runtime, target)
    args = (
        {"BASE_IMAGE": base_ref, **extra_args}
        if on
        else {
            "BASE_IMAGE": base_ref,
            "PYTHON_VERSIONS": " ".join(target.python),
            "TORCH": target.torch,
            "INDEX_URL": target.index_url,
            "TORCH_INDEX_URL": target.torch_index_url,
            **extra_args,
        }
    )
    inputs: dict[str, Path | None] = dict(files) if on else _inputs(target, files)
    repository = f"activekv/{name}-{target.name}"
    ref = f"{repository}:{_fingerprint(inputs, dockerfile, args | {'base': base_id})}"
    with _one_maker(f"{name}-{target.name}"):
        drop_superseded(runtime, repository, keep=ref)
        if (image := runtime.image_id(ref)) is None:
            runtime.prune_untagged(BASE_LABEL)
            ctx = _context(name, target, inputs)
            try:
                image = runtime.build_image(
                    tag=ref,
                    context=ctx,
                    dockerfile=dockerfile,
                    needs_free=target.image_build_gib * 2**30,
                    build_args=args,
                    labels={BASE_LABEL: f"{base_ref}@{base_id}"},
                )
            finally:
                shutil.rmtree(ctx)
    return ref, image


def builder_image(runtime: ContainerRuntime, target: Target) -> tuple[str, str]:
    """(reference, image id) of the target's builder: cibuildwheel's layout,
    compilers, ccache, torch and the pinned build tools."""
    return _image(
        runtime,
        target,
        "builder",
        target.builder_dockerfile,
        {"builder-requirements.txt": BUILDER_REQUIREMENTS, "install-torch.sh": DOCKER_DIR / "install-torch.sh"},
        {},
    )


def runtime_base_image(runtime: ContainerRuntime, target: Target) -> tuple[str, str]:
    """(reference, image id) of the target's runtime base: Python and torch
    (on cpu, with what inductor needs: g++ and Python.h; on cuda, with
    torch's CUDA libraries and the builder's CPython). The payload audit
    loads the wheels there."""
    # A runtime base that takes the builder's CPython (the cuda one: bookworm
    # lacks 3.12) names the builder's image as a build argument.
    extra = (
        {"BUILDER_IMAGE": builder_image(runtime, target)[0]}
        if "ARG BUILDER_IMAGE" in target.runtime_dockerfile.read_text()
        else {}
    )
    return _image(
        runtime,
        target,
        "runtime-base",
        target.runtime_dockerfile,
        {"install-torch.sh": DOCKER_DIR / "install-torch.sh"},
        extra,
    )


def runtime_dependencies_image(
    runtime: ContainerRuntime, target: Target, requirements: Path, constraints: Path
) -> tuple[str, str]:
    """(reference, image id) of the target's runtime base with its vLLM's
    dependencies installed at the release's pins (`requirements`: the patched
    vLLM's own, runtime_image.wheel_requirements), less broken_beside_torch.
    Its own image, tagged by those inputs, so that it outlives the runtime
    images built on it: these change with every commit, it only with the pins
    (GBs of packages installed once, not per commit)."""
    return _image(
        runtime,
        target,
        "runtime-dependencies",
        DOCKER_DIR / "runtime-dependencies.Dockerfile",
        {"requirements.txt": requirements, "constraints.txt": constraints},
        {"BROKEN_BESIDE_TORCH": " ".join(target.broken_beside_torch)},
        on=runtime_base_image(runtime, target),
    )


def target_images(runtime: ContainerRuntime, target: Target) -> list[tuple[str, str]]:
    """(reference, image id) of the target's builder and runtime base, made where missing."""
    return [builder_image(runtime, target), runtime_base_image(runtime, target)]


def execute(run: Run) -> None:
    for target in run.targets:
        for ref, image in target_images(run.runtime, target):
            run.say(f"{target.name}: {ref} ({image})")


def prepare(target_names: list[str]) -> None:
    """Make the targets' base, builder and runtime-base images where they are
    missing (`python -m pipeline.images cpu`): the tests session runs this in
    the background while it installs, so a fresh host's image builds (mostly
    downloads) overlap its own; the container tests then find them made."""
    from pipeline import config
    from pipeline.host import prepared_runtime

    started = time.monotonic()
    cfg = config.load()
    runtime = prepared_runtime(cfg.container_engine)
    for name in target_names:
        for ref, image in target_images(runtime, cfg.target(name)):
            print(f"{name}: {ref} ({image})", flush=True)
    print(f"images ready in {time.monotonic() - started:.0f} s", flush=True)


if __name__ == "__main__":
    import sys

    prepare(sys.argv[1:])
