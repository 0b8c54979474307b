"""Publishing to folder destinations, on a small signed release made of real
files: a destination that runs out of space (a real 1 MiB tmpfs where this
runs as root; the file-size limit, RLIMIT_FSIZE, everywhere), a symlinked
artifact, a missing folder or file, a destination folder that cannot be
made, and the images' digest references read back from a registry."""

from __future__ import annotations

import contextlib
import hashlib
import http.server
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from pipeline.errors import PublishError
from pipeline.publishing import index as package_index
from pipeline.publishing.registry import Registry
from pipeline.stages import publish

from tests.small_release import PATCH, VERSION, WHEEL, entry, small_release  # noqa: F401


def destinations(root: Path, registry=None) -> publish.Destinations:
    return publish.Destinations(
        index=package_index.DirectoryIndex(root / "simple"),
        registry=registry or Registry("127.0.0.1:9", None),
        manifests=root / "manifests",
    )


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob("*") if p.name.endswith(".partial"))


@pytest.fixture
def small_fs(tmp_path):
    """A real 1 MiB filesystem (tmpfs), mounted for the test and unmounted after."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root (the RLIMIT_FSIZE test covers the rest)")
    mnt = tmp_path / "small"
    mnt.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def test_a_destination_out_of_space_leaves_no_partial_file_and_the_rerun_resumes(tmp_path, small_fs):
    path, files = small_release(tmp_path / "release", wheel_bytes=200_000, patch_bytes=300_000)
    filler = small_fs / "filler"
    filler.write_bytes(b"\0" * 650_000)  # the wheel fits beside it, the patch does not
    dest = destinations(small_fs)
    final = small_fs / "manifests" / VERSION / PATCH
    with pytest.raises(PublishError) as failed:
        publish.publish(path, artifact_dirs=[files, path.parent], dest=dest)
    message = str(failed.value)
    assert str(final) in message and "No space left" in message and "free space" in message
    assert "re-run" in message and "\n" not in message
    assert not final.exists() and leftovers(small_fs) == []
    assert (small_fs / "simple" / "activekv" / WHEEL).is_file()  # what was published is kept
    assert not (small_fs / "manifests" / path.name).exists()  # the release is not visible

    filler.unlink()
    record = publish.publish(path, artifact_dirs=[files, path.parent], dest=dest)
    assert record["wheels"] == [] and record["files"] == [PATCH] and record["skipped"] == 1
    assert final.read_bytes() == (files / PATCH).read_bytes()
    assert (small_fs / "manifests" / path.name).read_bytes() == path.read_bytes()
    assert leftovers(small_fs) == []


RUN_WITH_SIZE_LIMIT = """
import json, resource, signal, sys
from pathlib import Path
from pipeline.publishing import index as package_index, registry
from pipeline.stages import publish
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[4]), int(sys.argv[4])))
dest = publish.Destinations(index=package_index.DirectoryIndex(Path(sys.argv[3]) / "simple"),
                            registry=registry.Registry("127.0.0.1:9", None), manifests=Path(sys.argv[3]) / "manifests")
try:
    publish.publish(Path(sys.argv[1]), artifact_dirs=[Path(sys.argv[2]), Path(sys.argv[1]).parent], dest=dest)
except publish.PublishError as e:
    print(f"error: {e}")
    sys.exit(e.exit_code)
