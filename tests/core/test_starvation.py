"""The engine's starvation watch (``Starvation`` in ``fairstream/core/starvation.py``): who is
starved since when under the preemption rule, and when a pass could next preempt though no
event arrives (``wake_at``)."""

from __future__ import annotations

import pytest

from fairstream.core.model import TaskCompleted
from fairstream.core.preemption import PreemptionRule
from fairstream.core.starvation import RECHECK_MIN, Starvation

from builders import engine, node, submit, tree


def crowded(timeout: float = 60.0):
    """A holds the whole node (4 of 4) from 0; B arrives at 10 with a task of 2: below half its
    fair share (1/2 of the node) with work the node could hold."""
    e = engine(tree("A", "B"), "drf", preemption="on", preemption_timeout=timeout)
    e.step(0.0, [node("n1", mem=4), *[submit(f"a{k}", "A") for k in range(4)]])
    e.step(10.0, [submit("b0", "B", mem=2)])
    return e


def test_a_tenant_below_the_threshold_with_work_a_node_could_hold_is_starved_since_then_until_served():
    e = crowded()
    assert e.starvation.since == {"B": 10.0}
    e.step(20.0, [])  # still starved: since stays 10, not 20
    assert e.starvation.since == {"B": 10.0}
    e.step(25.0, [TaskCompleted(25.0, "a0"), TaskCompleted(25.0, "a1")])  # room for b0: it runs, at its share
    assert e.starvation.since == {}


def test_the_next_wake_is_the_timeout_of_the_earliest_starved_tenant():
    e = crowded(timeout=60.0)
    assert e.wake_at() == 70.0  # 10 + 60
    assert engine(tree("A"), "drf").wake_at() is None  # no preemption rule: never


@pytest.mark.parametrize("victims, wake", [
    pytest.param(True, 100.0 + 5.0, id="past its timeout with a victim above its share: checked again a timeout later"),
    pytest.param(False, None, id="past its timeout and no tenant above its share: nothing to wait for"),
])
def test_a_tenant_starved_past_its_timeout_is_checked_again_only_while_victims_exist(victims, wake):
    watch = Starvation(PreemptionRule(threshold=0.5, timeout=5.0))
    watch.since, watch.victims_exist = {"B": 10.0}, victims
    assert watch.wake_at(100.0) == wake


def test_the_recheck_is_never_sooner_than_recheck_min():
    watch = Starvation(PreemptionRule(threshold=0.5, timeout=0.0))
    watch.since, watch.victims_exist = {"B": 10.0}, True
    assert watch.wake_at(100.0) == 100.0 + RECHECK_MIN
