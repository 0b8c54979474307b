"""Stage: publish. Wheels to a PEP 503 package index, images to an OCI
registry, the signed manifest last.

Destinations come from the release profile: `index` is a folder (the embedded
default: a directory index pip reads with --index-url file://...) or the URL of
a real index (pypiserver); `registry` is "local" (a Debian docker-registry the
pipeline runs on 127.0.0.1) or host:port. Before anything is written, every
artifact is checked against what the destinations already hold: a version
already published with different bytes is refused and nothing is published.
An artifact already there with the same bytes is skipped, so re-running a
release resumes where a failure stopped it. The manifest goes last: while it
is missing, the release is not published.

Every file written to a folder destination goes to a hidden temporary name in
its final folder, is fsynced and renamed into place: no reader ever sees part
of a file under its final name. A write that fails (out of space, a quota, a
read-only folder) removes its partial and stops with one error naming the
path; the re-run resumes. A local artifact given as a symbolic link is
refused. After the images are pushed, each is recorded by its registry
digest (REGISTRY/NAME@sha256:...) in activekv-<version>-images.txt.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from pipeline.artifacts import refuse_links
from pipeline.config import Profile
from pipeline.container import ContainerRuntime
from pipeline.digest import sha256_of
from pipeline.errors import CollisionError, PipelineError, PublishError
from pipeline.paths import MANIFEST_DIR, RELEASE_DIR, ROOT, VLLM_DIR, relative
from pipeline.publishing.files import make_folder, write_atomic
from pipeline.publishing.index import DirectoryIndex, PackageIndex, make_index
from pipeline.publishing.registry import Registry, ensure_local_registry
from pipeline.release_format import PUBLIC_KEY_FILE, images_name, manifest_name
from pipeline.run import Run
from pipeline.source import engine_version

# --- the stage ------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class Destinations:
    index: PackageIndex
    registry: Registry
    manifests: Path


def publish(manifest_path: Path, *, artifact_dirs: list[Path], dest: Destinations) -> dict:
    """Publish the artifacts of a signed manifest, then the manifest."""
    manifest = _read_manifest(manifest_path)
    version = manifest["version"]
    found = _found_artifacts(artifact_dirs)
    beside = [manifest_path.with_name(manifest_path.name + ".sig"), manifest_path.with_name(PUBLIC_KEY_FILE)]
    for src in beside:
        _plain_file(src, "it is written by the manifest stage beside the manifest: run that stage again")
    wheels = [a for a in manifest["artifacts"] if a.get("file", "").endswith(".whl")]
    files = [a for a in manifest["artifacts"] if "file" in a and not a["file"].endswith(".whl")]
    images = [a for a in manifest["artifacts"] if a["kind"] == "image"]

    # Pre-flight: nothing is written if any destination holds other bytes.
    files_dir = dest.manifests / version
    todo_wheels = _not_in_index(wheels, dest.index, version)
    todo_files = _not_in_folder(files, files_dir, version)
    todo_images = _not_in_registry(images, dest.registry, version)
    images_file = files_dir / images_name(version)
    refs = []
    if images and not todo_images and images_file.is_file():
        # Every image is already there: its listing must be the one published.
        refs = _image_references(images, dest.registry, version)
        _check_listing(images_file, _listing(refs), version)
    published = dest.manifests / manifest_path.name
    if published.is_file():
        earlier = json.loads(published.read_text())
        if earlier["artifacts"] != manifest["artifacts"]:
            raise CollisionError(f"{published} records other artifacts for version {version}")
    for a in todo_wheels + todo_files:
        _local(found, a)  # each file to send is here and is the listed one, before anything is written
    # The folders are made (or refused) before any file is written.
    make_folder(dest.manifests)
    if files or images:
        make_folder(files_dir)
    if isinstance(dest.index, DirectoryIndex):
        make_folder(dest.index.root)

    for a in todo_wheels:
        dest.index.upload(_local(found, a))
    for a in todo_files:
        write_atomic(files_dir / a["file"], _local(found, a))
    for a, name in todo_images:
        dest.registry.push(a["ref"], name, version)
    if images:
        refs = refs or _image_references(images, dest.registry, version)
        listing = _listing(refs)
        # A re-run writes it only where it is missing: a published file is never rewritten.
        if not _check_listing(images_file, listing, version):
            write_atomic(images_file, data=listing)
    # Last: the signature and public key, then the manifest, which makes the
    # release visible. A manifest already there (a finished release) is kept.
    if not published.is_file():
        for src in beside:
            write_atomic(dest.manifests / src.name, src)
        write_atomic(published, manifest_path)
    return {
        "stage": "publish",
        "version": version,
        "wheels": [a["file"] for a in todo_wheels],
        "files": [a["file"] for a in todo_files],
        "images": [n for _, n in todo_images],
        "manifest": str(published),
        "image_references": [ref for _, ref in refs],
        # Every artifact where it is published (this run's and those already there).
        "index": dest.index.pip_url(),
        "published_wheels": [dest.index.location(a["file"]) for a in wheels],
        "files_dir": str(files_dir) if files or images else None,
        "skipped": len(wheels) + len(files) + len(images) - len(todo_wheels) - len(todo_files) - len(todo_images),
    }


def _found_artifacts(artifact_dirs: list[Path]) -> dict[str, Path]:
    """Every file of the artifact folders, by name."""
    found = {}
    for d in artifact_dirs:
        if not d.is_dir():
            raise PublishError(
                f"{d}: {'no such folder' if not d.exists() else 'not a folder'}; it "
                f"holds the release's artifacts: run the stages that make them first"
            )
        found.update({p.name: p for p in d.rglob("*") if p.is_file() or p.is_symlink()})
    return found


def _not_in_index(wheels: list[dict], index: PackageIndex, version: str) -> list[dict]:
    """The wheels the index lacks; a CollisionError where it holds one with other bytes."""
    todo = []
    for a in wheels:
        have = index.existing(a["file"])
        if have is not None and have != a["sha256"]:
            raise CollisionError(
                f"{a['file']} is already in {index} with other bytes "
                f"(sha256 {have}); version {version} is published. Bump the version"
            )
        if have is None:
            todo.append(a)
    return todo


def _not_in_folder(files: list[dict], folder: Path, version: str) -> list[dict]:
    """The files the folder lacks; a CollisionError where it holds one with other bytes."""
    todo = []
    for a in files:
        path = folder / a["file"]
        if path.is_file() and sha256_of(path) != a["sha256"]:
            raise CollisionError(f"{path} exists with other bytes; version {version} is published")
        if not path.is_file():
            todo.append(a)
    return todo


def _not_in_registry(images: list[dict], registry: Registry, version: str) -> list[tuple[dict, str]]:
    """The images (and their names) the registry lacks; a CollisionError
    where it holds one as another digest."""
    todo = []
    for a in images:
        name = a["ref"].split("/", 1)[1].rsplit(":", 1)[0]
        have = registry.existing(name, version)
        if have is not None and have != a["digest"]:
            raise CollisionError(
                f"{name}:{version} is already in {registry} as {have}, "
                f"not {a['digest']}; version {version} is published"
            )
        if have is None:
            todo.append((a, name))
    return todo


def _listing(refs: list[tuple[dict, str]]) -> bytes:
    return "".join(
        f"# target {a['target']}: image id {a['digest']} (the signed manifest's digest)\n{ref}\n" for a, ref in refs
    ).encode()


def _check_listing(path: Path, listing: bytes, version: str) -> bool:
    """Whether the images' listing is already at `path`; refused where it says other digests."""
    if not path.is_file():
        return False
    if path.read_bytes() != listing:
        raise CollisionError(
            f"{path} exists with other image references than the registry now "
            f"gives for version {version} (a registry digest changed?); version "
            f"{version} is published with those: bump the version"
        )
    return True


