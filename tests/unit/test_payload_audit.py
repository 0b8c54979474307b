"""The payload audit takes a wheel's contents as an allowlist: what the engine
build makes (the extension module at the root, its dist-info files, libraries
auditwheel grafted that the policy names). Every other entry, and every entry
that would install outside site-packages or that Python imports at start-up,
is refused by the audit itself, naming the entry and the rule; a damaged
wheel is a finding, never a traceback.

The wheels are written here: a good one modelled on what we ship (its module a
small ELF shared object made below, or a real extension module of this
interpreter) and one change per case."""

from __future__ import annotations

import dataclasses
import json
import random
import stat
import struct
import sysconfig
import warnings
import zipfile
from collections.abc import Iterable
from pathlib import Path

import pytest

from pipeline import config
from pipeline.audit.policy import POLICY_FILE, Policy, load_policy
from pipeline.audit.static import audit_wheel
from pipeline.digest import record_hash
from pipeline.errors import AuditError, ConfigError
from pipeline.source import engine_version
from pipeline.stages import audit

TARGET = config.load(environ={}).targets["cpu"]
PY = TARGET.cpython_tags[0]
VERSION = TARGET.wheel_version(engine_version())  # the release's, with the cpu target's local label
DIST_INFO = f"activekv-{VERSION}.dist-info"
WHEEL_NAME = f"activekv-{VERSION}-{PY}-{PY}-{TARGET.platform_tag}.whl"
MODULE = f"activekv.cpython-{PY.removeprefix('cp')}-x86_64-linux-gnu.so"
GRAFTED = "activekv.libs/libnuma-a34b3233.so.1"

ET_EXEC, ET_DYN = 2, 3
EM_X86_64, EM_AARCH64 = 62, 183
DT_NULL, DT_NEEDED, DT_STRTAB, DT_STRSZ, DT_RUNPATH = 0, 1, 5, 10, 29


def shared_object(
    needed: Iterable[str] = ("libc.so.6", "libtorch_cpu.so", "libc10.so"),
    runpath: str = "$ORIGIN/torch/lib",
    *,
    e_type: int = ET_DYN,
    machine: int = EM_X86_64,
    elf_class: int = 2,
) -> bytes:
    """A minimal ELF64 shared object as the linker lays one out: a load
    segment over the file, a dynamic segment (NEEDED, RUNPATH, string table)
    and the section headers that describe the same bytes."""
    strings, offsets = b"\0", {}
    for s in [*needed, runpath]:
        offsets[s] = len(strings)
        strings += s.encode() + b"\0"
    dynstr_off = 64 + 2 * 56
    dyn_off = (dynstr_off + len(strings) + 7) & ~7
    tags = [(DT_NEEDED, offsets[n]) for n in needed] + [
        (DT_RUNPATH, offsets[runpath]),
        (DT_STRTAB, dynstr_off),
        (DT_STRSZ, len(strings)),
        (DT_NULL, 0),
    ]
    dynamic = b"".join(struct.pack("<qQ", t, v) for t, v in tags)
    shstr = b"\0.dynstr\0.dynamic\0.shstrtab\0"
    shstr_off = dyn_off + len(dynamic)
    sh_off = (shstr_off + len(shstr) + 7) & ~7
    size = sh_off + 4 * 64
    ident = b"\x7fELF" + bytes([elf_class, 1, 1, 0]) + bytes(8)
    header = ident + struct.pack("<HHIQQQIHHHHHH", e_type, machine, 1, 0, 64, sh_off, 0, 64, 56, 2, 64, 4, 3)
    phdrs = struct.pack("<IIQQQQQQ", 1, 4, 0, 0, 0, size, size, 0x1000) + struct.pack(
        "<IIQQQQQQ", 2, 6, dyn_off, dyn_off, dyn_off, len(dynamic), len(dynamic), 8
    )
    sections = (
        bytes(64)
        + struct.pack("<IIQQQQIIQQ", 1, 3, 2, dynstr_off, dynstr_off, len(strings), 0, 0, 1, 0)
        + struct.pack("<IIQQQQIIQQ", 9, 6, 3, dyn_off, dyn_off, len(dynamic), 1, 0, 8, 16)
        + struct.pack("<IIQQQQIIQQ", 18, 3, 0, 0, shstr_off, len(shstr), 0, 0, 1, 0)
    )
    out = bytearray(size)
    out[0:64] = header
    out[64:dynstr_off] = phdrs
    out[dynstr_off : dynstr_off + len(strings)] = strings
    out[dyn_off : dyn_off + len(dynamic)] = dynamic
    out[shstr_off : shstr_off + len(shstr)] = shstr
    out[sh_off:] = sections
    return bytes(out)


