"""Parity cells: a replay that diverged from its live run fails, and a run's
cells are checked against the cells the repository expects to gate."""

from __future__ import annotations

import pytest

from pipeline.parity.cells import EXPECTED, expectation_problems, expected_cells, judge

OBS = [("loaded", [1, 2]), ("host store", "ab")]


def test_a_replay_that_diverged_from_its_live_run_fails_even_where_engines_agree():
    cell = judge("exact", "miss", OBS, OBS, OBS, live_differs=2)
    assert (cell.gating, cell.result) == (False, "FAIL")
    assert "diverged from its live recording (2 scheduler returns differ)" in cell.detail


def test_equal_engines_on_a_faithful_replay_pass_and_gate():
    assert (judge("exact", "miss", OBS, OBS, OBS).gating, judge("exact", "miss", OBS, OBS, OBS).result) == (
        True,
        "pass",
    )


@pytest.fixture
def expected(tmp_path):
    path = tmp_path / "expected.toml"
    path.write_text(
        '[[gating]]\nmode = "exact"\nscenario = "miss"\n\n'
        '[[gating]]\nmode = "exact"\nscenario = "full hit"\n\n'
        '[[not_gating]]\nmode = "exact"\nscenario = "mixed batch"\n'
        'reason = "vLLM batches it differently each run"\n'
    )
    return path


def cell(scenario, gating, mode="exact"):
    return {"mode": mode, "scenario": scenario, "gating": gating, "result": "pass" if gating else "reported"}


def test_cells_as_expected_have_no_problem(expected):
    assert (
        expectation_problems([cell("miss", True), cell("full hit", True), cell("mixed batch", False)], expected) == []
    )


def test_a_cell_that_stopped_gating_without_a_recorded_reason_is_a_problem(expected):
    problems = expectation_problems([cell("miss", True), cell("full hit", False), cell("mixed batch", False)], expected)
    assert len(problems) == 1 and "exact/full hit stopped gating" in problems[0]


def test_a_run_with_one_gating_cell_does_not_pass_for_all(expected):
    problems = expectation_problems([cell("miss", True)], expected)
    assert problems == ["exact/full hit did not run"]


def test_new_cells_and_cells_that_gate_again_must_be_listed(expected):
    problems = expectation_problems(
        [cell("miss", True), cell("full hit", True), cell("mixed batch", True), cell("brand new", True)], expected
    )
    assert any("exact/brand new is a new cell" in p for p in problems)
    assert any("exact/mixed batch gates now" in p for p in problems)


def test_modes_a_run_was_not_asked_for_are_not_asked_for(expected):
    assert expectation_problems([cell("miss", True, mode="compressed")], expected, modes=["compressed"]) == [
        "compressed/miss is a new cell: list it in pipeline/parity/expected.toml"
    ]


def test_evidence_that_left_a_mode_out_does_not_pass_the_gate(expected):
    # The release's gate names no modes: every mode with expected cells must be there.
    problems = expectation_problems([cell("miss", True, mode="compressed")], expected)
    assert "exact/miss did not run" in problems and "exact/full hit did not run" in problems


def test_a_not_gating_entry_needs_its_reason(tmp_path):
    path = tmp_path / "expected.toml"
    path.write_text('[[not_gating]]\nmode = "exact"\nscenario = "x"\nreason = " "\n')
    with pytest.raises(ValueError, match="exact/x has no reason"):
        expected_cells(path)


def test_the_repository_lists_every_scenario_of_both_modes():
    from pipeline.parity.workloads import sessions

    gating, not_gating = expected_cells(EXPECTED)
    listed = gating | set(not_gating)
    for mode in ("exact", "compressed"):
        scenarios = {name for s in sessions(mode) for name in s.cell_names()} | {"end to end in vLLM"}
        assert {s for m, s in listed if m == mode} == scenarios, mode
