"""Prometheus metrics of the worker, served at ``/metrics`` on ``--metrics-port`` (default 9464;
0 turns the endpoint off) with the visibility API (``streams/api.py``).

Rates (events/s, decisions/s) come from the counters with PromQL's ``rate()``.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily

from fairstream.streams.stages import StageMeter


class WorkerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.events = Counter("fairstream_events_total", "Input messages received", ["topic"], registry=self.registry)
        self.decisions = Counter("fairstream_decisions_total", "Tasks decided (a decision of several tasks counts each)", ["kind"], registry=self.registry)
        self.dead_letters = Counter("fairstream_dead_letters_total", "Inputs sent to the dead-letter topic", ["topic"],
                                    registry=self.registry)
        self.latency = Histogram(
            "fairstream_decision_latency_seconds",
            "From a batch's arrival at the worker (or, for a step held open, the arrival of the batch that "
            "opened it) to its decisions being published",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
            registry=self.registry,
        )
        self.lag = _Lag()
        self.registry.register(self.lag)
        self.stages = StageMeter()  # where batches' time goes, per stage (streams/stages.py)
        self.registry.register(self.stages)
        self.steps = Counter("fairstream_engine_steps_total", "Engine steps (scheduling passes)", registry=self.registry)
        self.internal_errors = Counter(
            "fairstream_internal_errors_total",
            "Input messages dead-lettered because applying them kept failing with an unexpected error",
            ["topic"], registry=self.registry)
        self.read_again = Counter(
            "fairstream_input_read_again_total",
            "Input messages read again from Kafka because the state store lost them (it was behind what the "
            "worker had applied)", registry=self.registry)
        self.snapshots_unreadable = Counter(
            "fairstream_snapshots_unreadable_total",
            "Engine snapshots in the store that could not be read (another version, damaged or planted); "
            "the engine was rebuilt from the retained log instead, or its cluster's events were dead-lettered",
            registry=self.registry)
        self.gc_pause = Histogram(
            "fairstream_gc_pause_seconds", "Python garbage collector passes (the worker stops meanwhile)",
            ["generation"], buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25),
            registry=self.registry,
        )

        # Preemption's cost per tenant, counted as its decisions are published (the simulator's
        # metrics.json has the same figures per run).
        self.preemptions = Counter("fairstream_preemptions_total",
                                   "Tasks of the tenant preempted (killed to give a starved tenant its fair share)",
                                   ["cluster", "tenant"], registry=self.registry)
        self.work_lost = Counter("fairstream_work_lost_task_seconds_total",
                                 "Work of the tenant's preempted tasks lost: for each, how long it had run, in "
                                 "task-seconds of event time", ["cluster", "tenant"], registry=self.registry)
        self.config_changes = Counter("fairstream_config_changes_total",
                                      "Tenant configurations (tenants.config) applied (outcome accepted) or "
                                      "dead-lettered with the reason (outcome rejected)", ["outcome"],
                                      registry=self.registry)

        # Per tenant, as of the cluster's last explanation (``--explain-interval``): what an
        # operator's dashboard plots per queue (deploy/grafana/fairstream.json).
        labels = ["cluster", "tenant"]
        self.tenant_share = Gauge("fairstream_tenant_share", "The tenant's dominant share of the cluster",
                                  labels, registry=self.registry)
        self.tenant_fair_share = Gauge("fairstream_tenant_fair_share",
                                       "The tenant's fair share (fairness.fair_shares: hierarchical, demand-capped by max_share and "
                                       "max_resources, min_share guaranteed; docs/policies.md), in the policy's measure",
                                       labels, registry=self.registry)
        self.tenant_running = Gauge("fairstream_tenant_running_tasks", "The tenant's running tasks", labels,
                                    registry=self.registry)
        self.tenant_pending = Gauge("fairstream_tenant_pending_tasks", "The tenant's pending tasks", labels,
                                    registry=self.registry)
        self.tenant_accumulated = Gauge("fairstream_tenant_accumulated_usage",
                                        "The tenant's normalised accumulated usage in the current round",
                                        labels, registry=self.registry)
        # Starvation (with preemption on: below its threshold x fair share), beside the
        # preemption counters: what an operator is paged on.
        self.starved_tenants = Gauge("fairstream_starved_tenants",
                                     "Tenants of the cluster starved now (below preemption_threshold x their fair "
                                     "share with work waiting; preemption on)", ["cluster"], registry=self.registry)
        self.tenant_starved_seconds = Gauge("fairstream_tenant_starved_seconds",
                                            "Seconds of event time the tenant has been starved (0: not starved)",
                                            labels, registry=self.registry)

    def observe_tenants(self, cluster: str, status: dict) -> None:
        """Set the per-tenant gauges from an explanation's ``status_json()``."""
        for t in status["tenants"]:
            labels = (cluster, t["tenant"])
            self.tenant_share.labels(*labels).set(max(t["share"].values(), default=0.0))
            self.tenant_fair_share.labels(*labels).set(t["fair_share"])
            self.tenant_running.labels(*labels).set(t["running"])
            self.tenant_pending.labels(*labels).set(t["pending"])
            self.tenant_accumulated.labels(*labels).set(t["accumulated"])
            since = t.get("starved_since")
            self.tenant_starved_seconds.labels(*labels).set(0.0 if since is None else max(status["time"] - since, 0.0))
        self.starved_tenants.labels(cluster).set(sum(t.get("starved_since") is not None for t in status["tenants"]))

    def count_published(self, topics: list[str], received: float, published) -> None:
        """A batch's messages (their ``topics``) published (the future ``published`` done):
        counted per topic, and the time since the earliest input its decisions answer was
        received (``time.monotonic``: the batch's arrival, or when a step it took was first
        held open) observed."""
        if published.cancelled() or published.exception() is not None:
            return
        for topic in set(topics):  # a labelled child per topic, not per message
            self.events.labels(topic).inc(topics.count(topic))
        self.latency.observe(time.monotonic() - received)

    def watch_gc(self) -> Callable[[], None]:
        """Observe every collector pass in ``gc_pause``; returns what stops observing.
        A full pass stops the worker for as long as it walks the long-lived objects, so its
        length shows directly in the decision latency (docs/architecture.md)."""
        started = [0.0]
        children = {str(g): self.gc_pause.labels(str(g)) for g in range(3)}

        def observe(phase: str, info: dict) -> None:
            if phase == "start":
                started[0] = time.perf_counter()
            else:
                children[str(info["generation"])].observe(time.perf_counter() - started[0])

        gc.callbacks.append(observe)
        return lambda: gc.callbacks.remove(observe)

    def watch_lag(self, source: Callable[[], dict[tuple[str, int], int]]) -> None:
        """Report ``source()`` as ``fairstream_consumer_lag`` at every scrape: per input
        partition this worker consumes, the messages Kafka holds that are not applied yet."""
        self.lag.source = source


class _Lag:
    """``fairstream_consumer_lag``, computed when scraped (a gauge set per batch went stale:
    on a partition that went quiet it kept the backlog of its last batch)."""

    def __init__(self) -> None:
        self.source: Callable[[], dict[tuple[str, int], int]] = dict

    def collect(self):
        family = GaugeMetricFamily(
            "fairstream_consumer_lag",
            "Input messages in Kafka not applied yet, per partition this worker consumes (the partition's end "
            "as of the consumer's last fetch, less the next offset to apply)", labels=["topic", "partition"])
        for (topic, partition), lag in sorted(self.source().items()):
            family.add_metric([topic, str(partition)], lag)
        yield family

