"""A pass's walk over each tenant's pending queue: which entry comes next.

A tenant's queue (``snapshot.PendingQueue``) holds its pending entries grouped by shape, each
group in arrival order. A pass does not change the queues (they are the engine's); it keeps
its own cursor per (tenant, shape) and a heap of each tenant's shape heads by arrival, so the
tenant's earliest pending task whose shape can still fit is found without walking what the
pass took or what cannot fit (``QueueWalk``). A leaf that orders its jobs (``TenantSpec.ordering``
``fair``, ``drf``, ``ltrf``), or one below a queue's ``max_running``, is walked job by job
(``JobQueue``), as YARN's leaf queues order their applications.
"""

from __future__ import annotations

import bisect
import heapq

import numpy as np

from fairstream.core.fairness import resource_share
from fairstream.core.model import Task
from fairstream.core.snapshot import Snapshot

_START = (0, 0)


def _arrival(task: Task) -> int:
    return task.seq


class QueueWalk:
    """The pass's cursors in every tenant's queue. ``failed_shapes`` (shapes that fit no node
    in this pass) and ``failed_for`` (per tenant, shapes it may not run in this pass) are the
    pass's own sets, shared with it: entries of those shapes are passed over. ``job_limits``:
    the queues with a ``max_running`` (``limits.QueueLimits``)."""

    def __init__(self, snapshot: Snapshot, failed_shapes: set[int], failed_for: dict[str, set[int]],
                 job_limits: dict[str, int]) -> None:
        self.snapshot = snapshot
        self.failed_shapes = failed_shapes
        self.failed_for = failed_for
        self.job_limits = job_limits
        # Leaves served job by job through pass-local job queues: those that order their jobs
        # (``TenantSpec.ordering``), and those below a max_running, where a job that may not
        # start is passed over without holding back the running jobs' tasks of its shape.
        self.orders_jobs = self.orders_jobs_of(snapshot, job_limits)
        self._job_queues: dict[str, JobQueue | None] = {}
        self._heads: dict[str, list] = {}
        # Per (tenant, shape): the pass's cursor in the queue (``TaskList.next_from``) and how
        # many tasks it took there.
        self._cursor: dict[tuple[str, int], tuple[int, int]] = {}
        self._taken: dict[tuple[str, int], int] = {}
        # Per tenant (walked in arrival order, not job by job): the next untaken entry of each
        # of its shapes, in arrival order, made on first read and kept through ``advance``
        # (``shape_heads``: made again per call, it walked every shape each time, issue 64).
        self._shape_heads: dict[str, list[Task]] = {}

    @staticmethod
    def orders_jobs_of(snapshot: Snapshot, job_limits: dict[str, int]) -> bool:
        """Whether a pass over ``snapshot`` serves leaves job by job (``orders_jobs``)."""
        return snapshot.tree.orders_jobs or bool(job_limits)

    def job_queue(self, tenant: str) -> JobQueue | None:
        """The pass's queue of ``tenant``'s jobs if it orders them (fair, drf, ltrf) or a queue
        on its path limits its running jobs (then in arrival order unless it orders them), else None."""
        queues = self._job_queues
        if tenant in queues:
            return queues[tenant]
        tree = self.snapshot.tree
        queue = None
        if tenant in self.snapshot.pending and tree.is_leaf(tenant):
            ordering = tree.job_ordering(tenant)
            if ordering != "fifo" or any(node in self.job_limits for node in tree.path(tenant)):
                queue = JobQueue(self.snapshot, tenant, ordering)
        queues[tenant] = queue
        return queue

    def next_task(self, tenant: str) -> Task | None:
        """The entry (task or request) of the tenant's earliest pending task whose shape can
        still fit, or None. A leaf that orders its jobs gives its first job's earliest such entry."""
        if self.orders_jobs and (jobs := self.job_queue(tenant)) is not None:
            return jobs.next_entry(self.failed_shapes, self.failed_for.get(tenant, ()))
        heads = self._heads.get(tenant)
        if heads is None:
            queue = self.snapshot.pending.get(tenant)
            heads = []
            if queue is not None:
                for shape, group in queue.groups.items():
                    task, _ = group.pending_at(0)
                    if task is not None:
                        heads.append((task.seq, shape))
                heapq.heapify(heads)
            self._heads[tenant] = heads
        failed, failed_here = self.failed_shapes, self.failed_for.get(tenant, ())
        while heads:
            seq, shape = heads[0]
            if shape in failed or shape in failed_here:
                heapq.heappop(heads)
                continue
            group = self.snapshot.pending[tenant].groups[shape]
            task, _, _ = group.next_from(*self._cursor.get((tenant, shape), _START))
            if task is None:
                heapq.heappop(heads)
                continue
            return task
        return None

    def first_entry(self, tenant: str) -> Task | None:
        """The tenant's next entry whatever shapes failed for other tenants in this pass (those
        that failed for it alone are passed over): what a pass over every tenant would have
        tried at its turn, if that came before them."""
        if self.orders_jobs and (jobs := self.job_queue(tenant)) is not None:
            return jobs.next_entry((), self.failed_for.get(tenant, ()))
        failed_here = self.failed_for.get(tenant, ())
        return next((task for task in self.shape_heads(tenant, every_shape=True) if task.shape not in failed_here), None)

    def advance(self, tenant: str, task: Task) -> int:
        """Take the next task of ``task``'s shape for ``tenant``; returns how many tasks of
        the entry ``task`` this pass took before it (its place in a request)."""
        if self.orders_jobs and (jobs := self.job_queue(tenant)) is not None:
            self._taken[(tenant, task.shape)] = self._taken.get((tenant, task.shape), 0) + 1
            return jobs.take(task)
        if tenant not in self._heads:  # placed without next_task (Tetris picks tasks itself)
            self.next_task(tenant)
        shape = task.shape
        group = self.snapshot.pending[tenant].groups[shape]
        key = (tenant, shape)
        entry, offset, within = group.next_from(*self._cursor.get(key, _START))
        self._cursor[key] = (offset, within + 1)
        self._taken[key] = self._taken.get(key, 0) + 1
        nxt, _, _ = group.next_from(offset, within + 1)  # (the shape's head now: ``entry`` while it has more)
        if (kept := self._shape_heads.get(tenant)) is not None and entry is not None and nxt is not entry:
            at = bisect.bisect_left(kept, entry.seq, key=_arrival)  # (the entry is used up: the next heads its shape)
            assert kept[at] is entry  # (the shape's head is the entry its cursor is at)
            del kept[at]
            if nxt is not None:
                bisect.insort(kept, nxt, key=_arrival)
        if within + 1 < task.count:
            return within  # the request has more: its entry stays the shape's head, same seq
        heads = self._heads[tenant]
        if heads and heads[0][1] == shape:  # the usual case: the tenant's earliest shape was placed
            if nxt is None:
                heapq.heappop(heads)
            else:
                heapq.heapreplace(heads, (nxt.seq, shape))
            return within
        # Another shape was placed (Tetris): update its entry wherever it is.
        rest = [entry for entry in heads if entry[1] != shape]
        if nxt is not None:
            rest.append((nxt.seq, shape))
        heapq.heapify(rest)
        self._heads[tenant] = rest
        return within

    def shape_heads(self, tenant: str, every_shape: bool = False) -> list[Task]:
        """The next pending entry of each of the tenant's shapes still worth trying (with
        ``every_shape``: also those that fitted no node's free room in this pass), in arrival order."""
        queue = self.snapshot.pending.get(tenant)
        if queue is None:
            return []
        failed_here = self.failed_for.get(tenant, ())
        if self.orders_jobs and (jobs := self.job_queue(tenant)) is not None:
            return jobs.shape_heads(() if every_shape else self.failed_shapes, () if every_shape else failed_here)
        heads = self._shape_heads.get(tenant)
        if heads is None:
            heads = []
            for shape, group in queue.groups.items():
                task, _, _ = group.next_from(*self._cursor.get((tenant, shape), _START))
                if task is not None:
                    heads.append(task)
            heads.sort(key=_arrival)
            self._shape_heads[tenant] = heads
        if every_shape:
            return list(heads)
        failed = self.failed_shapes
        return [task for task in heads if task.shape not in failed and task.shape not in failed_here]

    def pending_left(self, tenant: str) -> int:
        """How many of the tenant's queued tasks this pass has not placed yet."""
        queue = self.snapshot.pending.get(tenant)
        if queue is None:
            return 0
        return sum(g.count - self._taken.get((tenant, shape), 0) for shape, g in queue.groups.items())

    def heads_within(self, tenant: str, limit: int) -> list[Task]:
        """The shape heads ``shape_heads`` gives, in arrival order, that have fewer than
        ``limit`` of the tenant's tasks not yet placed in this pass ahead of them (counted over
        all its shapes, failed ones too): the heads within the first ``limit`` of its queue.

        One walk over the tenant's untaken entries in arrival order, its shapes' heads (kept
        in arrival order through the pass, ``shape_heads``) merged with the entries behind
        them, stopped at ``limit`` tasks or at the last head, whichever comes first: ranking
        each head apart walked every shape per head (a tenant of 1,000 shapes on a GPU cluster,
        issue 64), and walking on to ``limit`` past the last head walks thousands of tasks of a
        few shapes (the Philly workload)."""
        if limit <= 0:
            return []
        if self.orders_jobs and (jobs := self.job_queue(tenant)) is not None:
            return [task for task in self.shape_heads(tenant) if jobs.rank(task) < limit]
        queue = self.snapshot.pending.get(tenant)
        if queue is None:
            return []
        every_head = self.shape_heads(tenant, every_shape=True)
        failed, failed_here, cursor, taken = self.failed_shapes, self.failed_for.get(tenant, ()), self._cursor, self._taken
        groups = queue.groups
        behind: list[tuple[int, int, int]] = []  # (seq, shape, offset): untaken entries after their shape's head
        heads: list[Task] = []
        rank = 0
        at = 0
        while at < len(every_head) and rank < limit:  # (past the last head none can follow, whatever the limit)
            head = every_head[at]
            if behind and behind[0][0] < head.seq:  # an entry behind another head comes first
                _, shape, offset = behind[0]
                group = groups[shape]
                rank += group.tasks[group.head + offset].count
                following, offset, _ = group.next_from(offset + 1, 0)
                if following is None:
                    heapq.heappop(behind)
                else:
                    heapq.heapreplace(behind, (following.seq, shape, offset))
                continue
            at += 1
            shape = head.shape
            if shape not in failed and shape not in failed_here:
                heads.append(head)
            group = groups[shape]
            key = (tenant, shape)
            _, offset, within = group.next_from(*cursor.get(key, _START))  # (``head`` itself: where it is)
            rank += head.count - within
            if group.count - taken.get(key, 0) > head.count - within:  # more of its shape wait behind it
                following, offset, _ = group.next_from(offset + 1, 0)
                if following is not None:
                    heapq.heappush(behind, (following.seq, shape, offset))
        return heads


