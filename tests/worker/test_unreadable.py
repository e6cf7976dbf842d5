"""Compressed batches the worker cannot read (``streams/unreadable.py``), without Kafka: real
aiokafka record batches, read through the worker's reader; the dead letter that stands for one.
On a real broker, with kcat's batches of every codec: ``tests/live/test_worker_live.py``."""

import pytest
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from aiokafka.record.memory_records import MemoryRecords

from fairstream.streams.decoding import decode_batch
from fairstream.streams.incoming import Incoming, UnreadableBatch
from fairstream.streams.unreadable import ReadableRecords

CODEC_IDS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


def fetched(codec: str, values: list[bytes], base: int = 10) -> bytes:
    """One record batch as a fetch returns it: ``values`` at offsets ``base``..., compressed."""
    builder = DefaultRecordBatchBuilder(2, CODEC_IDS[codec], 0, -1, -1, -1, 1 << 20)
    for k, value in enumerate(values):
        builder.append(k, 1_700_000_000_000, b"c1", value, [])
    raw = bytearray(builder.build())
    raw[0:8] = base.to_bytes(8, "big")  # the batch's base offset, as the broker assigns it
    return bytes(raw)


def read(raw: bytes) -> list:
    records = ReadableRecords("tasks.submitted", 0, MemoryRecords(raw))
    out = []
    while records.has_next():
        batch = records.next_batch()
        if batch is None:
            break
        assert batch.validate_crc()
        out += [(record.offset, record.value) for record in batch]
    return out


@pytest.mark.parametrize("codec", list(CODEC_IDS))
def test_a_batch_of_every_codec_reads_as_its_messages(codec):
    values = [b'{"n": %d}' % k for k in range(3)]
    assert read(fetched(codec, values)) == [(10, values[0]), (11, values[1]), (12, values[2])]


def test_a_batch_whose_codec_cannot_be_read_is_one_message_at_its_last_offset_with_the_reason(monkeypatch):
    import aiokafka.codec

    raw = fetched("lz4", [b"{}"] * 3)
    monkeypatch.setattr(aiokafka.codec, "cramjam", None)  # an install without the codecs' library
    [(offset, value)] = read(raw)
    assert offset == 12  # past it, the next fetch starts after the batch
    assert value.__class__ is UnreadableBatch and value == b""
    assert "compressed with lz4 at offsets 10-12 that this worker cannot read" in value.reason
    assert "Libraries for lz4 compression codec not found" in value.reason


def test_the_message_of_an_unreadable_batch_is_dead_lettered_with_its_reason_and_a_clients_bytes_are_not():
    reason = "a batch of messages compressed with lz4 at offsets 1-3 that this worker cannot read (...)"
    messages = [Incoming("submitted", UnreadableBatch(reason), "tasks.submitted", 0, 3),
                Incoming("submitted", b"", "tasks.submitted", 0, 4)]  # a client's empty message
    decoded = decode_batch(messages, {}, 64 * 1024)
    [unreadable, empty] = decoded.dead
    assert (unreadable.offset, unreadable.reason) == (3, reason)
    assert empty.offset == 4 and empty.reason != reason
    assert decoded.offsets == {"tasks.submitted:0": 5}
