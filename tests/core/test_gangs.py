"""Gangs: a distributed job's tasks start together or not at all, and stop together
(docs/workloads.md, "Gangs"; issue 62). A gang is a request (``count`` tasks) with ``gang``
its size: at least that many of its tasks start in one pass, or none does."""

from __future__ import annotations

from collections import Counter

import pytest

from fairstream.core.model import DecisionKind, NodeHeartbeat, NodeLost, ReasonCode, TaskCompleted, TaskSubmitted
from fairstream.policies import REGISTRY
from fairstream.sim.scenario import ModelError
from tests.builders import engine, scenario, tree


def gpus(name: str, count: float = 4, time: float = 0.0) -> NodeHeartbeat:
    return NodeHeartbeat(time, name, {"gpu": count})


def gang(task: str, tenant: str, count: int, least: int, time: float = 0.0, gpu: float = 1) -> TaskSubmitted:
    return TaskSubmitted(time, task, task, tenant, {"gpu": gpu}, count=count, gang=least)


def one(task: str, tenant: str, time: float = 0.0, gpu: float = 1) -> TaskSubmitted:
    return TaskSubmitted(time, task, task, tenant, {"gpu": gpu})


def placed(decisions) -> Counter:
    """Tasks placed per node."""
    return Counter(d.node for d in decisions if d.kind is DecisionKind.PLACE for _ in d.task_ids)


POLICIES = [p for p in REGISTRY if p != "flex"]


@pytest.mark.parametrize("policy", POLICIES)
def test_a_gang_of_8_with_5_gpus_free_starts_nothing_and_all_8_together_when_8_are_free(policy):
    e = engine(tree("A", "B"), policy, resources=("gpu",))
    e.step(0, [gpus("n0"), gpus("n1"), one("b1", "B"), one("b2", "B"), one("b3", "B")])
    # 8 gpus, 3 taken by B: 5 free, and the gang needs 8 at once.
    waiting = e.step(1, [gang("j", "A", count=8, least=8)])
    assert not [d for d in waiting.decisions if d.tenant == "A"], "no part of the gang starts"
    started = e.step(2, [TaskCompleted(2, "b1"), TaskCompleted(2, "b2"), TaskCompleted(2, "b3")])
    # All 8 at the same instant, first fit: n0 filled, then n1.
    assert placed(started.decisions) == {"n0": 4, "n1": 4}
    assert {d.time for d in started.decisions} == {2}


def test_a_gang_of_8_of_10_starts_8_together_and_the_rest_as_room_comes():
    e = engine(tree("A"), "drf", resources=("gpu",))
    e.step(0, [gpus("n0"), gpus("n1"), gpus("n2", 1)])
    # 9 gpus: the 8 start together, and then a 9th fits as any task would; the 10th waits.
    first = e.step(1, [gang("j", "A", count=10, least=8)])
    assert sum(placed(first.decisions).values()) == 9
    assert "gang j of 8 starts whole (n0: 4, n1: 4)" in first.decisions[0].reason
    later = e.step(2, [gpus("n3", 1, time=2)])
    assert [d.task for d in later.decisions] == ["j-9"]


def test_a_gang_spans_the_fewest_nodes_first_fit_gives():
    e = engine(tree("A"), "drf", resources=("gpu",))
    e.step(0, [gpus("n0", 2), gpus("n1", 8), gpus("n2", 8)])
    result = e.step(1, [gang("j", "A", count=6, least=6)])
    # First fit: n0's 2, then 4 of n1's 8.
    assert placed(result.decisions) == {"n0": 2, "n1": 4}


def test_a_lost_node_stops_the_whole_gang_and_it_starts_again_whole_with_the_same_task_ids():
    e = engine(tree("A"), "drf", resources=("gpu",))
    e.step(0, [gpus("n0"), gpus("n1"), gang("j", "A", count=8, least=8)])
    lost = e.step(5, [NodeLost(5, "n0")])
    requeued = [d for d in lost.decisions if d.kind is DecisionKind.REQUEUE]
    # The 4 on n0 and the 4 on n1: a distributed job cannot go on without a worker.
    assert sorted(d.task for d in requeued) == [f"j-{k}" for k in range(8)]
    assert all(d.code is ReasonCode.NODE_LOST for d in requeued)
    assert not [d for d in lost.decisions if d.kind is DecisionKind.PLACE], "4 gpus left: the gang of 8 waits whole"
    assert e.workload.requests["j"].count == 8
    again = e.step(6, [gpus("n2", 4, time=6)])
    assert sorted(t for d in again.decisions for t in d.task_ids) == sorted(f"j-{k}" for k in range(8))


