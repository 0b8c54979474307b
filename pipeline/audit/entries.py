"""The wheel's entries against the allowlist: each name is a plain relative
path inside site-packages, each entry a regular file (or folder), and each file
one the engine build makes: the extension module at the root, the files it
writes into <distribution>-<version>.dist-info/, or a library auditwheel grafted
into <distribution>.libs/ under a name the policy allows."""

from __future__ import annotations

import collections
import fnmatch
import re
import stat
import zipfile
import zlib

from pipeline.audit.elf import ELF_MAGIC, is_library
from pipeline.audit.policy import matches
from pipeline.audit.wheel import Wheel

# A library auditwheel grafted: its soname with 8 hex digits of its hash
# inserted before the .so (libgomp.so.1 -> libgomp-a34b3233.so.1).
GRAFTED_NAME = re.compile(r"(?P<stem>[^/]+)-[0-9a-f]{8}(?P<ext>\.so(?:\.[0-9A-Za-z_]+)*)")
# What a zip entry's read can raise on a damaged or hostile archive.
ZIP_READ_ERRORS = (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError, NotImplementedError, RuntimeError)
# Where a <distribution>.data/<scheme>/ entry installs (PEP 427).
DATA_SCHEMES = {
    "scripts": "the environment's scripts directory (bin/)",
    "headers": "the environment's include directory",
    "data": "the environment's prefix",
    "purelib": "site-packages beside the package, not inside it",
    "platlib": "site-packages beside the package, not inside it",
}


def _path_problem(name: str) -> str | None:
    """Why an entry's name is not a plain relative path inside the install
    directory, or None."""
    if "\\" in name:
        return "a backslash in the path (a Windows separator: where it lands depends on the installer)"
    if name.startswith("/"):
        return "an absolute path: it would install where it points, outside site-packages"
    if re.match(r"[A-Za-z]:", name):
        return "a drive letter: an absolute Windows path, outside site-packages"
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in name):
        return "a control character in the path"
    parts = name.removesuffix("/").split("/")
    if ".." in parts:
        return "a `..` component: the entry would install outside the package's install directory"
    if any(p in ("", ".") for p in parts):
        return "not a canonical path (an empty or `.` component)"
    if parts[0].endswith(".data"):
        scheme = parts[1] if len(parts) > 1 else ""
        where = DATA_SCHEMES.get(scheme, f"an unknown scheme {scheme!r}")
        return f"in a .data folder: it installs into {where}; the engine wheel has no .data folder"
    return None


def screen(wheel: Wheel, zf: zipfile.ZipFile) -> tuple[set[str], list[zipfile.ZipInfo]]:
    """The zip's names (files, not folders) and its regular, safe entries;
    every other entry gets its finding here and is read no further."""
    infos = zf.infolist()
    counts = collections.Counter(i.filename for i in infos)
    present = {i.filename for i in infos if not i.filename.endswith("/")}
    regular, reported = [], set()
    for info in infos:
        name = info.filename
        if counts[name] > 1:
            if name not in reported:
                reported.add(name)
                wheel.fail(
                    name,
                    "duplicate",
                    f"the zip holds {counts[name]} entries of this "
                    f"name: an installer writes each in turn, the last wins, and the "
                    f"audit could not say which it checked",
                )
            continue
        problem = _path_problem(name)
        if problem:
            wheel.fail(name, "path", problem)
            continue
        # The file type in the Unix mode bits; 0 where the writer left it
        # unsaid (zipfile's writestr), which installers take as a file.
        mode = info.external_attr >> 16
        is_dir = name.endswith("/")
        if stat.S_IFMT(mode) not in (0, stat.S_IFDIR if is_dir else stat.S_IFREG):
            kind = "a symbolic link" if stat.S_ISLNK(mode) else f"not a regular file (mode {mode:o})"
            wheel.fail(name, "special-file", f"{kind} (zip external attributes): a wheel holds regular files only")
            continue
        if is_dir:
            _folder(wheel, name)
        else:
            regular.append(info)
    return present, regular


def read(wheel: Wheel, zf: zipfile.ZipFile, regular: list[zipfile.ZipInfo]) -> dict[str, bytes]:
    files = {}
    for info in regular:
        try:
            files[info.filename] = zf.read(info)
        except ZIP_READ_ERRORS as e:
            wheel.fail(info.filename, "format", f"does not read back from the zip ({e})")
    return files


def _folder(wheel: Wheel, name: str) -> None:
    """A folder entry: only inside a folder the wheel may hold."""
    top = name.split("/", 1)[0]
    if top in (wheel.dist_info, wheel.libs):
        return
    if top.split(".", 1)[0] in wheel.stdlib or matches(top, wheel.policy.startup):
        wheel.fail(
            name,
            "shadows",
            f"a package {top!r}: the interpreter imports a module of "
            f"this name at start-up or from the standard library",
        )
    else:
        wheel.fail(name, "not-ours", "a folder the engine build does not make")


