"""What the worker does with a batch of input messages, independent of Faust and Kafka: it
keeps dedup, batching, commit and publishing; the rest is in modules of its own.

``Processor.handle(messages)``:
1. skip messages whose offsets were already applied (Kafka redelivers after a crash);
2. decode and validate each (``fairstream.wire.events``; bad ones become dead letters with the
   reason);
3. per cluster, in arrival order, turn events into engine steps (``stepper.run_steps``: the
   step window, lateness and silent nodes), on the cluster's ``ClusterSession``;
4. commit the new log steps, offsets, outputs (outbox) and operator views (``views``) to the
   store in one transaction, with a snapshot of an engine when one is due (``snapshots``: in
   the same transaction, or encoded by a forked child after the commit and added to the
   first commit after the child is done);
5. enqueue the outbox for publishing; then, with the next batch free to start, wait for the
   broker's acknowledgements and clear the outbox.

A cluster seen for the first time since start is loaded from the store: its last snapshot,
then the log steps after it replayed through a fresh engine (``fairstream.wire.log.replay``;
decisions are deterministic, so the engine ends exactly where it was). Snapshots are plain data
(``state/engine_snapshot.py``); one that cannot be read is not trusted, and the engine is
rebuilt from the retained log instead.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
import uuid
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import AsyncIterator, Awaitable, Callable, Mapping, Protocol

import structlog

from fairstream.core.engine import Engine
from fairstream.core.explain import explain
from fairstream.core.forecast import WORKER_STEPS, WORKER_TASKS
from fairstream.wire.jsoncodec import dumps_text, loads
from fairstream.core.model import DecisionKind, Event
from fairstream.state.engine_snapshot import SnapshotError, decode_engine
from fairstream.state.store import BatchCommit, ClusterRecord, StaleLog, StateStore, republishing_order
from fairstream.streams import snapshots
from fairstream.streams.journal import JOURNAL_KEY, RangeBuffer, journal_record, unique_records
from fairstream.streams.session import ClusterSession
from fairstream.streams.snapshots import SnapshotRules, Snapshotting
from fairstream.streams.stepper import StepRules, run_steps
from fairstream.streams.views import touched_nodes, views
from fairstream.wire.events import CONFIG, BadElement, BadInput, DeadLetter, decision_message, decode_message, element_bytes
from fairstream.wire.log import events_in
from fairstream.wire.log import replay as replay_log
from fairstream.wire.topics import Topics
from fairstream.wire.visibility import DEFAULT_MAX_ENTRIES, history_sample, stored_views

log = structlog.get_logger("fairstream.worker")

# publish(topic, key, message) enqueues the message (in call order) and returns an awaitable that
# resolves when the broker has it, or None when there is nothing to wait for.
Publish = Callable[[str, str, dict], Awaitable["Awaitable | None"]]


@dataclass(frozen=True)
class Incoming:
    """One input message as the agent received it."""

    kind: str  # submitted | completed | heartbeat
    raw: bytes
    topic: str
    partition: int
    offset: int
    # When it was produced: the Kafka record's timestamp in seconds (the producer's clock, or
    # the broker's with LogAppendTime); 0 where unknown. Tells an event its producer sent late
    # from one the worker read late (``fairstream.streams.stepper.is_late``).
    produced: float = 0.0
    # The Kafka message key: the cluster id (README, Topics); None for a message sent without one.
    key: bytes | None = None

    @property
    def position(self) -> str:
        return f"{self.topic}:{self.partition}"


class InputLog(Protocol):
    """Kafka's record of the input, as the processor reads it again (``streams/app.py``)."""

    def read(self, ranges: dict[str, tuple[int, int]]) -> AsyncIterator[tuple[str, list["Incoming"], bool]]:
        """Each position's (``"topic:partition"``) messages from offset ``start`` (or where its
        log now begins, if retention dropped that) up to ``end``, excluded: chunks of
        ``(position, messages in offset order, whether the position is done)``."""
        ...

    def journal(self, start: dict[str, int]) -> AsyncIterator[object]:
        """The journal's records (``streams/journal.py``) from offset ``start[position]`` of each
        of its positions (from its beginning where none is given) to its end as of the call,
        each position in order, decoded from JSON (what is not JSON: None)."""
        ...