def test_a_completed_task_of_a_stopped_gang_is_not_run_again():
    e = engine(tree("A"), "drf", resources=("gpu",))
    e.step(0, [gpus("n0"), gpus("n1"), gang("j", "A", count=8, least=6)])
    e.step(3, [TaskCompleted(3, "j-2")])
    lost = e.step(5, [NodeLost(5, "n1")])
    assert sorted(d.task for d in lost.decisions if d.kind is DecisionKind.REQUEUE) == \
        ["j-0", "j-1", "j-3", "j-4", "j-5", "j-6", "j-7"]
    request = e.workload.requests["j"]
    assert (request.index, request.count, sorted(request.cancelled)) == (0, 7, [2])
    again = e.step(6, [gpus("n2", 4, time=6)])
    assert sorted(t for d in again.decisions for t in d.task_ids) == ["j-0", "j-1", "j-3", "j-4", "j-5", "j-6", "j-7"]


@pytest.mark.parametrize("event, reason", [
    pytest.param(gang("j", "A", count=4, least=8), "gang.min: 8 must start together, but the submission has 4 tasks",
                 id="a gang larger than its request is refused"),
    pytest.param(TaskSubmitted(0, "j", "j", "A", {"gpu": 1}, gang=2),
                 "gang.min: 2 must start together, but the submission has 1 task (a gang is a request: give count)",
                 id="a gang of one task without a count is refused"),
    pytest.param(gang("j", "A", count=4, least=0), "gang.min: must be an integer from 1 to 10000000, got 0",
                 id="a gang of none is refused"),
])
def test_a_gang_that_cannot_be_is_refused_with_its_reason(event, reason):
    e = engine(tree("A"), "drf", resources=("gpu",))
    result = e.step(0, [gpus("n0"), event])
    assert [why for _, why in result.rejected] == [reason]


def test_a_scenario_gang_larger_than_its_request_is_an_error_naming_the_task():
    with pytest.raises(ModelError, match=r"tasks\[0\].gang.min: 8 must start together, but the submission has 4 tasks"):
        scenario(resources=["gpu"], tenants=[{"id": "A"}], nodes=[{"id": "n0", "capacity": {"gpu": 4}}],
                 tasks=[{"id": "j", "tenant": "A", "submit": 0, "duration": 1, "demand": {"gpu": 1}, "count": 4,
                         "gang": {"min": 8}}])


@pytest.mark.parametrize("reservation", ["off", "on"])
def test_a_gang_that_never_fits_the_cluster_is_unschedulable_and_holds_nothing_back(reservation):
    e = engine(tree("A", "B"), "drf", resources=("gpu",), reservation=reservation)
    result = e.step(0, [gpus("n0"), gpus("n1"), gang("j", "A", count=10, least=10), one("b", "B", gpu=3)])
    [verdict] = [d for d in result.decisions if d.kind is DecisionKind.UNSCHEDULABLE]
    assert verdict.reason == ("unschedulable: gang of 10 ({'gpu': 1.0} each) never starts whole: the 2 live nodes "
                              "it may use hold at most 8 of its tasks at once")
    assert [d.task for d in result.decisions if d.kind is DecisionKind.PLACE] == ["b"]
    assert e.reservations.held is None


def test_a_gang_first_in_line_holds_nodes_against_smaller_tasks_with_reservations_on():
    e = engine(tree("A", "B"), "drf", resources=("gpu",), reservation="on")
    e.step(0, [gpus("n0"), gpus("n1"), one("b0", "B", gpu=4)])
    e.step(1, [gang("j", "A", count=6, least=6)])  # 4 free: it waits, first in line
    assert e.reservations.held is not None and e.reservations.held.tenant == "A"
    later = e.step(2, [one("b1", "B", time=2)])
    assert not [d for d in later.decisions if d.kind is DecisionKind.PLACE], "B's small task keeps off the held room"


