"""Compressed batches the worker cannot read: one dead letter each, never a crash.

Kafka producers compress batches of messages (gzip, snappy, lz4, zstd); the consumer
decompresses a batch when it hands out its first message. The worker reads all four (aiokafka's
codecs, through ``cramjam``, a dependency). A batch it still cannot read (the library missing
from an install, a codec Kafka does not know, data that does not decompress) made aiokafka
raise from the middle of a fetch: Faust's consumer stopped the worker, and a restarted worker
met the same batch at the same offset and stopped again, for ever.

With ``install()`` (the worker does it at start), a batch is decompressed when it is taken
from a fetch; one that cannot be is handed on as a single message at its last offset whose
value is an ``UnreadableBatch`` (no bytes, and the reason). The processor dead-letters it with
that reason (``decoding.decode_batch``), so its offsets are committed and a restart goes past
it; the worker logs one line, ``worker.batch_unreadable``, with the partition, the offsets and
the codec. The messages in it are not applied: the producer sends them again (uncompressed, or
once the worker can read the codec). The rebuild's reader (``app.KafkaInputLog``) goes through
the same path, so a rebuild rejects the batch as the worker did.

aiokafka has no hook for this; ``install`` replaces the class its fetcher builds for a
partition's fetched data (``aiokafka.consumer.fetcher.PartitionRecords``) with a subclass whose
records come through ``ReadableRecords``, for every consumer in the process.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import structlog

from fairstream.streams.incoming import UnreadableBatch

log = structlog.get_logger("fairstream.worker")

CODECS = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}  # Kafka's compression codec ids


class _Record(NamedTuple):
    """What aiokafka reads off a record to build a ``ConsumerRecord``."""

    offset: int
    timestamp: int | None
    timestamp_type: int | None
    key: bytes | None
    value: bytes
    checksum: int | None
    headers: tuple = ()


class _Decompressed:
    """A batch whose records were read when it was taken (or, for one that could not be, the one
    record standing for it); its other attributes are the batch's.
    Its CRC is checked before (aiokafka's batches allow that only before they are iterated)."""

    def __init__(self, batch: Any, records: list, crc_valid: bool) -> None:
        self._batch = batch
        self._records = iter(records)
        self._crc_valid = crc_valid

    def validate_crc(self) -> bool:
        return self._crc_valid

    def __iter__(self) -> _Decompressed:
        return self

    def __next__(self):
        return next(self._records)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._batch, name)


def unreadable_record(topic: str, partition: int, batch: Any, error: BaseException) -> _Record:
    """The one record that stands for ``batch`` of ``topic``'s ``partition``, which could not be
    read (``error``), with the reason; logged as ``worker.batch_unreadable``."""
    first = getattr(batch, "base_offset", None)
    last = batch.next_offset - 1
    codec_id = getattr(batch, "compression_type", None)
    codec = CODECS.get(codec_id, f"unknown codec {codec_id}") if codec_id is not None else "a legacy codec"
    offsets = f"offsets {first}-{last}" if first is not None and first != last else f"offset {last}"
    reason = (f"a batch of messages compressed with {codec} at {offsets} that this worker cannot read "
              f"({type(error).__name__}: {error}); none of it was applied: send it again (uncompressed, or "
              f"once the worker reads {codec})")
    log.error("worker.batch_unreadable", partition=f"{topic}:{partition}", offsets=[first, last], codec=codec,
              error=f"{type(error).__name__}: {error}")
    timestamp = getattr(batch, "max_timestamp", None)
    return _Record(last, timestamp if timestamp is not None and timestamp >= 0 else None,
                   getattr(batch, "timestamp_type", None), None, UnreadableBatch(reason), None)


class ReadableRecords:
    """A fetch's records (aiokafka's ``MemoryRecords``) whose compressed batches are read when
    taken (``next_batch``): whole, or as one ``UnreadableBatch`` record."""

    def __init__(self, topic: str, partition: int, records: Any) -> None:
        self.topic, self.partition, self.records = topic, partition, records

    def has_next(self) -> bool:
        return self.records.has_next()

    def next_batch(self):
        batch = self.records.next_batch()
        # Uncompressed batches (v2, compression_type 0) are passed as they are: nothing to fail.
        if batch is None or getattr(batch, "compression_type", None) == 0:
            return batch
        # (A batch whose CRC fails is aiokafka's to report: it fetches it again.)
        crc_valid = batch.validate_crc()
        try:
            return _Decompressed(batch, list(batch), crc_valid)
        except Exception as exc:  # whatever the codec raises, the batch is one dead letter
            # (As one record at its last offset, an ``UnreadableBatch``.)
            return _Decompressed(batch, [unreadable_record(self.topic, self.partition, batch, exc)], crc_valid)


_installed = False


def install() -> None:
    """Have every aiokafka consumer of this process read fetched batches through
    ``ReadableRecords`` (idempotent)."""
    global _installed
    if _installed:
        return
    from aiokafka.consumer import fetcher

    base = fetcher.PartitionRecords

    class PartitionRecords(base):  # type: ignore[misc, valid-type]
        def __init__(self, tp, records, *args, **kwargs) -> None:
            super().__init__(tp, ReadableRecords(tp.topic, tp.partition, records), *args, **kwargs)

    fetcher.PartitionRecords = PartitionRecords
    _installed = True
