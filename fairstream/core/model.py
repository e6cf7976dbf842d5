"""The scheduling model: resources, nodes, the tenant tree, tasks, events and decisions.

Everything here is plain data. The engine (``fairstream.core.engine``) owns the mutable state;
policies only ever see a read-only ``Snapshot`` built from it.

Resources are named vectors: a ``ResourceSpace`` fixes the names and their order once per
cluster, and every demand or capacity is a ``numpy`` vector in that order.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, NamedTuple, cast

import numpy as np

#: Slack allowed when comparing sums of floating-point demands against capacity.
EPSILON = 1e-9

DEFAULT_RESOURCES = ("cpu", "mem")
ROOT = "root"

#: Event times are kept to the microsecond, in one place for the simulator and the worker
#: alike (``event_time``): sums such as a submit time plus a duration otherwise make instants
#: that differ by float noise (1.14 and 1.1400000000000001), each its own scheduling pass with
#: its own grouping of events.
TIME_DECIMALS = 6


def event_time(time: float) -> float:
    """``time`` rounded to ``TIME_DECIMALS`` decimals (the nearest double to it)."""
    return round(time, TIME_DECIMALS)


def subtract_floored(vector: np.ndarray, amounts: Sequence[float]) -> None:
    """``vector -= amounts`` and then ``np.maximum(vector, 0.0, out=vector)``, in place: a
    task's demand leaving an allocation, with float dust below zero cleared. In plain floats,
    with numpy's bits (a NaN stays NaN; -0.0 becomes 0.0, as ``np.maximum(-0.0, 0.0)`` gives
    it), at a third of the cost of the two numpy calls on a vector of two or three."""
    for k, amount in enumerate(amounts):
        left = vector[k] - amount
        vector[k] = left if left > 0.0 or left != left else 0.0


def subtract_each_floored(vector: np.ndarray, amounts: Iterable[Sequence[float]]) -> None:
    """``subtract_floored`` of each of ``amounts`` in turn, with its bits: ``vector`` (a row
    of a node's or a tenant's totals) read and written once, for the demands of a run of tasks."""
    values = vector.tolist()
    for each in amounts:
        subtract_floored(values, each)
    vector[:] = values


def tasks_fitting(room: np.ndarray, demand: np.ndarray) -> np.ndarray:
    """Per row of ``room`` (node x resource, or one node's row), how many tasks of ``demand`` fit
    in it side by side, read on the resources the demand asks for (it must ask for one); room
    below 0 holds none. A gang's count of room (``verdicts``, ``reservation``)."""
    asked = demand > EPSILON
    return np.floor((np.maximum(room[..., asked], 0.0) + EPSILON) / demand[asked]).min(axis=-1)


class ModelError(ValueError):
    """An input that does not fit the model: the message names the offending field."""


class PolicyViolation(RuntimeError):
    """A policy returned a decision that would break an invariant (a bug, never input): the
    engine raises it instead of applying the decision (``core/transitions.py``)."""


@dataclass(frozen=True)
class ResourceSpace:
    """The ordered resource names of one cluster (e.g. ``("cpu", "mem")``)."""

    names: tuple[str, ...]
    _position: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.names:
            raise ModelError("resources: at least one resource name is needed")
        if len(set(self.names)) != len(self.names):
            raise ModelError(f"resources: duplicate names in {list(self.names)}")
        object.__setattr__(self, "_position", {name: i for i, name in enumerate(self.names)})

    def __len__(self) -> int:
        return len(self.names)

    def index(self, name: str) -> int:
        try:
            return self.names.index(name)
        except ValueError:
            raise ModelError(f"unknown resource {name!r} (known: {', '.join(self.names)})") from None

    def vector(self, amounts: Mapping[str, float], where: str = "demand") -> np.ndarray:
        """Turn ``{"cpu": 1, "mem": 2}`` into a vector; missing names are 0.

        Raises ``ModelError`` naming ``where`` for unknown names, negative or non-numeric values.
        """
        values = [0.0] * len(self.names)
        position = self._position
        for name, amount in amounts.items():
            i = position.get(name)
            if i is None:
                raise ModelError(f"{where}.{name}: unknown resource (known: {', '.join(self.names)})")
            if amount.__class__ is not float and (isinstance(amount, bool) or not isinstance(amount, (int, float))):
                raise ModelError(f"{where}.{name}: must be a number, got {amount!r}")
            if not 0 <= amount < math.inf:  # also false for NaN
                raise ModelError(f"{where}.{name}: must be a finite number >= 0, got {amount!r}")
            values[i] = float(amount)
        return np.array(values)

    def as_dict(self, vec: Sequence[float] | np.ndarray) -> dict[str, float]:
        values = vec.tolist() if isinstance(vec, np.ndarray) and vec.dtype == np.float64 else [float(v) for v in vec]
        return dict(zip(self.names, values))


@dataclass(frozen=True)
class Constraints:
    """Placement constraints of a task: an allow-list of nodes and/or required node labels.
    A label's value is one string, or a tuple of strings of which the node's must be one
    (``{"gpu": ["V100", "P100"]}``: any of them, as Kubernetes' node affinity ``In``).

    ``max_per_node``: at most so many tasks of its job on one node, counting every running
    task of the job there (1: each on a different node, the Google trace's "different machine"
    restriction; YARN's anti-affinity cardinality). Unlike nodes and labels it depends on what
    runs: ``allows`` checks the rest, placement counts (``placement.Cycle.below_job_limit``)."""

    nodes: frozenset[str] | None = None
    labels: tuple[tuple[str, str | tuple[str, ...]], ...] = ()
    max_per_node: int | None = None

    @property
    def empty(self) -> bool:
        return self.nodes is None and not self.labels and self.max_per_node is None

    def allows(self, node_id: str, node_labels: Mapping[str, str]) -> bool:
        if self.nodes is not None and node_id not in self.nodes:
            return False
        for key, value in self.labels:
            have = node_labels.get(key)
            if have != value and (type(value) is not tuple or have not in value):
                return False
        return True

    @staticmethod
    def from_json(raw: Mapping | None, where: str = "constraints") -> Constraints:
        if not raw:
            return NO_CONSTRAINTS
        nodes = raw.get("nodes")
        labels = raw.get("labels") or {}
        if nodes is not None and (not isinstance(nodes, list) or not all(isinstance(n, str) for n in nodes)):
            raise ModelError(f"{where}.nodes: must be a list of node ids")
        if not isinstance(labels, Mapping) or not all(
                isinstance(v, str) or (isinstance(v, list) and v and all(isinstance(x, str) for x in v))
                for v in labels.values()):
            raise ModelError(f"{where}.labels: must be an object of string values "
                             "(or non-empty lists of strings: any of them)")

        def allowed(value):  # one form per meaning: ["a"] is "a"; a list sorted, without repeats
            if isinstance(value, str):
                return value
            values = tuple(sorted(set(value)))
            return values[0] if len(values) == 1 else values

        per_node = raw.get("max_per_node")
        if per_node is not None:
            if isinstance(per_node, float) and per_node.is_integer():
                per_node = int(per_node)  # (JSON's 2.0 is a whole number too)
            if isinstance(per_node, bool) or not isinstance(per_node, int) or per_node < 1:
                raise ModelError(f"{where}.max_per_node: must be a whole number >= 1 (tasks of its job on one node)")
        return Constraints(
            nodes=frozenset(nodes) if nodes is not None else None,
            labels=tuple(sorted((key, allowed(value)) for key, value in labels.items())),
            max_per_node=per_node,
        )

    def to_json(self) -> dict:
        out: dict = {}
        if self.nodes is not None:
            out["nodes"] = sorted(self.nodes)
        if self.labels:
            out["labels"] = {key: list(value) if type(value) is tuple else value for key, value in self.labels}
        if self.max_per_node is not None:
            out["max_per_node"] = self.max_per_node
        return out


NO_CONSTRAINTS = Constraints()


@dataclass
class Node:
    """A machine: capacity vector, labels and liveness (``alive`` is False after NodeLost)."""

    id: str
    capacity: np.ndarray
    labels: dict[str, str] = field(default_factory=dict)
    alive: bool = True
    last_heartbeat: float = 0.0
    # Resource weights delta (LTRF formula 9): a task's accounted usage there is its demand x
    # delta x time (a faster CPU counts more); None: 1 for every resource.
    weights: np.ndarray | None = None


@dataclass
class TenantSpec:
    """One node of the tenant tree: a queue (has children) or a leaf (user, application).

    ``weight`` is relative to siblings. ``min_share``/``max_share`` are fractions of the cluster
    (dominant share in multi-resource terms, the policy's resource in single-resource terms).
    ``max_resources``: absolute caps per resource of what runs below it (YARN's
    ``maxResources``); ``max_running``: at most so many jobs running below it at once, the
    tasks of other jobs wait (YARN's ``maxRunningApps``). ``ordering``: how the tenant orders
    its own jobs (a leaf) or children (a queue, under a hierarchical policy), one of
    ``ORDERINGS``; None is ``fifo`` for a leaf and the policy's own order for a queue (YARN's
    per-queue ``schedulingPolicy``).
    """

    id: str
    parent: str = ROOT
    weight: float = 1.0
    min_share: float = 0.0
    max_share: float = 1.0
    max_resources: dict[str, float] | None = None
    max_running: int | None = None
    ordering: str | None = None


#: A queue's ordering of its jobs or children (``TenantSpec.ordering``): arrival, lowest current
#: share of one resource (the policy's, else memory), lowest dominant share, lowest accumulated usage.
ORDERINGS = ("fifo", "fair", "drf", "ltrf")


class TaskState(str, Enum):
    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"


#: The most tasks one request may hold (the schemas' ``count`` maximum says the same).
MAX_COUNT = 10_000_000


def request_task_id(request: str, index: int) -> str:
    """The id of task ``index`` of request ``request`` (``j1-m`` and 3: ``j1-m-3``), as scenario
    files expand ``count``."""
    return f"{request}-{index}"


def gang_of(task: Task) -> str:
    """The gang a task of a gang belongs to: its request's id (``j1-3`` of ``j1``: ``j1``)."""
    return task.id if task.index >= 0 else cast(tuple[str, int], split_task_id(task.id))[0]


def split_task_id(task: str) -> tuple[str, int] | None:
    """``("j1-m", 3)`` for ``"j1-m-3"``: the request and index a task id would have (the
    index written as ``request_task_id`` writes it), or None."""
    base, dash, number = task.rpartition("-")
    if not dash or not number.isdigit() or (number[0] == "0" and len(number) > 1) or not number.isascii():
        return None
    return base, int(number)


@dataclass(eq=False, slots=True)
class Task:
    """A unit of work, or a *request*: ``count`` identical pending tasks (YARN's
    ResourceRequest, Kueue's PodSet count). ``duration`` is the true run time, known to the
    simulator only; ``estimate`` the run time its submitter expects (seconds, None: not given),
    which backfill uses (``reservation=backfill``: Slurm's time limit).

    ``seq`` is the global arrival sequence number: the last tie-break everywhere. A request
    takes one number per task, and its ``seq`` is always that of its next task, so that
    requests and single tasks order exactly as the tasks would one by one.
    ``shape`` is an engine-interned id shared by tasks that fit exactly the same nodes (same
    demand and constraints): placement remembers per shape what fits where within a pass.

    A request (``index >= 0``) hands out tasks ``<id>-<index>``, ``<id>-<index + 1>``, ...
    skipping ``cancelled`` ones (completed while pending); each placed one becomes a ``Task``
    of its own, with count 1. A single task has ``index == -1`` and ``count == 1``.
    """

    id: str
    job: str
    tenant: str
    demand: np.ndarray
    submit: float
    constraints: Constraints = NO_CONSTRAINTS
    duration: float | None = None
    estimate: float | None = None
    seq: int = 0
    demand_map: dict[str, float] = field(default_factory=dict)
    # Filled in by the engine.
    state: TaskState = TaskState.PENDING
    node: str | None = None
    start: float | None = None
    running_entry: Any = None  # its ``accounting._Running`` while it runs
    shape: int = -1
    demand_values: tuple[float, ...] = ()  # the demand as plain floats, for cheap comparisons
    count: int = 1  # pending tasks this entry stands for
    index: int = -1  # a request's next task index; -1: a single task
    cancelled: frozenset[int] = frozenset()  # a request's indices completed while pending
    # A gang: at least so many of the request's tasks start together or none does (0: not a
    # gang). Carried by each of its tasks, whose gang is their request (``gang_of``).
    gang: int = 0

    def task_id(self, skip: int = 0) -> str:
        """The id of the pending task after the first ``skip`` (a single task: its id)."""
        if self.index < 0:
            return self.id
        if not self.cancelled:
            return request_task_id(self.id, self.index + skip)
        return self.task_ids(skip, 1)[0]

    def pending_indices(self) -> list[int]:
        """A request's pending task indices, in order (``index`` on, past ``cancelled``)."""
        out: list[int] = []
        k = self.index
        while len(out) < self.count:
            if k not in self.cancelled:
                out.append(k)
            k += 1
        return out

    def task_ids(self, skip: int, n: int) -> list[str]:
        """The ids of the ``n`` pending tasks after the first ``skip`` (a single task: its id)."""
        if self.index < 0:
            return [self.id]
        if not self.cancelled:
            return [request_task_id(self.id, k) for k in range(self.index + skip, self.index + skip + n)]
        out: list[str] = []
        k, cancelled = self.index, self.cancelled
        while len(out) < n:
            if k not in cancelled:
                if skip:
                    skip -= 1
                else:
                    out.append(request_task_id(self.id, k))
            k += 1
        return out


# ----------------------------------------------------------------------------------- events


class CompletionStatus(str, Enum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    KILLED = "killed"


@dataclass(frozen=True)
class TaskSubmitted:
    """A task, or with ``count`` a request of ``count`` identical tasks ``<task>-0`` ...
    ``<task>-<count - 1>`` (one event and one pending entry for a job's maps). ``estimate``: the
    run time expected of each task, in seconds (None: unknown); only backfill reads it.
    ``gang``: the request is a gang (a distributed job's workers): at least ``gang`` of its
    tasks start together, in one pass, or none does (Volcano's ``minAvailable``, Kubernetes'
    PodGroup ``minCount``); docs/workloads.md, "Gangs"."""

    time: float
    task: str
    job: str
    tenant: str
    demand: Mapping[str, float]
    constraints: Mapping | None = None
    count: int | None = None
    estimate: float | None = None
    gang: int | None = None  # at least so many of the request's tasks start together (``"gang": {"min": n}``)


@dataclass(frozen=True)
class TaskCompleted:
    time: float
    task: str
    status: CompletionStatus = CompletionStatus.SUCCEEDED


@dataclass(frozen=True)
class NodeHeartbeat:
    time: float
    node: str
    capacity: Mapping[str, float]
    labels: Mapping[str, str] | None = None
    weights: Mapping[str, float] | None = None  # resource -> delta (formula 9); None: as before


@dataclass(frozen=True)
class NodeLost:
    time: float
    node: str


@dataclass(frozen=True)
class TenantsChanged:
    """A new tenant tree for the cluster, from this point of its event order on (issue "Queue
    configuration": live changes): queues added, weights, min/max shares changed. ``tenants``
    is the whole tree, as a scenario file's ``tenants``; ``time`` None means "at the cluster's
    clock when it arrives" (the worker sets it, and records the time it used)."""

    time: float | None
    tenants: tuple[TenantSpec, ...]


Event = TaskSubmitted | TaskCompleted | NodeHeartbeat | NodeLost | TenantsChanged


# ------------------------------------------------------------------------------- decisions


class DecisionKind(str, Enum):
    PLACE = "place"
    REQUEUE = "requeue"
    UNSCHEDULABLE = "unschedulable"
    PREEMPT = "preempt"


class ReasonCode(str, Enum):
    """Why a decision was taken, typed (``Decision.code``), beside its readable ``reason``.

    The values are stable: consumers and tests match on them, never on the reason's text.
    """

    # place
    MIN_SHARE = "min_share"  # the tenant (or a queue above it) was below its guaranteed min_share
    FAIR_ORDER = "fair_order"  # first in the policy's fairness order (lowest key; see fairness.py)
    STARVED = "starved"  # H-LTRF: the lowest leaf waited t_wait or longer (Algorithm 2)
    ARRIVAL_ORDER = "arrival_order"  # FIFO: the earliest pending task that fits
    PARTITION = "partition"  # static: fits in the tenant's own partition
    PACKING = "packing"  # an efficiency stage chose it (Tetris alignment, QKnobler's integer program)
    RECLAIMED = "reclaimed"  # placed for a starved tenant on room preempted (or taken back) for it
    BACKFILL = "backfill"  # on a node reserved for another task, expected to end before that task can start
    # preempt
    FAIR_SHARE_PREEMPTION = "fair_share_preemption"  # killed to give a starved tenant its fair share
    # requeue
    NODE_LOST = "node_lost"  # the node it ran on was lost
    # unschedulable
    NO_MATCHING_NODE = "no_matching_node"  # no live node matches its constraints
    TOO_LARGE = "too_large"  # no live node it may use is large enough, however idle


class Decision(NamedTuple):
    """One scheduling decision, plain data with the reason it was taken.

    ``PLACE``: run ``task`` on ``node``. ``REQUEUE``: the task's node was lost; it is pending again.
    ``PREEMPT``: kill ``task`` on ``node`` to give its room to a starved tenant (the reason names
    it); the task is pending again with the same id and starts over when placed.
    ``UNSCHEDULABLE``: no live node its constraints allow is large enough for it, however idle
    (``node`` is empty); it stays pending, in case such a node joins, and is reported again only
    after it became schedulable in between.

    ``reason`` says why in words, ``code`` (``ReasonCode``) the same as a type.

    ``count``: how many tasks the decision is about. A placement of several tasks of one
    request on one node lists them in ``tasks`` (``task`` is the first); an unschedulable
    request names the request as submitted in ``task`` and its pending tasks in ``count``.

    ``started``: on a ``PREEMPT``, when the killed task started (its work lost is ``time -
    started`` task-seconds); None on other kinds.
    """

    time: float
    task: str
    job: str
    tenant: str
    node: str
    demand: Mapping[str, float]
    policy: str
    reason: str
    code: ReasonCode
    kind: DecisionKind = DecisionKind.PLACE
    count: int = 1  # type: ignore[assignment]  # (the wire's name; shadows tuple.count, never called on a decision)
    tasks: tuple[str, ...] = ()
    started: float | None = None

    @property
    def id(self) -> str:
        """Idempotency key: the kind, task, count, time and node (``place:t1@12.5>n3``,
        ``place:j1-m-0*4@12.5>n3``). A decision published again has the same id; one that
        differs in any of these (a placement taken again after the worker's state store lost
        writes can land elsewhere) has another."""
        many = f"*{self.count}" if self.count != 1 else ""
        return f"{self.kind.value}:{self.task}{many}@{self.time!r}>{self.node}"

    @property
    def task_ids(self) -> tuple[str, ...]:
        """The ids of the tasks this decision places or requeues."""
        return self.tasks or (self.task,)

    def to_json(self) -> dict:
        out: dict[str, Any] = {
            "id": self.id,
            "kind": self.kind.value,
            "time": self.time,
            "task": self.task,
            "job": self.job,
            "tenant": self.tenant,
            "node": self.node,
            "demand": dict(self.demand),
            "policy": self.policy,
            "reason": self.reason,
            "code": self.code.value,
        }
        if self.count != 1:
            out["count"] = self.count
        if self.tasks:
            out["tasks"] = list(self.tasks)
        if self.started is not None:
            out["started"] = self.started
        return out


class DecisionList(list):
    """A scheduling pass's decisions, in order, and ``blocked``: the first (tenant, entry) the
    pass tried that fitted no node's free room (not one held by a limit), or None. A policy
    returns it as its list of decisions; the engine reserves a node for ``blocked`` when the policy has
    ``reservation=on``. ``withdrawn``: placements a later stage took back (``Cycle.withdraw``):
    room they held that the stage did not use goes in another pass at once."""

    blocked: tuple[str, Task] | None = None
    withdrawn: int = 0
    # (A plain Python class beside the compiled modules, not in them: mypyc compiles no
    # subclass of ``list``.)
