"""Batches and outputs, without Kafka or Redis: the lock that batches input, how the consumer
fetches, group commit, commits and sends tried again, the one retry helper."""

import asyncio
import json
from types import SimpleNamespace

import pytest

from fairstream.state.store import MemoryStore
from fairstream.streams.app import WorkerConfig, create_app
from fairstream.streams.processor import Incoming

from offline import Wire, heartbeat, processor, run, task, until


def test_a_burst_for_several_clusters_is_refused_before_anything_is_sent():
    from fairstream.producers.client import burst_key

    assert burst_key([task("a", cluster="c1"), task("b", cluster="c1")]) == "c1"
    with pytest.raises(ValueError, match="one cluster's events"):
        burst_key([task("a", cluster="c1"), task("b", cluster="c2")])


def test_batches_that_wait_for_the_lock_together_are_applied_in_one_pass_and_one_commit():
    # The first batch is held inside its commit; the two that arrive meanwhile (the other
    # agents') are applied together: three batches, two commits, every decision once.
    class SlowStore(MemoryStore):
        def __init__(self):
            super().__init__()
            self.commits, self.release = [], asyncio.Event()

        async def commit(self, batch):
            self.commits.append(sum(len(s) for s in batch.steps.values()))
            if len(self.commits) == 1:
                await self.release.wait()
            await super().commit(batch)

    store, wire = SlowStore(), Wire()

    async def scenario():
        p = processor(store, wire)
        first = asyncio.create_task(p.handle([wire.msg("heartbeat", heartbeat(cpu=8, mem=8))]))
        await until(lambda: store.commits)  # the first batch is held inside its commit
        others = [asyncio.create_task(p.handle([wire.msg("submitted", task(f"t{k}", time=1))])) for k in range(2)]
        await until(lambda: len(p._waiting) == 2)  # both wait for the lock
        store.release.set()
        return await asyncio.gather(first, *others)

    outcomes = run(scenario())
    assert len(store.commits) == 2
    assert outcomes[1] is outcomes[2] and outcomes[1].decisions == 2  # one outcome for the pair
    assert [d["task"] for d in wire.decisions()] == ["t0", "t1"]


@pytest.mark.parametrize("config, expected_wait_ms, expected_min_bytes", [
    pytest.param(WorkerConfig(), 10, 8192,
                 id="by default the broker holds a fetch 10 ms, not Faust's 1.5 s, gathering 8 KiB, not 1 byte"),
    pytest.param(WorkerConfig(fetch_max_wait=0.0), 1, 8192, id="a zero wait is raised to aiokafka's smallest, 1 ms"),
    pytest.param(WorkerConfig(fetch_min_bytes=1), 10, 1, id="fetch_min_bytes 1 answers at the first record"),
    pytest.param(WorkerConfig(fetch_min_bytes=0), 10, 1, id="a zero fetch_min_bytes is raised to 1"),
])
def test_the_worker_consumer_fetches_with_the_configured_wait_and_minimum(config, expected_wait_ms, expected_min_bytes):
    async def scenario():
        app, _ = create_app(config, MemoryStore())
        consumer = app.consumer._new_consumer_thread()._create_worker_consumer(app.transport)
        try:
            # what aiokafka builds its fetcher with at start
            return consumer._fetch_max_wait_ms, consumer._fetch_min_bytes
        finally:
            await consumer.stop()  # never started: only releases the client

    assert run(scenario()) == (expected_wait_ms, expected_min_bytes)


class Delivered:
    """What a Faust agent's stream hands over: the value and the message it came in (with its
    topic, partition, offset and record timestamp)."""

    def __init__(self, incoming: Incoming):
        self.value = incoming.raw
        self.message = SimpleNamespace(topic=incoming.topic, partition=incoming.partition, offset=incoming.offset,
                                       timestamp=incoming.produced, key=incoming.key)


class GatedStore(MemoryStore):
    """Records each commit's size in steps; the first commit waits until ``release`` is set,
    and the commits listed in ``fail`` (by number) raise once."""

    def __init__(self, fail=()):
        super().__init__()
        self.commits, self.release, self.fail = [], asyncio.Event(), set(fail)

    async def commit(self, batch):
        number = len(self.commits)
        self.commits.append(sum(len(s) for s in batch.steps.values()))
        if number == 0:
            await self.release.wait()
        if number in self.fail:
            raise ConnectionError("redis went away")
        await super().commit(batch)


