"""The worker's input as it arrives: one Kafka message (``Incoming``), and Kafka's record of the
input as the worker reads it again after Redis lost writes (``InputLog``, ``streams/app.py``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol


class UnreadableBatch(bytes):
    """The value of the one message that stands for a compressed batch the worker could not
    read (``streams/unreadable.py``): no bytes, and ``reason``, which its dead letter gives. A
    client cannot make one: it is made by the worker's own Kafka reader."""

    reason: str

    def __new__(cls, reason: str) -> UnreadableBatch:
        made = super().__new__(cls, b"")
        made.reason = reason
        return made


@dataclass(frozen=True)
class Incoming:
    """One input message as the agent received it."""

    kind: str  # submitted | completed | heartbeat | config
    raw: bytes  # (an ``UnreadableBatch`` for a batch that could not be read)
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

    def read(self, ranges: dict[str, tuple[int, int]]) -> AsyncIterator[tuple[str, list[Incoming], bool]]:
        """Each position's (``"topic:partition"``) messages from offset ``start`` (or where its
        log now begins, if retention dropped that) up to ``end``, excluded: chunks of
        ``(position, messages in offset order, whether the position is done)``."""
        ...

    def journal(self, start: dict[str, int]) -> AsyncIterator[tuple[str, int, object]]:
        """The journal's records (``streams/journal.py``) from offset ``start[position]`` of each
        of its positions (from its beginning where none is given) to its end as of the call,
        each position in order: ``(position, offset, the record decoded from JSON)`` (what is
        not JSON: None)."""
        ...
