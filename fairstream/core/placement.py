"""The working state of one scheduling pass and the loop most policies share.

A ``Cycle`` copies the snapshot's free capacity and allocations and applies tentative
placements to the copy: policies never mutate the snapshot, so "what if" is always free.

Placement is first fit in node order. Free capacity only shrinks within a pass, so a node
that cannot take a task shape (demand and constraints) now cannot take it later in the pass:
the first time a shape is placed, one vectorised scan lists the nodes it fits on, and the
pass walks that list forward, dropping nodes that have filled up. A shape that fits nowhere
is remembered, and so is its demand: anything at least as large fails at once. Every pass is
therefore work-conserving for the order it is given: it stops only when no pending task fits.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Callable

import numpy as np

from fairstream.core import native
from fairstream.core.fairness import BELOW_MIN_SHARE, FairKey, dominant_share, fair_key, resource_share, resource_shares
from fairstream.core.model import EPSILON, Constraints, Decision, DecisionKind, ReasonCode, Task, TaskState, event_time
from fairstream.core.snapshot import Snapshot

_START = (0, 0)


class DecisionList(list):
    """A pass's decisions, in order, and ``blocked``: the first (tenant, entry) the pass tried
    that fitted no node's free room (not one held by a limit), or None. A policy returns it as
    its list of decisions; the engine reserves a node for ``blocked`` when the policy has
    ``reservation=on``. ``withdrawn``: placements a later stage took back (``Cycle.withdraw``):
    room they held that the stage did not use goes in another pass at once."""

    blocked: tuple[str, Task] | None = None
    withdrawn: int = 0


class Cycle:
    """Tentative state of one pass: free capacity, tenant and queue allocations, decisions."""

    def __init__(self, snapshot: Snapshot, policy: str, affinity: bool = False) -> None:
        self.snapshot = snapshot
        self.policy = policy
        # First fit (lowest-numbered node) unless ``affinity``: then the node whose idle
        # resources align best with the task (``alignment_scores``; QKnobler C3, Tetris).
        self.affinity = affinity
        # First fit walks nodes in this order if a policy sets it (TSF: least contended first).
        self.node_order: np.ndarray | None = None
        self.free = snapshot.free.copy()
        # Rows of ``free`` as plain floats, made on first use: checking one node is then a few
        # float compares instead of numpy calls on a 2-element array.
        self._free_rows: dict[int, list[float]] = {}
        self.allocation = snapshot.allocation.copy()
        self.decisions = DecisionList()
        # This pass's placements, in order: (decision, tenant, entry, node row); a later stage
        # may withdraw one (``withdraw``) before it ever reaches the engine.
        self.placed: list[tuple[Decision, str, Task, int]] = []
        self._placed_after: dict[str, tuple[str, ...]] | None = None  # (``may_withdraw``)
        # The node reserved for one waiting task (``Snapshot.reservation``): no other shape goes there.
        self.reservation = snapshot.reservation
        self._candidates: dict[tuple, list] = {}
        self._failed_shapes: set[int] = set()
        # Demands that fit on no node at all (kept minimal): anything at least as large cannot
        # fit either.
        self._too_large: list[tuple[float, ...]] = []
        self._failed_for: dict[str, set[int]] = {}
        self._heads: dict[str, list] = {}
        # Per (tenant, shape): the pass's cursor in the queue (``TaskList.next_from``) and how
        # many tasks it took there.
        self._cursor: dict[tuple[str, int], tuple[int, int]] = {}
        self._taken: dict[tuple[str, int], int] = {}
        self._eligible: dict[Constraints, np.ndarray] = {}
        # Per (tenant, job) of a task with a ``max_per_node``: its running tasks per node row,
        # this pass's placements included (``job_rows``).
        self._job_rows: dict[tuple[str, str], dict[int, int]] = {}
        # In a pass over candidate tenants (``Snapshot.grown_demands``), the grown rows watched:
        # once none has room for a shape queued before the pass, only new shapes could still fit
        # (``out_of_room``). Not with backfill onto a reserved node (its room is outside them),
        # nor with new shapes in the queues, nor when placing by alignment over all nodes.
        # (Made at the first look: the grown rows with room then are those with room at the start
        # less those placed on since that have none left, which the look would have dropped.)
        self._room_rows: set[int] | None = None  # the grown rows that still have room for one of them
        self._room_later = (snapshot.grown_demands is not None and not snapshot.fresh_shapes and not affinity
                            and (snapshot.reservation is None or snapshot.backfill_until is None))
        self._room_lost: set[int] = set()  # watched rows placed on since the last look (``out_of_room``)
        tree = snapshot.tree
        self._job_queues: dict[str, _JobQueue | None] = {}
        self.capped = tree.has_limits  # min or max shares: keys and caps read the queue allocations
        # What runs below each queue, kept through the pass when limits or a queue's ordering
        # of its children (hltrf) read it.
        self.tracks_groups = self.capped or bool(tree.queue_orderings)
        self.group_allocation: dict[str, np.ndarray] = {}
        # Queues' absolute caps (max_resources, unnamed resources unbounded) and job limits
        # (max_running): the jobs running below each such queue, and those this pass started.
        self.resource_caps: dict[str, np.ndarray] = {}
        self.job_limits: dict[str, int] = {}
        self.group_jobs: dict[str, int] = {}
        self._started_jobs: set[tuple[str, str]] = set()
        if self.tracks_groups:
            for tenant, row in snapshot.rows.items():
                if not tree.is_leaf(tenant):
                    continue  # a tenant whose row outlived a tree change (it has no work)
                for node in tree.path(tenant):
                    prev = self.group_allocation.get(node)
                    alloc = snapshot.allocation[row]
                    self.group_allocation[node] = alloc.copy() if prev is None else prev + alloc
        if self.capped:
            for node, spec in tree.specs.items():
                if spec.max_resources:
                    cap = np.full(len(snapshot.capacity), np.inf)
                    for name, value in spec.max_resources.items():
                        cap[snapshot.resources.index(name)] = value
                    self.resource_caps[node] = cap
                if spec.max_running is not None:
                    self.job_limits[node] = spec.max_running
                    self.group_jobs[node] = 0
            if self.job_limits:
                for tenant, jobs in snapshot.running_jobs.items():
                    if tree.is_leaf(tenant):
                        for node in tree.path(tenant):
                            if node in self.group_jobs:
                                self.group_jobs[node] += len(jobs)
        # Leaves served job by job through pass-local job queues: those that order their jobs
        # (``TenantSpec.ordering``), and those below a max_running, where a job that may not
        # start is passed over without holding back the running jobs' tasks of its shape.
        self._orders_jobs = tree.orders_jobs or bool(self.job_limits)

    # ------------------------------------------------------------------- tasks

    def job_queue(self, tenant: str) -> "_JobQueue | None":
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
                queue = _JobQueue(self.snapshot, tenant, ordering)
        queues[tenant] = queue
        return queue

    def next_task(self, tenant: str) -> Task | None:
        """The entry (task or request) of the tenant's earliest pending task whose shape can
        still fit, or None. A leaf that orders its jobs gives its first job's earliest such entry."""
        if self._orders_jobs and (jobs := self.job_queue(tenant)) is not None:
            return jobs.next_entry(self._failed_shapes, self._failed_for.get(tenant, ()))
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
        failed_here = self._failed_for.get(tenant, ())
        while heads:
            seq, shape = heads[0]
            if shape in self._failed_shapes or shape in failed_here:
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
        """The tenant's next entry whatever shapes failed for other tenants in this pass: what
        a pass over every tenant would have tried at its turn, if that came before them."""
        if self._orders_jobs and (jobs := self.job_queue(tenant)) is not None:
            return jobs.next_entry((), self._failed_for.get(tenant, ()))
        heads = self.shape_heads(tenant, every_shape=True)
        return heads[0] if heads else None

    def _advance(self, tenant: str, task: Task) -> int:
        """Take the next task of ``task``'s shape for ``tenant``; returns how many tasks of
        the entry ``task`` this pass took before it (its place in a request)."""
        if self._orders_jobs and (jobs := self.job_queue(tenant)) is not None:
            self._taken[(tenant, task.shape)] = self._taken.get((tenant, task.shape), 0) + 1
            return jobs.take(task)
        if tenant not in self._heads:  # placed without next_task (Tetris picks tasks itself)
            self.next_task(tenant)
        shape = task.shape
        group = self.snapshot.pending[tenant].groups[shape]
        key = (tenant, shape)
        _, offset, within = group.next_from(*self._cursor.get(key, _START))
        self._cursor[key] = (offset, within + 1)
        self._taken[key] = self._taken.get(key, 0) + 1
        if within + 1 < task.count:
            return within  # the request has more: its entry stays the shape's head, same seq
        heads = self._heads[tenant]
        nxt, _, _ = group.next_from(offset, within + 1)
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
        failed_here = self._failed_for.get(tenant, ())
        if self._orders_jobs and (jobs := self.job_queue(tenant)) is not None:
            return jobs.shape_heads(() if every_shape else self._failed_shapes, () if every_shape else failed_here)
        heads = []
        for shape, group in queue.groups.items():
            if not every_shape and (shape in self._failed_shapes or shape in failed_here):
                continue
            task, _, _ = group.next_from(*self._cursor.get((tenant, shape), _START))
            if task is not None:
                heads.append(task)
        heads.sort(key=lambda task: task.seq)
        return heads

    def pending_left(self, tenant: str) -> int:
        """How many of the tenant's queued tasks this pass has not placed yet."""
        queue = self.snapshot.pending.get(tenant)
        if queue is None:
            return 0
        return sum(g.count - self._taken.get((tenant, shape), 0) for shape, g in queue.groups.items())

    def rank_in_queue(self, tenant: str, task: Task) -> int:
        """How many of the tenant's tasks not yet placed arrived before ``task`` (the next task
        of that entry: its position in the tenant's queue, counted over all shapes)."""
        import bisect

        if self._orders_jobs and (jobs := self.job_queue(tenant)) is not None:
            return jobs.rank(task)
        rank = 0
        for shape, group in self.snapshot.pending[tenant].groups.items():
            offset, within = self._cursor.get((tenant, shape), _START)
            start = group.head + offset
            end = bisect.bisect_left(group.tasks, task.seq, lo=start, key=lambda t: t.seq)
            for entry in group.tasks[start:end]:
                if entry.state is TaskState.PENDING:
                    rank += entry.count - (within if entry is group.tasks[start] else 0)
        return rank

    def skip_for(self, tenant: str, task: Task) -> None:
        """This tenant may not run tasks of this shape in this pass (a quota or cap); a task held
        only because its job may not start (max_running) holds back its job alone: the running
        jobs' tasks of the same shape may still go."""
        if self.job_limits and (jobs := self.job_queue(tenant)) is not None:
            over = self.over_cap(tenant, task)
            if over is not None and over[0] == "max_running":
                jobs.block(task.job)
                return
        self._failed_for.setdefault(tenant, set()).add(task.shape)

    def out_of_room(self) -> bool:
        """True when the rest of a pass over candidate tenants can place nothing and find
        nothing new: no grown row has room for any shape queued before the pass (none fits any
        other node: ``Snapshot.grown_rows``), no new shape waits, and the pass's first blocked
        task is known (or the policy does not reserve). Trying the remaining tenants would only
        fail; the decisions are those of trying them. Asked after a task failed to place: the
        rows placed on since the last look are looked at then, together."""
        if self._room_later:
            self._room_later = False
            grown = self.snapshot.grown_rows
            self._room_rows = set(grown[room_for_any(self.free[grown], self.snapshot.grown_demands)].tolist())
            self._room_lost.clear()
        rows = self._room_rows
        if rows is None or (self.decisions.blocked is None and self.snapshot.reserving):
            return False
        if self._room_lost:
            lost = np.fromiter(self._room_lost, dtype=np.int64, count=len(self._room_lost))
            rows.difference_update(lost[~room_for_any(self.free[lost], self.snapshot.grown_demands)].tolist())
            self._room_lost.clear()
        return not rows

    # ------------------------------------------------------------------- nodes

    def eligible(self, constraints: Constraints) -> np.ndarray:
        mask = self._eligible.get(constraints)
        if mask is None:
            snap = self.snapshot
            mask = np.fromiter(
                (constraints.allows(nid, labels) for nid, labels in zip(snap.node_ids, snap.node_labels)),
                dtype=bool,
                count=len(snap.node_ids),
            )
            self._eligible[constraints] = mask
        return mask

    def job_rows(self, tenant: str, job: str) -> dict[int, int]:
        """Node row -> how many tasks of ``tenant``'s ``job`` run there, this pass's placements
        included (made on first ask; counts only grow in a pass, but for a withdrawal)."""
        key = (tenant, job)
        rows = self._job_rows.get(key)
        if rows is None:
            known = self.snapshot.job_rows
            rows = self._job_rows[key] = dict(known.of(tenant, job)) if known is not None else {}
            for _, placed_tenant, entry, node in self.placed:
                if placed_tenant == tenant and entry.job == job:
                    rows[node] = rows.get(node, 0) + 1
        return rows

    def below_job_limit(self, tenant: str, task: Task) -> np.ndarray | bool:
        """The nodes where ``task``'s job runs fewer tasks than its ``max_per_node`` (True: it
        has none)."""
        most = task.constraints.max_per_node
        if most is None:
            return True
        mask = np.ones(len(self.free), dtype=bool)
        for row, running in self.job_rows(tenant, task.job).items():
            if running >= most:
                mask[row] = False
        return mask

    def _count_on(self, tenant: str, job: str, node: int, change: int) -> None:
        rows = self._job_rows.get((tenant, job))
        if rows is not None:  # (not asked yet: made with this pass's placements when asked)
            rows[node] = rows.get(node, 0) + change

    def usable(self, task: Task) -> np.ndarray | bool:
        """The nodes ``task`` may take room on as far as a reservation goes: all but a node
        reserved for another shape (True: no reservation stands in its way)."""
        reserved = self.reservation
        if reserved is None or reserved.shape == task.shape:
            return True
        mask = np.ones(len(self.free), dtype=bool)
        mask[reserved.node] = False
        return mask

    def find_node(self, task: Task) -> int | None:
        """First fit: the lowest-numbered node with room that the task may use, or None
        (with ``affinity``: the best-aligned such node, lowest number on ties)."""
        if self.affinity:
            return self.best_aligned_node(task)
        entry = self._candidates.get(task.shape)
        if entry is None:
            if not len(self.free):
                return None
            need = task.demand - EPSILON
            grown = self.snapshot.grown_rows
            if grown is not None and task.shape not in self.snapshot.fresh_shapes:
                # It fitted no node when the last pass ended: only those that gained room may
                # take it now (``Snapshot.grown_rows``); first fit over them is first fit.
                fits = (self.free[grown] >= need).all(axis=1)
                if not task.constraints.empty:
                    fits &= self.eligible(task.constraints)[grown]
                nodes = grown[fits]
            else:
                fits = (self.free >= need).all(axis=1)
                if not task.constraints.empty:
                    fits &= self.eligible(task.constraints)
                nodes = np.flatnonzero(fits)
            reserved = self.reservation
            if reserved is not None and reserved.shape != task.shape:
                nodes = nodes[nodes != reserved.node]
            if self.node_order is not None:
                rank = np.empty(len(self.node_order), dtype=np.int64)
                rank[self.node_order] = np.arange(len(self.node_order))
                nodes = nodes[np.argsort(rank[nodes], kind="stable")]
            entry = self._candidates[task.shape] = [nodes.tolist(), 0, need.tolist()]
        candidates, i, need = entry
        rows = self._free_rows
        most = task.constraints.max_per_node
        # With a max_per_node, its job's tasks on a node only grow in a pass: a node where the job
        # runs its most is passed over for good, as one without room.
        running = self.job_rows(task.tenant, task.job) if most is not None else None
        while i < len(candidates):
            node = candidates[i]
            row = rows.get(node)
            if row is None:
                row = rows[node] = self.free[node].tolist()
            if all(have >= want for have, want in zip(row, need)) and (running is None or running.get(node, 0) < most):
                entry[1] = i
                return node
            i += 1
        entry[1] = i
        return None

    def best_aligned_node(self, task: Task) -> int | None:
        if not len(self.free):
            return None
        fits = (self.free >= task.demand - EPSILON).all(axis=1) & self.usable(task)
        if not task.constraints.empty:
            fits &= self.eligible(task.constraints) & self.below_job_limit(task.tenant, task)
        if not fits.any():
            return None
        scores = alignment_scores(self.free, task.demand, self.snapshot.capacity)
        scores[~fits] = -np.inf
        return int(np.argmax(scores))  # argmax takes the first maximum: the lowest node number

    # --------------------------------------------------------------- placement

    def within_caps(self, tenant: str, task: Task) -> bool:
        """True unless the task would lift the tenant or one of its queues over max_share or
        max_resources, or start a job beyond max_running."""
        return not self.capped or self.over_cap(tenant, task) is None

    def over_cap(self, tenant: str, task: Task) -> tuple[str, str] | None:
        """Which limit the task would take its tenant or a queue above it over (the first, top
        down) and a sentence saying so: ``("max_share" | "max_resources" | "max_running", text)``;
        None if none."""
        tree, cap = self.snapshot.tree, self.snapshot.capacity
        new_job = bool(self.job_limits) and self._new_job(tenant, task)
        for node in tree.path(tenant):
            limit = tree.specs[node].max_share
            if limit < 1 and dominant_share(self.group_allocation[node] + task.demand, cap) > limit + EPSILON:
                return "max_share", f"{node} is at its max_share {limit:g}: one more task would take it over"
            caps = self.resource_caps.get(node)
            if caps is not None and (self.group_allocation[node] + task.demand > caps + EPSILON).any():
                named = {k: v for k, v in self.snapshot.resources.as_dict(caps).items() if v != np.inf}
                return "max_resources", f"{node} is at its max_resources {named}: one more task would take it over"
            jobs = self.job_limits.get(node)
            if new_job and jobs is not None and self.group_jobs[node] + 1 > jobs:
                return ("max_running", f"{node} runs {self.group_jobs[node]} jobs, its max_running: job {task.job} "
                                       f"waits for one of them to end")
        return None

    def _new_job(self, tenant: str, task: Task) -> bool:
        """Whether placing ``task`` starts a job that runs nothing yet."""
        return (task.job not in self.snapshot.running_jobs.get(tenant, ())
                and (tenant, task.job) not in self._started_jobs)

    def below_min_share(self, tenant: str) -> bool:
        """True if the tenant or one of its queues is below its guaranteed min_share."""
        if not self.capped:
            return False
        tree, cap = self.snapshot.tree, self.snapshot.capacity
        return any(
            tree.specs[node].min_share > 0
            and dominant_share(self.group_allocation[node], cap) < tree.specs[node].min_share - EPSILON
            for node in tree.path(tenant)
        )

    def try_place(self, tenant: str, task: Task, reason: str | Callable[[], str], code: ReasonCode) -> bool:
        """Place ``task`` if caps and some node allow it; otherwise remember why not. ``reason``
        (or a function making it, called only on success) and ``code`` say why it was chosen."""
        if not self.within_caps(tenant, task):
            self.skip_for(tenant, task)
            return False
        demand = task.demand_values
        for floor in self._too_large:
            if all(d >= f for d, f in zip(demand, floor)):
                self._failed_shapes.add(task.shape)
                self._blocked(tenant, task)
                return False
        node = self.find_node(task)
        if node is None and self.snapshot.backfill_until is not None and self._fits_reserved_room(task):
            if self._ends_in_time(task):
                held = self.reservation
                self.commit(tenant, task, held.node, f"backfill: node {self.snapshot.node_ids[held.node]} is reserved "
                                                     f"for {held.tenant}'s task {held.task}, which can start there at "
                                                     f"{self.snapshot.backfill_until:g} by the estimates of the tasks "
                                                     f"running there; this one is expected to end at "
                                                     f"{event_time(self.snapshot.time + task.estimate):g}",
                            ReasonCode.BACKFILL)
                return True
            # Its estimate keeps it off (or it has none): another's task of this shape may end in time.
            self._failed_for.setdefault(tenant, set()).add(task.shape)
            return False
        if node is None:
            self._failed_shapes.add(task.shape)
            self._blocked(tenant, task)
            if task.constraints.empty and not self.kept_off_reserved_room(task):
                # (Not when a reservation kept it off a node's room: a larger task of the reserved
                # shape may still fit there.)
                # Nothing in the list is below this demand (it would have been caught above);
                # drop what this one dominates from below.
                self._too_large = [f for f in self._too_large if not all(x >= d for x, d in zip(f, demand))]
                self._too_large.append(demand)
            return False
        self.commit(tenant, task, node, reason() if callable(reason) else reason, code)
        return True

    def _blocked(self, tenant: str, task: Task) -> None:
        """``task`` fitted no node's free room: the first such task in the pass's order of
        service is first in line for room (``DecisionList.blocked``; the engine may reserve a
        node for it)."""
        if self.decisions.blocked is not None or self.kept_off_reserved_room(task) or self.held_by_job_limit(task):
            return  # (kept off the reserved node's room, or its job's nodes: held by that, not short of room)
        self.decisions.blocked = (tenant, task)

    def held_by_job_limit(self, task: Task) -> bool:
        """``task`` would fit the free room of a node its constraints allow where its job
        already runs its ``max_per_node`` (reserved for another or not: the limit holds it first)."""
        return task.constraints.max_per_node is not None and bool(self.nodes_held_by_job_limit(task).any())

    def nodes_held_by_job_limit(self, task: Task) -> np.ndarray:
        """The nodes its constraints allow whose free room fits ``task`` but where its job runs its
        ``max_per_node`` (a task with one)."""
        fits = (self.free >= task.demand - EPSILON).all(axis=1) & self.eligible(task.constraints)
        return fits & ~self.below_job_limit(task.tenant, task)

    def job_may_use(self, task: Task, node: int) -> bool:
        """Its job runs fewer than ``task``'s ``max_per_node`` tasks on ``node`` (True: it has none)."""
        most = task.constraints.max_per_node
        return most is None or self.job_rows(task.tenant, task.job).get(node, 0) < most

    def kept_off_reserved_room(self, task: Task) -> bool:
        """``task`` would fit the free room of the node reserved for another shape, and may not
        backfill there."""
        return self._fits_reserved_room(task) and not self._ends_in_time(task)

    def backfill_node(self, task: Task) -> int | None:
        """With backfill (``Snapshot.backfill_until`` set): the node reserved for another shape,
        if ``task`` fits its free room and is expected to end by the time the reserved task
        can start there (its estimate from now), so it does not delay it; else None."""
        if self._ends_in_time(task) and self._fits_reserved_room(task):
            return self.reservation.node
        return None

    def _ends_in_time(self, task: Task) -> bool:
        until = self.snapshot.backfill_until
        return (until is not None and task.estimate is not None
                and event_time(self.snapshot.time + task.estimate) <= until)

    def _fits_reserved_room(self, task: Task) -> bool:
        held = self.reservation
        snap = self.snapshot
        return (held is not None and held.shape != task.shape
                and all(have >= want - EPSILON for have, want in zip(self.free[held.node].tolist(), task.demand_values))
                and task.constraints.allows(snap.node_ids[held.node], snap.node_labels[held.node])
                and self.job_may_use(task, held.node))

    def commit(self, tenant: str, task: Task, node: int, reason: str, code: ReasonCode) -> None:
        self.free[node] -= task.demand
        self._free_rows[node] = self.free[node].tolist()
        if self._room_rows and node in self._room_rows:
            self._room_lost.add(node)
        if self._job_rows:
            self._count_on(tenant, task.job, node, 1)
        row = self.snapshot.rows[tenant]
        self.allocation[row] += task.demand
        if self.capped:
            if self.job_limits and self._new_job(tenant, task):
                self._started_jobs.add((tenant, task.job))
                for group in self.snapshot.tree.path(tenant):
                    if group in self.group_jobs:
                        self.group_jobs[group] += 1
        if self.tracks_groups:
            for group in self.snapshot.tree.path(tenant):
                self.group_allocation[group] += task.demand
        decision = self.record_placement(tenant, task, node, self._advance(tenant, task), reason, code)
        self.placed.append((decision, tenant, task, node))
        self._placed_after = None

    def record_placement(self, tenant: str, task: Task, node: int, within: int, reason: str,
                         code: ReasonCode) -> Decision:
        """Record the decision placing ``task`` (an entry: its task ``within`` of a request) on
        ``node``; the pass's working state is ``commit``'s to change."""
        decision = Decision(
            time=self.snapshot.time,
            task=task.id if task.index < 0 else task.task_ids(within, 1)[0],
            job=task.job,
            tenant=tenant,
            node=self.snapshot.node_ids[node],
            demand=task.demand_map,
            policy=self.policy,
            reason=reason,
            code=code,
        )
        self.decisions.append(decision)
        return decision

    def may_withdraw(self, task_id: str, gone) -> bool:
        """Whether this pass's placement of ``task_id`` may be withdrawn, given the task ids
        ``gone`` (withdrawn, or about to be): a request's task only once every task of that
        request placed after it is gone (the engine takes a request's tasks in order)."""
        if self._placed_after is None:
            later: dict[int, list[str]] = {}
            self._placed_after = {}
            for decision, _, entry, _ in reversed(self.placed):
                if entry.index >= 0:
                    self._placed_after[decision.task] = tuple(later.setdefault(id(entry), []))
                    later[id(entry)].append(decision.task)
        return all(other in gone for other in self._placed_after.get(task_id, ()))

    def withdraw(self, task_id: str) -> None:
        """Take back this pass's placement of ``task_id`` (never started: no decision reaches
        the engine for it, and it stays pending): its room and its tenant's allocation return."""
        index = next(i for i, placed in enumerate(self.placed) if placed[0].task == task_id)
        decision, tenant, entry, node = self.placed.pop(index)
        self.decisions.remove(decision)
        self.decisions.withdrawn += 1
        if (tenant, entry.job) in self._started_jobs and not any(
                placed[1] == tenant and placed[2].job == entry.job for placed in self.placed):
            # It was its job's only start in this pass: the job runs nothing again (max_running).
            self._started_jobs.discard((tenant, entry.job))
            for group in self.snapshot.tree.path(tenant):
                if group in self.group_jobs:
                    self.group_jobs[group] -= 1
        self.free[node] += entry.demand
        self._free_rows[node] = self.free[node].tolist()
        if self._job_rows:
            self._count_on(tenant, entry.job, node, -1)
        self.allocation[self.snapshot.rows[tenant]] -= entry.demand
        if self.tracks_groups:
            for group in self.snapshot.tree.path(tenant):
                self.group_allocation[group] -= entry.demand
        self._candidates.clear()
        self._failed_shapes.clear()
        self._too_large.clear()
        self._room_rows, self._room_later = None, False  # room came back outside what was watched

    def evict(self, task, reason: str, code: ReasonCode) -> None:
        """Preempt running ``task`` (a ``preemption.RunningTask``): its room and its tenant's
        allocation come back in this pass, and a ``PREEMPT`` decision says so."""
        node = task.node
        self.free[node] += task.demand
        self._free_rows[node] = self.free[node].tolist()
        if self._job_rows:
            self._count_on(task.tenant, task.job, node, -1)
        self.allocation[self.snapshot.rows[task.tenant]] -= task.demand
        if self.tracks_groups:
            for group in self.snapshot.tree.path(task.tenant):
                self.group_allocation[group] -= task.demand
        self._candidates.clear()  # first-fit lists were made before this room came free
        self._failed_shapes.clear()
        self._too_large.clear()
        self._room_rows, self._room_later = None, False  # room came back outside what was watched
        self.decisions.append(Decision(self.snapshot.time, task.id, task.job, task.tenant, self.snapshot.node_ids[node],
                                       task.demand_map, self.policy, reason, code, DecisionKind.PREEMPT,
                                       started=task.start))


