"""Task Share Fairness under placement constraints (Wang, Li, Liang and Li, SIGMETRICS'16):
the paper's toy example and the engine's handling of constraints."""

from collections import Counter
from fractions import Fraction

import numpy as np
import pytest

from fairstream.core.fairness import monopoly_tasks
from fairstream.core.model import DecisionKind
from tests.builders import engine, node, submit, tree

# Figure 1: m1 and m3 are <9 CPU, 12 GB>, m2 is <3, 4>. j1's tasks <1, 2> may not run on m3;
# j2's <3, 1> only on m2; j3's <1, 4> anywhere.
MACHINES = {"m1": {"cpu": 9, "mem": 12}, "m2": {"cpu": 3, "mem": 4}, "m3": {"cpu": 9, "mem": 12}}
JOBS = {"j1": ({"cpu": 1, "mem": 2}, {"nodes": ["m1", "m2"]}),
        "j2": ({"cpu": 3, "mem": 1}, {"nodes": ["m2"]}),
        "j3": ({"cpu": 1, "mem": 4}, None)}


def toy_pass(policy, tasks=20, order=("j1", "j2", "j3")):
    e = engine(tree(*order), policy, ("cpu", "mem"))
    events = [node(name, **capacity) for name, capacity in MACHINES.items()]
    for job in order:
        demand, constraints = JOBS[job]
        events += [submit(f"{job}-{i}", job, constraints=constraints, **demand) for i in range(tasks)]
    result = e.step(0.0, events)
    return Counter(d.tenant for d in result.decisions if d.kind is DecisionKind.PLACE), result.decisions


def test_h_is_the_tasks_a_job_could_run_alone_on_the_whole_cluster_without_constraints():
    capacities = np.array([[9.0, 12.0], [3.0, 4.0], [9.0, 12.0]])
    # j1 <1, 2>: 6 on m1, 2 on m2, 6 on m3 = 14; j2 <3, 1>: 3 + 1 + 3 = 7; j3 <1, 4>: 3 + 1 + 3 = 7.
    assert [monopoly_tasks(np.array(d), capacities) for d in ([1, 2], [3, 1], [1, 4])] == [14, 7, 7]


@pytest.mark.parametrize("order", [("j1", "j2", "j3"), ("j3", "j2", "j1"), ("j2", "j3", "j1")],
                         ids=lambda order: "jobs arriving " + ", ".join(order))
def test_the_toy_example_runs_6_1_and_3_tasks_with_task_shares_3_7_1_7_and_3_7(order):
    placed, decisions = toy_pass("tsf", order=order)
    assert dict(placed) == {"j1": 6, "j2": 1, "j3": 3}
    shares = {job: Fraction(placed[job], h) for job, h in (("j1", 14), ("j2", 7), ("j3", 7))}
    assert shares == {"j1": Fraction(3, 7), "j2": Fraction(1, 7), "j3": Fraction(3, 7)}
    nodes = {(d.tenant, d.node) for d in decisions if d.kind is DecisionKind.PLACE}
    assert nodes == {("j1", "m1"), ("j2", "m2"), ("j3", "m3")}  # as in the paper's Figure 1


def test_drf_on_the_toy_example_lets_j3_take_room_j1_cannot_get_back():
    # DRF with first fit: j3 lands on m1, which j1 needs; j1 ends below its TSF share.
    placed, _ = toy_pass("drf")
    assert placed["j1"] < 6


# ---------------------------------------------------------------------------------------------
# The rules themselves in the paper's model (divisible tasks), by brute force on small instances:
# every allocation is computed by progressive filling (a linear program per level) and every
# property is checked exactly, strategy-proofness by trying each lie a job could tell.


def small_instances(seed: int, count: int, random_pools: bool):
    import random

    rng = random.Random(seed)
    for _ in range(count):
        machines, jobs = rng.randint(1, 3), rng.randint(2, 3)
        capacity = np.array([[rng.randint(1, 10), rng.randint(1, 10)] for _ in range(machines)], float)
        demands = np.array([[rng.randint(1, 4), rng.randint(1, 4)] for _ in range(jobs)], float)
        allowed = np.array([[rng.random() < 0.7 for _ in range(machines)] for _ in range(jobs)])
        for i in range(jobs):
            if not allowed[i].any():
                allowed[i, rng.randrange(machines)] = True
        pools = np.array([[rng.random() for _ in range(machines)] for _ in range(jobs)]) if random_pools else \
            np.full((jobs, machines), 1.0 / jobs)
        yield capacity, demands, allowed, pools / pools.sum(axis=0)


def failures(rule: str) -> dict[str, str]:
    from fairstream.lab.divisible import violations

    found: dict[str, str] = {}
    for random_pools in (False, True):
        for capacity, demands, allowed, pools in small_instances(3, 40, random_pools):
            for name, why in violations(rule, capacity, demands, allowed, pools).items():
                found.setdefault(name, why)
    return found


