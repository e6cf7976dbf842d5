"""Stage two of a batch (``Processor``): each cluster's events through its engine, and into the
batch's commit what they changed: log steps, decisions (the outbox), operator views, the
cluster's explanation, a snapshot when one is due. No store or broker here: the commit is
written by the processor."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import structlog

from fairstream.core.explain import explain, node_status
from fairstream.core.forecast import WORKER_STEPS, WORKER_TASKS
from fairstream.core.model import DecisionKind, Event
from fairstream.state.engine_snapshot import SnapshotError
from fairstream.state.store import BatchCommit
from fairstream.streams import snapshots
from fairstream.streams.decoding import dead_letter, held_step
from fairstream.streams.incoming import Incoming
from fairstream.streams.journal import held_from
from fairstream.streams.prometheus import WorkerMetrics
from fairstream.streams.session import ClusterSession, Sessions
from fairstream.streams.snapshots import SnapshotRules
from fairstream.streams.stepper import StepRules, run_steps
from fairstream.streams.views import touched_nodes, views
from fairstream.wire.events import CONFIG, DeadLetter, decision_message
from fairstream.wire.jsoncodec import dumps_text, loads
from fairstream.wire.log import events_in
from fairstream.wire.topics import Topics
from fairstream.wire.visibility import DEFAULT_MAX_ENTRIES, history_sample, stored_views

log = structlog.get_logger("fairstream.worker")


@dataclass
class BatchOutcome:
    decisions: int = 0
    dead_letters: int = 0
    skipped: int = 0
    steps: int = 0
    reasons: list[str] = field(default_factory=list)
    config_accepted: int = 0  # tenants.config events applied
    # When the earliest step this batch took that an earlier batch held open was first held
    # (time.monotonic): its decisions answer input that came before this batch.
    held_since: float | None = None


#: A batch committed, as the pipeline hands it on: its outcome, its outbox and the task that
#: enqueues its outputs (``Outputs.enqueue_in_order``), which resolves to their acknowledgements.
Enqueued = tuple[BatchOutcome, list[tuple[str, dict]], asyncio.Task]


@dataclass(frozen=True)
class Applied:
    """A batch applied and committed (``outcome``); ``published`` resolves once the broker has
    its outputs and they are cleared from the outbox (or fails with what went wrong)."""

    outcome: BatchOutcome
    published: asyncio.Future


@dataclass
class Stepping:
    """How the worker steps its clusters: the rules of time (``stepper.py``), of snapshots
    (``snapshots.py``), and how often a cluster's explanation (why tasks wait, tenants' status)
    is written: at most every ``explain_interval`` seconds (inf: never), ``explain_max_entries``
    pending entries per tenant (``fairstream.wire.visibility``)."""

    topics: Topics
    metrics: WorkerMetrics
    rules: StepRules = field(default_factory=StepRules)
    snapshot_rules: SnapshotRules = field(default_factory=SnapshotRules)
    # Encode snapshots in a forked child (copy-on-write, as Redis's BGSAVE does), so the worker
    # goes on answering while it runs.
    background_snapshots: bool = False
    explain_interval: float = 5.0
    explain_max_entries: int = DEFAULT_MAX_ENTRIES
    # Seconds a cluster's last step stays open for a next batch's events within its window
    # (``stepper.run_steps``' ``hold_open``); 0: a batch's end ends its steps.
    step_wait: float = 0.0

    async def step(self, sessions: Sessions, by_cluster: dict[str, list[tuple[Event, Incoming, int | None]]],
                   commit: BatchCommit, outcome: BatchOutcome,
                   dead: list[DeadLetter], closing: bool = False) -> list[tuple[ClusterSession, int, float]]:
        """Each cluster's events through its engine, into ``commit`` (steps, outbox, views,
        snapshots) and ``outcome``; events that cannot be applied into ``dead``. Returns the
        snapshots to encode in a child once the commit is written: (session, steps, time).

        A cluster's step held open is taken first; its last step is held open again (with
        ``step_wait``), unless ``closing``: the steps held open are taken now."""
        fork_after_commit: list[tuple[ClusterSession, int, float]] = []
        for cluster, new_items in by_cluster.items():
            try:
                session = await sessions.get(cluster)
            except SnapshotError as exc:
                # Its state is gone to this worker: applying events to a fresh engine would
                # forget what runs where. Dead-lettered with the reason, not dropped.
                log.error("worker.cluster_unreadable", cluster=cluster, reason=str(exc))
                dead.extend(dead_letter(message, index, f"cluster {cluster}: its state in the store cannot be "
                                        f"read, so its events are not applied ({exc})")
                            for _, message, index in new_items)
                continue
            engine = session.engine
            held_before, opened = session.open_items, session.open_since
            items = held_before + new_items if held_before else new_items
            stages = self.metrics.stages
            with stages.stage("step"):
                run = run_steps(engine, items, session.produced, self.rules,
                                hold_open=self.step_wait > 0 and not closing)
            session.produced = run.produced
            if run.open_items:
                commit.open_steps[cluster] = held_step(run.open_items)
                if new_items:
                    session.open_touched = time.monotonic()
                if not session.open_items or held_from(session.open_items) != held_from(run.open_items):
                    session.open_since = session.open_touched  # (a step newly opened)
            elif session.open_items:
                commit.open_steps[cluster] = None
            if held_before and not (run.open_items and held_from(run.open_items) == held_from(held_before)):
                outcome.held_since = opened if outcome.held_since is None else min(outcome.held_since, opened)
            session.open_items = run.open_items
            dead.extend(dead_letter(message, index, reason) for message, index, reason in run.rejected)
            commit.steps[cluster] = run.steps
            commit.expected_steps[cluster] = session.steps_taken  # fencing: the log as this worker left it
            outcome.steps += len(run.steps)
            outcome.decisions += len(run.decisions)
            recent = []
            for d in run.decisions:
                if d.kind is DecisionKind.PREEMPT:  # the page's list, and its tenant's totals
                    recent.append(recent_preemption(d))
                    totals = commit.preempted.setdefault(cluster, {})
                    tasks, lost = totals.get(d.tenant, (0, 0.0))
                    totals[d.tenant] = (tasks + 1, lost + (0.0 if d.started is None else max(d.time - d.started, 0.0)))
            for step in run.steps:
                for event in step["events"]:
                    if event["type"] == CONFIG:
                        outcome.config_accepted += 1
                        recent.append(recent_config(event))
            if recent:
                commit.recent.setdefault(cluster, []).extend(recent)
            commit.outbox.extend((self.topics.decisions, decision_message(cluster, d)) for d in run.decisions)
            with stages.stage("views"):
                commit.views[cluster] = views(engine, run.touched, touched_nodes(run.steps), session.written_quanta)
                commit.views[cluster]["clock"] = {"time": dumps_text(engine.time),
                                                  "produced": dumps_text(session.produced)}
            session.explain_due = True
            with stages.stage("explain"):
                self.explain(cluster, session, commit)
            session.steps_taken += len(run.steps)
            session.events_since_snapshot += events_in(run.steps)
            with stages.stage("snapshot"):
                self._snapshot(cluster, session, commit, fork_after_commit)
        return fork_after_commit

    def _snapshot(self, cluster: str, session: ClusterSession, commit: BatchCommit,
                  fork_after_commit: list[tuple[ClusterSession, int, float]]) -> None:
        """Into ``commit``: a background snapshot that finished, or one due now (encoded here,
        or into ``fork_after_commit`` to encode in a child once the commit is written)."""
        engine = session.engine
        rules = self.snapshot_rules
        snapshots.land_snapshot(cluster, session, commit, rules)
        if session.snapshotting is None and snapshots.due(session, rules):
            first = session.steps_at_snapshot == 0  # a new cluster's: small, and wanted in this commit
            steps_now, time_now = session.steps_taken, engine.time or 0.0
            session.steps_at_snapshot = steps_now
            session.events_since_snapshot = 0
            session.time_at_snapshot = time_now
            if self.background_snapshots and not first:
                fork_after_commit.append((session, steps_now, time_now))
            else:
                snapshots.add_snapshot(cluster, session, steps_now, time_now, snapshots.encoded(engine), commit,
                                       rules)

    def dead_letters(self, dead: list[DeadLetter], commit: BatchCommit, outcome: BatchOutcome,
                     clock=lambda cluster: None) -> None:
        """``dead`` into ``commit`` (the outbox; a rejected tenant tree among its cluster's recent
        events, at its time or else at ``clock(cluster)``, the cluster's clock) and ``outcome``,
        each logged and counted."""
        for letter in dead:
            log.warning("worker.dead_letter", topic=letter.topic, partition=letter.partition,
                        offset=letter.offset, reason=letter.reason)
            if letter.topic == self.topics.config:
                rejected = recent_config_rejected(letter, clock)
                if rejected is not None:
                    commit.recent.setdefault(rejected[0], []).append(rejected[1])
            self.metrics.dead_letters.labels(letter.topic).inc()
            commit.outbox.append((self.topics.deadletter, letter.to_json()))
            outcome.reasons.append(letter.reason)
        outcome.dead_letters = len(dead)

    def explain(self, cluster: str, session: ClusterSession, commit: BatchCommit, force: bool = False) -> None:
        """Into ``commit``: the cluster's explanation (``fairstream.core.explain``), replacing the
        last, and a point of its history, if it changed and the last is ``explain_interval`` old."""
        now = time.monotonic()
        if not session.explain_due or (not force and now - session.explained_at < self.explain_interval):
            return
        explanation = explain(session.engine, max_entries=self.explain_max_entries,
                              forecast=(WORKER_STEPS, WORKER_TASKS))
        status = explanation.status_json()
        commit.replaced_views.setdefault(cluster, {})["explain"] = stored_views(status, explanation.pending_json(),
                                                                                node_status(session.engine))
        commit.history[cluster] = history_sample(status)
        self.metrics.observe_tenants(cluster, status)
        session.explained_at, session.explain_due = now, False


def recent_preemption(decision) -> str:
    """A preempt decision as one of its cluster's recent events (the page's list)."""
    return dumps_text({"kind": "preempt", "time": decision.time, "tenant": decision.tenant, "task": decision.task,
                       "node": decision.node, "started": decision.started, "message": decision.reason})


def recent_config(event: dict) -> str:
    """An applied tenants.config (as the log records it) as a recent event."""
    tenants = event["tenants"]
    shown = ", ".join(f"{t['id']} (weight {t.get('weight', 1):g})" for t in tenants[:8])
    return dumps_text({"kind": "config_accepted", "time": event["time"],
                       "message": f"tenant tree of {len(tenants)} applied: {shown}" + (" ..." if len(tenants) > 8 else "")})


def recent_config_rejected(letter: DeadLetter, clock=lambda cluster: None) -> tuple[str, str] | None:
    """A dead-lettered tenants.config as (cluster, recent event), if its cluster can be read; one
    sent without a time is shown at ``clock(cluster)``, the time it was read at (it showed
    ``time: null``)."""
    try:
        body = loads(letter.raw)
    except Exception:  # not JSON: no cluster to show it under
        return None
    cluster = body.get("cluster") if isinstance(body, dict) else None
    if not isinstance(cluster, str):
        return None
    at = body.get("time")
    if not isinstance(at, (int, float)) or isinstance(at, bool):
        at = clock(cluster)
    return cluster, dumps_text({"kind": "config_rejected", "time": at,
                                "message": letter.reason})