class _JobQueue:
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

    def next_entry(self, failed: set[int], failed_here: set[int] | tuple) -> Task | None:
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


KeyFn = Callable[[Cycle, str], tuple]
ChargeFn = Callable[[Cycle, str, Task], None]
ReasonFn = Callable[[Cycle, str, tuple], str]


@dataclass(frozen=True)
class TenantOrder:
    """A policy's order of tenants, "who is served next", as its own pass computes it:
    ``key(cycle, tenant)`` (smaller first: a ``FairKey``, or a tuple led by a number) on a
    ``Cycle``'s state, and ``label`` saying what the key's number is ("accumulated usage /
    weight"). The pass serves by it; ``fairstream.core.explain`` ranks waiting tenants by it."""

    label: str
    key: KeyFn
    value_of: Callable[[tuple], float] | None = None  # the number to show of a key, if not the default

    def value(self, key: tuple) -> float:
        """The number a key orders by, as ``label`` names it: ``value_of(key)`` if given, else
        ``FairKey.share``, else the key's first element."""
        if self.value_of is not None:
            return self.value_of(key)
        return float(key.share) if isinstance(key, FairKey) else float(key[0])


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


def dominant_share_order(snapshot: Snapshot) -> TenantOrder:
    """Weighted dominant share of the whole cluster, then arrival, then id (DRF's order);
    tenants below a min share first."""

    def key(cycle: Cycle, tenant: str):
        row = snapshot.rows[tenant]
        share = dominant_share(cycle.allocation[row], snapshot.capacity) / snapshot.share_fraction[row]
        return fair_key(share, leaf_arrival(snapshot, tenant), tenant, cycle.below_min_share(tenant))

    return TenantOrder("dominant share / weight", key)


