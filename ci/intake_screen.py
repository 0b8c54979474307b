#!/usr/bin/env python3
"""The intake screen: keeps Python from creeping back into the product.

    python3 ci/intake_screen.py [ROOT]

Rules (each finding names the rule, the file and the line):
  1. no Python module in product paths: everything under engine/ ships,
     except the entries of ci/intake-allowlist.toml [python_modules];
  2. no Python import from C++ (py::module_::import, PyImport_*) except the
     entries of [cpp_imports], each with its reason;
  3. no call into a Python object from the functions vLLM calls every step
     (the connector's per-step methods in engine/bindings/, and every helper
     they reach in any file there), except the entries of [per_step_calls],
     each with its reason.
A rule that finds nothing to check (no engine sources, no per-step method)
is a finding too: the screen must not pass by looking at nothing.
Exits 1 on a finding. Standard library only: it runs before anything is set up.
"""

from __future__ import annotations

import dataclasses
import re
import sys
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent
ALLOWLIST = HERE / "intake-allowlist.toml"

PRODUCT = "engine"
CPP_SUFFIXES = {".cpp", ".cc", ".h", ".hpp"}
BINDINGS = "engine/bindings"
# What vLLM calls on the connector every step (worker, then scheduler side).
PER_STEP = (
    "bind_connector_metadata",
    "clear_connector_metadata",
    "start_load_kv",
    "has_layer_work",
    "wait_for_layer_load",
    "save_kv_layer",
    "wait_for_save",
    "get_finished",
    "get_block_ids_with_load_errors",
    "build_connector_worker_meta",
    "get_kv_connector_stats",
    "get_num_new_matched_tokens",
    "update_state_after_alloc",
    "build_connector_meta",
    "update_connector_output",
    "request_finished",
    "has_pending_push_work",
)
IMPORT = re.compile(r"py::module_?::import\(\s*\"([^\"]+)\"|\b(PyImport_\w+)")
# A call into a Python object: an attribute called, a Python class held by the
# binding called, or the C API's call functions.
PY_CALL = re.compile(r"\.attr\(\s*\"(\w+)\"\s*\)\s*\(|\bg_classes->(\w+)\s*\(|\b(PyObject_Call\w*)\s*\(")


@dataclasses.dataclass(frozen=True)
class Finding:
    rule: int
    file: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"rule {self.rule}: {self.file}:{self.line}: {self.message}"


def load_allowlist(path: Path) -> dict:
    data = tomllib.loads(path.read_text()) if path.is_file() else {}
    for section in ("python_modules", "cpp_imports", "per_step_calls"):
        for entry in data.get(section, []):
            if not entry.get("reason", "").strip():
                raise SystemExit(f"{path.name}: an entry of [{section}] has no reason: {entry}")
    return data


def files_under(root: Path, top: str) -> list[Path]:
    skip = {"build", ".nox", "__pycache__", ".cache"}
    return sorted(p for p in (root / top).rglob("*") if p.is_file() and not skip & set(p.relative_to(root).parts))


def rule1(root: Path, allow: dict) -> list[Finding]:
    allowed = {e["path"] for e in allow.get("python_modules", [])}
    files = files_under(root, PRODUCT)
    if not files:  # a rule that finds nothing to check must not pass
        return [
            Finding(
                1, PRODUCT, 0, f"found no file under {PRODUCT}/: nothing to screen (run it on the repository's root)"
            )
        ]
    out = []
    for p in files:
        rel = p.relative_to(root).as_posix()
        if p.suffix in (".py", ".pyx", ".pyi") and rel not in allowed:
            out.append(
                Finding(
                    1,
                    rel,
                    1,
                    "a Python module in a product path: port it to the native engine, or move it out of engine/",
                )
            )
    return out


def rule2(root: Path, allow: dict) -> list[Finding]:
    allowed = {(e["file"], e["module"]) for e in allow.get("cpp_imports", [])}
    sources = [p for p in files_under(root, PRODUCT) if p.suffix in CPP_SUFFIXES]
    if not sources:
        return [
            Finding(
                2,
                PRODUCT,
                0,
                f"found no C++ source under {PRODUCT}/ ({', '.join(sorted(CPP_SUFFIXES))}): nothing to screen",
            )
        ]
    out = []
    for p in sources:
        rel = p.relative_to(root).as_posix()
        for n, line in enumerate(p.read_text().splitlines(), 1):
            for m in IMPORT.finditer(line):
                module = m.group(1) or m.group(2)
                if (rel, module) not in allowed:
                    out.append(
                        Finding(
                            2,
                            rel,
                            n,
                            f"imports Python ({module}) from C++; add it to "
                            f"ci/intake-allowlist.toml [cpp_imports] with its reason, or drop it",
                        )
                    )
    return out