def classify(wheel: Wheel, name: str, data: bytes) -> str | None:
    """The allowlist, for one regular file: 'module', 'grafted' or
    'dist-info' for what the wheel may hold; None (with a finding) else."""
    parts = name.split("/")
    top = parts[0]
    if top == wheel.dist_info:
        if matches(name, wheel.policy.forbidden):
            wheel.fail(
                name,
                "no-python",
                "Python source or bytecode is never shipped (packaging/payload-policy.toml: forbidden)",
            )
        elif data[:4] == ELF_MAGIC:
            wheel.fail(name, "foreign-library", "an ELF file among the wheel's metadata")
        elif any(fnmatch.fnmatchcase("/".join(parts[1:]), p) for p in wheel.policy.dist_info):
            return "dist-info"
        else:
            wheel.fail(
                name,
                "not-ours",
                f"not a file the build writes into {wheel.dist_info}/ (packaging/payload-policy.toml: dist_info)",
            )
        return None
    if top == wheel.libs:
        return _grafted(wheel, name, parts, data)
    module = top if len(parts) > 1 else top.split(".", 1)[0]
    if len(parts) == 1 and top.endswith(".pth"):
        wheel.fail(
            name,
            "shadows",
            "a .pth file at site-packages' root: site runs its import lines at every interpreter start-up",
        )
    elif module in wheel.stdlib or matches(module, wheel.policy.startup):
        what = "a package" if len(parts) > 1 else "a module"
        wheel.fail(
            name,
            "shadows",
            f"{what} named {module!r}: the interpreter imports "
            f"that name at start-up or from the standard library, and site-packages "
            f"would give it ours (packaging/payload-policy.toml: startup, "
            f"sys.stdlib_module_names)",
        )
    elif matches(name, wheel.policy.forbidden):
        wheel.fail(
            name, "no-python", "Python source or bytecode is never shipped (packaging/payload-policy.toml: forbidden)"
        )
    elif len(parts) == 1 and any(top in names for names in wheel.modules.values()):
        return "module"
    elif is_library(name, data):
        expected = sorted(n for names in wheel.modules.values() for n in names)
        wheel.fail(
            name,
            "foreign-library",
            f"a shared library that is not ours: the wheel "
            f"holds our extension module ({', '.join(expected)}) and libraries "
            f"auditwheel grafted into {wheel.libs}/, nothing else",
        )
    else:
        wheel.fail(
            name,
            "not-ours",
            f"not something the engine build makes: the wheel "
            f"holds {'/'.join(sorted(wheel.policy.modules))}, {wheel.dist_info}/ and "
            f"{wheel.libs}/ only",
        )
    return None


def _grafted(wheel: Wheel, name: str, parts: list[str], data: bytes) -> str | None:
    """A file in <distribution>.libs/: a library auditwheel grafted, whose
    soname the policy names. That a module needs it is checked once every
    ELF file is read (linking)."""
    base = parts[-1]
    match = GRAFTED_NAME.fullmatch(base)
    if matches(name, wheel.policy.forbidden):
        wheel.fail(
            name, "no-python", "Python source or bytecode is never shipped (packaging/payload-policy.toml: forbidden)"
        )
    elif len(parts) == 2 and match and matches(match["stem"] + match["ext"], wheel.policy.grafted):
        return "grafted"
    elif is_library(name, data):
        why = (
            "not named as auditwheel names a grafted library (libX-<8 hex>.so...) directly in the folder"
            if len(parts) != 2 or not match
            else f"{match['stem'] + match['ext']} is not a library the policy lets auditwheel graft"
        )
        wheel.fail(
            name, "foreign-library", f"{why} (packaging/payload-policy.toml: grafted = {list(wheel.policy.grafted)})"
        )
    else:
        wheel.fail(name, "not-ours", f"{wheel.libs}/ holds grafted libraries only")
    return None


def required(wheel: Wheel, present: set[str]) -> None:
    """What every wheel of ours holds: its metadata, its license and its module."""
    folders = sorted({n.split("/", 1)[0] for n in present if "/" in n})
    for part in ("METADATA", "WHEEL", "RECORD", "licenses/LICENSE"):
        name = f"{wheel.dist_info}/{part}"
        if name not in present:
            wheel.fail(name, "missing", f"the wheel has no {part} (its folders: {', '.join(folders) or 'none'})")
    for module, names in sorted(wheel.modules.items()):
        if not names & present:
            wheel.fail(
                " or ".join(sorted(names)),
                "missing",
                f"the wheel has no extension module {module} for {wheel.target.platform_tag} (engine/CMakeLists.txt)",
            )