def group_commit(store, wire, acked, max_size=500, window=0.0, backlog=lambda message: 0):
    from fairstream.streams.app import GroupCommit

    async def ack(event):
        acked.append(event.message.offset)

    return GroupCommit(processor(store, wire, step_window=0.0), "submitted", max_size, window, ack,
                       backlog, retry_delays=(0.001, 0.001))


def test_a_batch_goes_at_once_and_what_arrives_while_it_is_applied_goes_together_next():
    # Group commit: the first message is applied alone, without waiting for a window; the three
    # that arrive during its commit are the next batch (one pass, one commit: three steps, as
    # each is at its own event time); all four are acknowledged in arrival order.
    store, wire, acked = GatedStore(), Wire(), []

    async def scenario():
        feed = group_commit(store, wire, acked)
        await feed.add(Delivered(wire.msg("submitted", task("t0", time=0))))
        await until(lambda: store.commits)
        for k in range(1, 4):
            await feed.add(Delivered(wire.msg("submitted", task(f"t{k}", time=k))))
        store.release.set()
        await feed.close()

    run(scenario())
    assert store.commits == [1, 3]
    assert acked == [0, 1, 2, 3]


@pytest.mark.parametrize("window, commits", [
    pytest.param(0.5, [3], id="with a window a batch waits for the messages Kafka is known to hold"),
    pytest.param(0.0, [1, 1, 1], id="without one each message goes as it arrives"),
])
def test_a_batch_waits_up_to_the_window_for_input_already_in_kafka(window, commits):
    store, wire, acked = GatedStore(), Wire(), []
    store.release.set()
    messages = [wire.msg("submitted", task(f"t{k}", time=k)) for k in range(3)]

    async def scenario():
        # Like Faust, hand the agent one message per turn of the event loop; the partition's
        # high watermark is known from the start (all three are in Kafka).
        feed = group_commit(store, wire, acked, window=window,
                            backlog=lambda message: len(messages) - message.offset - 1)
        for message in messages:
            await feed.add(Delivered(message))
            await asyncio.sleep(0)
        await feed.close()

    run(scenario())
    assert store.commits == commits
    assert acked == [0, 1, 2]


def test_a_full_buffer_holds_input_back_until_a_batch_is_taken():
    store, wire, acked = GatedStore(), Wire(), []

    async def scenario():
        feed = group_commit(store, wire, acked, max_size=2)
        await feed.add(Delivered(wire.msg("submitted", task("t0"))))
        await until(lambda: store.commits)  # t0 is being committed, the buffer is empty
        await feed.add(Delivered(wire.msg("submitted", task("t1"))))
        blocked = asyncio.create_task(feed.add(Delivered(wire.msg("submitted", task("t2")))))
        for _ in range(20):  # turns of the event loop, not time: nothing else can release it
            await asyncio.sleep(0)
        held_back = not blocked.done()
        store.release.set()
        await blocked
        await feed.close()
        return held_back

    assert run(scenario()) is True
    assert acked == [0, 1, 2]


def test_a_batch_whose_commit_fails_is_tried_again_and_applied_once():
    store, wire, acked = GatedStore(fail={1}), Wire(), []

    async def scenario():
        feed = group_commit(store, wire, acked)
        store.release.set()
        await feed.processor.handle([wire.msg("heartbeat", heartbeat())])  # the heartbeats agent's
        await feed.add(Delivered(wire.msg("submitted", task("t1"))))
        await feed.add(Delivered(wire.msg("submitted", task("t2"))))
        await feed.close()

    run(scenario())
    assert len(store.commits) == 3  # the heartbeat; t1 and t2 failed; t1 and t2 again
    assert [d["task"] for d in wire.decisions()] == ["t1", "t2"]
    assert acked == [0, 1]


def test_outputs_whose_publishing_fails_are_sent_again_before_their_input_is_acknowledged():
    store = MemoryStore()

    class FlakyWire(Wire):
        failed = False

        async def publish(self, topic, key, message):
            await super().publish(topic, key, message)
            future = asyncio.get_running_loop().create_future()
            if not self.failed and topic == "allocations.decisions":
                self.failed = True
                future.set_exception(ConnectionError("broker went away"))
            else:
                future.set_result(None)
            return future

    wire = FlakyWire()

    async def scenario():
        p = processor(store, wire)
        p.outputs.retry_delays = (0.001, 0.001)  # retry at once rather than after 0.1 s
        await p.handle([wire.msg("heartbeat", heartbeat()), wire.msg("submitted", task("t1"))])
        return await store.outbox()

    assert run(scenario()) == []  # published, then cleared
    assert [d["task"] for d in wire.decisions()] == ["t1", "t1"]  # the same id twice: idempotent
    assert len({d["id"] for d in wire.decisions()}) == 1


