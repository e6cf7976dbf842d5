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
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple, cast

import numpy as np
from numpy import ndarray

from fairstream.core import gangs, native
from fairstream.core.fairness import BELOW_MIN_SHARE, FairKey, dominant_share, fair_key, resource_shares
from fairstream.core.fit import NodeFit, alignment_scores
from fairstream.core.limits import QueueLimits
from fairstream.core.model import (
    EPSILON,
    Decision,
    DecisionKind,
    DecisionList,
    ReasonCode,
    Task,
    TaskState,
    event_time,
    split_task_id,
)
from fairstream.core.queues import QueueWalk, ordering_resource
from fairstream.core.snapshot import Snapshot


class Cycle:
    """Tentative state of one pass: free capacity, tenant and queue allocations, decisions."""

    def __init__(self, snapshot: Snapshot, policy: str, affinity: bool = False) -> None:
        self.snapshot = snapshot
        self.policy = policy
        # First fit (lowest-numbered node) unless ``affinity``: then the node whose idle
        # resources align best with the task (``alignment_scores``; QKnobler C3, Tetris).
        self.affinity = affinity
        self.decisions = DecisionList()
        # This pass's placements, in order: (decision, tenant, entry, node row); a later stage
        # may withdraw one (``withdraw``) before it ever reaches the engine.
        self.placed: list[tuple[Decision, str, Task, int]] = []
        # Requests with a placement withdrawn: entry id -> (entry, the task ids withdrawn) (``settle``).
        self._withdrawn_from: dict[int, tuple[Task, list[str]]] = {}
        # The node reserved for one waiting task (``Snapshot.reservation``): no other shape goes there.
        self.reservation = snapshot.reservation
        self._failed_shapes: set[int] = set()
        # Demands that fit on no node at all (kept minimal): anything at least as large cannot
        # fit either.
        self._too_large: list[tuple[float, ...]] = []
        self._failed_for: dict[str, set[int]] = {}
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
        # The tree's limits as this pass changes what runs below each queue (``core/limits.py``),
        # and the pass's walk over the tenants' queues (``core/queues.py``).
        self.limits = limits = QueueLimits(snapshot)
        self.capped, self.tracks_groups = limits.capped, limits.tracks_groups
        self.group_allocation, self.job_limits = limits.group_allocation, limits.job_limits
        self._orders_jobs = QueueWalk.orders_jobs_of(snapshot, limits.job_limits)
        self.below_min_share = limits.below_min_share
        self.last_count = 1  # how many tasks the last ``try_place`` placed (a gang: all of it)
        self.gangs_started: set[str] = set()  # gangs this pass started (``gangs.place``)
        # The working copies (``free``, ``allocation``) and the parts that walk the queues and
        # fit nodes (``queues``, ``nodes``) are made on first use, below: the compiled pass
        # (``_serve_compiled``) reads none of them.
        self._free: np.ndarray | None = None
        self._allocation: np.ndarray | None = None
        self._queues: QueueWalk | None = None
        self._nodes: NodeFit | None = None

    @property
    def free(self) -> np.ndarray:
        """The pass's free room per node row (a copy of the snapshot's, less this pass's placements)."""
        if self._free is None:
            self._free = self.snapshot.free.copy()
        return self._free

    def made(self, part: str) -> bool:
        """Whether the pass has made ``part`` (``free``, ``allocation``, ``queues``, ``nodes``)
        yet: what reads a part only if it exists asks this, not the part (which would make it)."""
        made = {"free": self._free, "allocation": self._allocation, "queues": self._queues, "nodes": self._nodes}
        return made[part] is not None

    @property
    def allocation(self) -> np.ndarray:
        """Per tenant row, its allocation with this pass's placements (a copy of the snapshot's)."""
        if self._allocation is None:
            self._allocation = self.snapshot.allocation.copy()
        return self._allocation

    @property
    def queues(self) -> QueueWalk:
        """The pass's walk over the tenants' queues (``core/queues.py``)."""
        if self._queues is None:
            self._queues = QueueWalk(self.snapshot, self._failed_shapes, self._failed_for, self.limits.job_limits)
        return self._queues

    @property
    def nodes(self) -> NodeFit:
        """Which node a task may take (``core/fit.py``), over the pass's ``free``."""
        if self._nodes is None:
            self._nodes = NodeFit(self.snapshot, self.free, self.placed, self.affinity)
        return self._nodes

    @property
    def node_order(self) -> np.ndarray | None:
        """The order first fit walks nodes in, if a policy sets it (TSF: least contended first)."""
        return self.nodes.node_order if self.made("nodes") else None  # (none set before the part is made)

    @node_order.setter
    def node_order(self, order: np.ndarray | None) -> None:
        self.nodes.node_order = order

    # ------------------------------------------------------------------- tasks

    def skip_for(self, tenant: str, task: Task) -> None:
        """This tenant may not run tasks of this shape in this pass (a quota or cap); a task held
        only because its job may not start (max_running) holds back its job alone: the running
        jobs' tasks of the same shape may still go."""
        if self.job_limits and (jobs := self.queues.job_queue(tenant)) is not None:
            over = self.limits.over_cap(tenant, task)
            if over is not None and over[0] == "max_running":
                jobs.block(task.job)
                return
        self._failed_for.setdefault(tenant, set()).add(task.shape)

    def out_of_room(self) -> bool:
        """True when the rest of a pass over candidate tenants can place nothing and find
        nothing new: no grown row has room for any shape queued before the pass (none fits any
        other node: ``Snapshot.grown_rows``), no new shape waits, and the pass's first blocked
        task is known (or the policy does not reserve), and no gang started in the pass. Trying
        the remaining tenants would only fail; the decisions are those of trying them. Asked
        after a task failed to place: the rows placed on since the last look are looked at
        then, together."""
        if self.gangs_started:
            # The rest of a gang started in this pass was held by its gang, not by room: it may
            # fit a node that did not grow (a pass stopped before it: found 2026-12-08).
            return False
        if self._room_later:
            self._room_later = False
            grown, demands = self.snapshot.grown_rows, self.snapshot.grown_demands
            assert grown is not None and demands is not None  # (a tenant-local pass: given both)
            self._room_rows = set(grown[room_for_any(self.free[grown], demands)].tolist())
            self._room_lost.clear()
        rows = self._room_rows
        if rows is None or (self.decisions.blocked is None and self.snapshot.reserving):
            return False
        if self._room_lost:
            lost = np.fromiter(self._room_lost, dtype=np.int64, count=len(self._room_lost))
            rows.difference_update(lost[~room_for_any(self.free[lost], cast(np.ndarray, self.snapshot.grown_demands))].tolist())
            self._room_lost.clear()
        return not rows

    # --------------------------------------------------------------- placement

    def within_caps(self, tenant: str, task: Task) -> bool:
        """True unless the task would lift the tenant or one of its queues over max_share or
        max_resources, or start a job beyond max_running."""
        return not self.capped or self.limits.over_cap(tenant, task) is None

    def try_place(self, tenant: str, task: Task, reason: str | Callable[[], str], code: ReasonCode) -> bool:
        """Place ``task`` if caps and some node allow it; otherwise remember why not. ``reason``
        (or a function making it, called only on success) and ``code`` say why it was chosen.
        The next task of a gang none of which runs places the whole gang or nothing
        (``gangs.place``); ``last_count`` says how many tasks the call placed."""
        self.last_count = 1
        if task.gang and (need := gangs.need(self, task)) > 1:
            return gangs.place(self, tenant, task, need, reason, code)
        if not self.within_caps(tenant, task):
            self.skip_for(tenant, task)
            return False
        demand = task.demand_values
        for floor in self._too_large:
            if all(d >= f for d, f in zip(demand, floor)):
                self._failed_shapes.add(task.shape)
                self._blocked(tenant, task)
                return False
        node = self.nodes.find_node(task)
        if node is None and self.snapshot.backfill_until is not None and self.nodes.fits_reserved_room(task):
            if self.nodes.ends_in_time(task):
                held, row = self.reservation, self.nodes.reserved_room_for(task)
                assert held is not None and row is not None and task.estimate is not None  # (room reserved; it ends in time)
                whose = (f"gang {held.task.rpartition('-')[0]}, which can start on the nodes held for it at"
                         if held.for_gang else f"task {held.task}, which can start there at")
                self.commit(tenant, task, row, f"backfill: node {self.snapshot.node_ids[row]} is reserved for "
                                               f"{held.tenant}'s {whose} {self.snapshot.backfill_until:g} by the "
                                               f"estimates of the tasks running there; this one is expected to end at "
                                               f"{event_time(self.snapshot.time + task.estimate):g}",
                            ReasonCode.BACKFILL)
                return True
            # Its estimate keeps it off (or it has none): another's task of this shape may end in time.
            self._failed_for.setdefault(tenant, set()).add(task.shape)
            return False
        if node is None:
            self._failed_shapes.add(task.shape)
            self._blocked(tenant, task)
            if task.constraints.empty and not self.nodes.kept_off_reserved_room(task):
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
        if self.decisions.blocked is None and self.short_of_room(task):
            self.decisions.blocked = (tenant, task)

    def short_of_room(self, task: Task) -> bool:
        """Whether ``task``, which fitted no node it may take, waits for room: False when it is
        kept off the reserved node's room, or off nodes with room by its job's max_per_node
        (held by those, not short of room, it is not first in line for a reservation)."""
        return not (self.nodes.kept_off_reserved_room(task) or self.nodes.held_by_job_limit(task))

    def commit(self, tenant: str, task: Task, node: int, reason: str, code: ReasonCode) -> None:
        self.free[node] -= task.demand
        self.nodes.took(node, tenant, task.job)
        if self._room_rows and node in self._room_rows:
            self._room_lost.add(node)
        row = self.snapshot.rows[tenant]
        self.allocation[row] += task.demand
        self.limits.placed(tenant, task)
        decision = self.record_placement(tenant, task, node, self.queues.advance(tenant, task), reason, code)
        self.placed.append((decision, tenant, task, node))

    def record_placement(self, tenant: str, task: Task, node: int, within: int, reason: str,
                         code: ReasonCode, count: int = 1) -> Decision:
        """Record the decision placing ``task`` (an entry: its task ``within`` of a request) on
        ``node``; the pass's working state is ``commit``'s to change. With ``count`` > 1 (only
        the compiled pass's runs: ``commit`` and what reads ``placed`` deal in one task each),
        the decision places the request's ``count`` tasks from there, listed in ``tasks``, as
        the engine publishes such a run (``engine._grouped``)."""
        if count == 1:
            first, tasks = task.task_id(within), cast(tuple[str, ...], ())
        else:
            ids = task.task_ids(within, count)
            first, tasks = ids[0], tuple(ids)
        decision = Decision(
            time=self.snapshot.time,
            task=first,
            job=task.job,
            tenant=tenant,
            node=self.snapshot.node_ids[node],
            demand=task.demand_map,
            policy=self.policy,
            reason=reason,
            code=code,
            count=count,
            tasks=tasks,
        )
        self.decisions.append(decision)
        return decision

    def withdraw(self, task_id: str) -> None:
        """Take back this pass's placement of ``task_id`` (never started: no decision reaches
        the engine for it, and it stays pending): its room and its tenant's allocation return.
        Any placement may go, a request's too: ``settle`` then gives the request's placements
        left its first ids (the engine takes a request's tasks in order)."""
        index = next(i for i, placed in enumerate(self.placed) if placed[0].task == task_id)
        decision, tenant, entry, node = self.placed.pop(index)
        self.decisions.remove(decision)
        self.decisions.withdrawn += 1
        if entry.index >= 0:
            self._withdrawn_from.setdefault(id(entry), (entry, []))[1].append(task_id)
        if not any(placed[1] == tenant and placed[2].job == entry.job for placed in self.placed):
            self.limits.unstarted(tenant, entry.job)  # (if it was its job's only start in this pass)
        self._give_back(node, tenant, entry.job, entry.demand)

    def settle(self) -> None:
        """After withdrawals: a request's placements left in this pass take, in their order, the
        lowest of the task ids it placed here, so its tasks still start in order (its tasks are
        alike: a request of four placed on n2 and then n3, then withdrawn from n2, runs its task
        2 on n3, and task 3 waits). Each keeps its node, reason and code: the policy's choice
        when it was made (a backfill placement stays on the reserved node it was let onto)."""
        for entry, withdrawn in self._withdrawn_from.values():
            kept = [at for at, placed in enumerate(self.placed) if placed[2] is entry]
            ids = sorted([self.placed[at][0].task for at in kept] + withdrawn,
                         key=lambda task: cast(tuple[str, int], split_task_id(task))[1])  # (by the index in the request)
            for at, task_id in zip(kept, ids):
                decision, tenant, _, node = self.placed[at]
                if decision.task != task_id:
                    renamed = decision._replace(task=task_id)
                    self.decisions[next(i for i, d in enumerate(self.decisions) if d is decision)] = renamed
                    self.placed[at] = (renamed, tenant, entry, node)
        self._withdrawn_from.clear()

    def _give_back(self, node: int, tenant: str, job: str, demand: np.ndarray) -> None:
        """Room ``demand`` on ``node`` and ``tenant``'s allocation come back in this pass (a
        placement withdrawn, a running task evicted): what was worked out from less room is
        worked out again."""
        self.free[node] += demand
        self.nodes.gave_back(node, tenant, job)  # (its first-fit lists were made with less room)
        self.allocation[self.snapshot.rows[tenant]] -= demand
        self.limits.released(tenant, demand)
        self._failed_shapes.clear()
        self._too_large.clear()
        self._room_rows, self._room_later = None, False  # room came back outside what was watched

    def evict(self, task, reason: str, code: ReasonCode) -> None:
        """Preempt running ``task`` (a ``preemption.RunningTask``): its room and its tenant's
        allocation come back in this pass, and a ``PREEMPT`` decision says so."""
        node = task.node
        self._give_back(node, task.tenant, task.job, task.demand)
        self.decisions.append(Decision(self.snapshot.time, task.id, task.job, task.tenant, self.snapshot.node_ids[node],
                                       task.demand_map, self.policy, reason, code, DecisionKind.PREEMPT,
                                       started=task.start))


