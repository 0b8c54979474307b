"""OCI registries a release's images go to, and the local one the pipeline
runs on 127.0.0.1 (a Debian docker-registry) when the profile says "local"."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

from pipeline.container import ContainerRuntime
from pipeline.errors import PublishError
from pipeline.host import ensure_debian_packages, running, start_daemon
from pipeline.paths import LOCAL_REGISTRY_DIR
from pipeline.publishing.http import fetch_with_headers

LOCAL_REGISTRY_ADDR = "127.0.0.1:5000"


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
        found = fetch_with_headers(request, self, f"reading {name}:{tag}")
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