def test_waiting_for_a_service_retries_what_it_is_told_to_and_nothing_else():
    from fairstream.wire.retry import waiting_for

    attempts = []

    async def flaky():
        attempts.append(1)
        if len(attempts) < 3:
            raise ConnectionError("not up yet")
        return "up"

    async def broken():
        raise ValueError("a bug, not an outage")

    assert run(waiting_for(flaky, "test.unavailable", ConnectionError, (0.001, 0.001))) == "up"
    assert len(attempts) == 3
    with pytest.raises(ValueError):
        run(waiting_for(broken, "test.unavailable", ConnectionError, (0.001, 0.001)))


def test_a_send_the_broker_had_no_leader_for_is_sent_again_and_other_errors_are_raised():
    # (A request the broker did not answer is aiokafka's to send again: the producer is
    # idempotent. On the real broker, frozen: tests/live/test_producers_live.py.)
    from aiokafka.errors import LeaderNotAvailableError, TopicAuthorizationFailedError

    from fairstream.producers.client import Publisher, Undelivered

    class Producer:
        def __init__(self, failures):
            self.failures, self.sent = list(failures), []

        async def send(self, topic, value, key):
            future = asyncio.get_running_loop().create_future()
            if self.failures:
                future.set_exception(self.failures.pop(0))
            else:
                self.sent.append((topic, key, value))
                future.set_result(None)
            return future

    async def send(failures, delivery_timeout_s=60.0):
        publisher = Publisher(delivery_timeout_s=delivery_timeout_s)
        assert publisher.producer._txn_manager is not None  # idempotent: Kafka writes a batch sent again once
        publisher.producer = Producer(failures)
        await publisher.send_raw("t", "c1", b"{}")
        return publisher.producer.sent

    # A broker restarting: no leader twice (the batch expired unwritten), then the send goes through, once.
    assert run(send([LeaderNotAvailableError(), LeaderNotAvailableError()])) == [("t", b"c1", b"{}")]
    # An error that is not an outage is raised as it is.
    with pytest.raises(TopicAuthorizationFailedError):
        run(send([TopicAuthorizationFailedError()]))
    # The outage lasts longer than the delivery timeout: one line says what was not sent.
    with pytest.raises(Undelivered, match=r"^gave up after the delivery timeout of 0.1 s \(no leader for its "
                                          r"partition\): 1 message\(s\) not acknowledged, the last to t keyed 'c1'"):
        run(send([LeaderNotAvailableError()] * 5, delivery_timeout_s=0.1))


def test_a_message_whose_application_keeps_failing_is_dead_lettered_as_an_internal_error_and_the_rest_go_on(monkeypatch):
    # A fault the decoder lets through (simulated: the engine half-applies a step holding task
    # "boom", then raises). Three failed attempts of the batch, then one message at a time:
    # "boom" fails three times alone and is dead-lettered; the others are applied once.
    from fairstream.core.engine import Engine

    step = Engine.step

    def faulty_step(self, time, events):
        events = list(events)
        if any(getattr(e, "task", None) == "boom" for e in events):
            step(self, time, [e for e in events if getattr(e, "task", None) != "boom"])  # half-applied...
            raise OverflowError("int too large to convert to float")  # ...then the fault
        return step(self, time, events)

    monkeypatch.setattr(Engine, "step", faulty_step)
    store, wire, acked = MemoryStore(), Wire(), []

    async def scenario():
        feed = group_commit(store, wire, acked)
        await feed.processor.handle([wire.msg("heartbeat", heartbeat())])
        for name in ("t1", "boom", "t2"):
            await feed.add(Delivered(wire.msg("submitted", task(name, time=1))))
        await feed.close()
        return feed.processor

    p = run(scenario())
    assert [d["task"] for d in wire.decisions()] == ["t1", "t2"]  # each once: the half-applied steps were forgotten
    [dead] = wire.dead()
    assert dead["reason"] == "internal error: OverflowError: int too large to convert to float"
    assert json.loads(dead["original"])["task"] == "boom" and acked == [0, 1, 2]
    assert p.metrics.internal_errors.labels("tasks.submitted")._value.get() == 1
    assert sorted(run(p.session("c1")).engine.tasks) == ["t1", "t2"]
