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
import errno
import hashlib
import html
import json
import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from email.message import Message
from pathlib import Path

from pipeline.artifacts import refuse_links
from pipeline.config import Profile
from pipeline.container import ContainerRuntime
from pipeline.digest import sha256_of
from pipeline.errors import CollisionError, PipelineError, PublishError
from pipeline.host import ensure_debian_packages, running, start_daemon
from pipeline.paths import LOCAL_REGISTRY_DIR, MANIFEST_DIR, RELEASE_DIR, ROOT, VLLM_DIR, relative
from pipeline.release_format import PUBLIC_KEY_FILE, images_name, manifest_name, project_of, wheel_name
from pipeline.run import Run
from pipeline.source import engine_version

LOCAL_REGISTRY_ADDR = "127.0.0.1:5000"


# --- writing files --------------------------------------------------------------

_NO_SPACE = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def _write_failed(path: Path, e: OSError) -> PublishError:
    if e.errno in _NO_SPACE:
        todo = (
            f"free space on the filesystem holding {path.parent} (df -h {path.parent}) and "
            f"re-run the release: what was published is kept and the rest resumes"
        )
    else:
        todo = f"make {path.parent} writable by this user and re-run the release: it resumes"
    return PublishError(f"{path}: writing failed ({e.strerror or e}); nothing was left under that name; {todo}")


def make_folder(folder: Path) -> None:
    """`folder` and its parents, or one PublishError naming the folder."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise PublishError(
            f"{folder}: a file is in the way of this destination folder; move it "
            f"or fix the profile's destination in release.toml"
        ) from None
    except OSError as e:
        raise PublishError(
            f"{folder}: cannot create this destination folder ({e.strerror}); create "
            f"it writable for this user or fix the profile's destination in "
            f"release.toml"
        ) from None


def write_atomic(dest: Path, source: Path | None = None, *, data: bytes | None = None) -> None:
    """`source`'s bytes (or `data`) at `dest`, by way of a hidden temporary
    file in dest's folder that is fsynced and renamed into place. A failed
    write removes the temporary file and raises PublishError naming `dest`."""
    make_folder(dest.parent)
    partial = dest.with_name(f".{dest.name}.partial")  # a stale one from a killed run is replaced
    fd = None
    try:
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "wb") as out:
            fd = None
            if data is not None:
                out.write(data)
            else:
                with source.open("rb") as f:
                    for block in iter(lambda: f.read(1 << 20), b""):
                        out.write(block)
            out.flush()
            os.fsync(out.fileno())
        os.replace(partial, dest)
    except OSError as e:
        if fd is not None:
            os.close(fd)
        partial.unlink(missing_ok=True)
        if source is not None and e.filename in (str(source), source):
            raise PublishError(
                f"{source}: cannot be read ({e.strerror}); run the release again from the build"
            ) from None
        raise _write_failed(dest, e) from None
    try:  # the rename itself survives a crash only once the folder is on disk
        dir_fd = os.open(dest.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError:
        pass  # some filesystems cannot fsync a folder; the file itself is complete


# --- package indexes -------------------------------------------------------------


class DirectoryIndex:
    """A PEP 503 index in a folder: <root>/<project>/<file> and index.html pages."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def __str__(self) -> str:
        return f"directory index {self.root}"

    def existing(self, wheel: str) -> str | None:
        path = self.root / project_of(wheel) / wheel
        return sha256_of(path) if path.is_file() else None

    def location(self, wheel: str) -> str:
        """Where the published `wheel` lies."""
        return relative(self.root / project_of(wheel) / wheel)

    def pip_url(self) -> str:
        """What `pip install --index-url` takes to install from it."""
        return f"file://{self.root.resolve()}"

    def upload(self, path: Path) -> None:
        write_atomic(self.root / project_of(path.name) / path.name, path)  # never half a wheel
        self._pages()

    def _pages(self) -> None:
        projects = sorted(p for p in self.root.iterdir() if p.is_dir())
        for project in projects:
            links = "".join(
                # The href quoted ('+' of a local version as %2B, as torch's index
                # writes it); pip unquotes it back to the file's name.
                f'<a href="{urllib.parse.quote(f.name)}#sha256={sha256_of(f)}">{html.escape(f.name)}</a><br>\n'
                for f in sorted(project.glob("*.whl"))
            )
            write_atomic(
                project / "index.html", data=f"<!DOCTYPE html>\n<html><body>\n{links}</body></html>\n".encode()
            )
        links = "".join(f'<a href="{p.name}/">{p.name}</a><br>\n' for p in projects)
        write_atomic(self.root / "index.html", data=f"<!DOCTYPE html>\n<html><body>\n{links}</body></html>\n".encode())