KeyFn = Callable[[Cycle, str], tuple]
ChargeFn = Callable[[Cycle, str, Task], None]
ReasonFn = Callable[[Cycle, str, Any], str]  # (the tenant's key: a FairKey, or a policy's own tuple)


class TenantOrder(NamedTuple):
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


def dominant_share_order(snapshot: Snapshot) -> TenantOrder:
    """Weighted dominant share of the whole cluster, then arrival, then id (DRF's order);
    tenants below a min share first."""

    def key(cycle: Cycle, tenant: str):
        row = snapshot.rows[tenant]
        share = dominant_share(cycle.allocation[row], snapshot.capacity) / snapshot.share_fraction[row]
        return fair_key(share, leaf_arrival(snapshot, tenant), tenant, cycle.below_min_share(tenant))

    return TenantOrder("dominant share / weight", key)


class FlatKey(NamedTuple):
    """What a flat policy's key is, for the compiled pass (``fairstream.core.native``): the
    ``resource_share`` (``resource`` None: the dominant share) of the tenant's row of
    ``vectors`` (row x resource), plus ``extra[row]`` if given, over its share fraction; a
    placement adds ``charge[row]`` times its demand to the row (the demand itself if None).
    ``drf`` and ``fair``: the allocation; ``ltrf``: accumulated usage, PAR and one quantum.
    ``compiled``: the compiled pass may serve by it (not when a later stage of the policy
    reads the pass's working state or what its charges left, nor when the charge is not
    linear in the demand): its placements are recorded as decisions, not replayed."""

    # (``ndarray`` by its own name: the compiled module makes the tuple type from names it looks up.)
    vectors: ndarray
    resource: int | None
    charge: ndarray | None = None
    extra: ndarray | None = None
    compiled: bool = True

    def initial_shares(self, snapshot: Snapshot) -> np.ndarray:
        """Every row's key share before the pass places anything."""
        shares = resource_shares(self.vectors, snapshot.capacity, self.resource)
        if self.extra is not None:
            shares = shares + self.extra
        return shares / snapshot.share_fraction


