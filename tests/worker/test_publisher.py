"""The Publisher's bursts: one message while it fits what the worker takes, several in order when not."""

import json

import pytest

from fairstream.producers.client import split_burst
from fairstream.wire.events import DEFAULT_MAX_BYTES, HEARTBEAT, decode_message


def beats(count: int) -> list[dict]:
    return [{"cluster": "prod", "node": f"node-{k:05}", "time": 1.5, "capacity": {"cpu": 32.0, "mem": 262144.0},
             "labels": {"type": "kwok", "fairstream.dev/bench": "0123abcd"}} for k in range(count)]


@pytest.mark.parametrize("count, parts", [(1, 1), (100, 1), (1000, 3)], ids=["one", "a hundred", "a thousand"])
def test_a_burst_is_split_into_messages_the_worker_takes_in_order(count, parts):
    # A thousand heartbeats are about 150 kB of JSON: three messages under the worker's 64 KiB.
    split = split_burst(beats(count))
    assert len(split) == parts
    assert all(len(part) <= DEFAULT_MAX_BYTES for part in split)
    assert [e for part in split for e in json.loads(part)] == beats(count)
    assert sum(len(decode_message(HEARTBEAT, part)) for part in split) == count


def test_a_send_the_broker_refuses_as_out_of_sequence_goes_again_on_a_new_producer():
    # A broker restarted under load may refuse an idempotent producer's batch as out of
    # sequence; aiokafka's producer then refuses everything (aio-libs/aiokafka#1017), which
    # once failed the kafka-restart drill in the emulator. The refused batch was not written,
    # so the publisher sends it again on a new producer and closes the old one.
    import asyncio

    from aiokafka.errors import OutOfOrderSequenceNumber

    from fairstream.producers.client import Publisher

    class Producer:
        made = []

        def __init__(self, refuse: bool) -> None:
            self.refuse, self.sent, self.stopped = refuse, [], False
            self.client = self

        async def start(self):
            pass

        async def send(self, topic, value, key):
            done = asyncio.get_running_loop().create_future()
            if self.refuse:
                done.set_exception(OutOfOrderSequenceNumber())
            else:
                self.sent.append((topic, key, value))
                done.set_result(None)
            return done

        async def close(self):
            pass

        async def stop(self):
            self.stopped = True

    def make():
        Producer.made.append(Producer(refuse=not Producer.made))
        return Producer.made[-1]

    async def scenario():
        publisher = Publisher("127.0.0.1:1", delivery_timeout_s=5.0)
        publisher._make = make
        publisher.producer = make()
        await publisher.send_raw("tasks.submitted", "c1", b"{}")

    asyncio.run(scenario())
    first, second = Producer.made
    assert first.stopped and first.sent == []
    assert second.sent == [("tasks.submitted", b"c1", b"{}")] and not second.stopped
