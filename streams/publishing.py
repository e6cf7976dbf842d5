"""Stage five of a batch (``Processor``): its outputs to the broker. The journal's record first,
acknowledged before anything else of the batch is sent (``streams/journal.py``), then the
decisions and dead letters in order; once the broker has them all, the batch's outbox is cleared
from the store and its decisions counted. Whatever fails is sent again (decisions are
idempotent by id) until it is through."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import cast

import structlog

from fairstream.state.store import OutboxEntry
from fairstream.streams.journal import JOURNAL_KEY
from fairstream.wire.jsoncodec import loads
from fairstream.wire.retry import Retry, waiting_for
from fairstream.wire.topics import Topics

log = structlog.get_logger("fairstream.worker")

# publish(topic, key, message) enqueues the message (in call order) and returns an awaitable that
# resolves when the broker has it, or None when there is nothing to wait for.
Publish = Callable[[str, str, dict], Awaitable["Awaitable | None"]]


class Outputs:
    def __init__(self, publish: Publish, topics: Topics, metrics,
                 clear_outbox: Callable[[list[list[OutboxEntry]]], Awaitable[None]]) -> None:
        self.publish = publish
        self.topics = topics
        self.metrics = metrics
        self.clear_outbox = clear_outbox
        # Per journal position, the offset after the last record the broker acknowledged: where
        # a rebuild starts reading, committed with the next batch.
        self.journaled: dict[str, int] = {}
        self.retry_delays = (0.1, 5.0)  # sending a batch's outputs again: first wait, longest
        self._enqueuing: asyncio.Task | None = None  # the last batch's outputs being enqueued

    async def enqueue_in_order(self, outbox: list[OutboxEntry]) -> asyncio.Task:
        """Enqueue a committed batch's ``outbox`` (``enqueue``: its journal record sent and
        acknowledged, then its decisions handed to the producer) after the previous batch's, in
        a task that resolves to the acknowledgements to wait for. Called with the processor's
        lock held, it returns once the previous batch's outputs are enqueued: a batch's journal
        round trip overlaps the next batch's pass and commit, outputs go in the order of the
        commits, and at most one batch's are being enqueued outside the lock (a broker that
        does not acknowledge holds the next batch's lock)."""
        previous = self._enqueuing
        if previous is not None and previous.done():
            previous = None  # (nothing to wait for; maybe of a loop that is gone, as in tests)
        self._enqueuing = enqueuing = asyncio.get_running_loop().create_task(self._enqueue_after(previous, outbox))
        if previous is not None:
            await asyncio.wait([previous])
        return enqueuing

    async def _enqueue_after(self, previous: asyncio.Task | None, outbox: list[OutboxEntry]) -> list:
        if previous is not None:
            await asyncio.wait([previous])  # (its failure is its batch's: ``published`` enqueues it again)
        return await self.metrics.stages.run(self.enqueue(outbox))

    def published_task(self, outbox: list[OutboxEntry], acks: list | asyncio.Future | None,
                       outcome) -> asyncio.Task:
        """``published`` as a task, its CPU time counted to its stage (``streams/stages.py``)."""
        return asyncio.get_running_loop().create_task(self.metrics.stages.run(self.published(outbox, acks, outcome)))

    async def enqueued(self) -> None:
        """Wait until the last batch's outputs are enqueued (or failed to be)."""
        if self._enqueuing is not None and not self._enqueuing.done():
            await asyncio.wait([self._enqueuing])

    async def enqueue(self, outbox: list[OutboxEntry]) -> list:
        """Enqueue every message in order, the journal's records first, once the broker has
        them (a decision is never published before its batch is in the journal); returns the
        acknowledgements to wait for."""
        journal = self.topics.journal
        records = [message for topic, message in outbox if topic == journal]
        stages = self.metrics.stages
        if records:
            with stages.stage("journal"):
                await waiting_for(lambda: self._journal(records), "worker.journal_unpublished",
                                  delays=self.retry_delays)
        acks = []
        with stages.stage("publish"):
            for topic, message in outbox:
                if topic == journal:
                    continue
                ack = await self.publish(topic, message.get("cluster") or _cluster_of(message), message)
                if ack is not None:
                    acks.append(ack)
        return acks

    async def _journal(self, records: list[dict]) -> None:
        """Publish journal ``records`` and wait until the broker has them."""
        acks = [await self.publish(self.topics.journal, JOURNAL_KEY, record) for record in records]
        for ack in acks:
            if ack is None:
                continue
            sent = await ack
            partition, offset = getattr(sent, "partition", None), getattr(sent, "offset", None)
            if isinstance(partition, int) and isinstance(offset, int):
                position = f"{self.topics.journal}:{partition}"
                self.journaled[position] = max(self.journaled.get(position, 0), offset + 1)

    async def published(self, outbox: list[OutboxEntry], acks: list | asyncio.Future | None, outcome) -> None:
        """Wait for the broker to have a batch's outputs, then clear them from the outbox; if
        either fails, enqueue the outputs again (decisions are idempotent by id) and retry.
        Then count them (``outcome``: the batch's ``BatchOutcome``)."""
        with self.metrics.stages.stage("settle"):
            await self._settle(outbox, acks)
        self._count(outbox, outcome)

    async def _settle(self, outbox: list[OutboxEntry], acks: list | asyncio.Future | None) -> None:
        retry: Retry | None = None  # (made at the first failure: most batches have none)
        acknowledged = False
        while True:
            try:
                if acks is None:
                    acks = await self.enqueue(outbox)
                elif isinstance(acks, asyncio.Future):  # being enqueued (``Outputs.enqueue_in_order``)
                    acks = await acks
                await acknowledged_all(cast(list, acks))  # (awaited above)
                acknowledged = True
                await self.clear_outbox([outbox])
                return
            except Exception as exc:
                retry = retry or Retry("worker.publish_failed", self.retry_delays, level="error", messages=len(outbox))
                await retry.after(exc, acknowledged=acknowledged)
                if not acknowledged:
                    acks = None

    def _count(self, outbox: list[OutboxEntry], outcome) -> None:
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


async def acknowledged_all(acks: list) -> None:
    if acks:
        await asyncio.gather(*acks)


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