def _image_references(images: list[dict], registry: Registry, version: str) -> list[tuple[dict, str]]:
    """Each image as REGISTRY/NAME@sha256:<manifest digest>, read back from the registry."""
    refs = []
    for a in images:
        name = a["ref"].split("/", 1)[1].rsplit(":", 1)[0]
        found = registry.manifest(name, version)
        if found is None or found[0] != a["digest"]:
            raise PublishError(
                f"{name}:{version} is not in {registry} as {a['digest']} after the push "
                f"(it holds {found[0] if found else 'nothing'}); re-run the release"
            )
        refs.append((a, registry.reference(name, found[1])))
    return refs


def _read_manifest(path: Path) -> dict:
    _plain_file(path, "run the manifest stage first (python -m pipeline manifest)")
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise PublishError(f"{path}: not a readable manifest ({e}); run the manifest stage again") from None


def _plain_file(path: Path, todo: str) -> None:
    refuse_links([path], "file", PublishError)
    if not path.exists():
        raise PublishError(f"{path}: missing; {todo}")
    if not path.is_file():
        raise PublishError(f"{path}: not a file; {todo}")


def _local(found: dict[str, Path], artifact: dict) -> Path:
    path = found.get(artifact["file"])
    if path is not None:
        refuse_links([path], artifact["kind"], PublishError)
    if path is None or sha256_of(path) != artifact["sha256"]:
        raise PublishError(
            f"{artifact['file']}: the local file is missing or not the one the "
            f"manifest lists; run the release again from the build"
        )
    return path


def destinations(profile: Profile, runtime: ContainerRuntime) -> Destinations:
    """Where the profile publishes (release.toml [profiles.*])."""
    registry = ensure_local_registry() if profile.registry == "local" else profile.registry
    return Destinations(
        index=make_index(profile.index), registry=Registry(registry, runtime), manifests=ROOT / profile.manifests
    )


def artifact_dirs() -> list[Path]:
    """The folders the stages wrote the release's artifacts to."""
    return [RELEASE_DIR, VLLM_DIR, MANIFEST_DIR]


def latest_manifest() -> Path:
    """The manifest the manifest stage signed for this checkout's version."""
    path = MANIFEST_DIR / manifest_name(engine_version())
    if not path.is_file():
        raise PipelineError(f"{relative(path)}: missing; run the manifest stage first")
    return path


def outputs(record: dict) -> list[tuple[str, str]]:
    """What a publish made, as the release's last lines name it: each wheel
    where it is published, the index pip installs from, each image by its
    registry digest, the folder of the release's other files, the manifest."""
    named = [("wheel", w) for w in record["published_wheels"]]
    named.append(("package index", f"{record['index']} (pip install --index-url)"))
    named += [("image", ref) for ref in record["image_references"]]
    if record["files_dir"]:
        named.append(("release files", relative(Path(record["files_dir"]))))
    named.append(("manifest", relative(Path(record["manifest"]))))
    return named


def execute(run: Run) -> None:
    record = publish(latest_manifest(), artifact_dirs=artifact_dirs(), dest=destinations(run.profile, run.runtime))
    run.say(
        f"published {record['version']}: {len(record['wheels'])} wheel(s), {len(record['images'])} image(s), "
        f"{record['skipped']} already there; manifest {relative(Path(record['manifest']))}"
    )
    for what, where in outputs(record):
        run.output(what, where)
