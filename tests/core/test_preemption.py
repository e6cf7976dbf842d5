"""Preemption toward fair share (fairstream.core.preemption): worked scenarios with the
arithmetic in comments, and the contract's rules one by one."""

from __future__ import annotations

from collections import Counter

import pytest

from fairstream.core.model import DecisionKind, ReasonCode
from fairstream.sim.scenario import parse_scenario
from fairstream.sim.simulator import Simulator

PREEMPTING = ["drf", "fair", "ltrf", "hltrf"]


def two_tenants(b_count: int = 100, b_demand: float = 1.0, a_count: int = 100) -> dict:
    """One node of 100 units; A submits unit tasks of 10,000 s at t = 0, B at t = 100."""
    return {"resources": ["cpu"], "nodes": [{"id": "n", "capacity": {"cpu": 100}}],
            "tasks": [{"id": "a", "job": "ja", "tenant": "A", "submit": 0, "duration": 10000, "demand": {"cpu": 1},
                       "count": a_count},
                      {"id": "b", "job": "jb", "tenant": "B", "submit": 100, "duration": 10000,
                       "demand": {"cpu": b_demand}, "count": b_count}]}


def run(document: dict, policy: str, preemption: str = "on", timeout: float = 30, threshold: float = 0.5):
    """Simulate; returns the decisions and, after every step, each tenant's running tasks."""
    params = {"preemption": preemption, "preemption_timeout": str(timeout), "preemption_threshold": str(threshold)}
    if policy != "drf":
        params["resource"] = "cpu"
    running: list[tuple[float, dict[str, int]]] = []

    def watch(engine, result):
        counts = Counter(t.tenant for t in engine.tasks.values() if t.state.value == "running")
        running.append((engine.time, dict(counts)))

    result = Simulator(parse_scenario(document), policy, params, on_step=watch).run()
    return result, running


def held_at(running, time: float, tenant: str) -> int:
    return [counts.get(tenant, 0) for t, counts in running if t <= time][-1]


@pytest.mark.parametrize("policy", PREEMPTING)
def test_a_tenant_starved_past_the_timeout_gets_its_fair_share_from_the_youngest_tasks_above_it(policy):
    # B arrives at t = 100 to a node A fills. Its fair share: weight 1 of 2 active = 50 units.
    # It holds 0 < 0.5 x 50, so it is starved from t = 100; at t = 100 + 30 the simulator
    # wakes the engine for a pass, which preempts A down to exactly its share (100 - 50 = 50)
    # and places 50 of B's tasks on the room: B holds 50 at t = 130.
    result, running = run(two_tenants(), policy)
    assert held_at(running, 129.9, "B") == 0 and held_at(running, 130, "B") == 50
    preempted = [d for d in result.decisions if d.kind is DecisionKind.PREEMPT and d.tenant == "A"]
    assert len(preempted) == 50
    # All of A's tasks started at t = 0: the youngest are the latest submitted, a-99 down to a-50.
    assert [d.task for d in preempted] == [f"a-{k}" for k in range(99, 49, -1)]
    assert all(d.code is ReasonCode.FAIR_SHARE_PREEMPTION and "frees room for B" in d.reason for d in preempted)
    reclaimed = [d for d in result.decisions if d.code is ReasonCode.RECLAIMED and d.time == 130]
    assert sum(d.count for d in reclaimed) == 50 and {d.tenant for d in reclaimed} == {"B"}
    # Each placement comes right after the preemption that made its room (an agent applying
    # decisions in order never over-commits), never merged into an earlier placement.
    at_130 = [(d.kind, d.count) for d in result.decisions if d.time == 130]
    assert at_130 == [(DecisionKind.PREEMPT, 1), (DecisionKind.PLACE, 1)] * 50
    assert [task for d in reclaimed for task in d.task_ids] == [f"b-{k}" for k in range(50)]
    # A is never cut below its share of 50 while B is active.
    assert min(counts.get("A", 0) for t, counts in running if 100 <= t < 10000) == 50
    summary = result.summary()["tenants"]
    assert summary["B"]["time_to_fair_share"] == 30.0
    # Work lost: 50 tasks that ran from t = 0 to t = 130.
    assert summary["A"]["preemptions"] == 50 and summary["A"]["work_lost"] == pytest.approx(50 * 130)


