"""What the worker does with a batch of input messages, independent of Faust and Kafka.

``Processor.handle(messages)``:
1. skip messages whose offsets were already applied (Kafka redelivers after a crash);
2. decode and validate each (bad ones become dead letters with the reason);
3. per cluster, in arrival order, turn events into engine steps: consecutive events within
   ``step_window`` seconds of event time (0: the same time) form one step, taken at the latest
   of their times (a scheduling cycle); an event up to ``max_lateness`` seconds behind the
   cluster's clock is applied at the clock; one further behind is a dead letter only if its
   producer sent it late (``_late``), else it too is applied at the clock; before each step,
   nodes silent for more than ``node_timeout`` seconds (event time) are declared lost;
4. commit the new log steps, offsets, outputs (outbox) and views to the store in one
   transaction, snapshotting an engine when it is due (``_snapshot_due``): in the same
   transaction, or, with ``background_snapshots``, encoded by a forked child after the commit
   and added to the first commit after the child is done (the snapshot is then as of an
   earlier step, and the log after it is replayed as usual);
5. enqueue the outbox for publishing; then, with the next batch free to start, wait for the
   broker's acknowledgements and clear the outbox.

A cluster seen for the first time since start is loaded from the store: its last snapshot,
then the log steps after it replayed through a fresh engine (decisions are deterministic, so
the engine ends exactly where it was). Snapshots are plain data (``state/engine_snapshot.py``);
one that cannot be read is not trusted, and the engine is rebuilt from the retained log instead.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import AsyncIterator, Awaitable, Callable, Mapping, Protocol

import structlog

from fairstream.engine import Engine
from fairstream.jsoncodec import dumps_text, loads
from fairstream.wire.events import (
    BadElement,
    BadInput,
    DeadLetter,
    decision_message,
    decode_message,
    element_bytes,
)
from fairstream.model import Event, NodeLost, TaskCompleted, TaskSubmitted
from fairstream.state.engine_snapshot import SnapshotError, decode_engine, encode_engine
from fairstream.state.store import BatchCommit, ClusterRecord, StaleLog, StateStore, Trim, republishing_order
from fairstream.wire.log import events_in, log_step
from fairstream.wire.log import replay as replay_log
from fairstream.wire.topics import Topics

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
    # from one the worker read late (``Processor._late``).
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


@dataclass
class BatchOutcome:
    decisions: int = 0
    dead_letters: int = 0
    skipped: int = 0
    steps: int = 0
    reasons: list[str] = field(default_factory=list)


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
    ) -> None:
        from fairstream.streams.metrics import WorkerMetrics

        self.metrics = metrics or WorkerMetrics()
        self.store = store
        self.make_engine = make_engine
        self.publish = publish
        self.topics = topics
        self.max_lateness = max_lateness
        self.node_timeout = node_timeout
        self.snapshot_every = snapshot_every
        self.snapshot_ratio = snapshot_ratio
        self.max_bytes = max_bytes
        self.step_window = step_window
        self.log_retention = log_retention
        # Encode snapshots in a forked child (copy-on-write, as Redis's BGSAVE does), so the
        # worker goes on answering while it runs: where the platform has fork().
        self.background_snapshots = background_snapshots and hasattr(os, "fork")
        self.max_engines = max_engines  # cluster engines kept in memory (_evict_idle)
        self.max_ahead = max_ahead  # how far an event may be ahead of its cluster's clock (_run)
        self.snapshotting: dict[str, _Snapshotting] = {}
        self.written_quanta: dict[str, dict[str, float]] = {}  # per cluster: what the quanta view holds
        self.engines: dict[str, Engine] = {}
        self.log_base: dict[str, int] = {}
        self.checkpoints: dict[str, list[tuple[int, float]]] = {}
        self.steps_taken: dict[str, int] = {}
        self.steps_at_snapshot: dict[str, int] = {}
        self.events_since_snapshot: dict[str, int] = {}  # replay cost of the log after the snapshot
        self.time_at_snapshot: dict[str, float] = {}
        self.applied: dict[str, int] = {}
        # Per cluster: the latest ``Incoming.produced`` of the events it applied (kept in the
        # store's "clock" view, so a restarted worker tells late producers from its own backlog).
        self.produced: dict[str, float] = {}
        self.input_log = input_log
        self.consumer_start: dict[str, int] = {}  # consuming_from: Kafka's committed offsets, not yet checked
        self.owed: dict[str, int] = {}  # per position, how far the store must be read up to again (start)
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
            if stored.get(position, 0) < offset:
                self.owed[position] = max(self.owed.get(position, 0), offset)
        self.consumer_start.clear()
        self.applied = stored
        if self.owed and self.input_log is not None:
            await self._read_again({p: (stored.get(p, 0), end) for p, end in self.owed.items()})
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

    async def _read_again(self, ranges: dict[str, tuple[int, int]]) -> None:
        """Apply again, from Kafka, what the store lost: ``ranges`` holds, per position, the
        store's offset and where this worker believed it was (what it had applied, or the
        committed offset the consumer started from), when the store lost writes (a Redis
        restarted empty or restored from an older file). Kafka holds the input.

        The three topics are merged in event-time order (heartbeats, then submissions, then
        completions at one time), each partition in its own order, so a completion comes after
        the submission it ends, as when they were first applied. Applied, committed and
        published in batches like any input; a decision taken again keeps its id where it comes
        out the same (docs/architecture.md, "Redis durability"). Cached engines are dropped
        first: they may hold what the store lost."""
        for cluster in list(self.engines):
            self._drop(cluster)
        log.warning("worker.reading_again", ranges={p: list(r) for p, r in sorted(ranges.items())})
        queues: dict[str, deque] = {position: deque() for position in ranges}
        reading = set(ranges)  # positions with more to come
        rank = {self.topics.heartbeats: 0, self.topics.submitted: 1, self.topics.completed: 2}
        batch: list[Incoming] = []
        read = 0
        async for position, messages, done in self.input_log.read(ranges):
            queues[position].extend((_first_time(m, self.max_bytes), rank.get(m.topic, 3), m.offset, m) for m in messages)
            read += len(messages)
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
        self.metrics.read_again.inc(read)
        log.warning("worker.read_again", messages=read)

    async def _apply_now(self, messages: list[Incoming]) -> None:
        """Apply, commit and publish ``messages`` while the lock is held (``_read_again``)."""
        outcome, outbox, acks = await self._handle(messages)
        await _acknowledged(acks)
        await self.store.clear_outbox([outbox])

    async def forget(self) -> None:
        """Drop cached engines and offsets (partitions were revoked: another worker may now
        append to these clusters' logs); they are reloaded from the store when next needed."""
        async with self._lock:
            for cluster in list(self.engines):
                self._drop(cluster)
            self._started = False

    def _drop(self, cluster: str) -> None:
        for cache in (self.engines, self.steps_taken, self.steps_at_snapshot, self.log_base, self.checkpoints,
                      self.events_since_snapshot, self.time_at_snapshot, self.snapshotting, self.written_quanta,
                      self.produced):
            cache.pop(cluster, None)

    def _retain(self, cluster: str, steps: int, now: float, blob: bytes, commit: BatchCommit) -> None:
        """Bound the input log to about ``log_retention`` seconds of event time.

        A snapshot becomes a checkpoint when the last one is a quarter of the retention old;
        the log's head is trimmed up to the newest checkpoint at least the retention old, which
        becomes the base the kept log replays from. So between R and 1.25 R of the log is kept
        (R = ``log_retention``), with at most about five checkpoints in the store."""
        points = self.checkpoints[cluster]
        if not points or now - points[-1][1] >= self.log_retention / 4:
            points.append((steps, now))
            commit.checkpoints[cluster] = (steps, now, blob)
        old_enough = [point for point in points if point[1] <= now - self.log_retention]
        if old_enough and old_enough[-1][0] > self.log_base[cluster]:
            new_base = old_enough[-1][0]
            dropped = [s for s, _ in points if s < new_base]
            commit.trims[cluster] = Trim(self.log_base[cluster], new_base, dropped)
            self.log_base[cluster] = new_base
            self.checkpoints[cluster] = [point for point in points if point[0] >= new_base]

    async def engine(self, cluster: str) -> Engine:
        """The cluster's engine: cached (moved to the end: ``engines`` is kept in order of last
        use), or recovered from the store."""
        engine = self.engines.pop(cluster, None)
        if engine is not None:
            self.engines[cluster] = engine
        else:
            record = await self.store.load(cluster)
            engine, snapshot_steps, replay = await self._starting_point(cluster, record)
            for _ in replay_log(engine, replay):
                pass
            self.engines[cluster] = engine
            self.steps_taken[cluster] = self.steps_at_snapshot[cluster] = snapshot_steps + len(replay)
            self.events_since_snapshot[cluster] = events_in(replay)
            self.time_at_snapshot[cluster] = engine.time or 0.0
            self.log_base[cluster] = record.log_base
            self.checkpoints[cluster] = list(record.checkpoints)
            self.produced[cluster] = float((await self.store.view(cluster, "clock")).get("produced", 0.0))
            if snapshot_steps or replay:
                log.info("worker.cluster_recovered", cluster=cluster, snapshot_steps=snapshot_steps,
                         replayed_steps=len(replay))
        return engine

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

    def _snapshot_due(self, cluster: str, engine: Engine) -> bool:
        """At least ``snapshot_every`` steps since the last snapshot, and a log after it that
        holds ``snapshot_ratio`` times as many events as the engine holds tasks and remembered
        finished ids (or, with a bounded log, a quarter of its retention of event time).

        Pickling costs time in proportion to that state (about 1 µs per task or id, during
        which the worker answers nothing), replaying the log in proportion to its events: so
        the pause is rare when the state is large, the snapshot's amortised cost per event is
        bounded, and a recovery replays at most about ``snapshot_ratio`` times the state."""
        if self.steps_taken[cluster] - self.steps_at_snapshot[cluster] < self.snapshot_every:
            return False
        if self.events_since_snapshot[cluster] >= self.snapshot_ratio * (len(engine.tasks) + len(engine.finished_ids)):
            return True
        return (engine.time or 0.0) - self.time_at_snapshot[cluster] >= self.log_retention / 4

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
            commit = BatchCommit()
            commit.offsets[message.position] = max(self.applied.get(message.position, 0), message.offset + 1)
            letter = DeadLetter(message.topic, message.partition, message.offset, reason, message.raw)
            log.error("worker.internal_error", topic=message.topic, partition=message.partition,
                      offset=message.offset, reason=reason)
            self.metrics.dead_letters.labels(message.topic).inc()
            self.metrics.internal_errors.labels(message.topic).inc()
            commit.outbox.append((self.topics.deadletter, letter.to_json()))
            await self.store.commit(commit)
            self.applied.update(commit.offsets)
            outcome = BatchOutcome(dead_letters=1, reasons=[reason])
            acks = await self._enqueue(commit.outbox)
            published = asyncio.get_running_loop().create_task(self._published(commit.outbox, acks, outcome))
        return Applied(outcome, published)

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
        for topic, message in outbox:
            if topic == self.topics.decisions:
                kinds[message["kind"]] += message.get("count", 1)  # a decision of a request's tasks
        for kind, count in kinds.items():
            self.metrics.decisions.labels(kind).inc(count)
        self.metrics.steps.inc(outcome.steps)

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
        fork_after_commit: list[tuple[str, Engine, int, float]] = []
        for message in messages:
            if message.offset < self.applied.get(message.position, 0):
                outcome.skipped += 1
                continue
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

        try:
            await self._step_clusters(by_cluster, commit, outcome, dead, fork_after_commit)
            for letter in dead:
                log.warning("worker.dead_letter", topic=letter.topic, partition=letter.partition,
                            offset=letter.offset, reason=letter.reason)
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
                self._drop(cluster)
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
        for cluster, engine, steps, at in fork_after_commit:
            self.snapshotting[cluster] = _Snapshotting(steps, at, _snapshot_in_child(engine))
        self._evict_idle(keep=by_cluster)
        return outcome, commit.outbox, await self._enqueue(commit.outbox)

    async def _step_clusters(self, by_cluster, commit: BatchCommit, outcome: BatchOutcome, dead: list[DeadLetter],
                             fork_after_commit: list) -> None:
        """Each cluster's events through its engine, into ``commit`` (steps, outbox, views,
        snapshots)."""
        for cluster, items in by_cluster.items():
            try:
                engine = await self.engine(cluster)
            except SnapshotError as exc:
                # Its state is gone to this worker: applying events to a fresh engine would
                # forget what runs where. Dead-lettered with the reason, not dropped.
                log.error("worker.cluster_unreadable", cluster=cluster, reason=str(exc))
                dead.extend(_dead_letter(message, index, f"cluster {cluster}: its state in the store cannot be "
                                         f"read, so its events are not applied ({exc})")
                            for _, message, index in items)
                continue
            steps, decisions, touched = self._run(cluster, engine, items, dead)
            commit.steps[cluster] = steps
            commit.expected_steps[cluster] = self.steps_taken[cluster]  # fencing: the log as this worker left it
            outcome.steps += len(steps)
            outcome.decisions += len(decisions)
            commit.outbox.extend((self.topics.decisions, decision_message(cluster, d)) for d in decisions)
            commit.views[cluster] = views(engine, touched, touched_nodes(steps),
                                          self.written_quanta.setdefault(cluster, {}))
            commit.views[cluster]["clock"] = {"time": dumps_text(engine.time), "produced": dumps_text(self.produced[cluster])}
            self.steps_taken[cluster] += len(steps)
            self.events_since_snapshot[cluster] += events_in(steps)
            self._land_snapshot(cluster, commit)
            if cluster not in self.snapshotting and self._snapshot_due(cluster, engine):
                steps_now, time_now = self.steps_taken[cluster], engine.time or 0.0
                self.steps_at_snapshot[cluster] = steps_now
                self.events_since_snapshot[cluster] = 0
                self.time_at_snapshot[cluster] = time_now
                if self.background_snapshots:
                    fork_after_commit.append((cluster, engine, steps_now, time_now))
                else:
                    self._add_snapshot(cluster, steps_now, time_now, _encoded(engine), commit)

    def _evict_idle(self, keep) -> None:
        """Drop the engines used longest ago while more than ``max_engines`` are cached (never
        those of the batch just applied). Their state is in the store: a cluster heard from
        again is recovered as after a restart. So a flood of new cluster ids costs memory for
        at most ``max_engines`` engines; their keys in Redis stay (they are the clusters' state)."""
        while len(self.engines) > self.max_engines:
            oldest = next(iter(self.engines))
            if oldest in keep:  # a batch of more clusters than the cap keeps them all
                return
            self._drop(oldest)
            log.info("worker.engine_evicted", cluster=oldest, cached=len(self.engines))

    def _add_snapshot(self, cluster: str, steps: int, at: float, blob: bytes, commit: BatchCommit) -> None:
        commit.snapshots[cluster] = (blob, steps)
        if math.isfinite(self.log_retention):
            self._retain(cluster, steps, at, blob, commit)

    def _land_snapshot(self, cluster: str, commit: BatchCommit) -> None:
        """Add a finished background snapshot of ``cluster`` to ``commit``: the engine as of
        ``steps``, before this batch's steps, which the log after it replays."""
        pending = self.snapshotting.get(cluster)
        if pending is None or not pending.blob.done():
            return
        del self.snapshotting[cluster]
        if pending.blob.cancelled() or pending.blob.exception() is not None:
            # Nothing lost: the last snapshot and the longer log still recover the engine.
            log.error("worker.snapshot_failed", cluster=cluster, steps=pending.steps,
                      error=str(pending.blob.exception() or "cancelled"))
            return
        blob = pending.blob.result()
        log.info("worker.snapshot_stored", cluster=cluster, steps=pending.steps, bytes=len(blob))
        self._add_snapshot(cluster, pending.steps, pending.time, blob, commit)

    async def _enqueue(self, outbox: list[tuple[str, dict]]) -> list:
        """Enqueue every message in order; returns the acknowledgements to wait for."""
        acks = []
        for topic, message in outbox:
            ack = await self.publish(topic, message.get("cluster") or _cluster_of(message), message)
            if ack is not None:
                acks.append(ack)
        return acks

    def _run(self, cluster: str, engine: Engine, items: list[tuple[Event, Incoming, int | None]], dead: list[DeadLetter]):
        """Events in arrival order to engine steps; returns (log steps, decisions, tenants whose
        accounting an event or decision of this batch changed)."""
        steps: list[dict] = []
        decisions = []
        touched: set[str] = set()
        group: list[tuple[Event, Incoming, int | None]] = []
        group_time: float | None = None  # the step's time: the latest event time in the group
        group_start: float | None = None

        def flush() -> None:
            if not group:
                return
            events = [e for e, _, _ in group]
            lost = self._silent_nodes(engine, group_time)
            step_events = lost + events
            result = engine.step(group_time, step_events)
            steps.append(log_step(group_time, step_events))
            decisions.extend(result.decisions)
            touched.update(d.tenant for d in result.decisions)
            touched.update(t.tenant for t in result.finished)
            touched.update(e.tenant for e in events if isinstance(e, TaskSubmitted))
            origin = {id(e): (m, index) for e, m, index in group}
            for event, reason in result.rejected:
                if id(event) in origin:
                    message, index = origin[id(event)]
                    dead.append(_dead_letter(message, index, reason))
            group.clear()

        produced = self.produced.get(cluster, 0.0)
        admission = engine.admission()  # what the engine would reject, before it moves the clock
        for event, message, index in items:
            clock = engine.time if group_time is None else group_time
            time = event.time
            if clock is not None and time > clock + self.max_ahead + max(0.0, message.produced - produced):
                dead.append(_dead_letter(message, index,
                                         f"time {time} is {time - clock:.3f} s ahead of the cluster clock {clock} "
                                         f"(more than max_ahead {self.max_ahead} s beyond how far its producer's "
                                         f"clock moved)"))
                continue
            if clock is not None and time < clock:
                if clock - time > self.max_lateness and self._late(event, message, produced):
                    dead.append(_dead_letter(message, index,
                                             f"time {time} is {clock - time:.3f} s behind the cluster clock {clock} "
                                             f"(more than max_lateness {self.max_lateness} s), and it was produced "
                                             f"after the events that moved the clock"))
                    continue
                event = _at(event, clock)  # late: applied now, recorded as applied
                time = clock
            if group_time is not None and (time > group_start + self.step_window or (self.step_window == 0 and time != group_time)):
                flush()  # the engine's clock is now the group's time
                group_start = group_time = None
                admission = engine.admission()  # against the state with the group applied
            reason = admission.check(event)
            if reason is not None:  # rejected before its time counts: it moves nothing
                dead.append(_dead_letter(message, index, reason))
                continue
            produced = max(produced, message.produced)
            if group_start is None:
                group_start = time
            group_time = time if group_time is None else max(group_time, time)
            group.append((event, message, index))
        flush()
        self.produced[cluster] = produced
        return steps, decisions, touched

    @staticmethod
    def _late(event: Event, message: Incoming, produced: float) -> bool:
        """Whether an event more than ``max_lateness`` behind its cluster's clock was sent late
        by its producer, and so is a dead letter.

        Not a completion: it reports that a known task is done, and dropping it would leave the
        task holding its resources for ever; it is applied at the clock. Not an event produced
        before one the cluster already applied (``produced``, the latest record timestamp so
        far): that one is only late because the worker read it late, catching up after an
        outage or reading one topic ahead of another, and is applied at the clock too. The
        record timestamps come from the producers' clocks, so skew between a cluster's
        producers moves this line by as much."""
        return not isinstance(event, TaskCompleted) and message.produced >= produced

    def _silent_nodes(self, engine: Engine, now: float) -> list[Event]:
        if math.isinf(self.node_timeout):
            return []
        return [NodeLost(now, n.id) for n in engine.nodes if n.alive and now - n.last_heartbeat > self.node_timeout]


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
    that does not decode goes first, to be dead-lettered."""
    try:
        items = decode_message(message.kind, message.raw, max_bytes)
    except BadInput:
        return -math.inf
    return min((item.event.time for item in items if item.__class__ is not BadElement), default=-math.inf)


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


@dataclass
class _Snapshotting:
    """A snapshot being encoded in a child process: the engine as of ``steps`` log steps."""

    steps: int
    time: float
    blob: asyncio.Future  # the encoded engine


def _snapshot_in_child(engine: Engine) -> asyncio.Future:
    """Encode ``engine`` in a forked child that writes it to a pipe; a thread of the default
    executor reads it (``os.read`` releases the interpreter lock) and reaps the child.

    The child sees the memory as it was at the fork, copy-on-write, whatever the worker does
    meanwhile; it runs only the encoder and leaves with ``os._exit`` (no finalizers, no
    flush of buffers it shares with the parent)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        status = 1
        try:
            os.close(read_end)
            view = memoryview(_encoded(engine))
            while view:
                view = view[os.write(write_end, view):]
            status = 0
        finally:
            os._exit(status)
    os.close(write_end)
    future = asyncio.get_running_loop().run_in_executor(None, _collect_snapshot, pid, read_end)
    future.add_done_callback(lambda done: done.cancelled() or done.exception())  # read in _land_snapshot
    return future


def _collect_snapshot(pid: int, read_end: int) -> bytes:
    chunks = []
    try:
        while chunk := os.read(read_end, 1 << 20):
            chunks.append(chunk)
    finally:
        os.close(read_end)
        _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code != 0:  # negative: killed by that signal (the kernel's OOM killer, say)
        raise RuntimeError(f"the snapshot process exited with code {code}")
    return b"".join(chunks)


def _encoded(engine: Engine) -> bytes:
    # The collector would walk the whole heap several times while the encoder allocates its
    # lists; nothing it could free is made here, so it waits until the snapshot is taken.
    import gc

    enabled = gc.isenabled()
    gc.disable()
    try:
        return encode_engine(engine)
    finally:
        if enabled:
            gc.enable()


def _dead_letter(message: Incoming, index: int | None, reason: str) -> DeadLetter:
    """A dead letter for one event of ``message`` (element ``index`` of a batch message, whose
    position the reason then starts with)."""
    if index is not None:
        reason = f"[{index}] {reason}"
    return DeadLetter(message.topic, message.partition, message.offset, reason, element_bytes(message.raw, index), index)


def _at(event: Event, time: float) -> Event:
    from dataclasses import replace

    return replace(event, time=time)


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


def touched_nodes(steps: list[dict]) -> set[str]:
    """Nodes whose registry entry (capacity, liveness, last heartbeat, labels) ``steps`` may
    have changed: those their events name (a placement changes none of these)."""
    nodes = set()
    for step in steps:
        nodes.update(e["node"] for e in step["events"] if "node" in e)
    return nodes


def views(engine: Engine, tenants: set[str] | None = None, nodes: set[str] | None = None,
          written_quanta: dict[str, float] | None = None) -> dict[str, dict[str, str]]:
    """Readable state for operators: accumulated usage per tenant in the current round (as of
    the tenant's last event or decision), quanta, and the node registry (JSON strings per
    field); only for ``tenants`` and ``nodes`` if given. With ``written_quanta`` (the quanta
    already in the store, updated here), only quanta that differ from it: they change only
    when the Quantum Updater moves them."""

    acc = engine.accounting
    now = engine.time or 0.0
    names = engine.resources.names
    usage = {}
    quanta = {}
    if tenants is None:
        rows = list(range(len(acc.ledgers)))
    else:  # by name, not a scan of every tenant: a pass touches a few of thousands
        rows = sorted(acc.row[name] for name in tenants if name in acc.row)
    keys = acc.usage_keys(rows, now)  # one vectorised call for all of them
    raw, counted, allocation = (acc.raw_usage[rows].tolist(), acc.counted_usage[rows].tolist(),
                                acc.allocation[rows].tolist())
    for i, row in enumerate(rows):
        name = acc.ledgers[row].name
        usage[name] = dumps_text({
            "round_start": acc.round_start,
            "raw": dict(zip(names, raw[i])),
            "counted": dict(zip(names, counted[i])),
            "allocation": dict(zip(names, allocation[i])),
            "usage_key": keys[i],
        })
        quantum = acc.quantum(row)
        if written_quanta is None or written_quanta.get(name) != quantum:
            quanta[name] = dumps_text(quantum)
            if written_quanta is not None:
                written_quanta[name] = quantum
    node_view = {
        n.id: dumps_text({"capacity": dict(zip(names, n.capacity.tolist())), "alive": n.alive,
                          "last_heartbeat": n.last_heartbeat, "labels": n.labels})
        for n in engine.nodes if nodes is None or n.id in nodes
    }
    return {f"usage:{acc.round_start:g}": usage, "quanta": quanta, "nodes": node_view}