@pytest.mark.parametrize("policy", ["drf", "ltrf", "hltrf"])
def test_a_running_gang_whose_loss_would_take_its_tenant_below_its_fair_share_is_not_preempted(policy):
    # A's gang of 8 is all of the cluster; B wants 2 gpus (fair shares 6/8 and 2/8): without the
    # whole gang A would hold 0, below its 6/8, and one task of it alone may not go.
    e = engine(tree("A", "B"), policy, resources=("gpu",), preemption_timeout=10)
    e.step(0, [gpus("n0"), gpus("n1"), gang("j", "A", count=8, least=8)])
    e.step(1, [one("b1", "B", time=1), one("b2", "B", time=1)])
    later = e.step(30, [])
    assert not [d for d in later.decisions if d.kind is DecisionKind.PREEMPT]


def test_a_waiting_gang_says_how_many_fit_now_where_and_how_many_more_it_needs_at_once():
    from fairstream.core.explain import WaitReason, explain

    e = engine(tree("A", "B"), "drf", resources=("gpu",))
    e.step(0, [gpus("n0"), gpus("n1"), one("b1", "B", gpu=2), one("b2", "B")])
    e.step(1, [gang("j", "A", count=8, least=8)])
    [entry] = explain(e).pending["A"]
    # n0: 4 - 2 - 1 = 1 free; n1: 4 free. 5 of 8 fit.
    assert entry.reason is WaitReason.GANG
    assert entry.message == ('gang j of 8 ({"gpu":1.0} each) starts whole or not at all: 5 fit now (n0: 1, n1: 4), '
                             'it needs room for 3 more at once; nodes n1, n0 are reserved for it since 1: room freed there is '
                             'kept for it from the tenants behind it in line until 301')


def test_a_tenant_behind_a_gang_that_its_room_would_start_is_told_the_room_may_go_first_to_the_gang():
    from fairstream.core.explain import WaitReason, explain

    e = engine(tree("A", "B", "C"), "drf", resources=("gpu",), reservation="off")
    e.step(0, [gpus("n0"), gpus("n1"), one("c1", "C", gpu=3), one("c2", "C", gpu=2)])
    # 3 gpus free; A's gang of 4 (ahead: share 0) fits 3; B (share 0, later) waits for 4.
    e.step(1, [gang("j", "A", count=4, least=4, time=1)])
    e.step(2, [one("b", "B", time=2, gpu=4)])
    [entry] = explain(e).pending["B"]
    assert entry.reason is WaitReason.BEHIND_TENANTS and entry.waits_for == "A"
    assert "freed room may go first to A's gang j" in entry.message
    assert "if with it the gang starts whole (3 of its 4 fit now)" in entry.message


def test_a_gang_goes_through_the_scenario_file_and_the_wire_unchanged():
    from fairstream.sim.scenario import parse_scenario
    from fairstream.wire.events import SUBMITTED, decode_message, event_from_json, event_to_json

    document = {"resources": ["gpu"], "tenants": [{"id": "A"}], "nodes": [{"id": "n0", "capacity": {"gpu": 8}}],
                "tasks": [{"id": "j", "job": "j", "tenant": "A", "submit": 0, "duration": 1, "demand": {"gpu": 1},
                           "count": 8, "gang": {"min": 6}}]}
    spec = parse_scenario(document).tasks[0]
    assert spec.gang == 6 and parse_scenario(parse_scenario(document).to_json()).tasks[0].gang == 6
    event = gang("j", "A", count=8, least=6)
    assert event_from_json(event_to_json(event)) == event
    message = b'{"cluster": "c1", "task": "j", "tenant": "A", "demand": {"gpu": 1}, "time": 0, "count": 8, "gang": {"min": 6}}'
    [decoded] = decode_message(SUBMITTED, message)
    assert decoded.event.gang == 6


def busy_cluster(hold: float):
    """Four nodes of 4 gpu; B's 12 one-gpu tasks fill n0-n2; A's gang of 8 waits first in line
    (A's share 0 against B's 0.75) with 4 gpus free on n3."""
    e = engine(tree("A", "B"), "drf", resources=("gpu",), reservation="on", gang_hold=hold)
    e.step(0, [gpus(f"n{k}") for k in range(4)] + [one(f"b{k}", "B") for k in range(1, 13)])
    e.step(1, [gang("j", "A", count=8, least=8, time=1)])
    return e