METADATA = (
    f"Metadata-Version: 2.2\nName: activekv\nVersion: {VERSION}\n"
    f"Summary: vLLM's KV cache in host RAM: the native ActiveKV connector\n"
    f"License-Expression: Apache-2.0\nRequires-Python: >=3.10\n"
    f"Requires-Dist: torch=={TARGET.torch}\nDescription-Content-Type: text/markdown\n\n"
    f"# ActiveKV\n"
).encode()
WHEEL = (
    f"Wheel-Version: 1.0\nGenerator: scikit-build-core 1.1.2\nRoot-Is-Purelib: false\n"
    f"Tag: {PY}-{PY}-{TARGET.platform_tag}\n"
).encode()
ENTRY_POINTS = b"[vllm.general_plugins]\nactivekv = activekv:register\n\n"


def good_files(module: bytes | None = None) -> dict[str, bytes]:
    """What the engine build ships (RECORD is written with the wheel)."""
    return {
        MODULE: module if module is not None else shared_object(),
        f"{DIST_INFO}/METADATA": METADATA,
        f"{DIST_INFO}/WHEEL": WHEEL,
        f"{DIST_INFO}/entry_points.txt": ENTRY_POINTS,
        f"{DIST_INFO}/licenses/LICENSE": b"Apache License\nVersion 2.0, January 2004\n",
    }


Entry = tuple[str | zipfile.ZipInfo, bytes]


def write_wheel(path: Path, entries: dict[str, bytes] | list[Entry], *, record: bool = True) -> Path:
    """Write the entries in order, then a RECORD listing each file once with
    its hash (what auditwheel writes), so a case breaks one rule only."""
    items = list(entries.items()) if isinstance(entries, dict) else list(entries)
    if record:
        rows, seen = [], set()
        for name, data in items:
            filename = name.filename if isinstance(name, zipfile.ZipInfo) else name
            if filename not in seen and not filename.endswith("/"):
                seen.add(filename)
                rows.append(f"{filename},{record_hash(data)},{len(data)}\n")
        items.append((f"{DIST_INFO}/RECORD", "".join(rows + [f"{DIST_INFO}/RECORD,,\n"]).encode()))
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        # The duplicate cases write one name twice on purpose.
        warnings.filterwarnings("ignore", "Duplicate name", UserWarning)
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
            for name, data in items:
                zf.writestr(name, data)
    return path


def wheel_with(
    tmp_path: Path, *, add: dict[str, bytes] | None = None, drop: Iterable[str] = (), name: str = WHEEL_NAME
) -> Path:
    files = good_files() | (add or {})
    for n in drop:
        del files[n]
    return write_wheel(tmp_path / "wheels" / name, files)


def findings(wheel: Path, policy: Policy | None = None) -> list[tuple[str, str]]:
    found = audit_wheel(wheel, TARGET, policy or load_policy())
    return [(f.file, f.rule) for f in found]


def assert_refused(wheel: Path, *expected: tuple[str, str]) -> None:
    """The audit refuses the wheel with exactly these (entry, rule) findings,
    raising AuditError (no other exception) that names each, and writes them
    all to audit.json."""
    assert sorted(findings(wheel)) == sorted(expected)
    report = wheel.parent.parent / "audit.json"
    with pytest.raises(AuditError) as err:
        audit.audit(None, TARGET, wheel.parent, report)
    for entry, rule in expected:
        assert f"{wheel.name}: {entry}: [{rule}]" in str(err.value)
    written = json.loads(report.read_text())
    assert written["passed"] is False
    assert sorted((f["file"], f["rule"]) for f in written["findings"]) == sorted(expected)


def zip_info(name: str, mode: int) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0))
    info.external_attr = mode << 16
    return info


