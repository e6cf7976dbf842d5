"""What a policy sees: a read-only snapshot of the cluster at the start of a scheduling pass.

Kueue's rule applies: everything after "take a snapshot" reads only the snapshot. Its arrays
are read-only views (writing to one raises), its node ids and labels immutable sequences; a
policy that wants to try something works on a ``Cycle`` copy (``fairstream.core.placement``).
The pending queues are the engine's own, to be read only (copying them every pass would cost
what the pass costs).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np

from fairstream.core.accounting import AccountingConfig
from fairstream.core.jobs import JobUsage
from fairstream.core.model import ResourceSpace, Task, TaskState
from fairstream.core.tenants import TenantTree


class TaskList:
    """Pending entries of one shape in arrival order: single tasks and requests (``Task.count``
    tasks each). ``head`` skips entries that left the queue; ``count`` is the pending tasks."""

    __slots__ = ("tasks", "head", "count")

    def __init__(self) -> None:
        self.tasks: list[Task] = []
        self.head = 0
        self.count = 0

    def compact(self) -> None:
        while self.head < len(self.tasks) and self.tasks[self.head].state is not TaskState.PENDING:
            self.head += 1
        if self.head > 64 and self.head * 2 > len(self.tasks):
            self.tasks = self.tasks[self.head :]
            self.head = 0

    def pending_at(self, offset: int) -> tuple[Task | None, int]:
        """The first pending entry at or after ``head + offset``, and its offset."""
        i = self.head + offset
        tasks = self.tasks
        while i < len(tasks) and tasks[i].state is not TaskState.PENDING:
            i += 1
        return (tasks[i], i - self.head) if i < len(tasks) else (None, i - self.head)

    def next_from(self, offset: int, within: int) -> tuple[Task | None, int, int]:
        """The first task not yet taken when the entries before ``head + offset`` and
        ``within`` tasks of the one there are: ``(entry, offset, within)``, the entry None at
        the end. A pass walks the queue with this cursor (``placement.Cycle``)."""
        i = self.head + offset
        tasks = self.tasks
        while i < len(tasks):
            entry = tasks[i]
            if entry.state is TaskState.PENDING and within < entry.count:
                return entry, i - self.head, within
            i += 1
            within = 0
        return None, i - self.head, 0


class PendingQueue:
    """A tenant's pending tasks, grouped by shape so a shape that fits nowhere is skipped whole.
    ``count`` is the pending tasks, requests counted by their ``count``; ``jobs`` the same per job."""

    def __init__(self) -> None:
        self.groups: dict[int, TaskList] = {}
        self.count = 0
        self.jobs: dict[str, int] = {}  # pending tasks per job

    def add(self, task: Task) -> None:
        group = self.groups.get(task.shape)
        if group is None:
            group = self.groups[task.shape] = TaskList()
        if group.tasks and group.tasks[-1].seq > task.seq:  # a requeued task keeps its place
            live = group.tasks[group.head :]
            live.append(task)
            live.sort(key=lambda t: t.seq)
            group.tasks, group.head = live, 0
        else:
            group.tasks.append(task)
        group.count += task.count
        self.count += task.count
        self.jobs[task.job] = self.jobs.get(task.job, 0) + task.count

    def add_more(self, tasks: list[Task]) -> None:
        """``add`` of each of ``tasks``: single tasks of one shape and job, in arrival order,
        after the last entry of their shape (``Workload.enqueue_more``)."""
        first = tasks[0]
        group = self.groups.get(first.shape)
        if group is None or (group.tasks and group.tasks[-1].seq > first.seq):
            for task in tasks:  # (not so: one at a time)
                self.add(task)
            return
        group.tasks.extend(tasks)
        group.count += len(tasks)
        self.count += len(tasks)
        self.jobs[first.job] = self.jobs.get(first.job, 0) + len(tasks)

    def removed(self, task: Task, n: int = 1) -> None:
        """Call after ``n`` tasks of entry ``task`` left the pending state (placed or
        cancelled); the entry leaves the queue once it is no longer pending."""
        self.count -= n
        left = self.jobs[task.job] - n
        if left:
            self.jobs[task.job] = left
        else:
            del self.jobs[task.job]
        group = self.groups.get(task.shape)
        if group is not None:
            group.count -= n
            group.compact()
            if group.head >= len(group.tasks):
                del self.groups[task.shape]

    def __iter__(self) -> Iterator[Task]:
        """The pending entries (single tasks and requests)."""
        for group in self.groups.values():
            for task in group.tasks[group.head :]:
                if task.state is TaskState.PENDING:
                    yield task


EMPTY_MAPPING: Mapping[str, Any] = MappingProxyType({})


class Later:
    """A snapshot array made on first read (``make()``), for what most policies never read
    (usage, PAR, quanta, waiting times, running counts): a pass of ``drf`` or ``fair`` then
    pays nothing for them. The engine ``expire``s a snapshot before it changes the state these
    are made from, so a late read raises rather than sees the state after the pass."""

    __slots__ = ("make",)

    def __init__(self, make) -> None:
        self.make = make


class SnapshotExpired(RuntimeError):
    """A field made on first read was read after the engine moved on from the snapshot."""


class NodeAllocation:
    """What each tenant's running tasks use on a node (``Snapshot.node_allocation``), made for
    a node when first asked (``tasks_on(row)``: the tasks running there): a pass that looks
    at a few nodes pays for those, not for every running task."""

    __slots__ = ("_tasks_on", "_rows", "_expired")

    def __init__(self, tasks_on) -> None:
        self._tasks_on = tasks_on
        self._rows: dict[int, Mapping[str, np.ndarray]] = {}
        self._expired = False

    def of(self, row: int) -> Mapping[str, np.ndarray]:
        """Tenant -> summed demand of its tasks running on node ``row`` (read-only arrays)."""
        got = self._rows.get(row)
        if got is None:
            if self._expired:
                raise SnapshotExpired("node_allocation read after the engine moved on from the snapshot")
            sums: dict[str, np.ndarray] = {}
            for task in self._tasks_on(row):
                sums[task.tenant] = sums[task.tenant] + task.demand if task.tenant in sums else task.demand.copy()
            for value in sums.values():
                value.flags.writeable = False
            got = self._rows[row] = MappingProxyType(sums)
        return got

    def expire(self) -> None:
        self._expired = True


class JobRows:
    """How many tasks of a job run on each node row (``Snapshot.job_rows``), for tasks with a
    ``max_per_node``: the engine's index, made on the first ask (``index()``), read only."""

    __slots__ = ("_index", "_expired")

    def __init__(self, index) -> None:
        self._index = index
        self._expired = False

    def of(self, tenant: str, job: str) -> Mapping[int, int]:
        """Node row -> the job's running tasks there (rows it runs nothing on left out)."""
        if self._expired:
            raise SnapshotExpired("job_rows read after the engine moved on from the snapshot")
        return MappingProxyType(self._index().get((tenant, job), EMPTY_MAPPING))

    def expire(self) -> None:
        self._expired = True


