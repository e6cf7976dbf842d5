"""Why a task waits and where each tenant stands (fairstream.core.explain), in simulation
(``simulate --explain-at``) and in the worker (the explanation view, ``status``, ``pending``,
the /v1 documents), on worked scenarios with the arithmetic in comments."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest

from fairstream.cli import main
from fairstream.core.explain import WaitReason, explain
from fairstream.sim.scenario import parse_scenario
from fairstream.sim.simulator import Simulator
from fairstream.state.store import MemoryStore
from fairstream.streams.api import Visibility, http_app
from fairstream.streams.processor import Incoming, Processor
from fairstream.wire.topics import Topics
from fairstream.wire.visibility import (
    WAIT_REASONS,
    DocumentError,
    grouped_entries,
    pending_document,
    queues_document,
    tenant_pending,
)
from tests.builders import worker_config

from test_oracle import (
    A_HOLDER_HELD_BY_MAX_RUNNING,
    A_VICTIM_AHEAD,
    BACKFILL_IS_NOT_BEHIND_THE_HOLDER,
    RESERVATION_YIELDS_TO_THE_TENANT_TOLD,
    RESERVED_SHAPE_BEHIND_A_STARVED_TENANT,
)

# Two nodes of 4 cpu in zones a and b; five tenants of weight 1 (each entitled to 1/5); C may
# hold at most a quarter of the cluster. At t = 0 A starts 3 unit tasks, B 2 and C 2 (its cap:
# 2 of 8 cpu), leaving 1 cpu free on n2. At t = 1 what arrives cannot start, each for its own
# reason.
EVERY_REASON = {
    "resources": ["cpu"],
    "nodes": [{"id": "n1", "capacity": {"cpu": 4}, "labels": {"zone": "a"}},
              {"id": "n2", "capacity": {"cpu": 4}, "labels": {"zone": "b"}}],
    "tenants": [{"id": "A"}, {"id": "B"}, {"id": "C", "max_share": 0.25}, {"id": "D"}, {"id": "E"}],
    "tasks": [
        {"id": "a", "job": "ja", "tenant": "A", "submit": 0, "duration": 100, "demand": {"cpu": 1}, "count": 3},
        {"id": "b", "job": "jb", "tenant": "B", "submit": 0, "duration": 100, "demand": {"cpu": 1}, "count": 2},
        {"id": "c", "job": "jc", "tenant": "C", "submit": 0, "duration": 100, "demand": {"cpu": 1}, "count": 3},
        {"id": "d1", "job": "jd", "tenant": "D", "submit": 1, "duration": 10, "demand": {"cpu": 1},
         "constraints": {"nodes": ["n1"]}},
        {"id": "a4", "job": "ja2", "tenant": "A", "submit": 1, "duration": 10, "demand": {"cpu": 2}},
        {"id": "b3", "job": "jb2", "tenant": "B", "submit": 1, "duration": 10, "demand": {"cpu": 2}},
        {"id": "b4", "job": "jb2", "tenant": "B", "submit": 1, "duration": 10, "demand": {"cpu": 1}, "stage": 1},
        {"id": "u1", "job": "je", "tenant": "E", "submit": 1, "duration": 10, "demand": {"cpu": 16}},
    ],
}


def explained(document: dict, policy: str = "drf", params: dict | None = None, at: float = 5.0):
    simulator = Simulator(parse_scenario(document), policy, params or {}, explain_at=at)
    simulator.run()
    return simulator.explanation


def reasons(explanation) -> dict[str, WaitReason]:
    return {entry.id: entry.reason for entries in explanation.pending.values() for entry in entries}


@pytest.mark.parametrize("task, reason, says", [
    pytest.param("u1", WaitReason.UNSCHEDULABLE, "none of the 2 live nodes it may use is large enough",
                 id="a task larger than every node is unschedulable"),
    pytest.param("b4", WaitReason.STAGE, "stage 1 of job jb2 starts when its earlier stages have finished",
                 id="a later stage waits for its job's earlier stage"),
    # C holds 2 of 8 cpu, 0.25; a third task would take it to 3/8 = 0.375.
    pytest.param("c", WaitReason.MAX_SHARE, "C holds 0.25 of the cluster (dominant share) and this task would take it "
                                            "to 0.375, over its max_share 0.25",
                 id="a tenant at max_share waits though a node has room"),
    pytest.param("d1", WaitReason.CONSTRAINTS, 'its constraints {"nodes":["n1"]} exclude it',
                 id="a task whose constraints exclude the only node with room"),
    # DRF's key, dominant share / weight: D holds nothing, 0; B holds 2/8 = 0.25 of a 1/5
    # entitlement, 1.25; A 3/8, 1.875. D's 1-cpu task waits for room on n1 (reserved for it),
    # so room freed there goes to D first; on n2 B's 2-cpu task is first, then A's.
    pytest.param("b3", WaitReason.BEHIND_TENANTS, "freed room on the nodes both may use goes first to D (dominant "
                                                  "share / weight 0 against B's 1.25; 1 waiting tenant ahead)",
                 id="a tenant behind one that waits for some nodes only is told so"),
    pytest.param("a4", WaitReason.BEHIND_TENANTS, "freed room on the nodes both may use goes first to D (dominant "
                 "share / weight 0 against A's 1.875; 2 waiting tenants ahead)",
                 id="a tenant behind others in the order is told whom"),
])
def test_each_pending_task_says_the_rule_that_holds_it_back(task, reason, says):
    explanation = explained(EVERY_REASON)
    entry = next(e for entries in explanation.pending.values() for e in entries if e.id == task)
    assert entry.reason is reason and says in entry.message
    if reason is WaitReason.BEHIND_TENANTS:
        assert entry.waits_for == "D" and entry.gap == pytest.approx({"b3": 1.25, "a4": 1.875}[task])


def test_a_tenant_ahead_with_larger_tasks_leaves_the_first_room_that_fits_a_smaller_one_to_it():
    # One node of 4 cpu held by A's four long unit tasks; reservation off. B (holding nothing,
    # first by arrival) waits with a 3-cpu task, C (holding nothing) with a 1-cpu task. Both are
    # first in line for the room that fits them: one freed cpu goes to C, as B does not fit it.
    document = {"resources": ["cpu"], "nodes": [{"id": "n1", "capacity": {"cpu": 4}}],
                "tenants": [{"id": "A"}, {"id": "B"}, {"id": "C"}],
                "tasks": [{"id": "a", "job": "ja", "tenant": "A", "submit": 0, "duration": 100, "demand": {"cpu": 1},
                           "count": 4},
                          {"id": "b", "job": "jb", "tenant": "B", "submit": 1, "duration": 10, "demand": {"cpu": 3}},
                          {"id": "c", "job": "jc", "tenant": "C", "submit": 2, "duration": 10, "demand": {"cpu": 1}}]}
    explanation = explained(document, params={"reservation": "off"})
    why = {entry.id: entry for entries in explanation.pending.values() for entry in entries}
    assert why["b"].reason is why["c"].reason is WaitReason.NO_ROOM
    # C is second in DRF's order (B arrived first): it is first in line for this room only,
    # and says so (it once said "first in line" at rank 2).
    assert ("C is first in line for this room (1 tenant ahead of it in the order waits for other room or is held "
            "by a limit): the first room that frees for it on one node goes to it") in why["c"].message
    assert "B is first in line: the first room" in why["b"].message


def test_every_reason_of_the_scenario_occurs_once_and_a_request_names_its_next_task():
    explanation = explained(EVERY_REASON)
    found = reasons(explanation)
    assert sorted(found.values()) == sorted([WaitReason.UNSCHEDULABLE, WaitReason.STAGE, WaitReason.MAX_SHARE,
                                             WaitReason.CONSTRAINTS, WaitReason.BEHIND_TENANTS,
                                             WaitReason.BEHIND_TENANTS])
    # C's request of 3 started c-0 and c-1 within its cap; what waits is c-2.
    (entry,) = explanation.pending["C"]
    assert (entry.first, entry.tasks, entry.position) == ("c-2", 1, 0)


def test_tenant_status_gives_shares_the_policys_key_and_rank():
    explanation = explained(EVERY_REASON)
    status = {t.tenant: t for t in explanation.tenants}
    # The fair share (fairness.fair_shares) of 8 cpu, equal weights, capped by demand (what
    # runs plus what waits that some node could hold) and max_share: E's 16-cpu task fits no
    # node, so E asks for nothing: 0. D asks 1 cpu: 1/8. C asks 3, capped by its max_share:
    # 0.25. A (3 running + 2 waiting = 5/8) and B (2 + 2 = 4/8) share the rest, 0.625: 0.3125 each.
    assert {t.tenant: t.fair_share for t in status.values()} == pytest.approx(
        {"A": 0.3125, "B": 0.3125, "C": 0.25, "D": 0.125, "E": 0.0})
    assert status["A"].share == {"cpu": pytest.approx(3 / 8)} and status["A"].order_value == pytest.approx(1.875)
    assert (status["A"].running, status["A"].pending, status["B"].pending) == (3, 1, 1)
    # Rank in DRF's order among tenants with pending work: D and E hold nothing (0, by arrival
    # then name), then B and C at 1.25 (B first by name), then A.
    assert [t.tenant for t in sorted(status.values(), key=lambda t: t.rank)] == ["D", "E", "B", "C", "A"]
    assert explanation.order_label == "dominant share / weight"


def one_node(policy_tasks: list[dict], capacity: int = 4, tenants: list[dict] | None = None) -> dict:
    return {"resources": ["cpu"], "nodes": [{"id": "n", "capacity": {"cpu": capacity}}],
            "tenants": tenants or [{"id": "A"}, {"id": "B"}], "tasks": policy_tasks}


def unit(name: str, tenant: str, submit: float, count: int, duration: float = 100) -> dict:
    return {"id": name, "job": name, "tenant": tenant, "submit": submit, "duration": duration, "demand": {"cpu": 1},
            "count": count}


@pytest.mark.parametrize("policy, params, document, task, reason, says", [
    # Static partitions: A's is half of 4 cpu; 2 run, the third waits though 2 cpu are idle.
    pytest.param("static", {}, one_node([unit("a", "A", 0, 3)]), "a", WaitReason.PARTITION,
                 "A's partition is full", id="static: a task over its tenant's partition"),
    pytest.param("tetris", {}, one_node([unit("a", "A", 0, 4), unit("b", "B", 1, 2)]), "b", WaitReason.EFFICIENCY,
                 "tetris gives freed room to the best-aligned task", id="tetris: freed room goes by packing"),
    # B arrives at t = 1 to a node A fills; with preemption it is starved from t = 1 and the
    # timeout of 30 s runs out at t = 31.
    pytest.param("drf", {"preemption": "on", "preemption_timeout": "30"},
                 one_node([unit("a", "A", 0, 4), unit("b", "B", 1, 2)]), "b", WaitReason.PREEMPTION_PENDING,
                 "preemption takes room back for it at 31", id="a starved tenant is told when preemption acts"),
])
def test_policy_specific_reasons(policy, params, document, task, reason, says):
    explanation = explained(document, policy, params, at=5)
    entry = next(e for entries in explanation.pending.values() for e in entries if e.id == task)
    assert entry.reason is reason and says in entry.message


def test_a_reservation_holds_room_against_a_tenant_behind_its_holder_until_that_tenant_is_starved_past_its_timeout():
    # Two nodes of 5 mem; fair on mem; G{u0, x} and u1, weights 1 (x never asks: u0's fair
    # share is G's half, 0.5, and its key's weight 1/4). At 0 u0 runs three 1-mem tasks on n0,
    # u1 one 5-mem task on n1, and u1's second fits nowhere: it reserves n0 (2 free, lacks 3).
    # At 1 u0 asks for 2 more: u0's key 0.3/0.25 = 1.2 is behind u1's 0.5/0.5 = 1, so n0's room
    # is kept from it. u0 (0.3 against 0.5) is starved from 1; at 6, past its timeout of 5, u1
    # is at its fair share (0.5) and its reservation no longer holds against u0: u0 takes n0's
    # two free units (reclaimed). A reservation never holds against a tenant ahead of its
    # holder (issue 59): the first version of this test had u0 ahead, and it now simply goes first.
    document = {"resources": ["cpu", "mem"],
                "nodes": [{"id": "n0", "capacity": {"cpu": 5, "mem": 5}}, {"id": "n1", "capacity": {"cpu": 5, "mem": 5}}],
                "tenants": [{"id": "G"}, {"id": "u0", "parent": "G"}, {"id": "x", "parent": "G"}, {"id": "u1"}],
                "tasks": [{"id": "a", "job": "ja", "tenant": "u0", "submit": 0, "duration": 100, "demand": {"mem": 1},
                           "count": 3},
                          {"id": "t1", "job": "j1", "tenant": "u1", "submit": 0, "duration": 100, "demand": {"mem": 5},
                           "count": 2},
                          {"id": "b", "job": "jb", "tenant": "u0", "submit": 1, "duration": 100, "demand": {"mem": 1},
                           "count": 2}]}
    params = {"preemption": "on", "preemption_timeout": "5", "preemption_threshold": "1", "resource": "mem"}
    at_3 = explained(document, "fair", params, at=3).pending
    (held,) = at_3["u1"]
    assert held.reason is WaitReason.RESERVATION
    assert ("node n0 is reserved for u1's next task of this shape (t1-1): room freed there is kept for it from the "
            "tenants behind it in line, and it needs {\"mem\":3.0} more there (first in line, mem share / weight 1)"
            ) == held.message
    (kept_off,) = at_3["u0"]
    assert kept_off.reason is WaitReason.RESERVED_FOR_OTHER and "kept for u1's task t1-1" in kept_off.message
    assert "u0" not in explained(document, "fair", params, at=6).pending


# Found by a what-if search over random scenarios (2026-11-27): at t = 28 u1 (at its fair
# share) waits behind u0, starved past its 5-s timeout. u0's next tasks need 3 cpu, more than
# the 1 cpu and 2 mem u1's task needs; freed room of that size on n1 went to u1's t5-4 (u0's
# preemption stage could not free the rest there), so "goes first to u0" was false.
BEHIND_A_STARVED_TENANT = {
    "resources": ["cpu", "mem"],
    "nodes": [{"id": "n0", "capacity": {"cpu": 8, "mem": 8}, "labels": {"zone": "b"}}, {"id": "n1", "capacity": {"cpu": 8, "mem": 7}, "labels": {"zone": "b"}}, {"id": "n2", "capacity": {"cpu": 6, "mem": 8}, "labels": {"zone": "b"}}],
    "tenants": [{"id": "g0", "weight": 3}, {"id": "g1", "weight": 1}, {"id": "u0", "weight": 1, "parent": "g0"}, {"id": "u1", "weight": 1, "parent": "g1", "ordering": "fair", "max_running": 1}],
    "tasks": [
        {"id": "t0", "job": "j0", "tenant": "u1", "submit": 12, "duration": 34, "demand": {"cpu": 1, "mem": 2}, "estimate": 68.0, "constraints": {"labels": {"zone": "a"}}},
        {"id": "t1", "job": "j1", "tenant": "u0", "submit": 23, "duration": 15, "demand": {"cpu": 3, "mem": 1}, "estimate": 15.0, "constraints": {"max_per_node": 1}},
        {"id": "t2", "job": "j2", "tenant": "u1", "submit": 11, "duration": 22, "demand": {"cpu": 3, "mem": 1}, "estimate": 22.0},
        {"id": "t3", "job": "j3", "tenant": "u1", "submit": 30, "duration": 31, "demand": {"cpu": 1, "mem": 1}, "count": 4, "constraints": {"labels": {"zone": "b"}}},
        {"id": "t4", "job": "j0", "tenant": "u1", "submit": 11, "duration": 27, "demand": {"cpu": 0, "mem": 3}, "estimate": 27.0, "constraints": {"labels": {"zone": "a"}}},
        {"id": "t5", "job": "j1", "tenant": "u1", "submit": 8, "duration": 36, "demand": {"cpu": 1, "mem": 2}, "count": 5, "estimate": 18.0},
        {"id": "t6", "job": "j2", "tenant": "u0", "submit": 5, "duration": 15, "demand": {"cpu": 0, "mem": 2}, "estimate": 7.5, "constraints": {"nodes": ["n1", "n2", "n0"]}},
        {"id": "t7", "job": "j3", "tenant": "u0", "submit": 1, "duration": 32, "demand": {"cpu": 3, "mem": 1}, "count": 6, "estimate": 32.0, "constraints": {"max_per_node": 2}},
        {"id": "t8", "job": "j0", "tenant": "u1", "submit": 0, "duration": 29, "demand": {"cpu": 3, "mem": 1}, "count": 5, "estimate": 58.0, "constraints": {"labels": {"zone": "a"}, "max_per_node": 2}}
    ]}


def test_a_tenant_behind_a_starved_one_with_larger_tasks_is_told_that_one_may_go_first():
    params = {"preemption": "on", "preemption_timeout": "5", "preemption_threshold": "1", "resource": "mem"}
    explanation = explained(BEHIND_A_STARVED_TENANT, "fair", params, at=28)
    (entry,) = [e for e in explanation.pending["u1"] if e.reason is WaitReason.BEHIND_TENANTS]
    assert entry.waits_for == "u0"
    assert "freed room may go first to u0" in entry.message
    assert "starved past its preemption timeout: room is taken back for it" in entry.message


def test_a_task_of_the_reserved_shape_is_behind_a_starved_tenant_the_reservation_does_not_hold_against():
    # Found by the oracle (test_oracle's first-in-line property), shrunk. n0 (8 cpu, 6 mem) is
    # the one node that holds <3 cpu, 3 mem>; from t = 0 it is reserved for u2's t2 of that shape.
    # u0 waits from t = 0 (t13-1, 3 mem) and is overdue at t = 5 (timeout 5 s); u2 is at or
    # above its fair share, so its reservation does not hold against u0. u1's t11 has the
    # reserved shape, not u1's reservation: room freed on n0 for it may go first to u0 (its
    # preemption stage frees the rest there), as the pass gives it. u1 was told it was first in line.
    params = {"preemption": "on", "preemption_timeout": "5", "preemption_threshold": "1", "resource": "mem"}
    explanation = explained(RESERVED_SHAPE_BEHIND_A_STARVED_TENANT, "fair", params, at=5)
    entry = next(e for e in explanation.pending["u1"] if e.id == "t11")
    assert entry.reason is WaitReason.BEHIND_TENANTS and entry.waits_for == "u0"
    assert "freed room may go first to u0" in entry.message and "starved past its preemption timeout" in entry.message
    (held,) = explanation.pending["u2"]  # the holder is told the same of u0
    assert held.reason is WaitReason.RESERVATION and held.waits_for == "u0"


def test_a_reservation_yielding_to_a_starved_tenant_tells_the_holder_it_may_lose_the_room_and_the_tenant_it_is_first():
    # Found by the behind-a-tenant oracle, shrunk. One node of 2 mem; ltrf (fixed 2-s quantum),
    # preemption after 5 s. u0's two 2-mem tasks arrive at t = 7 and n0 is reserved for them;
    # u2 (max_share 0.5) waits with 1-mem tasks, starved since 12: overdue at 17. u0 holds the
    # reservation at or above its fair share, so it does not hold against u2, and what the pass
    # gives u0 may be taken back for u2 (here it is: "reclaimed"). u2 was told the room "goes
    # first to u0"; whether it does depends on u0 staying at or above its fair share without it.
    # Room freed that fits u2's 1-mem task does not fit u0's 2-mem one, and the reservation does
    # not hold it from u2, past its timeout: u2 is first in line for it (a later trial told it
    # "goes first to u0" once "may be taken back" weighed u0's long-term usage, as ltrf does).
    params = {"preemption": "on", "preemption_timeout": "5", "preemption_threshold": "1", "reservation": "on",
              "quantum": "2", "quantum_mode": "fixed", "resource": "dominant"}
    explanation = explained(RESERVATION_YIELDS_TO_THE_TENANT_TOLD, "ltrf", params, at=17)
    (held,) = explanation.pending["u0"]
    assert held.reason is WaitReason.RESERVATION and held.waits_for == "u2" and "u2 may take it first" in held.message
    (entry,) = explanation.pending["u2"]
    assert entry.reason is WaitReason.NO_ROOM and entry.waits_for is None and "u2 is first in line" in entry.message


def test_a_task_that_would_backfill_the_reserved_node_is_not_behind_its_holder():
    # Found by the behind-a-tenant oracle, shrunk. One node of 2 mem, reservation=backfill. At
    # t = 0 u0's t1 and t2-0 (1 mem each, estimates 1 s) fill n0; u1's 2-mem t0 fits nowhere and
    # n0 is reserved for it, to start at 1 when u0's tasks end by their estimates. u0's t2-1
    # (estimate 1 s: it would end at 1) backfills room freed there; it was told the room "goes
    # first to u1".
    explanation = explained(BACKFILL_IS_NOT_BEHIND_THE_HOLDER, "fair", {"reservation": "backfill", "resource": "mem"},
                            at=0)
    (entry,) = explanation.pending["u0"]
    assert entry.reason is WaitReason.NO_ROOM and entry.waits_for is None and "u0 is first in line" in entry.message


# One node of <2 cpu, 2 mem>, reservation=backfill; u0 orders its jobs by dominant share. At 0
# big (jA, <2, 1>, estimate 5) starts and wide (jB, <1, 1>) fits nowhere: n0 is reserved for it,
# to start at 0 + 5 = 5. At 4 short (jA, 1 mem, estimate 1) and long (jB, 1 mem, estimate 2)
# arrive, short first; 1 mem is free. jB (share 0) goes before jA (share 2/2 = 1), so the pass
# tries long first: 4 + 2 = 6 > 5, it may not backfill, and its shape fails for u0: short (4 + 1
# = 5, in time) is not tried.
BACKFILL_BEHIND_A_JOB_FIRST_IN_ORDER = {
    "resources": ["cpu", "mem"],
    "nodes": [{"id": "n0", "capacity": {"cpu": 2, "mem": 2}}],
    "tenants": [{"id": "u0", "ordering": "drf"}],
    "tasks": [
        {"id": "big", "job": "jA", "tenant": "u0", "submit": 0, "duration": 5, "demand": {"cpu": 2, "mem": 1},
         "estimate": 5},
        {"id": "wide", "job": "jB", "tenant": "u0", "submit": 0, "duration": 1, "demand": {"cpu": 1, "mem": 1},
         "estimate": 1},
        {"id": "short", "job": "jA", "tenant": "u0", "submit": 4, "duration": 1, "demand": {"cpu": 0, "mem": 1},
         "estimate": 1},
        {"id": "long", "job": "jB", "tenant": "u0", "submit": 4, "duration": 2, "demand": {"cpu": 0, "mem": 1},
         "estimate": 2}]}


def test_a_shape_kept_off_backfill_by_the_first_of_it_in_job_order_says_so_for_each_of_its_tasks():
    # Found by the every-invariant oracle (explain said "the next pass backfills it" of tasks the
    # pass left: it took the shape's first task in arrival order, the pass its jobs' order).
    explanation = explained(BACKFILL_BEHIND_A_JOB_FIRST_IN_ORDER, "drf", {"reservation": "backfill"}, at=4)
    said = {entry.id: entry for entry in explanation.pending["u0"]}
    for task in ("long", "short"):
        assert said[task].reason is WaitReason.RESERVED_FOR_OTHER
        assert ("it cannot backfill there: long, the first of u0's tasks of this shape in its queue's order, has an "
                "estimate (2 s) that has it end at 6, after 5") in said[task].message


def test_a_starved_tenant_behind_a_tenant_at_its_fair_share_is_told_the_room_may_be_taken_back_for_it():
    # Found by the behind-a-tenant oracle, shrunk. One node of 3 mem; ltrf (fixed 2-s quantum),
    # preemption after 5 s. At t = 21 u0 (weight 3), starved since 1, waits with a 2-mem task
    # behind u2 in the order (accumulated usage / weight 13.33 against 15.56), and u2 holds n1's
    # reservation at or above its fair share: what the pass gives u2 is taken back for u0 here
    # ("reclaimed"). u0 was told the room "goes first to u2". Only "may": a tenant at or above
    # its fair share is a victim only while what is taken keeps it there (a random run found a
    # tenant so told it was first in line while the room stayed with the one ahead).
    params = {"preemption": "on", "preemption_timeout": "5", "preemption_threshold": "1", "reservation": "on",
              "quantum": "2", "quantum_mode": "fixed", "resource": "dominant"}
    explanation = explained(A_VICTIM_AHEAD, "ltrf", params, at=21)
    (entry,) = explanation.pending["u0"]
    assert entry.reason is WaitReason.BEHIND_TENANTS and entry.waits_for == "u2"
    assert "freed room may go first to u2" in entry.message and "may be taken back for u0" in entry.message
    (held,) = explanation.pending["u2"]
    assert held.reason is WaitReason.RESERVATION and held.waits_for == "u0"


def test_a_reservation_whose_holder_may_not_start_keeps_no_room_from_a_task_of_its_shape():
    # Found by the behind-a-tenant oracle, shrunk. n1 (3 mem) is reserved for u0's t2 (3 mem,
    # job j2), but u0 may run one job at a time (max_running 1) and runs j3 at t = 1 (on n2, as
    # n0 is lost then): j2 waits.
    # Room freed on n1 goes to u1's t17-1, of the same shape, in its turn; u1 was told it "goes
    # first to u0".
    params = {"preemption": "on", "preemption_timeout": "5", "preemption_threshold": "1", "resource": "mem"}
    explanation = explained(A_HOLDER_HELD_BY_MAX_RUNNING, "fair", params, at=1)
    (entry,) = explanation.pending["u1"]
    assert entry.reason is WaitReason.NO_ROOM and entry.waits_for is None and "u1 is first in line" in entry.message
    assert next(e for e in explanation.pending["u0"] if e.id == "t2").reason is WaitReason.MAX_RUNNING


def test_simulate_explain_at_writes_the_apis_documents(tmp_path, capsys):
    path = tmp_path / "s.json"
    path.write_text(json.dumps(EVERY_REASON))
    out = tmp_path / "run"
    assert main(["simulate", "--scenario", str(path), "--policy", "drf", "--explain-at", "5", "--no-baseline",
                 "--no-plots", "--out", str(out)]) == 0
    tenants = json.loads((out / "explain" / "tenants.json").read_text())
    pending = json.loads((out / "explain" / "pending.json").read_text())
    assert tenants["api"] == pending["api"] == "v1" and tenants["time"] == 1.0
    assert [t["tenant"] for t in tenants["tenants"]] == ["D", "E", "B", "C", "A"]
    assert pending["entries_total"] == 6 and {e["reason"] for e in pending["entries"]} == {
        "unschedulable", "stage_not_released", "max_share", "constraints", "behind_tenants"}


# The worker: the explanation is written with a commit, read back through the same documents.

def message(kind: str, offset: int, body: dict) -> Incoming:
    topic = {"submitted": "tasks.submitted", "completed": "tasks.completed", "heartbeat": "nodes.heartbeats"}[kind]
    return Incoming(kind, json.dumps(body).encode(), topic, 0, offset, 0.0, None)


async def published(topic, key, value):
    return None


def worker_with(store: MemoryStore, **options) -> Processor:
    return Processor(store, published, worker_config("drf", resources=("cpu",), **options))


def big_request_cluster(store: MemoryStore, **options) -> Processor:
    """One node of 4 cpu; A submits a request of 100,000 unit tasks, B one task of 2 cpu."""
    processor = worker_with(store, **options)

    async def scenario():
        await processor.handle([
            message("heartbeat", 0, {"cluster": "c1", "node": "n1", "time": 0, "capacity": {"cpu": 4}}),
            message("submitted", 0, {"cluster": "c1", "task": "maps", "job": "j1", "tenant": "A", "time": 0,
                                     "demand": {"cpu": 1}, "count": 100_000}),
            message("submitted", 1, {"cluster": "c1", "task": "b1", "job": "j2", "tenant": "B", "time": 1,
                                     "demand": {"cpu": 2}}),
        ])

    asyncio.run(scenario())
    return processor


def test_the_worker_writes_the_explanation_and_the_documents_read_it():
    store = MemoryStore()
    big_request_cluster(store, explain_interval=0.0)
    visibility = Visibility(store.view_reader())
    assert visibility.clusters()["clusters"] == [{"cluster": "c1", "time": 1.0, "policy": "drf", "tenants": 2,
                                                  "running": 4, "pending": 100_000 - 4 + 1}]
    tenants = visibility.tenants("c1")["tenants"]
    # B holds nothing and waits first in DRF's order; A holds 4 of 4 cpu.
    assert [(t["tenant"], t["rank"], t["running"]) for t in tenants] == [("B", 1, 0), ("A", 2, 4)]
    page = visibility.pending("c1", size=1)
    assert (page["entries_total"], page["tasks_total"], len(page["entries"])) == (2, 99_997, 1)
    # B's 2-cpu task fits no node's free room: first in line, node n1 is reserved for it.
    assert page["entries"][0]["id"] == "b1" and page["entries"][0]["reason"] == "reservation"
    second = visibility.pending("c1", size=1, page=2)["entries"][0]
    assert (second["id"], second["first"], second["tasks"], second["reason"]) == ("maps", "maps-4", 99_996,
                                                                                  "behind_tenants")
    # One task deep in the request: found by arithmetic, not a walk over 100,000 entries.
    found = visibility.pending("c1", task="maps-77777")
    assert found["position"] == 77_777 - 4 and found["entry"]["id"] == "maps"
    assert visibility.history("c1")["samples"][-1]["tenants"]["A"]["share"] == 1.0


def test_a_quiet_cluster_shows_its_last_state_after_the_interval():
    store = MemoryStore()
    processor = big_request_cluster(store, explain_interval=3600.0)  # the first commit writes it
    assert Visibility(store.view_reader()).tenants("c1")["time"] == 1.0

    async def later():
        await processor.handle([message("completed", 0, {"cluster": "c1", "task": "maps-0", "time": 2,
                                                          "status": "succeeded"})])
        written_then = Visibility(store.view_reader()).tenants("c1")["time"]
        processor.stepping.explain_interval = 0.0  # the interval has passed
        flushed = await processor.flush_explanations()
        return written_then, flushed

    written_then, flushed = asyncio.run(later())
    assert written_then == 1.0 and flushed == 1  # within the interval: not yet; then by the timer
    assert Visibility(store.view_reader()).tenants("c1")["time"] == 2.0


def http_get(visibility: Visibility, path: str, query: dict[str, list[str]]) -> tuple[int, dict]:
    """(status, JSON body) of a GET of the worker's HTTP endpoint (``http_app``), served on
    loopback over ``visibility``."""
    from aiohttp.test_utils import TestClient, TestServer
    from prometheus_client import CollectorRegistry

    async def get():
        async with TestClient(TestServer(http_app(CollectorRegistry(), visibility))) as client:
            response = await client.get(path, params=[(k, v) for k, values in query.items() for v in values])
            return response.status, await response.json()

    return asyncio.run(get())


@pytest.mark.parametrize("path, query, status, error", [
    pytest.param("/v1/clusters/c9/tenants", {}, 404, "cluster c9: unknown", id="an unknown cluster is 404"),
    pytest.param("/v1/clusters/c1/pending", {"tenant": ["Z"]}, 404, "tenant Z: not a tenant",
                 id="an unknown tenant is 404"),
    pytest.param("/v1/clusters/c1/pending", {"task": ["nope"]}, 404, "task nope: not pending",
                 id="a task that is not pending is 404"),
    pytest.param("/v1/clusters/c1/pending", {"size": ["5000"]}, 400, "size 5000: must be 1 to 1000",
                 id="a page too large is 400"),
    pytest.param("/v1/clusters/c1/pending", {"page": ["x"]}, 400, "whole numbers", id="a page that is no number"),
    pytest.param("/v2/clusters", {}, 404, "no such resource", id="another version is 404"),
])
def test_the_api_answers_a_bad_query_in_one_line_with_its_status(path, query, status, error):
    store = MemoryStore()
    big_request_cluster(store, explain_interval=0.0)
    code, document = http_get(Visibility(store.view_reader()), path, query)
    assert code == status and error in document["error"] and "\n" not in document["error"]


def test_a_store_that_cannot_be_read_is_503_in_one_line_and_the_endpoint_keeps_serving():
    class Down:  # a ViewReader whose Redis refuses connections
        def clusters(self, *args):
            raise ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")

        field = fields = recent = history = clusters

    visibility = Visibility(Down())
    for path in ("/v1/clusters", "/v1/clusters/c1/tenants", "/v1/clusters/c1/pending"):
        code, document = http_get(visibility, path, {})
        assert code == 503 and document["error"].startswith("the state store cannot be read: Error 111"), path


def test_a_tenant_with_nothing_pending_has_an_empty_page():
    status = {"time": 0.0, "policy": "drf", "order": "x", "tenants": [
        {"tenant": "A", "rank": None, "running": 1, "pending": 0}]}
    document = pending_document("c", status, {}, tenant="A")
    assert document["entries"] == [] and document["tasks_total"] == 0
    with pytest.raises(DocumentError):
        pending_document("c", status, {}, page=0)


def test_explain_changes_nothing_in_the_engine():
    simulator = Simulator(parse_scenario(EVERY_REASON), "drf", {}, explain_at=5)
    simulator.run()
    engine = simulator.engine
    before = (engine.accounting.allocation.copy(), {t: q.count for t, q in engine.pending.items()}, engine.time)
    explain(engine)
    explain(engine)
    after = (engine.accounting.allocation, {t: q.count for t, q in engine.pending.items()}, engine.time)
    assert (before[0] == after[0]).all() and before[1:] == after[1:]


@pytest.mark.slow
def test_a_tenant_of_100000_single_tasks_is_listed_up_to_the_cap_and_explained_whole_by_its_groups():
    store = MemoryStore()
    processor = worker_with(store, explain_interval=0.0, explain_max_entries=100)

    async def scenario():
        await processor.handle(
            [message("heartbeat", 0, {"cluster": "c1", "node": "n1", "time": 0, "capacity": {"cpu": 4}})]
            + [message("submitted", k, {"cluster": "c1", "task": f"t{k}", "job": "j", "tenant": "A", "time": 0,
                                        "demand": {"cpu": 1}}) for k in range(100_000)])

    asyncio.run(scenario())
    visibility = Visibility(store.view_reader())
    page = visibility.pending("c1", tenant="A", size=50, page=2)
    # 4 run on the node; 99,996 wait. The first 100 entries are listed (t4 ... t103), two pages
    # of 50; the group covers all 99,996 with one reason.
    assert (page["entries_total"], page["entries_listed"], page["tasks_total"]) == (99_996, 100, 99_996)
    assert [e["id"] for e in page["entries"]][:2] == ["t54", "t55"] and page["entries"][0]["position"] == 50
    (group,) = page["groups"]
    # A is first in line and its next task (t4) has n1 reserved: the room that frees there.
    assert (group["tasks"], group["reason"]) == (99_996, "reservation") and "next task of this shape (t4)" in group[
        "message"]
    with pytest.raises(DocumentError, match="beyond the entries kept per tenant"):
        visibility.pending("c1", task="t50000")


# ------------------------------------------------------------------ the pending listing an operator reads
# (issue 33: after a preemption, 25 alike entries of one tenant hid the starved tenant's)


def preempted_listing() -> tuple[dict, dict]:
    """One node of 50 cpu. A runs a request of 50 unit tasks from t = 0; B asks for 50 at t = 1
    and is starved (fair share 25, holding 0); after the 1-s timeout, at t = 2, preemption takes
    25 of A's tasks back for B. At t = 5 A's 25 wait again as 25 single tasks (a-25 ... a-49),
    B's last 25 as one request. Both hold 25/50: dominant share / weight 1 each, A first by name."""
    document = {"resources": ["cpu"], "nodes": [{"id": "n1", "capacity": {"cpu": 50}}],
                "tenants": [{"id": "A"}, {"id": "B"}],
                "tasks": [{"id": "a", "job": "ja", "tenant": "A", "submit": 0, "duration": 100, "demand": {"cpu": 1},
                           "count": 50},
                          {"id": "b", "job": "jb", "tenant": "B", "submit": 1, "duration": 100, "demand": {"cpu": 1},
                           "count": 50}]}
    explanation = explained(document, "drf", {"preemption": "on", "preemption_timeout": "1"}, at=5)
    pending = explanation.pending_json()
    return explanation.status_json(), {t: tenant_pending(e, pending["groups"].get(t, []))
                                       for t, e in pending["pending"].items()}