@pytest.mark.parametrize("policy", PREEMPTING)
def test_without_preemption_the_late_tenant_holds_nothing_until_the_first_tasks_finish(policy):
    result, running = run(two_tenants(), policy, preemption="off")
    assert held_at(running, 9999, "B") == 0 and held_at(running, 10000, "B") > 0
    assert not [d for d in result.decisions if d.kind is DecisionKind.PREEMPT]
    assert result.summary()["tenants"]["B"]["time_to_fair_share"] == 9900.0


@pytest.mark.parametrize("document, expected", [
    pytest.param(two_tenants(b_count=10), 10, id="no more is preempted than the starved tenant's next tasks need"),
    pytest.param(two_tenants(b_demand=200), 0, id="nothing is preempted for a task that would fit nowhere anyway"),
    pytest.param(two_tenants(b_demand=60), 0,
                 id="nothing is preempted when room for the task would take the victim below its share"),
    pytest.param(two_tenants(a_count=40), 0, id="nobody is preempted when the late tenant finds room"),
])
def test_preemption_takes_only_what_it_must(document, expected):
    result, _ = run(document, "drf")
    assert sum(1 for d in result.decisions if d.kind is DecisionKind.PREEMPT) == expected


@pytest.mark.parametrize("timeout, threshold, expected", [
    pytest.param(30, 0.5, 50, id="starved: below half its share for 30 s"),
    pytest.param(20000, 0.5, 0, id="not starved long enough: A's tasks finish before the timeout"),
])
def test_timeout_and_threshold_decide_when_a_tenant_is_starved(timeout, threshold, expected):
    result, _ = run(two_tenants(), "drf", timeout=timeout, threshold=threshold)
    assert sum(1 for d in result.decisions if d.kind is DecisionKind.PREEMPT) == expected


def test_a_threshold_of_0_is_refused_in_one_line_naming_preemption_off():
    # 0 x any fair share is 0: nobody is ever below it, so preemption=on would never act.
    from fairstream.core.model import ModelError
    from fairstream.policies import get as get_policy

    with pytest.raises(ModelError, match="preemption_threshold=0: must be > 0: .* set preemption=off"):
        get_policy("drf").parse_params({"preemption": "on", "preemption_threshold": "0"})


@pytest.mark.parametrize("policy", ["ltrf", "hltrf"])
def test_a_tenant_that_used_less_over_the_long_term_is_not_preempted_for_one_that_used_more(policy):
    # Timeout 10: A is cut to 50 at t = 110. At t = 10,000 A's first 50 finish and LTRF gives
    # the room to B, whose long-term usage is lower: A held 100 units over [100, 110] while B
    # held none (B's pseudo accumulated usage made them level at t = 100), so f_A - f_B is
    # about 100 x 10 = 1,000 unit-seconds. A, holding nothing, is starved from t = 10,000; at
    # t = 10,010 B has gained only 50 x 10 = 500 on A, so it is still behind A in LTRF's order
    # and is not a victim: preemption never undoes the policy's own choice.
    result, _ = run(two_tenants(), policy, timeout=10)
    assert {d.tenant for d in result.decisions if d.kind is DecisionKind.PREEMPT} == {"A"}


