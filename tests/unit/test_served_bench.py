"""The served benchmark's parts that need no server: workloads, arrivals,
the records' resumption, the metrics parser, the report's arithmetic."""

from __future__ import annotations

import importlib
import json
import statistics
import time
from dataclasses import replace
from pathlib import Path

import pytest

from bench import runs
from bench.served import __main__ as served
from bench.served import report, runner, server
from bench.served import workloads as wl
from bench.served.engines import ENGINES, with_options

W = wl.scaled(wl.WORKLOADS["doc-qa"], documents=5, document_tokens=(50, 80), requests=12)
VOCAB = 1000


def test_prompts_are_the_same_for_every_engine_and_differ_between_users_and_rates():
    m = wl.WORKLOADS["multi-turn"]
    assert wl.conversation_opening(m, VOCAB, 1.0, 3) == wl.conversation_opening(m, VOCAB, 1.0, 3)
    assert wl.conversation_opening(m, VOCAB, 1.0, 3) != wl.conversation_opening(m, VOCAB, 1.0, 4)
    assert wl.conversation_opening(m, VOCAB, 1.0, 3) != wl.conversation_opening(m, VOCAB, 2.0, 3)
    opening = wl.conversation_opening(m, VOCAB, 1.0, 3)
    # Every user opens with the one shared system prompt, then a history in range.
    assert opening[: m.system_tokens] == wl.system_prompt(m, VOCAB)
    assert m.history_tokens[0] <= len(opening) - m.system_tokens <= m.history_tokens[1]
    assert all(wl.FIRST_ID <= t < VOCAB for t in opening)


def test_documents_are_asked_again_in_random_order():
    order = wl.document_order(W, 1.0)
    assert len(order) == W.requests
    # shuffled passes: each document once before any is asked again
    for start in range(0, W.requests - W.documents + 1, W.documents):
        assert sorted(order[start : start + W.documents]) == list(range(W.documents))
    assert order != sorted(order)
    assert wl.document(W, VOCAB, 2) == wl.document(W, VOCAB, 2) != wl.document(W, VOCAB, 3)


def test_arrivals_are_poisson_at_the_rate():
    gaps = wl.arrival_gaps(W, 4.0, 20000)
    assert statistics.mean(gaps) == pytest.approx(0.25, rel=0.03)
    # exponential: the standard deviation equals the mean
    assert statistics.stdev(gaps) == pytest.approx(statistics.mean(gaps), rel=0.05)
    assert wl.arrival_gaps(W, 0.0, 3) == [0.0, 0.0, 0.0]


def test_working_set_against_the_budgets():
    # The shipped sizes keep the GPU's budget at a quarter or less of the
    # working set where the host tier is meant to serve, and all of it where not.
    kv_per_token = 32 * 8 * 128 * 2 * 2  # Llama-3-8B geometry, bf16
    for name in ("multi-turn", "doc-qa"):
        w = wl.WORKLOADS[name]
        ws = w.working_set_tokens() * kv_per_token
        assert w.kv_budget_gib * (1 << 30) <= ws / 4, name
        assert w.host_gib * (1 << 30) >= ws, name
    for name in ("multi-turn-fits", "doc-qa-fits"):
        w = wl.WORKLOADS[name]
        assert w.working_set_tokens() * kv_per_token <= w.kv_budget_gib * (1 << 30), name


def test_set_parses_ranges_and_refuses_unknown_keys():
    w = served.workload_with(wl.WORKLOADS["multi-turn"], ["users=3,history_tokens=10-20", "turns=2"], "1,2.5")
    assert (w.users, w.turns, w.history_tokens, w.rates) == (3, 2, (10, 20), (1.0, 2.5))
    with pytest.raises(SystemExit, match="no workload parameter 'userz'"):
        served.workload_with(wl.WORKLOADS["multi-turn"], ["userz=3"], None)


