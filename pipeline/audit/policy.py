"""The payload policy (packaging/payload-policy.toml): the allowlist of what a
wheel we ship may hold, read and checked before any wheel is."""

from __future__ import annotations

import dataclasses
import fnmatch
import posixpath
import re
import tomllib
from pathlib import Path

from pipeline.errors import ConfigError
from pipeline.paths import ROOT

POLICY_FILE = ROOT / "packaging" / "payload-policy.toml"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Policy:
    distribution: str
    modules: tuple[str, ...]
    dist_info: tuple[str, ...]
    grafted: tuple[str, ...]
    startup: tuple[str, ...]
    forbidden: tuple[str, ...]
    system_libraries: tuple[str, ...]


def matches(name: str, patterns: tuple[str, ...]) -> bool:
    """Whether a policy glob matches the entry's path or its file name."""
    return any(fnmatch.fnmatchcase(name, p) or fnmatch.fnmatchcase(posixpath.basename(name), p)
               for p in patterns)


def load_policy(path: Path = POLICY_FILE) -> Policy:
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"{path.name}: unreadable payload policy ({e})") from None
    lists = {}
    for key in ("modules", "dist_info", "grafted", "startup", "forbidden", "system_libraries"):
        value = data.get(key)
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise ConfigError(f"{path.name}: {key} must be a list of non-empty strings")
        lists[key] = tuple(value)
    distribution = data.get("distribution")
    if not isinstance(distribution, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", distribution):
        raise ConfigError(f"{path.name}: distribution must be the engine's project name "
                          f"(engine/pyproject.toml [project] name)")
    if not lists["modules"]:
        raise ConfigError(f"{path.name}: modules must name the extension module(s) the build makes")
    clash = [lib for lib in lists["system_libraries"] if matches(lib, lists["grafted"])]
    if clash:
        raise ConfigError(f"{path.name}: grafted names system libraries {clash}: a wheel "
                          f"never carries its own copy of one")
    unknown = sorted(set(data) - {"distribution", *lists})
    if unknown:
        raise ConfigError(f"{path.name}: unknown keys {unknown}")
    return Policy(distribution=distribution, **lists)
