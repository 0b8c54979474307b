"""The parity harness's units: kept under the same fingerprint with --resume,
run again under another or without it."""

import json

from pipeline.parity.__main__ import unit


def counting_run():
    calls = []

    def run():
        calls.append(1)
        return {"cells": [{"scenario": "miss", "result": "pass", "n": len(calls)}]}

    return run, calls


def test_a_unit_is_kept_under_the_same_fingerprint_with_resume(tmp_path, capsys):
    run, calls = counting_run()
    first = unit(tmp_path, "exact-default", "exact session default", False, "mark-a", run)
    again = unit(tmp_path, "exact-default", "exact session default", True, "mark-a", run)
    assert len(calls) == 1
    assert (first["kept"], again["kept"]) == (False, True)
    assert again["cells"] == first["cells"]
    assert "kept from an earlier run" in capsys.readouterr().out


def test_a_unit_of_another_fingerprint_or_without_resume_runs_again(tmp_path):
    run, calls = counting_run()
    unit(tmp_path, "exact-default", "s", False, "mark-a", run)
    other = unit(tmp_path, "exact-default", "s", True, "mark-b", run)
    assert len(calls) == 2 and other["cells"][0]["n"] == 2
    assert json.loads((tmp_path / "units" / "exact-default.json").read_text())["fingerprint"] == "mark-b"
    unit(tmp_path, "exact-default", "s", False, "mark-b", run)
    assert len(calls) == 3


def test_a_unit_that_failed_leaves_no_result_to_keep(tmp_path):
    def broken():
        raise RuntimeError("vLLM died")

    try:
        unit(tmp_path, "exact-default", "s", True, "mark-a", broken)
    except RuntimeError:
        pass
    assert not (tmp_path / "units" / "exact-default.json").exists()