@dataclass(frozen=True)
class FlatKey:
    """What a flat policy's key is, for the compiled pass (``fairstream.core.native``): the
    ``resource_share`` (``resource`` None: the dominant share) of the tenant's row of
    ``vectors`` (row x resource), plus ``extra[row]`` if given, over its share fraction; a
    placement adds ``charge[row]`` times its demand to the row (the demand itself if None).
    ``drf`` and ``fair``: the allocation; ``ltrf``: accumulated usage, PAR and one quantum.
    ``compiled``: the compiled pass may serve by it (not when a later stage of the policy
    reads the pass's working state or what its charges left, nor when the charge is not
    linear in the demand): its placements are recorded as decisions, not replayed."""

    vectors: np.ndarray
    resource: int | None
    charge: np.ndarray | None = None
    extra: np.ndarray | None = None
    compiled: bool = True

    def initial_shares(self, snapshot: Snapshot) -> np.ndarray:
        """Every row's key share before the pass places anything."""
        shares = resource_shares(self.vectors, snapshot.capacity, self.resource)
        if self.extra is not None:
            shares = shares + self.extra
        return shares / snapshot.share_fraction


def serve_in_order(
    snapshot: Snapshot,
    policy: str,
    key: KeyFn,
    reason: ReasonFn,
    charge: ChargeFn | None = None,
    admit: Callable[[Cycle, str, Task], bool] | None = None,
    initial_shares: np.ndarray | None = None,
    cycle: Cycle | None = None,
    only: list[str] | None = None,
    key_reads_queue: bool = False,
    code: ReasonCode = ReasonCode.FAIR_ORDER,
    flat_key: FlatKey | None = None,
) -> list[Decision]:
    """The loop of every flat policy: serve the tenant with the smallest key, one task at a time.

    ``key(cycle, tenant)`` is recomputed after each placement or skip of that tenant (keys of
    other tenants do not change when one tenant is served). ``charge`` updates policy-private
    state after a placement (LTRF's accumulated usage). ``admit`` is a per-tenant quota check.
    The loop ends when no demanding tenant has a task that fits: work conservation.
    ``initial_shares`` (one weighted share per tenant row, as ``key`` would compute it before
    any placement) lets the first keys be computed in one vectorised step; it is only used when
    no tenant has a min share, since that changes the priority class. ``cycle`` continues a pass
    that earlier stages of the policy began (``initial_shares`` must then reflect its allocation).
    ``only`` limits the pass to these demanding tenants (the others are known to have nothing
    that fits); by default the snapshot's ``candidates``, if the engine computed them.
    ``key_reads_queue``: the key depends on the tenant's next pending task (FIFO), so a task
    that cannot be placed changes it. ``code``: the decisions' reason code, but ``MIN_SHARE``
    for a tenant served in the below-min-share class (``order_code``). ``flat_key``: what
    ``key`` computes, as data (``initial_shares`` are then made from it if not given), so that
    the compiled pass may make this pass (``_serve_compiled``).
    """
    cycle = cycle or Cycle(snapshot, policy)
    if only is None and snapshot.candidates is not None:
        only = [tenant for tenant in snapshot.pending if tenant in snapshot.candidates]
    if flat_key is not None:
        if (flat_key.compiled and native.enabled() and admit is None and not key_reads_queue
                and _serve_compiled(cycle, flat_key, reason, initial_shares, only, code)):
            return cycle.decisions
        if initial_shares is None:
            initial_shares = flat_key.initial_shares(snapshot)
    heap = []
    if initial_shares is not None and not cycle.capped:
        rows, arrival = snapshot.rows, snapshot.arrival
        shares = initial_shares.tolist()
        for tenant in (snapshot.pending if only is None else only):
            row = rows[tenant]
            heap.append((fair_key(shares[row], float(arrival[row]), tenant), tenant))
    else:
        for tenant in (snapshot.demanding() if only is None else only):
            heap.append((key(cycle, tenant), tenant))
    heapq.heapify(heap)
    blocked_key = None  # the key its tenant had when the pass's first blocked task fitted nowhere
    while heap:
        tenant_key, tenant = heapq.heappop(heap)
        if key_reads_queue and (now := key(cycle, tenant)) != tenant_key:
            # Another tenant's task that fitted nowhere marked its shape too big, and this
            # tenant's head had that shape: its head, so its key, moved on meanwhile. Served
            # on the old key it would go before tenants whose heads came earlier.
            heapq.heappush(heap, (now, tenant))
            continue
        # Until the tenant is served its key stays what it was (keys read allocations and
        # charges, which only a placement changes), so it stays the smallest: its next task is
        # tried at once, without a trip through the heap. Not so if the key reads the queue's
        # head (``key_reads_queue``): then it goes back with its new key.
        while (task := cycle.next_task(tenant)) is not None:  # None: nothing of it fits any more
            if admit is not None and not admit(cycle, tenant, task):
                cycle.skip_for(tenant, task)
            elif cycle.try_place(tenant, task, lambda: reason(cycle, tenant, tenant_key), order_code(tenant_key, code)):
                if charge is not None:
                    charge(cycle, tenant, task)
                heapq.heappush(heap, (key(cycle, tenant), tenant))
                break
            elif blocked_key is None and cycle.decisions.blocked is not None:
                blocked_key = tenant_key
            if cycle.out_of_room():  # every try left would fail: the pass is over
                heap.clear()
                break
            if key_reads_queue:
                heapq.heappush(heap, (key(cycle, tenant), tenant))
                break
    if only is not None and snapshot.reserving:
        _first_blocked_of_all(cycle, only, key, initial_shares, blocked_key)
    return cycle.decisions


