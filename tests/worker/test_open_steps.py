"""A step whose window a batch's end cuts stays open for the next batch (issue 59.7): the worker
groups events by event time across Kafka's batches, with a bounded wait, so where a batch
happens to end does not change what it decides. Without Kafka or Redis (``offline.py``)."""

from __future__ import annotations

import copy

import pytest

from fairstream.state.store import MemoryStore
from tests.worker.offline import Wire, heartbeat, processor, run, task, until
from tests.worker.test_recovery import Partitions

WINDOW, WAIT = 0.1, 0.05


def burst() -> list[tuple[str, dict]]:
    """A node of 4 cpu at 0; at 1 s, ten one-cpu tasks 3 ms apart, A's and B's in turn (the
    operator's trial had ten completions so, in three Kafka batches), and one more a second
    later. In one step of the 0.1-s window ltrf gives A two and B two (lowest usage first, one
    quantum charged per placement); in three, the first batch's tasks take the node."""
    plan = [("heartbeat", heartbeat(cpu=4, mem=8))]
    plan += [("submitted", task(f"t{k}", "AB"[k % 2], time=1 + 0.003 * k, cpu=1, mem=1)) for k in range(10)]
    return plan + [("submitted", task("late", "A", time=2, cpu=1, mem=1))]


async def handed_over(p, wire: Wire, plan, cuts: list[int]):
    """``plan``'s messages handed to ``p`` in batches cut before each index of ``cuts``; then
    every step held open is closed (its wait runs out)."""
    messages = [wire.msg(kind, body) for kind, body in plan]
    for start, end in zip([0] + cuts, cuts + [len(messages)]):
        await p.handle(messages[start:end])
    await until(lambda: p.open_steps.idle)


def decided(store: MemoryStore, wire: Wire):
    """The cluster's log (step times and their events' tasks) and the decisions published."""
    log = [(step["time"], [e.get("task", e.get("node")) for e in step["events"]]) for step in store._log["c1"]]
    return log, [(d["kind"], d["task"], d["node"], d["time"]) for d in wire.decisions()]


def one_batch_each_event_time_window():
    store, wire = MemoryStore(), Wire()
    run(handed_over(processor(store, wire, step_window=WINDOW, step_wait=WAIT), wire, burst(), [1, 11]))
    return decided(store, wire)


@pytest.mark.parametrize("cuts", [[1, 4, 7, 11], [1, 2, 11], [1, 10, 11]],
                         ids=["three batches", "a batch of one, then the rest", "the last one alone"])
def test_a_step_cut_by_the_end_of_a_batch_decides_as_if_it_had_come_in_one(cuts):
    store, wire = MemoryStore(), Wire()
    run(handed_over(processor(store, wire, step_window=WINDOW, step_wait=WAIT), wire, burst(), cuts))
    log, decisions = decided(store, wire)
    assert (log, decisions) == one_batch_each_event_time_window()
    assert log[1] == (1.027, [f"t{k}" for k in range(10)])  # one step at the latest time of the ten
    assert store._open == {}  # nothing held open once closed


def test_without_a_wait_each_batch_ends_its_steps():
    # What the operator's trial saw (step_wait 0): three batches, three steps, other decisions.
    store, wire = MemoryStore(), Wire()
    run(handed_over(processor(store, wire, step_window=WINDOW, step_wait=0), wire, burst(), [1, 4, 7, 11]))
    log, decisions = decided(store, wire)
    assert [time for time, _ in log[1:4]] == [1.006, 1.015, 1.027]
    assert decisions != one_batch_each_event_time_window()[1]


def test_a_step_held_open_when_the_worker_stops_is_in_the_store_and_a_restarted_worker_closes_it():
    # The first seven of the ten are applied (offsets committed) and held open; the worker
    # stops (kill -9: nothing else written). A new worker reads the open step from the store,
    # takes the last three into it, and decides as one batch would have.
    store, wire = MemoryStore(), Wire()
    messages = [wire.msg(kind, body) for kind, body in burst()]

    async def scenario():
        first = processor(store, wire, step_window=WINDOW, step_wait=60)  # (its timer never runs out here)
        await first.handle(messages[:1])
        await first.handle(messages[1:8])
        assert len(first.sessions["c1"].open_items) == 7 and "c1" in store._open
        second = processor(store, wire, step_window=WINDOW, step_wait=WAIT)
        second.consuming_from({m.position: 0 for m in messages})
        await second.start()
        assert len(second.sessions["c1"].open_items) == 7  # (loaded at start, not waiting for input)
        await second.handle(messages[8:])
        await until(lambda: second.open_steps.idle)
        first.open_steps.cancel()

    run(scenario())
    assert decided(store, wire) == one_batch_each_event_time_window()


