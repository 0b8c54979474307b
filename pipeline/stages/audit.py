"""Stage: audit. The payload audit of a target's wheels; fails closed.

A wheel's contents are an allowlist (packaging/payload-policy.toml): the
extension module the engine build installs at the wheel's root, the files the
build writes into <distribution>-<version>.dist-info/, and libraries
auditwheel grafted into <distribution>.libs/ where the policy names the
library and a module of the wheel needs it by the name auditwheel gave it.
Every other entry is refused. Each finding names the wheel, the entry and the
rule it breaks:
- duplicate: a name the zip holds twice (the installer writes both, the last
  wins, and the audit could not say which it read);
- path: an entry whose path leaves the install directory or is not a plain
  relative POSIX path (absolute, `..`, backslash, drive letter, empty or `.`
  component, control character), or lies in a <distribution>.data/ folder
  (it installs into scripts, headers, data or beside the package);
- special-file: a symlink or other non-regular entry (zip external_attr);
- shadows: a top-level module, package or .pth file that Python imports at
  start-up or that shadows the standard library (sitecustomize, site,
  encodings, json, ...: sys.stdlib_module_names and the policy's startup);
- no-python: Python source or bytecode (the product is compiled);
- foreign-library: a shared library (by name or by ELF content) that is not
  our extension module nor a grafted library the policy names and a module
  needs (a copy of libc.so.6 at the root, a libfoo.so beside the module);
- not-ours: any other entry outside the allowlist (another package, another
  distribution's metadata, a file the build does not write);
- missing: METADATA, WHEEL, RECORD or the extension module is absent;
- format: not a readable zip, or an entry that does not read back;
- elf: a library we ship is not a whole ELF shared object for the target's
  machine (truncated, not ELF, another class or machine, unparseable);
- tags: the wheel's tags are the configured Python and platform tags;
- metadata: METADATA and WHEEL parse cleanly and name our distribution and
  the file name's version; torch-pin: METADATA pins torch== the target's torch;
- entry-point: entry_points.txt declares exactly the vllm.general_plugins
  entry point (a console script would install outside site-packages);
- sbom: auditwheel's SBOM, where present, is auditwheel's CycloneDX JSON;
- record: RECORD lists every file with a valid hash and size, once;
- linking (needed, rpath): every NEEDED library is in the wheel, a system
  library, or provided by the target's torch; no RPATH/RUNPATH leads outside
  the wheel or torch;
- size: at most the target's max_wheel_bytes;
- loading: in a container of the target's runtime base, `import torch` then
  `import activekv` (an ABI mismatch shows here without any accelerator).
Bad input gives findings, never a traceback: the audit raises AuditError (with
every finding) or ConfigError (an unreadable policy). Writes
build/release/<target>/audit.json, the record the manifest uses.
"""

from __future__ import annotations

import collections
import configparser
import csv
import dataclasses
import fnmatch
import io
import json
import posixpath
import re
import stat
import sys
import zipfile
import zlib
from email.parser import Parser
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from pipeline.artifacts import refuse_links
from pipeline.audit.policy import Policy, load_policy, matches
from pipeline.config import Target
from pipeline.container import Container, ContainerRuntime
from pipeline.digest import record_hash, sha256_of
from pipeline.errors import AuditError
from pipeline.images import runtime_base_image
from pipeline.paths import target_dir
from pipeline.run import Run

if TYPE_CHECKING:
    from elftools.elf.elffile import ELFFile

ENTRY_POINT_GROUP = "vllm.general_plugins"
ENTRY_POINT = "activekv = activekv:register"
# RPATH entries a module may carry: its own grafted libraries, or torch's
# libraries beside it in site-packages.
ALLOWED_RPATH_DIRS = ("torch/lib",)
ELF_MAGIC = b"\x7fELF"
# The platform tag's architecture -> the ELF machine (pyelftools' name) of
# every library a wheel of that platform may carry.
MACHINES = {"x86_64": "EM_X86_64", "aarch64": "EM_AARCH64", "ppc64le": "EM_PPC64",
            "s390x": "EM_S390", "i686": "EM_386"}
# A library auditwheel grafted: its soname with 8 hex digits of its hash
# inserted before the .so (libgomp.so.1 -> libgomp-a34b3233.so.1).
GRAFTED_NAME = re.compile(r"(?P<stem>[^/]+)-[0-9a-f]{8}(?P<ext>\.so(?:\.[0-9A-Za-z_]+)*)")
# What a zip entry's read can raise on a damaged or hostile archive.
ZIP_READ_ERRORS = (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError,
                   NotImplementedError, RuntimeError)