def test_engines_get_the_same_host_bytes():
    host = 3 << 30
    for name in ("activekv-exact", "vllm-offloading"):
        (flag, text) = ENGINES[name].server_args(host)
        assert flag == "--kv-transfer-config"
        assert host in json.loads(text)["kv_connector_extra_config"].values()
    assert ENGINES["lmcache"].server_env(host)["LMCACHE_MAX_LOCAL_CPU_SIZE"] == "3"
    assert ENGINES["lmcache"].server_env(host)["PYTHONHASHSEED"] == "0"
    assert ENGINES["plain"].server_args(host) == []
    assert with_options(ENGINES["activekv-exact"], {"store_threshold": 2}).extra["store_threshold"] == 2
    with pytest.raises(ValueError, match="plain has no connector"):
        with_options(ENGINES["plain"], {"x": 1})


def test_the_null_connector_is_loaded_from_this_checkout_by_its_module_path():
    (flag, text) = ENGINES["null-connector"].server_args(3 << 30)
    config = json.loads(text)
    assert (flag, config["kv_connector"]) == ("--kv-transfer-config", "NullConnector")
    module = importlib.import_module(config["kv_connector_module_path"])  # vllm serve imports it so
    assert module.NullConnector.__name__ == config["kv_connector"]


def test_metrics_are_summed_over_labels():
    text = (
        "# HELP vllm:prefix_cache_hits_total x\n"
        'vllm:prefix_cache_hits_total{engine="0",model_name="bench"} 10.0\n'
        'vllm:prefix_cache_hits_total{engine="1",model_name="bench"} 5.0\n'
        'vllm:num_requests_running{engine="0"} 3\n'
    )
    text += (
        'vllm:prompt_tokens_cached_by_source_total{engine="0",source="device"} 7.0\n'
        'vllm:prompt_tokens_cached_by_source_total{engine="0",source="host"} 2.0\n'
        'vllm:prompt_tokens_cached_by_source_total{engine="1",source="host"} 1.0\n'
    )
    assert server.parse_metrics(text) == {
        "vllm:prefix_cache_hits_total": 15.0,
        "vllm:num_requests_running": 3.0,
        "vllm:prompt_tokens_cached_by_source_total": 10.0,
        "vllm:prompt_tokens_cached_by_source_total{source=device}": 7.0,
        "vllm:prompt_tokens_cached_by_source_total{source=host}": 3.0,
    }
    delta = runner.counters_delta(
        {"vllm:prefix_cache_hits_total": 4.0, "vllm:prompt_tokens_cached_by_source_total{source=host}": 1.0},
        {
            "vllm:prefix_cache_hits_total": 15.0,
            "vllm:prefix_cache_hits_created": 9.0,
            "vllm:prompt_tokens_cached_by_source_total{source=host}": 3.0,
            "vllm:prompt_tokens_cached_by_source_created{source=host}": 5.0,
        },
    )
    assert delta == {
        "vllm:prefix_cache_hits_total": 11.0,
        "vllm:prompt_tokens_cached_by_source_total{source=host}": 2.0,
    }


def test_each_requests_phases_come_from_vllms_histograms_over_the_point():
    text = (
        'vllm:request_queue_time_seconds_bucket{engine="0",le="0.3"} 4.0\n'
        'vllm:request_queue_time_seconds_sum{engine="0"} 2.5\n'
        'vllm:request_queue_time_seconds_count{engine="0"} 5.0\n'
        'vllm:request_prefill_time_seconds_sum{engine="0"} 1.5\n'
        'vllm:request_prefill_time_seconds_count{engine="0"} 5.0\n'
        'vllm:request_decode_time_seconds_sum{engine="0"} 12.0\n'
        'vllm:request_decode_time_seconds_count{engine="0"} 5.0\n'
    )
    before = {
        "vllm:request_queue_time_seconds_sum": 0.5,
        "vllm:request_queue_time_seconds_count": 1.0,
        "vllm:request_prefill_time_seconds_sum": 0.3,
        "vllm:request_prefill_time_seconds_count": 1.0,
        "vllm:request_decode_time_seconds_sum": 2.0,
        "vllm:request_decode_time_seconds_count": 1.0,
    }
    delta = runner.counters_delta(before, server.parse_metrics(text))
    assert "vllm:request_queue_time_seconds_bucket" not in delta  # buckets summed over le mean nothing
    # Four requests over the point: 2 s queued, 1.2 s in prefill, 10 s decoding.
    assert report.request_phases(delta) == {"queue": 500.0, "prefill": 300.0, "decode": 2500.0}
    assert report.request_phases({"vllm:prefix_cache_hits_total": 1.0}) is None