def _serve_compiled(cycle: Cycle, flat_key: FlatKey, reason: ReasonFn, initial_shares: np.ndarray | None,
                    only: list[str] | None, code: ReasonCode) -> bool:
    """``serve_in_order``'s loop in the compiled module, for a fresh pass with none of what
    only the Python loop handles: caps and min shares, job orderings and max_running, queue
    orderings, alignment or a node order, backfill, constraints (the compiled pass gives up
    when it meets a task with some). Its placements are then recorded as ``cycle``'s
    decisions in order, with the reasons the Python loop gives them, and its first blocked
    entry set: ``cycle`` ends as the Python loop leaves it in what the engine reads of it
    (decisions, ``blocked``), not in its working state (free room, cursors), nor are the
    policy's charges replayed: ``FlatKey.compiled`` says nothing reads them after the pass.
    Returns False, having changed nothing, when it did not run."""
    snap = cycle.snapshot
    if (cycle.capped or cycle.tracks_groups or cycle._orders_jobs or cycle.affinity or cycle.node_order is not None
            or snap.backfill_until is not None or cycle.placed or cycle.decisions.blocked is not None):
        return False
    held = snap.reservation

    def floats(array):  # (the compiled side reads doubles; an array of whole numbers may be ints)
        return None if array is None else np.asarray(array, dtype=np.float64)

    result = native.module.serve_flat(
        snap.pending, TaskState.PENDING, EPSILON, list(snap.pending) if only is None else only, snap.rows,
        floats(cycle.free), floats(snap.capacity),
        floats(flat_key.vectors), floats(flat_key.charge), floats(flat_key.extra), floats(snap.share_fraction),
        floats(snap.arrival), floats(initial_shares), flat_key.resource,
        None if snap.grown_rows is None else np.asarray(snap.grown_rows, dtype=np.int64), list(snap.fresh_shapes),
        floats(snap.grown_demands), None if held is None else (held.node, held.shape), snap.reserving)
    if result is None:
        return False
    placements, blocked = result
    rows, arrival = snap.rows, snap.arrival
    for tenant, task, node, share, within in placements:
        tenant_key = fair_key(share, float(arrival[rows[tenant]]), tenant)
        cycle.record_placement(tenant, task, node, within, reason(cycle, tenant, tenant_key),
                               order_code(tenant_key, code))
    cycle.decisions.blocked = blocked
    return True