class Service(NamedTuple):
    """How a flat policy serves its tenants in ``serve_in_order``.

    - ``key(cycle, tenant)``: the tenant's key, smallest served first (a ``FairKey``, or a
      tuple led by a number); recomputed after each placement or skip of that tenant (keys of
      other tenants do not change when one tenant is served).
    - ``reason(cycle, tenant, key)``: the decision's readable reason; ``code`` its reason code
      (``MIN_SHARE`` instead for a tenant served in the below-min-share class: ``order_code``).
    - ``charge(cycle, tenant, task)``: updates policy-private state after a placement (LTRF's
      accumulated usage).
    - ``admit(cycle, tenant, task)``: a per-tenant quota check (static's partition).
    - ``flat_key``: what ``key`` computes, as data (``FlatKey``), so that the first keys are
      made in one vectorised step and the compiled pass may make the pass (``_serve_compiled``).
    - ``key_reads_queue``: the key depends on the tenant's next pending task (FIFO), so a task
      that cannot be placed changes it."""

    key: KeyFn
    reason: ReasonFn
    charge: ChargeFn | None = None
    admit: Callable[[Cycle, str, Task], bool] | None = None
    flat_key: FlatKey | None = None
    key_reads_queue: bool = False
    code: ReasonCode = ReasonCode.FAIR_ORDER


