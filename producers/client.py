"""Publishing events to, and reading decisions from, the worker's topics (aiokafka).

The Python API a cluster agent uses::

    from fairstream.producers.client import Publisher

    async with Publisher("127.0.0.1:9092") as pub:
        await pub.heartbeat("prod", "node-1", time=0, capacity={"cpu": 32, "mem": 128})
        await pub.submit("prod", "task-1", tenant="analytics", demand={"cpu": 1, "mem": 4}, time=0)
        await pub.complete("prod", "task-1", time=42.0)
        # A burst (a job's tasks, an agent's completions) as one message, applied in order:
        await pub.send_many(pub.topics.submitted, [{"cluster": "prod", "task": f"t{i}", "tenant": "analytics",
                                                    "demand": {"cpu": 1, "mem": 2}, "time": 43.0} for i in range(50)])

Each message is keyed by its cluster id, so one cluster's events stay in one partition, in order.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from typing import Any

from fairstream.core.model import ModelError
from fairstream.wire.events import DEFAULT_MAX_BYTES
from fairstream.wire.kafka import kafka_security
from fairstream.wire.topics import Topics

DELIVERY_TIMEOUT_S = 120.0  # a send's default deadline (FAIRSTREAM_KAFKA_DELIVERY_TIMEOUT overrides it)


class Undelivered(ModelError):
    """Kafka did not acknowledge messages within the delivery timeout (one line for the user)."""


class Publisher:
    """Sends events to the input topics.

    The producer is idempotent (Kafka's ``enable.idempotence``): a batch the broker did not
    answer (frozen, restarting, a network that paused) is sent again with its producer id and
    sequence number, and the broker writes it once. So a send rides out an outage: it returns
    once the broker has the message, or after ``delivery_timeout_s`` (default
    ``FAIRSTREAM_KAFKA_DELIVERY_TIMEOUT``, else 120 s) raises ``Undelivered``, saying what it
    could not send. A batch that expired without a leader (never written) is sent again within
    the same deadline. After ``Undelivered`` the producer is closed without waiting for what it
    holds (``__aexit__``): whether those messages arrived is then unknown, and nothing of them
    is sent again."""

    def __init__(self, broker: str = "127.0.0.1:9092", topics: Topics = Topics(),
                 delivery_timeout_s: float | None = None, **kafka_options: Any) -> None:
        import os

        from aiokafka import AIOKafkaProducer

        self.topics = topics
        if delivery_timeout_s is None:
            delivery_timeout_s = delivery_timeout_from_env(os.environ.get("FAIRSTREAM_KAFKA_DELIVERY_TIMEOUT"))
        self.delivery_timeout_s = delivery_timeout_s
        self.unacknowledged = 0  # sends under way
        self.gave_up = False
        self._make = lambda: AIOKafkaProducer(bootstrap_servers=broker, enable_idempotence=True,
                                              **kafka_security(kafka_options))
        self.producer = self._make()

    async def __aenter__(self) -> Publisher:
        try:
            await self.producer.start()
        except BaseException:
            await self.producer.stop()  # a failed start (refused, untrusted broker) leaves nothing open
            raise
        return self

    async def __aexit__(self, *exc) -> None:
        if self.gave_up or exc[0] is not None:
            await self._close_now()
        else:
            await self.producer.stop()  # (everything sent was acknowledged: nothing waits)

    async def _close_now(self, producer=None) -> None:
        """Close ``producer`` (by default this publisher's) without flushing: a producer stopping
        normally waits until the broker has every message it holds, however long the broker is
        away. Its sending task is cancelled (again while it waits for a request the broker does
        not answer) and its connections closed."""
        producer = producer or self.producer
        sender = getattr(producer, "_sender", None)
        task = getattr(sender, "sender_task", None)
        for _ in range(3):
            if task is None or task.done():
                break
            task.cancel()
            await asyncio.wait([task], timeout=1.0)
        await producer.client.close()
        await producer.stop()

    async def send_raw(self, topic: str, key: str, value: bytes) -> None:
        """Send one message and wait until the broker has it (``Undelivered`` after the delivery
        timeout)."""
        from aiokafka.errors import (
            KafkaTimeoutError,
            LeaderNotAvailableError,
            NotLeaderForPartitionError,
            OutOfOrderSequenceNumber,
        )

        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.delivery_timeout_s
        self.unacknowledged += 1
        try:
            while True:
                try:
                    remaining = max(0.0, deadline - loop.time())
                    producer = self.producer
                    # (send() waits for room in the producer's buffer; its future, for the broker.)
                    sent = await asyncio.wait_for(producer.send(topic, value=value, key=key.encode()), remaining)
                    await asyncio.wait_for(asyncio.shield(sent), max(0.0, deadline - loop.time()))
                    return
                except (LeaderNotAvailableError, NotLeaderForPartitionError):
                    # The batch expired with no leader to take it, so it was not written:
                    # sending it again cannot double it.
                    if loop.time() + 0.5 > deadline:
                        raise self._undelivered(topic, key, "no leader for its partition") from None
                    await asyncio.sleep(0.5)
                except OutOfOrderSequenceNumber:
                    # The broker refused the batch (so did not write it) as out of sequence for
                    # this producer id, as a broker that restarted under load may; aiokafka's
                    # producer then refuses everything (aio-libs/aiokafka#1017). A new producer
                    # (a new id) sends it again, as Kafka's Java client bumps its epoch.
                    if loop.time() + 0.5 > deadline:
                        raise self._undelivered(topic, key, "out of sequence for the broker") from None
                    await self._renew(producer)
                except (TimeoutError, KafkaTimeoutError):
                    raise self._undelivered(topic, key, "no acknowledgement from the broker") from None
        finally:
            self.unacknowledged -= 1

    async def _renew(self, failed) -> None:
        """Replace the producer ``failed`` (unless a concurrent send did already) with a new one,
        closing the old without waiting for what it holds: each of its sends refused so is sent
        again by its caller."""
        if self.producer is not failed:
            return
        fresh = self._make()
        await fresh.start()
        if self.producer is not failed:  # (renewed by another send meanwhile)
            await fresh.stop()
            return
        self.producer = fresh
        await self._close_now(failed)

    def _undelivered(self, topic: str, key: str, why: str) -> Undelivered:
        self.gave_up = True
        return Undelivered(
            f"gave up after the delivery timeout of {self.delivery_timeout_s:g} s ({why}): {self.unacknowledged} "
            f"message(s) not acknowledged, the last to {topic} keyed {key!r}; they may or may not have arrived and "
            "are not sent again (set FAIRSTREAM_KAFKA_DELIVERY_TIMEOUT or --delivery-timeout to wait longer)")

    async def send(self, topic: str, message: dict[str, Any] | list[dict[str, Any]]) -> None:
        """One message: an event (a JSON object) or several of one cluster (a JSON array), keyed by
        the cluster id."""
        if isinstance(message, list):
            return await self.send_many(topic, message)
        await self.send_raw(topic, str(message.get("cluster", "")), json.dumps(message, separators=(",", ":")).encode())

    async def send_many(self, topic: str, messages: list[dict[str, Any]]) -> None:
        """Several events of one cluster in one message (a JSON array), applied in order: far
        cheaper for the worker than as many messages (its cost is mostly per message). A burst
        larger than the worker takes in one message (``DEFAULT_MAX_BYTES``) goes as several, in
        order."""
        key = burst_key(messages)
        for part in split_burst(messages):
            await self.send_raw(topic, key, part)

    async def submit(self, cluster: str, task: str, tenant: str, demand: dict[str, float], time: float,
                     job: str | None = None, constraints: dict | None = None, count: int | None = None,
                     estimate: float | None = None, gang: int | None = None) -> None:
        """A task, or with ``count`` a request of that many tasks ``<task>-<k>``; ``estimate``: the
        run time expected of each (seconds), for backfill; ``gang``: at least so many of them
        start together or none does."""
        message = {"cluster": cluster, "task": task, "job": job or task, "tenant": tenant, "demand": demand, "time": time}
        if constraints:
            message["constraints"] = constraints
        if count is not None:
            message["count"] = count
        if estimate is not None:
            message["estimate"] = estimate
        if gang is not None:
            message["gang"] = {"min": gang}
        await self.send(self.topics.submitted, message)

    async def complete(self, cluster: str, task: str, time: float, status: str = "succeeded") -> None:
        await self.send(self.topics.completed, {"cluster": cluster, "task": task, "time": time, "status": status})

    async def heartbeat(self, cluster: str, node: str, time: float, capacity: dict[str, float],
                        labels: dict[str, str] | None = None, weights: dict[str, float] | None = None) -> None:
        """``weights``: the node's resource weights (LTRF formula 9: a faster CPU counts more)."""
        message = {"cluster": cluster, "node": node, "time": time, "capacity": capacity}
        if labels is not None:
            message["labels"] = labels
        if weights is not None:
            message["weights"] = weights
        await self.send(self.topics.heartbeats, message)

    async def node_lost(self, cluster: str, node: str, time: float) -> None:
        """The node is gone (deleted, down for good): its running tasks are requeued at once."""
        await self.send(self.topics.heartbeats, {"cluster": cluster, "node": node, "time": time, "lost": True})

    async def configure(self, cluster: str, tenants: list[dict[str, Any]], time: float | None = None) -> None:
        """A new tenant tree for ``cluster`` (``tenants``: the whole tree, as a scenario file's),
        applied at ``time`` or, without it, at the cluster's clock when the worker reads it."""
        message: dict[str, Any] = {"cluster": cluster, "tenants": tenants}
        if time is not None:
            message["time"] = time
        await self.send(self.topics.config, message)


def delivery_timeout_from_env(text: str | None) -> float:
    """``FAIRSTREAM_KAFKA_DELIVERY_TIMEOUT`` (seconds) as a float; the default when unset."""
    if text is None or not text.strip():
        return DELIVERY_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ModelError(f"FAIRSTREAM_KAFKA_DELIVERY_TIMEOUT={text!r}: give a number of seconds above 0")
    return value


def split_burst(messages: list[dict[str, Any]], max_bytes: int = DEFAULT_MAX_BYTES) -> list[bytes]:
    """``messages`` as JSON arrays of at most ``max_bytes`` each, in order (one event larger
    than that goes alone: the worker dead-letters it, saying so)."""
    parts: list[bytes] = []
    current: list[bytes] = []
    size = 2  # the brackets
    for message in messages:
        encoded = json.dumps(message, separators=(",", ":")).encode()
        if current and size + len(encoded) + 1 > max_bytes:
            parts.append(b"[" + b",".join(current) + b"]")
            current, size = [], 2
        current.append(encoded)
        size += len(encoded) + 1
    if current:
        parts.append(b"[" + b",".join(current) + b"]")
    return parts


def burst_key(messages: list[dict[str, Any]]) -> str:
    """The message key of a burst: its one cluster (raises ValueError for several)."""
    clusters = {str(m.get("cluster", "")) if isinstance(m, dict) else "" for m in messages}
    if len(clusters) > 1:
        raise ValueError(f"one message carries one cluster's events, not {sorted(clusters)}")
    return clusters.pop() if clusters else ""


async def read_topic(broker: str, topic: str, from_beginning: bool = True, idle_timeout: float | None = None,
                     group: str | None = None, **kafka_options: Any) -> AsyncIterator[dict[str, Any]]:
    """Yield JSON messages of ``topic`` until ``idle_timeout`` seconds pass without one."""
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(topic, bootstrap_servers=broker, group_id=group,
                                auto_offset_reset="earliest" if from_beginning else "latest",
                                enable_auto_commit=group is not None, **kafka_security(kafka_options))
    try:
        await consumer.start()
    except BaseException:
        await consumer.stop()  # a failed start (refused, untrusted broker) leaves nothing open
        raise
    try:
        while True:
            batch = await consumer.getmany(timeout_ms=int((idle_timeout or 1.0) * 1000))
            if not batch:
                if idle_timeout is not None:
                    return
                continue
            for records in batch.values():
                for record in records:
                    try:
                        yield json.loads(record.value)
                    except ValueError:
                        yield {"undecodable": record.value.decode("utf-8", "replace")}
    finally:
        await consumer.stop()


def publish_stdin(broker: str, topic: str, delivery_timeout: float | None = None) -> int:
    """``fairstream publish``: one message per line of stdin to ``topic`` (a JSON object, or an
    array of one cluster's events); returns the count of messages."""

    async def run() -> int:
        count = 0
        async with Publisher(broker, delivery_timeout_s=delivery_timeout) as pub:
            for number, line in enumerate(sys.stdin, 1):
                if not line.strip():
                    continue
                try:
                    message = json.loads(line)
                except ValueError as exc:
                    raise ModelError(f"stdin line {number}: not JSON ({exc})") from None
                try:
                    await pub.send(topic, message)
                except ValueError as exc:
                    raise ModelError(f"stdin line {number}: {exc}") from None
                count += 1
        return count

    return asyncio.run(run())


def tail(broker: str, topic: str, from_beginning: bool, idle_timeout: float | None, count: int | None) -> int:
    """``fairstream tail``: print a topic's messages as JSON lines."""

    async def run() -> int:
        seen = 0
        async for message in read_topic(broker, topic, from_beginning, idle_timeout):
            print(json.dumps(message), flush=True)
            seen += 1
            if count is not None and seen >= count:
                break
        return seen

    return asyncio.run(run())
