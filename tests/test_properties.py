"""Invariants on random scenarios (hypothesis): no node is over-committed on any resource,
every placement respects its task's constraints, work-conserving policies leave no pending task
that fits somewhere, and the same input gives the same decisions."""

import heapq

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fairstream.engine import Engine
from fairstream.model import EPSILON, NodeHeartbeat, NodeLost, TaskCompleted, TaskState, TaskSubmitted
from fairstream.scenario import parse_scenario
from fairstream.simulator import Simulator

WORK_CONSERVING = ["fifo", "fair", "drf", "ltrf", "hltrf", "qknobler", "tetris", "tsf", "pmdrf", "drfh", "cdrf",
                   "perf", "flex"]
ALL = WORK_CONSERVING + ["static"]


@st.composite
def scenarios(draw):
    n_nodes = draw(st.integers(1, 4))
    nodes = [{"id": f"n{i}", "capacity": {"cpu": draw(st.integers(1, 8)), "mem": draw(st.integers(1, 8))},
              "labels": {"zone": draw(st.sampled_from("ab"))}} for i in range(n_nodes)]
    nested = draw(st.booleans())
    leaves = [f"u{i}" for i in range(draw(st.integers(1, 4)))]
    tenants = [{"id": "g0", "weight": draw(st.integers(1, 3))}, {"id": "g1", "weight": draw(st.integers(1, 3))}] if nested else []
    for i, leaf in enumerate(leaves):
        spec = {"id": leaf, "weight": draw(st.integers(1, 3))}
        if nested:
            spec["parent"] = f"g{i % 2}"
        tenants.append(spec)
    if nested and len(leaves) == 1:
        tenants = [t for t in tenants if t["id"] != "g1"]
    tasks = []
    for k in range(draw(st.integers(1, 25))):
        demand = {"cpu": draw(st.integers(0, 4)), "mem": draw(st.integers(1, 4))}
        task = {"id": f"t{k}", "job": f"j{k % 3}", "tenant": draw(st.sampled_from(leaves)),
                "submit": draw(st.integers(0, 10)), "duration": draw(st.integers(1, 5)), "demand": demand}
        kind = draw(st.sampled_from(["none", "none", "nodes", "labels"]))
        if kind == "nodes":
            task["constraints"] = {"nodes": draw(st.lists(st.sampled_from([n["id"] for n in nodes]), min_size=1, unique=True))}
        elif kind == "labels":
            task["constraints"] = {"labels": {"zone": draw(st.sampled_from("ab"))}}
        tasks.append(task)
    return {"resources": ["cpu", "mem"], "nodes": nodes, "tenants": tenants, "tasks": tasks}


def drive(document, policy, check, params=None, extra_events=()):
    """Run the engine over the scenario, calling ``check(engine)`` after every step; with
    ``extra_events`` ((time, event) pairs, such as a node lost) completions of tasks those
    sent back to the queue may be rejected."""
    sc = parse_scenario(document)
    engine = Engine(sc.resources, sc.tree, policy, params or {})
    heap = [(0.0, 0, i, NodeHeartbeat(0.0, n.id, n.capacity, n.labels)) for i, n in enumerate(sc.nodes)]
    heap += [(time, 0, -1 - i, event) for i, (time, event) in enumerate(extra_events)]
    heap += [(t.submit, 1, i, TaskSubmitted(t.submit, t.id, t.job, t.tenant, t.demand, t.constraints))
             for i, t in enumerate(sc.tasks)]
    heapq.heapify(heap)
    duration = {t.id: t.duration for t in sc.tasks}
    order = len(heap)
    while heap:
        now = heap[0][0]
        batch = []
        while heap and heap[0][0] == now:
            batch.append(heapq.heappop(heap)[3])
        result = engine.step(now, batch)
        assert not result.rejected or extra_events
        for d in result.decisions:
            order += 1
            heapq.heappush(heap, (now + duration[d.task], 0, order, TaskCompleted(now + duration[d.task], d.task)))
        check(engine)
    return engine


def no_overcommit_and_constraints_hold(engine):
    used = {n.id: np.zeros(len(engine.resources)) for n in engine.nodes}
    for task in engine.tasks.values():
        if task.state is TaskState.RUNNING:
            node = engine.nodes[engine.node_row[task.node]]
            assert task.constraints.allows(node.id, node.labels), f"{task.id} on {node.id} breaks its constraints"
            used[task.node] += task.demand
    for node in engine.nodes:
        assert (used[node.id] <= node.capacity + EPSILON).all(), f"{node.id} over-committed: {used[node.id]} > {node.capacity}"


