"""What an event or a decision does to the engine's parts: the state transitions of a step.

``core/admission.py`` says whether an event may apply (and what it means: its demand, its
constraints, its node's capacity); the functions here apply it, each to the parts it changes
(``Engine``'s ``workload``, ``registry``, ``accounting``, ``jobs``, ``verdicts``, ``changes``,
``reservations``). ``apply_event`` takes the events of a step, ``start`` and ``preempt`` a
pass's decisions, each checked against the engine's own view first: a policy's decision that
would break an invariant raises ``PolicyViolation`` (a bug, never input).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fairstream.core.admission import EventRejected, admit
from fairstream.core.jobs import orders_jobs
from fairstream.core.model import (
    EPSILON,
    Decision,
    DecisionKind,
    Event,
    Node,
    NodeHeartbeat,
    NodeLost,
    ReasonCode,
    Task,
    TaskCompleted,
    TaskState,
    TaskSubmitted,
    TenantsChanged,
    subtract_floored,
)

if TYPE_CHECKING:
    import numpy as np

    from fairstream.core.engine import Engine


class PolicyViolation(RuntimeError):
    """A policy returned a decision that would break an invariant (a bug, never input)."""


@dataclass
class StepResult:
    decisions: list[Decision] = field(default_factory=list)
    rejected: list[tuple[Event, str]] = field(default_factory=list)
    finished: list[Task] = field(default_factory=list)


def apply_event(engine: Engine, event: Event, result: StepResult) -> None:
    """Apply one event of a step (``ModelError`` if admission rejects it: nothing changed);
    a completion's task goes to ``result.finished``, a lost node's requeues to its decisions."""
    if isinstance(event, TaskSubmitted):
        _submit(engine, event)
    elif isinstance(event, TaskCompleted):
        result.finished.append(_complete(engine, event))
    elif isinstance(event, NodeHeartbeat):
        _heartbeat(engine, event)
    elif isinstance(event, NodeLost):
        result.decisions.extend(_lose(engine, event))
    elif isinstance(event, TenantsChanged):
        _configure(engine, event)
    else:  # pragma: no cover - the type union is closed
        raise EventRejected(f"unknown event type {type(event).__name__}")


def _configure(engine: Engine, event: TenantsChanged) -> None:
    """Apply a new tenant tree: accumulated usage, quanta and running tasks are kept; new
    leaves get accounting of their own; every share is computed again."""
    old = engine.tree
    engine.tree = admit(engine, event)
    engine.jobs.retrack(engine.tree, old, engine.workload.running())
    for leaf in engine.tree.leaves:
        engine.accounting.add_tenant(leaf, engine.tree.path(leaf))
        engine.accounting.quanta.initialise(engine.tree.path(leaf))
    engine.refresh_shares()
    engine.changes.touched.update(engine.workload.pending)  # every tenant's key may have moved: all are candidates


def _submit(engine: Engine, event: TaskSubmitted) -> Task:
    demand, constraints = admit(engine, event)
    if engine.tree.ensure_leaf(event.tenant):
        engine.accounting.add_tenant(event.tenant, engine.tree.path(event.tenant))
        engine.refresh_shares()  # at once: the new tenant's PAR below reads shares
    task = engine.workload.submit(event, demand, constraints, engine.resources.as_dict(demand))
    engine.verdicts.to_check.append(task)
    engine.changes.touched.add(task.tenant)
    engine.changes.fresh.add(task.shape)
    engine.accounting.on_submit(engine.accounting.row[task.tenant], demand, event.time, task.count)
    return task


def _complete(engine: Engine, event: TaskCompleted) -> Task:
    admit(engine, event)
    task = engine.workload.finish(event.task, event.time)
    if task is None:  # a task of a pending request, killed or failed before it ran
        request, task, retired = engine.workload.cancel_in_request(event.task, event.time)
        if retired:
            engine.verdicts.unschedulable.discard(request.id)
        engine.accounting.on_cancel_pending(engine.accounting.row[request.tenant], request.demand)
        engine.jobs.left(request.tenant, request.job)
        return task
    row = engine.accounting.row[task.tenant]
    engine.verdicts.unschedulable.discard(task.id)
    if task.state is TaskState.PENDING:
        # Killed (or failed) before it ever ran: it leaves the queue.
        task.state = TaskState.DONE
        engine.workload.dequeue(task)
        engine.accounting.on_cancel_pending(row, task.demand)
        engine.jobs.left(task.tenant, task.job)
        return task
    node = engine.registry.row[task.node]
    subtract_floored(engine.registry.storage_used[node], task.demand_values)
    _running_changed(engine, node, task, started=False)
    engine.changes.grown.add(node)
    engine.changes.touched.add(task.tenant)
    task.state = TaskState.DONE
    engine.jobs.stopped(task.tenant, task.job, task.demand, event.time)
    engine.accounting.on_finish(row, task.running_entry, event.time, engine.tree)
    return task


def _heartbeat(engine: Engine, event: NodeHeartbeat) -> None:
    capacity = admit(engine, event)
    weights = None if event.weights is None else {engine.resources.index(name): float(value)
                                                    for name, value in event.weights.items()}
    row, changed, relabelled = engine.registry.heartbeat(
        event.node, capacity, None if event.labels is None else dict(event.labels), weights, event.time)
    if not (changed or relabelled):
        return
    # Its room, or where constraints match (new labels), changed: every pending task is
    # checked again and the node watched by the next pass.
    engine.verdicts.nodes_changed = True
    engine.changes.grown.add(row)
    if changed:
        engine.shares_stale = True


def _lose(engine: Engine, event: NodeLost) -> list[Decision]:
    admit(engine, event)
    row = engine.registry.row[event.node]
    if not engine.registry.lose(row):
        return []
    engine.verdicts.nodes_changed = True
    engine.reservations.node_lost(row)
    requeued = sorted((task for task in engine.workload.running() if task.node == event.node), key=lambda t: t.seq)
    decisions = []
    for task in requeued:
        _back_to_pending(engine, task, row, event.time)
        decisions.append(
            Decision(event.time, task.id, task.job, task.tenant, event.node, task.demand_map,
                     engine.policy, f"requeue: node {event.node} lost", ReasonCode.NODE_LOST, DecisionKind.REQUEUE)
        )
    engine.used[row] = 0.0
    engine.shares_stale = True
    return decisions


def _running_changed(engine: Engine, row: int, task: Task, started: bool) -> None:
    engine.reservations.node_changed(row)
    engine.workload.running_changed(row, task, started)


def _back_to_pending(engine: Engine, task: Task, row: int, time: float) -> None:
    """A running task stops (its node lost, or preempted) and waits again, same id."""
    engine.used[row] -= task.demand
    _running_changed(engine, row, task, started=False)
    engine.accounting.on_requeue(engine.accounting.row[task.tenant], task.running_entry, time)
    task.state, task.node, task.start, task.running_entry = TaskState.PENDING, None, None, None
    engine.workload.enqueue(task)  # before the job stops: it waits, so its usage is kept
    engine.jobs.stopped(task.tenant, task.job, task.demand, time)
    engine.changes.touched.add(task.tenant)
    engine.changes.fresh.add(task.shape)


def preempt(engine: Engine, decision: Decision) -> None:
    """Apply one ``PREEMPT``: the task stops and is pending again; its room is free at once."""
    task = engine.workload.tasks.get(decision.task)
    if task is None or task.state is not TaskState.RUNNING or task.node != decision.node:
        raise PolicyViolation(f"{decision.policy} preempted task {decision.task!r}, not running on {decision.node}")
    row = engine.registry.row[decision.node]
    _back_to_pending(engine, task, row, decision.time)
    engine.changes.grown.add(row)


def start(engine: Engine, decision: Decision) -> str | None:
    """Apply one placement, checked against the engine's own view (a policy bug raises
    ``PolicyViolation``); returns the id of the request it took a task of (or None)."""
    workload, registry = engine.workload, engine.registry
    taken = workload.take(decision.task)
    if taken is None:
        raise PolicyViolation(f"{decision.policy} placed task {decision.task!r} that is not pending")
    task, request = taken
    row = registry.row[decision.node]
    node = registry.nodes[row]
    problem = _placement_problem(engine, task, node, row)
    if problem is None and not _add_within(registry.storage_used[row], task.demand_values,
                                           registry.storage_capacity[row]):
        problem = f"over-commits node {node.id} with {task.id}"
    if problem is not None:
        raise PolicyViolation(f"{decision.policy} {problem}")
    _running_changed(engine, row, task, started=True)
    task.state, task.node, task.start = TaskState.RUNNING, node.id, decision.time
    engine.jobs.started(task.tenant, task.job, task.demand, decision.time,
                        engine.tree.orders_jobs and orders_jobs(engine.tree, task.tenant))
    retired = workload.started(task, request)
    if request is None:
        engine.verdicts.unschedulable.discard(task.id)
    elif retired:  # (a request is reported as one: it stops being so once no task of it is left)
        engine.verdicts.unschedulable.discard(request.id)
    # Formula 9: accounted usage is the demand times the node's resource weights.
    weighted = task.demand if node.weights is None else task.demand * node.weights
    task.running_entry = engine.accounting.on_start(engine.accounting.row[task.tenant], task.demand, decision.time,
                                                    weighted)
    return request.id if request is not None else None


def _placement_problem(engine: Engine, task: Task, node: Node, row: int) -> str | None:
    """What is wrong with placing ``task`` on ``node`` (row ``row``), as a policy's bug would
    be told, or None: the node is lost, its constraints refuse it, or its job runs its
    ``max_per_node`` there already (over-committing it: ``_add_within``)."""
    if not node.alive:
        return f"placed {task.id} on lost node {node.id}"
    if not task.constraints.allows(node.id, node.labels):
        return f"placed {task.id} on {node.id} against its constraints"
    most = task.constraints.max_per_node
    if most is not None and engine.workload.job_rows(engine.registry.row).get((task.tenant, task.job), {}).get(row, 0) >= most:
        return f"placed {task.id} on {node.id}, where job {task.job} already runs its max_per_node {most}"
    return None


def _add_within(used: np.ndarray, demand: tuple[float, ...], capacity: np.ndarray) -> bool:
    """``used += demand`` on a node unless that over-commits it (then False, nothing written):
    the float operations of ``(used + demand > capacity + EPSILON).any()`` and of ``add_values``,
    in plain floats (numpy costs several times more on a vector of two or three)."""
    after = [have + want for have, want in zip(used.tolist(), demand)]
    for total, room in zip(after, capacity.tolist()):
        if total > room + EPSILON:
            return False
    for k, total in enumerate(after):
        used[k] = total
    return True


__all__ = ["PolicyViolation", "StepResult", "apply_event", "preempt", "start"]