@pytest.mark.parametrize("rule, fails", [
    # The paper's Table 1: TSF has all four properties (with Theorem 1's weights w_i = k_i / h_i).
    pytest.param("tsf", set(), id="TSF: sharing incentive, envy-freeness, Pareto optimality, strategy-proofness"),
    # Per-machine DRF: strategy-proof and envy-free, not sharing-incentive (with unequal pools),
    # not Pareto optimal (a job takes its DRF share on every machine it may use).
    pytest.param("pmdrf", {"SI", "PO"}, id="per-machine DRF fails sharing incentive and Pareto optimality"),
    # DRFH: strategy-proof, envy-free, Pareto optimal; not sharing-incentive under constraints.
    pytest.param("drfh", {"SI"}, id="DRFH fails sharing incentive only"),
    # CDRF: Table 1 gives it SI and PO, not SP, not EF. Under our reading of CDRF (the poster does
    # not define it; docs/tsf.md) it also fails SI: a job confined to few machines counts as rich.
    pytest.param("cdrf", {"SP", "EF", "SI"}, id="CDRF fails strategy-proofness and envy-freeness (and SI as we read it)"),
])
@pytest.mark.slow
def test_each_rule_breaks_exactly_the_properties_table_1_says_with_a_counterexample(rule, fails):
    found = failures(rule)
    assert set(found) == fails, found
    assert all(why for why in found.values())  # each failure comes with its counterexample


def test_the_divisible_rules_reproduce_the_toy_example():
    from fairstream.lab.divisible import allocate

    capacity = np.array([[9.0, 12.0], [3.0, 4.0], [9.0, 12.0]])
    demands = np.array([[1.0, 2.0], [3.0, 1.0], [1.0, 4.0]])
    allowed = np.array([[True, True, False], [False, True, False], [True, True, True]])
    # The toy example is unweighted TSF (all weights 1).
    x = allocate("tsf", capacity, demands, allowed, fixed_weights=np.ones(3))
    assert x.sum(axis=1) == pytest.approx([6, 1, 3])


def test_tsf_follows_nodes_that_join_leave_and_change_labels():
    e = engine(tree("A", "B"), "tsf", ("cpu", "mem"))
    gpu = {"labels": {"gpu": "yes"}}
    first = e.step(0.0, [node("m1", cpu=2, mem=2, labels={"gpu": "yes"}), node("m2", cpu=2, mem=2, labels={}),
                         submit("a1", "A", constraints=gpu, cpu=1, mem=1), submit("b1", "B", cpu=1, mem=1)])
    # B goes where A cannot: m2 is the least contended node it may use.
    assert {(d.task, d.node) for d in first.decisions} == {("a1", "m1"), ("b1", "m2")}
    # m1 loses its label: A's next task fits no node it may use, and says so.
    second = e.step(1.0, [node("m1", 1.0, cpu=2, mem=2, labels={}), submit("a2", "A", constraints=gpu, cpu=1, mem=1)])
    assert [(d.task, d.kind) for d in second.decisions] == [("a2", DecisionKind.UNSCHEDULABLE)]
    # m2 gains the label: a2 runs there; B's new task goes to m1, which A may no longer use.
    third = e.step(2.0, [node("m2", 2.0, cpu=2, mem=2, labels={"gpu": "yes"}), submit("b2", "B", cpu=1, mem=1)])
    assert {(d.task, d.node) for d in third.decisions} == {("a2", "m2"), ("b2", "m1")}


def test_with_dedicated_pools_every_tenant_runs_at_least_what_its_pool_would():
    # One machine <10, 10>; A <1, 1> was promised 20 % of it (k_A = 2), B <2, 2> 80 % (k_B = 4).
    # Plain TSF equalises x/h (h_A = 10, h_B = 5): A 4, B 3, below B's pool. With Theorem 1's
    # weights the key is x/k: A 2, B 4, exactly the pools, and nothing is left.
    def run(**params):
        e = engine(tree("A", "B"), "tsf", ("cpu", "mem"), **params)
        events = [node("m", cpu=10, mem=10)]
        events += [submit(f"a{i}", "A", cpu=1, mem=1) for i in range(20)]
        events += [submit(f"b{i}", "B", cpu=2, mem=2) for i in range(20)]
        return Counter(d.tenant for d in e.step(0.0, events).decisions)

    assert run()["B"] < 4
    assert dict(run(pools="A:0.2,B:0.8")) == {"A": 2, "B": 4}


@pytest.mark.parametrize("pools, message", [
    ("A:0.7,B:0.7", "more than the cluster"),
    ("A", "expected tenant:fraction"),
    ("A:0", "a pool is a fraction in (0, 1]"),
])
def test_bad_pools_are_named_in_one_line(pools, message):
    import re

    from fairstream.core.model import ModelError

    with pytest.raises(ModelError, match=re.escape(message)):
        engine(tree("A", "B"), "tsf", ("cpu", "mem"), pools=pools)


def test_tasks_running_from_earlier_passes_count_in_the_task_share():
    # One node <4 cpu, 8 GB>; tasks <1, 1>, so h = 4 for both tenants. A runs 3 tasks from t=0;
    # at t=1 A and B each ask for one more and one slot is free. Task shares: A 3/4, B 0/4: B
    # goes first (counting only this pass's placements, both would be 0 and A, earlier, would).
    e = engine(tree("A", "B"), "tsf", ("cpu", "mem"))
    e.step(0.0, [node("n0", cpu=4, mem=8)] + [submit(f"a{i}", "A", cpu=1, mem=1) for i in range(3)])
    result = e.step(1.0, [submit("a3", "A", cpu=1, mem=1), submit("b0", "B", cpu=1, mem=1)])
    assert [(d.tenant, d.task) for d in result.decisions if d.kind is DecisionKind.PLACE] == [("B", "b0")]