def serve_in_order(snapshot: Snapshot, policy: str, service: Service, cycle: Cycle | None = None,
                   only: list[str] | None = None, initial_shares: np.ndarray | None = None) -> list[Decision]:
    """The loop of every flat policy: serve the tenant with the smallest key (``service``), one
    task at a time, until no demanding tenant has a task that fits (work conservation).

    ``cycle`` continues a pass that earlier stages of the policy began (``initial_shares`` must
    then reflect its allocation). ``only`` limits the pass to these demanding tenants (the
    others are known to have nothing that fits); by default the snapshot's ``candidates``, if
    the engine computed them. ``initial_shares`` (one weighted share per tenant row, as the key
    would compute it before any placement) lets the first keys be computed in one vectorised
    step; it is only used when no tenant has a min share, since that changes the priority class
    (made from ``service.flat_key`` if not given).
    """
    key, reason, charge, admit = service.key, service.reason, service.charge, service.admit
    key_reads_queue, code, flat_key = service.key_reads_queue, service.code, service.flat_key
    cycle = cycle or Cycle(snapshot, policy)
    # A reservation holds room only against tenants behind its holder in line: those whose key
    # comes before the holder's are served first with it open (``NodeFit.suspend_reservation``).
    holder_key = _holder_key(cycle, key)
    if (flat_key is not None and flat_key.compiled and native.pass_enabled() and admit is None and not key_reads_queue
            and not _ahead_of_holder(cycle, key, holder_key, only)
            and _serve_compiled(cycle, flat_key, reason, initial_shares, only, code)):
        return cycle.decisions
    if only is None and snapshot.candidates is not None:
        only = [tenant for tenant in snapshot.pending if tenant in snapshot.candidates]
    if flat_key is not None:
        if initial_shares is None:
            initial_shares = flat_key.initial_shares(snapshot)
    heap: list[tuple[Any, str]] = []
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
    if holder_key is not None and heap and heap[0][0] < holder_key:
        cycle.nodes.suspend_reservation()
    while heap:
        tenant_key, tenant = heapq.heappop(heap)
        if holder_key is not None and not tenant_key < holder_key:
            # (Keys only grow in a pass: every tenant served from here on is behind the holder.)
            cycle.nodes.resume_reservation()
            holder_key = None
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
        while (task := cycle.queues.next_task(tenant)) is not None:  # None: nothing of it fits any more
            if admit is not None and not admit(cycle, tenant, task):
                cycle.skip_for(tenant, task)
            elif cycle.try_place(tenant, task, lambda: reason(cycle, tenant, tenant_key), order_code(tenant_key, code)):  # noqa: B023 (called before the loop moves on)
                if charge is not None:
                    for _ in range(cycle.last_count):  # (a gang's charge is the whole gang's)
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
    if holder_key is not None and cycle.made("nodes"):
        cycle.nodes.resume_reservation()
    if only is not None and snapshot.reserving:
        _first_blocked_of_all(cycle, only, key, initial_shares, blocked_key)
    return cycle.decisions