@dataclass
class BatchOutcome:
    decisions: int = 0
    dead_letters: int = 0
    skipped: int = 0
    steps: int = 0
    reasons: list[str] = field(default_factory=list)
    config_accepted: int = 0  # tenants.config events applied


class Processor:
    def __init__(
        self,
        store: StateStore,
        make_engine: Callable[[], Engine],
        publish: Publish,
        topics: Topics = Topics(),
        max_lateness: float = 60.0,
        node_timeout: float = math.inf,
        snapshot_every: int = 500,
        snapshot_ratio: float = 2.0,
        max_bytes: int = 64 * 1024,
        metrics=None,
        step_window: float = 0.0,
        log_retention: float = math.inf,
        background_snapshots: bool = False,
        max_engines: int = 1000,
        max_ahead: float = 86400.0,
        input_log: InputLog | None = None,
        explain_interval: float = 5.0,
        explain_max_entries: int = DEFAULT_MAX_ENTRIES,
    ) -> None:
        from fairstream.streams.prometheus import WorkerMetrics

        self.metrics = metrics or WorkerMetrics()
        self.store = store
        self.make_engine = make_engine
        self.publish = publish
        self.topics = topics
        self.rules = StepRules(max_lateness=max_lateness, max_ahead=max_ahead, step_window=step_window,
                               node_timeout=node_timeout)
        self.snapshot_rules = SnapshotRules(every=snapshot_every, ratio=snapshot_ratio, log_retention=log_retention)
        self.max_bytes = max_bytes
        # Encode snapshots in a forked child (copy-on-write, as Redis's BGSAVE does), so the
        # worker goes on answering while it runs: where the platform has fork().
        self.background_snapshots = background_snapshots and hasattr(os, "fork")
        self.max_engines = max_engines  # cluster sessions kept in memory (_evict_idle)
        # Per cluster, in order of last use: its engine and what the worker knows of its log.
        self.sessions: dict[str, ClusterSession] = {}
        self.applied: dict[str, int] = {}  # per position ("topic:partition"): the next offset to apply
        self.input_log = input_log
        # A worker that can read the input again journals what it applies (streams/journal.py);
        # per journal position, the offset after its last record the broker acknowledged.
        self.journaled: dict[str, int] = {}
        self.consumer_start: dict[str, int] = {}  # consuming_from: Kafka's committed offsets, not yet checked
        self.owed: dict[str, int] = {}  # per position, how far the store must be read up to again (start)
        # Each cluster's explanation (why tasks wait, tenants' status) is written with a commit
        # at most every ``explain_interval`` seconds (inf: never), ``explain_max_entries``
        # pending entries per tenant (``fairstream.wire.visibility``).
        self.explain_interval = explain_interval
        self.explain_max_entries = explain_max_entries
        self._lock = asyncio.Lock()
        self._waiting: list[_Ticket] = []  # batches waiting for the lock, applied together
        self._started = False

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
        for position, offset in journal_from.items():
            self.journaled[position] = max(self.journaled.get(position, 0), offset)
        if self.owed and self.input_log is not None:
            await self._read_again({p: (stored.get(p, 0), end) for p, end in self.owed.items()}, journal_from)
        self.owed.clear()
        pending = await self.store.outbox()
        entries = republishing_order(pending)
        await _acknowledged(await self._enqueue(entries))
        await self.store.clear_outbox(pending)
        if entries:
            log.info("worker.outbox_republished", messages=len(entries))
        self._started = True

    def consuming_from(self, offsets: Mapping[str, int]) -> None:
        """Where the consumer starts reading partitions (Kafka's committed offsets), at start-up
        and after every rebalance (``streams/transport.py``): checked against the store's
        offsets when the store is next read (``start``), before anything of theirs is applied."""
        self.consumer_start.update(offsets)
        self._started = False  # the first assignment comes after the worker's own start

    def _journal_position(self, position: str) -> bool:
        return position.rpartition(":")[0] == self.topics.journal

    async def _read_again(self, ranges: dict[str, tuple[int, int]], journal_from: dict[str, int]) -> None:
        """Apply again, from Kafka, what the store lost: ``ranges`` holds, per position, the
        store's offset and where this worker believed it was (what it had applied, or the
        committed offset the consumer started from), when the store lost writes (a Redis
        restarted empty or restored from an older file). Kafka holds the input, and the
        journal (``streams/journal.py``, read from ``journal_from``, the store's offsets in it)
        the batches it was applied in.

        First the journal's batches, in its order: each applied as it was first, so it decides
        exactly what was published, with the same ids. Then what no record holds (input the
        worker read but had not committed, or older than the journal's retention): the input
        topics merged in event-time order (heartbeats, then submissions, then completions, then
        tenant trees at one time), each partition in its own order, so a completion comes after
        the submission it ends. Applied, committed and published in batches like any input
        (docs/architecture.md, "Redis durability"). Cached engines are dropped first: they may
        hold what the store lost."""
        self.sessions.clear()
        log.warning("worker.reading_again", ranges={p: list(r) for p, r in sorted(ranges.items())})
        held = RangeBuffer(self.input_log.read(ranges), ranges)
        journaled = 0
        async for record, runs in unique_records(self.input_log.journal(journal_from)):
            messages = await held.take(runs)
            if not messages:
                continue
            journaled += 1
            if record.get("rejected") is None:
                await self._apply_now(messages)
                continue
            if messages[:-1]:  # (input before it that no record holds)
                await self._apply_now(messages[:-1])
            outcome, outbox, acks = await self._rejected(messages[-1], str(record["rejected"]))
            await _acknowledged(acks)
            await self.store.clear_outbox([outbox])
        queues: dict[str, deque] = {position: deque() for position in ranges}
        reading = set(ranges)  # positions with more to come
        rank = {self.topics.heartbeats: 0, self.topics.submitted: 1, self.topics.completed: 2}
        batch: list[Incoming] = []
        async for position, messages, done in held.rest():
            queues[position].extend((_first_time(m, self.max_bytes), rank.get(m.topic, 3), m.offset, m) for m in messages)
            if done:
                reading.discard(position)
            # The earliest head goes next, once every position that may still send has one.
            while not any(not queues[p] for p in reading):
                heads = [queue for queue in queues.values() if queue]
                if not heads:
                    break
                batch.append(min(heads, key=lambda queue: queue[0][:3]).popleft()[3])
                if len(batch) >= _READ_AGAIN_BATCH:
                    await self._apply_now(batch)
                    batch = []
        if batch:
            await self._apply_now(batch)
        self.metrics.read_again.inc(held.read)
        log.warning("worker.read_again", messages=held.read, journaled_batches=journaled)

    async def _apply_now(self, messages: list[Incoming]) -> None:
        """Apply, commit and publish ``messages`` while the lock is held (``_read_again``)."""
        outcome, outbox, acks = await self._handle(messages)
        await _acknowledged(acks)
        await self.store.clear_outbox([outbox])

    async def forget(self) -> None:
        """Drop cached engines and offsets (partitions were revoked: another worker may now
        append to these clusters' logs); they are reloaded from the store when next needed."""
        async with self._lock:
            self.sessions.clear()
            self._started = False

    async def session(self, cluster: str) -> ClusterSession:
        """The cluster's session: cached (moved to the end: ``sessions`` is kept in order of
        last use), or recovered from the store: its last snapshot and the log after it."""
        session = self.sessions.pop(cluster, None)
        if session is None:
            record = await self.store.load(cluster)
            engine, snapshot_steps, replay = await self._starting_point(cluster, record)
            for _ in replay_log(engine, replay):
                pass
            steps = snapshot_steps + len(replay)
            session = ClusterSession(
                engine, log_base=record.log_base, checkpoints=list(record.checkpoints), steps_taken=steps,
                steps_at_snapshot=steps, events_since_snapshot=events_in(replay), time_at_snapshot=engine.time or 0.0,
                produced=float((await self.store.view(cluster, "clock")).get("produced", 0.0)))
            if snapshot_steps or replay:
                log.info("worker.cluster_recovered", cluster=cluster, snapshot_steps=snapshot_steps,
                         replayed_steps=len(replay))
        self.sessions[cluster] = session
        return session

    async def _starting_point(self, cluster: str, record: ClusterRecord) -> tuple[Engine, int, list[dict]]:
        """The engine a recovery starts from, the log steps it holds, and the steps to replay
        on it: the last snapshot and the log after it; if that snapshot cannot be read (another
        version, damaged, or planted by someone who could write the store), the retained log
        from its base, a fresh engine or the checkpoint there. Raises ``SnapshotError`` when
        that checkpoint cannot be read either: the cluster's state is then lost to this worker."""
        if not record.snapshot:
            return self.make_engine(), 0, record.log
        try:
            return decode_engine(record.snapshot), record.snapshot_steps, record.log
        except SnapshotError as exc:
            log.error("worker.snapshot_unreadable", cluster=cluster, steps=record.snapshot_steps, reason=str(exc),
                      log_base=record.log_base)
            self.metrics.snapshots_unreadable.inc()
        retained = await self.store.full_log(cluster)
        if not retained.base_steps:
            return self.make_engine(), 0, retained.steps
        if retained.base_snapshot is None:
            raise SnapshotError(f"the checkpoint at step {retained.base_steps}, where the retained log starts, is missing")
        try:
            return decode_engine(retained.base_snapshot), retained.base_steps, retained.steps
        except SnapshotError as exc:
            self.metrics.snapshots_unreadable.inc()
            raise SnapshotError(f"the checkpoint at step {retained.base_steps}, where the retained log starts: {exc}") from None

    async def handle(self, messages: list[Incoming]) -> BatchOutcome:
        """Apply, commit and publish ``messages``; returns when their effects are durable and
        published."""
        applied = await self.apply(messages)
        await asyncio.shield(applied.published)
        return applied.outcome

    async def apply(self, messages: list[Incoming]) -> "Applied":
        """Apply and commit ``messages`` and enqueue their outputs; returns once they are durable,
        with a future that resolves when the broker has the outputs (``Applied.published``).

        Batches that arrive while another is being applied (the other agents') wait together
        and are applied as one: one engine pass and one Redis transaction for all of them,
        which is most of a batch's fixed cost. The broker's acknowledgements are awaited
        outside the lock, so the next batch is applied meanwhile: its outputs are enqueued
        after these, which keeps the order on every partition."""
        received = time.perf_counter()  # the metric's clock; the engine never reads one
        loop = asyncio.get_running_loop()
        ticket = _Ticket(messages, loop.create_future())
        self._waiting.append(ticket)
        async with self._lock:
            if not ticket.done.done():  # else an earlier holder of the lock applied it
                tickets, self._waiting = self._waiting, []
                try:
                    await self._start_locked()
                    outcome, outbox, acks = await self._handle([m for t in tickets for m in t.messages])
                except BaseException as exc:
                    for other in tickets:
                        if other is not ticket:
                            other.done.set_exception(exc)
                    raise
                published = loop.create_task(self._published(outbox, acks, outcome))
                for other in tickets:
                    other.done.set_result(Applied(outcome, published))
        applied = ticket.done.result()
        applied.published.add_done_callback(lambda done: self._count(messages, received, done))
        return applied

    async def reject(self, message: Incoming, reason: str) -> "Applied":
        """Dead-letter ``message`` without applying it (applying it kept failing with an
        unexpected error: ``reason``): its offset and the dead letter are committed, so it is
        skipped from now on, and the dead letter is published like any other output."""
        async with self._lock:
            await self._start_locked()
            outcome, outbox, acks = await self._rejected(message, reason)
            published = asyncio.get_running_loop().create_task(self._published(outbox, acks, outcome))
        return Applied(outcome, published)

    async def _rejected(self, message: Incoming, reason: str) -> tuple[BatchOutcome, list[tuple[str, dict]], list]:
        """``reject`` with the lock held: commit and enqueue; returns the outcome, the outbox and
        the acknowledgements to wait for."""
        commit = BatchCommit()
        commit.offsets[message.position] = max(self.applied.get(message.position, 0), message.offset + 1)
        if self.input_log is not None:
            commit.outbox.append((self.topics.journal, journal_record(uuid.uuid4().hex, [message], rejected=reason)))
            commit.offsets.update(self.journaled)
        letter = DeadLetter(message.topic, message.partition, message.offset, reason, message.raw)
        log.error("worker.internal_error", topic=message.topic, partition=message.partition,
                  offset=message.offset, reason=reason)
        self.metrics.dead_letters.labels(message.topic).inc()
        self.metrics.internal_errors.labels(message.topic).inc()
        commit.outbox.append((self.topics.deadletter, letter.to_json()))
        await self.store.commit(commit)
        self.applied.update(commit.offsets)
        return BatchOutcome(dead_letters=1, reasons=[reason]), commit.outbox, await self._enqueue(commit.outbox)

    async def _published(self, outbox: list[tuple[str, dict]], acks: list | None, outcome: BatchOutcome,
                         retry_delays: tuple[float, float] = (0.1, 5.0)) -> None:
        """Wait for the broker to have a batch's outputs, then clear them from the outbox; if
        either fails, enqueue the outputs again (decisions are idempotent by id) and retry."""
        delays, acknowledged = backoff(*retry_delays), False
        while True:
            try:
                if acks is None:
                    acks = await self._enqueue(outbox)
                await _acknowledged(acks)
                acknowledged = True
                await self.store.clear_outbox([outbox])
                break
            except Exception as exc:
                delay = next(delays)
                log.error("worker.publish_failed", messages=len(outbox), error=f"{type(exc).__name__}: {exc}",
                          acknowledged=acknowledged, retry_in_s=delay)
                await asyncio.sleep(delay)
                if not acknowledged:
                    acks = None
        kinds: Counter = Counter()
        metrics = self.metrics
        rejected_configs = 0
        for topic, message in outbox:
            if topic == self.topics.decisions:
                kinds[message["kind"]] += message.get("count", 1)  # a decision of a request's tasks
                if message["kind"] == "preempt":
                    tenant = (message["cluster"], message["tenant"])
                    metrics.preemptions.labels(*tenant).inc()
                    metrics.work_lost.labels(*tenant).inc(max(message["time"] - message["started"], 0.0))
            elif topic == self.topics.deadletter and message["topic"] == self.topics.config:
                rejected_configs += 1
        for kind, count in kinds.items():
            metrics.decisions.labels(kind).inc(count)
        metrics.steps.inc(outcome.steps)
        if outcome.config_accepted:
            metrics.config_changes.labels("accepted").inc(outcome.config_accepted)
        if rejected_configs:
            metrics.config_changes.labels("rejected").inc(rejected_configs)

    def _count(self, messages: list[Incoming], received: float, published: asyncio.Future) -> None:
        if published.cancelled() or published.exception() is not None:
            return
        metrics = self.metrics
        for topic, count in Counter(m.topic for m in messages).items():  # a labelled child per topic, not per message
            metrics.events.labels(topic).inc(count)
        metrics.latency.observe(time.perf_counter() - received)

    async def _handle(self, messages: list[Incoming]) -> tuple[BatchOutcome, list[tuple[str, dict]], list]:
        """Apply a batch, commit it, and enqueue its outbox for publishing; returns the outcome,
        the outbox and the acknowledgements to wait for."""
        outcome = BatchOutcome()
        commit = BatchCommit()
        dead: list[DeadLetter] = []
        by_cluster: dict[str, list[tuple[Event, Incoming, int | None]]] = {}
        fork_after_commit: list[tuple[ClusterSession, int, float]] = []
        applying: list[Incoming] = []
        for message in messages:
            if message.offset < self.applied.get(message.position, 0):
                outcome.skipped += 1
                continue
            applying.append(message)
            commit.offsets[message.position] = max(commit.offsets.get(message.position, 0), message.offset + 1)
            try:
                decoded = decode_message(message.kind, message.raw, self.max_bytes)
            except BadInput as exc:
                dead.append(DeadLetter(message.topic, message.partition, message.offset, str(exc), message.raw))
                continue
            for item in decoded:
                if item.__class__ is BadElement:
                    dead.append(_dead_letter(message, item.index, item.reason))
                elif message.key is not None and message.key != item.cluster.encode():
                    # Keyed by another cluster, it sits in that one's partition, which another
                    # worker may own: its cluster's events would be split between workers.
                    dead.append(_dead_letter(message, item.index, f"message key {message.key!r} is not the event's "
                                             f"cluster {item.cluster!r} (key a cluster's events by its id)"))
                else:
                    by_cluster.setdefault(item.cluster, []).append((item.event, message, item.index))
        if applying and self.input_log is not None:
            # First in the outbox: published, and acknowledged, before the batch's decisions.
            commit.outbox.append((self.topics.journal, journal_record(uuid.uuid4().hex, applying)))
            commit.offsets.update(self.journaled)

        try:
            await self._step_clusters(by_cluster, commit, outcome, dead, fork_after_commit)
            for letter in dead:
                log.warning("worker.dead_letter", topic=letter.topic, partition=letter.partition,
                            offset=letter.offset, reason=letter.reason)
                if letter.topic == self.topics.config:
                    rejected = recent_config_rejected(letter)
                    if rejected is not None:
                        commit.recent.setdefault(rejected[0], []).append(rejected[1])
                self.metrics.dead_letters.labels(letter.topic).inc()
                commit.outbox.append((self.topics.deadletter, letter.to_json()))
                outcome.reasons.append(letter.reason)
            outcome.dead_letters = len(dead)
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
            session.snapshotting = Snapshotting(steps, at, snapshots.snapshot_in_child(session.engine))
        self._evict_idle(keep=by_cluster)
        return outcome, commit.outbox, await self._enqueue(commit.outbox)

    async def _step_clusters(self, by_cluster, commit: BatchCommit, outcome: BatchOutcome, dead: list[DeadLetter],
                             fork_after_commit: list) -> None:
        """Each cluster's events through its engine, into ``commit`` (steps, outbox, views,
        snapshots)."""
        for cluster, items in by_cluster.items():
            try:
                session = await self.session(cluster)
            except SnapshotError as exc:
                # Its state is gone to this worker: applying events to a fresh engine would
                # forget what runs where. Dead-lettered with the reason, not dropped.
                log.error("worker.cluster_unreadable", cluster=cluster, reason=str(exc))
                dead.extend(_dead_letter(message, index, f"cluster {cluster}: its state in the store cannot be "
                                         f"read, so its events are not applied ({exc})")
                            for _, message, index in items)
                continue
            engine = session.engine
            run = run_steps(engine, items, session.produced, self.rules)
            session.produced = run.produced
            dead.extend(_dead_letter(message, index, reason) for message, index, reason in run.rejected)
            commit.steps[cluster] = run.steps
            commit.expected_steps[cluster] = session.steps_taken  # fencing: the log as this worker left it
            outcome.steps += len(run.steps)
            outcome.decisions += len(run.decisions)
            recent = [recent_preemption(d) for d in run.decisions if d.kind is DecisionKind.PREEMPT]
            for step in run.steps:
                for event in step["events"]:
                    if event["type"] == CONFIG:
                        outcome.config_accepted += 1
                        recent.append(recent_config(event))
            if recent:
                commit.recent.setdefault(cluster, []).extend(recent)
            commit.outbox.extend((self.topics.decisions, decision_message(cluster, d)) for d in run.decisions)
            commit.views[cluster] = views(engine, run.touched, touched_nodes(run.steps), session.written_quanta)
            commit.views[cluster]["clock"] = {"time": dumps_text(engine.time), "produced": dumps_text(session.produced)}
            session.explain_due = True
            self._explain(cluster, session, commit)
            session.steps_taken += len(run.steps)
            session.events_since_snapshot += events_in(run.steps)
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

    def _explain(self, cluster: str, session: ClusterSession, commit: BatchCommit, force: bool = False) -> None:
        """Into ``commit``: the cluster's explanation (``fairstream.core.explain``), replacing the
        last, and a point of its history, if it changed and the last is ``explain_interval`` old."""
        now = time.monotonic()
        if not session.explain_due or (not force and now - session.explained_at < self.explain_interval):
            return
        explanation = explain(session.engine, max_entries=self.explain_max_entries,
                              forecast=(WORKER_STEPS, WORKER_TASKS))
        status = explanation.status_json()
        commit.replaced_views.setdefault(cluster, {})["explain"] = stored_views(status, explanation.pending_json())
        commit.history[cluster] = history_sample(status)
        self.metrics.observe_tenants(cluster, status)
        session.explained_at, session.explain_due = now, False

    async def flush_explanations(self) -> int:
        """Write the explanations a batch left due (it came within ``explain_interval`` of the
        last): called on a timer, so the last state of a cluster that went quiet is shown.
        Fenced like a batch: a cluster another worker moved on is forgotten, not written."""
        async with self._lock:
            due = [(cluster, session) for cluster, session in self.sessions.items() if session.explain_due
                   and time.monotonic() - session.explained_at >= self.explain_interval]
            if not due or not self._started:
                return 0
            commit = BatchCommit()
            for cluster, session in due:
                commit.expected_steps[cluster] = session.steps_taken
                self._explain(cluster, session, commit)
            try:
                await self.store.commit(commit)
            except StaleLog as exc:
                self.sessions.pop(exc.cluster, None)
                return 0
            return len(due)

    def _evict_idle(self, keep) -> None:
        """Drop the engines used longest ago while more than ``max_engines`` are cached (never
        those of the batch just applied). Their state is in the store: a cluster heard from
        again is recovered as after a restart. So a flood of new cluster ids costs memory for
        at most ``max_engines`` engines; their keys in Redis stay (they are the clusters' state)."""
        while len(self.sessions) > self.max_engines:
            oldest = next(iter(self.sessions))
            if oldest in keep:  # a batch of more clusters than the cap keeps them all
                return
            del self.sessions[oldest]
            log.info("worker.engine_evicted", cluster=oldest, cached=len(self.sessions))

    async def _enqueue(self, outbox: list[tuple[str, dict]]) -> list:
        """Enqueue every message in order, the journal's records first, once the broker has
        them (a decision is never published before its batch is in the journal); returns the
        acknowledgements to wait for."""
        journal = self.topics.journal
        records = [message for topic, message in outbox if topic == journal]
        if records:
            await waiting_for(lambda: self._journal(records), "worker.journal_unpublished", delays=(0.1, 5.0))
        acks = []
        for topic, message in outbox:
            if topic == journal:
                continue
            ack = await self.publish(topic, message.get("cluster") or _cluster_of(message), message)
            if ack is not None:
                acks.append(ack)
        return acks

    async def _journal(self, records: list[dict]) -> None:
        """Publish journal ``records`` (``streams/journal.py``) and wait until the broker has
        them; the offsets after them go into the next commit (where a rebuild starts reading)."""
        acks = [await self.publish(self.topics.journal, JOURNAL_KEY, record) for record in records]
        for ack in acks:
            if ack is None:
                continue
            sent = await ack
            partition, offset = getattr(sent, "partition", None), getattr(sent, "offset", None)
            if isinstance(partition, int) and isinstance(offset, int):
                position = f"{self.topics.journal}:{partition}"
                self.journaled[position] = max(self.journaled.get(position, 0), offset + 1)


