"""Cells: one scenario in one mode, judged from the replays' observations."""

from __future__ import annotations

from dataclasses import asdict, dataclass


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
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"observation {i} ({x[0]}): {str(x[1])[:120]} != {str(y[1])[:120]}"
    if len(a) != len(b):
        return f"{len(a)} observations != {len(b)}"
    return ""


def judge(
    mode: str, scenario: str, ref1: list, ref2: list, native: list, live_differs: int = 0
) -> Cell:
    live = "live run: equal" if live_differs == 0 else f"live run: {live_differs} returns differ"
    self_diff = _first_difference(ref1, ref2)
    if self_diff:
        # The reference does not agree with itself: nothing to gate on.
        native_diff = _first_difference(ref1, native)
        return Cell(mode, scenario, False, "reported", len(ref1), live,
                    f"reference disagrees with itself: {self_diff}; native vs run 1: "
                    f"{native_diff or 'equal'}")
    diff = _first_difference(ref1, native)
    return Cell(mode, scenario, True, "FAIL" if diff else "pass", len(ref1), live, diff)


def table(cells: list[Cell]) -> str:
    rows = [("mode", "scenario", "gating", "result", "observations", "note")]
    rows += [(c.mode, c.scenario, "yes" if c.gating else "no", c.result, str(c.observations), c.note)
             for c in cells]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(r, widths)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    for c in cells:
        if c.detail:
            lines.append(f"{c.mode}/{c.scenario}: {c.detail}")
    return "\n".join(lines)
