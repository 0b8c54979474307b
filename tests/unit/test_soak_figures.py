"""The soak's figures: the process group read from /proc, slopes after warm-up."""

import os
import threading

from bench import soak


def test_the_process_group_of_this_test_is_read_from_proc():
    stop = threading.Event()
    extra = threading.Thread(target=stop.wait)
    extra.start()
    try:
        got = soak.process_figures(os.getpgrp())
    finally:
        stop.set()
        extra.join()
    assert os.getpid() in soak.group_pids(os.getpgrp())
    assert got["processes"] >= 1 and got["threads"] >= 2
    assert got["rss_bytes"] > 1 << 20 and got["open_files"] >= 3


def test_a_flat_figure_has_no_slope_and_a_creeping_one_its_rate():
    flat = [{"t_s": t, "rss_bytes": 100.0} for t in range(0, 100, 5)]
    creeping = [{"t_s": t, "rss_bytes": 100.0 + 2 * t} for t in range(0, 100, 5)]
    assert soak.slope_per_hour(flat, "rss_bytes") == 0
    assert soak.slope_per_hour(creeping, "rss_bytes") == 2 * 3600


def test_warm_up_is_left_out_of_the_slope():
    # Growth in the first quarter only (filling caches), flat after.
    samples = [{"t_s": t, "rss_bytes": min(t, 20) * 10.0} for t in range(0, 100, 2)]
    assert soak.slope_per_hour(samples, "rss_bytes") == 0


def test_too_few_samples_give_no_slope():
    assert soak.slope_per_hour([{"t_s": 0, "x": 1}, {"t_s": 10, "x": 2}], "x") is None
    assert soak.slope_per_hour([], "x") is None


def test_growth_per_thousand_requests_is_read_against_the_requests_served():
    # 2 bytes a request, at 10 requests a second.
    samples = [{"t_s": t, "requests": 10 * t, "rss_bytes": 20.0 * t} for t in range(0, 100, 5)]
    assert soak.slope_per_1k_requests(samples, "rss_bytes") == 2000


def test_the_report_names_samples_the_server_did_not_answer():
    summary = {
        "engine": "activekv-exact",
        "requests": 10,
        "duration_s": 60,
        "answered": 10,
        "cancelled": 0,
        "errors": 0,
        "idle_kv_usage": 0,
        "slopes_per_hour": {},
        "first": {},
        "last": {},
    }
    assert "missed" not in soak.report({**summary, "missed_samples": 0})
    assert "; 3 samples missed (/metrics did not answer)" in soak.report({**summary, "missed_samples": 3})