@dataclass(frozen=True)
class Applied:
    """A batch applied and committed (``outcome``); ``published`` resolves once the broker has
    its outputs and they are cleared from the outbox (or fails with what went wrong)."""

    outcome: BatchOutcome
    published: asyncio.Future


@dataclass
class _Ticket:
    """A batch waiting to be applied; ``done`` holds its ``Applied`` once a holder of the lock
    (its own call or another agent's) applied it."""

    messages: list[Incoming]
    done: asyncio.Future


_READ_AGAIN_BATCH = 500  # messages per commit while reading again what the store lost


def _first_time(message: Incoming, max_bytes: int) -> float:
    """The earliest event time in ``message`` (where ``_read_again`` merges it); a message
    that does not decode goes first, to be dead-lettered, and so does a tenant tree sent without
    a time (its event time was the clock when it first came, which the store lost with it)."""
    try:
        items = decode_message(message.kind, message.raw, max_bytes)
    except BadInput:
        return -math.inf
    times = [item.event.time for item in items if item.__class__ is not BadElement]
    return min((-math.inf if t is None else t for t in times), default=-math.inf)


def backoff(first: float, longest: float):
    """Waits before successive retries: ``first``, doubling up to ``longest``."""
    delay = first
    while True:
        yield delay
        delay = min(2 * delay, longest)


