"""One wheel under audit: the names the engine build gives what it makes for
this wheel's file name and target, which every rule compares against, and the
findings against it."""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path

from pipeline.audit.policy import Policy
from pipeline.config import Target

# The platform tag's architecture -> the ELF machine (pyelftools' name) of
# every library a wheel of that platform may carry.
MACHINES = {"x86_64": "EM_X86_64", "aarch64": "EM_AARCH64", "ppc64le": "EM_PPC64", "s390x": "EM_S390", "i686": "EM_386"}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Finding:
    wheel: str
    file: str
    rule: str
    message: str

    def __str__(self) -> str:
        return f"{self.wheel}: {self.file}: [{self.rule}] {self.message}"


def escaped(distribution: str) -> str:
    """The distribution as wheel file and folder names spell it (PEP 427)."""
    return re.sub(r"[-_.]+", "_", distribution).lower()


def _architecture(platform_tag: str) -> str | None:
    return next((a for a in MACHINES if platform_tag.endswith("_" + a)), None)


class Wheel:
    """A wheel file, what it should hold, and the findings against it."""

    def __init__(self, path: Path, target: Target, policy: Policy) -> None:
        self.path = path
        self.target = target
        self.policy = policy
        self.findings: list[Finding] = []
        stem = path.name.removesuffix(".whl").split("-")
        self.name_parts = stem if len(stem) in (5, 6) else None
        distribution = escaped(policy.distribution)
        version = self.name_parts[1] if self.name_parts else "?"
        # What the engine build makes for this wheel (engine/pyproject.toml,
        # engine/CMakeLists.txt): the module(s) at the root, one dist-info
        # folder, and auditwheel's folder of grafted libraries.
        self.dist_info = f"{distribution}-{version}.dist-info"
        self.libs = f"{distribution}.libs"
        self.arch = _architecture(target.platform_tag)
        py = self.name_parts[-3] if self.name_parts else ""
        tags = (py,) if py in target.cpython_tags else target.cpython_tags
        libc = "musl" if target.platform_tag.startswith("musllinux") else "gnu"
        self.modules = {
            m: {f"{m}.cpython-{t.removeprefix('cp')}-{self.arch}-linux-{libc}.so" for t in tags} for m in policy.modules
        }
        self.stdlib = frozenset(sys.stdlib_module_names)

    def fail(self, file: str, rule: str, message: str) -> None:
        self.findings.append(Finding(wheel=self.path.name, file=file, rule=rule, message=message))
