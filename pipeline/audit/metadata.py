"""The wheel's metadata: its file name's tags, and the dist-info files that
name it to an installer (METADATA, WHEEL, entry_points.txt, auditwheel's SBOM,
RECORD), each parsed strictly and checked against the target and the policy."""

from __future__ import annotations

import configparser
import csv
import io
import json
from email.parser import Parser

from pipeline.audit.wheel import Wheel, escaped
from pipeline.digest import record_hash
from pipeline.source import engine_version

ENTRY_POINT_GROUP = "vllm.general_plugins"
ENTRY_POINT = "activekv = activekv:register"


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


def tags(wheel: Wheel, wheel_data: bytes | None) -> None:
    if wheel.name_parts is None:
        wheel.fail(wheel.path.name, "tags", "file name is not name-version-python-abi-platform.whl")
        return
    py, abi, plat = wheel.name_parts[-3:]
    expected_py = set(wheel.target.cpython_tags)
    if py not in expected_py or abi != py:
        wheel.fail(
            wheel.path.name,
            "tags",
            f"python/abi tag {py}-{abi}; expected one of "
            f"{sorted(f'{t}-{t}' for t in expected_py)} (release.toml python)",
        )
    if wheel.arch is None:
        wheel.fail(
            wheel.path.name,
            "tags",
            f"the audit knows no ELF machine for platform tag "
            f"{wheel.target.platform_tag} (pipeline/audit/wheel.py MACHINES)",
        )
    if plat != wheel.target.platform_tag:
        wheel.fail(
            wheel.path.name,
            "tags",
            f"platform tag {plat}; expected "
            f"{wheel.target.platform_tag} (release.toml [targets.{wheel.target.name}] platform_tag)",
        )
    if wheel_data is None:
        return
    name = f"{wheel.dist_info}/WHEEL"
    wheel_file, why = _headers(wheel_data)
    if wheel_file is None:
        wheel.fail(name, "metadata", why)
        return
    if (wheel_file.get("Wheel-Version") or "").split(".")[0] != "1":
        wheel.fail(name, "metadata", f"Wheel-Version {wheel_file.get('Wheel-Version')!r}; expected 1.x")
    declared = set(wheel_file.get_all("Tag") or [])
    # A file name may compress tag sets with dots (PEP 425).
    from_name = {f"{x}-{y}-{z}" for x in py.split(".") for y in abi.split(".") for z in plat.split(".")}
    if declared != from_name:
        wheel.fail(name, "tags", f"Tag lines {sorted(declared)} do not match the file name's {py}-{abi}-{plat}")
    if (wheel_file.get("Root-Is-Purelib") or "").lower() != "false":
        wheel.fail(name, "tags", "Root-Is-Purelib must be false for a binary wheel")


def metadata(wheel: Wheel, files: dict[str, bytes]) -> None:
    name = f"{wheel.dist_info}/METADATA"
    if wheel.name_parts and escaped(wheel.name_parts[0]) != escaped(wheel.policy.distribution):
        wheel.fail(
            wheel.path.name,
            "metadata",
            f"distribution {wheel.name_parts[0]!r} in the "
            f"file name; expected {wheel.policy.distribution!r} "
            f"(packaging/payload-policy.toml: distribution)",
        )
    want = wheel.target.wheel_version(engine_version())
    if wheel.name_parts and wheel.name_parts[1] != want:
        wheel.fail(
            wheel.path.name,
            "version",
            f"version {wheel.name_parts[1]!r} in the file name; "
            f"expected {want!r} (the release's version, engine/pyproject.toml, with release.toml "
            f"[targets.{wheel.target.name}] local_version: each target's wheels are named apart)",
        )
    if name in files:
        meta, why = _headers(files[name])
        if meta is None:
            wheel.fail(name, "metadata", why)
        else:
            _metadata_fields(wheel, name, meta)
    _entry_points(wheel, files)


