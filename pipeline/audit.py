"""Stage: audit. The payload audit of a target's wheels; fails closed.

Each finding names the wheel, the file and the rule it breaks:
- files: no Python source or bytecode of ours; only the file types of
  packaging/payload-policy.toml;
- tags: the wheel's tags are the configured Python and platform tags;
- metadata: METADATA pins torch== the target's torch and the wheel declares
  the vllm.general_plugins entry point; RECORD lists every file with a valid
  hash and size;
- linking: every NEEDED library is in the wheel, a system library, or provided
  by the target's torch; no RPATH/RUNPATH leads outside the wheel or torch;
- size: at most the target's max_wheel_bytes;
- loading: in a container of the target's runtime base, `import torch` then
  `import activekv` (an ABI mismatch shows here without any accelerator).
Writes build/release/<target>/audit.json, the record the manifest uses.
"""

from __future__ import annotations

import csv
import dataclasses
import fnmatch
import io
import json
import posixpath
import tomllib
import zipfile
from email.parser import Parser
from pathlib import Path, PurePosixPath

from elftools.elf.dynamic import DynamicSection
from elftools.elf.elffile import ELFFile

from pipeline.config import ROOT, Target
from pipeline.container import Container, ContainerEngine
from pipeline.digest import record_hash, sha256_of
from pipeline.errors import AuditError, ConfigError
from pipeline.images import runtime_base_image

POLICY_FILE = ROOT / "packaging" / "payload-policy.toml"
ENTRY_POINT_GROUP = "vllm.general_plugins"
ENTRY_POINT = "activekv = activekv:register"
# RPATH entries a module may carry: its own grafted libraries, or torch's
# libraries beside it in site-packages.
ALLOWED_RPATH_DIRS = ("torch/lib",)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Policy:
    allowed: tuple[str, ...]
    forbidden: tuple[str, ...]
    system_libraries: tuple[str, ...]


def load_policy(path: Path = POLICY_FILE) -> Policy:
    try:
        data = tomllib.loads(path.read_text())
        return Policy(allowed=tuple(data["allowed"]), forbidden=tuple(data["forbidden"]),
                      system_libraries=tuple(data["system_libraries"]))
    except (OSError, tomllib.TOMLDecodeError, KeyError) as e:
        raise ConfigError(f"{path.name}: unreadable payload policy ({e!r}); it needs "
                          f"allowed, forbidden and system_libraries lists") from None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Finding:
    wheel: str
    file: str
    rule: str
    message: str

    def __str__(self) -> str:
        return f"{self.wheel}: {self.file}: [{self.rule}] {self.message}"


def _matches(name: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) or fnmatch.fnmatchcase(posixpath.basename(name), p)
               for p in patterns)


