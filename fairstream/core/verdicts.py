"""The engine's part that judges pending tasks no live node could ever hold.

A task that no live node its constraints allow could hold even when idle is reported once
with an ``UNSCHEDULABLE`` decision (``no_matching_node`` or ``too_large``) and asks for no fair
share while it stays so (``waiting_demand``). New tasks are judged at the end of the instant's
events; when the set of nodes changes (a node joins, is lost, changes capacity or labels), every
pending task is judged again. Verdicts are kept per task shape (interned demand and
constraints, ``Workload.shape_of``) until the nodes change: most tasks share a few shapes, so
judging a new task is usually a lookup.
"""

from __future__ import annotations

import numpy as np

from fairstream.core.model import (
    EPSILON,
    Constraints,
    Decision,
    DecisionKind,
    ReasonCode,
    ResourceSpace,
    Task,
    TaskState,
    tasks_fitting,
)
from fairstream.core.nodes import Nodes
from fairstream.core.workload import Workload

Verdict = tuple[ReasonCode, str]


class Verdicts:
    """Which pending tasks are unschedulable, which to judge next, and the verdict per shape."""

    def __init__(self) -> None:
        self.unschedulable: set[str] = set()  # ids of tasks (and requests) reported unschedulable
        self.to_check: list[Task] = []  # new tasks, judged at the end of the instant's events
        self.nodes_changed = False  # then every pending task is judged again
        self.by_shape: dict[int, Verdict | None] = {}  # valid until the nodes change

    def verdict(self, shape: int) -> Verdict | None:
        """Why no live node could ever hold a task of ``shape`` (as last judged), or None."""
        return self.by_shape.get(shape)

    def reason(self, shape: int) -> str | None:
        """The text of ``shape``'s verdict (its ``unschedulable`` decision's reason), or None if
        a live node could hold it (or it was not judged: no live node yet)."""
        verdict = self.by_shape.get(shape)
        return None if verdict is None else verdict[1]

    def report(self, time: float, workload: Workload, registry: Nodes, resources: ResourceSpace,
               policy: str) -> list[Decision]:
        """An ``UNSCHEDULABLE`` decision for each pending task that fits no live node its
        constraints allow even when idle: new tasks, or all pending ones when nodes changed.
        A task that some node could hold again asks for a share again (no decision)."""
        if not self.to_check and not self.nodes_changed:
            return []
        live = np.flatnonzero(registry.alive)
        if not len(live):  # no cluster yet: judge when the first node arrives
            self.to_check.clear()
            return []
        if self.nodes_changed:
            candidates = [t for t in workload.tasks.values() if t.state is TaskState.PENDING]
            candidates += workload.requests.values()
            self.by_shape.clear()
        else:
            candidates = [t for t in self.to_check if t.state is TaskState.PENDING]
        self.to_check.clear()
        self.nodes_changed = False
        capacity = registry.capacity[live]
        verdicts = self.by_shape
        decisions = []
        for task in sorted(candidates, key=lambda t: t.seq):
            if task.shape not in verdicts:
                verdicts[task.shape] = _why_unschedulable(task, live, capacity, registry, resources)
            why = verdicts[task.shape]
            if why is None:
                self.unschedulable.discard(task.id)
            elif task.id not in self.unschedulable:
                self.unschedulable.add(task.id)
                code, text = why
                decisions.append(Decision(time, task.id, task.job, task.tenant, "", task.demand_map,
                                          policy, text, code, DecisionKind.UNSCHEDULABLE, task.count))
        return decisions

    def waiting_demand(self, pending: np.ndarray, workload: Workload, rows: dict[str, int]) -> np.ndarray:
        """``pending`` (per tenant row, the summed demand of its pending tasks) less what the
        tasks judged unschedulable ask for: a task no node can ever hold asks for no share.
        A fresh array, or ``pending`` itself when none is."""
        if not self.unschedulable:
            return pending
        pending = pending.copy()
        for task_id in self.unschedulable:
            task = workload.tasks.get(task_id) or workload.requests.get(task_id)
            if task is not None and task.state is TaskState.PENDING:
                pending[rows[task.tenant]] -= task.demand * task.count
        return np.maximum(pending, 0.0, out=pending)


def allowed(constraints: Constraints, registry: Nodes, rows: np.ndarray | range) -> np.ndarray:
    """Per node row of ``rows`` (an array of rows, or a range): do ``constraints`` allow it?"""
    if constraints.nodes is None and not constraints.labels:
        return np.ones(len(rows), dtype=bool)  # (every node: no walk)
    ids, labels = registry.ids, registry.labels
    return np.array([constraints.allows(ids[r], labels[r]) for r in rows], dtype=bool)


def _why_never_whole(task: Task, capacity: np.ndarray) -> Verdict | None:
    """Why gang ``task`` could never start whole on the idle live nodes it may use (``capacity``,
    one row each): together they hold fewer of its tasks than its size; None if they hold it."""
    asked = task.demand > EPSILON
    if not asked.any():
        return None
    each = tasks_fitting(capacity, task.demand)
    if task.constraints.max_per_node is not None:
        each = np.minimum(each, task.constraints.max_per_node)
    most = int(each.sum())
    if most >= task.gang:
        return None
    return (ReasonCode.TOO_LARGE, f"unschedulable: gang of {task.gang} ({task.demand_map} each) never starts whole: "
                                  f"the {len(capacity)} live nodes it may use hold at most {most} of its tasks at once")


def _why_unschedulable(task: Task, live: np.ndarray, capacity: np.ndarray, registry: Nodes,
                       resources: ResourceSpace) -> Verdict | None:
    eligible = allowed(task.constraints, registry, live)
    if not eligible.any():
        return (ReasonCode.NO_MATCHING_NODE,
                f"unschedulable: no live node matches its constraints {task.constraints.to_json()}")
    large = (capacity[eligible] >= task.demand - EPSILON).all(axis=1)
    if large.any():
        return None if not task.gang else _why_never_whole(task, capacity[eligible])
    biggest = resources.as_dict(capacity[eligible].max(axis=0))
    return (ReasonCode.TOO_LARGE, f"unschedulable: none of the {int(eligible.sum())} live nodes it may use is "
                                  f"large enough (needs {task.demand_map}; largest per resource {biggest})")


__all__ = ["Verdicts", "Verdict", "allowed"]
