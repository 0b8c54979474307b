"""release.toml, read into frozen dataclasses. Every key is checked at load
time; an error names the key, what was wrong and what it accepts."""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, get_args

from pipeline import paths
from pipeline.errors import ConfigError
from pipeline.paths import ROOT

RELEASE_TOML = ROOT / "release.toml"

# What a target builds for. A target is named by its accelerator, or by a name
# of its own with an `accelerator` key (cuda-vllm0.26: a second cuda target
# for another vLLM and torch).
Accelerator = Literal["cpu", "cuda", "xpu"]
EngineName = Literal["docker", "podman"]
ACCELERATORS: tuple[str, ...] = get_args(Accelerator)
# A target's name is a folder (build/release/<target>) and part of image names.
_TARGET_NAME = re.compile(r"^[a-z][a-z0-9.-]*[a-z0-9]$")
# A PEP 440 local version label, normalised (lower case, dot-separated).
_LOCAL_VERSION = re.compile(r"^[a-z0-9]+(\.[a-z0-9]+)*$")
_PYTHON = re.compile(r"^3\.(\d+)$")
_DIGEST_PIN = re.compile(r"^[^@\s]+@sha256:[0-9a-f]{64}$")
_DISTRIBUTION = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$")  # a PEP 508 name
_RELEASE_VERSION = re.compile(r"^\d+(\.\d+)*$")  # a vLLM release: 0.32.0
# Keys a target table may leave out (their defaults are the dataclass's).
OPTIONAL_TARGET_KEYS = {"broken_beside_torch", "accelerator", "image_build_gib"}
# Free space an image of a target needs while it is built, where release.toml
# does not say: a cpu builder or runtime base is ~2 GB, and a build step's
# layer is held twice (its container and the committed layer).
DEFAULT_IMAGE_BUILD_GIB = 6


@dataclasses.dataclass(frozen=True, kw_only=True)
class DebootstrapBase:
    """A Debian base made on the build host with debootstrap and imported."""

    suite: str
    mirror: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class PulledBase:
    """A base image pulled from a registry, pinned by digest."""

    image: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class Target:
    name: str
    accelerator: Accelerator
    torch: str
    # The local version label of the target's engine wheels (0.1.0+cu130):
    # one index holds every target's wheels under distinct names.
    local_version: str
    python: tuple[str, ...]
    platform_tag: str
    builder_base: DebootstrapBase | PulledBase
    builder_dockerfile: Path
    runtime_dockerfile: Path
    index_url: str
    torch_index_url: str
    find_links: tuple[Path, ...]
    ca_bundle: Path | None
    provided_libraries: tuple[str, ...]
    max_wheel_bytes: int
    vllm_distribution: str
    # The vLLM release this target's users run (patches/vllm/<version>/ and
    # the pin of vllm_distribution at it in packaging/vllm-distributions.toml).
    vllm_version: str
    # Distributions vLLM pulls in that fail to import beside this target's
    # torch: uninstalled wherever the target's vLLM is installed.
    broken_beside_torch: tuple[str, ...] = ()
    # GiB free the container runtime needs while one of the target's images
    # is built (checked before each build: a clear error, not a full disk).
    image_build_gib: int = DEFAULT_IMAGE_BUILD_GIB

    @property
    def cpython_tags(self) -> tuple[str, ...]:
        """cp311 for 3.11, and so on."""
        return tuple("cp" + v.replace(".", "") for v in self.python)

    @property
    def torch_version(self) -> str:
        """The public version (2.13.0 of 2.13.0+cpu)."""
        return self.torch.split("+", 1)[0]

    def wheel_version(self, release: str) -> str:
        """The version its engine wheels carry for a release: 0.1.0+cu130."""
        return f"{release}+{self.local_version}"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Profile:
    name: str
    description: str
    targets: tuple[str, ...]
    # Where a release of this profile is published (see pipeline/stages/publish.py).
    index: str = paths.relative(paths.PUBLISH_INDEX)
    registry: str = "local"
    manifests: str = paths.relative(paths.PUBLISH_MANIFESTS)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ReleaseConfig:
    container_engine: EngineName
    default_profile: str
    profiles: Mapping[str, Profile]
    targets: Mapping[str, Target]

    def target(self, name: str) -> Target:
        if name not in self.targets:
            raise ConfigError(f"release.toml: no target {name!r}; configured targets: {', '.join(self.targets)}")
        return self.targets[name]


def load(path: Path = RELEASE_TOML, *, environ: Mapping[str, str] = os.environ) -> ReleaseConfig:
    """Read and check release.toml. PIP_FIND_LINKS and PIP_CERT / SSL_CERT_FILE
    from `environ` add a wheelhouse and supply the CA bundle where the file
    leaves them empty (hosts configure pip that way)."""
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path.name} not found at {path}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path.name}: not valid TOML: {e}") from None
    reader = _Reader(path.name, path.parent, environ)
    return reader.release(data)


