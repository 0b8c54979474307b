"""The language boundary, reported: what Python the release still puts into
the user's process, and every place vLLM calls into ActiveKV.

    python -m pipeline.boundary [--vllm 0.32.0] [--json out.json]

Retention audit: every line the vLLM patch series adds (the only Python of
ours a release ships: the wheels hold none, the payload audit proves it),
hunk by hunk, for every vLLM version a target of release.toml names (or the
one --vllm names), labelled in ci/retention.toml (rows keyed by version,
patch, file and hunk) as
  contract     the framework requires Python here (with the vLLM or PyTorch
               source line that says so),
  convenience  Python we could port but have not,
  delegate     Python that only forwards to native code.
Convenience and delegate must be zero; an unlabelled hunk is a violation too.

Census: every attribute vLLM reaches on the classes the engine gives it (the
connector, its metadata, stats and Prometheus classes) and the plugin entry
point, each shown to be a native function (or a property / classmethod of
one). Needs vLLM and the engine installed. Exits 1 on any violation.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from pathlib import Path

from pipeline.errors import ConfigError
from pipeline.patch_series import PATCHES_DIR, load_series
from pipeline.paths import ROOT
from pipeline.toml_schema import load_checked

LABELS = ROOT / "ci" / "retention.toml"
ALLOWED_LABEL = "contract"


@dataclasses.dataclass(frozen=True)
class Hunk:
    patch: str
    file: str
    index: int  # 1-based within the file
    start: int  # first line in the patched file
    added: tuple[str, ...]


def hunks(patch: Path) -> list[Hunk]:
    out, current, index, start, added = [], None, 0, 0, []

    def flush() -> None:
        if current is not None and index:
            out.append(Hunk(patch.name, current, index, start, tuple(added)))

    for line in patch.read_text().splitlines():
        if line.startswith("+++ b/"):
            flush()
            current, index, added = line[6:].strip(), 0, []
        elif m := re.match(r"@@ -\d+(?:,\d+)? \+(\d+)(?:,\d+)? @@", line):
            flush()
            index, start, added = index + 1, int(m.group(1)), []
        elif current and index and line.startswith("+") and not line.startswith("+++"):
            added.append(line[1:])
    flush()
    return out


def retention(
    version: str, labels_file: Path = LABELS, patches_dir: Path = PATCHES_DIR
) -> tuple[list[dict], list[str]]:
    labels = load_checked(labels_file, "retention.schema.json").get("hunk", []) if labels_file.is_file() else []
    by_key = {(e.get("version"), e["patch"], e["file"], e["hunk"]): e for e in labels}
    rows, violations = [], []
    for patch in load_series(version, patches_dir).patches:
        for h in hunks(patch):
            code = [line for line in h.added if line.strip() and not line.strip().startswith("#")]
            entry = by_key.get((version, h.patch, h.file, h.index))
            label = entry["label"] if entry else "UNLABELLED"
            rows.append(
                {
                    "version": version,
                    "patch": h.patch,
                    "file": h.file,
                    "hunk": h.index,
                    "line": h.start,
                    "python_lines": len(code),
                    "label": label,
                    "cite": entry.get("cite", "") if entry else "",
                    "why": entry.get("why", "") if entry else "",
                }
            )
            if entry is None:
                violations.append(
                    f"{h.patch} {h.file} hunk {h.index}: no label for vLLM {version} in {labels_file.name}"
                )
            elif label != ALLOWED_LABEL:
                violations.append(f"{h.patch} {h.file} hunk {h.index}: labelled {label}; port it")
            elif not entry.get("cite"):
                violations.append(
                    f"{h.patch} {h.file} hunk {h.index}: a contract needs the source line that requires it"
                )
    return rows, violations


def release_versions(cfg) -> list[str]:
    """Every vLLM version a target of the release config names, oldest first."""
    from packaging.version import Version

    return sorted({t.vllm_version for t in cfg.targets.values()}, key=Version)


def is_native(value) -> bool:
    """Whether `value` is a native function (or a classmethod, staticmethod or
    property made of native functions)."""
    kind = type(value).__name__
    if kind in ("builtin_function_or_method", "instancemethod"):
        return True
    if isinstance(value, classmethod | staticmethod):
        return is_native(value.__func__)
    if isinstance(value, property):
        return all(f is None or is_native(f) for f in (value.fget, value.fset, value.fdel))
    return False


def census() -> tuple[list[dict], list[str]]:
    from importlib.metadata import entry_points

    import activekv

    rows, violations = [], []
    # What the class namespaces hold by construction and vLLM never calls.
    data = {
        "__module__",
        "__doc__",
        "__qualname__",
        "__signature__",
        "_cache_hit_source",
        "__slotnames__",
        "__dict__",
        "__weakref__",
        "__abstractmethods__",
        "_abc_impl",
        "__orig_bases__",
        "__parameters__",
        "__annotations__",
    }
    for cls_name in (
        "ActiveKVHostConnector",
        "ActiveKVMetadata",
        "ActiveKVWorkerMetadata",
        "ActiveKVStats",
        "ActiveKVPromMetrics",
    ):
        cls = getattr(activekv, cls_name)
        for name, value in sorted(vars(cls).items()):
            if name in data:
                continue
            native = is_native(value)
            rows.append({"where": f"{cls_name}.{name}", "kind": type(value).__name__, "native": native})
            if not native:
                violations.append(f"{cls_name}.{name} is {type(value).__name__}, not a native function")
    for ep in entry_points(group="vllm.general_plugins"):
        if ep.name == "activekv":
            native = is_native(ep.load())
            rows.append({"where": f"entry point {ep.value}", "kind": type(ep.load()).__name__, "native": native})
            if not native:
                violations.append(f"entry point {ep.value} is not native")
    if not any(r["where"].startswith("entry point") for r in rows):
        violations.append("the vllm.general_plugins entry point 'activekv' is not installed")
    return rows, violations


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.boundary", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--vllm",
        default=None,
        help="one patch series' vLLM version (default: every version a target of release.toml names)",
    )
    parser.add_argument("--json", type=Path, help="also write the report here")
    args = parser.parse_args(argv)
    from pipeline import config

    versions = [args.vllm] if args.vllm else release_versions(config.load())
    kept, v1 = [], []
    for version in versions:
        try:
            rows, found = retention(version)
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            return e.exit_code
        kept += rows
        v1 += [f"vLLM {version}: {v}" for v in found]
    calls, v2 = census()
    print(f"Retention audit: Python the release puts into the user's process (vLLM {', '.join(versions)} series)")
    print(f"  {'vllm':<7} {'patch':<36} {'file':<58} {'hunk':>4} {'lines':>5}  label     cite")
    for r in kept:
        print(
            f"  {r['version']:<7} {r['patch']:<36} {r['file']:<58} {r['hunk']:>4} {r['python_lines']:>5}  "
            f"{r['label']:<9} {r['cite']}"
        )
    print("  engine wheels: no Python (the payload audit rejects any .py, .pyc, .pyi, .pyx)")
    totals = {}
    for r in kept:
        totals[r["label"]] = totals.get(r["label"], 0) + r["python_lines"]
    print("  lines by label: " + ", ".join(f"{k} {v}" for k, v in sorted(totals.items())))
    print("\nCensus: where vLLM calls into ActiveKV")
    for r in calls:
        print(f"  {'native' if r['native'] else 'PYTHON'}  {r['where']:<58} {r['kind']}")
    violations = v1 + v2
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps({"retention": kept, "census": calls, "violations": violations}, indent=2) + "\n"
        )
    for v in violations:
        print(f"violation: {v}", file=sys.stderr)
    print(f"\n{len(violations)} violation(s)")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
