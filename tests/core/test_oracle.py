"""Every feature on at once, held to a slow reference (tests/core/oracle.py): random trees with
weights, min_share, max_share, max_resources, max_running and leaf orderings, requests,
constraints, preemption, half-life, a live tenants config and a lost node, for every policy
that accepts them. After every pass:

- the fair share the engine uses is the reference's;
- no node is over-committed and no placement breaks its constraints (max_per_node included);
- nothing preempted takes its tenant below its fair share (so never below its min_share);
- (fair, drf) no tenant stays starved past its timeout while some node could be freed for one
  of its tasks by tenants that would stay at or above their fair share;
- every pending task has exactly one wait reason and none waits while a node has room for it
  unless a limit, its constraints or another task's reservation hold it;
- the room of a reserved node goes to the reserved task's shape only, or to a task that backfills
  it: expected to end before the reserved task can start, a start the backfill does not move;
- a tenant said to be first in line gets the next room that fits its task;
- the simulator and a worker replaying its recorded input take the same decisions.
- hltrf on a tree of one level (its flat pass) decides as its walk down the tree.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from fairstream.core import engine as engine_module
from fairstream.core import transitions
from fairstream.core.engine import Engine
from fairstream.core.fairness import fair_shares
from fairstream.core.model import DecisionKind, TenantSpec
from fairstream.core.tenants import TenantTree
from fairstream.policies import get as get_policy
from fairstream.policies import hltrf as hltrf_module
from fairstream.sim.scenario import parse_scenario
from fairstream.sim.simulator import Simulator
from fairstream.state.engine_snapshot import encode_engine
from fairstream.wire.log import log_step, replay

import oracle
from test_properties import (
    decide_alike_with_passes_over_candidates_and_over_all,
    every_pending_task_has_one_reason_and_none_fits_now,
    no_overcommit_and_constraints_hold,
    placements_keep_max_per_node,
    runs_its_most,
)

pytestmark = pytest.mark.slow  # (long properties: the fast part, `scripts/test.sh --fast`, leaves them out)

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# Policies that preempt toward the fair share; the others still compose every other feature.
PREEMPTING = ["fair", "drf", "ltrf", "hltrf"]


@st.composite
def limits(draw, resources=("cpu", "mem")) -> dict:
    out = {}
    if draw(st.integers(0, 3)) == 0:
        out["min_share"] = draw(st.sampled_from([0.1, 0.3, 0.6]))
    if draw(st.integers(0, 3)) == 0:
        out["max_share"] = max(out.get("min_share", 0.0), draw(st.sampled_from([0.25, 0.5, 0.75])))
    if draw(st.integers(0, 4)) == 0:
        out["max_resources"] = {draw(st.sampled_from(resources)): draw(st.integers(1, 8))}
    return out


@st.composite
def trees(draw) -> list[dict]:
    """Two levels at most: queues g0, g1 with leaves, or leaves under the root."""
    nested = draw(st.booleans())
    leaves = [f"u{i}" for i in range(draw(st.integers(1, 4)))]
    tenants = []
    if nested:
        for q in ("g0", "g1"):
            tenants.append({"id": q, "weight": draw(st.integers(1, 3)), **draw(limits())})
    for i, leaf in enumerate(leaves):
        spec = {"id": leaf, "weight": draw(st.integers(1, 3)), **draw(limits())}
        if nested:
            spec["parent"] = f"g{i % 2}"
        tenants.append(spec)
    if nested and len(leaves) == 1:
        tenants = [t for t in tenants if t["id"] != "g1"]
    return tenants


@SETTINGS
@given(tenants=trees(), demand=st.lists(st.lists(st.integers(0, 12), min_size=2, max_size=2), min_size=4, max_size=4),
       resource=st.sampled_from([None, 0, 1]))
def test_the_fair_share_is_the_references(tenants, demand, resource):
    from fairstream.core.tenants import specs_from_json

    specs = specs_from_json(tenants)
    tree = TenantTree.from_specs(specs)
    leaves = tree.leaves
    rows = np.array([[float(x) for x in demand[i % 4]] for i in range(len(leaves))])
    capacity = np.array([16.0, 24.0])
    got = fair_shares(tree, leaves, rows, capacity, resource, ("cpu", "mem"))
    want = oracle.fair_shares({s.id: s for s in specs}, {leaf: rows[i].tolist() for i, leaf in enumerate(leaves)},
                              capacity.tolist(), resource, ["cpu", "mem"])
    assert dict(zip(leaves, got.tolist())) == pytest.approx(want, abs=1e-9)
    assert got.sum() <= 1 + 1e-9


@st.composite
def everything(draw):
    n_nodes = draw(st.integers(1, 4))
    nodes = [{"id": f"n{i}", "capacity": {"cpu": draw(st.integers(2, 8)), "mem": draw(st.integers(2, 8))},
              "labels": {"zone": draw(st.sampled_from("ab"))}} for i in range(n_nodes)]
    tenants = draw(trees())
    leaves = [t["id"] for t in tenants if t["id"].startswith("u")]
    for spec in tenants:
        if spec["id"].startswith("u"):
            ordering = draw(st.sampled_from([None, None, "fifo", "fair", "drf", "ltrf"]))
            if ordering is not None:
                spec["ordering"] = ordering
            if draw(st.integers(0, 3)) == 0:
                spec["max_running"] = draw(st.integers(1, 2))
    tasks = []
    for k in range(draw(st.integers(1, 20))):
        task = {"id": f"t{k}", "job": f"j{k % 4}", "tenant": draw(st.sampled_from(leaves)),
                "submit": draw(st.integers(0, 30)), "duration": draw(st.integers(1, 40)),
                "demand": {"cpu": draw(st.integers(0, 3)), "mem": draw(st.integers(1, 3))}}
        if draw(st.integers(0, 3)) == 0:
            task["count"] = draw(st.integers(2, 6))
            if draw(st.booleans()):  # a gang: at least so many of them start together
                task["gang"] = {"min": draw(st.integers(2, task["count"]))}
        estimate = draw(st.sampled_from(["exact", "exact", "none", "short", "long"]))  # backfill reads it
        if estimate != "none":
            task["estimate"] = {"exact": 1.0, "short": 0.5, "long": 2.0}[estimate] * task["duration"]
        kind = draw(st.sampled_from(["none", "none", "nodes", "labels"]))
        if kind == "nodes":
            task["constraints"] = {"nodes": draw(st.lists(st.sampled_from([n["id"] for n in nodes]), min_size=1,
                                                          unique=True))}
        elif kind == "labels":
            task["constraints"] = {"labels": {"zone": draw(st.sampled_from("ab"))}}
        if draw(st.integers(0, 3)) == 0:  # at most 1 or 2 of its job's tasks on one node
            task["constraints"] = {**task.get("constraints", {}), "max_per_node": draw(st.integers(1, 2))}
        tasks.append(task)
    events = []
    if draw(st.booleans()):  # a live config: the same tree with new weights
        changed = [{**t, "weight": draw(st.integers(1, 3))} for t in tenants]
        events.append({"time": draw(st.integers(1, 30)), "type": "tenants", "tenants": changed})
    if n_nodes > 1 and draw(st.booleans()):
        events.append({"time": draw(st.integers(1, 40)), "type": "node_lost", "node": "n0"})
    return {"resources": ["cpu", "mem"], "nodes": nodes, "tenants": tenants, "tasks": tasks, "events": events}


def params_for(policy: str, draw_half_life: bool, reservation: str = "on") -> dict[str, str]:
    # (A gang's hold of nodes runs out within the scenarios' 40 s, and lapses for as long.)
    params = {"preemption": "on", "preemption_timeout": "5", "preemption_threshold": "1", "reservation": reservation,
              "gang_hold": "7"}
    if policy in ("ltrf", "hltrf"):
        params |= {"quantum": "2", "quantum_mode": "fixed", "resource": "dominant"}
        if draw_half_life:
            params["half_life"] = "20"
    if policy == "fair":
        params["resource"] = "mem"
    return params


def checking_every_pass(simulator: Simulator) -> Simulator:
    """``simulator`` with its policy's passes checked one by one (a step may run several, and
    the reservation may change between them): ``reserved_room_goes_to_the_reserved_shape_only``."""
    engine = simulator.engine
    decide = engine.spec.decide

    def checked(snapshot, params):
        decisions = decide(snapshot, params)
        reserved_room_goes_to_the_reserved_shape_only(engine, snapshot, decisions)
        placements_keep_max_per_node(engine, decisions)
        return decisions

    engine.spec = dataclasses.replace(engine.spec, decide=checked)
    return simulator


def _pending_task(engine: Engine, task_id: str):
    """The pending task ``task_id`` (a request's: the request) before the pass's decisions apply."""
    return engine.tasks.get(task_id) or engine.workload.in_request(task_id)[0]


def reserved_room_goes_to_the_reserved_shape_only(engine: Engine, snapshot, decisions) -> None:
    """No placement of one pass goes to the node reserved when it began unless it is of the
    reserved shape, or it backfills: with ``reservation=backfill``, expected (by its estimate)
    to end by the time the reserved task can start there, which is the reference's
    (``oracle.reserved_start``, from the running tasks' estimates). Ending by then, it does not
    move that time. Or it is a starved tenant's reclaimed room while the reservation's tenant is
    at or above its fair share."""
    held = snapshot.reservation
    if held is None:
        assert not any(d.code.value == "backfill" for d in decisions)
        return
    if engine.params.get("reservation") == "backfill":
        want = oracle.reserved_start(engine, held) if not held.for_gang else oracle.gang_reserved_start(engine, held)
        assert (snapshot.backfill_until is None) == (want is None), "whether the reserved task's start is known"
        assert want is None or snapshot.backfill_until == pytest.approx(want, abs=1e-6), "the reserved task's start"
    for decision in decisions:
        # (A gang's hold keeps several nodes: ``held.more``.)
        if decision.kind is not DecisionKind.PLACE or engine.node_row[decision.node] not in (held.node, *held.more):
            continue
        task = _pending_task(engine, decision.task)
        if decision.code.value == "backfill":
            assert engine.params["reservation"] == "backfill" and task.shape != held.shape
            assert task.estimate is not None and snapshot.backfill_until is not None
            assert decision.time + task.estimate <= snapshot.backfill_until + 1e-6, \
                f"{decision.task} backfilled to end at {decision.time + task.estimate}, after {snapshot.backfill_until}"
        elif decision.code.value == "reclaimed" and holder_at_fair_share(engine, held.tenant):
            continue  # a reservation of a tenant at or above its fair share does not hold against a starved one
        elif ahead_in_line(engine, snapshot, decision.tenant, held.tenant):
            continue  # nor against a tenant ahead of its holder in line when the pass began
        else:
            assert task.shape == held.shape, f"{decision.task} took the room reserved for {held.task}"


def ahead_in_line(engine: Engine, snapshot, tenant: str, holder: str) -> bool:
    """Whether ``tenant`` comes before ``holder`` in the policy's order at the start of the pass
    (``snapshot``): a reservation does not hold room against it (a tenant ahead may fall behind
    within the pass, after which it is held off: this checks the first half of that rule)."""
    from fairstream.core.placement import Cycle, dominant_share_order

    spec = engine.spec
    order = spec.ordering.order(snapshot, engine.params) if spec.ordering.order is not None else dominant_share_order(snapshot)
    cycle = Cycle(snapshot, spec.name)
    return tenant != holder and order.key(cycle, tenant) < order.key(cycle, holder)


def holder_at_fair_share(engine: Engine, tenant: str) -> bool:
    """Whether ``tenant``'s share is at or above its fair share, by the reference (before the
    pass's decisions apply)."""
    return oracle.engine_shares(engine).get(tenant, 0.0) >= oracle.engine_fair_shares(engine)[tenant] - 1e-9


def every_invariant(engine: Engine, result) -> None:
    no_overcommit_and_constraints_hold(engine)
    every_pending_task_has_one_reason_and_none_fits_now(engine)
    reference = oracle.engine_fair_shares(engine)
    used = engine.fair_shares()
    for row, ledger in enumerate(engine.accounting.ledgers):
        if ledger.name in reference:
            assert used[row] == pytest.approx(reference[ledger.name], abs=1e-9), f"{ledger.name}'s fair share"
    shares = oracle.engine_shares(engine)
    for decision in result.decisions:
        if decision.kind is DecisionKind.PREEMPT:
            tenant = decision.tenant
            assert shares.get(tenant, 0.0) >= reference[tenant] - 1e-9, \
                f"{tenant} preempted below its fair share {reference[tenant]:.4g}"


def no_starved_tenant_left_while_a_node_could_be_freed_for_it(engine: Engine, result) -> None:
    """After a pass of a memoryless policy (its victims: the tenants furthest above their fair
    share): a tenant starved past the timeout and still below threshold x its fair share has no
    waiting task (within its limits, its constraints, and off nodes reserved for others) for
    which some live node holds enough room once every task of the tenants that could give all
    they run there and stay at or above their fair share were gone. Gangs are left out of it
    (docs/preemption.md, "Gangs"): no gang's task counts as a victim here, nor a gang waiting
    to start whole as a task to free room for; the stage may do more (a floor, not its rule)."""
    from fairstream.core.placement import Cycle

    rule, now = engine.preemption, engine.time
    fair, shares = oracle.engine_fair_shares(engine), oracle.engine_shares(engine)
    starved = [t for t, since in engine.starvation.since.items() if since < now and now - since >= rule.timeout - 1e-9
               and shares.get(t, 0.0) < rule.threshold * fair.get(t, 0.0) - 1e-9]
    if not starved:
        return
    capacity = oracle.live_capacity(engine)
    cycle = Cycle(engine.snapshot(), engine.policy)
    on_node: dict[int, dict[str, list]] = {}
    for task in engine.tasks.values():
        if task.state.name == "RUNNING" and not task.gang:
            on_node.setdefault(engine.node_row[task.node], {}).setdefault(task.tenant, []).append(task)
    running_gangs = {t.id.rsplit("-", 1)[0] for t in engine.tasks.values() if t.state.name == "RUNNING" and t.gang}
    for tenant in starved:
        for head in cycle.queues.shape_heads(tenant, every_shape=True):
            if not cycle.within_caps(tenant, head) or (head.gang and head.id not in running_gangs):
                continue
            usable = cycle.nodes.eligible(head.constraints) & cycle.nodes.usable(head)
            for row, by_tenant in on_node.items():
                if not engine.nodes[row].alive or not usable[row] or runs_its_most(engine, head, engine.nodes[row].id):
                    continue
                room = engine.capacity[row] - engine.used[row]
                for victim, tasks in by_tenant.items():
                    if victim == tenant:
                        continue
                    given = sum((t.demand for t in tasks), np.zeros(len(capacity)))
                    after = shares.get(victim, 0.0) - oracle.measure(given.tolist(), capacity,
                                                                     engine.accounting.config.resource)
                    if after >= fair.get(victim, 0.0) + 1e-6:
                        room = room + given
                assert not (room >= head.demand - 1e-9).all(), (
                    f"t={now}: {tenant} starved past its timeout, yet node {engine.nodes[row].id} could be freed for "
                    f"{head.id}")


@SETTINGS
@given(document=everything(), policy=st.sampled_from(["fair", "drf"]), reservation=st.sampled_from(["on", "off", "backfill"]))
def test_no_starved_tenant_is_left_while_a_node_could_be_freed_for_it(document, policy, reservation):
    def check(engine, result):
        no_starved_tenant_left_while_a_node_could_be_freed_for_it(engine, result)

    Simulator(parse_scenario(document), policy, params_for(policy, False, reservation), on_step=check).run()


def _task(task_id: str, job: str, tenant: str, submit: float, duration: float, mem: float, cpu: float = 0,
          count: int | None = None) -> dict:
    return {"id": task_id, "job": job, "tenant": tenant, "submit": submit, "duration": duration,
            "demand": {"cpu": cpu, "mem": mem}, **({} if count is None else {"count": count})}


# Found by the random examples of the test above (2026-11-26). u0 (weight 2, max_running 2)
# is starved from t=9; its t6 (2 cpu, 1 mem, of job j2, which runs) fits n0's free room
# (2, 1), but n0 is reserved for u1's shape (0 cpu, 2 mem), and u1 holds 0.8 of the memory
# against a fair share of 0.5. The preemption stage honoured that reservation: at t=14, when
# u0's timeout ran out, n0's room stayed kept for u1, and at t=19 the pass gave the room
# freed there to u1's t10-3; u0 waited until t=24. A reservation of a tenant at or above its
# fair share no longer holds against a starved tenant's preemption stage.
RESERVED_AGAINST_A_STARVED_TENANT = {
    "resources": ["cpu", "mem"],
    "nodes": [{"id": "n0", "capacity": {"cpu": 2, "mem": 2}}, {"id": "n1", "capacity": {"cpu": 2, "mem": 8}}],
    "tenants": [{"id": "u0", "weight": 2, "max_running": 2}, {"id": "u1", "weight": 1}],
    "tasks": [_task("t1", "j1", "u0", 1, 1, mem=1), _task("t2", "j2", "u0", 0, 19, mem=1, count=2),
              _task("t4", "j0", "u0", 0, 23, mem=1), _task("t5", "j1", "u1", 0, 1, mem=1, count=2),
              _task("t6", "j2", "u0", 9, 13, cpu=2, mem=1, count=2), _task("t7", "j3", "u0", 0, 1, mem=1),
              _task("t8", "j0", "u0", 0, 1, mem=1), _task("t9", "j1", "u1", 0, 31, mem=2),
              _task("t10", "j2", "u1", 0, 9, mem=2, count=5), _task("t11", "j3", "u0", 0, 1, mem=1),
              _task("t12", "j0", "u0", 0, 1, mem=1), _task("t13", "j1", "u0", 0, 1, mem=1),
              _task("t14", "j2", "u0", 0, 1, mem=1)],
}


def test_a_reservation_of_a_tenant_above_its_fair_share_does_not_keep_a_starved_tenant_off_the_node():
    def check(engine, result):
        no_starved_tenant_left_while_a_node_could_be_freed_for_it(engine, result)

    result = Simulator(parse_scenario(RESERVED_AGAINST_A_STARVED_TENANT), "fair", params_for("fair", False, "on"),
                       on_step=check).run()
    placed = [(d.time, d.task, d.node, d.code.value) for d in result.decisions]
    # u0 (weight 2) is ahead of u1 in fair's order, so the reservation does not hold n0's room
    # against it at all (issue 59): t6-0 takes it at 9, when it is submitted; until then a
    # starved u0 got n0 only at its timeout, 14, reclaimed.
    assert (9.0, "t6-0", "n0", "fair_order") in placed


# Found by the random examples of the oracle test above (2026-11-27). n0 is lost at t=23 and
# u2's t8 and t9 requeued: t8 (2 cpu, 1 mem) goes to n1, t9 (1 mem, zone b only) fits nowhere,
# and u2 is starved from 23. u0's request t0 of four (3 mem each, 5 s) arrives at 23: t0-0 on
# n2, t0-1 on n3. At 28 both end and u0, at share 0, is served first: t0-2 on n2 (the only
# zone-b room), t0-3 on n3. u2's timeout runs out at 28: its share 1/10 of the live memory,
# its fair share 0.18 (the reference's); u0 holds 6/10 against 0.18, and 3/10 without the
# placement on n2: a victim. But a request's placement could be withdrawn only after the ones
# placed after it (t0-3, on n3), and the stage frees one node at a time, so t9 waited to 31.
# Now any placement may go: the one on n2 is withdrawn, the one on n3 becomes t0-2 (its reason
# and code its own), t9 takes n2 at 28, and t0-3 waits.
REQUEST_PLACED_ON_TWO_NODES = {
    "resources": ["cpu", "mem"],
    "nodes": [{"id": "n0", "capacity": {"cpu": 4, "mem": 2}, "labels": {"zone": "b"}},
              {"id": "n1", "capacity": {"cpu": 4, "mem": 3}, "labels": {"zone": "b"}},
              {"id": "n2", "capacity": {"cpu": 2, "mem": 3}, "labels": {"zone": "b"}},
              {"id": "n3", "capacity": {"cpu": 2, "mem": 4}}],
    "tenants": [{"id": "g0", "max_resources": {"cpu": 2}}, {"id": "u0", "parent": "g0", "max_running": 1},
                {"id": "u2", "parent": "g0"}, {"id": "u3"}],
    "tasks": [_task("t0", "j0", "u0", 23, 5, mem=3, count=4), _task("t2", "j2", "u0", 1, 1, cpu=2, mem=1, count=2),
              _task("t6", "j2", "u2", 4, 1, cpu=3, mem=1), _task("t7", "j3", "u3", 0, 31, cpu=2, mem=2),
              _task("t8", "j0", "u2", 3, 20, cpu=2, mem=1),
              {**_task("t9", "j1", "u2", 15, 9, mem=1), "constraints": {"labels": {"zone": "b"}}},
              _task("t12", "j0", "u0", 0, 1, mem=1), _task("t13", "j1", "u0", 0, 1, mem=1)],
    "events": [{"time": 23, "type": "node_lost", "node": "n0"}],
}


def test_a_requests_placement_on_one_node_is_taken_back_for_a_starved_tenant_while_its_others_stay():
    def check(engine, result):
        no_starved_tenant_left_while_a_node_could_be_freed_for_it(engine, result)

    result = Simulator(parse_scenario(REQUEST_PLACED_ON_TWO_NODES), "fair", params_for("fair", False, "on"),
                       on_step=check).run()
    placed = [(d.time, d.task, d.node, d.code.value) for d in result.decisions if d.time >= 28]
    assert placed == [(28.0, "t0-2", "n3", "fair_order"), (28.0, "t9", "n2", "reclaimed"),
                      (33.0, "t0-3", "n3", "fair_order")]
    reclaimed = next(d for d in result.decisions if d.task == "t9" and d.time == 28)
    assert reclaimed.reason == "reclaimed: placed for starved u2 on room this pass had given to u0, taken back for it"


# Found by the random examples of the oracle test above (2026-11-27). u0 is starved from t=5
# (its t10-1 waits for a node other than the one t10-0 runs on). At 22, u3's t13 (2 cpu, 3 mem)
# fits nowhere and n2 is reserved for it. At 23, u0's t0 (two of 3 mem, only on n2) arrives;
# u0, served first, finds n2 full (u1's t8 runs there), and its t0-0, first blocked, takes the
# reservation at the pass's end. In that pass n2 was still u3's, below its fair share, so the
# preemption stage kept off it; no pass followed (n2 had no free room) and u0 waited to 24,
# when t8 ended. The reservation moving while a tenant is starved past its timeout is now
# followed by another pass, whose stage preempts u1's t8 (u1 at 0.375 of the memory against
# 0.137) for t0-0 at 23.
RESERVATION_MOVED_TO_A_STARVED_TENANT = {
    "resources": ["cpu", "mem"],
    "nodes": [{"id": "n2", "capacity": {"cpu": 4, "mem": 3}, "labels": {"zone": "b"}},
              {"id": "n3", "capacity": {"cpu": 5, "mem": 7}}],
    "tenants": [{"id": "g0", "min_share": 0.6}, {"id": "u0", "parent": "g0"}, {"id": "u1"},
                {"id": "u3", "min_share": 0.3, "max_resources": {"cpu": 3}}],
    "tasks": [{**_task("t0", "j0", "u0", 23, 1, mem=3, count=2), "constraints": {"nodes": ["n2"]}},
              _task("t4", "j0", "u3", 0, 5, cpu=3, mem=2, count=2), _task("t5", "j1", "u3", 0, 14, cpu=1, mem=2),
              _task("t6", "j2", "u1", 21, 3, mem=3),
              {**_task("t8", "j0", "u1", 1, 19, cpu=3, mem=3), "constraints": {"labels": {"zone": "b"}}},
              {**_task("t10", "j2", "u0", 5, 18, mem=1, count=2), "constraints": {"max_per_node": 1}},
              {**_task("t13", "j1", "u3", 22, 1, cpu=2, mem=3), "constraints": {"max_per_node": 1}}],
}


def test_a_reservation_moved_to_a_tenant_starved_past_its_timeout_is_followed_by_a_pass_that_preempts_for_it():
    def check(engine, result):
        no_starved_tenant_left_while_a_node_could_be_freed_for_it(engine, result)

    result = Simulator(parse_scenario(RESERVATION_MOVED_TO_A_STARVED_TENANT), "fair", params_for("fair", False, "on"),
                       on_step=check).run()
    # Since a reservation no longer holds room against a tenant ahead of its holder (issue 59),
    # u3 (below its min share, ahead in line) takes n3 for t13 at 22 rather than reserving n2,
    # so the reservation never moves to u0: the check above (every step) is what still guards
    # the rule, and u0's t0 starts on n2 when t8 ends.
    placed = [(d.time, d.task, d.node) for d in result.decisions if 22 <= d.time <= 25 and d.kind.value == "place"]
    assert placed == [(22.0, "t13", "n3"), (24.0, "t0-0", "n2"), (25.0, "t0-1", "n2")]


@SETTINGS
@given(document=everything(), policy=st.sampled_from(PREEMPTING), half_life=st.booleans(),
       reservation=st.sampled_from(["on", "off", "backfill"]))
def test_every_feature_on_keeps_every_invariant_after_every_pass(document, policy, half_life, reservation):
    simulator = Simulator(parse_scenario(document), policy, params_for(policy, half_life, reservation),
                          on_step=every_invariant)
    checking_every_pass(simulator).run()


@SETTINGS
@given(document=everything(), policy=st.sampled_from(["fair", "drf", "ltrf"]), half_life=st.booleans(),
       reservation=st.sampled_from(["on", "off", "backfill"]), compiled=st.booleans())
def test_every_feature_on_passes_over_the_tenants_that_may_place_decide_exactly_as_passes_over_all(
        document, policy, half_life, reservation, compiled):
    """The engine's candidate tenants (``core/candidates.py``) beside max_running, queue
    orderings and limits, live weights, a lost node, estimates, backfill and preemption: a
    pass over the tenants that may place decides as a pass over every waiting tenant."""
    decide_alike_with_passes_over_candidates_and_over_all(document, policy, None, compiled,
                                                          params_for(policy, half_life, reservation))


@SETTINGS
@given(document=everything(), policy=st.sampled_from(PREEMPTING), half_life=st.booleans(),
       reservation=st.sampled_from(["on", "off", "backfill"]))
def test_a_worker_replaying_the_recorded_input_takes_the_simulators_decisions(document, policy, half_life, reservation):
    params = params_for(policy, half_life, reservation)
    scenario = parse_scenario(document)
    result = Simulator(scenario, policy, params, record_events=True).run()
    fresh = parse_scenario(document)  # its own tree: the simulator's engine changed the first one
    worker = Engine(fresh.resources, fresh.tree, get_policy(policy), params)
    steps = [log_step(time, events) for time, events in result.events]
    replayed = [d for step in replay(worker, steps) for d in step.decisions]
    assert [d.to_json() for d in replayed] == [d.to_json() for d in result.decisions]


def one_level(document: dict) -> dict:
    """``document`` with every leaf under the root: its queues gone (in a live config too)."""
    def leaves(tenants: list[dict]) -> list[dict]:
        return [{key: value for key, value in t.items() if key != "parent"} for t in tenants if t["id"].startswith("u")]

    events = [{**e, "tenants": leaves(e["tenants"])} if e["type"] == "tenants" else e for e in document["events"]]
    return {**document, "tenants": leaves(document["tenants"]), "events": events}


@SETTINGS
@given(document=everything(), half_life=st.booleans(), reservation=st.sampled_from(["on", "off", "backfill"]),
       preemption=st.booleans(), discount=st.sampled_from(["1", "0.5"]))
def test_hltrf_on_a_tree_of_one_level_decides_as_its_walk_of_the_tree(document, half_life, reservation, preemption,
                                                                        discount):
    # With every leaf under the root and no timeout, hltrf's pass is the flat pass by usage
    # (``hltrf.walks_one_level``: a heap of the leaves, compiled when it may be) instead of its
    # walk down the tree per placement. Its decisions (reasons included) and the run's summary
    # are the walk's, with min shares, caps, preemption, reservations and a discount (which
    # keeps the pass in Python).
    document = one_level(document)
    params = params_for("hltrf", half_life, reservation) | {"discount": discount}
    if not preemption:
        params["preemption"] = "off"
    flat_passes, walks_one_level = [], hltrf_module.walks_one_level

    def run(walks_one_level) -> tuple[list, dict]:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(hltrf_module, "walks_one_level", walks_one_level)
            result = Simulator(parse_scenario(document), "hltrf", params).run()
        return [d.to_json() for d in result.decisions], result.summary()

    def counted(snapshot, params) -> bool:
        flat_passes.append(walks_one_level(snapshot, params))
        return flat_passes[-1]

    assert run(counted) == run(lambda snapshot, params: False)
    assert all(flat_passes)


def in_fractions(document: dict) -> dict:
    """``document`` with demands and capacities in tenths, node resource weights and run times
    off the whole second: sums of a run's tasks then depend on the order of their float
    additions (whole numbers add exactly in any order)."""
    tenths = lambda vector: {name: value / 10 for name, value in vector.items()}
    nodes = [{**n, "capacity": tenths(n["capacity"]), "weights": {"cpu": 1.5 if i % 2 else 1.0, "mem": 0.7}}
             for i, n in enumerate(document["nodes"])]
    tasks = [{**t, "demand": tenths(t["demand"]), "duration": t["duration"] * 1.1} for t in document["tasks"]]
    return {**document, "nodes": nodes, "tasks": tasks}


def decisions_one_at_a_time(engine: Engine, decisions):
    """The reference for runs of placements: each of a pass's decisions applied alone."""
    return [request for decision in decisions for request in transitions.apply_decisions(engine, [decision])]


def events_one_at_a_time(engine: Engine, events, result) -> None:
    """The reference for runs of completions and submissions: each of a step's events
    applied alone."""
    for event in events:
        transitions.apply_events(engine, [event], result)


@SETTINGS
@given(document=everything(), policy=st.sampled_from(PREEMPTING), half_life=st.booleans(),
       reservation=st.sampled_from(["on", "off", "backfill"]))
def test_runs_of_tasks_started_or_finished_at_once_leave_the_state_of_one_at_a_time_to_the_bit(
        document, policy, half_life, reservation):
    # ``transitions.apply_decisions`` starts the placements of one request's next tasks on one
    # node in one go, ``transitions.apply_events`` the completions in a row of one tenant's
    # tasks on one node, and the submissions in a row of one job's tasks of one demand: after
    # every step, the engine's whole state (its snapshot's bytes) and its decisions are those
    # of applying each alone.
    document = in_fractions(document)

    def steps(apply_decisions, apply_events) -> list:
        seen = []
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(engine_module, "apply_decisions", apply_decisions)
            patch.setattr(engine_module, "apply_events", apply_events)
            Simulator(parse_scenario(document), policy, params_for(policy, half_life, reservation),
                      on_step=lambda engine, result: seen.append((result.decisions, [task.id for task in result.finished],
                                                                  encode_engine(engine)))).run()
        return seen

    assert steps(transitions.apply_decisions, transitions.apply_events) == \
        steps(decisions_one_at_a_time, events_one_at_a_time)


def first_in_line_is_true(engine: Engine) -> None:
    """Every explanation is true: a tenant said to be first in line (``no_room``: "the first room
    that frees for it on one node goes to it"; ``reservation`` naming no tenant ahead) gets that
    room. For its earliest such entry and every live node its constraints allow that could hold
    it and is not reserved for another shape: with exactly its demand free there (the rest as it
    is), the policy's pass places a task of that tenant there."""
    from fairstream.core.explain import WaitReason, explain

    explanation = explain(engine)
    for tenant, entries in explanation.pending.items():
        entry = next((e for e in entries if e.reason in (WaitReason.NO_ROOM, WaitReason.RESERVATION)), None)
        if entry is None or entry.waits_for is not None:
            continue  # (not said to be first: a reservation behind a tenant ahead names it)
        for node, decisions in _room_freed_for(engine, entry.id):
            assert any(d.kind is DecisionKind.PLACE and d.tenant == tenant and d.node == node.id for d in decisions), (
                f"t={engine.time}: {tenant} is told '{entry.message}', yet room for {entry.first} on {node.id} "
                f"goes to {[(d.tenant, d.task) for d in decisions if d.node == node.id]}")


def behind_a_tenant_is_true(engine: Engine) -> None:
    """Every explanation is true: a tenant told that freed room "goes first to" another
    (``behind_tenants``, not the "may go first" of a starved tenant ahead, which takes the room
    only if its preemption stage frees the rest) is behind it: on some node that could hold its
    earliest such entry, with exactly that entry's demand set free (the rest as it is), the
    tenant named takes some of it, or the node is reserved for that tenant's task and the
    entry is kept off it (smaller tasks that end in time may backfill there, its tenant's too)."""
    from fairstream.core.explain import WaitReason, explain

    explanation = explain(engine)
    for tenant, entries in explanation.pending.items():
        entry = next((e for e in entries if e.reason is WaitReason.BEHIND_TENANTS), None)
        if entry is None or "may go first" in entry.message:
            continue
        ahead, held = entry.waits_for, engine.reservation
        kept_for = set() if held is None or held.tenant != ahead else {engine.nodes[r].id for r in (held.node, *held.more)}

        def goes_first(node, decisions) -> bool:
            placed = [d for d in decisions if d.kind is DecisionKind.PLACE and d.node == node.id]
            return (any(d.tenant == ahead for d in placed)  # noqa: B023 (called before the loop moves on)
                    or (node.id in kept_for and not any(entry.first in d.task_ids for d in placed)))  # noqa: B023 (called before the loop moves on)

        tried = list(_room_freed_for(engine, entry.id, reserved_for_others=True))
        assert not tried or any(goes_first(node, decisions) for node, decisions in tried), (
            f"t={engine.time}: {tenant} is told '{entry.message}', yet room freed for {entry.first} on "
            f"{[node.id for node, _ in tried]} never goes to {ahead} (nor is kept for it)")


def _room_freed_for(engine: Engine, entry_id: str, reserved_for_others: bool = False):
    """For pending entry ``entry_id``, each live node its constraints allow that could hold it
    (its job not at its max_per_node there, and not reserved for another shape unless
    ``reserved_for_others``): the node and the decisions of the policy's pass with exactly the
    entry's demand free there, the rest as it is (what-if: nothing changes)."""
    import dataclasses

    snapshot = engine.snapshot()
    held = engine.reservation
    head = engine.tasks.get(entry_id) or engine.requests[entry_id]
    for row, node in enumerate(engine.nodes):
        if (not node.alive or not head.constraints.allows(node.id, node.labels)
                or runs_its_most(engine, head, node.id)  # (its job's own tasks there hold it, not room)
                or not (node.capacity >= head.demand - 1e-9).all()
                or (not reserved_for_others and held is not None and row in (held.node, *held.more)
                    and held.shape != head.shape)):
            continue
        free = snapshot.free.copy()
        free[row] = head.demand
        until = snapshot.backfill_until
        if held is not None and held.node == row and held.shape == head.shape:
            until = snapshot.time if until is not None else None  # the reserved task fits now: nothing backfills
        yield node, engine.spec.decide(dataclasses.replace(snapshot, free=free, backfill_until=until,
                                                           running_tasks=_ended_for(snapshot, row, head.demand)),
                                       engine.params)


def _ended_for(snapshot, row: int, demand: np.ndarray):
    """The running tasks (preemption's victims) as they would be once ``demand`` is free on node
    ``row``: the latest started there end until what stays fits beside it. (Free room with all of
    them still running would let preemption free more than the node holds.)"""
    if snapshot.running_tasks is None:
        return None
    there = sorted((t for t in snapshot.running_tasks if t.node == row), key=lambda t: (t.start, t.seq))
    room = snapshot.node_capacity[row] - demand
    while there and (sum(t.demand for t in there) > room + 1e-9).any():
        there.pop()
    kept = {t.id for t in there}
    return tuple(t for t in snapshot.running_tasks if t.node != row or t.id in kept)


# Found by the property test below: room set free beside tasks still running let preemption free more
# than n2 holds (2 mem): u0's 3-mem task went there, and u1, first in line, seemed passed over.
WHAT_IF_BEYOND_CAPACITY = {
    "resources": ["cpu", "mem"],
    "nodes": [{"id": "n0", "capacity": {"cpu": 2, "mem": 8}, "labels": {"zone": "a"}},
              {"id": "n1", "capacity": {"cpu": 2, "mem": 3}, "labels": {"zone": "a"}},
              {"id": "n2", "capacity": {"cpu": 2, "mem": 2}, "labels": {"zone": "a"}}],
    "tenants": [{"id": "g0", "weight": 1, "min_share": 0.1}, {"id": "g1", "weight": 1, "min_share": 0.3},
                {"id": "u0", "weight": 1, "parent": "g0"}, {"id": "u1", "weight": 1, "parent": "g1"}],
    "tasks": [
        {"id": "t0", "job": "j0", "tenant": "u0", "submit": 0, "duration": 1, "demand": {"cpu": 0, "mem": 1},
         "count": 2, "estimate": 1.0, "constraints": {"labels": {"zone": "b"}}},
        {"id": "t1", "job": "j1", "tenant": "u0", "submit": 0, "duration": 1, "demand": {"cpu": 0, "mem": 1},
         "estimate": 1.0},
        {"id": "t2", "job": "j2", "tenant": "u1", "submit": 0, "duration": 36, "demand": {"cpu": 0, "mem": 3},
         "count": 2, "estimate": 36.0},
        {"id": "t3", "job": "j3", "tenant": "u0", "submit": 0, "duration": 1, "demand": {"cpu": 0, "mem": 1},
         "estimate": 1.0},
        {"id": "t4", "job": "j0", "tenant": "u0", "submit": 0, "duration": 1, "demand": {"cpu": 0, "mem": 1},
         "estimate": 1.0},
        {"id": "t5", "job": "j1", "tenant": "u1", "submit": 2, "duration": 13, "demand": {"cpu": 0, "mem": 2},
         "count": 3, "estimate": 13.0, "constraints": {"nodes": ["n2"]}},
        {"id": "t6", "job": "j2", "tenant": "u0", "submit": 0, "duration": 5, "demand": {"cpu": 0, "mem": 3},
         "estimate": 5.0},
        {"id": "t7", "job": "j3", "tenant": "u0", "submit": 0, "duration": 1, "demand": {"cpu": 0, "mem": 1},
         "estimate": 1.0},
        {"id": "t8", "job": "j0", "tenant": "u1", "submit": 5, "duration": 1, "demand": {"cpu": 0, "mem": 1},
         "estimate": 1.0},
        {"id": "t9", "job": "j1", "tenant": "u0", "submit": 0, "duration": 2, "demand": {"cpu": 0, "mem": 3},
         "estimate": 2.0}],
    "events": []}


# Found by the property test below, shrunk: n0 is reserved for u2's <3 cpu, 3 mem> task; at t = 5 u0 is
# overdue and u2 at or above its fair share, so room freed on n0 for u1's task of the same shape may go
# first to u0. u1 was told it was first in line (test_explain has the worked example).
RESERVED_SHAPE_BEHIND_A_STARVED_TENANT = {
    "resources": ["cpu", "mem"],
    "nodes": [{"id": "n0", "capacity": {"cpu": 8, "mem": 6}}, {"id": "n1", "capacity": {"cpu": 2, "mem": 4}},
              {"id": "n2", "capacity": {"cpu": 2, "mem": 2}}],
    "tenants": [{"id": "g0", "min_share": 0.3}, {"id": "g1"}, {"id": "u0", "min_share": 0.6, "parent": "g0"},
                {"id": "u1", "min_share": 0.6, "parent": "g1"}, {"id": "u2", "parent": "g0"}],
    "tasks": [
        {"id": "t0", "job": "j0", "tenant": "u1", "submit": 0, "duration": 40, "demand": {"cpu": 1, "mem": 2},
         "count": 6},
        {"id": "t2", "job": "j2", "tenant": "u2", "submit": 0, "duration": 1, "demand": {"cpu": 3, "mem": 3}},
        {"id": "t3", "job": "j3", "tenant": "u0", "submit": 0, "duration": 1, "demand": {"cpu": 0, "mem": 2},
         "count": 2, "constraints": {"nodes": ["n0"]}},
        {"id": "t11", "job": "j3", "tenant": "u1", "submit": 0, "duration": 1, "demand": {"cpu": 3, "mem": 3}},
        {"id": "t13", "job": "j1", "tenant": "u0", "submit": 0, "duration": 19, "demand": {"cpu": 0, "mem": 3},
         "count": 2}]}


# Found by the property test below in CI, shrunk: n0 is reserved for u0's 2-mem t1-1; u1, ahead of
# u0 in the order, waits with t10-1 (1 mem, max_per_node 1: t10-0 runs on n2). The pass serves u1
# with the reservation open, so room freed on n0 goes to t10-1; u0 was told that u1 "waits for
# other room" (explain kept the reserved node from every other shape, those ahead of the holder too).
RESERVED_NODE_OPEN_TO_A_TENANT_AHEAD = {
    "resources": ["cpu", "mem"],
    "nodes": [{"id": f"n{k}", "capacity": {"cpu": 2, "mem": 2}} for k in range(3)],
    "tenants": [{"id": "u0", "min_share": 0.1}, {"id": "u1"}],
    "tasks": [
        {"id": "t0", "job": "j0", "tenant": "u0", "submit": 0, "duration": 1, "demand": {"cpu": 0, "mem": 1}},
        {"id": "t1", "job": "j1", "tenant": "u0", "submit": 0, "duration": 1, "demand": {"cpu": 0, "mem": 2},
         "count": 2, "constraints": {"max_per_node": 1}},
        *({"id": f"t{k}", "job": f"j{k % 4}", "tenant": "u0", "submit": 0, "duration": 1,
           "demand": {"cpu": 0, "mem": 1}} for k in range(2, 9)),
        {"id": "t9", "job": "j1", "tenant": "u1", "submit": 0, "duration": 1, "demand": {"cpu": 0, "mem": 1}},
        {"id": "t10", "job": "j2", "tenant": "u1", "submit": 0, "duration": 1, "demand": {"cpu": 0, "mem": 1},
         "count": 2, "constraints": {"max_per_node": 1}}]}


# Found by CI's run of the property below: u0 (below its min_share, starved past its timeout) waits
# with a gang of 2 (2 mem each); u1 was told it was first in line for 3 mem on n0, but the
# preemption stage took back what the pass gave u1 there to start u0's gang whole. u0's reason is
# ``gang``, so explain did not count it among the overdue tenants in the way.
OVERDUE_GANG_TAKES_ROOM_BACK = {
    "resources": ["cpu", "mem"],
    "nodes": [{"id": "n0", "capacity": {"cpu": 2, "mem": 7}, "labels": {"zone": "a"}}],
    "tenants": [{"id": "u0", "weight": 1, "min_share": 0.1}, {"id": "u1", "weight": 1}, {"id": "u2", "weight": 1}],
    "tasks": [
        {"id": "t0", "job": "j0", "tenant": "u0", "submit": 0, "duration": 1, "demand": {"cpu": 0, "mem": 1}, "estimate": 1.0},
        {"id": "t1", "job": "j1", "tenant": "u1", "submit": 0, "duration": 4, "demand": {"cpu": 0, "mem": 3}, "count": 4,
         "estimate": 4.0},
        {"id": "t2", "job": "j2", "tenant": "u0", "submit": 0, "duration": 1, "demand": {"cpu": 0, "mem": 1}, "estimate": 1.0},
        {"id": "t3", "job": "j3", "tenant": "u1", "submit": 0, "duration": 3, "demand": {"cpu": 0, "mem": 1}, "count": 2,
         "estimate": 3.0, "constraints": {"max_per_node": 1}},
        {"id": "t4", "job": "j0", "tenant": "u1", "submit": 0, "duration": 1, "demand": {"cpu": 0, "mem": 1}, "count": 2,
         "estimate": 1.0},
        {"id": "t5", "job": "j1", "tenant": "u1", "submit": 1, "duration": 2, "demand": {"cpu": 1, "mem": 2}, "count": 2,
         "estimate": 2.0},
        {"id": "t6", "job": "j2", "tenant": "u0", "submit": 1, "duration": 1, "demand": {"cpu": 2, "mem": 1}, "estimate": 1.0},
        {"id": "t7", "job": "j3", "tenant": "u1", "submit": 0, "duration": 1, "demand": {"cpu": 1, "mem": 1}, "estimate": 1.0,
         "constraints": {"max_per_node": 1}},
        {"id": "t8", "job": "j0", "tenant": "u0", "submit": 0, "duration": 1, "demand": {"cpu": 0, "mem": 1}, "estimate": 1.0},
        {"id": "t9", "job": "j1", "tenant": "u0", "submit": 0, "duration": 1, "demand": {"cpu": 0, "mem": 2}, "count": 2,
         "gang": {"min": 2}, "estimate": 1.0, "constraints": {"max_per_node": 2}}],
    "events": []}


@SETTINGS
@given(document=everything(), policy=st.sampled_from(PREEMPTING), reservation=st.sampled_from(["on", "off", "backfill"]))
@example(document=RESERVED_NODE_OPEN_TO_A_TENANT_AHEAD, policy="fair", reservation="on")
@example(document=OVERDUE_GANG_TAKES_ROOM_BACK, policy="fair", reservation="off")
@example(document=RESERVED_SHAPE_BEHIND_A_STARVED_TENANT, policy="fair", reservation="on")
@example(document=WHAT_IF_BEYOND_CAPACITY, policy="fair", reservation="on")
def test_first_in_line_means_the_next_room_that_fits_goes_to_it(document, policy, reservation):
    _check_every_step(document, policy, reservation, first_in_line_is_true)


# Found by the property test below, shrunk: n1 is reserved for u0's 3-mem t2, but u0 (max_running 1)
# runs job j3 (on n2: n0 is lost at t = 1), so j2 may not start: room freed on n1 goes to u1's task
# of the same shape. u1 was told it "goes first to u0".
A_HOLDER_HELD_BY_MAX_RUNNING = {
    "resources": ["cpu", "mem"],
    "nodes": [{"id": "n0", "capacity": {"cpu": 2, "mem": 2}}, {"id": "n1", "capacity": {"cpu": 2, "mem": 3}},
              {"id": "n2", "capacity": {"cpu": 2, "mem": 2}}],
    "tenants": [{"id": "u0", "max_running": 1}, {"id": "u1"}],
    "tasks": [
        {"id": "t0", "job": "j0", "tenant": "u0", "submit": 0, "duration": 1, "demand": {"cpu": 0, "mem": 1}},
        {"id": "t2", "job": "j2", "tenant": "u0", "submit": 0, "duration": 1, "demand": {"cpu": 0, "mem": 3}},
        {"id": "t3", "job": "j3", "tenant": "u0", "submit": 0, "duration": 1, "demand": {"cpu": 0, "mem": 1}},
        {"id": "t7", "job": "j3", "tenant": "u0", "submit": 0, "duration": 1, "demand": {"cpu": 0, "mem": 1}},
        {"id": "t11", "job": "j3", "tenant": "u0", "submit": 0, "duration": 1, "demand": {"cpu": 0, "mem": 1}},
        {"id": "t17", "job": "j1", "tenant": "u1", "submit": 0, "duration": 5, "demand": {"cpu": 0, "mem": 3},
         "count": 2}],
    "events": [{"time": 1, "type": "node_lost", "node": "n0"}]}


# Found by the property test below, shrunk: at t = 21 u0 is starved past its timeout and u2, ahead
# of it in ltrf's order, at or above its fair share: what the pass gives u2 is taken back for u0.
# u0 was told the room "goes first to u2".
A_VICTIM_AHEAD = {
    "resources": ["cpu", "mem"],
    "nodes": [{"id": "n1", "capacity": {"cpu": 2, "mem": 3}}],
    "tenants": [{"id": "u0", "weight": 3}, {"id": "u2", "weight": 1}],
    "tasks": [
        {"id": "t1", "job": "j1", "tenant": "u0", "submit": 0, "duration": 16, "demand": {"cpu": 0, "mem": 2},
         "count": 2},
        {"id": "t3", "job": "j3", "tenant": "u0", "submit": 0, "duration": 1, "demand": {"cpu": 0, "mem": 1}},
        {"id": "t4", "job": "j0", "tenant": "u0", "submit": 0, "duration": 1, "demand": {"cpu": 0, "mem": 1}},
        {"id": "t11", "job": "j3", "tenant": "u2", "submit": 0, "duration": 26, "demand": {"cpu": 0, "mem": 2},
         "count": 2}]}


# Found by CI's run of the property test below (2026-11-29), shrunk: at t = 10 u0 and u2 tie in
# ltrf's order, u0 first; u2 (and u3) are starved past their timeout and u0 at or above its fair
# share, so what the pass gives u0 is taken back for u2. u3, behind both, was told the room "goes
# first to u0": it goes to u2 ("may go first", as u2 is named now).
ROOM_OF_A_VICTIM_AHEAD_GOES_TO_THE_STARVED = {
    "resources": ["cpu", "mem"],
    "nodes": [{"id": "n0", "capacity": {"cpu": 2, "mem": 3}}],
    "tenants": [{"id": "u0"}, {"id": "u1"}, {"id": "u2", "weight": 2}, {"id": "u3"}],
    "tasks": [
        {"id": "t0", "job": "j0", "tenant": "u0", "submit": 1, "duration": 3, "demand": {"cpu": 0, "mem": 1},
         "count": 2},
        {"id": "t1", "job": "j1", "tenant": "u0", "submit": 0, "duration": 1, "demand": {"cpu": 1, "mem": 1}},
        {"id": "t4", "job": "j0", "tenant": "u3", "submit": 0, "duration": 4, "demand": {"cpu": 0, "mem": 3}},
        {"id": "t5", "job": "j1", "tenant": "u3", "submit": 0, "duration": 1, "demand": {"cpu": 0, "mem": 1},
         "count": 2},
        {"id": "t6", "job": "j2", "tenant": "u0", "submit": 0, "duration": 1, "demand": {"cpu": 2, "mem": 1}},
        {"id": "t7", "job": "j3", "tenant": "u1", "submit": 2, "duration": 6, "demand": {"cpu": 0, "mem": 1}},
        {"id": "t8", "job": "j0", "tenant": "u2", "submit": 5, "duration": 3, "demand": {"cpu": 0, "mem": 1},
         "count": 2},
        {"id": "t9", "job": "j1", "tenant": "u0", "submit": 0, "duration": 1, "demand": {"cpu": 0, "mem": 1}},
        {"id": "t11", "job": "j3", "tenant": "u0", "submit": 0, "duration": 1, "demand": {"cpu": 0, "mem": 1}},
        {"id": "t12", "job": "j0", "tenant": "u0", "submit": 1, "duration": 1, "demand": {"cpu": 0, "mem": 1}},
        {"id": "t13", "job": "j1", "tenant": "u1", "submit": 0, "duration": 1, "demand": {"cpu": 0, "mem": 1}}]}


# Found by the property test below, shrunk: n0 is reserved for u1's 2-mem task with backfill; u0's
# 1-mem task, expected to end before u1's can start, would backfill room freed there, yet it was
# told the room "goes first to u1".
BACKFILL_IS_NOT_BEHIND_THE_HOLDER = {
    "resources": ["cpu", "mem"],
    "nodes": [{"id": "n0", "capacity": {"cpu": 2, "mem": 2}}],
    "tenants": [{"id": "u0"}, {"id": "u1"}],
    "tasks": [
        {"id": "t0", "job": "j0", "tenant": "u1", "submit": 0, "duration": 1, "demand": {"cpu": 0, "mem": 2}},
        {"id": "t1", "job": "j1", "tenant": "u0", "submit": 0, "duration": 1, "demand": {"cpu": 0, "mem": 1},
         "estimate": 1.0},
        {"id": "t2", "job": "j2", "tenant": "u0", "submit": 0, "duration": 1, "demand": {"cpu": 0, "mem": 1},
         "count": 2, "estimate": 1.0}]}


# Found by the property test below, shrunk: n0 is reserved for u0's 2-mem tasks; at t = 17 u2 is
# starved past its timeout and u0 at or above its fair share, so the reservation yields to u2. The
# holder was told so ("u2 may take it first") while u2 was told the room "goes first to u0".
RESERVATION_YIELDS_TO_THE_TENANT_TOLD = {
    "resources": ["cpu", "mem"],
    "nodes": [{"id": "n0", "capacity": {"cpu": 2, "mem": 2}}],
    "tenants": [{"id": "u0"}, {"id": "u2", "max_share": 0.5}],
    "tasks": [
        {"id": "t0", "job": "j0", "tenant": "u0", "submit": 7, "duration": 6, "demand": {"cpu": 0, "mem": 2},
         "count": 2},
        {"id": "t1", "job": "j1", "tenant": "u0", "submit": 0, "duration": 1, "demand": {"cpu": 0, "mem": 1}},
        {"id": "t3", "job": "j3", "tenant": "u2", "submit": 0, "duration": 6, "demand": {"cpu": 0, "mem": 1},
         "count": 3}]}


# Found by the property test below: n0 (4 mem) is reserved for u1's 3-mem t3-1; at t = 6 u0,
# starved since 1, is past its timeout and u1 at or above its fair share, so the reservation
# yields to u0. Room freed there for u0's 1-mem t7 cannot hold t3-1; the preemption stage gives
# it to u0 (its free room, no victim). u0 was told it "goes first to u1" (under ltrf u1, which
# used less, is no victim of u0's: the "may go first" that once covered it went with that rule).
A_RESERVATION_YIELDING_TO_AN_OVERDUE_TENANT = {
    "resources": ["cpu", "mem"],
    "nodes": [{"id": "n0", "capacity": {"cpu": 2, "mem": 4}}],
    "tenants": [{"id": "g0", "weight": 1, "min_share": 0.1}, {"id": "g1", "weight": 1, "min_share": 0.1}, {"id": "u0", "weight": 1, "min_share": 0.1, "parent": "g0"}, {"id": "u1", "weight": 1, "parent": "g1"}, {"id": "u2", "weight": 1, "parent": "g0"}],
    "tasks": [
        {"id": "t0", "job": "j0", "tenant": "u0", "submit": 0, "duration": 1, "demand": {"cpu": 0, "mem": 1}, "estimate": 1.0},
        {"id": "t1", "job": "j1", "tenant": "u0", "submit": 0, "duration": 1, "demand": {"cpu": 0, "mem": 1}, "estimate": 1.0},
        {"id": "t2", "job": "j2", "tenant": "u0", "submit": 0, "duration": 3, "demand": {"cpu": 0, "mem": 1}, "estimate": 3.0},
        {"id": "t3", "job": "j3", "tenant": "u1", "submit": 1, "duration": 6, "demand": {"cpu": 0, "mem": 3}, "count": 2, "estimate": 6.0},
        {"id": "t4", "job": "j0", "tenant": "u0", "submit": 0, "duration": 1, "demand": {"cpu": 0, "mem": 1}, "count": 2, "estimate": 1.0},
        {"id": "t5", "job": "j1", "tenant": "u0", "submit": 0, "duration": 1, "demand": {"cpu": 0, "mem": 1}, "count": 2, "estimate": 1.0},
        {"id": "t6", "job": "j2", "tenant": "u0", "submit": 0, "duration": 1, "demand": {"cpu": 0, "mem": 1}, "estimate": 1.0},
        {"id": "t7", "job": "j3", "tenant": "u0", "submit": 0, "duration": 1, "demand": {"cpu": 0, "mem": 1}, "estimate": 1.0}]}


@SETTINGS
@given(document=everything(), policy=st.sampled_from(PREEMPTING), reservation=st.sampled_from(["on", "off", "backfill"]))
@example(document=A_RESERVATION_YIELDING_TO_AN_OVERDUE_TENANT, policy="ltrf", reservation="on")
@example(document=RESERVATION_YIELDS_TO_THE_TENANT_TOLD, policy="ltrf", reservation="on")
@example(document=BACKFILL_IS_NOT_BEHIND_THE_HOLDER, policy="fair", reservation="backfill")
@example(document=A_VICTIM_AHEAD, policy="ltrf", reservation="on")
@example(document=A_HOLDER_HELD_BY_MAX_RUNNING, policy="fair", reservation="on")
@example(document=ROOM_OF_A_VICTIM_AHEAD_GOES_TO_THE_STARVED, policy="ltrf", reservation="off")
def test_behind_a_tenant_means_freed_room_goes_to_that_tenant_first(document, policy, reservation):
    _check_every_step(document, policy, reservation, behind_a_tenant_is_true)


class PromisedPreemption:
    """An oracle with a memory (issue 59.2): a tenant told "preemption takes room back for it at
    T" (``preemption_pending``, the promise without conditions) gets a pass at T, in which the
    preemption stage counts it starved past its timeout, unless it stopped being starved
    before (room came, or its work went); and if nothing happened between (no event, no
    decision) and nothing comes at T, that pass takes room back for it. (Under ltrf and hltrf
    "b ... at 130" was a promise no pass kept until 250: the message now says from whom room
    may be taken.) ``attach`` it to the simulator, which tells it each step's events."""

    def __init__(self) -> None:
        self.promised: dict[str, tuple[float, float, bool]] = {}  # tenant -> (starved since, T, quiet since)
        self.events: list = []

    def attach(self, simulator: Simulator) -> Simulator:
        engine, step = simulator.engine, simulator.engine.step

        def recorded(time, events):
            self.events = list(events)
            return step(time, self.events)

        engine.step = recorded
        simulator.on_step = lambda engine, result: self(engine, result)
        return simulator

    def __call__(self, engine: Engine, result) -> None:
        from fairstream.core.explain import WaitReason, explain
        from fairstream.core.model import ReasonCode
        from fairstream.core.preemption import starved_past_timeout

        now, rule = engine.time, engine.preemption
        quiet_step = not self.events and not result.decisions
        for tenant, (since, due, quiet) in list(self.promised.items()):
            if due < now - 1e-9:
                raise AssertionError(f"{tenant} was told preemption takes room back for it at {due:g}; "
                                     f"no pass ran then (the next at {now:g}), though it stayed starved")
            if abs(due - now) < 1e-9:
                assert tenant in starved_past_timeout({tenant: since}, now, rule), (tenant, since, now)
                if quiet and not self.events:
                    assert any(d.tenant == tenant and d.code is ReasonCode.RECLAIMED for d in result.decisions), (
                        f"t={now:g}: {tenant} was told preemption takes room back for it now, nothing changed since, "
                        f"and the pass took none back for it: {[(d.kind.value, d.tenant, d.task) for d in result.decisions]}")
                del self.promised[tenant]
            elif engine.starved_since.get(tenant) != since:
                del self.promised[tenant]  # (room came, or its work went: no promise left)
            elif not quiet_step:
                self.promised[tenant] = (since, due, False)
        for tenant, entries in explain(engine).pending.items():
            for entry in entries:
                if entry.reason is WaitReason.PREEMPTION_PENDING and "preemption takes room back for it at" in entry.message:
                    since = engine.starved_since[tenant]
                    due = float(entry.message.rsplit(" at ", 1)[1])
                    assert abs(due - (since + rule.timeout)) < 1e-6, entry.message
                    self.promised.setdefault(tenant, (since, due, True))


@SETTINGS
@given(document=everything(), policy=st.sampled_from(PREEMPTING), reservation=st.sampled_from(["on", "off", "backfill"]))
def test_every_promise_that_preemption_takes_room_back_at_a_time_is_kept_at_that_time(document, policy, reservation):
    PromisedPreemption().attach(Simulator(parse_scenario(document), policy,
                                          params_for(policy, False, reservation))).run()


def _check_every_step(document: dict, policy: str, reservation: str, oracle) -> None:
    """Run ``document`` under ``policy`` with preemption and ``reservation``, holding every
    step's engine to ``oracle`` (an explanation oracle: it raises on a false one)."""
    Simulator(parse_scenario(document), policy, params_for(policy, False, reservation),
              on_step=lambda engine, result: oracle(engine)).run()


def test_the_reference_catches_a_fair_share_that_ignores_the_tree():
    # A test that cannot fail is a bug: a flat renormalisation (the old instantaneous share)
    # differs from the reference on eng {a, b idle} + ops.
    specs = {s.id: s for s in (TenantSpec("eng"), TenantSpec("a", parent="eng"), TenantSpec("b", parent="eng"),
                               TenantSpec("ops"))}
    want = oracle.fair_shares(specs, {"a": [100.0], "ops": [100.0]}, [100.0], 0, ["cpu"])
    assert want == pytest.approx({"a": 0.5, "b": 0.0, "ops": 0.5})
    weights = np.array([0.25, 0.0, 0.5])  # effective weights, b idle
    flat = weights / weights.sum()  # renormalised over the busy tenants: a 1/3, ops 2/3
    assert flat.tolist() != pytest.approx([want["a"], want["b"], want["ops"]])