class HttpIndex:
    """A real package index that takes uploads (pypiserver: the upload API
    twine uses) and serves PEP 503 pages under /simple/."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")

    def __str__(self) -> str:
        return f"package index {self.url}"

    def location(self, wheel: str) -> str:
        return f"{wheel} at {self.pip_url()}{project_of(wheel)}/"

    def pip_url(self) -> str:
        return f"{self.url}/simple/"

    def existing(self, wheel: str) -> str | None:
        page_url = f"{self.url}/simple/{project_of(wheel)}/"
        page = _fetch(page_url, self, f"listing {project_of(wheel)}")
        if page is None:
            return None
        for href in re.findall(r'href="([^"]+)"', page.decode()):
            name, _, frag = href.rpartition("/")[2].partition("#")
            if urllib.request.url2pathname(name) == wheel:
                if frag.startswith("sha256="):
                    return frag.removeprefix("sha256=")
                data = _fetch(urllib.parse.urljoin(page_url, href), self, f"reading {wheel}", timeout=60)
                return hashlib.sha256(data).hexdigest() if data is not None else None
        return None

    def upload(self, path: Path) -> None:
        parts = wheel_name(path.name, PublishError)
        name, version = parts.project, parts.version
        boundary = uuid.uuid4().hex
        fields = {
            ":action": "file_upload",
            "protocol_version": "1",
            "name": name,
            "version": version,
            "filetype": "bdist_wheel",
            "sha256_digest": sha256_of(path),
        }
        body = b"".join(
            f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode()
            for k, v in fields.items()
        )
        body += (
            f'--{boundary}\r\nContent-Disposition: form-data; name="content"; filename="{path.name}"\r\n'
            f"Content-Type: application/octet-stream\r\n\r\n"
        ).encode() + path.read_bytes()
        body += f"\r\n--{boundary}--\r\n".encode()
        request = urllib.request.Request(
            f"{self.url}/",
            data=body,
            method="POST",
            headers={"Content-Type": f"multipart/form-data; boundary={boundary}"},
        )
        print(f"+ POST {self.url}/ ({path.name})", flush=True)
        try:
            urllib.request.urlopen(request, timeout=300).close()
        except (urllib.error.URLError, OSError) as e:
            raise PublishError(f"uploading {path.name} to {self} failed: {e}") from None


def _fetch(url: str | urllib.request.Request, where: object, what: str, *, timeout: float = 30) -> bytes | None:
    """The body at a destination's URL, or None where it answers 404; any
    other failure is a PublishError naming the destination (`where`)."""
    found = _fetch_with_headers(url, where, what, timeout=timeout)
    return found[0] if found is not None else None


def _fetch_with_headers(
    url: str | urllib.request.Request, where: object, what: str, *, timeout: float = 30
) -> tuple[bytes, Message] | None:
    """As _fetch, with the response's headers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.read(), r.headers
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return None
        raise PublishError(f"{where}: {what} failed: HTTP {e.code}") from None
    except (urllib.error.URLError, OSError) as e:
        raise PublishError(f"{where} is not reachable: {e}") from None


def make_index(spec: str):
    return HttpIndex(spec) if spec.startswith(("http://", "https://")) else DirectoryIndex(ROOT / spec)


# --- registries -----------------------------------------------------------------


class Registry:
    """An OCI registry reached over HTTP on loopback (docker pushes there
    without TLS)."""

    def __init__(self, address: str, runtime: ContainerRuntime) -> None:
        self.address = address
        self.runtime = runtime

    def __str__(self) -> str:
        return f"registry {self.address}"

    def existing(self, name: str, tag: str) -> str | None:
        """The image id (config digest) the tag holds, or None."""
        found = self.manifest(name, tag)
        return found[0] if found is not None else None

    def manifest(self, name: str, tag: str) -> tuple[str, str] | None:
        """(image id, registry manifest digest) of the tag, or None. The
        manifest digest is the sha256 of the manifest's bytes as served,
        which must be the registry's Docker-Content-Digest: what a pull by
        NAME@sha256:... fetches."""
        request = urllib.request.Request(
            f"http://{self.address}/v2/{name}/manifests/{tag}",
            headers={
                "Accept": "application/vnd.docker.distribution.manifest.v2+json, "
                "application/vnd.oci.image.manifest.v1+json"
            },
        )
        found = _fetch_with_headers(request, self, f"reading {name}:{tag}")
        if found is None:
            return None
        body, header = found[0], found[1].get("Docker-Content-Digest")
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
        if header is not None and header != digest:
            raise PublishError(
                f"{self}: {name}:{tag} is served with Docker-Content-Digest {header} "
                f"but its bytes hash to {digest}; check the registry"
            )
        return json.loads(body)["config"]["digest"], digest

    def reference(self, name: str, digest: str) -> str:
        return f"{self.address}/{name}@{digest}"

    def push(self, local_ref: str, name: str, tag: str) -> None:
        remote = f"{self.address}/{name}:{tag}"
        self.runtime.run("tag", local_ref, remote)
        try:
            if self.runtime.run("push", remote, check=False).returncode != 0:
                raise PublishError(
                    f"pushing {remote} failed (output above): is {self} up? "
                    f"Re-run the release once it is: what was published is kept"
                )
        finally:
            self.runtime.remove_image(remote)  # only the push's tag: the image keeps local_ref