def _holder_key(cycle: Cycle, key: KeyFn):
    """The key of the tenant holding the reservation (its place in line), or None without one."""
    held = cycle.snapshot.reservation
    return None if held is None else key(cycle, held.tenant)


def _ahead_of_holder(cycle: Cycle, key: KeyFn, holder_key, only: list[str] | None) -> bool:
    """Whether a tenant this pass may serve comes before the reservation's holder in line (the
    compiled pass applies a reservation to every tenant, so the Python loop serves such a pass)."""
    if holder_key is None:
        return False
    snapshot = cycle.snapshot
    tenants = only if only is not None else (
        snapshot.pending if snapshot.candidates is None else [t for t in snapshot.pending if t in snapshot.candidates])
    assert snapshot.reservation is not None  # (asked only while a node is reserved)
    holder = snapshot.reservation.tenant
    return any(tenant != holder and key(cycle, tenant) < holder_key for tenant in tenants)


def _serve_compiled(cycle: Cycle, flat_key: FlatKey, reason: ReasonFn, initial_shares: np.ndarray | None,
                    only: list[str] | None, code: ReasonCode) -> bool:
    """``serve_in_order``'s loop in the compiled module, for a fresh pass with none of what
    only the Python loop handles: caps and min shares, job orderings and max_running, queue
    orderings, alignment or a node order, backfill, a gang waiting to start, constraints (the
    compiled pass gives up when it meets a task with some). Its placements are then recorded as ``cycle``'s
    decisions in order, with the reasons the Python loop gives them, and its first blocked
    entry set: ``cycle`` ends as the Python loop leaves it in what the engine reads of it
    (decisions, ``blocked``), not in its working state (free room, cursors), nor are the
    policy's charges replayed: ``FlatKey.compiled`` says nothing reads them after the pass.
    Returns False, having changed nothing, when it did not run."""
    snap = cycle.snapshot
    if (cycle.capped or cycle.tracks_groups or cycle._orders_jobs or cycle.affinity or cycle.node_order is not None
            or snap.backfill_until is not None or cycle.placed or cycle.decisions.blocked is not None
            or snap.gangs_waiting or (snap.reservation is not None and snap.reservation.for_gang)):
        return False
    held = snap.reservation

    # (The compiled side reads doubles: an array of whole numbers may be ints. Written out, not
    # a helper per array: nine calls a pass.)
    f64, charge, extra, grown_demands = np.float64, flat_key.charge, flat_key.extra, snap.grown_demands
    result = native.module.serve_flat(
        snap.pending, TaskState.PENDING, EPSILON, only, snap.candidates, snap.rows, snap.tenants,
        np.asarray(cycle.free if cycle.made("free") else snap.free, f64), np.asarray(snap.capacity, f64), np.asarray(flat_key.vectors, f64),
        None if charge is None else np.asarray(charge, f64), None if extra is None else np.asarray(extra, f64),
        np.asarray(snap.share_fraction, f64), np.asarray(snap.arrival, f64),
        None if initial_shares is None else np.asarray(initial_shares, f64), flat_key.resource,
        None if snap.grown_rows is None else np.asarray(snap.grown_rows, dtype=np.int64), list(snap.fresh_shapes),
        None if grown_demands is None else np.asarray(grown_demands, f64),
        None if held is None else (held.node, held.shape), snap.reserving)
    if result is None:
        return False
    placements, blocked = result
    rows, arrival = snap.rows, snap.arrival
    # A run of placements of an entry's next tasks on one node, one after another, comes as
    # one (``count`` > 1) and is recorded as one decision listing its tasks, with the reason of
    # its first: the engine starts it as one and would publish it so (``engine._grouped``).
    for tenant, task, node, share, within, count in placements:
        tenant_key = fair_key(share, float(arrival[rows[tenant]]), tenant)
        cycle.record_placement(tenant, task, node, within, reason(cycle, tenant, tenant_key),
                               order_code(tenant_key, code), count)
    cycle.decisions.blocked = blocked
    return True