class WheelAudit:
    """The static rules, on one wheel file."""

    def __init__(self, wheel: Path, target: Target, policy: Policy) -> None:
        self.wheel = wheel
        self.target = target
        self.policy = policy
        self.findings: list[Finding] = []

    def fail(self, file: str, rule: str, message: str) -> None:
        self.findings.append(Finding(wheel=self.wheel.name, file=file, rule=rule, message=message))

    def run(self) -> list[Finding]:
        size = self.wheel.stat().st_size
        if size > self.target.max_wheel_bytes:
            self.fail(self.wheel.name, "size", f"{size} bytes exceeds max_wheel_bytes="
                      f"{self.target.max_wheel_bytes} of target {self.target.name} (release.toml)")
        try:
            zf = zipfile.ZipFile(self.wheel)
        except zipfile.BadZipFile:
            self.fail(self.wheel.name, "format", "not a zip archive")
            return self.findings
        with zf:
            names = [n for n in zf.namelist() if not n.endswith("/")]
            self.files(names)
            dist_info = self.dist_info(names)
            if dist_info is None:
                return self.findings
            self.tags(zf, dist_info)
            self.metadata(zf, dist_info)
            self.record(zf, dist_info, names)
            for name in names:
                data = zf.read(name)
                if data[:4] == b"\x7fELF":
                    self.elf(name, data, names)
        return self.findings

    def files(self, names: list[str]) -> None:
        for name in names:
            if _matches(name, self.policy.forbidden):
                self.fail(name, "no-python", "Python source or bytecode is never shipped "
                          "(packaging/payload-policy.toml: forbidden)")
            elif not _matches(name, self.policy.allowed):
                self.fail(name, "file-type", "not an allowed file type "
                          "(packaging/payload-policy.toml: allowed)")

    def dist_info(self, names: list[str]) -> str | None:
        dirs = {n.split("/", 1)[0] for n in names if n.split("/", 1)[0].endswith(".dist-info")}
        match sorted(dirs):
            case [one]:
                return one
            case found:
                self.fail(self.wheel.name, "dist-info", f"expected exactly one .dist-info folder, found {found}")
                return None

    def tags(self, zf: zipfile.ZipFile, dist_info: str) -> None:
        stem = self.wheel.name.removesuffix(".whl")
        parts = stem.split("-")
        if len(parts) not in (5, 6):
            self.fail(self.wheel.name, "tags", "file name is not name-version-python-abi-platform.whl")
            return
        py, abi, plat = parts[-3:]
        expected_py = set(self.target.cpython_tags)
        if py not in expected_py or abi != py:
            self.fail(self.wheel.name, "tags", f"python/abi tag {py}-{abi}; expected one of "
                      f"{sorted(f'{t}-{t}' for t in expected_py)} (release.toml python)")
        if plat != self.target.platform_tag:
            self.fail(self.wheel.name, "tags", f"platform tag {plat}; expected "
                      f"{self.target.platform_tag} (release.toml [targets.{self.target.name}] platform_tag)")
        wheel_file = Parser().parsestr(zf.read(f"{dist_info}/WHEEL").decode())
        declared = set(wheel_file.get_all("Tag") or [])
        # A file name may compress tag sets with dots (PEP 425).
        from_name = {f"{x}-{y}-{z}" for x in py.split(".") for y in abi.split(".")
                     for z in plat.split(".")}
        if declared != from_name:
            self.fail(f"{dist_info}/WHEEL", "tags", f"Tag lines {sorted(declared)} do not match "
                      f"the file name's {py}-{abi}-{plat}")
        if wheel_file.get("Root-Is-Purelib", "").lower() != "false":
            self.fail(f"{dist_info}/WHEEL", "tags", "Root-Is-Purelib must be false for a binary wheel")

    def metadata(self, zf: zipfile.ZipFile, dist_info: str) -> None:
        meta = Parser().parsestr(zf.read(f"{dist_info}/METADATA").decode())
        requires = [r.replace(" ", "") for r in meta.get_all("Requires-Dist") or []]
        torch_pins = [r for r in requires if r.startswith("torch")]
        want = f"torch=={self.target.torch}"
        if torch_pins != [want]:
            self.fail(f"{dist_info}/METADATA", "torch-pin", f"Requires-Dist for torch is "
                      f"{torch_pins or 'missing'}; expected exactly {want!r} (the torch it was built against)")
        name = f"{dist_info}/entry_points.txt"
        text = zf.read(name).decode() if name in zf.namelist() else ""
        section = None
        found = False
        for line in text.splitlines():
            line = line.strip()
            if line.startswith("["):
                section = line.strip("[]")
            elif section == ENTRY_POINT_GROUP and line.replace(" ", "") == ENTRY_POINT.replace(" ", ""):
                found = True
        if not found:
            self.fail(name, "entry-point", f"no [{ENTRY_POINT_GROUP}] entry {ENTRY_POINT!r}: "
                      f"vLLM would not load the plugin")

    def record(self, zf: zipfile.ZipFile, dist_info: str, names: list[str]) -> None:
        record_name = f"{dist_info}/RECORD"
        rows = list(csv.reader(io.StringIO(zf.read(record_name).decode())))
        listed = {}
        for row in rows:
            if len(row) != 3:
                self.fail(record_name, "record", f"malformed row {row!r}")
                continue
            listed[row[0]] = row
        for name in names:
            if name == record_name:
                continue
            if name not in listed:
                self.fail(name, "record", "file is not listed in RECORD")
                continue
            _, digest, size = listed[name]
            data = zf.read(name)
            actual = record_hash(data)
            if digest != actual or size != str(len(data)):
                self.fail(name, "record", f"RECORD says {digest},{size}; the file is {actual},{len(data)}")
        for name in sorted(set(listed) - set(names)):
            self.fail(name, "record", "listed in RECORD but not in the wheel")

    def elf(self, name: str, data: bytes, names: list[str]) -> None:
        elf = ELFFile(io.BytesIO(data))
        needed: list[str] = []
        paths: list[str] = []
        for section in elf.iter_sections():
            if isinstance(section, DynamicSection):
                for tag in section.iter_tags():
                    if tag.entry.d_tag == "DT_NEEDED":
                        needed.append(tag.needed)
                    elif tag.entry.d_tag == "DT_RPATH":
                        paths += tag.rpath.split(":")
                    elif tag.entry.d_tag == "DT_RUNPATH":
                        paths += tag.runpath.split(":")
        here = PurePosixPath(name).parent
        in_wheel = {posixpath.basename(n) for n in names}
        for lib in needed:
            if lib in in_wheel or _matches(lib, self.policy.system_libraries):
                continue
            if _matches(lib, self.target.provided_libraries):
                continue
            self.fail(name, "needed", f"needs {lib}, which is neither in the wheel, a system "
                      f"library, nor provided by target {self.target.name}'s torch "
                      f"(release.toml provided_libraries)")
        for p in paths:
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


