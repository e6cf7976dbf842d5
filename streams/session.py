"""One cluster's state in the worker (``ClusterSession``): its engine and what the worker knows of
the cluster's log and views in the store; and the sessions it holds (``Sessions``). Forgetting a
cluster is dropping its session."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import structlog

from fairstream.core.engine import Engine
from fairstream.state.engine_snapshot import SnapshotError, decode_engine
from fairstream.state.store import ClusterRecord, StateStore
from fairstream.streams.decoding import held_items
from fairstream.streams.snapshots import Snapshotting
from fairstream.wire.log import events_in
from fairstream.wire.log import replay as replay_log

log = structlog.get_logger("fairstream.worker")


@dataclass
class ClusterSession:
    engine: Engine
    log_base: int  # log steps trimmed off the head: the kept log replays from this step
    checkpoints: list[tuple[int, float]]  # (log steps, event time) of the kept checkpoints
    steps_taken: int  # log steps the store holds, as this worker left it (fencing)
    steps_at_snapshot: int  # log steps the last snapshot holds
    events_since_snapshot: int  # events in the log after it: the cost of a recovery's replay
    time_at_snapshot: float  # event time of the last snapshot
    # The latest ``Incoming.produced`` of the events the cluster applied (kept in the store's
    # "clock" view, so a restarted worker tells late producers from its own backlog).
    produced: float
    written_quanta: dict[str, float] = field(default_factory=dict)  # what the store's quanta view holds
    snapshotting: Snapshotting | None = None  # a snapshot being encoded in a child
    # The explanation view (``streams.stepping.Stepping.explain``): when it was last written
    # (monotonic seconds), and whether the cluster changed since.
    explained_at: float = -math.inf
    explain_due: bool = False
    # The step held open (``stepper.run_steps``' ``open_items``: a batch ended inside its step
    # window), when a batch last gave it events and when it opened (monotonic seconds): closed
    # by an event beyond its window, or on a timer (``open_steps.OpenSteps``).
    open_items: list = field(default_factory=list)
    open_touched: float = 0.0
    open_since: float = 0.0


class Sessions:
    """The clusters' sessions this worker holds in memory, in order of last use (``get`` moves a
    cluster to the end), at most ``max_engines`` of them (``evict_idle``). A cluster not held is
    recovered from the store: its last snapshot, then the log after it replayed through the
    engine (``fairstream.wire.log.replay``: decisions are deterministic, so it ends exactly
    where it was). A snapshot that cannot be read is not trusted: the engine is rebuilt from
    the retained log instead."""

    def __init__(self, store: StateStore, make_engine: Callable[[], Engine], metrics, max_engines: int = 1000,
                 max_bytes: int = 64 * 1024) -> None:
        self.store = store
        self.max_bytes = max_bytes
        self.make_engine = make_engine
        self.metrics = metrics
        self.max_engines = max_engines
        self.held: dict[str, ClusterSession] = {}

    async def get(self, cluster: str) -> ClusterSession:
        """The cluster's session: held (moved to the end), or recovered from the store. Raises
        ``SnapshotError`` when its state cannot be read (``_starting_point``)."""
        session = self.held.pop(cluster, None)
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
            if record.open_step is not None:
                try:
                    session.open_items = held_items(record.open_step, self.max_bytes)
                except ValueError as exc:
                    raise SnapshotError(f"the step it holds open cannot be read: {exc}") from None
                session.open_touched = session.open_since = time.monotonic()  # (its wait starts again)
            if snapshot_steps or replay:
                log.info("worker.cluster_recovered", cluster=cluster, snapshot_steps=snapshot_steps,
                         replayed_steps=len(replay))
        self.held[cluster] = session
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

    def evict_idle(self, keep) -> None:
        """Drop the engines used longest ago while more than ``max_engines`` are held (never
        those of ``keep``, the batch just applied). Their state is in the store: a cluster heard
        from again is recovered as after a restart. So a flood of new cluster ids costs memory
        for at most ``max_engines`` engines; their keys in Redis stay (they are the clusters' state)."""
        while len(self.held) > self.max_engines:
            # (Not one holding a step open: it is closed on a timer, from the sessions held.)
            oldest = next((c for c, session in self.held.items() if not session.open_items), None)
            if oldest is None or oldest in keep:  # a batch of more clusters than the cap keeps them all
                return
            del self.held[oldest]
            log.info("worker.engine_evicted", cluster=oldest, cached=len(self.held))
