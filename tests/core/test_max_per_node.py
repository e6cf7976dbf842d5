"""A maximum of a job's tasks per node (``constraints.max_per_node``): worked cases.

The rule: a task with ``max_per_node: m`` goes only to a node where its job (same tenant, same
job id) runs fewer than ``m`` tasks, counting every running task of the job there and those the
same pass placed before it. It composes with the other features (the property tests in
tests/core/test_properties.py and tests/core/test_oracle.py check it with every feature on); these are the
cases an operator would work out by hand.
"""

from __future__ import annotations

import dataclasses

import pytest

from fairstream.core.engine import PolicyViolation
from fairstream.core.explain import WaitReason, explain
from fairstream.core.model import Decision, DecisionKind, ReasonCode, TaskCompleted, TaskSubmitted

from builders import engine, node, tree


def request(task: str, tenant: str, count: int, job: str, time: float = 0.0, estimate: float | None = None,
            **constraints) -> TaskSubmitted:
    """``count`` tasks of 1 GB of ``tenant``'s ``job``, with ``constraints`` (max_per_node=...)."""
    return TaskSubmitted(time, task, job, tenant, {"mem": 1}, constraints or None, count if count > 1 else None,
                         estimate)


def placed_on(decisions) -> dict[str, list[str]]:
    """Node -> the tasks placed there, in order."""
    out: dict[str, list[str]] = {}
    for d in decisions:
        if d.kind is DecisionKind.PLACE:
            out.setdefault(d.node, []).extend(d.tasks or (d.task,))  # (a request's tasks on one node: one decision)
    return out


NODES = [node("n0", mem=8), node("n1", mem=8), node("n2", mem=8)]

# (events at time 0 after three nodes of 8 GB, what goes where, tasks left waiting)
CASES = [
    pytest.param([request("web", "A", 5, "web", max_per_node=1)],
                 {"n0": ["web-0"], "n1": ["web-1"], "n2": ["web-2"]}, 2,
                 id="max_per_node 1 puts each task of its job on a different node and the rest wait"),
    pytest.param([request("web", "A", 5, "web", max_per_node=2)],
                 {"n0": ["web-0", "web-1"], "n1": ["web-2", "web-3"], "n2": ["web-4"]}, 0,
                 id="max_per_node 2 fills each node with two, first fit"),
    pytest.param([request("plain", "A", 1, "web"), request("web", "A", 3, "web", max_per_node=1)],
                 {"n0": ["plain"], "n1": ["web-0"], "n2": ["web-1"]}, 1,
                 id="the job's tasks without the limit count against the one with it"),
    pytest.param([request("a", "A", 3, "ja", max_per_node=1), request("b", "A", 3, "jb", max_per_node=1)],
                 {"n0": ["a-0", "b-0"], "n1": ["a-1", "b-1"], "n2": ["a-2", "b-2"]}, 0,
                 # Same demand and constraints, different jobs: each job has every node to itself.
                 id="another job's tasks of the same shape do not count"),
    pytest.param([request("x", "A", 2, "x", max_per_node=1), request("y", "B", 2, "x", max_per_node=1)],
                 {"n0": ["x-0", "y-0"], "n1": ["x-1", "y-1"]}, 0,
                 id="another tenant's job of the same name does not count"),
]


@pytest.mark.parametrize("events, where, waiting", CASES)
def test_a_job_runs_at_most_max_per_node_tasks_on_one_node(events, where, waiting):
    e = engine(tree("A", "B"), "fifo")
    decisions = e.step(0, [*NODES, *events]).decisions
    assert placed_on(decisions) == where
    assert sum(q.count for q in e.pending.values()) == waiting


def test_a_task_that_ends_frees_its_node_for_the_next_task_of_its_job():
    e = engine(tree("A"), "fifo")
    e.step(0, [*NODES, request("web", "A", 4, "web", max_per_node=1)])
    # web-3 waits: each node runs one task of web. web-1 ends on n1: web-3 goes there.
    assert placed_on(e.step(1, [TaskCompleted(1, "web-1")]).decisions) == {"n1": ["web-3"]}


def test_a_task_held_by_its_jobs_limit_says_so_and_is_not_said_to_wait_for_room():
    e = engine(tree("A"), "drf")
    e.step(0, [*NODES, request("web", "A", 4, "web", max_per_node=1)])
    [entry] = explain(e).pending["A"]
    assert (entry.first, entry.reason) == ("web-3", WaitReason.MAX_PER_NODE)
    assert entry.message == ("3 nodes its constraints allow have room for it, but job web runs its max_per_node 1 "
                             "task on each: it waits for room on another node or for one of those tasks to end")