class _Reader:
    def __init__(self, filename: str, root: Path, environ: Mapping[str, str]) -> None:
        self.filename = filename
        self.root = root
        self.environ = environ

    def fail(self, key: str, message: str) -> ConfigError:
        return ConfigError(f"{self.filename}: [{key}] {message}")

    def table(
        self, data: Mapping[str, Any], key: str, allowed: set[str], required: set[str], *, entry: str | None = None
    ) -> dict:
        """data[entry] (default: the last part of `key`, which names it in errors)."""
        value = data.get(entry or key.rsplit(".", 1)[-1])
        if not isinstance(value, dict):
            raise self.fail(key, "missing or not a table")
        unknown = sorted(set(value) - allowed)
        if unknown:
            raise self.fail(key, f"unknown key {unknown[0]!r}; accepted keys: {', '.join(sorted(allowed))}")
        missing = sorted(required - set(value))
        if missing:
            raise self.fail(key, f"missing key {missing[0]!r}")
        return value

    def typed(self, table: Mapping[str, Any], where: str, key: str, kind: type) -> Any:
        value = table[key]
        if kind is int and isinstance(value, bool) or not isinstance(value, kind):
            raise self.fail(where, f"{key} must be a {kind.__name__}, got {value!r}")
        return value

    def strings(self, table: Mapping[str, Any], where: str, key: str) -> tuple[str, ...]:
        value = table[key]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.fail(where, f"{key} must be a list of strings, got {value!r}")
        return tuple(value)

    def existing_file(self, where: str, key: str, value: str) -> Path:
        path = self.root / value
        if not path.is_file():
            raise self.fail(where, f"{key}: {value} does not exist (paths are relative to the repository root)")
        return path

    def release(self, data: Mapping[str, Any]) -> ReleaseConfig:
        unknown = sorted(set(data) - {"release", "profiles", "targets"})
        if unknown:
            raise self.fail(unknown[0], "unknown table; accepted: release, profiles, targets")
        keys = {"container_engine", "default_profile"}
        if isinstance(data.get("release"), dict) and "vllm_version" in data["release"]:
            raise self.fail(
                "release", "vllm_version is per target now: give each [targets.*] table its own vllm_version"
            )
        rel = self.table(data, "release", keys, keys)
        engine = rel["container_engine"]
        if engine not in get_args(EngineName):
            raise self.fail(
                "release", f"container_engine {engine!r} is not accepted; accepted values: 'docker', 'podman'"
            )
        targets = self.targets(data)
        profiles = self.profiles(data, targets)
        default = self.typed(rel, "release", "default_profile", str)
        if default not in profiles:
            raise self.fail("release", f"default_profile {default!r} is not a profile; profiles: {', '.join(profiles)}")
        return ReleaseConfig(container_engine=engine, default_profile=default, profiles=profiles, targets=targets)

    def profiles(self, data: Mapping[str, Any], targets: Mapping[str, Target]) -> dict[str, Profile]:
        raw = data.get("profiles")
        if not isinstance(raw, dict) or not raw:
            raise self.fail("profiles", "missing: define at least one profile")
        out = {}
        for name in raw:
            where = f"profiles.{name}"
            t = self.table(
                raw, where, {"description", "targets", "index", "registry", "manifests"}, {"targets"}, entry=name
            )
            names = self.strings(t, where, "targets")
            for n in names:
                if n not in targets:
                    raise self.fail(where, f"target {n!r} is not configured; targets: {', '.join(targets)}")
            dests = {k: self.typed(t, where, k, str) for k in ("index", "registry", "manifests") if k in t}
            out[name] = Profile(
                name=name,
                description=t.get("description", ""),
                targets=names,  # type: ignore[arg-type]
                **dests,
            )
        return out

    def targets(self, data: Mapping[str, Any]) -> dict[str, Target]:
        raw = data.get("targets")
        if not isinstance(raw, dict) or not raw:
            raise self.fail("targets", "missing: define at least one target")
        targets = {name: self.target(raw, name) for name in raw}
        labels: dict[str, str] = {}
        for t in targets.values():
            if t.local_version in labels:
                raise self.fail(
                    f"targets.{t.name}",
                    f"local_version {t.local_version!r} is also "
                    f"[targets.{labels[t.local_version]}]'s: each target's engine wheels "
                    f"need a label of their own (one index holds them all)",
                )
            labels[t.local_version] = t.name
        return targets

    def target(self, raw: Mapping[str, Any], name: str) -> Target:
        where = f"targets.{name}"
        if not _TARGET_NAME.match(name):
            raise self.fail(
                where,
                "a target's name is lower-case letters, digits, '.' and '-', "
                "starting with a letter (it names folders and images)",
            )
        keys = {f.name for f in dataclasses.fields(Target)} - {"name"}
        t = self.table(raw, where, keys, keys - OPTIONAL_TARGET_KEYS, entry=name)
        accelerator = self.accelerator(t, where, name)
        torch = self.typed(t, where, "torch", str)
        local = self.local_version(t, where, torch)
        python = self.strings(t, where, "python")
        for v in python:
            if not _PYTHON.match(v):
                raise self.fail(where, f"python: {v!r} is not a CPython version like '3.11'")
        size = self.typed(t, where, "max_wheel_bytes", int)
        if size <= 0:
            raise self.fail(where, f"max_wheel_bytes must be positive, got {size}")
        build_gib = self.typed(t, where, "image_build_gib", int) if "image_build_gib" in t else DEFAULT_IMAGE_BUILD_GIB
        if build_gib <= 0:
            raise self.fail(where, f"image_build_gib must be positive, got {build_gib}")
        ca = (
            self.typed(t, where, "ca_bundle", str)
            or self.environ.get("PIP_CERT")
            or self.environ.get("SSL_CERT_FILE")
            or ""
        )
        if ca and not Path(ca).is_file():
            raise self.fail(where, f"ca_bundle: {ca} is not a file")
        find_links = [self.root / p for p in self.strings(t, where, "find_links")]
        find_links += [Path(p) for p in self.environ.get("PIP_FIND_LINKS", "").split() if p]
        return Target(
            name=name,
            accelerator=accelerator,  # type: ignore[arg-type]
            torch=torch,
            local_version=local,
            python=python,
            platform_tag=self.typed(t, where, "platform_tag", str),
            builder_base=self.base(t, where),
            builder_dockerfile=self.existing_file(where, "builder_dockerfile", t["builder_dockerfile"]),
            runtime_dockerfile=self.existing_file(where, "runtime_dockerfile", t["runtime_dockerfile"]),
            index_url=self.typed(t, where, "index_url", str),
            torch_index_url=self.typed(t, where, "torch_index_url", str),
            find_links=tuple(p for p in find_links if p.is_dir()),
            ca_bundle=Path(ca) if ca else None,
            provided_libraries=self.strings(t, where, "provided_libraries"),
            max_wheel_bytes=size,
            vllm_distribution=self.typed(t, where, "vllm_distribution", str),
            vllm_version=self.release_version(t, where, "vllm_version"),
            broken_beside_torch=self.distributions(t, where, "broken_beside_torch"),
            image_build_gib=build_gib,
        )

    def accelerator(self, t: Mapping[str, Any], where: str, name: str) -> str:
        if "accelerator" not in t:
            if name not in ACCELERATORS:
                raise self.fail(
                    where,
                    f"missing key 'accelerator': a target not named {', '.join(ACCELERATORS)} says which it builds for",
                )
            return name
        value = self.typed(t, where, "accelerator", str)
        if value not in ACCELERATORS:
            raise self.fail(
                where,
                f"accelerator {value!r} is not accepted; accepted values: {', '.join(repr(a) for a in ACCELERATORS)}",
            )
        if name in ACCELERATORS and value != name:
            raise self.fail(where, f"accelerator {value!r}: a target named {name!r} builds for {name}")
        return value

    def local_version(self, t: Mapping[str, Any], where: str, torch: str) -> str:
        value = self.typed(t, where, "local_version", str)
        if not _LOCAL_VERSION.match(value):
            raise self.fail(
                where,
                f"local_version: {value!r} is not a PEP 440 local version label "
                f"(lower-case letters and digits, dot-separated, like 'cu130')",
            )
        own = torch.partition("+")[2]
        if own and value.split(".")[0] != own:
            raise self.fail(
                where, f"local_version {value!r}: torch {torch} is the {own!r} build, so the label starts with {own!r}"
            )
        return value

    def release_version(self, t: Mapping[str, Any], where: str, key: str) -> str:
        value = self.typed(t, where, key, str)
        if not _RELEASE_VERSION.match(value):
            raise self.fail(where, f"{key}: {value!r} is not a vLLM release version like '0.32.0'")
        return value

    def distributions(self, t: Mapping[str, Any], where: str, key: str) -> tuple[str, ...]:
        if key not in t:
            return ()
        names = self.strings(t, where, key)
        for n in names:
            if not _DISTRIBUTION.match(n):
                raise self.fail(where, f"{key}: {n!r} is not a distribution name (like 'torchvision')")
        return names

    def base(self, t: Mapping[str, Any], where: str) -> DebootstrapBase | PulledBase:
        base = t["builder_base"]
        if isinstance(base, dict) and set(base) == {"debootstrap", "mirror"}:
            return DebootstrapBase(suite=base["debootstrap"], mirror=base["mirror"])
        if isinstance(base, dict) and set(base) == {"image"}:
            if not _DIGEST_PIN.match(base["image"]):
                raise self.fail(
                    where, f"builder_base: {base['image']!r} is not pinned; write it as name@sha256:<64 hex digits>"
                )
            return PulledBase(image=base["image"])
        raise self.fail(
            where,
            'builder_base must be { debootstrap = "<suite>", mirror = "<url>" } or '
            '{ image = "<name>@sha256:<digest>" }, got ' + repr(base),
        )