class JobQueue:
    """A pass's view of the jobs of one leaf that orders them (``TenantSpec.ordering``): the
    job with the smallest key is served first, its tasks in arrival order. Keys, smallest first:
    ``fair``: current share of the policy's resource (memory if it has none and the cluster has
    memory, else the dominant share); ``drf``: current dominant share; ``ltrf``: accumulated usage
    (``fairstream.core.jobs``) as a share of the policy's resource, plus one quantum of each task
    the pass places (LTRF's charge, Algorithm 1 line 10). Ties: the job's earliest waiting task,
    then its id. A placement raises only its own job's key."""

    def __init__(self, snapshot: Snapshot, tenant: str, ordering: str) -> None:
        self.ordering = ordering
        self.capacity = snapshot.capacity
        self.resource = ordering_resource(snapshot, ordering)
        self.quantum = float(snapshot.quantum[snapshot.rows[tenant]])
        usage = snapshot.job_usage.get(tenant, {})
        self.entries: dict[str, list[Task]] = {}
        for entry in snapshot.pending[tenant]:
            self.entries.setdefault(entry.job, []).append(entry)
        self.position: dict[str, int] = {}  # entries before it are wholly taken in this pass
        self.taken: dict[str, int] = {}  # per entry id: tasks this pass took of it
        self.used: dict[str, np.ndarray] = {}  # per job: allocation (fair, drf) or usage (ltrf)
        self.current: dict[str, tuple] = {}
        self.blocked: set[str] = set()  # jobs that may not start in this pass (max_running)
        heap = []
        for job, entries in self.entries.items():
            entries.sort(key=lambda t: t.seq)
            self.position[job] = 0
            known = usage.get(job)
            if known is None:
                self.used[job] = np.zeros(len(self.capacity))
            elif ordering == "ltrf":
                self.used[job] = known.accumulated(snapshot.time)
            else:
                self.used[job] = known.allocation.copy()
            key = self.current[job] = self._key(job)
            heap.append((key, job))
        heapq.heapify(heap)
        self.heap = heap

    def _key(self, job: str) -> tuple:
        entries = self.entries[job]
        first = entries[self.position[job]].seq if self.position[job] < len(entries) else float("inf")
        if self.ordering == "fifo":  # the earliest waiting task first: the leaf's arrival order
            return (0.0, first, job)
        return (resource_share(self.used[job], self.capacity, self.resource), first, job)

    def block(self, job: str) -> None:
        """``job`` may not start in this pass (a max_running above its leaf is reached)."""
        self.blocked.add(job)
        self.current.pop(job, None)  # its heap entry is stale from now on

    def _first_open(self, job: str, failed: set[int] | tuple, failed_here: set[int] | tuple) -> Task | None:
        if job in self.blocked:
            return None
        entries, i = self.entries[job], self.position[job]
        while i < len(entries) and self.taken.get(entries[i].id, 0) >= entries[i].count:
            i += 1
        self.position[job] = i
        for entry in entries[i:]:
            if self.taken.get(entry.id, 0) < entry.count and entry.shape not in failed and entry.shape not in failed_here:
                return entry
        return None

    def next_entry(self, failed: set[int] | tuple[()], failed_here: set[int] | tuple[()]) -> Task | None:
        heap = self.heap
        while heap:
            key, job = heap[0]
            if self.current.get(job) != key:
                heapq.heappop(heap)  # stale: the job was served since
                continue
            entry = self._first_open(job, failed, failed_here)
            if entry is not None:
                return entry
            heapq.heappop(heap)  # nothing of it can fit in this pass
            del self.current[job]
        return None

    def take(self, task: Task) -> int:
        """One task of entry ``task`` placed: returns how many of it the pass took before."""
        before = self.taken.get(task.id, 0)
        self.taken[task.id] = before + 1
        job = task.job
        self.used[job] = self.used[job] + (task.demand * self.quantum if self.ordering == "ltrf" else task.demand)
        if job in self.current or self._first_open(job, (), ()) is not None:
            key = self.current[job] = self._key(job)
            heapq.heappush(self.heap, (key, job))
        return before

    def jobs_in_order(self) -> list[str]:
        return sorted(self.entries, key=self._key)

    def shape_heads(self, failed: set[int] | tuple, failed_here: set[int] | tuple) -> list[Task]:
        """The first open entry of each shape, jobs in their order (the pass's order of the leaf)."""
        seen, heads = set(), []
        for job in self.jobs_in_order():
            if job in self.blocked:
                continue
            for entry in self.entries[job][self.position[job]:]:
                if (entry.shape not in seen and self.taken.get(entry.id, 0) < entry.count
                        and entry.shape not in failed and entry.shape not in failed_here):
                    seen.add(entry.shape)
                    heads.append(entry)
        return heads

    def rank(self, task: Task) -> int:
        """Tasks of this leaf not yet placed that come before ``task``'s entry in its order."""
        rank = 0
        for job in self.jobs_in_order():
            for entry in self.entries[job][self.position[job]:]:
                if entry is task:
                    return rank
                rank += entry.count - self.taken.get(entry.id, 0)
        return rank


def ordering_resource(snapshot: Snapshot, ordering: str) -> int | None:
    """The resource a queue's ``ordering`` compares (None: the dominant share): ``drf`` the
    dominant share; ``fair`` and ``ltrf`` the policy's resource, ``fair`` memory when the policy
    has none and the cluster has memory (YARN's fair policy)."""
    resource = snapshot.accounting.resource
    if ordering == "drf":
        return None
    if ordering == "fair" and resource is None and "mem" in snapshot.resources.names:
        return snapshot.resources.index("mem")
    return resource


__all__ = ["JobQueue", "QueueWalk", "ordering_resource"]