def test_percentile_is_numpys():
    np = pytest.importorskip("numpy")
    xs = [0.3, 0.1, 0.9, 0.5, 0.7, 0.2, 0.25]
    for q in (50, 90, 99):
        assert report.percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)))


def _request(rate, i, ttft, out=4, **extra):
    return {
        "type": "request",
        "phase": "measured",
        "rate": rate,
        "sent": i * 0.5,
        "ttft_s": ttft,
        "latency_s": ttft + 0.3,
        "tpot_s": 0.1,
        "output_tokens": out,
        "prompt_tokens": 100,
        "user": i,
        "turn": 0,
        "output_sha": f"a{i}",
        **extra,
    }


def _write(records, engine, rate, ttfts, counters, device="GPU-X", shas=None):
    path = runner.records_path(records, "multi-turn", engine)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [{"type": "run", "engine": engine, "workload": {"name": "multi-turn"}, "machine": {"device": device}}]
    lines += [_request(rate, i, t, output_sha=(shas or {}).get(i, f"a{i}")) for i, t in enumerate(ttfts)]
    lines.append({"type": "point", "rate": rate, "counters": counters})
    with path.open("a") as f:
        f.writelines(json.dumps(x) + "\n" for x in lines)
    return path


def test_report_hit_shares_answers_and_the_best_peer(tmp_path):
    _write(
        tmp_path,
        "plain",
        2.0,
        [0.4, 0.5, 0.6],
        {"vllm:prefix_cache_queries_total": 1000, "vllm:prefix_cache_hits_total": 200},
    )
    _write(
        tmp_path,
        "vllm-offloading",
        2.0,
        [0.2, 0.3, 0.4],
        {
            "vllm:prefix_cache_queries_total": 1000,
            "vllm:prefix_cache_hits_total": 200,
            "vllm:external_prefix_cache_hits_total": 300,
        },
    )
    _write(
        tmp_path,
        "activekv-exact",
        2.0,
        [0.1, 0.1, 0.2],
        {
            "vllm:prefix_cache_queries_total": 1000,
            "vllm:prefix_cache_hits_total": 200,
            "vllm:external_prefix_cache_hits_total": 700,
            "vllm:prompt_tokens_cached_by_source_total{source=host}": 700,
            "vllm:prompt_tokens_cached_by_source_total{source=disk}": 0,
        },
        shas={1: "other"},
    )
    table = report.load(tmp_path)
    engines = table[("multi-turn", "GPU-X")]
    assert list(engines) == ["plain", "activekv-exact", "vllm-offloading"]  # engines.py's order
    exact = engines["activekv-exact"][2.0]
    assert (exact["gpu_hit_pct"], exact["host_hit_pct"]) == (20.0, 70.0)
    assert exact["same_answers"] == "2/3"
    assert exact["cached_by_source"] == {"host": 700}
    assert exact["ttft_p50_ms"] == 100.0
    lines = report.against_peers(engines, "multi-turn")
    (i,) = [n for n, x in enumerate(lines) if x.startswith("- activekv-exact")]
    # ActiveKV's TTFT p50 of 100 ms over each peer's (vllm-offloading's 300 ms)
    plain_ratio = 100 / engines["plain"][2.0]["ttft_p50_ms"]
    assert f"ttft_p50 {plain_ratio:.2f}x plain, 0.33x vllm-offloading" in lines[i]
    assert lines[i + 1].startswith("  goals: ttft_p50 below every peer's: met")


def test_resumption_counts_only_whole_rate_points(tmp_path):
    path = _write(tmp_path, "plain", 1.0, [0.1], {})
    with path.open("a") as f:  # a rate point cut off: requests, no "point" line
        f.write(json.dumps(_request(2.0, 0, 0.1)) + "\n")
    assert runner.rates_done(path) == {1.0}


