"""config_examples/grafana_energy_router.json queries only series the code registers (no drift)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client import REGISTRY

import litellm_energy_router.metrics  # noqa: F401 - registers every energy_router_* metric

DASHBOARD = Path(__file__).resolve().parents[1] / "config_examples/grafana_energy_router.json"
SUFFIXES = {"counter": ("_total", "_created"), "gauge": ("",), "histogram": ("_bucket", "_count", "_sum", "_created")}
PROMQL_FUNCTIONS = {"sum", "min", "max", "avg", "rate", "increase", "histogram_quantile"}


def registered_series() -> set[str]:
    """Sample names of the energy_router_* metrics in the default registry (what /metrics serves)."""
    return {f.name + s for f in REGISTRY.collect() if f.name.startswith("energy_router_") for s in SUFFIXES[f.type]}


def series_in(expr: str) -> tuple[set[str], set[str]]:
    """(metric names, function names) an expression uses."""
    bare = re.sub(r"\{[^}]*\}|\[[^\]]*\]|\b(?:by|without)\s*\([^)]*\)|\$\w+|\b\d+(?:\.\d+)?\b", " ", expr)
    names = set(re.findall(r"[A-Za-z_:][\w:]*(?=\s*\()", bare))
    return set(re.findall(r"[A-Za-z_:][\w:]*", bare)) - names, names


def panels(items: list[dict]) -> list[dict]:
    return [q for p in items for q in (p, *panels(p.get("panels", [])))]


def test_dashboard_uses_registered_metrics_only():
    dash = json.loads(DASHBOARD.read_text())
    assert [v["type"] for v in dash["templating"]["list"]] == ["datasource"]
    known, used = registered_series(), set()
    for p in panels(dash["panels"]):
        if p["type"] == "row":
            continue
        assert p["datasource"]["uid"] == "${datasource}" and p["targets"], p["title"]
        for t in p["targets"]:
            metrics, functions = series_in(t["expr"])
            assert metrics and metrics <= known, (p["title"], metrics - known)
            assert functions <= PROMQL_FUNCTIONS, (p["title"], functions - PROMQL_FUNCTIONS)
            used |= metrics
    for name in (
        "request_joules_sum",
        "decisions_total",
        "decision_seconds_bucket",
        "fallbacks_total",
        "spool_backlog_rows",
        "reloads_total",
        "checkpoint_load_seconds_sum",
    ):
        assert f"energy_router_{name}" in used
    assert len({p["id"] for p in panels(dash["panels"])}) == len(panels(dash["panels"]))


def test_series_in_reads_promql():
    expr = (
        'histogram_quantile(0.99, sum by (le) (rate(energy_router_decision_seconds_bucket{job="x"}[$__rate_interval])))'
    )
    assert series_in(expr) == ({"energy_router_decision_seconds_bucket"}, {"histogram_quantile", "sum", "rate"})
    assert registered_series() >= {
        "energy_router_decisions_total",
        "energy_router_checkpoint_load_seconds_bucket",
        "energy_router_spool_backlog_rows",
    }
