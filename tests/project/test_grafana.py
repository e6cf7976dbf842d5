"""The Grafana dashboard (deploy/grafana/fairstream.json) asks only for metrics the worker
serves: a renamed metric cannot leave a panel silently empty."""

import json
import re
from pathlib import Path

from fairstream.streams.prometheus import WorkerMetrics

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "fairstream.json"
SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count", "_created"),
            "gauge": ("",), "unknown": ("",)}


def served() -> set[str]:
    """Every series name the worker's registry can expose (counters as ``_total``, ...)."""
    names = set()
    for family in WorkerMetrics().registry.collect():
        names.update(family.name + suffix for suffix in SUFFIXES.get(family.type, ("",)))
    return names


def queries() -> list[str]:
    document = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for panel in document["panels"] for t in panel["targets"]]
    exprs += [v["query"] for v in document["templating"]["list"] if v["type"] == "query"]
    return exprs


def test_every_query_of_the_dashboard_names_a_metric_the_worker_serves():
    names = served()
    asked = {name for expr in queries() for name in re.findall(r"\bfairstream_[a-z_]+", expr)}
    assert asked and asked <= names, sorted(asked - names)


def test_the_dashboard_shows_every_tenant_gauge_and_the_workers_health():
    asked = " ".join(queries())
    for metric in ("fairstream_tenant_share", "fairstream_tenant_pending_tasks", "fairstream_consumer_lag",
                   "fairstream_decision_latency_seconds_bucket", "fairstream_dead_letters_total",
                   "fairstream_preemptions_total", "fairstream_work_lost_task_seconds_total",
                   "fairstream_config_changes_total"):
        assert metric in asked


def test_the_check_catches_a_misspelt_metric():
    assert "fairstream_tenant_shares" not in served() and "fairstream_decisions_total" in served()