def test_a_node_is_not_reserved_for_a_task_where_its_job_runs_its_most():
    # n0 and n1 hold 4 GB. A's job j runs j0 (3 GB) on n0; B's two 2-GB tasks fill n1. A's j1
    # (3 GB, max 1 per node) fits nowhere: n0 lacks 2 GB and n1 lacks 3, so the node that
    # "lacks least" is n0, but j runs its one task there: room kept on n0 could never take j1.
    e = engine(tree("A", "B"), "drf", reservation="on")
    e.step(0, [node("n0", mem=4), node("n1", mem=4),
               TaskSubmitted(0, "j0", "j", "A", {"mem": 3}, {"max_per_node": 1})])
    e.step(1, [TaskSubmitted(1, "b0", "b", "B", {"mem": 2}), TaskSubmitted(1, "b1", "b", "B", {"mem": 2})])
    e.step(2, [TaskSubmitted(2, "j1", "j", "A", {"mem": 3}, {"max_per_node": 1})])
    assert e.reservation is not None and e.nodes[e.reservation.node].id == "n1"


def test_a_task_held_only_by_its_jobs_limit_gets_no_reservation():
    # B's task fills n0; j-0 goes to n1. j-1 would fit n1's free room, but j runs its one task
    # there. j-1 is not short of room, its job's limit holds it: no node is kept for it (n0's
    # room, kept when b ends, would stay idle for a task that could have run on n1 but for
    # its own job).
    e = engine(tree("A", "B"), "drf", reservation="on")
    e.step(0, [node("n0", mem=4), node("n1", mem=8), TaskSubmitted(0, "b", "b", "B", {"mem": 4})])
    e.step(1, [request("j", "A", 2, "j", 1, max_per_node=1)])
    assert e.pending["A"].count == 1 and e.reservation is None


def test_backfill_does_not_put_a_task_on_the_reserved_node_where_its_job_runs_its_most():
    # Found by the property test (tests/core/test_oracle.py): B's 4-GB task has n0 reserved, until
    # A's j0 ends at 10 by its estimate. A's j1 (estimate 1: it would end at 2) fits the room
    # left there and would backfill, but j already runs its one task per node on n0.
    e = engine(tree("A", "B"), "drf", reservation="backfill")
    e.step(0, [node("n0", mem=4), TaskSubmitted(0, "j0", "j", "A", {"mem": 1}, {"max_per_node": 1}, None, 10.0)])
    e.step(0, [TaskSubmitted(0, "big", "big", "B", {"mem": 4}, None, None, 10.0)])
    assert e.reservation is not None
    decisions = e.step(1, [TaskSubmitted(1, "j1", "j", "A", {"mem": 1}, {"max_per_node": 1}, None, 1.0)]).decisions
    assert placed_on(decisions) == {}
    [entry] = explain(e).pending["A"]
    assert entry.reason is WaitReason.MAX_PER_NODE


def test_the_engine_refuses_a_policy_that_breaks_the_limit():
    # The engine checks every decision against its own view (fairstream.core.engine, "check").
    e = engine(tree("A"), "fifo")
    e.step(0, [node("n0", mem=8), request("j", "A", 1, "j", max_per_node=1)])

    def two_on_n0(snapshot, params):
        return [Decision(1.0, "k", "j", "A", "n0", {"mem": 1.0}, "fifo", "test", ReasonCode.ARRIVAL_ORDER)]

    e.spec = dataclasses.replace(e.spec, decide=two_on_n0)
    with pytest.raises(PolicyViolation, match="where job j already runs its max_per_node 1"):
        e.step(1, [TaskSubmitted(1, "k", "j", "A", {"mem": 1}, {"max_per_node": 1})])


@pytest.mark.parametrize("raw, expected", [
    pytest.param({"max_per_node": 2}, {"max_per_node": 2}, id="a whole number is kept"),
    pytest.param({"max_per_node": 2.0}, {"max_per_node": 2}, id="JSON's 2.0 is the whole number 2"),
    pytest.param({"labels": {"zone": "a"}, "max_per_node": 1}, {"labels": {"zone": "a"}, "max_per_node": 1},
                 id="it composes with labels"),
])
def test_max_per_node_reads_and_writes_back(raw, expected):
    from fairstream.core.model import Constraints

    constraints = Constraints.from_json(raw)
    assert constraints.to_json() == expected and not constraints.empty
    assert constraints.allows("any-node", {"zone": "a"})  # (the count is placement's, not a node's property)


@pytest.mark.parametrize("value", [0, -1, 1.5, True, "2"])
def test_a_max_per_node_that_is_not_a_whole_number_from_1_is_refused(value):
    e = engine(tree("A"), "fifo")
    result = e.step(0, [node("n0", mem=8), TaskSubmitted(0, "t", "j", "A", {"mem": 1}, {"max_per_node": value})])
    assert len(result.rejected) == 1 and "constraints.max_per_node: must be a whole number >= 1" in result.rejected[0][1]
