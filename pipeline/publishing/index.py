"""Package indexes a release's wheels go to: a PEP 503 folder or a real
index that takes uploads, behind one interface (PackageIndex)."""

from __future__ import annotations

import hashlib
import html
import re
import urllib.error
import urllib.parse
import urllib.request
import uuid
from pathlib import Path
from typing import Protocol

from pipeline.digest import sha256_of
from pipeline.errors import PublishError
from pipeline.paths import ROOT, relative
from pipeline.publishing.files import write_atomic
from pipeline.publishing.http import fetch
from pipeline.release_format import project_of, wheel_name


class PackageIndex(Protocol):
    """What the publish stage needs of an index."""

    def existing(self, wheel: str) -> str | None:
        """The sha256 of the published `wheel`, None where it is not there."""

    def upload(self, path: Path) -> None:
        """Publish the wheel at `path` (whole, or not at all)."""

    def location(self, wheel: str) -> str:
        """Where the published `wheel` lies, for the operator."""

    def pip_url(self) -> str:
        """What `pip install --index-url` takes to install from it."""


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
        page = fetch(page_url, self, f"listing {project_of(wheel)}")
        if page is None:
            return None
        for href in re.findall(r'href="([^"]+)"', page.decode()):
            name, _, frag = href.rpartition("/")[2].partition("#")
            if urllib.request.url2pathname(name) == wheel:
                if frag.startswith("sha256="):
                    return frag.removeprefix("sha256=")
                data = fetch(urllib.parse.urljoin(page_url, href), self, f"reading {wheel}", timeout=60)
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


def make_index(spec: str) -> PackageIndex:
    return HttpIndex(spec) if spec.startswith(("http://", "https://")) else DirectoryIndex(ROOT / spec)