# -- what we ship passes ------------------------------------------------------


def test_the_wheel_the_engine_build_makes_passes(tmp_path):
    wheel = wheel_with(tmp_path)
    assert findings(wheel) == []
    record = audit.audit(None, TARGET, wheel.parent, tmp_path / "audit.json")
    assert record["passed"] and record["findings"] == []


def real_extension_module() -> bytes:
    """An extension module this interpreter loads (gcc's output, not ours)."""
    folder = Path(sysconfig.get_config_var("DESTSHARED") or "/nonexistent")
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    for name in ("_json", "_bisect", "_heapq", "_struct", "math"):
        if (folder / f"{name}{suffix}").is_file():
            return (folder / f"{name}{suffix}").read_bytes()
    pytest.skip(f"no small extension module in {folder}")


def test_a_real_shared_object_as_our_module_is_read_whole(tmp_path):
    module = real_extension_module()
    wheel = write_wheel(tmp_path / "wheels" / WHEEL_NAME, good_files(module))
    found = audit_wheel(wheel, TARGET, load_policy())
    # Its interpreter's build may have left a RUNPATH of that machine in it
    # (pyenv does): the audit reads it, and that is the only finding.
    assert [(f.file, f.rule) for f in found] in ([], [(MODULE, "rpath")])
    for f in found:
        runpath = f.message.split("'")[1]
        assert not runpath.startswith("$ORIGIN") and runpath.encode() in module


def native_module() -> bytes:
    """The engine's module the tests load, built on this host by the engine
    install (not imported: it needs torch's libraries loaded)."""
    import importlib.util

    spec = importlib.util.find_spec("activekv")
    assert spec is not None and spec.origin and spec.origin.endswith(".so"), spec
    return Path(spec.origin).read_bytes()


def symbol_version_findings(wheel: Path, policy: Policy) -> list[str]:
    return [f.message for f in audit_wheel(wheel, TARGET, policy) if f.rule == "symbol-version"]


def test_the_engine_built_here_needs_no_symbol_version_past_the_cpu_wheels_tag(tmp_path):
    """The gate in seconds for what auditwheel refuses at the release build's
    end (2026-12-04: std::condition_variable::wait, GLIBCXX_3.4.30, past
    manylinux_2_34's 3.4.29). The host builds with the builder image's
    toolchain (Debian 12's GCC 12), so its module needs what the wheel's does."""
    wheel = write_wheel(tmp_path / "wheels" / WHEEL_NAME, good_files(native_module()))
    assert symbol_version_findings(wheel, load_policy()) == []


def test_a_symbol_version_past_the_platform_tags_newest_is_refused_naming_it(tmp_path):
    # Every x86_64 glibc program needs GLIBC_2.2.5, that architecture's first
    # version: a policy allowing up to GLIBC 2.2 must refuse it.
    wheel = write_wheel(tmp_path / "wheels" / WHEEL_NAME, good_files(native_module()))
    strict = dataclasses.replace(load_policy(), symbol_versions={TARGET.platform_tag: {"GLIBC": (2, 2)}})
    [message] = symbol_version_findings(wheel, strict)
    assert "GLIBC_2.2.5 of libc.so.6 (newest allowed: 2.2)" in message
    assert TARGET.platform_tag in message
    # The other families are not ranked by that policy: only GLIBC versions named.
    assert "GLIBCXX" not in message


def test_a_platform_tag_the_policy_has_no_symbol_versions_for_is_refused(tmp_path):
    wheel = wheel_with(tmp_path)
    other = dataclasses.replace(load_policy(), symbol_versions={"manylinux_2_17_x86_64": {"GLIBC": (2, 17)}})
    [message] = symbol_version_findings(wheel, other)
    assert f"[symbol_versions.{TARGET.platform_tag}]" in message


def test_every_targets_platform_tag_has_symbol_versions():
    tags = {t.platform_tag for t in config.load(environ={}).targets.values()}
    assert tags <= set(load_policy().symbol_versions), tags - set(load_policy().symbol_versions)


def grafting_policy() -> Policy:
    return dataclasses.replace(load_policy(), grafted=("libnuma.so.1",))