def test_alike_entries_are_one_row_with_a_count_so_the_waiting_tenant_is_on_the_first_page():
    status, stored = preempted_listing()
    flat = pending_document("c", status, stored, size=10)
    assert (flat["entries_total"], flat["tasks_total"]) == (26, 50)
    assert {e["tenant"] for e in flat["entries"]} == {"A"}  # page 1: ten of A's 25 alike entries, no B
    grouped = pending_document("c", status, stored, size=10, group=True)
    rows = [(e["tenant"], e["tenant_rank"], e["id"], e["last"], e["entries"], e["tasks"], e["position"], e["reason"])
            for e in grouped["entries"]]
    assert rows == [("A", 1, "a-25", "a-49", 25, 25, 0, "reservation"),
                    ("B", 2, "b", "b", 1, 25, 0, "behind_tenants")]
    assert (grouped["entries_total"], grouped["entries_listed"], grouped["tasks_total"]) == (26, 2, 50)


def test_entries_alike_but_not_adjacent_in_their_line_stay_apart():
    # Two runs of one shape with another between them: grouping never reorders a tenant's line.
    entry = {"tenant": "A", "job": "j", "demand": {"cpu": 1}, "reason": "no_room", "message": "m", "waits_for": None,
             "gap": None, "tasks": 1}
    entries = [{**entry, "id": "t0", "position": 0}, {**entry, "id": "t1", "position": 1},
               {**entry, "id": "big", "position": 2, "demand": {"cpu": 2}}, {**entry, "id": "t3", "position": 3}]
    assert [(r["id"], r["last"], r["entries"]) for r in grouped_entries(entries)] == [
        ("t0", "t1", 2), ("big", "big", 1), ("t3", "t3", 1)]