def _first_blocked_of_all(cycle: Cycle, only: list[str], key: KeyFn, initial_shares: np.ndarray | None,
                          blocked_key) -> None:
    """A pass over the candidate tenants ``only`` finds the first blocked task a pass over every
    tenant would: a waiting tenant left out fits no node (``Snapshot.candidates``), so a pass
    over all would have found its next task blocked when its key came up, if before
    ``blocked_key``. Its key cannot have moved: nothing of it was placed."""
    snapshot = cycle.snapshot
    chosen = set(only)
    if blocked_key is not None and initial_shares is not None and not cycle.capped:
        # Only a tenant whose share is not above the blocked key's can come before it: those
        # rows' names (rows are the tenants' positions), not every waiting tenant's.
        names, waiting = snapshot.tenants, snapshot.pending
        rest = [names[row] for row in np.flatnonzero(initial_shares <= blocked_key.share).tolist()]
        rest = [tenant for tenant in rest if tenant in waiting and tenant not in chosen]
    else:
        rest = [tenant for tenant in snapshot.pending if tenant not in chosen]
    if not rest:
        return
    if initial_shares is not None and not cycle.capped:  # the keys in one sort, in C: rest may be most tenants
        rows = np.array([snapshot.rows[t] for t in rest])
        shares = initial_shares[rows]
        arrival = snapshot.arrival[rows]
        order = np.lexsort((np.array(rest), arrival, shares)).tolist()
        keyed: Iterator[tuple[Any, str]] = ((fair_key(float(shares[i]), float(arrival[i]), rest[i]), rest[i]) for i in order)
    else:
        keyed = iter(sorted((key(cycle, t), t) for t in rest))
    for tenant_key, tenant in keyed:
        if blocked_key is not None and not tenant_key < blocked_key:
            return
        task = _first_short_of_room(cycle, tenant)
        if task is not None:
            cycle.decisions.blocked = (tenant, task)
            return