@dataclass(frozen=True)
class Reservation:
    """A node whose freed room is kept for one waiting task: ``tenant``'s next task of ``shape``
    (``task``: its id when reserved), on node row ``node`` (YARN Fair Scheduler's reservation).
    For a gang (docs/workloads.md, "Gangs"): ``more`` nodes beside ``node``, together able to
    hold the whole gang, kept for it from event time ``since`` until ``until`` (then the room is
    released to others: ``Reservations.reserve``)."""

    node: int
    tenant: str
    shape: int
    task: str
    more: tuple[int, ...] = ()
    until: float = math.inf
    since: float | None = None

    @property
    def rows(self) -> tuple[int, ...]:
        """Every node row it keeps room on."""
        return (self.node, *self.more) if self.more else (self.node,)

    @property
    def for_gang(self) -> bool:
        """Held for a gang: several nodes, or a time it ends (``gang_hold`` may be inf)."""
        return bool(self.more) or self.until != math.inf


@dataclass(frozen=True)
class Snapshot:
    """The cluster as one pass sees it. Row ``i`` of every tenant array is ``tenants[i]``.

    - ``free``: node x resource idle capacity; lost nodes have -1 everywhere so nothing fits.
    - ``capacity``: total capacity of live nodes.
    - ``accumulated``: counted accumulated usage per resource (resource-seconds, formula 13
      with the quantum top-up of formula 15), PAR excluded.
    - ``pseudo_accumulated``: PAR ``phi_i`` in normalised units (formula 16).
    - ``waiting_since``: when a demanding tenant last got a task (NaN if not demanding).
    - ``running``: how many tasks each tenant has running.
    - ``node_capacity``: node x resource total capacity (lost nodes included; see ``free``).
    - ``node_allocation``: per node row, what each tenant's running tasks use there
      (``NodeAllocation.of``); only for policies that ask for it
      (``Traits.node_allocation``), else None.
    - ``job_rows``: per job, how many of its tasks run on each node (``JobRows.of``), read by
      placement for tasks with a ``max_per_node`` constraint.
    """

    time: float
    resources: ResourceSpace
    node_ids: Sequence[str]
    node_labels: Sequence[Mapping[str, str]]
    free: np.ndarray
    capacity: np.ndarray
    tree: TenantTree
    tenants: list[str]
    rows: dict[str, int]
    share_fraction: np.ndarray
    allocation: np.ndarray
    share: np.ndarray
    accumulated: np.ndarray
    pseudo_accumulated: np.ndarray
    quantum: np.ndarray
    arrival: np.ndarray
    waiting_since: np.ndarray
    pending: dict[str, PendingQueue]
    accounting: AccountingConfig
    running: np.ndarray | None = None
    node_capacity: np.ndarray | None = None
    node_allocation: NodeAllocation | None = None
    job_rows: JobRows | None = None
    # For ``Traits.tenant_local`` policies: the demanding tenants that may place anything
    # in this pass (None: all of them). The others placed nothing in the last pass, had no
    # event since, and none of their task shapes fits a node that gained room since.
    candidates: frozenset[str] | None = None
    # With ``candidates``: the live node rows that gained free room since the last pass, in
    # order, and the task shapes queued since (``fresh_shapes``). Any other shape fitted no
    # node when the last pass ended, so it can only fit on ``grown_rows`` now.
    grown_rows: np.ndarray | None = None
    fresh_shapes: frozenset[int] = frozenset()
    # With ``candidates``: the demands (shape x resource) of the queued shapes that fit the free
    # room of some grown row when the pass starts. Room only shrinks in a pass, so once no grown
    # row fits any of them, no shape queued before the pass fits anywhere (``Cycle.out_of_room``).
    grown_demands: np.ndarray | None = None
    # Preemption (``fairstream.core.preemption``): since when each starved tenant has been
    # starved (event time), and the running tasks, given only when one is starved past the
    # policy's timeout (a pass without preemption pays nothing for them).
    starved_since: Mapping[str, float] = field(default_factory=lambda: EMPTY_MAPPING)
    running_tasks: tuple | None = None
    # Per leaf, its jobs with running tasks (for queues' ``max_running``); the engine's own,
    # to be read only, and given only when the tree has limits.
    running_jobs: Mapping[str, Mapping[str, int]] = field(default_factory=lambda: EMPTY_MAPPING)
    # Per leaf that orders its jobs (``TenantSpec.ordering`` fair, drf or ltrf), its jobs' running
    # demand and accumulated usage (``fairstream.core.jobs``); the engine's own, to be read only.
    job_usage: Mapping[str, Mapping[str, JobUsage]] = field(default_factory=lambda: EMPTY_MAPPING)
    # Per tenant row, the summed demand of its pending tasks that some node could hold (requests
    # counted by their count): with ``allocation``, the demand the fair share is capped by
    # (``fairness.fair_shares``). Given when the policy preempts (the fair share's one reader).
    pending_demand: np.ndarray | None = None
    # The node reserved for the first waiting task that fitted nowhere (policies with
    # ``reservation=on`` or ``backfill``): no other task shape is placed there
    # (``placement.Cycle``), but with backfill those expected to end by ``backfill_until``, the
    # time the reserved task can start there by the running tasks' estimates (None: none may).
    reservation: Reservation | None = None
    reserving: bool = False  # the policy reserves nodes: passes find the first blocked task
    backfill_until: float | None = None
    # Gangs (docs/workloads.md, "Gangs"): whether a gang waits with none of it running (the
    # compiled pass gives up then: only ``Cycle.try_place`` starts a gang whole), and per gang
    # with tasks running (its request's id) those tasks; the engine's own, to be read only.
    gangs_waiting: bool = False
    gangs_running: Mapping[str, Mapping[str, Task]] = field(default_factory=lambda: EMPTY_MAPPING)

    def __post_init__(self) -> None:
        # Read-only in fact, not by convention: a policy that writes to a snapshot array raises
        # at once (it works on a ``Cycle``'s copies instead). The snapshot owns what it is given,
        # so the engine hands it copies, or fresh views of its own storage (``node_capacity``):
        # locking a view leaves the array under it writable for the engine.
        later = None
        for name in _ARRAYS:
            value = self.__dict__[name]
            if type(value) is Later:
                later = later or {}
                later[name] = value.make
                object.__delattr__(self, name)  # ``__getattr__`` makes it when first read
            elif value is not None:
                value.setflags(write=False)  # (half the cost of ``flags.writeable = False``)
        object.__setattr__(self, "_later", later)

    def __getattr__(self, name: str):
        # Called only for attributes not set: the fields given as ``Later``.
        later = self.__dict__.get("_later")
        if later is None or name not in later:
            raise AttributeError(name)
        make = later[name]
        if make is None:
            raise SnapshotExpired(f"snapshot field {name!r} read after the engine moved on from the snapshot")
        value = make()
        if value is not None:
            value.flags.writeable = False
        object.__setattr__(self, name, value)
        del later[name]
        return value

    def expire(self) -> None:
        """The engine is about to change the state behind the fields not read yet: reading one
        from now on raises ``SnapshotExpired``."""
        later = self.__dict__.get("_later")
        if later:
            for name in later:
                later[name] = None
        if self.node_allocation is not None:
            self.node_allocation.expire()
        if self.job_rows is not None:
            self.job_rows.expire()

    def demanding(self) -> list[str]:
        """Tenants with pending tasks, in row order."""
        return [t for t in self.tenants if t in self.pending]


_ARRAYS = ("free", "capacity", "share_fraction", "allocation", "share", "accumulated", "pseudo_accumulated",
           "quantum", "arrival", "waiting_since", "running", "node_capacity", "grown_rows", "grown_demands", "pending_demand")
# A dataclass keeps each field's default as a class attribute too; the instance's value of a
# field given as ``Later`` is removed until read, and the class default would then be found
# instead of ``__getattr__`` making it. ``__init__`` keeps the defaults.
for _name in _ARRAYS:
    if _name in Snapshot.__dict__:
        delattr(Snapshot, _name)
