"""The libraries we ship, read as the dynamic loader reads them: each a whole
ELF shared object for the target's machine, whose NEEDED libraries are in the
wheel, the system's or the target's torch's, whose RPATH/RUNPATH stays in the
wheel or torch's libraries, and whose versioned symbols are no newer than the
platform tag allows."""

from __future__ import annotations

import dataclasses
import io
import posixpath
from pathlib import PurePosixPath
from typing import TYPE_CHECKING

from pipeline.audit.policy import matches, version_number
from pipeline.audit.wheel import MACHINES, Wheel

if TYPE_CHECKING:
    from elftools.elf.elffile import ELFFile

ELF_MAGIC = b"\x7fELF"
# RPATH entries a module may carry: its own grafted libraries, or torch's
# libraries beside it in site-packages.
ALLOWED_RPATH_DIRS = ("torch/lib",)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Elf:
    """What the linking rules read of one ELF file (from its PT_DYNAMIC, as
    the dynamic loader does)."""

    needed: tuple[str, ...]
    paths: tuple[str, ...]
    # The symbol versions it needs (GNU version needs), as (library, version):
    # ("libstdc++.so.6", "GLIBCXX_3.4.30").
    versions: tuple[tuple[str, str], ...] = ()


def is_library(name: str, data: bytes) -> bool:
    base = posixpath.basename(name)
    return data[:4] == ELF_MAGIC or base.endswith(".so") or ".so." in base


def read_elf(wheel: Wheel, name: str, data: bytes) -> Elf | None:
    """The ELF file a module or grafted library must be, or None with a
    finding naming what is wrong with it."""
    if data[:4] != ELF_MAGIC:
        wheel.fail(name, "elf", "not an ELF file: a library we ship is a shared object")
        return None
    # pyelftools is the audit's own: `python -m pipeline verify` runs on an
    # operator's host with only cryptography, jsonschema and packaging, and
    # the command line imports every stage.
    from elftools.elf.elffile import ELFFile

    try:
        return _shared_object(wheel, name, data, ELFFile(io.BytesIO(data)))
    # pyelftools reports a damaged file with many exception types (its
    # ELFError and ELFParseError, struct.error, its construct's errors,
    # ValueError, IndexError, ...): any of them is this file's finding.
    except Exception as e:
        wheel.fail(name, "elf", f"not a readable ELF shared object ({type(e).__name__}: {e})")
        return None


def _shared_object(wheel: Wheel, name: str, data: bytes, elf: ELFFile) -> Elf | None:
    machine = MACHINES.get(wheel.arch or "")
    problems = []
    want_class = 32 if wheel.arch == "i686" else 64
    if elf.elfclass != want_class:
        problems.append(f"ELF class {elf.elfclass} ({wheel.target.platform_tag} needs {want_class})")
    if elf["e_type"] != "ET_DYN":
        problems.append(f"type {elf['e_type']} (a shared object is ET_DYN)")
    if elf["e_machine"] != machine:
        problems.append(f"machine {elf['e_machine']} ({wheel.target.platform_tag} needs {machine})")
    # Truncated: a segment or section that ends past the end of the file.
    ends = [(f"segment {i}", s["p_offset"] + s["p_filesz"]) for i, s in enumerate(elf.iter_segments())]
    ends += [
        (f"section {s.name or i}", s["sh_offset"] + s["sh_size"])
        for i, s in enumerate(elf.iter_sections())
        if s["sh_type"] != "SHT_NOBITS"
    ]
    ends.append(("section header table", elf["e_shoff"] + elf["e_shnum"] * elf["e_shentsize"]))
    past = [(what, end) for what, end in ends if end > len(data)]
    if past:
        problems.append(f"truncated: {past[0][0]} ends at byte {past[0][1]}, the file has {len(data)}")
    dynamic = [s for s in elf.iter_segments() if s["p_type"] == "PT_DYNAMIC"]
    if len(dynamic) != 1:
        problems.append(f"{len(dynamic)} dynamic segments (a shared object has one)")
    if problems:
        wheel.fail(name, "elf", "not a shared object for this target: " + "; ".join(problems))
        return None
    needed, paths = [], []
    for tag in dynamic[0].iter_tags():
        if tag.entry.d_tag == "DT_NEEDED":
            needed.append(tag.needed)
        elif tag.entry.d_tag == "DT_RPATH":
            paths += tag.rpath.split(":")
        elif tag.entry.d_tag == "DT_RUNPATH":
            paths += tag.runpath.split(":")
    return Elf(needed=tuple(needed), paths=tuple(paths), versions=version_needs(elf))


