"""How pipeline's modules depend on each other: no stage imports another (a
stage reads another's records through pipeline/artifacts.py).

Imports are read from the source with ast, every one of them: at the top,
inside functions and under TYPE_CHECKING."""

from __future__ import annotations

import ast
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


def test_no_stage_imports_another_stage():
    stages = {n for n in MODULES if n.startswith("pipeline.stages.")} - {"pipeline.stages.registry"}
    crossing = sorted(f"{n} imports {m}" for n in stages for m in GRAPH[n] if m in stages)
    assert not crossing, "; ".join(crossing)
