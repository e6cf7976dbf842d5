"""Where a batch's time goes (streams/stages.py): per stage, the CPU time of the batch's own turns
on the event loop, not other tasks' that ran while it awaited; and the processor's pipeline,
whose outputs are enqueued after the next batch's commit has begun (``Outputs.enqueue_in_order``)."""

from __future__ import annotations

import asyncio
import time

import pytest

from fairstream.state.store import MemoryStore
from fairstream.streams.incoming import Incoming
from fairstream.streams.stages import StageMeter
from fairstream.wire.jsoncodec import dumps
from fairstream.wire.topics import Topics
from tests.worker.offline import Wire, heartbeat, processor, run, task, until


def burn(seconds: float) -> None:
    """Use ``seconds`` of this thread's CPU time."""
    deadline = time.thread_time() + seconds
    while time.thread_time() < deadline:
        pass


def test_a_stage_counts_its_own_cpu_time_not_that_of_tasks_run_while_it_awaits():
    meter = StageMeter()

    async def batch(other_done: asyncio.Event) -> None:
        with meter.stage("persist"):
            burn(0.02)
            await other_done.wait()  # (a round trip: another task burns 0.1 s meanwhile)
            burn(0.02)

    async def other(done: asyncio.Event) -> None:
        burn(0.1)
        done.set()

    async def scenario() -> None:
        done = asyncio.Event()
        await asyncio.gather(meter.run(batch(done)), other(done))

    run(scenario())
    # 40 ms of its own; the other task's 100 ms is not counted, though the stage's wall time holds it
    assert 0.035 <= meter.cpu_ns["persist"] / 1e9 < 0.09
    assert meter.wall_ns["persist"] / 1e9 >= 0.13


def test_a_stage_inside_another_counts_to_itself_and_the_outer_goes_on_after_it():
    meter = StageMeter()

    async def batch() -> None:
        with meter.stage("step"):
            burn(0.01)
            with meter.stage("views"):
                burn(0.03)
                await asyncio.sleep(0)
            burn(0.01)
        burn(0.01)  # the pipeline's glue

    run(meter.run(batch()))
    assert 0.025 <= meter.cpu_ns["views"] / 1e9 < 0.05
    assert 0.018 <= meter.cpu_ns["step"] / 1e9 < 0.035
    assert 0.008 <= meter.cpu_ns["other"] / 1e9 < 0.03


def test_a_metered_coroutine_raises_returns_and_is_cancelled_as_it_would_be_alone():
    meter = StageMeter()

    async def fails() -> None:
        with meter.stage("decode"):
            await asyncio.sleep(0)
            raise ValueError("bad")

    async def returns() -> int:
        await asyncio.sleep(0)
        return 7

    async def scenario() -> None:
        with pytest.raises(ValueError, match="bad"):
            await meter.run(fails())
        assert await meter.run(returns()) == 7
        blocked = asyncio.get_running_loop().create_task(meter.run(asyncio.Event().wait()))
        await asyncio.sleep(0)
        blocked.cancel()
        with pytest.raises(asyncio.CancelledError):
            await blocked

    run(scenario())
    assert "decode" in meter.wall_ns


def messages(topic: str, kind: str, documents: list[dict], first_offset: int = 0) -> list[Incoming]:
    return [Incoming(kind, dumps(d), topic, 0, first_offset + i, 0.0, d["cluster"].encode())
            for i, d in enumerate(documents)]


def test_the_processor_reports_each_stage_of_a_batch_and_the_events_it_decoded():
    topics = Topics()
    wire = Wire()

    async def scenario():
        p = processor(wire=wire)
        await p.handle(messages(topics.heartbeats, "heartbeat", [heartbeat("n1"), heartbeat("n2")]))
        await p.handle(messages(topics.submitted, "submitted", [task("t1"), task("t2"), task("t3")]))
        return p.metrics.stages

    stages = run(scenario())
    assert stages.events == 5 and stages.batches == 2
    for stage in ("decode", "step", "views", "persist", "publish", "settle"):
        assert stages.wall_ns[stage] > 0, stage
    for stage in ("decode", "step", "views"):
        assert stages.cpu_ns[stage] > 0, stage
    exposed = {sample.name: sample.value for family in stages.collect() for sample in family.samples
               if not sample.labels or sample.labels.get("stage") == "step"}
    assert exposed["fairstream_input_events_applied_total"] == 5
    assert exposed["fairstream_stage_cpu_seconds_total"] == stages.cpu_ns["step"] / 1e9


def test_a_batch_is_applied_and_committed_while_the_previous_batchs_journal_record_awaits_the_broker():
    # The journal's round trip is outside the lock: the next batch's pass and commit overlap it.
    # Its decisions still go after the previous batch's (commit order), and only once its own
    # record is acknowledged; a third batch waits until the first's outputs are enqueued.
    topics = Topics()
    wire = Wire()
    acknowledge = asyncio.Event()
    journaled = []

    async def publish(topic, key, message):
        if topic == topics.journal:
            journaled.append(message)
            if len(journaled) == 2:  # the first batch's (the heartbeats) went through at once
                await acknowledge.wait()
        return await Wire.publish(wire, topic, key, message)

    class Log:
        async def read(self, ranges):
            return
            yield

        async def journal(self, start):
            return
            yield

    async def scenario():
        store = MemoryStore()
        p = processor(store=store, wire=wire, input_log=Log())
        p.outputs.publish = publish
        await p.handle(messages(topics.heartbeats, "heartbeat", [heartbeat("n1")]))
        first = asyncio.get_running_loop().create_task(p.handle(messages(topics.submitted, "submitted", [task("t1")])))
        await until(lambda: len(journaled) == 2)
        second = asyncio.get_running_loop().create_task(
            p.handle(messages(topics.submitted, "submitted", [task("t2")], first_offset=1)))
        # The second batch is committed (the store has its offset) with the first's record unacknowledged.
        await until(lambda: p.applied.get(f"{topics.submitted}:0") == 2)
        third = asyncio.get_running_loop().create_task(
            p.handle(messages(topics.submitted, "submitted", [task("t3")], first_offset=2)))
        for _ in range(50):
            await asyncio.sleep(0)
        assert p.applied.get(f"{topics.submitted}:0") == 2  # the third waits for the first's outputs
        assert [d["task"] for d in wire.decisions()] == []
        acknowledge.set()
        await asyncio.gather(first, second, third)

    run(scenario())
    assert [d["task"] for d in wire.decisions()] == ["t1", "t2", "t3"]
    assert len(journaled) == 4