def test_a_gang_first_in_line_holds_as_many_nodes_as_hold_it_whole_and_smaller_tasks_keep_off_them():
    e = busy_cluster(hold=100)
    held = e.reservations.held
    # The node with the most room now (n3: 4), then the lowest of those that hold 4 when idle (n0):
    # 8 together.
    assert (held.tenant, [e.nodes[r].id for r in held.rows], held.until) == ("A", ["n3", "n0"], 101)
    kept = e.step(2, [one("b13", "B", time=2)])
    assert not [d for d in kept.decisions if d.kind is DecisionKind.PLACE], "n3's free room is kept for the gang"
    started = e.step(3, [TaskCompleted(3, f"b{k}") for k in range(1, 5)])  # n0's tasks end
    assert placed([d for d in started.decisions if d.tenant == "A"]) == {"n0": 4, "n3": 4}


def test_a_gangs_hold_runs_out_after_gang_hold_then_its_room_goes_to_others_for_as_long():
    e = busy_cluster(hold=10)
    assert e.reservations.held.until == 11 and e.wake_at() == 11  # (the simulator steps the engine then)
    e.step(2, [one("b13", "B", time=2)])  # kept off n3 while the hold lasts
    lapsed = e.step(11, [])
    assert [d.task for d in lapsed.decisions if d.kind is DecisionKind.PLACE] == ["b13"]
    assert e.reservations.held is None and e.reservations.lapsed == {"j": 21}
    e.step(15, [one("b14", "B", time=15)])  # placed: nothing is held for the gang until 21
    assert e.reservations.held is None
    e.step(21, [])
    assert e.reservations.held is not None and e.reservations.held.tenant == "A"  # it holds again


def test_a_waiting_gang_says_which_nodes_are_held_for_it_since_when_and_until_when():
    from fairstream.core.explain import WaitReason, explain

    e = busy_cluster(hold=100)
    [entry] = explain(e).pending["A"]
    assert entry.reason is WaitReason.GANG
    # Held from 1, when the gang came first in line, for hold = 100 s.
    assert entry.message.endswith("4 fit now (n3: 4), it needs room for 4 more at once; nodes n3, n0 are reserved "
                                  "for it since 1: room freed there is kept for it from the tenants behind it in line "
                                  "until 101")


@pytest.mark.parametrize("policy", ["drf", "fair"])
def test_a_running_gang_is_preempted_whole_for_a_starved_tenant_and_the_room_goes_to_it(policy):
    # (Under ltrf and hltrf B's pseudo-accumulated usage ranks it behind A here: no victim.)
    e = engine(tree("A", "B"), policy, resources=("gpu",), preemption="on", preemption_timeout=10,
               reservation="off")
    # A: a gang of 4 on n0, then 4 single tasks on n1: all 8 gpus. B wants a whole node (4 gpus):
    # fair shares 4 and 4. Freeing n0 kills the gang's 4 tasks, n1 4 of A's single tasks: a tie,
    # and the lower number wins.
    e.step(0, [gpus("n0"), gpus("n1"), gang("j", "A", count=4, least=4)] + [one(f"a{k}", "A") for k in range(4)])
    e.step(1, [one("b", "B", time=1, gpu=4)])
    later = e.step(12, [])
    preempted = [d for d in later.decisions if d.kind is DecisionKind.PREEMPT]
    assert sorted(d.task for d in preempted) == ["j-0", "j-1", "j-2", "j-3"]
    assert all("its gang j stops whole" in d.reason for d in preempted)
    assert [(d.task, d.node) for d in later.decisions if d.kind is DecisionKind.PLACE] == [("b", "n0")]
    assert e.workload.requests["j"].count == 4  # the gang waits whole again


def test_a_task_of_a_gang_is_never_a_victim_alone():
    e = engine(tree("A", "B"), "drf", resources=("gpu",), preemption="on", preemption_timeout=10,
               reservation="off")
    # n0: a0, a1, j-0, j-1; n1: j-2, j-3, a2, a3. B wants 2 gpus: fair shares 6/8 and 2/8. On n0 the
    # youngest are j-1 and j-0, but the whole gang would take A to 4/8: A's older single tasks go.
    e.step(0, [gpus("n0"), gpus("n1"), one("a0", "A"), one("a1", "A"), gang("j", "A", count=4, least=4),
               one("a2", "A"), one("a3", "A")])
    assert placed(e.step(0.5, []).decisions) == {} and e.workload.gangs.running(e.workload)["j"].keys() == {
        "j-0", "j-1", "j-2", "j-3"}
    e.step(1, [one("b", "B", time=1, gpu=2)])
    later = e.step(12, [])
    assert sorted(d.task for d in later.decisions if d.kind is DecisionKind.PREEMPT) == ["a0", "a1"]
    assert [(d.task, d.node) for d in later.decisions if d.kind is DecisionKind.PLACE] == [("b", "n0")]


