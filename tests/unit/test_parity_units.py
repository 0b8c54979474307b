"""The parity harness's units: kept under the same fingerprint with --resume,
run again under another or without it."""

import argparse
import json
import sys
import time

from pipeline.parity import __main__ as parity
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
    assert "kept (units/exact-default.json, same fingerprint)" in capsys.readouterr().out


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


def fake_job_python(tmp_path):
    """A `python` that plays one job (`-m pipeline.parity ... --units NAME`):
    logs its start and end with its compile cache, sleeps, fails for 'broken'."""
    script = tmp_path / "python"
    script.write_text(
        "#!/usr/bin/env bash\n"
        'name="${@: -1}"\n'
        f'echo "start $name $VLLM_CACHE_ROOT $(date +%s.%N) $OMP_NUM_THREADS" >> {tmp_path}/calls\n'
        "sleep 0.5\n"
        f'echo "end $name $VLLM_CACHE_ROOT $(date +%s.%N) $OMP_NUM_THREADS" >> {tmp_path}/calls\n'
        '[[ $name != broken ]] || { echo "it broke"; exit 3; }\n'
    )
    script.chmod(0o755)
    return script


def test_jobs_run_each_unit_once_at_most_n_at_a_time_each_with_a_compile_cache_of_its_own(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(sys, "executable", str(fake_job_python(tmp_path)))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(parity.os, "cpu_count", lambda: 16)
    args = argparse.Namespace(
        out=tmp_path / "out", cache=tmp_path, device="cuda", modes=["exact"], jobs=2, resume=False
    )
    names = ["a", "b", "c", "broken", "e"]
    start = time.monotonic()
    parity.run_in_jobs(args, names)
    assert time.monotonic() - start < 0.5 * len(names)  # some ran side by side
    events = [line.split() for line in (tmp_path / "calls").read_text().splitlines()]
    assert sorted(name for kind, name, *_ in events if kind == "start") == sorted(names)
    running: dict[str, str] = {}  # name: its compile cache
    most = 0
    assert {threads for *_, threads in events} == {"8"}  # the host's 16 cores shared by 2 jobs
    for kind, name, cache, _, _ in sorted(events, key=lambda e: float(e[3])):
        if kind == "start":
            assert cache not in running.values()  # no two at once share a cache
            running[name] = cache
            most = max(most, len(running))
        else:
            del running[name]
    assert most == 2
    said = capsys.readouterr().out
    assert "job broken: FAILED (exit 3; jobs/broken.log)" in said
    assert "it broke" in (tmp_path / "out" / "jobs" / "broken.log").read_text()
    assert said.count(": done in") == 4


def test_jobs_start_with_the_streaming_sessions_then_the_units_that_start_vllm_most():
    def of(name, starts, streams):
        return parity.Unit(name, name, lambda: {}, starts, streams)

    units = [of("default", 1, False), of("end-to-end", 3, False), of("streaming", 1, True), of("policy", 1, False)]
    assert parity.longest_first(units) == ["streaming", "end-to-end", "default", "policy"]
