"""Builders for the worker's tests without Kafka or Redis: input messages with increasing offsets
and what the worker publishes (``Wire``), events, a processor on the in-memory store, waiting on
the event loop."""

import asyncio
import json
from types import SimpleNamespace

from fairstream.state.store import MemoryStore
from fairstream.streams.processor import Incoming, Processor
from fairstream.wire.topics import Topics
from tests.builders import worker_config

TOPIC = {"submitted": "tasks.submitted", "completed": "tasks.completed", "heartbeat": "nodes.heartbeats"}


class Wire:
    """Builds input messages with increasing offsets and collects what the worker publishes."""

    def __init__(self):
        self.offsets = {}
        self.published = []
        self.journal = []  # what a processor that can read again journals (streams/journal.py)

    def msg(self, kind, body, raw=None, produced=0.0, key=None):
        """The next message of ``kind``'s topic; ``produced``: its record timestamp (s);
        ``key``: its Kafka key (None: sent without one)."""
        offset = self.offsets.get(kind, 0)
        self.offsets[kind] = offset + 1
        data = raw if raw is not None else json.dumps(body).encode()
        return Incoming(kind, data, TOPIC[kind], 0, offset, produced, key)

    async def publish(self, topic, key, message):
        if topic == Topics().journal:  # the broker acknowledges it at once, with its offset
            self.journal.append(message)
            sent = asyncio.get_running_loop().create_future()
            sent.set_result(SimpleNamespace(partition=0, offset=len(self.journal) - 1))
            return sent
        self.published.append((topic, key, message))

    def decisions(self):
        return [m for t, _, m in self.published if t == "allocations.decisions"]

    def dead(self):
        return [m for t, _, m in self.published if t == "events.deadletter"]


def heartbeat(node="n1", time=0, cluster="c1", **capacity):
    return {"cluster": cluster, "node": node, "time": time, "capacity": capacity or {"cpu": 4, "mem": 8}}


def task(name, tenant="A", time=0, cluster="c1", **demand):
    return {"cluster": cluster, "task": name, "job": "j", "tenant": tenant, "time": time, "demand": demand or {"cpu": 1, "mem": 1}}


def done(name, time, cluster="c1"):
    return {"cluster": cluster, "task": name, "time": time, "status": "succeeded"}


def processor(store=None, wire=None, input_log=None, **settings):
    """A processor of ``ltrf`` on memory, publishing to ``wire``; ``settings``: ``WorkerConfig``'s."""
    config = worker_config("ltrf", params={"resource": "mem"}, **settings)
    return Processor(store or MemoryStore(), wire.publish, config, input_log=input_log)


async def until(condition, timeout: float = 5.0) -> None:
    """Wait (on the event loop) until ``condition()`` holds; fail after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        assert loop.time() < deadline, "timed out waiting"
        await asyncio.sleep(0.001)


def run(coroutine):
    return asyncio.run(coroutine)