@pytest.mark.parametrize("reason, listed", [
    pytest.param("behind_tenants", [("B", "b")], id="the tenant behind another"),
    pytest.param("reservation", [("A", "a-25")], id="the tenant a node is reserved for"),
    pytest.param("no_room", [], id="a reason nothing waits for: an empty page"),
])
def test_pending_filtered_by_reason(reason, listed):
    status, stored = preempted_listing()
    document = pending_document("c", status, stored, reason=reason, group=True)
    assert [(e["tenant"], e["id"]) for e in document["entries"]] == listed
    assert {g["reason"] for g in document["groups"]} <= {reason}
    assert document["tasks_total"] == 25 * len(listed)


def test_an_unknown_reason_is_one_line_naming_the_reasons():
    status, stored = preempted_listing()
    with pytest.raises(DocumentError, match="reason full: not a wait reason .reasons: unschedulable, "):
        pending_document("c", status, stored, reason="full")


def test_the_documents_know_every_wait_reason_the_engine_gives():
    assert WAIT_REASONS == tuple(reason.value for reason in WaitReason)


def test_the_api_groups_and_filters_on_request():
    store = MemoryStore()
    big_request_cluster(store, explain_interval=0.0)
    visibility = Visibility(store.view_reader())
    code, document = http_get(visibility, "/v1/clusters/c1/pending", {"reason": ["behind_tenants"], "group": ["true"]})
    assert code == 200 and document["grouped"] and [e["id"] for e in document["entries"]] == ["maps"]
    code, document = http_get(visibility, "/v1/clusters/c1/pending", {"group": ["maybe"]})
    assert code == 400 and "group maybe: true or false" in document["error"]