# Where a <distribution>.data/<scheme>/ entry installs (PEP 427).
DATA_SCHEMES = {"scripts": "the environment's scripts directory (bin/)",
                "headers": "the environment's include directory",
                "data": "the environment's prefix",
                "purelib": "site-packages beside the package, not inside it",
                "platlib": "site-packages beside the package, not inside it"}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Finding:
    wheel: str
    file: str
    rule: str
    message: str

    def __str__(self) -> str:
        return f"{self.wheel}: {self.file}: [{self.rule}] {self.message}"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Elf:
    """What the linking rules read of one ELF file (from its PT_DYNAMIC, as
    the dynamic loader does)."""

    needed: tuple[str, ...]
    paths: tuple[str, ...]


def _escaped(distribution: str) -> str:
    """The distribution as wheel file and folder names spell it (PEP 427)."""
    return re.sub(r"[-_.]+", "_", distribution).lower()


def _architecture(platform_tag: str) -> str | None:
    return next((a for a in MACHINES if platform_tag.endswith("_" + a)), None)


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
        return (f"in a .data folder: it installs into {where}; the engine wheel has no "
                f".data folder")
    return None


def _is_library(name: str, data: bytes) -> bool:
    base = posixpath.basename(name)
    return data[:4] == ELF_MAGIC or base.endswith(".so") or ".so." in base


