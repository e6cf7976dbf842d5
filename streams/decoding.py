"""Stage one of a batch (``Processor``): which of its messages are new, and their events, per
cluster, with a dead letter for each that cannot be applied. Pure: no store, broker or clock."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from fairstream.core.model import Event
from fairstream.streams.incoming import Incoming, UnreadableBatch
from fairstream.wire.events import BadElement, BadInput, DeadLetter, Decoded, decode_message, element_bytes


@dataclass
class DecodedBatch:
    applying: list[Incoming] = field(default_factory=list)  # the messages not applied before, in order
    offsets: dict[str, int] = field(default_factory=dict)  # per position, the next offset after them
    # per cluster, in arrival order: (event, the message it came in, its index in a batch message)
    by_cluster: dict[str, list[tuple[Event, Incoming, int | None]]] = field(default_factory=dict)
    dead: list[DeadLetter] = field(default_factory=list)
    skipped: int = 0  # messages whose offsets were applied before (Kafka redelivers after a crash)


def decode_batch(messages: list[Incoming], applied: Mapping[str, int], max_bytes: int) -> DecodedBatch:
    """``messages`` decoded and validated (``fairstream.wire.events``), those below ``applied``
    (per position, the next offset to apply) skipped."""
    out = DecodedBatch()
    for message in messages:
        if message.offset < applied.get(message.position, 0):
            out.skipped += 1
            continue
        out.applying.append(message)
        out.offsets[message.position] = max(out.offsets.get(message.position, 0), message.offset + 1)
        if type(message.raw) is UnreadableBatch:
            out.dead.append(DeadLetter(message.topic, message.partition, message.offset, message.raw.reason, b""))
            continue
        try:
            decoded = decode_message(message.kind, message.raw, max_bytes)
        except BadInput as exc:
            out.dead.append(DeadLetter(message.topic, message.partition, message.offset, str(exc), message.raw))
            continue
        for item in decoded:
            if type(item) is BadElement:
                out.dead.append(dead_letter(message, item.index, item.reason))
            elif message.key is not None and message.key != item.cluster.encode():
                # Keyed by another cluster, it sits in that one's partition, which another
                # worker may own: its cluster's events would be split between workers.
                out.dead.append(dead_letter(message, item.index, f"message key {message.key!r} is not the event's "
                                            f"cluster {item.cluster!r} (key a cluster's events by its id)"))
            else:
                out.by_cluster.setdefault(item.cluster, []).append((item.event, message, item.index))
    return out


def dead_letter(message: Incoming, index: int | None, reason: str) -> DeadLetter:
    """A dead letter for one event of ``message`` (element ``index`` of a batch message, whose
    position the reason then starts with)."""
    if index is not None:
        reason = f"[{index}] {reason}"
    return DeadLetter(message.topic, message.partition, message.offset, reason, element_bytes(message.raw, index), index)


def first_time(message: Incoming, max_bytes: int) -> float:
    """The earliest event time in ``message`` (where a rebuild merges input no journal record
    holds); a message that does not decode goes first, to be dead-lettered, and so does a
    tenant tree sent without a time (its event time was the clock when it first came, which the
    store lost with it)."""
    try:
        items = decode_message(message.kind, message.raw, max_bytes)
    except BadInput:
        return -math.inf
    times = [item.event.time for item in items if type(item) is Decoded]
    return min((-math.inf if t is None else t for t in times), default=-math.inf)


def held_step(items: list[tuple[Event, Incoming, int | None]]) -> list[dict]:
    """The input of a step held open (``stepper.run_steps``' ``open_items``) as the store keeps it
    (``BatchCommit.open_steps``): per event, its message and its index there. (The message, not
    the event: read back, it is decoded and judged again as it first was.)"""
    return [{"kind": m.kind, "topic": m.topic, "partition": m.partition, "offset": m.offset, "produced": m.produced,
             "key": None if m.key is None else m.key.decode(), "raw": bytes(m.raw).decode(), "index": index}
            for _, m, index in items]


def held_items(held: object, max_bytes: int) -> list[tuple[Event, Incoming, int | None]]:
    """``held_step``'s record read back: the items again. Raises ValueError if it is not one
    (the store is not trusted to hold only what the worker wrote)."""
    if not isinstance(held, list):
        raise ValueError("not a list")
    items = []
    for entry in held:
        try:
            message = Incoming(str(entry["kind"]), str(entry["raw"]).encode(), str(entry["topic"]),
                               int(entry["partition"]), int(entry["offset"]), float(entry["produced"]),
                               None if entry["key"] is None else str(entry["key"]).encode())
            index = entry["index"]
            decoded = decode_message(message.kind, message.raw, max_bytes)
            event = next(item.event for item in decoded if type(item) is Decoded and item.index == index)
        except (BadInput, KeyError, TypeError, ValueError, StopIteration) as exc:
            raise ValueError(f"an entry does not decode ({exc.__class__.__name__}: {exc})") from None
        items.append((event, message, index))
    return items