# ------------------------------------------------------------------ the queue tree and recent events


def test_the_queue_tree_shows_weights_limits_shares_and_what_holds_each_queue():
    # 8 cpu. Queue g (weight 2) holds A and B; C (weight 1, max_share 0.25) at the root. Each
    # asks for 4 unit tasks. The fair share divides the root 2:1, g 2/3 and C 1/3, but C is
    # capped at 0.25, so g gets 0.75: A and B 0.375 each, 3 cpu. C runs 2 and 2 wait at its cap.
    document = {"resources": ["cpu"], "nodes": [{"id": "n1", "capacity": {"cpu": 8}}],
                "tenants": [{"id": "g", "weight": 2}, {"id": "A", "parent": "g"}, {"id": "B", "parent": "g"},
                            {"id": "C", "max_share": 0.25}],
                "tasks": [{"id": t.lower(), "job": f"j{t}", "tenant": t, "submit": 0, "duration": 100,
                           "demand": {"cpu": 1}, "count": 4} for t in "ABC"]}
    explanation = explained(document, "drf", at=5)
    pending = explanation.pending_json()
    stored = {t: tenant_pending(e, pending["groups"].get(t, [])) for t, e in pending["pending"].items()}
    rows = {q["queue"]: q for q in queues_document("c", explanation.status_json(), stored)["queues"]}
    assert list(rows) == ["C", "g", "A", "B"]  # parents first, children by name
    assert [(q["depth"], q["leaf"], q["weight"]) for q in rows.values()] == [(0, True, 1.0), (0, False, 2.0),
                                                                             (1, True, 1.0), (1, True, 1.0)]
    assert rows["C"]["limits"] == {"max_share": 0.25} and rows["g"]["limits"] == {}
    assert [(q["fair_share"], q["share"], q["running"], q["pending"]) for q in rows.values()] == [
        (0.25, 0.25, 2, 2), (0.75, 0.75, 6, 2), (0.375, 0.375, 3, 1), (0.375, 0.375, 3, 1)]
    # What holds them: C its max_share; g's two waiting tasks, one per leaf, each its reason.
    assert (rows["C"]["waiting"], rows["C"]["held_by"]) == ({"max_share": 2}, "max_share")
    assert rows["g"]["waiting"] == {"behind_tenants": 1, "reservation": 1}
    assert rows["A"]["waiting"] == {"reservation": 1} and rows["B"]["waiting"] == {"behind_tenants": 1}