class WheelAudit:
    """The static rules, on one wheel file."""

    def __init__(self, wheel: Path, target: Target, policy: Policy) -> None:
        self.wheel = wheel
        self.target = target
        self.policy = policy
        self.findings: list[Finding] = []
        stem = wheel.name.removesuffix(".whl").split("-")
        self.name_parts = stem if len(stem) in (5, 6) else None
        escaped = _escaped(policy.distribution)
        version = self.name_parts[1] if self.name_parts else "?"
        # What the engine build makes for this wheel (engine/pyproject.toml,
        # engine/CMakeLists.txt): the module(s) at the root, one dist-info
        # folder, and auditwheel's folder of grafted libraries.
        self.dist_info = f"{escaped}-{version}.dist-info"
        self.libs = f"{escaped}.libs"
        self.arch = _architecture(target.platform_tag)
        py = self.name_parts[-3] if self.name_parts else ""
        tags = (py,) if py in target.cpython_tags else target.cpython_tags
        libc = "musl" if target.platform_tag.startswith("musllinux") else "gnu"
        self.modules = {m: {f"{m}.cpython-{t.removeprefix('cp')}-{self.arch}-linux-{libc}.so"
                            for t in tags} for m in policy.modules}
        self.stdlib = frozenset(sys.stdlib_module_names)

    def fail(self, file: str, rule: str, message: str) -> None:
        self.findings.append(Finding(wheel=self.wheel.name, file=file, rule=rule, message=message))

    def run(self) -> list[Finding]:
        try:
            size = self.wheel.stat().st_size
            zf = zipfile.ZipFile(self.wheel)
        except (*ZIP_READ_ERRORS, zipfile.LargeZipFile) as e:
            self.fail(self.wheel.name, "format", f"not a readable zip archive ({e})")
            return self.findings
        if size > self.target.max_wheel_bytes:
            self.fail(self.wheel.name, "size", f"{size} bytes exceeds max_wheel_bytes="
                      f"{self.target.max_wheel_bytes} of target {self.target.name} (release.toml)")
        with zf:
            present, regular = self.entries(zf)
            files = self.read(zf, regular)
            kinds = {name: self.classify(name, data) for name, data in files.items()}
            self.required(present)
            self.tags(files.get(f"{self.dist_info}/WHEEL"))
            self.metadata(files)
            self.sbom(files.get(f"{self.dist_info}/sboms/auditwheel.cdx.json"))
            if f"{self.dist_info}/RECORD" in files:
                self.record(files, present)
            libraries = {n: self.elf(n, files[n]) for n, k in kinds.items() if k in ("module", "grafted")}
            self.linking({n: e for n, e in libraries.items() if e is not None},
                         [n for n, k in kinds.items() if k == "grafted"], present)
        return self.findings

    def entries(self, zf: zipfile.ZipFile) -> tuple[set[str], list[zipfile.ZipInfo]]:
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
                    self.fail(name, "duplicate", f"the zip holds {counts[name]} entries of this "
                              f"name: an installer writes each in turn, the last wins, and the "
                              f"audit could not say which it checked")
                continue
            problem = _path_problem(name)
            if problem:
                self.fail(name, "path", problem)
                continue
            # The file type in the Unix mode bits; 0 where the writer left it
            # unsaid (zipfile's writestr), which installers take as a file.
            mode = info.external_attr >> 16
            is_dir = name.endswith("/")
            if stat.S_IFMT(mode) not in (0, stat.S_IFDIR if is_dir else stat.S_IFREG):
                kind = "a symbolic link" if stat.S_ISLNK(mode) else f"not a regular file (mode {mode:o})"
                self.fail(name, "special-file", f"{kind} (zip external attributes): a wheel "
                          f"holds regular files only")
                continue
            if is_dir:
                self.folder(name)
            else:
                regular.append(info)
        return present, regular

    def read(self, zf: zipfile.ZipFile, regular: list[zipfile.ZipInfo]) -> dict[str, bytes]:
        files = {}
        for info in regular:
            try:
                files[info.filename] = zf.read(info)
            except ZIP_READ_ERRORS as e:
                self.fail(info.filename, "format", f"does not read back from the zip ({e})")
        return files

    def folder(self, name: str) -> None:
        """A folder entry: only inside a folder the wheel may hold."""
        top = name.split("/", 1)[0]
        if top in (self.dist_info, self.libs):
            return
        if top.split(".", 1)[0] in self.stdlib or matches(top, self.policy.startup):
            self.fail(name, "shadows", f"a package {top!r}: the interpreter imports a module of "
                      f"this name at start-up or from the standard library")
        else:
            self.fail(name, "not-ours", "a folder the engine build does not make")

    def classify(self, name: str, data: bytes) -> str | None:
        """The allowlist, for one regular file: 'module', 'grafted' or
        'dist-info' for what the wheel may hold; None (with a finding) else."""
        parts = name.split("/")
        top = parts[0]
        if top == self.dist_info:
            if matches(name, self.policy.forbidden):
                self.fail(name, "no-python", "Python source or bytecode is never shipped "
                          "(packaging/payload-policy.toml: forbidden)")
            elif data[:4] == ELF_MAGIC:
                self.fail(name, "foreign-library", "an ELF file among the wheel's metadata")
            elif any(fnmatch.fnmatchcase("/".join(parts[1:]), p) for p in self.policy.dist_info):
                return "dist-info"
            else:
                self.fail(name, "not-ours", f"not a file the build writes into {self.dist_info}/ "
                          f"(packaging/payload-policy.toml: dist_info)")
            return None
        if top == self.libs:
            return self.grafted(name, parts, data)
        module = top if len(parts) > 1 else top.split(".", 1)[0]
        if len(parts) == 1 and top.endswith(".pth"):
            self.fail(name, "shadows", "a .pth file at site-packages' root: site runs its "
                      "import lines at every interpreter start-up")
        elif module in self.stdlib or matches(module, self.policy.startup):
            what = "a package" if len(parts) > 1 else "a module"
            self.fail(name, "shadows", f"{what} named {module!r}: the interpreter imports "
                      f"that name at start-up or from the standard library, and site-packages "
                      f"would give it ours (packaging/payload-policy.toml: startup, "
                      f"sys.stdlib_module_names)")
        elif matches(name, self.policy.forbidden):
            self.fail(name, "no-python", "Python source or bytecode is never shipped "
                      "(packaging/payload-policy.toml: forbidden)")
        elif len(parts) == 1 and any(top in names for names in self.modules.values()):
            return "module"
        elif _is_library(name, data):
            expected = sorted(n for names in self.modules.values() for n in names)
            self.fail(name, "foreign-library", f"a shared library that is not ours: the wheel "
                      f"holds our extension module ({', '.join(expected)}) and libraries "
                      f"auditwheel grafted into {self.libs}/, nothing else")
        else:
            self.fail(name, "not-ours", f"not something the engine build makes: the wheel "
                      f"holds {'/'.join(sorted(self.policy.modules))}, {self.dist_info}/ and "
                      f"{self.libs}/ only")
        return None

    def grafted(self, name: str, parts: list[str], data: bytes) -> str | None:
        """A file in <distribution>.libs/: a library auditwheel grafted, whose
        soname the policy names. That a module needs it is checked once every
        ELF file is read (linking)."""
        base = parts[-1]
        match = GRAFTED_NAME.fullmatch(base)
        if matches(name, self.policy.forbidden):
            self.fail(name, "no-python", "Python source or bytecode is never shipped "
                      "(packaging/payload-policy.toml: forbidden)")
        elif len(parts) == 2 and match and matches(match["stem"] + match["ext"], self.policy.grafted):
            return "grafted"
        elif _is_library(name, data):
            why = ("not named as auditwheel names a grafted library (libX-<8 hex>.so...) "
                   "directly in the folder" if len(parts) != 2 or not match else
                   f"{match['stem'] + match['ext']} is not a library the policy lets auditwheel "
                   f"graft")
            self.fail(name, "foreign-library", f"{why} (packaging/payload-policy.toml: grafted "
                      f"= {list(self.policy.grafted)})")
        else:
            self.fail(name, "not-ours", f"{self.libs}/ holds grafted libraries only")
        return None

    def required(self, present: set[str]) -> None:
        """What every wheel of ours holds: its metadata and its module."""
        folders = sorted({n.split("/", 1)[0] for n in present if "/" in n})
        for part in ("METADATA", "WHEEL", "RECORD"):
            name = f"{self.dist_info}/{part}"
            if name not in present:
                self.fail(name, "missing", f"the wheel has no {part} (its folders: "
                          f"{', '.join(folders) or 'none'})")
        for module, names in sorted(self.modules.items()):
            if not names & present:
                self.fail(" or ".join(sorted(names)), "missing", f"the wheel has no extension "
                          f"module {module} for {self.target.platform_tag} (engine/CMakeLists.txt)")

    @staticmethod
    def _headers(data: bytes) -> tuple[object | None, str]:
        """An email-header file (METADATA, WHEEL), or None and why not."""
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            return None, f"not UTF-8 ({e})"
        message = Parser().parsestr(text)
        if message.defects:
            return None, f"malformed headers ({'; '.join(type(d).__name__ for d in message.defects)})"
        return message, ""

    def tags(self, wheel_data: bytes | None) -> None:
        if self.name_parts is None:
            self.fail(self.wheel.name, "tags", "file name is not name-version-python-abi-platform.whl")
            return
        py, abi, plat = self.name_parts[-3:]
        expected_py = set(self.target.cpython_tags)
        if py not in expected_py or abi != py:
            self.fail(self.wheel.name, "tags", f"python/abi tag {py}-{abi}; expected one of "
                      f"{sorted(f'{t}-{t}' for t in expected_py)} (release.toml python)")
        if self.arch is None:
            self.fail(self.wheel.name, "tags", f"the audit knows no ELF machine for platform tag "
                      f"{self.target.platform_tag} (pipeline/audit.py MACHINES)")
        if plat != self.target.platform_tag:
            self.fail(self.wheel.name, "tags", f"platform tag {plat}; expected "
                      f"{self.target.platform_tag} (release.toml [targets.{self.target.name}] platform_tag)")
        if wheel_data is None:
            return
        name = f"{self.dist_info}/WHEEL"
        wheel_file, why = self._headers(wheel_data)
        if wheel_file is None:
            self.fail(name, "metadata", why)
            return
        if (wheel_file.get("Wheel-Version") or "").split(".")[0] != "1":
            self.fail(name, "metadata", f"Wheel-Version {wheel_file.get('Wheel-Version')!r}; "
                      f"expected 1.x")
        declared = set(wheel_file.get_all("Tag") or [])
        # A file name may compress tag sets with dots (PEP 425).
        from_name = {f"{x}-{y}-{z}" for x in py.split(".") for y in abi.split(".")
                     for z in plat.split(".")}
        if declared != from_name:
            self.fail(name, "tags", f"Tag lines {sorted(declared)} do not match "
                      f"the file name's {py}-{abi}-{plat}")
        if (wheel_file.get("Root-Is-Purelib") or "").lower() != "false":
            self.fail(name, "tags", "Root-Is-Purelib must be false for a binary wheel")

    def metadata(self, files: dict[str, bytes]) -> None:
        name = f"{self.dist_info}/METADATA"
        if self.name_parts and _escaped(self.name_parts[0]) != _escaped(self.policy.distribution):
            self.fail(self.wheel.name, "metadata", f"distribution {self.name_parts[0]!r} in the "
                      f"file name; expected {self.policy.distribution!r} "
                      f"(packaging/payload-policy.toml: distribution)")
        if name in files:
            meta, why = self._headers(files[name])
            if meta is None:
                self.fail(name, "metadata", why)
            else:
                self.metadata_fields(name, meta)
        self.entry_points(files)

    def metadata_fields(self, name: str, meta) -> None:
        found = {k: meta.get(k) for k in ("Metadata-Version", "Name", "Version")}
        if None in found.values():
            self.fail(name, "metadata", f"lacks {[k for k, v in found.items() if v is None]}")
        if found["Name"] is not None and _escaped(found["Name"]) != _escaped(self.policy.distribution):
            self.fail(name, "metadata", f"Name {found['Name']!r}; expected "
                      f"{self.policy.distribution!r} (packaging/payload-policy.toml: distribution)")
        if found["Version"] is not None and self.name_parts and found["Version"] != self.name_parts[1]:
            self.fail(name, "metadata", f"Version {found['Version']!r}; the file name says "
                      f"{self.name_parts[1]!r}")
        requires = [r.replace(" ", "") for r in meta.get_all("Requires-Dist") or []]
        torch_pins = [r for r in requires if r.startswith("torch")]
        want = f"torch=={self.target.torch}"
        if torch_pins != [want]:
            self.fail(name, "torch-pin", f"Requires-Dist for torch is {torch_pins or 'missing'}; "
                      f"expected exactly {want!r} (the torch it was built against)")

    def entry_points(self, files: dict[str, bytes]) -> None:
        """Exactly our plugin entry point: any other group (console_scripts,
        gui_scripts) installs or runs something that is not the engine."""
        name = f"{self.dist_info}/entry_points.txt"
        group, key, value = ENTRY_POINT_GROUP, *(s.strip() for s in ENTRY_POINT.split("="))
        parser = configparser.ConfigParser(delimiters=("=",), interpolation=None, strict=True)
        parser.optionxform = str  # entry point names are case-sensitive
        try:
            parser.read_string(files.get(name, b"").decode("utf-8"), source=name)
        except (UnicodeDecodeError, configparser.Error) as e:
            self.fail(name, "entry-point", f"unreadable ({str(e).splitlines()[0]})")
            return
        declared = {(g, k, v.replace(" ", "")) for g in parser.sections() for k, v in parser[g].items()}
        if (group, key, value) not in declared:
            self.fail(name, "entry-point", f"no [{group}] entry {ENTRY_POINT!r}: "
                      f"vLLM would not load the plugin")
        for g, k, v in sorted(declared - {(group, key, value)}):
            self.fail(name, "entry-point", f"[{g}] {k} = {v}: not an entry point the engine "
                      f"declares (engine/pyproject.toml); only [{group}] {ENTRY_POINT}")

    def sbom(self, data: bytes | None) -> None:
        if data is None:
            return
        name = f"{self.dist_info}/sboms/auditwheel.cdx.json"
        try:
            doc = json.loads(data)
            tools = doc["metadata"]["tools"]
            tools = tools["components"] if isinstance(tools, dict) else tools
            ok = doc["bomFormat"] == "CycloneDX" and any(t.get("name") == "auditwheel" for t in tools)
        except (ValueError, KeyError, TypeError, AttributeError):
            ok = False
        if not ok:
            self.fail(name, "sbom", "not auditwheel's CycloneDX SBOM (bomFormat CycloneDX, "
                      "metadata.tools naming auditwheel)")

    def record(self, files: dict[str, bytes], present: set[str]) -> None:
        record_name = f"{self.dist_info}/RECORD"
        try:
            rows = list(csv.reader(io.StringIO(files[record_name].decode("utf-8"))))
        except (UnicodeDecodeError, csv.Error) as e:
            self.fail(record_name, "record", f"unreadable ({e})")
            return
        listed: dict[str, list[str]] = {}
        for row in rows:
            if len(row) != 3:
                self.fail(record_name, "record", f"malformed row {row!r}")
            elif row[0] in listed:
                self.fail(row[0], "record", "listed twice in RECORD")
            else:
                listed[row[0]] = row
        for name in sorted(present - {record_name}):
            if name not in listed:
                self.fail(name, "record", "file is not listed in RECORD")
            elif name in files:  # an entry refused above was not read
                _, digest, size = listed[name]
                actual = record_hash(files[name])
                if digest != actual or size != str(len(files[name])):
                    self.fail(name, "record", f"RECORD says {digest},{size}; the file is "
                              f"{actual},{len(files[name])}")
        for name in sorted(set(listed) - present):
            self.fail(name, "record", "listed in RECORD but not in the wheel")

    def elf(self, name: str, data: bytes) -> Elf | None:
        """The ELF file a module or grafted library must be, or None with a
        finding naming what is wrong with it."""
        if data[:4] != ELF_MAGIC:
            self.fail(name, "elf", "not an ELF file: a library we ship is a shared object")
            return None
        # pyelftools is the audit's own: `python -m pipeline verify` runs on an
        # operator's host with only cryptography, jsonschema and packaging, and
        # the command line imports every stage.
        from elftools.elf.elffile import ELFFile

        try:
            return self._read_elf(name, data, ELFFile(io.BytesIO(data)))
        # pyelftools reports a damaged file with many exception types (its
        # ELFError and ELFParseError, struct.error, its construct's errors,
        # ValueError, IndexError, ...): any of them is this file's finding.
        except Exception as e:
            self.fail(name, "elf", f"not a readable ELF shared object ({type(e).__name__}: {e})")
            return None

    def _read_elf(self, name: str, data: bytes, elf: ELFFile) -> Elf | None:
        machine = MACHINES.get(self.arch or "")
        problems = []
        want_class = 32 if self.arch == "i686" else 64
        if elf.elfclass != want_class:
            problems.append(f"ELF class {elf.elfclass} ({self.target.platform_tag} needs {want_class})")
        if elf["e_type"] != "ET_DYN":
            problems.append(f"type {elf['e_type']} (a shared object is ET_DYN)")
        if elf["e_machine"] != machine:
            problems.append(f"machine {elf['e_machine']} ({self.target.platform_tag} needs {machine})")
        # Truncated: a segment or section that ends past the end of the file.
        ends = [(f"segment {i}", s["p_offset"] + s["p_filesz"]) for i, s in enumerate(elf.iter_segments())]
        ends += [(f"section {s.name or i}", s["sh_offset"] + s["sh_size"])
                 for i, s in enumerate(elf.iter_sections()) if s["sh_type"] != "SHT_NOBITS"]
        ends.append(("section header table", elf["e_shoff"] + elf["e_shnum"] * elf["e_shentsize"]))
        past = [(what, end) for what, end in ends if end > len(data)]
        if past:
            problems.append(f"truncated: {past[0][0]} ends at byte {past[0][1]}, the file "
                            f"has {len(data)}")
        dynamic = [s for s in elf.iter_segments() if s["p_type"] == "PT_DYNAMIC"]
        if len(dynamic) != 1:
            problems.append(f"{len(dynamic)} dynamic segments (a shared object has one)")
        if problems:
            self.fail(name, "elf", "not a shared object for this target: " + "; ".join(problems))
            return None
        needed, paths = [], []
        for tag in dynamic[0].iter_tags():
            if tag.entry.d_tag == "DT_NEEDED":
                needed.append(tag.needed)
            elif tag.entry.d_tag == "DT_RPATH":
                paths += tag.rpath.split(":")
            elif tag.entry.d_tag == "DT_RUNPATH":
                paths += tag.runpath.split(":")
        return Elf(needed=tuple(needed), paths=tuple(paths))

    def linking(self, libraries: dict[str, Elf], grafted: list[str], present: set[str]) -> None:
        """NEEDED and RPATH of every library we ship; a grafted library only
        where one of them needs it by its grafted name."""
        in_wheel = {posixpath.basename(n) for n in libraries}
        for name, elf in sorted(libraries.items()):
            self.needed(name, elf, in_wheel)
            self.rpath(name, elf, present)
        needed = {lib for elf in libraries.values() for lib in elf.needed}
        for name in grafted:
            if posixpath.basename(name) not in needed:
                self.fail(name, "foreign-library", "no library in the wheel needs it: auditwheel "
                          "grafts a library only for a module that needs it, under this name")

    def needed(self, name: str, elf: Elf, in_wheel: set[str]) -> None:
        for lib in elf.needed:
            if lib in in_wheel or matches(lib, self.policy.system_libraries):
                continue
            if matches(lib, self.target.provided_libraries):
                continue
            self.fail(name, "needed", f"needs {lib}, which is neither in the wheel, a system "
                      f"library, nor provided by target {self.target.name}'s torch "
                      f"(release.toml provided_libraries)")

    def rpath(self, name: str, elf: Elf, names: set[str]) -> None:
        here = PurePosixPath(name).parent
        for p in elf.paths:
            if not p:
                continue
            if not p.startswith("$ORIGIN"):
                self.fail(name, "rpath", f"RPATH/RUNPATH entry {p!r} points outside the wheel "
                          f"(only $ORIGIN-relative entries are allowed)")
                continue
            resolved = posixpath.normpath(posixpath.join(str(here), p.replace("$ORIGIN", ".", 1)))
            inside = any(n.startswith(resolved.rstrip("/") + "/") for n in names)
            if not inside and resolved not in ALLOWED_RPATH_DIRS:
                self.fail(name, "rpath", f"RPATH/RUNPATH entry {p!r} resolves to {resolved!r}, "
                          f"neither in the wheel nor torch's libraries ({', '.join(ALLOWED_RPATH_DIRS)})")