async def waiting_for(action, log_event: str, retry_on: type | tuple = Exception,
                      delays: tuple[float, float] = (0.5, 10.0), **fields):
    """``await action()`` until it succeeds: for a service that is not up yet. Each failure of
    ``retry_on`` is logged as ``log_event`` (with ``fields``, the error and the wait) and tried
    again after ``backoff(*delays)``."""
    waits = backoff(*delays)
    while True:
        try:
            return await action()
        except retry_on as exc:
            delay = next(waits)
            log.warning(log_event, **fields, error=f"{type(exc).__name__}: {exc}", retry_in_s=delay)
            await asyncio.sleep(delay)


async def _acknowledged(acks: list) -> None:
    if acks:
        await asyncio.gather(*acks)


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


def recent_config_rejected(letter: DeadLetter) -> tuple[str, str] | None:
    """A dead-lettered tenants.config as (cluster, recent event), if its cluster can be read."""
    try:
        body = loads(letter.raw)
    except Exception:  # noqa: BLE001 - not JSON: no cluster to show it under
        return None
    cluster = body.get("cluster") if isinstance(body, dict) else None
    if not isinstance(cluster, str):
        return None
    at = body.get("time")
    return cluster, dumps_text({"kind": "config_rejected", "time": at if isinstance(at, (int, float)) else None,
                                "message": letter.reason})


def _dead_letter(message: Incoming, index: int | None, reason: str) -> DeadLetter:
    """A dead letter for one event of ``message`` (element ``index`` of a batch message, whose
    position the reason then starts with)."""
    if index is not None:
        reason = f"[{index}] {reason}"
    return DeadLetter(message.topic, message.partition, message.offset, reason, element_bytes(message.raw, index), index)


def _cluster_of(message: dict) -> str:
    """A dead letter's message key: the cluster its original names, if it is a JSON object
    that does (orjson: any original, however deep, only raises a ValueError)."""
    original = message.get("original")
    if isinstance(original, str):
        try:
            doc = loads(original)
            if isinstance(doc, dict) and isinstance(doc.get("cluster"), str):
                return doc["cluster"]
        except ValueError:
            pass
    return ""