def version_needs(elf: ELFFile) -> tuple[tuple[str, str], ...]:
    """(library, version) for every symbol version the file's GNU version
    needs section asks of a library."""
    out = []
    for section in elf.iter_sections():
        if section["sh_type"] == "SHT_GNU_verneed":
            for verneed, auxiliaries in section.iter_versions():
                out += [(verneed.name, aux.name) for aux in auxiliaries]
    return tuple(out)


def too_new(versions: tuple[tuple[str, str], ...], ceilings: dict[str, tuple[int, ...]]) -> list[str]:
    """The versions past their family's newest allowed one, each as
    "GLIBCXX_3.4.30 of libstdc++.so.6 (newest allowed: 3.4.29)"."""
    out = []
    for library, version in versions:
        family, _, number = version.rpartition("_")
        newest = ceilings.get(family)
        got = version_number(number)
        if newest is not None and got is not None and got > newest:
            out.append(f"{version} of {library} (newest allowed: {'.'.join(map(str, newest))})")
    return sorted(set(out))


def symbol_versions(wheel: Wheel, libraries: dict[str, Elf]) -> None:
    """No library needs a symbol version newer than the platform tag allows."""
    tag = wheel.target.platform_tag
    ceilings = wheel.policy.symbol_versions.get(tag)
    if ceilings is None:
        wheel.fail(
            wheel.path.name,
            "symbol-version",
            f"payload-policy.toml has no "
            f"[symbol_versions.{tag}] for target {wheel.target.name}'s platform tag: add "
            f"the newest versions its manylinux policy allows",
        )
        return
    for name, elf in sorted(libraries.items()):
        newer = too_new(elf.versions, ceilings)
        if newer:
            wheel.fail(
                name,
                "symbol-version",
                f"needs {', '.join(newer)}, past what {tag} allows: "
                f"hosts of that tag may lack it. Build with the target's builder image, "
                f"or avoid the call that needs it",
            )


def linking(wheel: Wheel, libraries: dict[str, Elf], grafted: list[str], present: set[str]) -> None:
    """NEEDED and RPATH of every library we ship; a grafted library only
    where one of them needs it by its grafted name."""
    in_wheel = {posixpath.basename(n) for n in libraries}
    for name, elf in sorted(libraries.items()):
        _needed(wheel, name, elf, in_wheel)
        _rpath(wheel, name, elf, present)
    needed = {lib for elf in libraries.values() for lib in elf.needed}
    for name in grafted:
        if posixpath.basename(name) not in needed:
            wheel.fail(
                name,
                "foreign-library",
                "no library in the wheel needs it: auditwheel "
                "grafts a library only for a module that needs it, under this name",
            )


def _needed(wheel: Wheel, name: str, elf: Elf, in_wheel: set[str]) -> None:
    for lib in elf.needed:
        if lib in in_wheel or matches(lib, wheel.policy.system_libraries):
            continue
        if matches(lib, wheel.target.provided_libraries):
            continue
        wheel.fail(
            name,
            "needed",
            f"needs {lib}, which is neither in the wheel, a system "
            f"library, nor provided by target {wheel.target.name}'s torch "
            f"(release.toml provided_libraries)",
        )


def _rpath(wheel: Wheel, name: str, elf: Elf, names: set[str]) -> None:
    here = PurePosixPath(name).parent
    for p in elf.paths:
        if not p:
            continue
        if not p.startswith("$ORIGIN"):
            wheel.fail(
                name,
                "rpath",
                f"RPATH/RUNPATH entry {p!r} points outside the wheel (only $ORIGIN-relative entries are allowed)",
            )
            continue
        resolved = posixpath.normpath(posixpath.join(str(here), p.replace("$ORIGIN", ".", 1)))
        inside = any(n.startswith(resolved.rstrip("/") + "/") for n in names)
        if not inside and resolved not in ALLOWED_RPATH_DIRS:
            wheel.fail(
                name,
                "rpath",
                f"RPATH/RUNPATH entry {p!r} resolves to {resolved!r}, "
                f"neither in the wheel nor torch's libraries ({', '.join(ALLOWED_RPATH_DIRS)})",
            )