LOAD_CHECK = """
import importlib.metadata, torch, activekv
print("torch", torch.__version__, "activekv", importlib.metadata.version("activekv"), activekv.__file__)
"""


def load_check(runtime: ContainerRuntime, target: Target, wheels: list[Path]
               ) -> tuple[dict[str, str], list[Finding]]:
    """Install each wheel offline in a clean container of the target's runtime
    base (its torch must satisfy the wheel's torch pin) and import it after
    torch. Returns the image ({ref, id}) and the findings."""
    image, image_id = runtime_base_image(runtime, target)
    findings = []
    for wheel in wheels:
        with Container(runtime=runtime, image=image) as c:
            inside = PurePosixPath("/tmp/wheels") / wheel.name
            c.copy_into(wheel, inside)
            install = c.call(["python", "-m", "pip", "install", "--no-index", str(inside)],
                             capture=True, check=False)
            result = install if install.returncode != 0 else c.call(
                ["python", "-c", LOAD_CHECK], capture=True, check=False, cwd="/")
            print(result.stdout, end="", flush=True)
            if result.returncode != 0:
                findings.append(Finding(wheel=wheel.name, file=wheel.name, rule="loads",
                                        message=f"does not install and import in {image} "
                                                f"after torch: {result.stderr.strip()[-800:]}"))
    return {"ref": image, "id": image_id}, findings