def test_connector_time_from_activekv_counters():
    counters = {
        "vllm:activekv_load_us_total": 20000.0,
        "vllm:activekv_bytes_to_device_total": 1e9,
        "vllm:activekv_save_us_total": 0.0,
        "vllm:activekv_hit_tokens_total": 640.0,
    }
    c = report.connector_time(counters, requests=10)
    assert c["load_ms_a_request"] == 2.0
    assert c["load_gbps"] == 50.0  # 1 GB in 20 ms
    assert c["save_gbps"] is None and c["hit_tokens"] == 640.0
    assert report.connector_time({"vllm:prefix_cache_hits_total": 3.0}, requests=10) is None


def test_connector_note_says_how_many_blocks_loaded_asynchronously_where_the_engine_counted_them():
    counters = {"vllm:activekv_loaded_blocks_total": 300.0, "vllm:activekv_load_us_total": 1.0}
    before_the_counter = report._connector_note(report.connector_time(counters, requests=3))
    assert "300 blocks loaded," in before_the_counter and "asynchronously" not in before_the_counter
    counters["vllm:activekv_async_loaded_blocks_total"] = 280.0
    assert "300 blocks loaded (280 asynchronously)" in report._connector_note(
        report.connector_time(counters, requests=3)
    )


def test_connector_time_derives_no_rate_from_a_gpus_issue_time():
    # On a GPU load_us counts the worker issuing copies that run on a copy
    # stream: 105 GB in 142 ms would read as 741 GB/s, past any bus.
    counters = {"vllm:activekv_load_us_total": 142279.0, "vllm:activekv_bytes_to_device_total": 105.5e9}
    c = report.connector_time(counters, requests=32, on_gpu=True)
    assert c["load_ms_a_request"] == 4.45 and c["load_gbps"] is None and c["copies_on_a_stream"]
    assert report.connector_time(counters, requests=32)["load_gbps"] == pytest.approx(741.5, abs=0.1)


@pytest.mark.parametrize(
    ("machine", "says"),
    [
        ({"device": "NVIDIA H200"}, "loads 142.28 ms a request issuing copies, saves"),  # before "cuda" was written
        ({"device": "GPU-X", "cuda": True}, "loads 142.28 ms a request issuing copies, saves"),
        ({"device": "x86_64", "cuda": False}, "GB/s while loading"),
    ],
)
def test_report_says_what_the_workers_time_is_on_each_machine(tmp_path, machine, says):
    path = _write(
        tmp_path,
        "activekv-exact",
        2.0,
        [0.1],
        {"vllm:activekv_load_us_total": 142279.0, "vllm:activekv_bytes_to_device_total": 105.5e9},
        device=machine["device"],
    )
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    lines[0]["machine"] = machine
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    (line,) = [x for x in report.markdown(report.load(tmp_path)).splitlines() if "workers' time" in x]
    assert says in line
    assert ("GB/s" in line) == (not machine.get("cuda", machine["device"].startswith("NVIDIA")))


def test_host_bytes_are_split_as_each_tier_counts_them():
    host = 8 << 30
    extra = lambda name: json.loads(ENGINES[name].server_args(host, workers=2)[1])["kv_connector_extra_config"]  # noqa: E731
    assert extra("activekv-exact")["capacity_bytes"] == host // 2  # per worker
    assert extra("vllm-offloading")["cpu_bytes_to_use"] == host  # vLLM's total
    assert ENGINES["lmcache"].server_env(host, workers=2)["LMCACHE_MAX_LOCAL_CPU_SIZE"] == "4"  # per process
    assert extra("activekv-streaming")["streaming"] == {"resident_layers": 14, "ring_size": 2}


def _run_line(**changes):
    line = {
        "type": "run",
        "engine": "plain",
        "workload": {"name": "multi-turn", "users": 8, "rates": [1.0]},
        "server_args": ["--block-size", "16"],
        "server_env": {},
        "workers": 1,
        "machine": {"device": "GPU-X", "vllm": "0.26.0", "host": "a"},
    }
    for key, value in changes.items():
        line[key] = {**line[key], **value} if isinstance(value, dict) else value
    return line