def test_status_shows_each_tenants_limits_and_since_when_it_is_starved():
    # 4 cpu; A runs 4 unit tasks from 0; B (min_share 0.5, max_running 3) asks for 2 at 1 and
    # is starved from 1 (preemption on, timeout 100: nothing taken back by 5). C has max_share
    # 0.25 and nothing to run.
    from fairstream.cli import status_table
    from fairstream.wire.visibility import tenants_document

    document = {"resources": ["cpu"], "nodes": [{"id": "n1", "capacity": {"cpu": 4}}],
                "tenants": [{"id": "A"}, {"id": "B", "min_share": 0.5, "max_running": 3},
                            {"id": "C", "max_share": 0.25, "max_resources": {"cpu": 2}}],
                "tasks": [{"id": "a", "job": "ja", "tenant": "A", "submit": 0, "duration": 100, "demand": {"cpu": 1},
                           "count": 4},
                          {"id": "b", "job": "jb", "tenant": "B", "submit": 1, "duration": 100, "demand": {"cpu": 1},
                           "count": 2}]}
    explanation = explained(document, "drf", at=5, params={"preemption": "on", "preemption_timeout": "100"})
    tenants = {t["tenant"]: t for t in tenants_document("c", explanation.status_json())["tenants"]}
    assert tenants["A"]["limits"] == {} and tenants["B"]["limits"] == {"min_share": 0.5, "max_running": 3}
    assert tenants["C"]["limits"] == {"max_share": 0.25, "max_resources": {"cpu": 2}}
    header, *rows = status_table(tenants_document("c", explanation.status_json())).splitlines()[1:]
    assert header.split()[-4:] == ["quantum", "limits", "starved", "since"]
    last_two = {row.split()[0]: re.split(r"\s{2,}", row.rstrip())[-2:] for row in rows}  # (columns: 2+ spaces apart)
    assert last_two == {"B": ["min_share 0.5, max_running 3", "1"],
                        "C": ["max_share 0.25, max_resources {cpu: 2}", "-"], "A": ["-", "-"]}


