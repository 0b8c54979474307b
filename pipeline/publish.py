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
"""

from __future__ import annotations

import dataclasses
import hashlib
import html
import json
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

from pipeline.config import ROOT
from pipeline.container import ContainerEngine
from pipeline.errors import PipelineError
from pipeline.host import ensure_debian_packages, running, start_daemon
from pipeline.digest import sha256_of

LOCAL_REGISTRY_ADDR = "127.0.0.1:5000"
LOCAL_REGISTRY_DIR = ROOT / "build" / "publish" / "registry"


class PublishError(PipelineError):
    exit_code = 9


class CollisionError(PublishError):
    """This version is already published with other bytes."""

    exit_code = 10


def project_of(wheel: str) -> str:
    return re.sub(r"[-_.]+", "-", wheel.split("-", 1)[0]).lower()


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

    def upload(self, path: Path) -> None:
        folder = self.root / project_of(path.name)
        folder.mkdir(parents=True, exist_ok=True)
        partial = folder / (path.name + ".partial")
        shutil.copyfile(path, partial)
        partial.rename(folder / path.name)  # a reader never sees half a wheel
        self._pages()

    def _pages(self) -> None:
        projects = sorted(p for p in self.root.iterdir() if p.is_dir())
        for project in projects:
            links = "".join(
                f'<a href="{html.escape(f.name)}#sha256={sha256_of(f)}">{html.escape(f.name)}</a><br>\n'
                for f in sorted(project.glob("*.whl")))
            (project / "index.html").write_text(f"<!DOCTYPE html>\n<html><body>\n{links}</body></html>\n")
        links = "".join(f'<a href="{p.name}/">{p.name}</a><br>\n' for p in projects)
        (self.root / "index.html").write_text(f"<!DOCTYPE html>\n<html><body>\n{links}</body></html>\n")


class HttpIndex:
    """A real package index that takes uploads (pypiserver: the upload API
    twine uses) and serves PEP 503 pages under /simple/."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")

    def __str__(self) -> str:
        return f"package index {self.url}"

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
        name, version = path.name.split("-")[:2]
        boundary = uuid.uuid4().hex
        fields = {":action": "file_upload", "protocol_version": "1", "name": name, "version": version,
                  "filetype": "bdist_wheel", "sha256_digest": sha256_of(path)}
        body = b"".join(f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode()
                        for k, v in fields.items())
        body += (f'--{boundary}\r\nContent-Disposition: form-data; name="content"; filename="{path.name}"\r\n'
                 f"Content-Type: application/octet-stream\r\n\r\n").encode() + path.read_bytes()
        body += f"\r\n--{boundary}--\r\n".encode()
        request = urllib.request.Request(f"{self.url}/", data=body, method="POST", headers={
            "Content-Type": f"multipart/form-data; boundary={boundary}"})
        print(f"+ POST {self.url}/ ({path.name})", flush=True)
        try:
            urllib.request.urlopen(request, timeout=300).close()
        except (urllib.error.URLError, OSError) as e:
            raise PublishError(f"uploading {path.name} to {self} failed: {e}") from None


def _fetch(url: str | urllib.request.Request, where: object, what: str, *, timeout: float = 30
           ) -> bytes | None:
    """The body at a destination's URL, or None where it answers 404; any
    other failure is a PublishError naming the destination (`where`)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.read()
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

    def __init__(self, address: str, engine: ContainerEngine) -> None:
        self.address = address
        self.engine = engine

    def __str__(self) -> str:
        return f"registry {self.address}"

    def existing(self, name: str, tag: str) -> str | None:
        """The image id (config digest) the tag holds, or None."""
        request = urllib.request.Request(
            f"http://{self.address}/v2/{name}/manifests/{tag}",
            headers={"Accept": "application/vnd.docker.distribution.manifest.v2+json, "
                               "application/vnd.oci.image.manifest.v1+json"})
        body = _fetch(request, self, f"reading {name}:{tag}")
        return json.loads(body)["config"]["digest"] if body is not None else None

    def push(self, local_ref: str, name: str, tag: str) -> None:
        remote = f"{self.address}/{name}:{tag}"
        self.engine.run("tag", local_ref, remote)
        try:
            if self.engine.run("push", remote, check=False).returncode != 0:
                raise PublishError(f"pushing {remote} failed (output above): is {self} up? "
                                   f"Re-run the release once it is: what was published is kept")
        finally:
            self.engine.remove_image(remote)  # only the push's tag: the image keeps local_ref


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
    config.write_text(f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {root / 'data'}\n"
                      f"http:\n  addr: {address}\n")
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
    manifest = json.loads(manifest_path.read_text())
    version = manifest["version"]
    found = {p.name: p for d in artifact_dirs for p in d.rglob("*") if p.is_file()}
    wheels = [a for a in manifest["artifacts"] if a.get("file", "").endswith(".whl")]
    files = [a for a in manifest["artifacts"] if "file" in a and not a["file"].endswith(".whl")]
    images = [a for a in manifest["artifacts"] if a["kind"] == "image"]

    # Pre-flight: nothing is written if any destination holds other bytes.
    todo_wheels, todo_files, todo_images = [], [], []
    for a in wheels:
        have = dest.index.existing(a["file"])
        if have is not None and have != a["sha256"]:
            raise CollisionError(f"{a['file']} is already in {dest.index} with other bytes "
                                 f"(sha256 {have}); version {version} is published. Bump the version")
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
            raise CollisionError(f"{name}:{version} is already in {dest.registry} as {have}, "
                                 f"not {a['digest']}; version {version} is published")
        if have is None:
            todo_images.append((a, name))
    published = dest.manifests / manifest_path.name
    if published.is_file():
        earlier = json.loads(published.read_text())
        if earlier["artifacts"] != manifest["artifacts"]:
            raise CollisionError(f"{published} records other artifacts for version {version}")

    for a in todo_wheels:
        dest.index.upload(_local(found, a))
    for a in todo_files:
        files_dir.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(_local(found, a), files_dir / a["file"])
    for a, name in todo_images:
        dest.registry.push(a["ref"], name, version)
    # Last: the signature and public key, then the manifest, which makes the
    # release visible. A manifest already there (a finished release) is kept.
    if not published.is_file():
        dest.manifests.mkdir(parents=True, exist_ok=True)
        for src in (manifest_path.with_name(manifest_path.name + ".sig"),
                    manifest_path.with_name("activekv-release-key.pub.pem")):
            shutil.copyfile(src, dest.manifests / src.name)
        partial = published.with_name(published.name + ".partial")
        shutil.copyfile(manifest_path, partial)
        partial.rename(published)
    return {"stage": "publish", "version": version,
            "wheels": [a["file"] for a in todo_wheels], "files": [a["file"] for a in todo_files],
            "images": [n for _, n in todo_images], "manifest": str(published),
            "skipped": len(wheels) + len(files) + len(images) - len(todo_wheels) - len(todo_files) - len(todo_images)}


def _local(found: dict[str, Path], artifact: dict) -> Path:
    path = found.get(artifact["file"])
    if path is None or sha256_of(path) != artifact["sha256"]:
        raise PublishError(f"{artifact['file']}: the local file is missing or not the one the "
                           f"manifest lists; run the release again from the build")
    return path
