"""docs/metrics.md and the Grafana dashboard name only what the engine exports,
and every name it exports is documented with its type."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "metrics.md"
DASHBOARD = ROOT / "docs" / "grafana" / "activekv-dashboard.json"
NAME = re.compile(r"vllm:activekv_[a-z0-9_]+")
ROW = re.compile(r"^\|\s*`(vllm:activekv_[a-z0-9_]+)`\s*\|\s*(counter|gauge|info)\s*\|", re.M)


def telemetry_names() -> dict:
    """The engine's names: from the built module, else from the reference's
    lists (test_telemetry.py holds the two equal)."""
    try:
        import torch  # noqa: F401  (before activekv, which links against torch's libraries)
        import activekv

        return activekv.telemetry_names()
    except ImportError:
        from activekv_reference import stats

        return {
            "counters": stats.COUNTERS,
            "gauges": stats.GAUGES,
            "info": {"name": stats.CONFIG_INFO, "labels": list(stats.CONFIG_INFO_LABELS)},
        }


def exported() -> dict[str, str]:
    """Every Prometheus name the engine exports, with its type."""
    names = telemetry_names()
    out = {f"vllm:activekv_{n}_total": "counter" for n in names["counters"]}
    out.update({f"vllm:activekv_{n}": "gauge" for n in names["gauges"]})
    out[f"vllm:activekv_{names['info']['name']}"] = "info"
    return out


def queries(node) -> list[str]:
    """Every PromQL expression of the dashboard: its panels' and its variables'."""
    found = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("expr", "definition") and isinstance(value, str):
                found.append(value)
            elif key == "query" and isinstance(value, str):
                found.append(value)
            else:
                found.extend(queries(value))
    elif isinstance(node, list):
        for item in node:
            found.extend(queries(item))
    return found


def test_every_exported_name_is_documented_with_its_type():
    documented = dict(ROW.findall(DOC.read_text()))
    names = exported()
    assert sorted(set(names) - set(documented)) == [], "exported but not in docs/metrics.md"
    assert sorted(set(documented) - set(names)) == [], "in docs/metrics.md but not exported"
    assert {n: documented[n] for n in names} == names, "a type in docs/metrics.md is not the exported one"


def test_the_doc_names_only_exported_metrics_and_every_config_label():
    names = exported()
    text = DOC.read_text()
    assert sorted(set(NAME.findall(text)) - set(names)) == []
    info_row = next(line for line in text.splitlines() if line.startswith("| `vllm:activekv_config_info`"))
    labels = telemetry_names()["info"]["labels"]
    assert [label for label in labels if label not in info_row] == []
    assert [label for label in labels if f"| `{label}` |" not in text] == [], "a config label has no row"


def test_the_dashboard_queries_only_exported_metrics():
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = queries(dashboard)
    used = {n for e in exprs for n in NAME.findall(e)}
    assert used, "no ActiveKV metric in the dashboard's queries"
    assert sorted(used - set(exported())) == [], "the dashboard queries a name the engine does not export"
    # A counter is read through rate() or increase(), never as a level.
    for e in exprs:
        for name in NAME.findall(e):
            if name.endswith("_total"):
                assert re.search(rf"(rate|increase)\(\s*{re.escape(name)}", e), e


def test_the_dashboard_shows_what_an_operator_runs_by():
    used = {n for e in queries(json.loads(DASHBOARD.read_text())) for n in NAME.findall(e)}
    for name in (
        "store_used_bytes",
        "store_capacity_bytes",
        "hit_tokens_total",
        "lookup_tokens_total",
        "bytes_to_device_total",
        "bytes_to_host_total",
        "streamed_bytes_to_device_total",
        "streamed_bytes_to_host_total",
        "load_us_total",
        "save_us_total",
        "streamed_step_bytes_to_device",
        "streamed_step_bytes_to_host",
        "evicted_blocks_total",
        "async_loaded_blocks_total",
        "quarantined_fences_total",
        "config_info",
    ):
        assert f"vllm:activekv_{name}" in used, name


def test_the_dashboard_says_each_key_once():
    """Grafana keeps a repeated key's last value and drops the others unseen."""

    def once(pairs):
        keys = [k for k, _ in pairs]
        assert len(keys) == len(set(keys)), f"repeated keys {sorted({k for k in keys if keys.count(k) > 1})}"
        return dict(pairs)

    json.loads(DASHBOARD.read_text(), object_pairs_hook=once)
