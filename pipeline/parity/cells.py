"""Cells: one scenario in one mode, judged from the replays' observations, and
checked against the cells expected to gate (expected.toml)."""

from __future__ import annotations

import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

EXPECTED = Path(__file__).with_name("expected.toml")


@dataclass(frozen=True)
class Cell:
    mode: str
    scenario: str
    gating: bool  # the reference agreed with itself, so the cell gates bitwise
    result: str  # "pass", "FAIL", or "reported" for a non-gating cell
    observations: int
    note: str  # replays: does the reference return what the live vLLM run did; e2e: the store
    detail: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


def _first_difference(a: list, b: list) -> str:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return f"observation {i} ({x[0]}): {str(x[1])[:120]} != {str(y[1])[:120]}"
    if len(a) != len(b):
        return f"{len(a)} observations != {len(b)}"
    return ""


def judge(mode: str, scenario: str, ref1: list, ref2: list, native: list, live_differs: int = 0) -> Cell:
    live = "live run: equal" if live_differs == 0 else f"live run: {live_differs} returns differ"
    if live_differs:
        # The replay no longer does what vLLM saw: the cell proves nothing.
        return Cell(
            mode,
            scenario,
            False,
            "FAIL",
            len(ref1),
            live,
            f"the reference's replay diverged from its live recording ({live_differs} "
            "scheduler returns differ): the recording no longer replays what vLLM ran",
        )
    self_diff = _first_difference(ref1, ref2)
    if self_diff:
        # The reference does not agree with itself: nothing to gate on.
        native_diff = _first_difference(ref1, native)
        return Cell(
            mode,
            scenario,
            False,
            "reported",
            len(ref1),
            live,
            f"reference disagrees with itself: {self_diff}; native vs run 1: {native_diff or 'equal'}",
        )
    diff = _first_difference(ref1, native)
    return Cell(mode, scenario, True, "FAIL" if diff else "pass", len(ref1), live, diff)


def expected_cells(path: Path = EXPECTED) -> tuple[set[tuple[str, str]], dict[tuple[str, str], str]]:
    """The cells expected to gate, and those known not to, with their reasons."""
    data = tomllib.loads(path.read_text())
    gating = {(c["mode"], c["scenario"]) for c in data.get("gating", [])}
    not_gating = {}
    for c in data.get("not_gating", []):
        if not str(c.get("reason", "")).strip():
            raise ValueError(f"{path.name}: not_gating cell {c.get('mode')}/{c.get('scenario')} has no reason")
        not_gating[(c["mode"], c["scenario"])] = c["reason"]
    return gating, not_gating


def expectation_problems(
    cells: Iterable[Mapping], path: Path = EXPECTED, modes: Iterable[str] | None = None
) -> list[str]:
    """Why a run's cells fall short of what is expected of them ([] when they
    do not): an expected cell that is missing or stopped gating, a cell that
    gates nowhere on record, a cell no one listed. `modes` are the modes the
    run was asked for (the harness's --modes); None, as the release's gate
    asks, means every mode the expected cells name, so evidence that left a
    mode out does not pass for it."""
    gating, not_gating = expected_cells(path)
    seen = {(c["mode"], c["scenario"]): bool(c["gating"]) for c in cells}
    modes = {mode for mode, _ in gating} if modes is None else set(modes)
    problems = []
    for cell in sorted(gating):
        if cell[0] in modes and cell not in seen:
            problems.append(f"{'/'.join(cell)} did not run")
        elif cell in seen and not seen[cell]:
            problems.append(
                f"{'/'.join(cell)} stopped gating (record why under [[not_gating]] in "
                f"pipeline/parity/{path.name}, or make the reference agree with itself)"
            )
    for cell, gates in sorted(seen.items()):
        if cell not in gating and cell not in not_gating:
            problems.append(f"{'/'.join(cell)} is a new cell: list it in pipeline/parity/{path.name}")
        elif cell in not_gating and gates:
            problems.append(f"{'/'.join(cell)} gates now: move it to [[gating]] in pipeline/parity/{path.name}")
    return problems


def table(cells: list[Cell]) -> str:
    rows = [("mode", "scenario", "gating", "result", "observations", "note")]
    rows += [(c.mode, c.scenario, "yes" if c.gating else "no", c.result, str(c.observations), c.note) for c in cells]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=False)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    for c in cells:
        if c.detail:
            lines.append(f"{c.mode}/{c.scenario}: {c.detail}")
    return "\n".join(lines)
