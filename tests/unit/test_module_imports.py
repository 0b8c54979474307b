"""How pipeline's modules depend on each other: no import cycle (a cycle makes
the import order decide what works, and hides which module is the base), no
stage that imports another (a stage reads another's records through
pipeline/artifacts.py), and an operator's verify that loads no stage.

Imports are read from the source with ast, every one of them: at the top,
inside functions and under TYPE_CHECKING."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from pipeline.paths import ROOT

PACKAGE = ROOT / "pipeline"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imported(name: str, path: Path) -> Iterator[str]:
    """Every pipeline module `name` (at `path`) imports, and the packages
    above each: importing pipeline.a.b runs pipeline/a/__init__.py too."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            # `from pipeline.x import y`: y is a module of its own where there is one.
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        for target in targets:
            parts = target.split(".")
            for i in range(1, len(parts) + 1):
                if (up := ".".join(parts[:i])) in MODULES and up != name:
                    yield up


GRAPH = {name: set(imported(name, path)) for name, path in MODULES.items()}


def cycle_through(start: str) -> list[str] | None:
    """The shortest import path from `start` back to it, if there is one."""
    paths, seen = [[start]], {start}
    while paths:
        path = paths.pop(0)
        for nxt in sorted(GRAPH[path[-1]]):
            if nxt == start:
                return [*path, start]
            if nxt not in seen:
                seen.add(nxt)
                paths.append([*path, nxt])
    return None


def test_no_import_cycle_among_pipeline_modules():
    cycles, covered = [], set()
    for name in sorted(GRAPH):
        if name not in covered and (cycle := cycle_through(name)):
            covered.update(cycle)
            cycles.append(" → ".join(cycle))
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_no_stage_imports_another_stage():
    stages = {n for n in MODULES if n.startswith("pipeline.stages.")} - {"pipeline.stages.registry"}
    crossing = sorted(f"{n} imports {m}" for n in stages for m in GRAPH[n] if m in stages)
    assert not crossing, "; ".join(crossing)


def test_verify_loads_no_stage():
    """What an operator runs imports no stage, and so none of what the stages
    need: checked in a fresh interpreter, where nothing was imported yet."""
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, pipeline.verify; print(' '.join(m for m in sys.modules if m.startswith('pipeline.stages')))",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert loaded == [], f"import pipeline.verify loaded {', '.join(loaded)}"
