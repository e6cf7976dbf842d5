"""The steps a worker holds open across batches (issue 59.7): a cluster's last step, whose
``--step-window`` a batch's end cut, waits for the next batch's events (``stepper.run_steps``'
``hold_open``; its input is committed with the batch, ``BatchCommit.open_steps``). Here: when
each is due, the task that closes those due (as a batch of no input: ``Processor._close``), and
which the store holds open for this worker at start. Where Kafka's batches happen to end then
does not change what the worker decides."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

import structlog

from fairstream.state.engine_snapshot import SnapshotError
from fairstream.streams.journal import held_from
from fairstream.streams.prometheus import WorkerMetrics
from fairstream.streams.publishing import Outputs
from fairstream.streams.session import ClusterSession
from fairstream.streams.stepping import Applied, BatchOutcome, Enqueued

log = structlog.get_logger("fairstream.worker")


class StepsHolder(Protocol):
    """What closing held steps uses of the worker's processor (``Processor`` is one): its
    sessions, its lock and the steps of its pipeline that run under it."""

    _lock: asyncio.Lock
    metrics: WorkerMetrics
    outputs: Outputs

    @property
    def sessions(self) -> dict[str, ClusterSession]: ...

    async def session(self, cluster: str) -> ClusterSession: ...

    async def _start_locked(self) -> None: ...

    async def _close(self, clusters: list[str], journaled: tuple[str, int] | None = None) -> Enqueued: ...

    async def _settle(self, outcome: BatchOutcome, outbox: list[tuple[str, dict]], acks: asyncio.Task) -> None: ...


class OpenSteps:
    """The open steps of ``processor``'s sessions: each is closed ``step_wait`` seconds after a
    batch last gave it events, and never later than ``step_window`` + ``step_wait`` after it
    opened (events that keep coming at one event time must not hold it for ever). ``step_wait``
    0: no step is held open."""

    def __init__(self, processor: StepsHolder, step_wait: float, step_window: float) -> None:
        self.processor = processor
        self.step_wait, self.step_window = step_wait, step_window
        self._closer: asyncio.Task | None = None

    def due(self, session: ClusterSession) -> float:
        """When ``session``'s step held open is closed (monotonic seconds)."""
        return min(session.open_touched + self.step_wait, session.open_since + self.step_window + self.step_wait)

    def due_now(self) -> list[str]:
        """The clusters whose step held open is due now, in order."""
        now = time.monotonic()
        return sorted(cluster for cluster, session in self.processor.sessions.items()
                      if session.open_items and now >= self.due(session))

    def watch(self) -> None:
        """Start the task that closes the steps held open when due, unless it runs."""
        if self.step_wait > 0 and (self._closer is None or self._closer.done()):
            self._closer = asyncio.get_running_loop().create_task(self._close_when_due())

    @property
    def idle(self) -> bool:
        """No step is held open and the closing task is done (what a test waits for)."""
        return (not any(s.open_items for s in self.processor.sessions.values())
                and (self._closer is None or self._closer.done()))

    def cancel(self) -> None:
        if self._closer is not None:
            self._closer.cancel()

    async def close_due(self) -> Applied | None:
        """Take the steps held open that are due, as a batch (``Processor._close``): committed,
        and its outputs enqueued (``Applied.published``); None when none is due."""
        processor = self.processor
        async with processor._lock:
            await processor._start_locked()
            due = self.due_now()
            if not due:
                return None
            stages = processor.metrics.stages
            outcome, outbox, acks = await stages.run(processor._close(due))
            published = processor.outputs.published_task(outbox, acks, outcome)
        if outcome.held_since is not None:  # the latency of the input the closed steps held
            since = outcome.held_since
            published.add_done_callback(lambda done: processor.metrics.count_published([], since, done))
        return Applied(outcome, published)

    async def close_now(self, closing: dict[str, str], journaled: tuple[str, int]) -> None:
        """Close the steps a journal record says a timer closed, while the lock is held (a
        rebuild, ``rebuild.read_again``): those that start where the record says (``held_from``)."""
        processor, clusters = self.processor, []
        for cluster, first in closing.items():
            session = await processor.session(cluster)
            if session.open_items and held_from(session.open_items) == first:
                clusters.append(cluster)
        await processor._settle(*await processor._close(clusters, journaled))

    async def _close_when_due(self) -> None:
        """Until no session holds a step open: sleep until the first is due, close what is due.
        A failure (the store down) is logged and tried again a moment later; the sessions it
        touched are then recovered from the store, their steps still open."""
        while True:
            due = [self.due(s) for s in self.processor.sessions.values() if s.open_items]
            if not due:
                return
            wait = min(due) - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
                continue
            try:
                applied = await self.close_due()
                if applied is not None:
                    await asyncio.shield(applied.published)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # tried again: the steps stay open meanwhile
                log.warning("worker.open_steps_unclosed", error=str(exc))
                await asyncio.sleep(max(self.step_wait, 0.5))

    async def load(self, held: dict, assigned: set[str], session: Callable[[str], Awaitable[ClusterSession]]) -> None:
        """Hold the sessions (``session``) of the clusters whose step the store holds open
        (``held``: ``StateStore.open_steps``) from the partitions this worker consumes
        (``assigned``): their wait runs from now (a cluster that sends nothing more is not
        loaded by a batch)."""
        for cluster, entries in held.items():
            positions = {f"{entry.get('topic')}:{entry.get('partition')}" for entry in entries
                         if isinstance(entry, dict)} if isinstance(entries, list) else set()
            if cluster not in self.processor.sessions and positions & assigned:
                try:
                    await session(cluster)
                except SnapshotError as exc:
                    log.error("worker.cluster_unreadable", cluster=cluster, reason=str(exc))