def test_a_step_the_timer_closed_is_closed_at_the_same_point_when_the_store_is_rebuilt_from_the_journal():
    # The ten come in two batches, the second after the first's wait ran out: two steps, the
    # second's close journaled. A Redis restored from an older file (before all of it) is rebuilt
    # from Kafka and the journal: the same two steps, the same decisions (no task placed twice).
    store, wire = MemoryStore(), Wire()
    kafka = Partitions(wire, burst())

    async def scenario():
        p = processor(store, wire, step_window=WINDOW, step_wait=WAIT, input_log=kafka.input_log())
        older = copy.deepcopy(store)
        batches = [kafka.poll(per_partition=1), kafka.poll(per_partition=4), kafka.poll(per_partition=10)]
        await p.handle(batches[0])
        await p.handle(batches[1])
        await until(lambda: not p.sessions["c1"].open_items)  # the wait ran out: closed on its own
        await p.handle(batches[2])
        await until(lambda: p.open_steps.idle)
        rebuilt = processor(older, wire, step_window=WINDOW, step_wait=WAIT, input_log=kafka.input_log())
        rebuilt.consuming_from(dict(p.applied))
        await rebuilt.start()
        await rebuilt.session("c1")
        await until(lambda: rebuilt.open_steps.idle)
        return older

    older = run(scenario())
    log, _ = decided(store, wire)
    assert [len(events) for _, events in log] == [1, 5, 5, 1]  # (the node; t0-t4, closed by the timer; t5-t9; late)
    assert sum("close" in record for record in wire.journal) == 2  # (t0-t4; late)
    rebuilt_log, _ = decided(older, wire)
    assert rebuilt_log == log
    # Each decision read again was published again as it was, with the id it had: a consumer
    # sees each once.
    first, again = wire.decisions()[:len(wire.decisions()) // 2], wire.decisions()[len(wire.decisions()) // 2:]
    assert again == first and len({d["id"] for d in first}) == len(first) == 4  # (the node's 4 cpu)


def test_recent_events_are_shown_newest_first_by_event_time_not_by_when_they_were_recorded():
    # A tenant tree accepted at 6 sits in a step held open; one rejected at 7 is recorded at
    # once; the step closes later and records the acceptance after it. The page shows the
    # rejection first (newest), as it happened; equal times keep the last recorded first.
    from fairstream.wire.visibility import events_document

    recorded = [{"kind": "preempt", "time": 5}, {"kind": "config_rejected", "time": 7},
                {"kind": "config_accepted", "time": 6}, {"kind": "preempt", "time": 7}]
    shown = events_document("c1", {"time": 7}, recorded)["events"]
    assert shown == [recorded[3], recorded[1], recorded[2], recorded[0]]


@pytest.mark.parametrize("closed_by", ["the next batch", "the timer"])
def test_the_decision_latency_metric_counts_the_time_a_step_was_held_open(closed_by):
    # A task held in an open step is decided when the step is closed: its latency runs from the
    # arrival of the batch that held it, not of the batch (or timer) that closed it.
    import asyncio

    wire = Wire()
    messages = [wire.msg("heartbeat", heartbeat(cpu=4, mem=8)), wire.msg("submitted", task("t0", time=1, cpu=1, mem=1))]
    beyond = wire.msg("submitted", task("t1", time=5, cpu=1, mem=1))

    async def scenario():
        p = processor(MemoryStore(), wire, step_window=WINDOW, step_wait=0.3 if closed_by == "the timer" else 10.0)
        await p.handle(messages)  # t0 is held open
        assert not wire.decisions()
        await asyncio.sleep(0.3)
        if closed_by == "the next batch":
            await p.handle([beyond])
        await until(lambda: [d["task"] for d in wire.decisions()][:1] == ["t0"])
        await until(lambda: p.metrics.latency._sum.get() >= 0.3, timeout=2.0)
        return p.metrics

    metrics = run(scenario())
    assert max(b.get() for b in metrics.latency._buckets[6:]) >= 1  # an observation above 0.25 s