def test_records_of_another_setup_are_refused_naming_what_differs(tmp_path):
    path = tmp_path / "plain.jsonl"
    path.write_text(json.dumps(_run_line()) + "\n")
    # Other rates, another host name of the same kind of machine: one sweep.
    runner.check_same_setup(path, _run_line(workload={"rates": [2.0]}, machine={"host": "b"}))
    with pytest.raises(RuntimeError, match=r"machine\.device, workload\.users differ"):
        runner.check_same_setup(path, _run_line(workload={"users": 4}, machine={"device": "GPU-Y"}))
    with pytest.raises(RuntimeError, match=r"server\.args differ"):
        runner.check_same_setup(path, _run_line(server_args=["--block-size", "64"]))


def test_stop_ends_the_servers_group_even_after_its_leader_exited(tmp_path):
    import os
    import subprocess
    import time

    s = server.Server(tmp_path, [], {}, tmp_path / "log")
    child = tmp_path / "child"
    # The leader exits at once and leaves a child behind, as an API server
    # that died would leave its engine core.
    s.process = subprocess.Popen(["sh", "-c", f"sleep 300 & echo $! > {child}"], start_new_session=True)
    s.process.wait()
    pid = int(child.read_text())
    os.kill(pid, 0)  # alive
    s.stop()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
            # dead but not yet reaped by its new parent counts as ended
            if (Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]) == "Z":
                break
        except (ProcessLookupError, FileNotFoundError):
            break
        time.sleep(0.05)
    else:
        pytest.fail("the leader's child outlived stop()")


def _iteration(i, ctx_requests, ctx_tokens, gen_requests, ms, dummy=False):
    return (
        f"(APIServer pid=1) INFO 12-07 06:21:02 [loggers.py:199] Iteration({i}): {ctx_requests} context requests, "
        f"{ctx_tokens} context tokens, {gen_requests} generation requests, {gen_requests} generation tokens, "
        f"iteration elapsed time: {ms:.2f} ms{' (dummy)' if dummy else ''}, GPU KV cache usage: 50.0%\n"
    )


def test_step_times_split_the_points_iterations_by_whether_they_took_prompt_tokens(tmp_path):
    before = _iteration(0, 1, 25000, 0, 900.0)  # the warm-up's prefill: outside the point
    inside = [
        _iteration(1, 1, 30, 3, 70.0),  # a request admitted beside three decoding
        _iteration(2, 0, 0, 4, 20.0),
        _iteration(3, 0, 0, 4, 22.0),
        _iteration(4, 0, 0, 0, 5.0, dummy=True),
        _iteration(5, 0, 0, 4, 24.0),
        "(APIServer pid=1) INFO 12-07 06:21:02 [loggers.py:335] Engine 000: Avg prompt throughput: 1.0 tokens/s\n",
    ]
    log = tmp_path / "activekv-exact.server.log"
    log.write_text(before + "".join(inside) + _iteration(6, 2, 60, 2, 500.0))
    start = len(before.encode())
    t = report.step_times(log, start, start + len("".join(inside).encode()))
    assert (t["prompt_steps"], t["prompt_step_p50_ms"]) == (1, 70.0)
    assert (t["decode_steps"], t["decode_step_p50_ms"], t["decode_step_p90_ms"]) == (3, 22.0, 23.6)
    assert t["prompt_share"] == round(70 / (70 + 20 + 22 + 24), 3)
    assert report.step_times(log, 0, 0) is None  # no iteration in the range
    assert report.step_times(tmp_path / "absent.log", 0, 10) is None


def test_report_times_the_steps_of_a_point_from_its_servers_log(tmp_path):
    path = _write(tmp_path, "activekv-exact", 2.0, [0.1], {})
    path.with_suffix(".server.log").write_text(_iteration(1, 1, 30, 3, 70.0) + _iteration(2, 0, 0, 4, 20.0))
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    lines[-1]["server_log"] = [0, path.with_suffix(".server.log").stat().st_size]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    text = report.markdown(report.load(tmp_path))
    assert "- activekv-exact at 2/s, vLLM's steps: 1 decode-only, p50 20.0 ms" in text
    assert "1 taking in prompt tokens, p50 70.0 ms" in text