def _body(text: str, open_brace: int) -> tuple[int, int]:
    depth = 0
    for i in range(open_brace, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return open_brace, i
    return open_brace, len(text)


def functions(text: str) -> dict[str, list[tuple[int, int]]]:
    """Function bodies of a binding file by name: top-level, members defined in
    their class, and members defined outside it (Class::name); every overload."""
    out: dict[str, list[tuple[int, int]]] = {}
    for m in re.finditer(
        r"^\s*[\w:<>&*, ]+?[\s&*](?:\w+::)*(\w+)\(([^;{}]*)\)\s*(?:const\s*)?"
        r"(?:->\s*[\w:<>]+\s*)?\{",
        text,
        re.MULTILINE,
    ):
        if m.group(1) not in ("if", "for", "while", "switch", "catch"):
            out.setdefault(m.group(1), []).append(_body(text, m.end() - 1))
    return out


def per_step_bodies(text: str) -> dict[str, tuple[int, int]]:
    out = {}
    for m in re.finditer(r'ns\["(\w+)"\]\s*=\s*named\(\s*"\w+",\s*\[[^\]]*\]\([^)]*\)[^{]*\{', text):
        if m.group(1) in PER_STEP:
            out[m.group(1)] = _body(text, m.end() - 1)
    return out


def rule3(root: Path, allow: dict) -> list[Finding]:
    allowed = {(e["method"], e["call"]) for e in allow.get("per_step_calls", [])}
    sources = {
        p.relative_to(root).as_posix(): p.read_text() for p in files_under(root, BINDINGS) if p.suffix in CPP_SUFFIXES
    }
    # Every binding file's helpers: a per-step method reaches helpers of other
    # files (conversions, the scheduler adapter).
    helpers: dict[str, list[tuple[str, int, int]]] = {}
    for rel, text in sources.items():
        for name, spans in functions(text).items():
            helpers.setdefault(name, []).extend((rel, start, end) for start, end in spans)
    out = []
    found: set[str] = set()
    for rel, text in sources.items():
        bodies = per_step_bodies(text)
        found |= set(bodies)
        for method, (start, end) in bodies.items():
            seen: set[str] = set()
            todo = [(rel, start, end)]
            while todo:
                file, start, end = todo.pop()
                body = sources[file][start:end]
                for m in PY_CALL.finditer(body):
                    call = next(g for g in m.groups() if g)
                    if (method, call) not in allowed:
                        line = sources[file].count("\n", 0, start + m.start()) + 1
                        out.append(
                            Finding(
                                3,
                                file,
                                line,
                                f"{method} (called by vLLM every step) reaches a "
                                f"call into Python ({call}); keep per-step paths "
                                f"native, or allowlist it with the contract that needs it",
                            )
                        )
                for name in set(re.findall(r"\b(\w+)\s*\(", body)) & set(helpers) - seen:
                    seen.add(name)
                    todo.extend(helpers[name])
    # A rule that finds nothing to check must not pass: a binding split into
    # other files or moved, or methods defined another way, would silently skip it.
    for method in sorted(set(PER_STEP) - found):
        out.append(
            Finding(
                3,
                BINDINGS,
                0,
                f"found no body of the per-step method {method} "
                f'(ns["{method}"] = named(...)) under {BINDINGS}/, so '
                f"rule 3 cannot check it: define it that way or teach "
                f"per_step_bodies the new form",
            )
        )
    return out


def screen(root: Path, allowlist: Path = ALLOWLIST) -> list[Finding]:
    allow = load_allowlist(allowlist)
    return rule1(root, allow) + rule2(root, allow) + rule3(root, allow)


def main(argv: list[str]) -> int:
    root = Path(argv[0]).resolve() if argv else HERE.parent
    allowlist = Path(argv[1]) if len(argv) > 1 else ALLOWLIST
    findings = screen(root, allowlist)
    for f in findings:
        print(f)
    print(f"intake screen: {len(findings)} finding(s) in {root.name}/", file=sys.stderr)
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
