"""Build-time metadata provider (never packaged): the engine wheel's version.
The release's version comes from engine/pyproject.toml (`release` in this
provider's table); the release's build stage adds the target's PEP 440 local
version label (release.toml [targets.*] local_version) through
ACTIVEKV_LOCAL_VERSION, as torch labels its builds (2.14.0+cu130): wheels of
several targets then have names of their own in one package index. A build
without it (the tests' local install) is the plain release version."""

from __future__ import annotations

import os
import re
from typing import Any

LABEL = "ACTIVEKV_LOCAL_VERSION"
# Normalised PEP 440 local version label: what release.toml accepts.
_LABEL = re.compile(r"^[a-z0-9]+(\.[a-z0-9]+)*$")


def dynamic_metadata(settings: dict[str, Any], project: dict[str, Any]) -> dict[str, Any]:
    release = settings.get("release")
    if not isinstance(release, str) or not release:
        raise RuntimeError('engine/pyproject.toml: the version provider\'s table needs release = "X.Y.Z"')
    label = os.environ.get(LABEL, "")
    if not label:
        return {"version": release}
    if not _LABEL.match(label):
        raise RuntimeError(f"{LABEL}={label!r} is not a PEP 440 local version label (like 'cu130')")
    return {"version": f"{release}+{label}"}