def test_the_worker_keeps_recent_preemptions_and_configuration_changes_for_the_page():
    # The preemption of tests/worker/test_operations.py's metrics test, seen as the page lists it: newest
    # first by event time (the last recorded first among equal times), a rejected configuration
    # with its reason.
    store = MemoryStore()
    config = worker_config("drf", params={"preemption": "on", "preemption_timeout": "1"}, resources=("cpu",),
                           explain_interval=0.0)
    processor = Processor(store, published, config)

    def config_message(offset, body):
        return Incoming("config", json.dumps(body).encode(), Topics().config, 0, offset, 0.0, None)

    async def scenario():
        await processor.handle([message("heartbeat", 0, {"cluster": "c1", "node": "n1", "time": 0, "capacity": {"cpu": 4}})]
                               + [message("submitted", k, {"cluster": "c1", "task": f"a{k}", "job": "j", "tenant": "A",
                                                           "time": k // 2, "demand": {"cpu": 1}}) for k in range(4)])
        await processor.handle([message("submitted", 4 + k, {"cluster": "c1", "task": f"b{k}", "job": "k", "tenant": "B",
                                                             "time": 2, "demand": {"cpu": 1}}) for k in range(4)])
        await processor.handle([message("heartbeat", 1, {"cluster": "c1", "node": "n1", "time": 5, "capacity": {"cpu": 4}})])
        await processor.handle([config_message(0, {"cluster": "c1", "time": 6, "tenants": [{"id": "A"}, {"id": "B", "weight": 2}]}),
                                config_message(1, {"cluster": "c1", "time": 7, "tenants": [{"id": "A", "ordering": "lifo"}]})])
        # Sent without a time, a rejected tree is shown at the cluster's clock (it showed null).
        await processor.handle([config_message(2, {"cluster": "c1", "tenants": [{"id": "A", "ordering": "lifo"}]})])

    asyncio.run(scenario())
    events = Visibility(store.view_reader()).events("c1")["events"]
    assert [(e["kind"], e["time"]) for e in events] == [("config_rejected", 7), ("config_rejected", 6),
                                                        ("config_accepted", 6), ("preempt", 5.0), ("preempt", 5.0)]
    del events[1]  # (the one sent without a time, at the clock: 6)
    assert "tenants.0.ordering" in events[0]["message"] and "B (weight 2)" in events[1]["message"]
    assert sorted((e["task"], e["tenant"], e["started"]) for e in events[2:]) == [("a2", "A", 1.0), ("a3", "A", 1.0)]
    # Per tenant since the cluster's start: A lost a2 and a3, which ran from 1 to 5: 2 x 4 = 8 task-seconds.
    assert Visibility(store.view_reader()).events("c1")["preempted"] == [{"tenant": "A", "tasks": 2, "work_lost": 8.0}]


def test_work_lost_counts_from_a_task_started_at_time_zero():
    # 2 cpu; A runs 2 tasks from 0; B asks for one at 1, starved past the 1 s timeout: the
    # heartbeat at 3 preempts A's youngest, which ran 3 s (from 0: a start of 0 is a start).
    store = MemoryStore()
    processor = Processor(store, published, worker_config("drf", params={"preemption": "on", "preemption_timeout": "1"},
                                                          resources=("cpu",), explain_interval=0.0))

    async def scenario():
        await processor.handle([message("heartbeat", 0, {"cluster": "c1", "node": "n1", "time": 0, "capacity": {"cpu": 2}})]
                               + [message("submitted", k, {"cluster": "c1", "task": f"a{k}", "job": "j", "tenant": "A",
                                                           "time": 0, "demand": {"cpu": 1}}) for k in range(2)])
        await processor.handle([message("submitted", 2, {"cluster": "c1", "task": "b", "job": "k", "tenant": "B",
                                                         "time": 1, "demand": {"cpu": 1}})])
        await processor.handle([message("heartbeat", 1, {"cluster": "c1", "node": "n1", "time": 3, "capacity": {"cpu": 2}})])

    asyncio.run(scenario())
    assert Visibility(store.view_reader()).events("c1")["preempted"] == [{"tenant": "A", "tasks": 1, "work_lost": 3.0}]


def test_the_page_opens_on_the_busiest_cluster_unless_the_address_names_one():
    # c1 runs 4 and has 99,997 waiting; a0, first by name, has a node and nothing else.
    store = MemoryStore()
    processor = big_request_cluster(store, explain_interval=0.0)
    asyncio.run(processor.handle([message("heartbeat", 1, {"cluster": "a0", "node": "m1", "time": 0,
                                                           "capacity": {"cpu": 4}})]))
    visibility = Visibility(store.view_reader())
    assert [c["cluster"] for c in visibility.clusters()["clusters"]] == ["a0", "c1"]
    assert visibility.page_data(None)["cluster"] == "c1"
    assert visibility.page_data("a0")["cluster"] == "a0" and visibility.page_data("nope")["cluster"] == "c1"


def test_the_nodes_say_what_they_hold_and_for_whom_each_is_reserved():
    # B's 2-cpu task fits no node's free room (A holds all 4 cpu of n1): n1 is reserved for it.
    store = MemoryStore()
    big_request_cluster(store, explain_interval=0.0)
    nodes = Visibility(store.view_reader()).nodes("c1")
    [n1] = nodes["nodes"]
    assert (n1["node"], n1["alive"], n1["capacity"], n1["used"], n1["busy"]) == ("n1", True, {"cpu": 4.0},
                                                                               {"cpu": 4.0}, 1.0)
    assert n1["reserved"] == nodes["reservation"] == {"tenant": "B", "task": "b1", "gang": False, "nodes": ["n1"],
                                                      "since": None, "until": None}
    assert nodes["nodes_total"] == 1


@pytest.mark.parametrize("samples, expected", [
    ([(0, {}), (5, {"below": True}), (10, {"below": True}), (15, {})],
     {"below_since": None, "time_to_fair_share": 10, "reached_at": 15}),
    ([(0, {}), (5, {"below": True}), (10, {"below": True})],
     {"below_since": 5, "time_to_fair_share": None, "reached_at": None}),
    ([(0, {"below": True}), (5, {}), (10, {"below": True})],
     {"below_since": 10, "time_to_fair_share": 5, "reached_at": 5}),
    ([(0, {"below": True}), (5, {"idle": True})],
     {"below_since": None, "time_to_fair_share": None, "reached_at": None}),
], ids=["below from 5, at its fair share at 15: 10 s to fair share",
        "below from 5 still: below since 5",
        "a stretch reached, then below again: both shown",
        "a stretch that ended with nothing waiting reached nothing"])
def test_time_to_fair_share_is_the_last_stretch_below_it_in_the_history(samples, expected):
    from fairstream.wire.visibility import fair_share_times

    history = [{"time": at, "tenants": {"A": {"share": 0.0, "accumulated": 0.0, **flags}}} for at, flags in samples]
    assert fair_share_times(history)["A"] == expected


def test_below_fair_share_counts_whole_tasks_as_the_simulator_does():
    # 256 GPUs over three tenants of 1-GPU tasks, each asking for more: 86, 86, 84 is fair
    # (85.33 each cannot be: no task of C's could come to it without taking A or B below theirs);
    # 87, 86, 83 is not: A is over its share by more than one of C's tasks (1/256).
    from fairstream.wire.visibility import below_fair_share

    def status(*held):
        return {"tenants": [{"tenant": name, "share": {"gpu": n / 256}, "fair_share": 1 / 3, "running": n,
                             "pending": 10} for name, n in zip("ABC", held)]}

    assert below_fair_share(status(86, 86, 84)) == set()
    assert below_fair_share(status(87, 86, 83)) == {"C"}


def test_the_page_comes_with_its_data_so_the_first_paint_shows_it():
    from fairstream.streams.api import INITIAL, with_initial_data

    store = MemoryStore()
    big_request_cluster(store, explain_interval=0.0)
    page = (Path(__file__).resolve().parents[2] / "streams" / "web" / "index.html").read_bytes()
    assert INITIAL in page
    served = with_initial_data(page, Visibility(store.view_reader()), None)
    data = json.loads(served.split(b'<script id="initial" type="application/json">')[1].split(b"</script>")[0])
    assert data["cluster"] == "c1" and [t["tenant"] for t in data["tenants"]["tenants"]] == ["B", "A"]
    assert [q["queue"] for q in data["queues"]["queues"]] == ["A", "B"] and data["pending"]["grouped"]
    assert {r["reason"]: r["tasks"] for r in data["pending"]["by_reason"]} == {"behind_tenants": 99_996, "reservation": 1}


def test_nothing_in_the_data_can_end_the_pages_script_element():
    from fairstream.streams.api import INITIAL, with_initial_data

    class Named:  # a tenant named to close the element and run a script of its own
        def page_data(self, cluster):
            return {"clusters": {"clusters": []}, "cluster": None, "name": "</script><script>alert(1)</script>"}

    served = with_initial_data(INITIAL, Named(), None)
    assert served.count(b"</script>") == 1 and b"\\u003c/script>" in served


# ------------------------------------------------------------------ expected starts (squeue --start)


from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from test_properties import scenarios  # noqa: E402


def first_starts(document: dict, policy: str, params: dict | None = None) -> tuple[dict, dict[str, float]]:
    """The explanation at t = 0 and when each task first started in the run."""
    decisions = []
    simulator = Simulator(parse_scenario(document).with_exact_estimates(), policy, params or {}, explain_at=0,
                          on_decision=decisions.append)
    simulator.run()
    started: dict[str, float] = {}
    for d in decisions:
        if d.kind.value == "place":
            for task in d.task_ids:
                started.setdefault(task, d.time)
    return simulator.explanation, started


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(document=scenarios(), policy=st.sampled_from(["drf", "fair", "ltrf", "fifo", "hltrf", "tsf"]))
@pytest.mark.slow
def test_with_exact_estimates_and_nothing_more_arriving_the_expected_start_is_the_start(document, policy):
    # Everything is submitted at t = 0: the forecast's one assumption left (tasks end at their
    # estimates) holds, so it must name the instant each waiting task really starts.
    document = {**document, "tasks": [{**t, "submit": 0} for t in document["tasks"]]}
    explanation, started = first_starts(document, policy)
    for entries in explanation.pending.values():
        for entry in entries:
            if entry.reason.value != "unschedulable":
                assert entry.expected_start == started.get(entry.first), (entry.first, entry.reason)


def test_expected_start_is_unknown_without_estimates_and_says_so_in_the_listing():
    # One node of 2 cpu, A's two 2-cpu tasks of 10 s: the second waits. Without an estimate
    # for the first, when it ends is unknown; with one (10 s), the second starts at 10.
    document = {"resources": ["cpu"], "nodes": [{"id": "n1", "capacity": {"cpu": 2}}], "tenants": [{"id": "A"}],
                "tasks": [{"id": f"t{k}", "job": "j", "tenant": "A", "submit": 0, "duration": 10, "demand": {"cpu": 2}}
                          for k in range(2)]}
    (entry,) = explained(document, "drf", at=0).pending["A"]
    assert entry.expected_start is None
    explanation, _ = first_starts(document, "drf")
    (entry,) = explanation.pending["A"]
    assert (entry.first, entry.expected_start) == ("t1", 10.0)


def test_the_worker_lists_expected_starts_from_the_estimates_it_was_sent():
    # One node of 2 cpu: t0 (2 cpu, expected to run 30 s) starts at 0; t1 and t2 wait. t1
    # starts when t0 ends, at 30; t2, expected to run 5 s... after t1, which has no estimate:
    # unknown.
    store = MemoryStore()
    processor = worker_with(store, explain_interval=0.0)

    def task(name, estimate=None):
        body = {"cluster": "c1", "task": name, "job": "j", "tenant": "A", "time": 0, "demand": {"cpu": 2}}
        return body if estimate is None else {**body, "estimate": estimate}

    asyncio.run(processor.handle([message("heartbeat", 0, {"cluster": "c1", "node": "n1", "time": 0, "capacity": {"cpu": 2}}),
                                  message("submitted", 0, task("t0", 30)), message("submitted", 1, task("t1")),
                                  message("submitted", 2, task("t2", 5))]))
    entries = Visibility(store.view_reader()).pending("c1")["entries"]
    assert [(e["id"], e["expected_start"]) for e in entries] == [("t1", 30.0), ("t2", None)]


@pytest.mark.parametrize("steps, tasks, expected", [
    pytest.param(2_000, 100, {"t1": 10.0, "t2": 20.0}, id="far enough: both starts"),
    pytest.param(1, 100, {"t1": 10.0}, id="one step ahead: the second start is unknown"),
    pytest.param(2_000, 2, {}, id="more tasks than it copies: every start unknown"),
])
def test_how_far_the_forecast_looks(steps, tasks, expected):
    from fairstream.core.forecast import expected_starts
    from fairstream.core.model import TaskSubmitted

    from builders import engine, node, tree

    # Three 2-cpu tasks expected to run 10 s each on 2 cpu: t1 starts at 10, t2 at 20.
    e = engine(tree("A"), "drf", resources=("cpu",))
    e.step(0, [node("n1", cpu=2)] + [TaskSubmitted(0, f"t{k}", "j", "A", {"cpu": 2}, None, None, 10.0) for k in range(3)])
    assert expected_starts(e, ["t1", "t2"], steps, tasks) == expected
