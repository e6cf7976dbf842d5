"""LTRF paper (ICS'14) Table 1 and TSC Table 1: 100 resources, users A and B with equal shares
of 50; new demands at t1..t4 are A: 20, 40, 80, 60 and B: 100, 60, 50, 50; every task uses one
unit for one time unit. Unmet demand carries over to the next step."""

import pytest

from builders import UnitTaskRun, engine, node, tree

NEW_DEMAND = [{"A": 20, "B": 100}, {"A": 40, "B": 60}, {"A": 80, "B": 50}, {"A": 60, "B": 50}]


def run(policy: str, **params):
    e = engine(tree("A", "B"), policy, **params)
    e.step(0, [node("n1", mem=100)])
    runner = UnitTaskRun(e)
    allocations = []
    for t, demand in enumerate(NEW_DEMAND, start=1):
        got = runner.step(t, demand)
        allocations.append((got["A"], got["B"]))
    snapshot = e.snapshot()
    totals = tuple(round(float(snapshot.accumulated[snapshot.rows[u], 0]), 6) for u in ("A", "B"))
    return allocations, totals


@pytest.mark.parametrize(
    "policy, params, allocations, totals",
    [
        pytest.param(
            # (a) MLRF: at t3 and t4 A only gets its share of 50 although B was lent 40 before;
            # totals 20+40+50+50 = 160 for A, 80+60+50+50 = 240 for B.
            "fair", {}, [(20, 80), (40, 60), (50, 50), (50, 50)], None,
            id="memoryless fair sharing lends A's unused resources and never pays them back (Table 1a)",
        ),
        pytest.param(
            # (b) LTRF: at t3 A (total 60) is served before B (total 140) until it has all 80;
            # at t4 A (140) catches up with B (160): both end at 200.
            "ltrf", {"quantum": 1, "quantum_mode": "fixed"}, [(20, 80), (40, 60), (80, 20), (60, 40)], (200.0, 200.0),
            id="long-term fairness pays back what A lent, totals end equal at 200 each (Table 1b)",
        ),
        pytest.param(
            # (c) eta = 0.5: B's 80 at t1 counts 50 + 30*0.5 = 65; A's 80 at t3 counts 65;
            # counted totals A 20+40+65+55 = 180, B 65+55+20+40 = 180; real allocations as in (b).
            "ltrf", {"quantum": 1, "quantum_mode": "fixed", "discount": 0.5},
            [(20, 80), (40, 60), (80, 20), (60, 40)], (180.0, 180.0),
            id="with discount 0.5 resources beyond the share count half, counted totals 180 each (Table 1c)",
        ),
    ],
)
def test_table1(policy, params, allocations, totals):
    got_allocations, got_totals = run(policy, **params)
    assert got_allocations == allocations
    if totals is not None:
        assert got_totals == totals


def test_memoryless_totals_are_160_and_240():
    # Table 1a's Total column at t4, counted as plain integrals of the allocation.
    e = engine(tree("A", "B"), "ltrf", quantum=1, quantum_mode="fixed")
    e.step(0, [node("n1", mem=100)])
    # Replay the MLRF allocations through the accounting only: ltrf's ledger counts any policy.
    fair = engine(tree("A", "B"), "fair")
    fair.step(0, [node("n1", mem=100)])
    runner = UnitTaskRun(fair)
    for t, demand in enumerate(NEW_DEMAND, start=1):
        runner.step(t, demand)
    fair.step(5, [])
    raw = fair.accounting.raw_usage
    assert (raw[fair.accounting.row["A"], 0], raw[fair.accounting.row["B"], 0]) == (160.0, 240.0)


@pytest.mark.parametrize("nodes, arrives, until, fair_part_of_a", [
    # Fair: B alone for `arrives` s, then half each: A's part = (until - arrives) / (2 until).
    # 25 nodes, A from 300 s to 900 s: 600 / 1800 = 1/3 (the demo's shape, at half its size).
    pytest.param(25, 300.0, 900.0, 1 / 3, id="B alone for a third of the window: fair leaves A a third, ltrf half"),
    # 10 nodes, A from 100 s to 900 s: 800 / 1800 = 4/9.
    pytest.param(10, 100.0, 900.0, 4 / 9, id="B alone for a ninth of the window: fair leaves A four ninths, ltrf half"),
])
def test_table1_at_cluster_scale_fair_keeps_what_b_was_lent_and_ltrf_pays_it_back(nodes, arrives, until, fair_part_of_a):
    # LTRF (F-LTMM): A gets everything from `arrives` until the totals meet, then half: at
    # `until` both have half of what the cluster served, as Table 1(b)'s 200/200.
    from fairstream.sim.simulator import Simulator
    from fairstream.sim.traces.come_and_go import come_and_go

    scenario = come_and_go(nodes=nodes, a_arrives=arrives, contended_until=until)
    parts = {}
    for policy in ("fair", "ltrf"):
        used = Simulator(scenario, policy, {}, progress=False).run().metrics.accumulated_at(until)
        parts[policy] = used["A"] / (used["A"] + used["B"])
    assert parts["fair"] == pytest.approx(fair_part_of_a, abs=0.005)
    assert parts["ltrf"] == pytest.approx(0.5, abs=0.005)