def audit(runtime: ContainerRuntime | None, target: Target, wheels_dir: Path, report: Path) -> dict:
    """Audit every wheel in wheels_dir; write the report; raise AuditError on
    any finding. runtime=None skips the load check (static rules only)."""
    policy = load_policy()
    wheels = refuse_links(sorted(wheels_dir.glob("*.whl")), "wheel", AuditError)
    findings: list[Finding] = []
    if not wheels:
        findings.append(Finding(wheel="-", file=str(wheels_dir), rule="wheels",
                                message="no wheel to audit: run the build stage first"))
    for wheel in wheels:
        findings += WheelAudit(wheel, target, policy).run()
    runtime_image = None
    if runtime is not None and wheels and not findings:
        runtime_image, loaded = load_check(runtime, target, wheels)
        findings += loaded
    listed = []
    for w in wheels:
        try:
            listed.append({"file": w.name, "sha256": sha256_of(w), "size": w.stat().st_size})
        except OSError:  # its finding ("format") says so
            listed.append({"file": w.name, "sha256": None, "size": None})
    record = {
        "stage": "audit",
        "target": target.name,
        "passed": not findings,
        "load_checked": runtime_image is not None,
        "runtime_image": runtime_image,
        "wheels": listed,
        "findings": [dataclasses.asdict(f) for f in findings],
    }
    report.parent.mkdir(parents=True, exist_ok=True)
    report.write_text(json.dumps(record, indent=2) + "\n")
    if findings:
        raise AuditError(f"payload audit of target {target.name} failed ({len(findings)} finding(s); "
                         f"report: {report}):\n" + "\n".join(f"  {f}" for f in findings))
    return record


def execute(run: Run) -> None:
    static_only = run.options.static_only
    for target in run.targets:
        out = target_dir(target.name)
        audit(None if static_only else run.runtime, target, out / "wheels", out / "audit.json")
        run.say(f"{target.name}: payload audit passed ({out / 'audit.json'})"
                + (" (static rules only: the manifest stage will refuse this audit)" if static_only else ""))