def _first_blocked_of_all(cycle: Cycle, only: list[str], key: KeyFn, initial_shares: np.ndarray | None,
                          blocked_key) -> None:
    """A pass over the candidate tenants ``only`` finds the first blocked task a pass over every
    tenant would: a waiting tenant left out fits no node (``Snapshot.candidates``), so a pass
    over all would have found its next task blocked when its key came up, if before
    ``blocked_key``. Its key cannot have moved: nothing of it was placed."""
    snapshot = cycle.snapshot
    if (blocked_key is not None and initial_shares is not None and not cycle.capped
            and float(initial_shares.min()) > blocked_key.share):
        return  # the usual case, in one step: every tenant, left out or not, comes after it
    chosen = set(only)
    rest = [tenant for tenant in snapshot.pending if tenant not in chosen]
    if not rest:
        return
    if initial_shares is not None and not cycle.capped:  # the keys in one sort, in C: rest may be most tenants
        rows = np.array([snapshot.rows[t] for t in rest])
        shares = initial_shares[rows]
        if blocked_key is not None and float(shares.min()) > blocked_key.share:
            return  # the usual case: every tenant left out comes after it
        arrival = snapshot.arrival[rows]
        order = np.lexsort((np.array(rest), arrival, shares)).tolist()
        keyed = ((fair_key(float(shares[i]), float(arrival[i]), rest[i]), rest[i]) for i in order)
    else:
        keyed = iter(sorted((key(cycle, t), t) for t in rest))
    for tenant_key, tenant in keyed:
        if blocked_key is not None and not tenant_key < blocked_key:
            return
        # Its head as a pass over all would have tried it, before the candidates' failures: a
        # shape that failed for them failed only after its turn (an earlier failure that was not
        # a reservation's keeping off would have been the first blocked).
        task = cycle.first_entry(tenant)
        if task is not None and not cycle.kept_off_reserved_room(task):
            cycle.decisions.blocked = (tenant, task)
            return


