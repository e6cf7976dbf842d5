"""Admission: whether an event can be applied to an engine's state, and what its check parsed,
without changing anything ("what if" without mutation). ``Engine.step`` applies an event only
after ``admit`` passed it (a rejected one is a dead letter with the reason); a driver checks a
batch ahead with ``Admission`` (``Engine.admission``), each event as if those it passed were
applied, so one that would be rejected stays out of a step and its time off the clock.

Reads the engine's state (tasks, requests, finished ids, the tree, nodes, the tenants'
ledgers) and never writes it; it keeps the last demand it parsed (``Workload.last_demand``),
a cache that is not state (never in a snapshot, and the same decisions without it).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

import numpy as np

from fairstream.core.accounting import Accounting
from fairstream.core.model import (
    MAX_COUNT,
    Constraints,
    Event,
    ModelError,
    NodeHeartbeat,
    NodeLost,
    ResourceSpace,
    TaskCompleted,
    TaskSubmitted,
    TenantsChanged,
    TenantSpec,
    request_task_id,
    split_task_id,
)
from fairstream.core.tenants import TenantTree, spec_changes
from fairstream.core.workload import Workload


class EngineState(Protocol):
    """What admission reads of an engine (``Engine`` is one): its resources, tenant tree,
    tasks, requests and finished ids (``workload``), the tenants' ledgers (``accounting``),
    its nodes' rows, and its policy's name and whether that policy walks the tree."""

    resources: ResourceSpace
    tree: TenantTree
    workload: Workload
    accounting: Accounting
    auto_tenants: bool

    @property
    def policy(self) -> str: ...

    @property
    def hierarchical(self) -> bool: ...

    @property
    def node_row(self) -> Mapping[str, int]: ...


class EventRejected(ModelError):
    """An event that cannot be applied; the message is the dead-letter reason."""


@dataclass
class Earlier:
    """What the events before one in ``Admission`` submitted, completed and introduced."""

    submitted: set[str] = field(default_factory=set)
    completed: set[str] = field(default_factory=set)
    nodes: set[str] = field(default_factory=set)
    requests: dict[str, int] = field(default_factory=dict)  # request id -> count: its tasks, as a range

    def add(self, event: Event) -> None:
        if isinstance(event, TaskSubmitted):
            if event.count is None:
                self.submitted.add(event.task)
            else:
                self.requests[event.task] = event.count
        elif isinstance(event, TaskCompleted):
            self.completed.add(event.task)
        elif isinstance(event, NodeHeartbeat):
            self.nodes.add(event.node)

    def submitted_task(self, task: str) -> bool:
        """``task`` was submitted by an earlier event, on its own or in a request."""
        if task in self.submitted:
            return True
        found = split_task_id(task) if self.requests else None
        return found is not None and found[1] < self.requests.get(found[0], 0)


NOTHING_EARLIER = Earlier()


class Admission:
    """``Engine.admission()``: events checked one at a time, without changing the engine."""

    def __init__(self, engine: EngineState) -> None:
        self.engine = engine
        self.earlier = Earlier()

    def check(self, event: Event) -> str | None:
        """Why applying ``event`` after those passed before would reject it, or None (it is
        then counted as passed)."""
        try:
            admit(self.engine, event, self.earlier)
        except ModelError as exc:
            return str(exc)
        self.earlier.add(event)
        return None


def gang_problem(least: object, count: int | None, where: str = "gang.min") -> None:
    """Raise ``EventRejected`` unless ``least`` is a gang's size a submission of ``count`` tasks
    (None: one task) can have: a whole number from 1 to the tasks it submits."""
    if not isinstance(least, int) or isinstance(least, bool) or not 1 <= least <= MAX_COUNT:
        raise EventRejected(f"{where}: must be an integer from 1 to {MAX_COUNT}, got {least!r}")
    tasks = 1 if count is None else count
    if least > tasks:
        submits = "1 task (a gang is a request: give count)" if count is None else f"{count} tasks"
        raise EventRejected(f"{where}: {least} must start together, but the submission has {submits}")


def admit(engine: EngineState, event: Event, earlier: Earlier | None = None):
    """Raise ``ModelError`` if ``event`` cannot be applied to this state with ``earlier``'s
    events applied too; returns what the check parsed (a submission's demand vector and
    constraints, a heartbeat's capacity vector)."""
    earlier = earlier or NOTHING_EARLIER
    if isinstance(event, TaskSubmitted):
        task = event.task
        if event.count is None:
            if known(engine, task, earlier):
                raise EventRejected(f"task {task!r}: duplicate submission")
        else:
            if not isinstance(event.count, int) or isinstance(event.count, bool) or not 1 <= event.count <= MAX_COUNT:
                raise EventRejected(f"count: must be an integer from 1 to {MAX_COUNT}, got {event.count!r}")
            if task in engine.workload.requests or task in earlier.requests:
                raise EventRejected(f"task {task!r}: duplicate submission (a request of that id is pending)")
            taken = taken_id(engine, task, event.count, earlier)
            if taken is not None:
                raise EventRejected(f"task {taken!r}: duplicate submission")
        if not engine.tree.is_leaf(event.tenant):
            if event.tenant in engine.tree.specs:
                raise EventRejected(f"tenant {event.tenant!r}: a queue with children; tasks go to leaves")
            if not engine.auto_tenants:
                raise EventRejected(f"tenant {event.tenant!r}: unknown tenant")
        if event.gang is not None:
            gang_problem(event.gang, event.count)
        parsed = parsed_demand(engine, event)
        estimate = event.estimate
        if estimate is not None and (estimate.__class__ not in (int, float) or not 0 <= estimate < math.inf):
            raise EventRejected(f"estimate: must be a finite number of seconds >= 0, got {estimate!r}")
        return parsed
    if isinstance(event, TaskCompleted):
        task, workload = event.task, engine.workload
        if task in workload.tasks:  # (pending or running: most completions)
            if task in earlier.completed:
                raise EventRejected(f"task {task!r}: already completed")
            return None
        if task in earlier.completed or task in workload.finished_ids:
            raise EventRejected(f"task {task!r}: already completed")
        if not earlier.submitted_task(task) and workload.in_request(task) is None:
            raise EventRejected(f"task {task!r}: completion of an unknown task")
        return None
    if isinstance(event, NodeHeartbeat):
        if event.weights is not None:
            weights = engine.resources.vector(event.weights, where="weights")
            zero = [name for name in event.weights if weights[engine.resources.index(name)] <= 0]
            if zero:
                raise EventRejected(f"weights.{zero[0]}: must be above 0")
        return engine.resources.vector(event.capacity, where="capacity")
    if isinstance(event, NodeLost):
        if event.node not in engine.node_row and event.node not in earlier.nodes:
            raise EventRejected(f"node {event.node!r}: unknown node")
        return None
    if isinstance(event, TenantsChanged):
        return new_tree(engine, event)
    raise EventRejected(f"unknown event type {type(event).__name__}")


def new_tree(engine: EngineState, event: TenantsChanged) -> TenantTree:
    """The tree ``event`` asks for, checked against this state; ``EventRejected`` (the old
    tree stays) if it is no tree, moves a tenant to another parent, or leaves a tenant with
    running or pending tasks out (without ``auto_tenants``) or makes it a queue. With
    ``auto_tenants``, such a tenant left out stays a leaf under the root, weight 1, as it
    would join, if it was one; one the old tree placed or limited otherwise is refused (leaving
    it out would move it and drop its limits without a word)."""
    try:
        tree = TenantTree.from_specs([dataclasses.replace(spec) for spec in event.tenants])
        for spec in event.tenants:
            if spec.max_resources:
                engine.resources.vector(spec.max_resources, where=f"tenants[{spec.id}].max_resources")
    except ModelError as exc:
        raise EventRejected(f"tenants: {exc}") from None
    for spec in event.tenants:
        old = engine.tree.specs.get(spec.id)
        if old is not None and old.parent != spec.parent:
            raise EventRejected(f"tenants[{spec.id}].parent: {spec.parent!r}, was {old.parent!r}: a tenant cannot "
                                "move to another parent while the cluster runs")
    for ledger in engine.accounting.ledgers:
        if not ledger.active:
            continue
        if ledger.name not in tree.specs:
            if not engine.auto_tenants:
                raise EventRejected(f"tenants: {ledger.name!r} has running or pending tasks and is not in the "
                                    "new tree")
            old = engine.tree.specs.get(ledger.name)
            if old is not None and old != TenantSpec(ledger.name):
                # Left out, it would stay as a tenant joins: a leaf under the root, weight 1, no
                # limits. That is a move, refused when asked for, and the loss of its limits (an
                # operator's ops/c lost its max_share this way and 11 of its tasks were preempted).
                was = {name: before for name, (before, _) in spec_changes(old, TenantSpec(ledger.name)).items()}
                raise EventRejected(f"tenants: {ledger.name!r} has running or pending tasks and is not in the new "
                                    f"tree: it would become a leaf under the root with weight 1 and no limits, losing "
                                    f"{_settings(was)}; list it as it is (a tenant cannot move to another parent "
                                    "while the cluster runs)")
            tree.ensure_leaf(ledger.name)
        elif not tree.is_leaf(ledger.name):
            raise EventRejected(f"tenants[{ledger.name}]: has running or pending tasks, so it cannot become a "
                                "queue with children")
    problem = orderings_problem(engine.policy, engine.hierarchical, tree)
    if problem is not None:
        raise EventRejected(problem)
    return tree


def _settings(fields: dict) -> str:
    """A tenant's settings that differ from a joining tenant's, as ``parent 'ops', max_share 0.4``."""
    return ", ".join(f"{name} {value!r}" if isinstance(value, str) else f"{name} {value}" for name, value in fields.items())


def orderings_problem(policy: str, hierarchical: bool, tree: TenantTree) -> str | None:
    """Why policy ``policy`` cannot honour the tree's queue orderings, or None: a queue's
    ordering of its children needs a policy that walks the tree (``hierarchical``: its
    ``Traits.hierarchical``)."""
    queues = list(tree.queue_orderings)
    if not queues or hierarchical:
        return None
    return (f"tenants[{queues[0]}].ordering: orders a queue's children, which only a hierarchical policy "
            f"(hltrf) does; {policy} shares the cluster among leaves by their effective weights "
            "(set ordering on leaves, for their jobs)")


class ParsedDemand(NamedTuple):
    """A submission's demand and constraints as the engine keeps them: the demand as a vector,
    as a map of every resource (the decisions') and as plain floats, and the constraints."""

    vector: np.ndarray
    constraints: Constraints
    as_map: dict[str, float]
    values: tuple[float, ...]


def parsed_demand(engine: EngineState, event: TaskSubmitted) -> ParsedDemand:
    """``event``'s demand and constraints checked and parsed (``ModelError`` if they cannot
    be). A job's tasks usually arrive one after another with one demand, so the last parse is
    kept (``Workload.last_demand``, a cache: never in a snapshot) and a demand equal to it is
    compared, not parsed again. Only a demand of positive floats without constraints is kept:
    two such maps that compare equal hold the same bits, whereas 0.0 == -0.0 and 1.0 == 1 ==
    True would let another input (another shape, a bool) pass as the kept one."""
    raw = event.demand
    last = engine.workload.last_demand
    if last is not None and not event.constraints and raw == last[0]:
        for amount in raw.values():
            if amount.__class__ is not float:
                break
        else:
            return last[1]
    demand = engine.resources.vector(raw, where="demand")
    if not any(raw.values()):  # (each checked a number >= 0 above: numpy's any, cheaper)
        raise EventRejected("demand: must ask for some resource (all zero)")
    values = demand.tolist()
    parsed = ParsedDemand(demand, Constraints.from_json(event.constraints),
                          dict(zip(engine.resources.names, values)), tuple(values))
    if not event.constraints and all(amount.__class__ is float and amount > 0 for amount in raw.values()):
        engine.workload.last_demand = (dict(raw), parsed)
    return parsed


def known(engine: EngineState, task: str, earlier: Earlier) -> bool:
    """``task`` is pending, running, recently finished, or pending in a request."""
    return (task in engine.workload.tasks or task in engine.workload.finished_ids or earlier.submitted_task(task)
            or task in earlier.completed or engine.workload.in_request(task) is not None)


def taken_id(engine: EngineState, request: str, count: int, earlier: Earlier) -> str | None:
    """A task id of request ``request`` of ``count`` tasks that is already known, or None.
    Walks the request's ids or the known ids, whichever are fewer: a request of a million
    tasks costs no more than the tasks the engine holds."""
    held = (engine.workload.tasks, engine.workload.finished_ids, earlier.submitted, earlier.completed)
    if count <= sum(len(ids) for ids in held):
        # ``known`` of each id, but for the requests: the caller refused a pending request of
        # this id, and only a request of this id could hold ``<request>-<k>`` (the index has no
        # dash), so the ids held are the ones to look in.
        tasks, finished, submitted, completed = held
        for k in range(count):
            task = request_task_id(request, k)
            if task in tasks or task in finished or task in submitted or task in completed:
                return task
        return None
    for ids in held:
        for task in ids:
            found = split_task_id(task)
            if found is not None and found[0] == request and found[1] < count:
                return task
    return None  # pending requests' ids: another request of this id is refused above