def test_preemption_frees_room_for_a_whole_waiting_gang_across_nodes_or_none():
    e = engine(tree("A", "B"), "drf", resources=("gpu",), preemption="on", preemption_timeout=10,
               reservation="off")
    # n0: a0-a2, n1: a3-a5 (1 gpu free on each). B's gang of 4 fits 2 now. Fair shares 4 and 4:
    # A may give 2 tasks. n0: its free gpu and a2, a1 make room for 3; n1's free gpu the 4th.
    on = lambda k, node: TaskSubmitted(0, f"a{k}", f"a{k}", "A", {"gpu": 1}, {"nodes": [node]})
    e.step(0, [gpus("n0"), gpus("n1")] + [on(k, "n0") for k in range(3)] + [on(k, "n1") for k in range(3, 6)])
    waiting = e.step(1, [gang("j", "B", count=4, least=4, time=1)])
    assert not [d for d in waiting.decisions if d.tenant == "B"]
    later = e.step(12, [])
    preempted = [d for d in later.decisions if d.kind is DecisionKind.PREEMPT]
    assert [d.task for d in preempted] == ["a2", "a1"]
    # (Said as every preemption says it, naming the starved tenant first: a property reads it.)
    assert all(d.reason.startswith("preempt: frees room for B, ") and "to start its gang j whole" in d.reason
               for d in preempted)
    started = [d for d in later.decisions if d.kind is DecisionKind.PLACE]
    assert placed(started) == {"n0": 3, "n1": 1} and {d.code for d in started} == {ReasonCode.RECLAIMED}
    assert "gang j of 4 starts whole (n0: 3, n1: 1)" in started[0].reason


def test_preemption_frees_nothing_for_a_gang_it_cannot_make_whole_room_for():
    e = engine(tree("A", "B"), "drf", resources=("gpu",), preemption="on", preemption_timeout=10,
               reservation="off")
    # B's gang of 8 is the whole cluster: A may give only what keeps it at its fair share (4 of 8).
    e.step(0, [gpus("n0"), gpus("n1")] + [one(f"a{k}", "A") for k in range(8)])
    e.step(1, [gang("j", "B", count=8, least=8, time=1)])
    later = e.step(12, [])
    assert later.decisions == []


def test_a_gang_may_hold_its_nodes_for_good_with_gang_hold_inf():
    e = busy_cluster(hold=float("inf"))
    held = e.reservations.held
    assert held.for_gang and [e.nodes[r].id for r in held.rows] == ["n3", "n0"] and e.wake_at() is None
    e.step(500, [one("b13", "B", time=500)])
    assert e.reservations.held == held and "b13" in {entry.id for entry in e.pending["B"]}


def test_with_backfill_a_task_that_ends_before_the_gang_can_start_may_use_its_held_nodes():
    e = engine(tree("A", "B"), "drf", resources=("gpu",), reservation="backfill", gang_hold=1000)
    # B's 12 tasks fill n0-n2, those on n0 expected to end at 50; A's gang of 8 holds n3 (4 free)
    # and n0: it can start at 50. B's next task, expected to end at 40, backfills n3; one
    # expected to end at 60 may not.
    b = [TaskSubmitted(0, f"b{k}", f"b{k}", "B", {"gpu": 1}, estimate=50 if k < 4 else 500) for k in range(12)]
    e.step(0, [gpus(f"n{k}") for k in range(4)] + b)
    e.step(1, [gang("j", "A", count=8, least=8, time=1)])
    assert [e.nodes[r].id for r in e.reservations.held.rows] == ["n3", "n0"] and e.backfill_until() == 50
    short = e.step(2, [TaskSubmitted(2, "s", "s", "B", {"gpu": 1}, estimate=38)])
    [backfilled] = [d for d in short.decisions if d.kind is DecisionKind.PLACE]
    assert (backfilled.task, backfilled.node, backfilled.code) == ("s", "n3", ReasonCode.BACKFILL)
    assert "reserved for A's gang j, which can start on the nodes held for it at 50" in backfilled.reason
    long = e.step(3, [TaskSubmitted(3, "l", "l", "B", {"gpu": 1}, estimate=57)])
    assert not [d for d in long.decisions if d.kind is DecisionKind.PLACE]
