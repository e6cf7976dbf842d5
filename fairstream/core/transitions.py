"""What an event or a decision does to the engine's parts: the state transitions of a step.

``core/admission.py`` says whether an event may apply (and what it means: its demand, its
constraints, its node's capacity); the functions here apply it, each to the parts it changes
(``Engine``'s ``workload``, ``registry``, ``accounting``, ``jobs``, ``verdicts``, ``changes``,
``reservations``). ``apply_events`` takes the events of a step, ``apply_decisions`` a pass's
decisions, each checked against the engine's own view first: a policy's decision that would
break an invariant raises ``PolicyViolation`` (a bug, never input).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol, cast

import numpy as np

from fairstream.core.admission import EngineState, EventRejected, ParsedDemand, admit
from fairstream.core.candidates import Changes
from fairstream.core.jobs import Jobs, orders_jobs
from fairstream.core.model import (
    EPSILON,
    Decision,
    DecisionKind,
    Event,
    ModelError,
    Node,
    NodeHeartbeat,
    NodeLost,
    PolicyViolation,
    ReasonCode,
    Task,
    TaskCompleted,
    TaskState,
    TaskSubmitted,
    TenantsChanged,
    gang_of,
    split_task_id,
    subtract_each_floored,
)
from fairstream.core.nodes import Nodes
from fairstream.core.reservation import Reservations
from fairstream.core.verdicts import Verdicts
from fairstream.core.workload import back_into_request


class EngineParts(EngineState, Protocol):
    """What applying events and decisions reads and changes (``Engine`` is one): what admission
    reads, and the parts the functions here change (nodes, jobs, verdicts, a pass's candidates,
    reservations) and the shares, made again when stale."""

    registry: Nodes
    jobs: Jobs
    verdicts: Verdicts
    changes: Changes
    reservations: Reservations
    shares_stale: bool

    @property
    def used(self) -> np.ndarray: ...

    def refresh_shares(self) -> None: ...


@dataclass
class StepResult:
    decisions: list[Decision] = field(default_factory=list)
    rejected: list[tuple[Event, str]] = field(default_factory=list)
    finished: list[Task] = field(default_factory=list)


def apply_events(engine: EngineParts, events: Iterable[Event], result: StepResult) -> None:
    """Apply the events of a step in order; one that admission rejects goes to
    ``result.rejected`` with the reason (nothing changed). Runs are applied together, with the
    same state, to the bit, as one event at a time:
    - the completions of running tasks in a row, on one node and of one tenant, finish together
      (``_finish_running``: the node and the tenant's ledger looked up once);
    - tasks submitted in a row, of one tenant and job with one demand and no constraints (a
      job's tasks as they usually arrive), are stored one by one as they come (admission of the
      next reads the task table), and queued and counted once (``_queue_more``)."""
    tasks = engine.workload.tasks
    ending: list[tuple[Task, float]] = []  # running tasks out of the table, their bookkeeping to do
    arrived: list[Task] = []  # a run of submissions: the first applied, the rest stored, to queue
    for event in events:
        if type(event) is TaskCompleted:
            task = tasks.get(event.task)
            # (A completion of a task in the table is always admitted: ``admission.admit``.)
            if task is not None and task.state is TaskState.RUNNING:
                if len(arrived) > 1:
                    _queue_more(engine, arrived)
                arrived = []
                if ending and (task.node != ending[0][0].node or task.tenant != ending[0][0].tenant):
                    _finish_running(engine, ending, result)
                    ending = []
                engine.workload.finish(task.id, event.time)
                ending.append((task, event.time))
                continue
        if ending:
            _finish_running(engine, ending, result)
            ending = []
        if type(event) is TaskSubmitted and event.count is None:
            # (Admission of a submission reads the task table, the requests and the tree, not
            # what ``_queue_more`` does later: the queues, verdicts and ledgers.)
            try:
                parsed = admit(engine, event)
            except ModelError as exc:
                result.rejected.append((event, str(exc)))
                continue
            if arrived:
                first = arrived[0]
                if parsed.vector is first.demand and event.tenant == first.tenant and event.job == first.job:
                    arrived.append(engine.workload.submit_like(event, first))  # (one parse: the same shape)
                    continue
                if len(arrived) > 1:
                    _queue_more(engine, arrived)
            arrived = [_submit(engine, event, parsed)]
            continue
        if len(arrived) > 1:
            _queue_more(engine, arrived)
        arrived = []
        try:
            _apply_event(engine, event, result)
        except ModelError as exc:
            result.rejected.append((event, str(exc)))
    if len(arrived) > 1:
        _queue_more(engine, arrived)
    if ending:
        _finish_running(engine, ending, result)


def _queue_more(engine: EngineParts, arrived: list[Task]) -> None:
    """The tasks of a run of submissions after its first (``apply_events``; stored already)
    join their queue, the tasks to judge and their tenant's ledger, in order."""
    more = arrived[1:]
    engine.workload.enqueue_more(more)
    engine.verdicts.to_check.extend(more)
    first = arrived[0]
    engine.accounting.on_submit(engine.accounting.row[first.tenant], first.demand, more[0].submit, len(more),
                                first.demand_values)


def _apply_event(engine: EngineParts, event: Event, result: StepResult) -> None:
    """Apply one event of a step but the completion of a running task (``ModelError`` if
    admission rejects it: nothing changed); a completion's task goes to ``result.finished``, a
    lost node's requeues to its decisions."""
    if isinstance(event, TaskSubmitted):
        _submit(engine, event, admit(engine, event))
    elif isinstance(event, TaskCompleted):
        _complete_not_running(engine, event, result)
    elif isinstance(event, NodeHeartbeat):
        _heartbeat(engine, event)
    elif isinstance(event, NodeLost):
        result.decisions.extend(_lose(engine, event))
    elif isinstance(event, TenantsChanged):
        _configure(engine, event)
    else:  # pragma: no cover - the type union is closed
        raise EventRejected(f"unknown event type {type(event).__name__}")


def _configure(engine: EngineParts, event: TenantsChanged) -> None:
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


def _submit(engine: EngineParts, event: TaskSubmitted, parsed: ParsedDemand) -> Task:
    """Apply a submission that admission passed (``parsed``: its demand and constraints)."""
    if engine.tree.ensure_leaf(event.tenant):
        engine.accounting.add_tenant(event.tenant, engine.tree.path(event.tenant))
        engine.refresh_shares()  # at once: the new tenant's PAR below reads shares
    task = engine.workload.submit(event, parsed.vector, parsed.constraints, parsed.as_map, parsed.values)
    engine.verdicts.to_check.append(task)
    engine.changes.touched.add(task.tenant)
    engine.changes.fresh.add(task.shape)
    engine.accounting.on_submit(engine.accounting.row[task.tenant], task.demand, event.time, task.count,
                                task.demand_values if event.count is None else None)
    return task


def _complete_not_running(engine: EngineParts, event: TaskCompleted, result: StepResult) -> None:
    """A completion of a task that is not running (``apply_events`` finishes running ones):
    admitted, it is of a task killed or failed before it ran, on its own or in a request."""
    admit(engine, event)
    task = engine.workload.finish(event.task, event.time)
    if task is None:  # a task of a pending request, killed or failed before it ran
        request, task, retired = engine.workload.cancel_in_request(event.task, event.time)
        if retired:
            engine.verdicts.unschedulable.discard(request.id)
        engine.accounting.on_cancel_pending(engine.accounting.row[request.tenant], request.demand)
        engine.jobs.left(request.tenant, request.job)
        result.finished.append(task)
        return
    # Pending on its own, killed (or failed) before it ever ran: it leaves the queue.
    engine.verdicts.unschedulable.discard(task.id)
    task.state = TaskState.DONE
    engine.workload.dequeue(task)
    engine.accounting.on_cancel_pending(engine.accounting.row[task.tenant], task.demand)
    engine.jobs.left(task.tenant, task.job)
    result.finished.append(task)


def _finish_running(engine: EngineParts, ending: list[tuple[Task, float]], result: StepResult) -> None:
    """Running tasks that ended, each at its time (out of the task table already), all on one
    node and of one tenant: their node's room, the indexes of what runs where, their jobs and
    the tenant's ledger, task by task in their order (the float operations of one at a time).
    They go to ``result.finished``."""
    first = ending[0][0]
    row = engine.registry.row[cast(str, first.node)]  # (running: on a node)
    subtract_each_floored(engine.registry.storage_used[row], [task.demand_values for task, _ in ending])
    engine.reservations.node_changed(row)
    # (the parts below are apart: each takes the run in turn)
    tasks = [task for task, _ in ending]
    for task in tasks:
        task.state = TaskState.DONE
    unschedulable = engine.verdicts.unschedulable
    if unschedulable:
        for task in tasks:
            unschedulable.discard(task.id)
    engine.workload.running_changed_each(row, tasks, False)
    engine.jobs.stopped_each(first.tenant, [(task.job, task.demand, time) for task, time in ending])
    result.finished.extend(tasks)
    engine.changes.grown.add(row)
    engine.changes.touched.add(first.tenant)
    engine.accounting.on_finish(engine.accounting.row[first.tenant],
                                [(task.running_entry, time) for task, time in ending], engine.tree)


def _heartbeat(engine: EngineParts, event: NodeHeartbeat) -> None:
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


def _lose(engine: EngineParts, event: NodeLost) -> list[Decision]:
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
    # A gang stops whole: its tasks on other nodes wait again with it (a distributed job
    # cannot go on without a worker; docs/workloads.md, "Gangs").
    gangs = sorted({gang_of(task) for task in requeued if task.gang})
    running = engine.workload.gangs.running(engine.workload) if gangs else {}
    for gang in gangs:
        for task in sorted(running.get(gang, {}).values(), key=lambda t: t.seq):
            node = cast(str, task.node)
            other = engine.registry.row[node]
            _back_to_pending(engine, task, other, event.time)
            engine.changes.grown.add(other)
            decisions.append(
                Decision(event.time, task.id, task.job, task.tenant, node, task.demand_map, engine.policy,
                         f"requeue: node {event.node} lost, and with it a task of gang {gang}, which stops whole",
                         ReasonCode.NODE_LOST, DecisionKind.REQUEUE))
    engine.used[row] = 0.0
    engine.shares_stale = True
    return decisions


def _running_changed(engine: EngineParts, row: int, task: Task, started: bool) -> None:
    engine.reservations.node_changed(row)
    engine.workload.running_changed(row, task, started)


def _back_to_pending(engine: EngineParts, task: Task, row: int, time: float) -> None:
    """A running task stops (its node lost, or preempted) and waits again, same id."""
    engine.used[row] -= task.demand
    _running_changed(engine, row, task, started=False)
    engine.accounting.on_requeue(engine.accounting.row[task.tenant], task.running_entry, time)
    task.state, task.node, task.start, task.running_entry = TaskState.PENDING, None, None, None
    if task.gang:  # (a gang's pending tasks are one entry: its request)
        back_into_request(engine.workload, task)
    else:
        engine.workload.enqueue(task)  # before the job stops: it waits, so its usage is kept
    engine.jobs.stopped(task.tenant, task.job, task.demand, time)
    engine.changes.touched.add(task.tenant)
    engine.changes.fresh.add(task.shape)


def preempt(engine: EngineParts, decision: Decision) -> None:
    """Apply one ``PREEMPT``: the task stops and is pending again; its room is free at once."""
    task = engine.workload.tasks.get(decision.task)
    if task is None or task.state is not TaskState.RUNNING or task.node != decision.node:
        raise PolicyViolation(f"{decision.policy} preempted task {decision.task!r}, not running on {decision.node}")
    row = engine.registry.row[decision.node]
    _back_to_pending(engine, task, row, decision.time)
    engine.changes.grown.add(row)


def apply_decisions(engine: EngineParts, decisions: list[Decision]) -> list[str | None]:
    """Apply a pass's decisions in order, each checked against the engine's own view (a policy
    bug raises ``PolicyViolation``): a ``PREEMPT`` stops its task, a placement starts its own.
    Returns, per decision, the id of the request it took a task of (or None)."""
    requests: list[str | None] = []
    at = 0
    while at < len(decisions):
        decision = decisions[at]
        if decision.kind is DecisionKind.PREEMPT:
            preempt(engine, decision)
            requests.append(None)
            at += 1
        else:
            at = _start_run(engine, decisions, at, requests)
    return requests


def check_gangs(engine: EngineParts, decisions: list[Decision]) -> None:
    """Raise ``PolicyViolation`` unless the pass starts each gang whole or not at all (at least
    its size, or all its tasks if fewer are left, when none of it runs) and stops a running
    gang whole (every task of it preempted, or none)."""
    workload = engine.workload
    placed: dict[str, int] = {}
    preempted: dict[str, int] = {}
    for decision in decisions:
        found = split_task_id(decision.task)
        if found is None:
            continue
        if decision.kind is DecisionKind.PREEMPT:
            task = workload.tasks.get(decision.task)
            if task is not None and task.gang:
                preempted[found[0]] = preempted.get(found[0], 0) + 1
        elif decision.kind is DecisionKind.PLACE:
            request = workload.requests.get(found[0])
            if request is not None and request.gang:
                placed[found[0]] = placed.get(found[0], 0) + decision.count
    running = workload.gangs.running(workload)
    for gang, count in preempted.items():
        if count != len(running.get(gang, ())):
            raise PolicyViolation(f"{decisions[0].policy} preempted {count} of the {len(running.get(gang, ()))} running "
                                  f"tasks of gang {gang}: a gang stops whole")
    for gang, count in placed.items():
        request = workload.requests[gang]
        least = min(request.gang, request.count)
        if not running.get(gang) and count < least:
            raise PolicyViolation(f"{decisions[0].policy} started {count} tasks of gang {gang}, which starts "
                                  f"{least} together or none")


def _start_run(engine: EngineParts, decisions: list[Decision], first: int, requests: list[str | None]) -> int:
    """Start the placement ``decisions[first]`` and the placements right after it that take the
    next tasks of the same request to the same node, as far as each would be accepted alone
    (the one that would not is the next call's, which raises): one pass over the run's shared
    parts (node, request, queue, ledger), the same state to the bit as one call each. Appends
    each one's request id to ``requests``; returns the index of the first decision left."""
    decision = decisions[first]
    workload, registry = engine.workload, engine.registry
    taken = workload.take(decision.task)
    if taken is None:
        raise PolicyViolation(f"{decision.policy} placed task {decision.task!r} that is not pending")
    task, request = taken
    row = registry.row[decision.node]
    node = registry.nodes[row]
    problem = _placement_problem(engine, task, node, row)
    capacity = registry.storage_capacity[row].tolist()
    within = _added_within(registry.storage_used[row].tolist(), task.demand_values, capacity)
    if problem is None and within is None:
        problem = f"over-commits node {node.id} with {task.id}"
    if problem is not None or within is None:
        raise PolicyViolation(f"{decision.policy} {problem}")
    used = within
    following: list[str] = []
    if decision.count > 1:  # a run given as one decision: its tasks, as listed, or none
        used = _listed_run(engine, decision, task, request, row, used, capacity, following)
    elif (request is not None and request.count > 1 and first + 1 < len(decisions)
          and decisions[first + 1].node == decision.node and decisions[first + 1].tenant == decision.tenant):
        # (else no run follows: the next placement is not of this tenant on this node)
        used = _run_after(engine, decisions, first, task, request, row, used, capacity, following)
    registry.storage_used[row] = used
    time = decision.time
    task.state, task.node, task.start = TaskState.RUNNING, node.id, time  # (before it leaves the queue: it is no longer pending)
    started, retired = workload.started(task, request, following)
    for each in started[1:]:
        each.state, each.node, each.start = TaskState.RUNNING, node.id, time
    engine.reservations.node_changed(row)
    workload.running_changed_each(row, started, True)
    engine.jobs.started(task.tenant, task.job, task.demand, time,
                        engine.tree.orders_jobs and orders_jobs(engine.tree, task.tenant), len(started))
    if request is None:
        engine.verdicts.unschedulable.discard(task.id)
    elif retired:  # (a request is reported as one: it stops being so once no task of it is left)
        engine.verdicts.unschedulable.discard(request.id)
    # Formula 9: accounted usage is the demand times the node's resource weights.
    weighted = task.demand if node.weights is None else task.demand * node.weights
    entries = engine.accounting.on_start(engine.accounting.row[task.tenant], task.demand, task.demand_values, time,
                                         weighted, len(started))
    for each, entry in zip(started, entries):
        each.running_entry = entry
    if decision.count > 1:
        requests.append(None if request is None else request.id)  # (a run of several is of a request)
        return first + 1
    requests.extend([None if request is None else request.id] * len(started))
    return first + len(started)


def _run_after(engine: EngineParts, decisions: list[Decision], first: int, task: Task, request: Task, row: int,
               used: list[float], capacity: list[float], following: list[str]) -> list[float]:
    """The placements after ``decisions[first]`` (``task`` of ``request`` on node ``row``, whose
    used room is then ``used``) that start with it: each the request's next task on the same
    node, within the job's ``max_per_node`` there and the node's room. Their ids go to
    ``following``; returns the node's used room with them."""
    end = first + 1
    while (end < len(decisions) and end - first < request.count and decisions[end].node == decisions[first].node
           and decisions[end].kind is not DecisionKind.PREEMPT and decisions[end].count == 1):
        end += 1
    if end == first + 1:
        return used
    most = task.constraints.max_per_node
    room = math.inf if most is None else most - 1 - _running_of_job(engine, task, row)
    for task_id, later in zip(request.task_ids(1, end - first - 1), decisions[first + 1 : end]):
        more = _added_within(used, task.demand_values, capacity)
        if later.task != task_id or len(following) >= room or more is None:
            break
        used = more
        following.append(task_id)
    return used


def _listed_run(engine: EngineParts, decision: Decision, task: Task, request: Task | None, row: int,
                used: list[float], capacity: list[float], following: list[str]) -> list[float]:
    """A placement of ``decision.count`` tasks in one decision (``decision.tasks``; its first,
    ``task``, taken): they must be the next tasks of ``request``, within the job's
    ``max_per_node`` on node ``row`` and the node's room, else ``PolicyViolation``. Their ids
    but the first go to ``following``; returns the node's used room with them (the float
    operations of adding each task's demand in turn)."""
    count, listed = decision.count, decision.tasks
    if (request is None or count > request.count or listed[:1] != (decision.task,)
            or request.task_ids(1, count - 1) != list(listed[1:])):
        raise PolicyViolation(f"{decision.policy} placed tasks {list(listed)} on {decision.node} in one decision, "
                              "not the next tasks of one request")
    most = task.constraints.max_per_node
    if most is not None and count > most - _running_of_job(engine, task, row):
        raise PolicyViolation(f"{decision.policy} placed {count} tasks of job {task.job} on {decision.node}, "
                              f"beyond its max_per_node {most}")
    # ``used`` holds the first task already. Demands are >= 0, so the sums only grow: the
    # last is the one to check (``_added_within`` of each in turn would find no other).
    after = []
    for have, want in zip(used, task.demand_values):
        for _ in range(count - 1):
            have += want
        after.append(have)
    for total, room in zip(after, capacity):
        if total > room + EPSILON:
            raise PolicyViolation(f"{decision.policy} over-commits node {decision.node} with {count} tasks "
                                  f"of {request.id}")
    following.extend(listed[1:])
    return after


def _placement_problem(engine: EngineParts, task: Task, node: Node, row: int) -> str | None:
    """What is wrong with placing ``task`` on ``node`` (row ``row``), as a policy's bug would
    be told, or None: the node is lost, its constraints refuse it, or its job runs its
    ``max_per_node`` there already (over-committing it: ``_added_within``)."""
    if not node.alive:
        return f"placed {task.id} on lost node {node.id}"
    if not task.constraints.allows(node.id, node.labels):
        return f"placed {task.id} on {node.id} against its constraints"
    most = task.constraints.max_per_node
    if most is not None and _running_of_job(engine, task, row) >= most:
        return f"placed {task.id} on {node.id}, where job {task.job} already runs its max_per_node {most}"
    return None


def _running_of_job(engine: EngineParts, task: Task, row: int) -> int:
    """How many tasks of ``task``'s job run on node row ``row`` (what ``max_per_node`` bounds)."""
    return engine.workload.job_rows(engine.registry.row).get((task.tenant, task.job), {}).get(row, 0)


def _added_within(used: list[float], demand: tuple[float, ...], capacity: list[float]) -> list[float] | None:
    """A node's used room with ``demand`` added, or None if that over-commits it: the float
    operations of ``(used + demand > capacity + EPSILON).any()`` and of ``used + demand``, in plain
    floats (numpy costs several times more on a vector of two or three)."""
    after = [have + want for have, want in zip(used, demand)]
    for total, room in zip(after, capacity):
        if total > room + EPSILON:
            return None
    return after


__all__ = ["PolicyViolation", "StepResult", "apply_decisions", "apply_events", "check_gangs", "preempt"]