def _first_short_of_room(cycle: Cycle, tenant: str) -> Task | None:
    """The entry of ``tenant``, left out of the pass (nothing of it fits), that a pass over
    every tenant would have found first in line at its turn, or None: its entries in its order
    as ``try_place`` meets them, past those over a cap and those held by something other than
    room (``Cycle.short_of_room``: a reservation's keeping off, its job's max_per_node), each
    failing only for it. Shapes that failed for the candidates are tried again (``first_entry``):
    they failed after its turn (an earlier failure that was short of room would have been the
    first blocked; one that was not is not short of room for this tenant either)."""
    while (task := cycle.queues.first_entry(tenant)) is not None:
        if cycle.within_caps(tenant, task) and cycle.short_of_room(task):
            return task
        cycle.skip_for(tenant, task)  # (its shape, or its job over max_running, passed over for it alone)
    return None


def order_code(key: tuple, code: ReasonCode = ReasonCode.FAIR_ORDER) -> ReasonCode:
    """``MIN_SHARE`` when ``key`` is a ``FairKey`` of the below-min-share class, else ``code``."""
    return ReasonCode.MIN_SHARE if isinstance(key, FairKey) and key.priority == BELOW_MIN_SHARE else code


def room_for_any(free: np.ndarray, demands: np.ndarray) -> np.ndarray:
    """Per row of ``free`` (node x resource free room): does some row of ``demands`` (demand x
    resource) fit in it?"""
    return cast(np.ndarray, (demands[:, None, :] <= free[None, :, :] + EPSILON).all(axis=2).any(axis=0))


def leaf_arrival(snapshot: Snapshot, tenant: str) -> float:
    return float(snapshot.arrival[snapshot.rows[tenant]])


__all__ = ["Cycle", "DecisionList", "FlatKey", "ReasonFn", "Service", "TenantOrder", "dominant_share_order", "ordering_resource", "serve_in_order", "order_code", "leaf_arrival",
           "alignment_scores", "room_for_any"]