# One node of 4 cpu. x (min_share 0.5) runs 4 unit tasks over [0, 1000): it has used 4,000
# cpu-seconds. At 1000 z's 4 tasks of 5,000 s take the node; at 1010 x submits 4 more. x holds 0,
# below its min_share 0.5, so its fair share is 0.5 (2 cpu): starved from 1010, its timeout (30)
# runs out at 1040. z has used 4 x 40 = 160 cpu-seconds by then, far less than x.
MIN_SHARE_AFTER_LONG_USE = {
    "resources": ["cpu"], "nodes": [{"id": "n0", "capacity": {"cpu": 4}}],
    "tenants": [{"id": "x", "min_share": 0.5}, {"id": "z"}],
    "tasks": [{"id": "x0", "job": "jx0", "tenant": "x", "submit": 0, "duration": 1000, "demand": {"cpu": 1}, "count": 4},
              {"id": "z1", "job": "jz1", "tenant": "z", "submit": 1000, "duration": 5000, "demand": {"cpu": 1},
               "count": 4},
              {"id": "x1", "job": "jx1", "tenant": "x", "submit": 1010, "duration": 100, "demand": {"cpu": 1},
               "count": 4}]}


@pytest.mark.parametrize("policy", PREEMPTING)
def test_a_tenant_below_its_min_share_takes_room_back_whatever_its_long_term_usage(policy):
    # Issue 59.3 (x, min_share 0.6, held nothing for 210 s under hltrf). Under ltrf and hltrf a
    # victim must otherwise have used more than the starved tenant (the test above); below its
    # min_share x is first in every fair order, so at 1040 two of z's tasks go (z keeps 2 = its
    # fair share) and x starts two: 2 of 4 = its min_share. Before, ltrf and hltrf took nothing.
    result, running = run(MIN_SHARE_AFTER_LONG_USE, policy, timeout=30, threshold=1)
    preempted = [d.task for d in result.decisions if d.kind is DecisionKind.PREEMPT]
    assert preempted == ["z1-3", "z1-2"]
    assert held_at(running, 1040, "x") == 2 and held_at(running, 1040, "z") == 2


def test_a_preempted_task_goes_back_to_pending_with_its_id_and_starts_over():
    result, _ = run(two_tenants(), "drf")
    placed = Counter(task for d in result.decisions if d.kind is DecisionKind.PLACE for task in d.task_ids)
    assert placed["a-99"] == 2 and placed["a-0"] == 1  # placed again after its preemption
    jobs = result.summary()["tenants"]
    assert result.summary()["unfinished_tasks"] == 0 and jobs["A"]["preemptions"] == 50


def test_preemption_is_off_by_default_and_its_parameters_are_checked():
    from fairstream.core.model import ModelError
    from fairstream.policies import get

    assert get("drf").parse_params({})["preemption"] == "off"
    with pytest.raises(ModelError, match="preemption_threshold=2"):
        get("ltrf").parse_params({"preemption_threshold": "2"})


def three_tenants() -> dict:
    """One node of 100 units; A submits 100 unit tasks of 10,000 s at t = 0, B at t = 100,
    C at t = 200."""
    document = two_tenants()
    document["tasks"].append({"id": "c", "job": "jc", "tenant": "C", "submit": 200, "duration": 10000,
                              "demand": {"cpu": 1}, "count": 100})
    return document


@pytest.mark.parametrize("policy", ["drf", "fair"])
def test_time_to_fair_share_counts_whole_tasks_when_the_exact_share_is_a_fraction_of_one(policy):
    # From t = 200 each of three tenants' fair share is 100 / 3 = 33.33 units. At t = 230 C is
    # starved past the timeout; A and B (50 each since t = 130) give back down to 34 each, not
    # 33 (below 33.33): C holds 100 - 34 - 34 = 32. Nobody is a whole unit task above its share
    # (34 - 33.33 = 0.67 < 1), so 32 is C's fair share as whole tasks allow: reached after 30 s.
    result, running = run(three_tenants(), policy)
    assert [held_at(running, 230, t) for t in "ABC"] == [34, 34, 32]
    assert result.summary()["tenants"]["C"]["time_to_fair_share"] == 30.0