def _metadata_fields(wheel: Wheel, name: str, meta) -> None:
    found = {k: meta.get(k) for k in ("Metadata-Version", "Name", "Version")}
    if None in found.values():
        wheel.fail(name, "metadata", f"lacks {[k for k, v in found.items() if v is None]}")
    if found["Name"] is not None and escaped(found["Name"]) != escaped(wheel.policy.distribution):
        wheel.fail(
            name,
            "metadata",
            f"Name {found['Name']!r}; expected "
            f"{wheel.policy.distribution!r} (packaging/payload-policy.toml: distribution)",
        )
    if found["Version"] is not None and wheel.name_parts and found["Version"] != wheel.name_parts[1]:
        wheel.fail(name, "metadata", f"Version {found['Version']!r}; the file name says {wheel.name_parts[1]!r}")
    requires = [r.replace(" ", "") for r in meta.get_all("Requires-Dist") or []]
    torch_pins = [r for r in requires if r.startswith("torch")]
    want = f"torch=={wheel.target.torch}"
    if torch_pins != [want]:
        wheel.fail(
            name,
            "torch-pin",
            f"Requires-Dist for torch is {torch_pins or 'missing'}; "
            f"expected exactly {want!r} (the torch it was built against)",
        )


def _entry_points(wheel: Wheel, files: dict[str, bytes]) -> None:
    """Exactly our plugin entry point: any other group (console_scripts,
    gui_scripts) installs or runs something that is not the engine."""
    name = f"{wheel.dist_info}/entry_points.txt"
    group, key, value = ENTRY_POINT_GROUP, *(s.strip() for s in ENTRY_POINT.split("="))
    parser = configparser.ConfigParser(delimiters=("=",), interpolation=None, strict=True)
    parser.optionxform = str  # entry point names are case-sensitive
    try:
        parser.read_string(files.get(name, b"").decode("utf-8"), source=name)
    except (UnicodeDecodeError, configparser.Error) as e:
        wheel.fail(name, "entry-point", f"unreadable ({str(e).splitlines()[0]})")
        return
    declared = {(g, k, v.replace(" ", "")) for g in parser.sections() for k, v in parser[g].items()}
    if (group, key, value) not in declared:
        wheel.fail(name, "entry-point", f"no [{group}] entry {ENTRY_POINT!r}: vLLM would not load the plugin")
    for g, k, v in sorted(declared - {(group, key, value)}):
        wheel.fail(
            name,
            "entry-point",
            f"[{g}] {k} = {v}: not an entry point the engine "
            f"declares (engine/pyproject.toml); only [{group}] {ENTRY_POINT}",
        )


def sbom(wheel: Wheel, data: bytes | None) -> None:
    if data is None:
        return
    name = f"{wheel.dist_info}/sboms/auditwheel.cdx.json"
    try:
        doc = json.loads(data)
        tools = doc["metadata"]["tools"]
        tools = tools["components"] if isinstance(tools, dict) else tools
        ok = doc["bomFormat"] == "CycloneDX" and any(t.get("name") == "auditwheel" for t in tools)
    except (ValueError, KeyError, TypeError, AttributeError):
        ok = False
    if not ok:
        wheel.fail(
            name, "sbom", "not auditwheel's CycloneDX SBOM (bomFormat CycloneDX, metadata.tools naming auditwheel)"
        )


def record(wheel: Wheel, files: dict[str, bytes], present: set[str]) -> None:
    record_name = f"{wheel.dist_info}/RECORD"
    try:
        rows = list(csv.reader(io.StringIO(files[record_name].decode("utf-8"))))
    except (UnicodeDecodeError, csv.Error) as e:
        wheel.fail(record_name, "record", f"unreadable ({e})")
        return
    listed: dict[str, list[str]] = {}
    for row in rows:
        if len(row) != 3:
            wheel.fail(record_name, "record", f"malformed row {row!r}")
        elif row[0] in listed:
            wheel.fail(row[0], "record", "listed twice in RECORD")
        else:
            listed[row[0]] = row
    for name in sorted(present - {record_name}):
        if name not in listed:
            wheel.fail(name, "record", "file is not listed in RECORD")
        elif name in files:  # an entry refused above was not read
            _, digest, size = listed[name]
            actual = record_hash(files[name])
            if digest != actual or size != str(len(files[name])):
                wheel.fail(name, "record", f"RECORD says {digest},{size}; the file is {actual},{len(files[name])}")
    for name in sorted(set(listed) - present):
        wheel.fail(name, "record", "listed in RECORD but not in the wheel")