def order_code(key: tuple, code: ReasonCode = ReasonCode.FAIR_ORDER) -> ReasonCode:
    """``MIN_SHARE`` when ``key`` is a ``FairKey`` of the below-min-share class, else ``code``."""
    return ReasonCode.MIN_SHARE if isinstance(key, FairKey) and key.priority == BELOW_MIN_SHARE else code


def room_for_any(free: np.ndarray, demands: np.ndarray) -> np.ndarray:
    """Per row of ``free`` (node x resource free room): does some row of ``demands`` (demand x
    resource) fit in it?"""
    return (demands[:, None, :] <= free[None, :, :] + EPSILON).all(axis=2).any(axis=0)


def alignment_scores(free: np.ndarray, demand: np.ndarray, capacity: np.ndarray) -> np.ndarray:
    """Tetris's alignment score of one task against every node: the dot product of the node's
    idle resources and the task's demand, both in units of the cluster's total capacity so that
    no resource outweighs another by its unit (cores vs GB). QKnobler's affinity (C3) is the same
    product."""
    scale = np.where(capacity > 0, capacity, 1.0)
    return (np.maximum(free, 0.0) / scale) @ (demand / scale)


def leaf_arrival(snapshot: Snapshot, tenant: str) -> float:
    return float(snapshot.arrival[snapshot.rows[tenant]])


__all__ = ["Cycle", "DecisionList", "FlatKey", "TenantOrder", "dominant_share_order", "ordering_resource", "serve_in_order", "order_code", "leaf_arrival",
           "alignment_scores", "room_for_any"]
