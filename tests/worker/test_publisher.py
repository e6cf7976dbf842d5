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