"""


def test_a_write_that_fails_past_the_file_size_limit_names_the_path_and_leaves_nothing(tmp_path):
    path, files = small_release(tmp_path / "release", wheel_bytes=10_000, patch_bytes=200_000)
    dest_root = tmp_path / "dest"

    def run(limit: int) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-c", RUN_WITH_SIZE_LIMIT, str(path), str(files), str(dest_root), str(limit)],
            capture_output=True,
            text=True,
            cwd=Path(publish.__file__).parents[1],
        )

    failed = run(100_000)
    final = dest_root / "manifests" / VERSION / PATCH
    assert failed.returncode == PublishError.exit_code, failed.stderr
    assert failed.stdout.count("error:") == 1 and "Traceback" not in failed.stderr
    assert f"error: {final}: writing failed (File too large)" in failed.stdout
    assert not final.exists() and leftovers(dest_root) == []
    assert not (dest_root / "manifests" / path.name).exists()

    resumed = run(10_000_000)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert final.read_bytes() == (files / PATCH).read_bytes()
    assert (dest_root / "manifests" / path.name).is_file() and leftovers(dest_root) == []


def test_a_wheel_given_as_a_symlink_is_refused_naming_it(tmp_path):
    path, files = small_release(tmp_path / "release")
    real = tmp_path / "elsewhere" / WHEEL
    real.parent.mkdir()
    (files / WHEEL).rename(real)
    (files / WHEEL).symlink_to(real)
    with pytest.raises(PublishError, match=f"{files / WHEEL}: a symbolic link \\(to {real}\\)"):
        publish.publish(path, artifact_dirs=[files, path.parent], dest=destinations(tmp_path / "dest"))
    assert not (tmp_path / "dest").exists()  # refused before anything was written


def test_a_missing_folder_or_file_is_one_error_naming_it(tmp_path):
    path, files = small_release(tmp_path / "release")
    dest = destinations(tmp_path / "dest")
    with pytest.raises(PublishError, match=f"{tmp_path / 'mistyped'}: no such folder"):
        publish.publish(path, artifact_dirs=[tmp_path / "mistyped", path.parent], dest=dest)
    with pytest.raises(PublishError, match=f"{path.with_name('nope.json')}: missing; run the manifest stage"):
        publish.publish(path.with_name("nope.json"), artifact_dirs=[files, path.parent], dest=dest)
    sig = path.with_name(path.name + ".sig")
    sig.unlink()
    with pytest.raises(PublishError, match=f"{sig}: missing"):
        publish.publish(path, artifact_dirs=[files, path.parent], dest=dest)
    assert not (tmp_path / "dest").exists()


def test_a_destination_folder_that_cannot_be_made_is_refused_before_anything_is_written(tmp_path):
    path, files = small_release(tmp_path / "release")
    (tmp_path / "dest").mkdir()
    (tmp_path / "dest" / "manifests").write_text("a file where the folder goes")
    with pytest.raises(PublishError, match=f"{tmp_path / 'dest' / 'manifests'}: a file is in the way"):
        publish.publish(path, artifact_dirs=[files, path.parent], dest=destinations(tmp_path / "dest"))
    assert not (tmp_path / "dest" / "simple").exists()


class FakeRegistryHandler(http.server.BaseHTTPRequestHandler):
    """Serves one image manifest as a registry does (distribution's v2 API)."""

    body = b""

    def do_GET(self):
        if self.path != "/v2/activekv-runtime-cpu/manifests/0.1.0":
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/vnd.docker.distribution.manifest.v2+json")
        self.send_header("Docker-Content-Digest", "sha256:" + hashlib.sha256(self.body).hexdigest())
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def release_with_a_registry(tmp_path, config: str):
    """A small release whose image has config digest `config`, and a fake
    registry serving that image's manifest: (path, files, dest, address)."""
    FakeRegistryHandler.body = json.dumps({"schemaVersion": 2, "config": {"digest": config}}).encode()
    server = http.server.HTTPServer(("127.0.0.1", 0), FakeRegistryHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        address = f"127.0.0.1:{server.server_port}"
        image = {
            "kind": "image",
            "target": "cpu",
            "ref": "activekv/activekv-runtime-cpu:0.1.0",
            "digest": config,
            "inputs_digest": "sha256:" + "c" * 64,
        }
        path, files = small_release(tmp_path / "release", image=image)
        yield path, files, destinations(tmp_path / "dest", Registry(address, None)), address
    finally:
        server.shutdown()
        server.server_close()


def test_images_are_published_by_their_registry_digest(tmp_path):
    config = "sha256:" + "b" * 64
    with release_with_a_registry(tmp_path, config) as (path, files, dest, address):
        record = publish.publish(path, artifact_dirs=[files, path.parent], dest=dest)
    digest = hashlib.sha256(FakeRegistryHandler.body).hexdigest()
    reference = f"{address}/activekv-runtime-cpu@sha256:{digest}"
    assert record["image_references"] == [reference]
    text = (tmp_path / "dest" / "manifests" / VERSION / "activekv-0.1.0-images.txt").read_text()
    assert [line for line in text.splitlines() if not line.startswith("#")] == [reference]
    assert config in text


def test_the_outputs_name_each_published_wheel_the_image_by_digest_and_the_manifest(tmp_path):
    with release_with_a_registry(tmp_path, "sha256:" + "d" * 64) as (path, files, dest, address):
        first = publish.publish(path, artifact_dirs=[files, path.parent], dest=dest)
        again = publish.publish(path, artifact_dirs=[files, path.parent], dest=dest)  # all there: a resumed run
    reference = f"{address}/activekv-runtime-cpu@sha256:{hashlib.sha256(FakeRegistryHandler.body).hexdigest()}"
    wheel = tmp_path / "dest" / "simple" / "activekv" / WHEEL
    assert again["wheels"] == [] and again["skipped"] == 3
    for record in (first, again):  # what is published, whether this run or an earlier one sent it
        assert publish.outputs(record) == [
            ("wheel", str(wheel)),
            ("package index", f"file://{(tmp_path / 'dest' / 'simple').resolve()} (pip install --index-url)"),
            ("image", reference),
            ("release files", str(tmp_path / "dest" / "manifests" / VERSION)),
            ("manifest", str(tmp_path / "dest" / "manifests" / path.name)),
        ]
    assert wheel.read_bytes() == (files / WHEEL).read_bytes()
    assert (tmp_path / "dest" / "manifests" / path.name).read_bytes() == path.read_bytes()


def test_an_http_index_names_where_pip_finds_each_wheel():
    index = package_index.HttpIndex("https://pypi.example.org/")
    assert index.pip_url() == "https://pypi.example.org/simple/"
    assert index.location(WHEEL) == f"{WHEEL} at https://pypi.example.org/simple/activekv/"