def grafted_wheel(tmp_path: Path, *, module_needs_it: bool = True) -> Path:
    needed = ["libc.so.6", "libtorch_cpu.so"] + (["libnuma-a34b3233.so.1"] if module_needs_it else [])
    files = good_files(shared_object(needed, "$ORIGIN/torch/lib:$ORIGIN/activekv.libs"))
    files[GRAFTED] = shared_object(["libc.so.6"], "")
    return write_wheel(tmp_path / "wheels" / WHEEL_NAME, files)


def test_a_grafted_library_the_policy_names_and_the_module_needs_passes(tmp_path):
    assert findings(grafted_wheel(tmp_path), grafting_policy()) == []


# -- shared libraries that are not ours ------------------------------------

ELF = shared_object(["libc.so.6"], "")


@pytest.mark.parametrize(
    "entry, data",
    [
        ("libc.so.6", ELF),  # a system library copied to the root
        ("libfoo.so", ELF),  # a library beside the module
        ("activekv.so", ELF),  # our name, a suffix we do not build
        ("activekv.abi3.so", ELF),
        ("activekv.cpython-312-x86_64-linux-gnu.so", ELF),  # our module for another Python
        ("activekv/libfoo.so", ELF),  # in a package folder
        ("torch/lib/libc10.so", ELF),  # another project's library
        ("activekv.libs/libfoo.so.1", ELF),  # not named as auditwheel names it
        ("activekv.libs/sub/libfoo-a34b3233.so.1", ELF),  # not directly in the folder
        ("activekv.libs/libc-a34b3233.so.6", ELF),  # grafted, but not in the policy
        ("payload.bin", ELF),  # ELF content under another name
        (f"{DIST_INFO}/licenses/LICENSE", ELF),  # ELF content among the metadata
        ("libfoo.so.1", b"not even ELF"),  # a library by name
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_a_shared_library_that_is_not_ours_is_refused(tmp_path, entry, data):
    assert_refused(wheel_with(tmp_path, add={entry: data}), (entry, "foreign-library"))


def test_a_grafted_library_the_policy_does_not_name_is_refused(tmp_path):
    wheel = grafted_wheel(tmp_path)
    # The module then needs a library the wheel is not allowed to carry.
    assert sorted(findings(wheel)) == sorted([(GRAFTED, "foreign-library"), (MODULE, "needed")])


def test_a_grafted_library_no_module_needs_is_refused(tmp_path):
    wheel = grafted_wheel(tmp_path, module_needs_it=False)
    assert findings(wheel, grafting_policy()) == [(GRAFTED, "foreign-library")]


# -- names Python imports at start-up, or that are not ours -------------------


@pytest.mark.parametrize(
    "entry",
    [
        "sitecustomize.py",
        "usercustomize.py",
        f"sitecustomize.cpython-{PY[2:]}-x86_64-linux-gnu.so",  # native, not only Python source
        "site.py",
        "encodings/__init__.py",
        f"encodings/utf_8.cpython-{PY[2:]}-x86_64-linux-gnu.so",
        "os.py",
        "json/__init__.py",
        f"_ssl.cpython-{PY[2:]}-x86_64-linux-gnu.so",
        "_sysconfigdata__linux_x86_64-linux-gnu.py",
        "typing.pyc",
        "activekv.pth",
        "distutils-precedence.pth",
    ],
)
def test_a_name_the_interpreter_imports_is_refused(tmp_path, entry):
    data = ELF if entry.endswith(".so") else b"import os\n"
    assert_refused(wheel_with(tmp_path, add={entry: data}), (entry, "shadows"))


def test_a_start_up_package_folder_is_refused(tmp_path):
    wheel = write_wheel(tmp_path / "wheels" / WHEEL_NAME, [("sitecustomize/", b""), *good_files().items()])
    assert_refused(wheel, ("sitecustomize/", "shadows"))


@pytest.mark.parametrize(
    "entry",
    [
        "activekv_helpers.py",
        "activekv/__init__.py",
        f"{DIST_INFO}/helper.pyc",
        "activekv.libs/helper.py",
    ],
)
def test_python_of_ours_is_refused(tmp_path, entry):
    assert_refused(wheel_with(tmp_path, add={entry: b"print('hi')\n"}), (entry, "no-python"))


@pytest.mark.parametrize(
    "entry",
    [
        "README.txt",
        "otherpkg/data.json",
        "activekv/config.json",  # a package folder would shadow the module
        f"{DIST_INFO}/INSTALLER",
        f"{DIST_INFO}/RECORD.jws",
        f"{DIST_INFO}/sboms/other.cdx.json",
        "torch-2.13.0.dist-info/METADATA",  # another distribution's metadata
        "activekv.libs/NOTICE",
    ],
)
def test_an_entry_the_build_does_not_make_is_refused(tmp_path, entry):
    assert_refused(wheel_with(tmp_path, add={entry: b"{}\n"}), (entry, "not-ours"))


# -- entry paths -----------------------------------------------------------


@pytest.mark.parametrize(
    "entry",
    [
        "/etc/ld.so.preload",  # absolute
        "../activekv.so",  # leaves site-packages
        f"{DIST_INFO}/../../../bin/activekv",
        "activekv\\..\\..\\evil.so",  # backslashes
        "C:/Windows/evil.dll",  # a drive letter
        "./activekv.txt",  # not canonical
        "activekv.libs//libfoo-a34b3233.so.1",
        "activekv\tx",  # a control character
        f"activekv-{VERSION}.data/scripts/activekv-serve",
        f"activekv-{VERSION}.data/headers/activekv.h",
        f"activekv-{VERSION}.data/data/etc/activekv.conf",
        f"activekv-{VERSION}.data/purelib/activekv_extra.txt",
    ],
)
def test_an_entry_whose_path_leaves_the_install_directory_is_refused(tmp_path, entry):
    assert_refused(wheel_with(tmp_path, add={entry: b"x"}), (entry, "path"))


@pytest.mark.parametrize(
    "entry, mode",
    [
        (f"{DIST_INFO}/licenses/LICENSE", stat.S_IFLNK | 0o777),  # a symlink to /etc/passwd
        ("libtorch.so", stat.S_IFLNK | 0o777),
        (MODULE, stat.S_IFLNK | 0o777),
        (f"{DIST_INFO}/licenses/fifo", stat.S_IFIFO | 0o644),
        (f"{DIST_INFO}/licenses/dir", stat.S_IFDIR | 0o755),  # a folder without its slash
    ],
    ids=["symlinked-license", "symlinked-library", "symlinked-module", "fifo", "folder-mode"],
)
def test_a_symlink_or_other_special_entry_is_refused(tmp_path, entry, mode):
    files = good_files()
    files.pop(entry, None)
    wheel = write_wheel(tmp_path / "wheels" / WHEEL_NAME, [*files.items(), (zip_info(entry, mode), b"/etc/passwd")])
    assert_refused(wheel, (entry, "special-file"))


@pytest.mark.parametrize("entry", [MODULE, f"{DIST_INFO}/METADATA", f"{DIST_INFO}/licenses/LICENSE"])
def test_a_name_the_zip_holds_twice_is_refused(tmp_path, entry):
    files = good_files()
    first = files.get(entry, b"Apache-2.0\n")
    entries = [*files.items(), (entry, first), (entry, b"the second copy wins on install\n")]
    assert_refused(write_wheel(tmp_path / "wheels" / WHEEL_NAME, entries), (entry, "duplicate"))


# -- what must be there and parse -------------------------------------------


@pytest.mark.parametrize("entry", [f"{DIST_INFO}/METADATA", f"{DIST_INFO}/WHEEL", f"{DIST_INFO}/licenses/LICENSE"])
def test_a_missing_metadata_file_is_a_finding(tmp_path, entry):
    assert_refused(wheel_with(tmp_path, drop=[entry]), (entry, "missing"))


def test_a_missing_record_is_a_finding(tmp_path):
    wheel = write_wheel(tmp_path / "wheels" / WHEEL_NAME, good_files(), record=False)
    assert_refused(wheel, (f"{DIST_INFO}/RECORD", "missing"))


def test_a_wheel_without_its_extension_module_is_refused(tmp_path):
    assert_refused(wheel_with(tmp_path, drop=[MODULE]), (MODULE, "missing"))


@pytest.mark.parametrize(
    "entry, data, rule, said",
    [
        (f"{DIST_INFO}/METADATA", b"\xff\xfeName: activekv\n", "metadata", "not UTF-8"),
        (f"{DIST_INFO}/METADATA", METADATA.replace(b"Summary:", b"Summary"), "metadata", "malformed"),
        (f"{DIST_INFO}/METADATA", METADATA.replace(b"Name: activekv", b"Name: torch"), "metadata", "Name"),
        (
            f"{DIST_INFO}/METADATA",
            METADATA.replace(f"Version: {VERSION}".encode(), b"Version: 9.9"),
            "metadata",
            "Version",
        ),
        (f"{DIST_INFO}/METADATA", METADATA.replace(b"Metadata-Version: 2.2\n", b""), "metadata", "lacks"),
        (f"{DIST_INFO}/WHEEL", b"\xff" + WHEEL, "metadata", "not UTF-8"),
        (f"{DIST_INFO}/WHEEL", WHEEL.replace(b"Wheel-Version: 1.0\n", b""), "metadata", "Wheel-Version"),
        (f"{DIST_INFO}/entry_points.txt", b"activekv = activekv:register\n", "entry-point", "unreadable"),
        (f"{DIST_INFO}/entry_points.txt", b"\xff[x]\n", "entry-point", "unreadable"),
        (f"{DIST_INFO}/entry_points.txt", ENTRY_POINTS * 2, "entry-point", "unreadable"),
        (
            f"{DIST_INFO}/entry_points.txt",
            ENTRY_POINTS + b"[console_scripts]\nactivekv = os:system\n",
            "entry-point",
            "console_scripts",
        ),
        (f"{DIST_INFO}/entry_points.txt", ENTRY_POINTS + b"other = activekv:register\n", "entry-point", "other"),
        (f"{DIST_INFO}/sboms/auditwheel.cdx.json", b'{"bomFormat": "CycloneDX"', "sbom", "auditwheel"),
    ],
)
def test_malformed_metadata_is_a_finding(tmp_path, entry, data, rule, said):
    wheel = wheel_with(tmp_path, add={entry: data})
    assert findings(wheel) == [(entry, rule)]
    (found,) = audit_wheel(wheel, TARGET, load_policy())
    assert said in found.message
    assert_refused(wheel, (entry, rule))


def test_auditwheels_own_sbom_passes(tmp_path):
    sbom = {
        "bomFormat": "CycloneDX",
        "specVersion": "1.4",
        "version": 1,
        "metadata": {"tools": [{"name": "auditwheel", "version": "6.8.2"}]},
        "components": [],
    }
    wheel = wheel_with(tmp_path, add={f"{DIST_INFO}/sboms/auditwheel.cdx.json": json.dumps(sbom).encode()})
    assert findings(wheel) == []


@pytest.mark.parametrize(
    "record",
    [
        lambda rows: rows.replace(b"\n", b"\n\xff", 1),
        lambda rows: rows + rows.splitlines(keepends=True)[0],
        lambda rows: rows + b"a,b\n",
    ],
    ids=["not-utf8", "a-file-listed-twice", "a-row-of-two-fields"],
)
def test_a_malformed_record_is_a_finding(tmp_path, record):
    wheel = wheel_with(tmp_path)
    with zipfile.ZipFile(wheel) as zf:
        rows = zf.read(f"{DIST_INFO}/RECORD")
    bad = write_wheel(
        tmp_path / "bad" / WHEEL_NAME, [*good_files().items(), (f"{DIST_INFO}/RECORD", record(rows))], record=False
    )
    found = audit_wheel(bad, TARGET, load_policy())
    assert [f.rule for f in found] == ["record"]
    assert found[0].file in (MODULE, f"{DIST_INFO}/RECORD")
    with pytest.raises(AuditError, match=r"\[record\]"):
        audit.audit(None, TARGET, bad.parent, tmp_path / "audit.json")


# -- the module must be a whole shared object -------------------------------

GOOD_SO = shared_object()


@pytest.mark.parametrize(
    "data, said",
    [
        (b"", "not an ELF file"),
        (b"MZ\x90\x00 not ELF at all", "not an ELF file"),
        (GOOD_SO[:10], "not a readable ELF"),  # the header cut short
        (GOOD_SO[:100], "not a readable ELF"),  # the program headers cut short
        (GOOD_SO[:-100], "ELF"),  # the section headers cut short
        (GOOD_SO[:64], ""),  # the header alone
        (shared_object(e_type=ET_EXEC), "ET_EXEC"),
        (shared_object(machine=EM_AARCH64), "EM_AARCH64"),
        (shared_object(elf_class=1), ""),  # 32-bit
    ],
    ids=["empty", "not-elf", "cut-at-10", "cut-at-100", "cut-at-end", "header-only", "executable", "aarch64", "elf32"],
)
def test_a_truncated_or_non_elf_module_is_a_finding(tmp_path, data, said):
    wheel = write_wheel(tmp_path / "wheels" / WHEEL_NAME, good_files(data))
    (found,) = audit_wheel(wheel, TARGET, load_policy())
    assert (found.file, found.rule) == (MODULE, "elf")
    assert said in found.message
    assert_refused(wheel, (MODULE, "elf"))


# -- the archive itself ------------------------------------------------------


def test_an_entry_that_does_not_read_back_is_a_finding(tmp_path):
    wheel = tmp_path / "wheels" / WHEEL_NAME
    write_wheel(wheel, good_files())
    with zipfile.ZipFile(wheel) as zf:
        info = zf.getinfo(MODULE)
    raw = bytearray(wheel.read_bytes())
    name_len, extra_len = struct.unpack("<HH", raw[info.header_offset + 26 : info.header_offset + 30])
    start = info.header_offset + 30 + name_len + extra_len
    raw[start + 5] ^= 0xFF  # the compressed bytes no longer match the CRC
    wheel.write_bytes(bytes(raw))
    assert_refused(wheel, (MODULE, "format"))


def test_a_folder_named_like_a_wheel_is_a_finding(tmp_path):
    (tmp_path / "wheels" / WHEEL_NAME).mkdir(parents=True)
    with pytest.raises(AuditError, match=r"\[format\]"):
        audit.audit(None, TARGET, tmp_path / "wheels", tmp_path / "audit.json")


def test_the_policy_file_must_be_whole(tmp_path):
    text = POLICY_FILE.read_text()
    (tmp_path / "no-modules.toml").write_text(text.replace('modules = ["activekv"]', ""))
    (tmp_path / "grafts-libc.toml").write_text(text.replace("grafted = []", 'grafted = ["libc.so*"]'))
    (tmp_path / "no-symbol-versions.toml").write_text(text.split("[symbol_versions.")[0])
    (tmp_path / "bad-version.toml").write_text(text.replace('GLIBCXX = "3.4.29"', 'GLIBCXX = "newest"'))
    (tmp_path / "lower-family.toml").write_text(text.replace('GLIBCXX = "3.4.29"', 'glibcxx = "3.4.29"'))
    for path in tmp_path.glob("*.toml"):
        with pytest.raises(ConfigError):
            load_policy(path)


def test_a_damaged_wheel_gives_findings_never_a_traceback(tmp_path):
    """Random damage to each file of the good wheel (bytes changed, cut
    short, RECORD left out): the audit passes it or raises AuditError, and
    always writes its report."""
    rng = random.Random(20260101)
    for i in range(150):
        files = good_files()
        name = rng.choice(sorted(files))
        data = bytearray(files[name])
        for _ in range(rng.randint(1, 6)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        files[name] = bytes(data[: rng.randrange(1, len(data) + 1)])
        wheel = write_wheel(tmp_path / str(i) / "wheels" / WHEEL_NAME, files, record=rng.random() < 0.8)
        report = tmp_path / str(i) / "audit.json"
        try:
            audit.audit(None, TARGET, wheel.parent, report)
        except AuditError:
            pass
        assert json.loads(report.read_text())["wheels"][0]["file"] == WHEEL_NAME


def test_the_engine_ships_the_repositorys_license():
    """The build sees engine/ only: its LICENSE is the repository's, byte for byte."""
    repo = Path(__file__).resolve().parents[2]
    assert (repo / "engine" / "LICENSE").read_bytes() == (repo / "LICENSE").read_bytes()
