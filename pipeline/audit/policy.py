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
    # platform tag -> symbol family ("GLIBCXX") -> the newest version allowed.
    symbol_versions: dict[str, dict[str, tuple[int, ...]]]


def matches(name: str, patterns: tuple[str, ...]) -> bool:
    """Whether a policy glob matches the entry's path or its file name."""
    return any(fnmatch.fnmatchcase(name, p) or fnmatch.fnmatchcase(posixpath.basename(name), p) for p in patterns)


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
        raise ConfigError(
            f"{path.name}: distribution must be the engine's project name (engine/pyproject.toml [project] name)"
        )
    if not lists["modules"]:
        raise ConfigError(f"{path.name}: modules must name the extension module(s) the build makes")
    clash = [lib for lib in lists["system_libraries"] if matches(lib, lists["grafted"])]
    if clash:
        raise ConfigError(
            f"{path.name}: grafted names system libraries {clash}: a wheel never carries its own copy of one"
        )
    unknown = sorted(set(data) - {"distribution", "symbol_versions", *lists})
    if unknown:
        raise ConfigError(f"{path.name}: unknown keys {unknown}")
    return Policy(distribution=distribution, symbol_versions=_symbol_versions(path, data), **lists)


def version_number(text: str) -> tuple[int, ...] | None:
    """A dotted version ("3.4.29") as numbers; None for another form ("FLOAT128")."""
    return tuple(int(x) for x in text.split(".")) if re.fullmatch(r"[0-9]+(\.[0-9]+)*", text) else None


def _symbol_versions(path: Path, data: dict) -> dict[str, dict[str, tuple[int, ...]]]:
    tables = data.get("symbol_versions")
    if not isinstance(tables, dict) or not tables:
        raise ConfigError(
            f"{path.name}: symbol_versions must hold a table per platform tag, "
            f'[symbol_versions.<tag>] with FAMILY = "newest version"'
        )
    out = {}
    for tag, families in tables.items():
        if not isinstance(families, dict) or not families:
            raise ConfigError(
                f'{path.name}: [symbol_versions.{tag}] must map symbol families to versions (GLIBC = "2.34")'
            )
        out[tag] = {}
        for family, version in families.items():
            number = version_number(version) if isinstance(version, str) else None
            if not re.fullmatch(r"[A-Z][A-Z0-9]*", family) or number is None:
                raise ConfigError(
                    f"{path.name}: [symbol_versions.{tag}] {family} = {version!r}: a "
                    f'family in capitals and a dotted version (GLIBCXX = "3.4.29")'
                )
            out[tag][family] = number
    return out
