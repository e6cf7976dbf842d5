"""Task Share Fairness under placement constraints (Wang, Li, Liang and Li, SIGMETRICS'16):
the paper's toy example and the engine's handling of constraints."""

from collections import Counter
from fractions import Fraction

import numpy as np
import pytest

from fairstream.fairness import monopoly_tasks
from fairstream.model import DecisionKind
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