def test_the_core_reservation_is_every_servers_unless_vllm_keeps_its_own():
    assert runs.reserved_cpus_env("1") == {"VLLM_CPU_NUM_OF_RESERVED_CPU": "1"}
    assert runs.reserved_cpus_env("vllm") == {}


def _figures(ttft_p50, ttft_p99, tpot_p50=10.0, tok_s=100.0, host_hit_pct=90.0):
    return {
        "ttft_p50_ms": ttft_p50,
        "ttft_p99_ms": ttft_p99,
        "tpot_p50_ms": tpot_p50,
        "output_tok_s": tok_s,
        "host_hit_pct": host_hit_pct,
    }


def test_goals_hold_activekv_below_every_peer_and_1_5x_below_the_best():
    peers = {"vllm-offloading": _figures(300.0, 900.0, tok_s=100.0), "plain": _figures(2000.0, 5000.0, tok_s=50.0)}
    met = report.goals(_figures(200.0, 600.0, tok_s=100.0), peers)
    assert met == [
        "ttft_p50 below every peer's: met",
        "ttft_p50 1.5x below the best peer's (1.50x): met",
        "ttft_p99 below every peer's: met",
        "ttft_p99 1.5x below the best peer's (1.50x): met",
        "throughput at least the best peer's: met",
    ]
    short = report.goals(_figures(250.0, 950.0, tok_s=99.0), peers)
    assert short == [
        "ttft_p50 below every peer's: met",
        "ttft_p50 1.5x below the best peer's (1.20x): not met",
        "ttft_p99 below every peer's: not met",
        "ttft_p99 1.5x below the best peer's (0.95x): not met",
        "throughput at least the best peer's: not met",
    ]
    # Where the host tier serves few hits, the 1.5x margin is not asked.
    assert not any("1.5x" in v for v in report.goals(_figures(250.0, 950.0, host_hit_pct=10.0), peers))


def test_where_everything_fits_activekv_is_held_within_2_percent_of_plain():
    plain = {"plain": _figures(100.0, 200.0, tpot_p50=10.0, tok_s=100.0)}
    assert report.fits_goal(_figures(101.9, 203.0, tpot_p50=10.1, tok_s=98.5), plain) == [
        "within 2% of plain vLLM on every figure: met"
    ]
    (verdict,) = report.fits_goal(_figures(103.0, 200.0, tpot_p50=10.0, tok_s=97.0), plain)
    assert verdict == "within 2% of plain vLLM on every figure (ttft_p50 1.030x, output_tok_s 0.970x): not met"
    (verdict,) = report.fits_goal(_figures(100.0, 200.0), {"vllm-offloading": _figures(1.0, 1.0)})
    assert verdict.endswith("no figure")


def test_a_rate_point_is_started_only_if_its_arrivals_fit_the_budget(capsys):
    w = replace(wl.WORKLOADS["multi-turn"], users=10, turns=3)  # 30 requests a point
    assert w.least_point_s(2.0) == 15.0
    assert replace(wl.WORKLOADS["doc-qa"], requests=40).least_point_s(4.0) == 10.0
    assert wl.WORKLOADS["long-streaming"].least_point_s(0.0) == 0.0  # a burst
    now = time.monotonic()
    assert runner.fits_before(None, w, 2.0, "e")
    assert runner.fits_before(now + 60, w, 2.0, "e")
    assert not runner.fits_before(now + 10, w, 2.0, "e")
    assert "rate 2 left for a later run (its arrivals take 15 s, 10 s of --budget-s left)" in capsys.readouterr().out


def test_a_sweep_with_no_time_left_starts_no_server(tmp_path, capsys):
    w = replace(wl.WORKLOADS["multi-turn"], users=10, turns=3, rates=(1.0,))
    path = runner.run_sweep(
        records=tmp_path,
        model_dir=tmp_path / "no-model",
        vocab=100,
        w=w,
        engine=ENGINES["plain"],
        server_args=[],
        start_timeout_s=1,
        deadline=time.monotonic() + 5,
    )
    assert not path.exists()
    assert "rate 1 left for a later run" in capsys.readouterr().out
