"""Requests with a count: a job's identical tasks are one pending entry, not N objects
(YARN's ResourceRequest, Kueue's PodSet count). Task ids stay ``<id>-<k>``; a pass that puts
several tasks of one request on one node says so in one decision that lists them.

The policies keep their order: a request takes one arrival number per task and always
carries the number of its next task, so it sorts against other entries exactly as its tasks
would one by one. Charging policies (LTRF, fair) still charge task by task inside the pass;
only the pending entry and the output are grouped.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from pathlib import Path

import pytest

from fairstream.core.model import DecisionKind, TaskCompleted, TaskSubmitted
from fairstream.policies import REGISTRY
from fairstream.sim.scenario import load_scenario
from fairstream.sim.simulator import Simulator
from fairstream.sim.traces.come_and_go import come_and_go
from fairstream.sim.traces.google import load_google
from fairstream.sim.traces.swim import load_swim
from fairstream.state.engine_snapshot import decode_engine, encode_engine
from tests.builders import engine, node, tree, worker_config

ROOT = Path(__file__).resolve().parents[2]
SWIM = ROOT / "tests" / "data" / "FB-2009_samples_24_times_1hr_1.head60.tsv"
GOOGLE = ROOT / "tests" / "data" / "google-task_events-part-00001.head3000.csv.gz"


def request(name: str, tenant: str, count: int, time: float = 0.0, **demand) -> TaskSubmitted:
    return TaskSubmitted(time, name, f"{tenant}-job", tenant, demand or {"mem": 1}, None, count)


def placements_per_step(decisions) -> dict[float, list[tuple[str, str]]]:
    """Per decision time, the (task, node) placements, each task of a grouped decision apart."""
    out = defaultdict(list)
    for d in decisions:
        if d.kind is DecisionKind.PLACE:
            out[d.time].extend((task, d.node) for task in d.task_ids)
    return {time: sorted(pairs) for time, pairs in out.items()}


SCENARIOS = [
    pytest.param(load_scenario(ROOT / "examples" / "two-tenants.json"), id="two-tenants.json"),
    pytest.param(load_scenario(ROOT / "examples" / "fig2-starvation.json"), id="fig2-starvation.json"),
    pytest.param(come_and_go(nodes=5, contended_until=120.0), id="the come-and-go workload"),
    pytest.param(load_swim(str(SWIM), limit=12, max_tasks_per_job=40, nodes=6), id="12 SWIM jobs"),
]


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("policy", sorted(REGISTRY))
def test_requests_and_their_tasks_one_by_one_place_the_same_tasks_on_the_same_nodes_at_every_step(scenario, policy):
    assert any(spec.count for spec in scenario.tasks), "the scenario has requests to compare"
    grouped = Simulator(scenario, policy).run()
    one_by_one = Simulator(scenario.one_by_one(), policy).run()
    assert placements_per_step(grouped.decisions) == placements_per_step(one_by_one.decisions)
    # And the grouped run says it in fewer decisions, each listing its tasks.
    assert len(grouped.decisions) <= len(one_by_one.decisions)
    assert all(d.count == len(d.task_ids) for d in grouped.decisions if d.kind is DecisionKind.PLACE)


def test_a_request_is_one_pending_entry_whatever_its_count():
    e = engine(tree("A"), "drf")
    e.step(0.0, [request("j1-m", "A", 100_000)])
    assert e.tasks == {} and len(e.requests) == 1
    assert e.pending["A"].count == 100_000 and e.accounting.ledgers[0].pending == 100_000
    # 4 slots: one decision of 4 tasks, ids <request>-<k> in order.
    [d] = e.step(1.0, [node("n1", mem=4)]).decisions
    assert (d.task, d.count, d.tasks, d.node) == ("j1-m-0", 4, ("j1-m-0", "j1-m-1", "j1-m-2", "j1-m-3"), "n1")
    assert d.id == "place:j1-m-0*4@1.0>n1"
    assert d.to_json()["count"] == 4 and d.to_json()["tasks"] == list(d.tasks)
    assert sorted(e.tasks) == ["j1-m-0", "j1-m-1", "j1-m-2", "j1-m-3"]  # running tasks are objects
    assert e.pending["A"].count == 99_996


@pytest.mark.parametrize("events, reason", [
    pytest.param([request("j", "A", 3), request("j", "A", 2)], "duplicate submission",
                 id="a request id already pending is a duplicate"),
    pytest.param([request("j", "A", 3), TaskSubmitted(0.0, "j-2", "x", "A", {"mem": 1})], "duplicate submission",
                 id="a single task named like a task of a pending request is a duplicate"),
    pytest.param([TaskSubmitted(0.0, "j-1", "x", "A", {"mem": 1}), request("j", "A", 3)], "'j-1': duplicate",
                 id="a request whose task ids include a known task is a duplicate"),
    pytest.param([TaskSubmitted(0.0, "j-5", "x", "A", {"mem": 1}), request("j", "A", 2)], None,
                 id="a request whose task ids miss a known task is not a duplicate"),
    pytest.param([request("j", "A", 3), request("j", "A", 3)], "duplicate submission",
                 id="the same request twice in one step is a duplicate"),
    pytest.param([request("j", "A", 3), TaskSubmitted(0.0, "j-1", "x", "A", {"mem": 1})], "duplicate submission",
                 id="a task of a request submitted earlier in the step is a duplicate"),
    pytest.param([request("j", "A", 0)], "count: must be an integer from 1", id="a count of 0 is refused"),
    pytest.param([request("j", "A", 3), TaskCompleted(0.0, "j-3")], "completion of an unknown task",
                 id="a completion past the request's last index is of an unknown task"),
    pytest.param([request("j", "A", 3), TaskCompleted(0.0, "j-01")], "completion of an unknown task",
                 id="an index written another way is another id"),
])
def test_request_ids_are_checked_like_task_ids(events, reason):
    e = engine(tree("A"), "drf")
    said = e.admissible(events)  # "what if", before: the same verdicts as the step's
    result = e.step(0.0, events)
    assert [why for why in said if why is not None] == [why for _, why in result.rejected]
    if reason is None:
        assert result.rejected == []
    else:
        assert result.rejected and reason in result.rejected[-1][1]


def test_a_request_of_a_million_tasks_is_checked_against_the_ids_the_engine_holds_not_its_own():
    # The request's ids are walked only when fewer than the known ones: here the one known id.
    e = engine(tree("A"), "drf")
    e.step(0.0, [TaskSubmitted(0.0, "j-999999", "x", "A", {"mem": 1})])
    [(_, why)] = e.step(1.0, [request("j", "A", 1_000_000, time=1.0)]).rejected
    assert why == "task 'j-999999': duplicate submission"
    assert e.step(2.0, [request("k", "A", 1_000_000, time=2.0)]).rejected == []


def test_a_request_of_100000_tasks_costs_the_worker_memory_for_its_running_tasks_only():
    import asyncio
    import gc
    import json
    import tracemalloc

    from fairstream.state.store import MemoryStore
    from fairstream.streams.processor import Incoming, Processor

    async def publish(topic, key, message):
        pass

    async def scenario():
        p = Processor(MemoryStore(), publish, worker_config("drf"))
        await p.handle([Incoming("heartbeat", json.dumps({"cluster": "c1", "node": "n1", "time": 0,
                                                          "capacity": {"cpu": 16, "mem": 64}}).encode(),
                                 "nodes.heartbeats", 0, 0, 0.0, None)])
        gc.collect()
        tracemalloc.start()
        try:
            body = {"cluster": "c1", "task": "big", "tenant": "A", "demand": {"cpu": 1, "mem": 4}, "time": 1, "count": 100_000}
            await p.handle([Incoming("submitted", json.dumps(body).encode(), "tasks.submitted", 0, 0, 0.0, None)])
            gc.collect()
            return tracemalloc.get_traced_memory(), p.sessions["c1"].engine
        finally:
            tracemalloc.stop()

    (now, peak), e = asyncio.run(scenario())
    assert len(e.tasks) == 16 and e.pending["A"].count == 100_000 - 16
    # Measured: 0.04 MB kept and 0.05 MB at the peak (16 running tasks); a task object each
    # would be about 60 MB.
    assert now < 1 * 2**20 and peak < 2 * 2**20, (now, peak)


def test_a_task_of_a_request_completed_before_it_ran_leaves_the_request_and_is_never_placed():
    e = engine(tree("A"), "drf")
    e.step(0.0, [request("j", "A", 5)])
    done = e.step(1.0, [TaskCompleted(1.0, "j-2"), TaskCompleted(1.0, "j-0")])  # killed while pending
    assert [t.id for t in done.finished] == ["j-2", "j-0"] and e.pending["A"].count == 3
    placed = e.step(2.0, [node("n1", mem=10)]).decisions
    assert [d.tasks for d in placed] == [("j-1", "j-3", "j-4")]
    assert e.requests == {} and e.pending["A"].count == 0


def test_a_task_requeued_from_a_lost_node_goes_before_the_rest_of_its_request():
    e = engine(tree("A"), "fifo")
    e.step(0.0, [node("n1", mem=2), node("n2", mem=1), request("j", "A", 6)])
    assert sorted(e.tasks) == ["j-0", "j-1", "j-2"]
    lost = e.step(1.0, [TaskCompleted(1.0, "j-0"), TaskCompleted(1.0, "j-1"),
                        TaskCompleted(1.0, "j-2")]).decisions  # n1 and n2 free again: j-3..j-5
    assert [d.task_ids for d in lost] == [("j-3", "j-4"), ("j-5",)]
    from fairstream.core.model import NodeLost

    again = e.step(2.0, [NodeLost(2.0, "n1"), request("k", "A", 1)]).decisions
    requeued = [d.task for d in again if d.kind is DecisionKind.REQUEUE]
    assert requeued == ["j-3", "j-4"]
    # One slot left (n2 is busy with j-5): when it frees, the requeued j-3 goes first, before k-0.
    freed = e.step(3.0, [TaskCompleted(3.0, "j-5")]).decisions
    assert [d.task for d in freed] == ["j-3"]


def test_an_unschedulable_request_is_reported_once_by_its_id_and_count():
    e = engine(tree("A"), "drf")
    [d] = e.step(0.0, [node("n1", mem=2), request("big", "A", 7, mem=4)]).decisions
    assert (d.kind, d.task, d.count) == (DecisionKind.UNSCHEDULABLE, "big", 7)
    assert e.step(1.0, [request("small", "A", 1)]).decisions[0].task == "small-0"


def test_a_request_half_placed_survives_a_snapshot_and_decides_the_rest_alike():
    def run(e, snapshot_at=None):
        out = []
        for step, events in enumerate([[node("n1", mem=3), request("j", "A", 10), request("k", "B", 10)],
                                       [TaskCompleted(1.0, "j-0"), TaskCompleted(1.0, "j-5")],
                                       [TaskCompleted(2.0, "k-0"), TaskCompleted(2.0, "j-1")],
                                       [TaskCompleted(3.0, "j-2"), TaskCompleted(3.0, "k-1")]]):
            if step == snapshot_at:
                e = decode_engine(encode_engine(e))
            out += e.step(float(step), events).decisions
        return [(d.kind, d.task_ids, d.node, d.time) for d in out]

    assert run(engine(tree("A", "B"), "ltrf"), snapshot_at=2) == run(engine(tree("A", "B"), "ltrf"))


@pytest.mark.parametrize("load", [
    pytest.param(lambda: load_swim(str(SWIM), limit=25, nodes=3), id="a SWIM trace"),
    pytest.param(lambda: load_google(str(GOOGLE), users=6, nodes=4), id="a Google task_events part"),
])
def test_a_trace_read_as_the_run_reaches_it_decides_as_the_same_workload_held_whole(load):
    lazy = load()
    assert not isinstance(lazy.tasks, list)  # the loader reads the file as it is iterated
    assert len(list(lazy.tasks)) > 20
    whole = dataclasses.replace(lazy, tasks=list(lazy.tasks))
    for policy in ("ltrf", "drf", "hltrf"):
        a, b = Simulator(lazy, policy).run(), Simulator(whole, policy).run()
        assert [d.to_json() for d in a.decisions] == [d.to_json() for d in b.decisions]
        assert a.summary() == b.summary()


def test_the_run_pulls_the_workload_as_its_clock_reaches_each_submission():
    spaced = [dataclasses.replace(spec, submit=100.0 * k) for k, spec in enumerate(
        come_and_go(nodes=1, contended_until=120.0).tasks)]
    passes: list[list[tuple[float, float | None]]] = []  # per pass over the workload: (submit, clock)
    running: list[Simulator] = []

    class Workload:
        def __iter__(self):
            seen = []
            passes.append(seen)
            for spec in spaced:
                seen.append((spec.submit, running[0].engine.time if running else None))
                yield spec

    simulator = Simulator(dataclasses.replace(come_and_go(nodes=1), tasks=Workload()), "drf")
    running.append(simulator)
    simulator.run()
    # The run's own pass (the last; sizing the run and the progress bar read it through
    # first): each submission is read once the clock has reached the one two before it.
    seen = passes[-1]
    assert len(seen) == len(spaced) > 10
    assert all(clock is not None and clock >= before for (before, _), (_, clock) in zip(seen, seen[2:]))


def test_the_schemas_allow_the_counts_the_model_allows():
    import json

    from fairstream.core.model import MAX_COUNT

    schemas = ROOT / "fairstream" / "schemas"
    submitted = json.loads((schemas / "task-submitted.schema.json").read_text())["properties"]["count"]
    scenario = json.loads((schemas / "scenario.schema.json").read_text())["properties"]["tasks"]["items"]["properties"]["count"]
    assert submitted["maximum"] == scenario["maximum"] == MAX_COUNT


def test_policies_that_weigh_pending_work_count_a_requests_tasks_not_its_entries():
    from fairstream.policies.flex import workload_degree

    # A asks for 10 cpu-only tasks (one request) and 2 memory-only tasks; B for memory only.
    # Counted by task A's pending demand is cpu-dominant (10 > 2), B's memory: degree 1 bit.
    # Counted by queue entry (1 request against 2 singles) both would be memory: degree 0.
    e = engine(tree("A", "B"), "drf", resources=("cpu", "mem"))
    e.step(0, [request("a-cpu", "A", 10, cpu=1, mem=0), TaskSubmitted(0, "a-m1", "A-job", "A", {"cpu": 0, "mem": 1}),
               TaskSubmitted(0, "a-m2", "A-job", "A", {"cpu": 0, "mem": 1}), request("b", "B", 3, cpu=0, mem=1)])
    assert workload_degree(e.snapshot()) == pytest.approx(1.0)
