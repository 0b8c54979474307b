"""Stage: images. The base, builder and runtime-base images of a target.

Images are named by a hash of everything that goes into them (Dockerfile,
build arguments, copied files), so an unchanged image is reused and a changed
input makes a new one. A debootstrap base is made once per suite and mirror.
Every image's id is recorded for the release manifest.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

from pipeline.config import ROOT, DebootstrapBase, PulledBase, Target
from pipeline.container import ContainerEngine, echo_run
from pipeline.errors import ImageError
from pipeline.host import ensure_debian_packages

DOCKER_DIR = ROOT / "docker"
BUILDER_REQUIREMENTS = ROOT / "packaging" / "builder-requirements.txt"
IMAGES_DIR = ROOT / "build" / "images"


def _digest(*parts: bytes | str) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode() if isinstance(p, str) else p)
        h.update(b"\0")
    return h.hexdigest()[:16]


def base_image(engine: ContainerEngine, target: Target) -> tuple[str, str]:
    """(reference, image id) of the target's builder base."""
    base = target.builder_base
    if isinstance(base, PulledBase):
        try:
            return base.image, engine.pull(base.image)
        except ImageError:
            raise ImageError(
                f"target {target.name}: could not get the builder base image {base.image} "
                f"(the pull failed: see above). Provide it by loading it here "
                f"({engine.name} load -i <file>, the file made where it can be pulled: "
                f"{engine.name} pull {base.image} && {engine.name} save -o <file> {base.image}), "
                f"or point builder_base in release.toml [targets.{target.name}] at a registry "
                f"this host reaches. Building the {target.name} builder also needs the "
                f"package indexes its Dockerfile ({target.builder_dockerfile.name}) names."
            ) from None
    return debootstrap_base(engine, base)


def debootstrap_base(engine: ContainerEngine, base: DebootstrapBase) -> tuple[str, str]:
    ref = f"activekv/debian:{base.suite}-{_digest(base.suite, base.mirror)}"
    if (image := engine.image_id(ref)) is not None:
        return ref, image
    ensure_debian_packages(["debootstrap"])
    rootfs = IMAGES_DIR / f"rootfs-{base.suite}"
    if rootfs.exists():  # a half-made root from an interrupted run
        shutil.rmtree(rootfs)
    rootfs.parent.mkdir(parents=True, exist_ok=True)
    try:
        echo_run(["debootstrap", "--variant=minbase", "--include=ca-certificates",
                  base.suite, rootfs, base.mirror])
    except subprocess.CalledProcessError:
        raise ImageError(f"debootstrap of {base.suite} from {base.mirror} failed (output above)") from None
    print(f"+ tar -C {rootfs} -c . | {engine.name} import - {ref}", flush=True)
    tar = subprocess.Popen(["tar", "-C", str(rootfs), "--numeric-owner", "-c", "."],
                           stdout=subprocess.PIPE)
    imported = subprocess.run([engine.name, "import", "-", ref], stdin=tar.stdout,
                              capture_output=True, text=True)
    tar.wait()
    shutil.rmtree(rootfs)
    if imported.returncode != 0 or tar.returncode != 0:
        raise ImageError(f"importing the {base.suite} root as {ref} failed: {imported.stderr.strip()}")
    image = engine.image_id(ref)
    assert image is not None
    return ref, image


def _context(target: Target, name: str, files: dict[str, Path]) -> Path:
    """A fresh build context: the CA bundle, the target's local wheelhouse and `files`."""
    ctx = IMAGES_DIR / f"context-{name}-{target.name}"
    if ctx.exists():
        shutil.rmtree(ctx)
    (ctx / "wheelhouse").mkdir(parents=True)
    for links in target.find_links:
        for wheel in sorted(links.glob("*.whl")):
            shutil.copy2(wheel, ctx / "wheelhouse" / wheel.name)
    ca = ctx / "ca-bundle.crt"
    if target.ca_bundle is not None:
        shutil.copy2(target.ca_bundle, ca)
    else:
        ca.write_text("")
    for dest, src in files.items():
        shutil.copy2(src, ctx / dest)
    return ctx


def _fingerprint(ctx: Path, dockerfile: Path, args: dict[str, str]) -> str:
    parts: list[bytes | str] = [dockerfile.read_bytes(), json.dumps(args, sort_keys=True)]
    for f in sorted(ctx.rglob("*")):
        if f.is_file():
            # Wheels by name and size: hashing a GB of torch on every run is slow.
            parts.append(f"{f.relative_to(ctx)}:{f.stat().st_size}")
            if f.suffix != ".whl":
                parts.append(f.read_bytes())
    return _digest(*parts)


def _image(engine: ContainerEngine, target: Target, name: str, dockerfile: Path,
           files: dict[str, Path], extra_args: dict[str, str]) -> tuple[str, str]:
    base_ref, base_id = base_image(engine, target)
    args = {
        "BASE_IMAGE": base_ref,
        "PYTHON_VERSIONS": " ".join(target.python),
        "TORCH": target.torch,
        "INDEX_URL": target.index_url,
        "TORCH_INDEX_URL": target.torch_index_url,
        **extra_args,
    }
    ctx = _context(target, name, files)
    ref = f"activekv/{name}-{target.name}:{_fingerprint(ctx, dockerfile, args | {'base': base_id})}"
    if (image := engine.image_id(ref)) is None:
        image = engine.build_image(tag=ref, context=ctx, dockerfile=dockerfile, build_args=args,
                                   labels={"org.activekv.base": f"{base_ref}@{base_id}"})
    shutil.rmtree(ctx)
    return ref, image


def builder_image(engine: ContainerEngine, target: Target) -> tuple[str, str]:
    """(reference, image id) of the target's builder: cibuildwheel's layout,
    compilers, ccache, torch and the pinned build tools."""
    return _image(engine, target, "builder", target.builder_dockerfile,
                  {"builder-requirements.txt": BUILDER_REQUIREMENTS,
                   "install-torch.sh": DOCKER_DIR / "install-torch.sh"}, {})


def runtime_base_image(engine: ContainerEngine, target: Target) -> tuple[str, str]:
    """(reference, image id) of the target's runtime base: Python and torch,
    no compilers. The payload audit loads the wheels there."""
    return _image(engine, target, "runtime-base", target.runtime_dockerfile,
                  {"install-torch.sh": DOCKER_DIR / "install-torch.sh"}, {})