def ensure_local_registry(root: Path = LOCAL_REGISTRY_DIR, address: str = LOCAL_REGISTRY_ADDR) -> str:
    """The pipeline's own registry: Debian's docker-registry on loopback,
    storing under `root`, started unless one answers there already. It keeps
    running after the release (the next release and consumers pull from it)."""
    if not _registry_answers(address):
        cmd, log = _registry_command(root, address)
        pid = start_daemon(cmd, log)
        try:
            _wait_for_registry(address, log, lambda: running(pid))
        except PublishError:
            if running(pid):
                os.kill(pid, signal.SIGTERM)
            raise
    return address


def start_registry(root: Path, address: str) -> subprocess.Popen:
    """Start docker-registry on `address` (loopback) storing under `root` as a
    child the caller stops; returns it once it answers."""
    cmd, log = _registry_command(root, address)
    print("+", " ".join(cmd), f">> {log} 2>&1 &", flush=True)
    with log.open("ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_for_registry(address, log, lambda: proc.poll() is None)
    except PublishError:
        proc.kill()
        proc.wait()
        raise
    return proc


def _registry_command(root: Path, address: str) -> tuple[list[str], Path]:
    ensure_debian_packages(["docker-registry"])
    root.mkdir(parents=True, exist_ok=True)
    config = root / "config.yml"
    config.write_text(
        f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {root / 'data'}\nhttp:\n  addr: {address}\n"
    )
    return ["docker-registry", "serve", str(config)], root / "registry.log"


def _wait_for_registry(address: str, log: Path, alive) -> None:
    for _ in range(60):
        if _registry_answers(address):
            return
        if not alive():
            break
        time.sleep(0.5)
    raise PublishError(f"the registry did not start on {address}; its log is {log}")


def _registry_answers(address: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{address}/v2/", timeout=5):
            return True
    except (urllib.error.URLError, OSError):
        return False


# --- the stage ------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class Destinations:
    index: object  # DirectoryIndex | HttpIndex
    registry: Registry
    manifests: Path


def publish(manifest_path: Path, *, artifact_dirs: list[Path], dest: Destinations) -> dict:
    """Publish the artifacts of a signed manifest, then the manifest."""
    manifest = _read_manifest(manifest_path)
    version = manifest["version"]
    found = {}
    for d in artifact_dirs:
        if not d.is_dir():
            raise PublishError(
                f"{d}: {'no such folder' if not d.exists() else 'not a folder'}; it "
                f"holds the release's artifacts: run the stages that make them first"
            )
        found.update({p.name: p for p in d.rglob("*") if p.is_file() or p.is_symlink()})
    beside = [manifest_path.with_name(manifest_path.name + ".sig"), manifest_path.with_name(PUBLIC_KEY_FILE)]
    for src in beside:
        _plain_file(src, "it is written by the manifest stage beside the manifest: run that stage again")
    wheels = [a for a in manifest["artifacts"] if a.get("file", "").endswith(".whl")]
    files = [a for a in manifest["artifacts"] if "file" in a and not a["file"].endswith(".whl")]
    images = [a for a in manifest["artifacts"] if a["kind"] == "image"]

    # Pre-flight: nothing is written if any destination holds other bytes.
    todo_wheels, todo_files, todo_images = [], [], []
    for a in wheels:
        have = dest.index.existing(a["file"])
        if have is not None and have != a["sha256"]:
            raise CollisionError(
                f"{a['file']} is already in {dest.index} with other bytes "
                f"(sha256 {have}); version {version} is published. Bump the version"
            )
        if have is None:
            todo_wheels.append(a)
    files_dir = dest.manifests / version
    for a in files:
        path = files_dir / a["file"]
        if path.is_file() and sha256_of(path) != a["sha256"]:
            raise CollisionError(f"{path} exists with other bytes; version {version} is published")
        if not path.is_file():
            todo_files.append(a)
    for a in images:
        name = a["ref"].split("/", 1)[1].rsplit(":", 1)[0]
        have = dest.registry.existing(name, version)
        if have is not None and have != a["digest"]:
            raise CollisionError(
                f"{name}:{version} is already in {dest.registry} as {have}, "
                f"not {a['digest']}; version {version} is published"
            )
        if have is None:
            todo_images.append((a, name))
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