def load_check(engine: ContainerEngine, target: Target, wheels: list[Path]
               ) -> tuple[dict[str, str], list[Finding]]:
    """Install each wheel offline in a clean container of the target's runtime
    base (its torch must satisfy the wheel's torch pin) and import it after
    torch. Returns the image ({ref, id}) and the findings."""
    image, image_id = runtime_base_image(engine, target)
    findings = []
    for wheel in wheels:
        with Container(engine=engine, image=image) as c:
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


def audit(engine: ContainerEngine | None, target: Target, wheels_dir: Path, report: Path) -> dict:
    """Audit every wheel in wheels_dir; write the report; raise AuditError on
    any finding. engine=None skips the load check (static rules only)."""
    policy = load_policy()
    wheels = sorted(wheels_dir.glob("*.whl"))
    findings: list[Finding] = []
    if not wheels:
        findings.append(Finding(wheel="-", file=str(wheels_dir), rule="wheels",
                                message="no wheel to audit: run the build stage first"))
    for wheel in wheels:
        findings += WheelAudit(wheel, target, policy).run()
    runtime_image = None
    if engine is not None and wheels and not findings:
        runtime_image, loaded = load_check(engine, target, wheels)
        findings += loaded
    record = {
        "stage": "audit",
        "target": target.name,
        "passed": not findings,
        "load_checked": runtime_image is not None,
        "runtime_image": runtime_image,
        "wheels": [{"file": w.name, "sha256": sha256_of(w),
                    "size": w.stat().st_size} for w in wheels],
        "findings": [dataclasses.asdict(f) for f in findings],
    }
    report.parent.mkdir(parents=True, exist_ok=True)
    report.write_text(json.dumps(record, indent=2) + "\n")
    if findings:
        raise AuditError(f"payload audit of target {target.name} failed ({len(findings)} finding(s); "
                         f"report: {report}):\n" + "\n".join(f"  {f}" for f in findings))
    return record