def nothing_pending_fits(engine):
    free = {n.id: n.capacity - engine.used[engine.node_row[n.id]] for n in engine.nodes if n.alive}
    for task in engine.tasks.values():
        if task.state is TaskState.PENDING:
            for node in engine.nodes:
                if task.constraints.allows(node.id, node.labels):
                    assert not (task.demand <= free[node.id] + EPSILON).all(), f"{task.id} fits idle {node.id} but waits"


SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(document=scenarios(), policy=st.sampled_from(ALL))
def test_no_node_is_over_committed_and_every_placement_respects_its_constraints(document, policy):
    drive(document, policy, no_overcommit_and_constraints_hold)


@SETTINGS
@given(document=scenarios(), policy=st.sampled_from(WORK_CONSERVING))
def test_work_conserving_policies_leave_no_pending_task_that_fits(document, policy):
    drive(document, policy, nothing_pending_fits)


@SETTINGS
@given(document=scenarios(), policy=st.sampled_from(ALL))
def test_identical_input_gives_identical_decisions(document, policy):
    first = Simulator(parse_scenario(document), policy, {}).run()
    second = Simulator(parse_scenario(document), policy, {}).run()
    assert [d.to_json() for d in first.decisions] == [d.to_json() for d in second.decisions]


def test_the_checks_themselves_catch_an_over_committed_node():
    # A test that cannot fail is a bug: corrupt an engine's state and the check must notice.
    document = {"resources": ["cpu", "mem"], "nodes": [{"id": "n0", "capacity": {"cpu": 1, "mem": 1}}],
                "tasks": [{"id": "t", "tenant": "u", "submit": 0, "duration": 1, "demand": {"mem": 1}}]}

    def corrupt(engine):
        engine.nodes[0].capacity = np.zeros(2)
        no_overcommit_and_constraints_hold(engine)

    try:
        drive(document, "fifo", corrupt)
    except AssertionError as exc:
        assert "over-committed" in str(exc)
    else:
        raise AssertionError("the over-commit check did not fire")


def top_ups_from_scratch(engine, now):
    """Formula 15 summed task by task: ``demand * max(0, Q - (now - max(t_s, start)))`` over
    the running tasks, one row per tenant (no discount)."""
    acc = engine.accounting
    expected = np.zeros((len(acc.ledgers), len(engine.resources)))
    for task in engine.tasks.values():
        if task.state is TaskState.RUNNING:
            row = acc.row[task.tenant]
            elapsed = now - max(acc.round_start, task.running_entry.start)
            expected[row] += task.demand * max(0.0, acc.quantum(row) - elapsed)
    return expected


@SETTINGS
@given(document=scenarios(), quantum=st.sampled_from(["1", "2.5", "60"]), mode=st.sampled_from(["adaptive", "fixed"]),
       round_length=st.sampled_from(["inf", "4"]), lost_at=st.one_of(st.none(), st.integers(1, 12)))
def test_quantum_top_ups_kept_per_changed_tenant_equal_formula_15_summed_task_by_task(
        document, quantum, mode, round_length, lost_at):
    import pickle

    def check(engine):
        acc, now = engine.accounting, engine.time
        expected = top_ups_from_scratch(engine, now)
        assert np.allclose(acc.top_ups(None, now), expected, atol=1e-9)
        last = [len(acc.ledgers) - 1]
        assert np.allclose(acc.top_ups(last, now), expected[last], atol=1e-9)
        # Read later (a metrics sample between events), then at the engine's time again.
        assert np.allclose(acc.top_ups(None, now + 0.75), top_ups_from_scratch(engine, now + 0.75), atol=1e-9)
        assert np.allclose(acc.top_ups(None, now), expected, atol=1e-9)
        # What is kept per tenant is derived: an engine restored from a snapshot has the same.
        restored = pickle.loads(pickle.dumps(engine)).accounting
        assert np.allclose(restored.top_ups(None, now), expected, atol=1e-9)

    lost = [(float(lost_at), NodeLost(float(lost_at), "n0"))] if lost_at is not None else []
    drive(document, "ltrf", check, {"quantum": quantum, "quantum_mode": mode, "round": round_length}, lost)
