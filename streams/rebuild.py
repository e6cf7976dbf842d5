"""Reading again what the state store lost (a Redis restarted empty or restored from an older
file), from Kafka: the input, in the batches the journal holds (``streams/journal.py``), then
what no record holds merged in event-time order (docs/architecture.md, "Redis durability")."""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable, Mapping

import structlog

from fairstream.streams.decoding import first_time
from fairstream.streams.incoming import Incoming, InputLog
from fairstream.streams.journal import RangeBuffer, record_closes, unique_records
from fairstream.wire.topics import Topics

log = structlog.get_logger("fairstream.worker")

BATCH = 500  # messages per commit of what no journal record holds


async def owed_by_journal(input_log: InputLog, stored: Mapping[str, int], journal_from: dict[str, int],
                          assigned: set[str], owed: dict[str, int]) -> None:
    """Add to ``owed`` (per position, how far to read again) what the journal holds past the
    store's offsets (``stored``) on the positions this worker consumes (``assigned``): batches
    a store that lost writes no longer has, which Kafka's committed offsets may not cover either
    (Faust commits them every few seconds, the journal is written with every batch). A worker
    killed with kill -9 and restarted on a Redis that forgot would otherwise read them as new
    batches, at a new clock, and decide again under new ids what it had published (a task
    placed twice). Reads the journal from the store's offsets in it (``journal_from``): at a
    normal start the last few records, which the store already covers."""
    async for _, runs, _, _ in unique_records(input_log.journal(journal_from)):
        for position, _first, last in runs:
            if position in assigned and stored.get(position, 0) <= last:
                owed[position] = max(owed.get(position, 0), last + 1)


async def read_again(input_log: InputLog, ranges: dict[str, tuple[int, int]], journal_from: dict[str, int],
                     apply: Callable[[list[Incoming], tuple[str, int] | None], Awaitable[None]],
                     reject: Callable[[Incoming, str, tuple[str, int]], Awaitable[None]], topics: Topics,
                     max_bytes: int,
                     close: Callable[[dict[str, str], tuple[str, int]], Awaitable[None]] | None = None) -> int:
    """Apply again ``ranges`` (per position: the store's offset, and where the worker believed it
    was) with ``apply`` (a batch: applied, committed and published) and ``reject`` (a message the
    journal says was rejected unapplied, with the reason); the journal is read from
    ``journal_from`` (the store's offsets in it), and ``close`` (the steps held open that a
    record says a timer closed). Returns how many messages were read.

    A batch applied again from a journal record is not journaled again: ``apply`` and
    ``reject`` are given the journal position and the offset to commit as read with it, just
    past that record (before it, for input the record holds ahead of a rejected message). So a
    rebuild cut short (the store failing again) goes on from the record it had reached: had it
    committed the worker's latest journal offset, the next rebuild would read no record and
    merge the rest by event time, deciding otherwise than was published.

    First the journal's batches, in its order: each applied as it was first, so it decides
    exactly what was published, with the same ids. Then what no record holds (input the worker
    read but had not committed, or older than the journal's retention): the input topics merged
    in event-time order (heartbeats, then submissions, then completions, then tenant trees at one
    time), each partition in its own order, so a completion comes after the submission it ends."""
    log.warning("worker.reading_again", ranges={p: list(r) for p, r in sorted(ranges.items())})
    held = RangeBuffer(input_log.read(ranges), ranges)
    journaled = 0
    async for record, runs, position, offset in unique_records(input_log.journal(journal_from)):
        closing = record_closes(record)
        if closing and close is not None:
            journaled += 1
            await close(closing, (position, offset + 1))
            continue
        messages = await held.take(runs)
        if not messages:
            continue
        journaled += 1
        if record.get("rejected") is None:
            await apply(messages, (position, offset + 1))
            continue
        if messages[:-1]:  # (input before it that no record holds)
            await apply(messages[:-1], (position, offset))
        await reject(messages[-1], str(record["rejected"]), (position, offset + 1))
    queues: dict[str, deque] = {position: deque() for position in ranges}
    reading = set(ranges)  # positions with more to come
    rank = {topics.heartbeats: 0, topics.submitted: 1, topics.completed: 2}
    batch: list[Incoming] = []
    async for position, messages, done in held.rest():
        queues[position].extend((first_time(m, max_bytes), rank.get(m.topic, 3), m.offset, m) for m in messages)
        if done:
            reading.discard(position)
        # The earliest head goes next, once every position that may still send has one.
        while not any(not queues[p] for p in reading):
            heads = [queue for queue in queues.values() if queue]
            if not heads:
                break
            batch.append(min(heads, key=lambda queue: queue[0][:3]).popleft()[3])
            if len(batch) >= BATCH:
                await apply(batch, None)
                batch = []
    if batch:
        await apply(batch, None)
    log.warning("worker.read_again", messages=held.read, journaled_batches=journaled)
    return held.read
