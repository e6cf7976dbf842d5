"""What the worker does with a batch of input messages, independent of Faust and Kafka: one
pipeline of named stages, each in a module of its own, under one lock.

``Processor.handle(messages)``:
1. decode (``decoding.decode_batch``): skip messages whose offsets were already applied (Kafka
   redelivers after a crash), decode and validate the rest (``fairstream.wire.events``; bad
   ones become dead letters with the reason), events per cluster in arrival order;
2. admit and step (``stepping.Stepping``): per cluster, on its ``ClusterSession``
   (``session.Sessions``), events the engine would reject are dead-lettered and the rest
   become engine steps (``stepper.run_steps``: the step window, lateness and silent nodes),
   with their decisions, views, explanation and a snapshot when one is due;
3. persist: the new log steps, offsets, outputs (outbox), the journal's record and operator
   views to the store in one transaction, fenced (``StaleLog``); a snapshot encoded by a forked
   child lands in the first commit after the child is done;
4. publish (``publishing.Outputs``): the journal's record, acknowledged, then the outbox; with
   the next batch free to start, wait for the broker's acknowledgements and clear the outbox.

When the store lost writes, what it lost is read again from Kafka first (``rebuild.read_again``).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass

import structlog

from fairstream.state.store import BatchCommit, StaleLog, StateStore, republishing_order
from fairstream.streams import snapshots
from fairstream.streams.config import WorkerConfig
from fairstream.streams.decoding import decode_batch
from fairstream.streams.incoming import Incoming, InputLog
from fairstream.streams.journal import held_from, journal_commit
from fairstream.streams.open_steps import OpenSteps
from fairstream.streams.publishing import Outputs, Publish, acknowledged_all
from fairstream.streams.rebuild import owed_by_journal, read_again
from fairstream.streams.session import ClusterSession, Sessions
from fairstream.streams.snapshots import SnapshotRules, Snapshotting
from fairstream.streams.stepper import StepRules
from fairstream.streams.stepping import Applied, BatchOutcome, Enqueued, Stepping
from fairstream.wire.events import DeadLetter

__all__ = ["Applied", "BatchOutcome", "Incoming", "InputLog", "Processor"]

log = structlog.get_logger("fairstream.worker")


class Processor:
    def __init__(self, store: StateStore, publish: Publish, config: WorkerConfig, metrics=None,
                 input_log: InputLog | None = None) -> None:
        """``store``: the state store; ``publish``: sends one output message; ``config``: the
        worker's settings, whole (its engine comes from ``config.make_engine``); ``metrics``: the
        worker's Prometheus metrics (new ones if None); ``input_log``: reads the input again
        (Kafka's journal), or None where the input cannot be read again (then nothing is
        journaled)."""
        from fairstream.streams.prometheus import WorkerMetrics

        self.metrics = metrics or WorkerMetrics()
        self.config = config
        self.topics = topics = config.topics
        self.max_bytes = config.max_bytes
        # The stages: sessions and stepping (2), the outputs (4); the store is the persist stage (3).
        self.sessions_held = Sessions(store, config.make_engine, self.metrics, config.max_engines, config.max_bytes)
        self.stepping = Stepping(
            topics, self.metrics,
            StepRules(max_lateness=config.max_lateness, max_ahead=config.max_ahead, step_window=config.step_window,
                      node_timeout=config.node_timeout),
            SnapshotRules(every=config.snapshot_every, ratio=config.snapshot_ratio, log_retention=config.log_retention),
            # Encoded in a forked child where the platform has fork().
            background_snapshots=config.background_snapshots and hasattr(os, "fork"),
            explain_interval=config.explain_interval, explain_max_entries=config.explain_max_entries,
            step_wait=config.step_wait)
        self.open_steps = OpenSteps(self, config.step_wait, config.step_window)
        self.outputs = Outputs(publish, topics, self.metrics, lambda batches: self.store.clear_outbox(batches))
        self._store = store
        self.applied: dict[str, int] = {}  # per position ("topic:partition"): the next offset to apply
        # A worker that can read the input again journals what it applies (streams/journal.py).
        self.input_log = input_log
        self.consumer_start: dict[str, int] = {}  # consuming_from: Kafka's committed offsets, not yet checked
        self.assigned: set[str] = set()  # the input positions the consumer was last given (consuming_from)
        self.owed: dict[str, int] = {}  # per position, how far the store must be read up to again (start)
        self._lock = asyncio.Lock()
        self._waiting: list[_Ticket] = []  # batches waiting for the lock, applied together
        self._started = False

    @property
    def store(self) -> StateStore:
        return self._store

    @store.setter
    def store(self, store: StateStore) -> None:  # (a test's Redis that lost writes)
        self._store = self.sessions_held.store = store

    @property
    def sessions(self) -> dict[str, ClusterSession]:
        """Per cluster, in order of last use: its engine and what the worker knows of its log."""
        return self.sessions_held.held

    async def session(self, cluster: str) -> ClusterSession:
        return await self.sessions_held.get(cluster)

    async def start(self) -> None:
        """Load offsets and publish whatever a previous run committed but did not publish."""
        async with self._lock:
            await self._start_locked()

    async def _start_locked(self) -> None:
        """``start`` with the lock held. Checked by every holder of the lock before it applies
        anything: a batch that waited for the lock while another failed (the store lost writes,
        a rebalance) must see the offsets read again, not an engine rebuilt from a store that
        lost what it had applied."""
        if self._started:
            return
        stored = await self.store.offsets()
        for position, offset in [*self.applied.items(), *self.consumer_start.items()]:
            if stored.get(position, 0) < offset and not self._journal_position(position):
                self.owed[position] = max(self.owed.get(position, 0), offset)
        self.consumer_start.clear()
        self.applied = stored
        journal_from = {p: o for p, o in stored.items() if self._journal_position(p)}
        journaled = self.outputs.journaled
        for position, offset in journal_from.items():
            journaled[position] = max(journaled.get(position, 0), offset)
        if self.input_log is not None and self.assigned:
            await owed_by_journal(self.input_log, stored, journal_from, self.assigned, self.owed)
        if self.owed and self.input_log is not None:
            self.sessions.clear()  # they may hold what the store lost
            read = await read_again(self.input_log, {p: (stored.get(p, 0), end) for p, end in self.owed.items()},
                                    journal_from, self._apply_now, self._reject_now, self.topics, self.max_bytes,
                                    self.open_steps.close_now)
            self.metrics.read_again.inc(read)
        self.owed.clear()
        await self.outputs.enqueued()  # (what it still sends is in the outbox: sent again below, after it)
        pending = await self.store.outbox()
        entries = republishing_order(pending)
        await acknowledged_all(await self.outputs.enqueue(entries))
        await self.store.clear_outbox(pending)
        if entries:
            log.info("worker.outbox_republished", messages=len(entries))
        if self.open_steps.step_wait > 0:
            await self.open_steps.load(await self.store.open_steps(), self.assigned, self.session)
        self._started = True
        self.open_steps.watch()

    def consuming_from(self, offsets: Mapping[str, int]) -> None:
        """Where the consumer starts reading partitions (Kafka's committed offsets; 0 where none
        is committed), at start-up and after every rebalance (``streams/transport.py``): checked
        against the store's offsets, and against the journal, when the store is next read
        (``start``), before anything of theirs is applied."""
        self.consumer_start.update(offsets)
        self.assigned = {position for position in offsets if not self._journal_position(position)}
        self._started = False  # the first assignment comes after the worker's own start

    def _journal_position(self, position: str) -> bool:
        return position.rpartition(":")[0] == self.topics.journal

    async def _apply_now(self, messages: list[Incoming], journaled: tuple[str, int] | None) -> None:
        """Apply, commit and publish ``messages`` while the lock is held (a rebuild);
        ``journaled``: the journal position and offset to commit, for a batch of the journal."""
        await self._settle(*await self._handle(messages, journaled))

    async def _reject_now(self, message: Incoming, reason: str, journaled: tuple[str, int]) -> None:
        """``reject`` ``message`` and publish it while the lock is held (a rebuild)."""
        await self._settle(*await self._rejected(message, reason, journaled))

    async def _settle(self, outcome: BatchOutcome, outbox: list[tuple[str, dict]], acks: asyncio.Task) -> None:
        """Wait for the broker to have a batch's outputs and clear them from the outbox."""
        await acknowledged_all(await acks)
        await self.store.clear_outbox([outbox])

    async def forget(self) -> None:
        """Drop cached engines and offsets (partitions were revoked: another worker may now
        append to these clusters' logs); they are reloaded from the store when next needed."""
        async with self._lock:
            self.sessions.clear()
            self._started = False

    async def handle(self, messages: list[Incoming]) -> BatchOutcome:
        """Apply, commit and publish ``messages``; returns when their effects are durable and
        published."""
        applied = await self.apply(messages)
        await asyncio.shield(applied.published)
        return applied.outcome

    async def apply(self, messages: list[Incoming]) -> Applied:
        """Apply and commit ``messages`` and enqueue their outputs; returns once they are durable,
        with a future that resolves when the broker has the outputs (``Applied.published``).

        Batches that arrive while another is being applied wait together and are applied as
        one (one engine pass, one Redis transaction). The journal's round trip and the broker's
        acknowledgements are outside the lock (``Outputs.enqueue_in_order``)."""
        received = time.monotonic()  # the metric's clock; the engine never reads one
        loop = asyncio.get_running_loop()
        ticket = _Ticket(messages, loop.create_future())
        self._waiting.append(ticket)
        stages = self.metrics.stages
        async with self._lock:
            stages.waited("lock", int((time.monotonic() - received) * 1e9))
            if not ticket.done.done():  # else an earlier holder of the lock applied it
                tickets, self._waiting = self._waiting, []
                try:
                    await self._start_locked()
                    outcome, outbox, acks = await stages.run(self._handle([m for t in tickets for m in t.messages]))
                except BaseException as exc:
                    for other in tickets:
                        if other is not ticket:
                            other.done.set_exception(exc)
                    raise
                published = self.outputs.published_task(outbox, acks, outcome)
                for other in tickets:
                    other.done.set_result(Applied(outcome, published))
        applied = ticket.done.result()
        topics = [m.topic for m in messages]
        since = received if applied.outcome.held_since is None else min(received, applied.outcome.held_since)
        applied.published.add_done_callback(lambda done: self.metrics.count_published(topics, since, done))
        return applied

    async def reject(self, message: Incoming, reason: str) -> Applied:
        """Dead-letter ``message`` without applying it (applying it kept failing with an
        unexpected error: ``reason``): its offset and the dead letter are committed, so it is
        skipped from now on, and the dead letter is published like any other output."""
        async with self._lock:
            await self._start_locked()
            outcome, outbox, acks = await self.metrics.stages.run(self._rejected(message, reason))
            published = self.outputs.published_task(outbox, acks, outcome)
        return Applied(outcome, published)

    async def _rejected(self, message: Incoming, reason: str, journaled: tuple[str, int] | None = None,
                        ) -> Enqueued:
        """``reject`` with the lock held: commit and enqueue; returns the outcome, the outbox and
        the acknowledgements to wait for. ``journaled``: as for ``_handle``."""
        commit = BatchCommit()
        commit.offsets[message.position] = max(self.applied.get(message.position, 0), message.offset + 1)
        if self.input_log is not None:
            journal_commit(commit, self.topics.journal, self.outputs.journaled, [message], journaled,
                           rejected=reason)
        letter = DeadLetter(message.topic, message.partition, message.offset, reason, message.raw)
        log.error("worker.internal_error", topic=message.topic, partition=message.partition,
                  offset=message.offset, reason=reason)
        self.metrics.dead_letters.labels(message.topic).inc()
        self.metrics.internal_errors.labels(message.topic).inc()
        commit.outbox.append((self.topics.deadletter, letter.to_json()))
        await self.store.commit(commit)
        self.applied.update(commit.offsets)
        return BatchOutcome(dead_letters=1, reasons=[reason]), commit.outbox, await self.outputs.enqueue_in_order(commit.outbox)

    def _clock_of(self, cluster: str) -> float | None:
        """The cluster's clock if its engine is held (a tenant tree sent without a time is read at it)."""
        session = self.sessions.get(cluster)
        return None if session is None else session.engine.time

    async def _handle(self, messages: list[Incoming], journaled: tuple[str, int] | None = None,
                      ) -> Enqueued:
        """The pipeline, with the lock held: decode, step, persist, publish; returns the outcome,
        the outbox and the acknowledgements to wait for. ``journaled``: the batch is applied
        again from the journal (a rebuild), which is read up to this position and offset."""
        stages = self.metrics.stages
        with stages.stage("decode"):
            decoded = decode_batch(messages, self.applied, self.max_bytes)
        stages.count_batch(sum(map(len, decoded.by_cluster.values())) + len(decoded.dead))
        outcome = BatchOutcome(skipped=decoded.skipped)
        commit = BatchCommit(offsets=decoded.offsets)
        if decoded.applying and self.input_log is not None:
            journal_commit(commit, self.topics.journal, self.outputs.journaled, decoded.applying, journaled)
        return await self._step_and_commit(decoded.by_cluster, decoded.dead, commit, outcome)

    async def _close(self, clusters: list[str], journaled: tuple[str, int] | None = None,
                     ) -> Enqueued:
        """Take the steps ``clusters`` hold open (held sessions), with the lock held: as a batch
        of no input, journaled as closing them (``journal.record_closes``)."""
        commit, outcome = BatchCommit(), BatchOutcome()
        if self.input_log is not None and (clusters or journaled is not None):
            journal_commit(commit, self.topics.journal, self.outputs.journaled, [], journaled,
                           closing={c: held_from(self.sessions[c].open_items) for c in clusters})
        return await self._step_and_commit({cluster: [] for cluster in clusters}, [], commit, outcome, closing=True)

    async def _step_and_commit(self, by_cluster: dict[str, list], dead: list[DeadLetter], commit: BatchCommit,
                               outcome: BatchOutcome, closing: bool = False,
                               ) -> Enqueued:
        """Stages two to four of a batch (decoded: ``by_cluster``, ``dead``) into ``commit``:
        step, persist, enqueue the outputs; ``closing``: the steps held open are taken."""
        try:
            fork_after_commit = await self.stepping.step(self.sessions_held, by_cluster, commit, outcome, dead,
                                                         closing=closing)
            self.stepping.dead_letters(dead, commit, outcome, self._clock_of)
            with self.metrics.stages.stage("persist"):
                await self.store.commit(commit)
        except BaseException as exc:
            # The engines have applied a batch that is not durable, or failed part-way through
            # it (a fault some input triggered): forget them, so that the redelivered messages
            # are applied to engines rebuilt from the store, once.
            for cluster in by_cluster:
                self.sessions.pop(cluster, None)
            if isinstance(exc, StaleLog):
                # Another worker moved the log on (it holds the partition now; a rebalance
                # will tell this one) or the store lost writes.
                log.warning("worker.log_moved", cluster=exc.cluster, expected_steps=exc.expected,
                            found_steps=exc.found)
            # Before the batch is tried again, read the offsets again (start): what another
            # worker applied is then skipped, and what a store that went down came back
            # without (restarted empty, or from an older file) is read again from Kafka. The
            # engines of other clusters are checked by their next commit's fencing.
            self._started = False
            raise
        self.applied.update(commit.offsets)
        # Only now: a snapshot must hold nothing the store does not (a failed commit's steps
        # are applied again after a redelivery).
        for session, steps, at in fork_after_commit:
            with self.metrics.stages.stage("snapshot"):
                session.snapshotting = Snapshotting(steps, at, snapshots.snapshot_in_child(session.engine))
        self.sessions_held.evict_idle(keep=by_cluster)
        if commit.open_steps:
            self.open_steps.watch()
        return outcome, commit.outbox, await self.outputs.enqueue_in_order(commit.outbox)

    async def flush_explanations(self) -> int:
        """Write the explanations a batch left due (it came within ``explain_interval`` of the
        last): called on a timer, so the last state of a cluster that went quiet is shown.
        Fenced like a batch: a cluster another worker moved on is forgotten, not written."""
        async with self._lock:
            interval = self.stepping.explain_interval
            due = [(cluster, session) for cluster, session in self.sessions.items() if session.explain_due
                   and time.monotonic() - session.explained_at >= interval]
            if not due or not self._started:
                return 0
            commit = BatchCommit()
            for cluster, session in due:
                commit.expected_steps[cluster] = session.steps_taken
                self.stepping.explain(cluster, session, commit)
            try:
                await self.store.commit(commit)
            except StaleLog as exc:
                self.sessions.pop(exc.cluster, None)
                return 0
            return len(due)


@dataclass
class _Ticket:
    """A batch waiting to be applied; ``done`` holds its ``Applied`` once a holder of the lock
    (its own call or another agent's) applied it."""

    messages: list[Incoming]
    done: asyncio.Future
