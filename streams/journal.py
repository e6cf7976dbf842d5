"""The worker's journal: which input messages it applied, in which batches and in what order,
kept in Kafka (topic ``worker.journal``) beside the input itself.

Why: the engine is deterministic, so the same input in the same batches and order decides the
same. The state store (Redis) logs exactly that, but a Redis that loses acknowledged writes
(restarted empty, restored from an older file) loses it with them; the input is still in
Kafka, but the order the worker first applied it in (arrival order across three topics, the
batches the agents happened to hand over, events applied at the clock when they came late) is
not. Read again in another order, the input can decide otherwise: a task placed on another
node while the agents already run it where it was first placed. With the journal, the worker
reads the input again in the batches it applied it in, and every decision comes out as it was
published, with the id it had (Kafka Streams keeps a state store's changelog in Kafka for the
same reason).

A record is one committed batch: ``{"id": batch id, "read": [[position, first, last], ...]}``,
runs of consecutive messages of one position (``"topic:partition"``) in the order applied,
offsets inclusive (a run takes every message of its position in that range: Kafka offsets may
have gaps). A message the worker rejected without applying (``Processor.reject``) is a record
with ``"rejected": reason``. Steps held open that a timer closed (``OpenSteps.close_due``:
no batch gave them more within ``step_wait``) are a record with ``"read": []`` and ``"close":
{cluster: its first event's place}`` (``held_from``): read again, each is closed at the same
point if the step it holds open starts there (else the store already had it closed). Every record is keyed ``journal``:
one partition, one order.

The processor publishes a batch's record after its commit and before its decisions, and waits
for the broker's acknowledgement in between (``Outputs.enqueue_in_order``): a published decision's
batch is always in the journal. The record is in the batch's outbox too, so a worker that dies
after its commit publishes it again at start, before the decisions; a record may thus be in the
journal twice, and the first copy counts (``unique_records``).
"""

from __future__ import annotations

import uuid
from collections import deque
from collections.abc import AsyncIterator, Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fairstream.streams.incoming import Incoming

JOURNAL_KEY = "journal"


def journal_record(batch: str, messages: Iterable[Incoming], rejected: str | None = None,
                   closing: dict[str, str] | None = None) -> dict:
    """The record of batch ``batch`` (its id) applying ``messages`` in this order (or closing
    the steps ``closing``'s clusters hold open)."""
    runs: list[list] = []
    for message in messages:
        position = message.position
        last = runs[-1] if runs else None
        if last is not None and last[0] == position and last[2] < message.offset:
            last[2] = message.offset
        else:
            runs.append([position, message.offset, message.offset])
    record: dict = {"id": batch, "read": runs}
    if rejected is not None:
        record["rejected"] = rejected
    if closing:
        record["close"] = dict(closing)
    return record


def journal_commit(commit, topic: str, acknowledged: dict[str, int], applying: Iterable[Incoming],
                   journaled: tuple[str, int] | None, rejected: str | None = None,
                   closing: dict[str, str] | None = None) -> None:
    """The journal's part of ``commit`` (a ``BatchCommit``): a new batch's record, first in the
    outbox (published, and acknowledged, before the batch's decisions) with the journal offsets
    ``acknowledged`` so far; a batch applied again from its record (``journaled``: the journal
    position and offset read to) only that offset."""
    if journaled is None:
        commit.outbox.append((topic, journal_record(uuid.uuid4().hex, applying, rejected=rejected, closing=closing)))
        commit.offsets.update(acknowledged)
    else:
        position, offset = journaled
        commit.offsets[position] = offset


def record_closes(record: dict) -> dict[str, str]:
    """The steps held open a record closes: cluster -> where its first event came from
    (``held_from``); none if it is not such a record."""
    closing = record.get("close")
    if not isinstance(closing, dict) or not all(isinstance(v, str) for v in closing.values()):
        return {}
    return closing


def held_from(items: list) -> str:
    """Where the first event of a step held open came from (``"topic:partition:offset:index"``):
    what a close record names it by."""
    _, message, index = items[0]
    return f"{message.position}:{message.offset}:{index}"


def record_runs(record: object) -> list[tuple[str, int, int]] | None:
    """A record's runs as ``(position, first, last)``; None if it is not a journal record (the
    topic is readable and writable by whoever the broker allows: nothing in it is trusted)."""
    if not isinstance(record, dict) or not isinstance(record.get("id"), str):
        return None
    runs = record.get("read")
    if not isinstance(runs, list):
        return None
    out = []
    for run in runs:
        if not (isinstance(run, list) and len(run) == 3 and isinstance(run[0], str)
                and all(type(x) is int and x >= 0 for x in run[1:]) and run[1] <= run[2]):
            return None
        out.append((run[0], run[1], run[2]))
    return out


async def unique_records(records: AsyncIterator[tuple[str, int, Any]]) -> AsyncIterator[tuple[dict, list[tuple[str, int, int]], str, int]]:
    """``records`` as read from the journal (``InputLog.journal``: position, offset, record),
    each batch once (its first copy): ``(record, its runs, its position, its offset)``; what
    is not a journal record is left out."""
    seen: set[str] = set()
    async for position, offset, record in records:
        runs = record_runs(record)
        if runs is None or record["id"] in seen:
            continue
        seen.add(record["id"])
        yield record, runs, position, offset


class RangeBuffer:
    """The input of ``ranges`` (``InputLog.read``), read once and held per position until
    taken: by offset (a journal record's runs, ``take``), then what is left in the order the
    reader gives it (``rest``)."""

    def __init__(self, chunks: AsyncIterator[tuple[str, list, bool]], ranges: dict[str, tuple[int, int]]) -> None:
        self.chunks = chunks
        self.ranges = ranges
        self.held: dict[str, deque] = {position: deque() for position in ranges}
        self.reading = set(ranges)  # positions with more to come
        self.read = 0  # messages read

    async def _read_until(self, position: str, offset: int) -> None:
        held = self.held[position]
        while position in self.reading and (not held or held[-1].offset < offset):
            try:
                read, messages, done = await anext(self.chunks)
            except StopAsyncIteration:  # (a reader that ends without saying every position is done)
                self.reading.clear()
                return
            self.held[read].extend(messages)
            self.read += len(messages)
            if done:
                self.reading.discard(read)

    async def take(self, runs: list[tuple[str, int, int]]) -> list:
        """The held messages of ``runs``, in their order; with a run, every message of its
        position before it that is still held (input no journal record holds: older than the
        journal's retention) comes first. Runs outside ``ranges`` are not this reader's."""
        taken = []
        for position, first, last in runs:
            start, end = self.ranges.get(position, (0, 0))
            if last < start or first >= end:
                continue
            await self._read_until(position, min(last, end - 1))
            held = self.held[position]
            while held and held[0].offset <= last:
                taken.append(held.popleft())
        return taken

    async def rest(self) -> AsyncIterator[tuple[str, list, bool]]:
        """What was not taken, as ``InputLog.read`` gives it: what is held first, then the rest."""
        for position, held in self.held.items():
            if held or position not in self.reading:
                yield position, list(held), position not in self.reading
                held.clear()
        if self.reading:
            async for position, messages, done in self.chunks:
                self.read += len(messages)
                yield position, messages, done
