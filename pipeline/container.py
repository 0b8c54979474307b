"""One container abstraction for the whole pipeline: docker or podman, chosen in
release.toml. Every command is echoed as `+ cmd`. Containers and image builds
use the host's network (the daemon runs without a bridge)."""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import shutil
import subprocess
import uuid
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath
from types import TracebackType

from pipeline.errors import ImageError

# Set to keep a failed container for debugging (its name is printed).
KEEP_ENV = "ACTIVEKV_KEEP_CONTAINER"


def _echoed(cmd: Sequence[str | os.PathLike[str]]) -> list[str]:
    args = [str(c) for c in cmd]
    print("+", shlex.join(args), flush=True)
    return args


def echo_run(
    cmd: Sequence[str | os.PathLike[str]],
    *,
    capture: bool = False,
    check: bool = True,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    args = _echoed(cmd)
    return subprocess.run(args, check=check, text=True, capture_output=capture, env=env, cwd=cwd)


def echo_run_keeping_tail(cmd: Sequence[str | os.PathLike[str]], *, lines: int = 40) -> tuple[int, str]:
    """Run `cmd` with its output (stdout and stderr together) streamed as it
    comes; returns the exit status and the last `lines` lines, so an error can
    carry them (a CI log's tail may not reach the streamed output)."""
    args = _echoed(cmd)
    tail: deque[str] = deque(maxlen=lines)
    with subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace") as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            print(line, end="", flush=True)
            tail.append(line)
    return proc.returncode, "".join(tail)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ContainerRuntime:
    name: str  # "docker" or "podman"
    network: str = "host"

    def run(
        self, *args: str | os.PathLike[str], capture: bool = False, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        return echo_run([self.name, *args], capture=capture, check=check)

    def run_in_image(self, image: str, *cmd: str, entrypoint: str | None = None) -> str:
        """Run `cmd` in a throwaway container of `image` (removed when it
        exits) and return its standard output: a question asked of an image,
        such as its compiler's version or its installed packages."""
        args = ["run", "--rm", f"--network={self.network}"]
        if entrypoint is not None:
            args += ["--entrypoint", entrypoint]
        return self.run(*args, image, *cmd, capture=True).stdout

    def installed_packages(self, image: str) -> list[dict]:
        """`pip list` of the image's Python: [{"name": ..., "version": ...}]."""
        return json.loads(self.run_in_image(image, "-m", "pip", "list", "--format", "json", entrypoint="python"))

    def image_id(self, ref: str) -> str | None:
        """The image's id (sha256:...), or None when it is not here."""
        probe = echo_run([self.name, "image", "inspect", "--format", "{{.Id}}", ref], capture=True, check=False)
        return probe.stdout.strip() if probe.returncode == 0 else None

    def inspect_image(self, ref: str) -> tuple[str, dict[str, str]] | None:
        """The image's id (its config digest, sha256:...) and labels, or None
        when no image `ref` is here. FileNotFoundError: the runtime's command
        is not installed."""
        probe = echo_run([self.name, "image", "inspect", ref], capture=True, check=False)
        if probe.returncode != 0:
            return None
        info = json.loads(probe.stdout)[0]
        return info["Id"], (info.get("Config") or {}).get("Labels") or {}

    def build_image(
        self,
        *,
        tag: str,
        context: Path,
        dockerfile: Path,
        needs_free: int,
        build_args: Mapping[str, str] = {},
        labels: Mapping[str, str] = {},
    ) -> str:
        """Build `tag`; first check that `needs_free` bytes are free where the
        runtime keeps its layers (a build that fills the disk half-way fails late
        and unclearly)."""
        self.require_free_space(needs_free, purpose=f"building {tag}")
        # --force-rm: a failed step's container goes too (it can hold GBs).
        args = ["build", f"--network={self.network}", "--force-rm", "--tag", tag, "--file", str(dockerfile)]
        for k, v in build_args.items():
            args += ["--build-arg", f"{k}={v}"]
        for k, v in labels.items():
            args += ["--label", f"{k}={v}"]
        status, tail = echo_run_keeping_tail([self.name, *args, str(context)])
        image = self.image_id(tag) if status == 0 else None
        if image is None:
            raise ImageError(
                f"building image {tag} from {dockerfile.name} failed (exit {status}); the build's last lines:\n{tail}"
            )
        return image

    def references(self, repository: str | None = None) -> list[str]:
        """The REPOSITORY:TAG references of `repository` here (of every
        repository when None)."""
        listed = echo_run(
            [self.name, "image", "ls", "--format", "{{.Repository}}:{{.Tag}}", *([repository] if repository else [])],
            capture=True,
            check=False,
        )
        # podman names local images localhost/REPO: give them as they were tagged.
        return sorted(
            {line.removeprefix("localhost/") for line in listed.stdout.split() if not line.endswith(":<none>")}
        )

    def remove_image(self, ref: str) -> bool:
        """Remove the tag or image `ref` (never forced: an image a container
        still uses stays). Says why where the runtime refuses."""
        removed = echo_run([self.name, "image", "rm", ref], capture=True, check=False)
        if removed.returncode != 0:
            print(f"  kept {ref}: {removed.stderr.strip()}", flush=True)
        return removed.returncode == 0

    def prune_untagged(self, label: str) -> None:
        """Remove untagged images carrying `label` (KEY=VALUE): earlier builds of
        ours whose tag moved on. Images without it are not ours to remove."""
        self.run("image", "prune", "--force", "--filter", f"label={label}", check=False)

    def free_bytes(self) -> int:
        """Free space where the runtime keeps its images and build layers."""
        template = "{{.Store.GraphRoot}}" if self.name == "podman" else "{{.DockerRootDir}}"
        root = echo_run([self.name, "info", "--format", template], capture=True).stdout.strip()
        return shutil.disk_usage(root).free

    def require_free_space(self, needed: int, *, purpose: str) -> None:
        """Raise ImageError before a build that would fill the disk half-way."""
        free = self.free_bytes()
        if free < needed:
            raise ImageError(
                f"{purpose} needs about {needed / 2**30:.0f} GiB free where {self.name} keeps its "
                f"images; {free / 2**30:.1f} GiB are free. Free space there ({self.name} image ls; "
                f"{self.name} image rm what is not needed; {self.name} image prune) and run again"
            )

    def pull(self, ref: str) -> str:
        if (image := self.image_id(ref)) is not None:
            return image
        result = self.run("pull", ref, check=False)
        if result.returncode != 0 or (image := self.image_id(ref)) is None:
            raise ImageError(f"could not pull {ref}")
        return image


class Container:
    """A started container of `image`, removed on exit (kept when
    ACTIVEKV_KEEP_CONTAINER is set). `call` runs a command in it."""

    def __init__(
        self,
        *,
        runtime: ContainerRuntime,
        image: str,
        volumes: Sequence[tuple[Path, str]] = (),
        env: Mapping[str, str] = {},
    ) -> None:
        self.runtime = runtime
        self.image = image
        self.volumes = volumes
        self.env = dict(env)
        self.name = f"activekv-{uuid.uuid4().hex[:12]}"

    def __enter__(self) -> Container:
        args = ["create", "--name", self.name, f"--network={self.runtime.network}", "--init"]
        for host, inside in self.volumes:
            args += ["--volume", f"{host}:{inside}"]
        for k, v in self.env.items():
            args += ["--env", f"{k}={v}"]
        self.runtime.run(*args, self.image, "sleep", "infinity")
        self.runtime.run("start", self.name)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is not None and os.environ.get(KEEP_ENV):
            print(f"{KEEP_ENV} is set: keeping container {self.name}", flush=True)
            return
        self.runtime.run("rm", "--force", self.name, capture=True, check=False)

    def call(
        self,
        args: Sequence[str | PurePosixPath],
        *,
        env: Mapping[str, str] = {},
        capture: bool = False,
        check: bool = True,
        cwd: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        cmd = ["exec"]
        for k, v in env.items():
            cmd += ["--env", f"{k}={v}"]
        if cwd:
            cmd += ["--workdir", cwd]
        return self.runtime.run(*cmd, self.name, *map(str, args), capture=capture, check=check)

    def copy_into(self, local: Path, inside: PurePosixPath) -> None:
        self.call(["mkdir", "-p", str(inside.parent)])
        self.runtime.run("cp", str(local), f"{self.name}:{inside}")

    def copy_out(self, inside: PurePosixPath, local: Path) -> None:
        local.parent.mkdir(parents=True, exist_ok=True)
        self.runtime.run("cp", f"{self.name}:{inside}", str(local))

    def glob(self, directory: PurePosixPath, pattern: str) -> list[PurePosixPath]:
        out = self.call(["find", str(directory), "-maxdepth", "1", "-name", pattern], capture=True).stdout.split()
        return sorted(PurePosixPath(p) for p in out)
