"""Why a task waits, and where each tenant stands: the engine's state after a pass, explained
by the code that decides (issue "Operators can see why").

``explain(engine)`` reads the state a pass left (``Engine.snapshot``), builds the pass's own
working state on it (``placement.Cycle``) and asks it, per pending request, the questions the
pass asked: could any live node ever hold it (the engine's ``unschedulable`` verdict), would it
lift its tenant or a queue over ``max_share`` (``Cycle.within_caps``), is it over its tenant's
quota (the policy's ``quota``: static's partition), does any node its constraints allow have
room (``Cycle.find_node``), does any node have room at all. A request that waits for room waits
in the policy's own order of tenants (``PolicySpec.order``, the key its pass serves by): the
first waiting tenant gets the next room that fits its task, the others wait behind it. Nothing
here changes the engine: "what if" without mutation.

Reasons (``WaitReason``), the first that holds:

- ``unschedulable``: no live node it may use could hold it even idle (as its decision said);
- ``stage_not_released``: (simulation) its job's earlier stage, or the job it is chained
  after, has not finished;
- ``max_share``, ``max_resources``, ``max_running``: one more task would take its tenant or a
  queue above it over that limit (``max_running``: it would start one job too many);
- ``partition``: it does not fit in its tenant's quota (``static``'s partition);
- ``constraints``: nodes have room for it, but none its constraints allow;
- ``max_per_node``: nodes its constraints allow have room for it, but its job runs its
  ``max_per_node`` tasks on each of them: it waits for room on another node, or for one of
  those tasks to end;
- ``gang``: a gang none of which runs, and the free room holds fewer of its tasks than its
  size: how many fit now and where, how many more it needs at once, and the node held for it
  (docs/workloads.md, "Gangs"); a tenant behind it in the order is told that freed room may go
  first to the gang, if that room would let it start whole;
- ``next_pass``: a node has room for it now (a gang: room for all of it); the next pass places it;
- ``preemption_pending``: no node has room; its tenant is starved and preemption takes room
  back when the timeout runs out (``fairstream.core.preemption``);
- ``efficiency``: no node has room; when room frees, the policy's packing stage chooses among
  tenants (Tetris, QKnobler, Perf, FLEX), said in the policy's words;
- ``reservation``: no node has room; it is first in line and a node is reserved for it: room
  freed there is kept for it (``reservation=on``), the message says how much more it needs.
  Not from a tenant starved past its preemption timeout while its own tenant is at or above
  its fair share: then the message names that tenant, which may take it first;
- ``reserved_for_other``: the only node with room for it is reserved for another task (with
  ``reservation=backfill``: and its estimate, or the missing ones, say it may not backfill there;
  one that may is ``next_pass``);
- ``no_room``: no node has room; its tenant is first in the policy's order among the waiting
  (without a reservation: room freed in smaller pieces goes to smaller tasks);
- ``behind_tenants``: no node has room; tenants ahead of it in the policy's order get room
  first: the reason names the first of them and the gap in the policy's key.
"""

from __future__ import annotations

import functools
import heapq
import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from fairstream.core import gangs
from fairstream.core.forecast import expected_starts
from fairstream.core.model import EPSILON, ROOT, DecisionKind, ReasonCode, TaskState, gang_of
from fairstream.core.placement import Cycle, dominant_share_order
from fairstream.core.preemption import share_ratios
from fairstream.core.tenants import spec_to_json

if TYPE_CHECKING:
    from fairstream.core.engine import Engine
    from fairstream.core.model import Task


class WaitReason(str, Enum):
    UNSCHEDULABLE = "unschedulable"
    STAGE = "stage_not_released"
    MAX_SHARE = "max_share"
    MAX_RESOURCES = "max_resources"
    MAX_RUNNING = "max_running"
    PARTITION = "partition"
    CONSTRAINTS = "constraints"
    MAX_PER_NODE = "max_per_node"
    GANG = "gang"
    NEXT_PASS = "next_pass"
    PREEMPTION_PENDING = "preemption_pending"
    EFFICIENCY = "efficiency"
    RESERVATION = "reservation"
    RESERVED_FOR_OTHER = "reserved_for_other"
    NO_ROOM = "no_room"
    BEHIND_TENANTS = "behind_tenants"


@dataclass(frozen=True)
class PendingEntry:
    """A pending single task or request (``tasks`` > 1: tasks ``first`` ... of request ``id``)."""

    tenant: str
    id: str
    job: str
    tasks: int
    first: str
    position: int  # the tenant's pending tasks ahead of it (0: its next)
    demand: dict[str, float]
    submitted: float
    reason: WaitReason
    message: str
    waits_for: str | None = None  # behind_tenants, reservation: the tenant that gets the next room (elsewhere)
    gap: float | None = None  # behind_tenants: its key less that tenant's, in the policy's key
    # When its first task is expected to start (``fairstream.core.forecast``), None: unknown.
    expected_start: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"tenant": self.tenant, "id": self.id, "job": self.job, "tasks": self.tasks, "first": self.first,
                "position": self.position, "demand": self.demand, "submitted": self.submitted,
                "reason": self.reason.value, "message": self.message, "waits_for": self.waits_for, "gap": self.gap,
                "expected_start": self.expected_start}


@dataclass(frozen=True)
class HeldEntry:
    """Work its driver holds back from the engine (the simulator's later job stages)."""

    tenant: str
    id: str
    job: str
    tasks: int
    demand: dict[str, float]
    submitted: float
    stage: int
    after_job: str | None = None  # a chained job: it starts when this job has finished

    def message(self) -> str:
        if self.after_job is not None:
            return f"job {self.job} starts when job {self.after_job} has finished"
        return f"stage {self.stage} of job {self.job} starts when its earlier stages have finished"


@dataclass(frozen=True)
class TenantStatus:
    tenant: str
    weight: float  # as configured in the tree
    entitled: float  # effective share of the cluster (the weight fraction down the tree)
    fair_share: float  # the fair share (``fairness.fair_shares``) in the policy's measure
    share: dict[str, float]  # current allocation / cluster capacity, per resource
    order_value: float | None  # the policy's key (None: no work)
    rank: int | None  # 1-based among the tenants with pending work, in the policy's order
    quantum: float
    running: int
    pending: int
    accumulated: float  # normalised accumulated usage in the current round (``Accounting.usage_key``)
    starved_since: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"tenant": self.tenant, "weight": self.weight, "entitled": self.entitled,
                "fair_share": self.fair_share, "share": self.share, "order_value": _finite(self.order_value),
                "rank": self.rank, "quantum": _finite(self.quantum), "running": self.running,
                "pending": self.pending, "accumulated": self.accumulated, "starved_since": self.starved_since}


@dataclass(frozen=True)
class PendingGroup:
    """A tenant's pending tasks of one shape (same demand and constraints): they all wait for
    the same reason, in arrival order; ``tasks`` counts every one of them, listed or not."""

    tenant: str
    tasks: int
    entries: int
    demand: dict[str, float]
    reason: WaitReason
    message: str
    waits_for: str | None = None
    gap: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"tenant": self.tenant, "tasks": self.tasks, "entries": self.entries, "demand": self.demand,
                "reason": self.reason.value, "message": self.message, "waits_for": self.waits_for, "gap": self.gap}


@dataclass(frozen=True)
class Explanation:
    time: float
    policy: str
    order_label: str  # what ``TenantStatus.order_value`` is ("accumulated usage / weight")
    tenants: list[TenantStatus]
    # Per tenant, in its queue's order: its first ``max_entries`` pending entries, and every
    # pending task by shape (``groups``), so nothing goes unexplained when entries are capped.
    pending: dict[str, list[PendingEntry]] = field(default_factory=dict)
    groups: dict[str, list[PendingGroup]] = field(default_factory=dict)
    # The tenant tree as configured: every queue and leaf (``tenants.spec_to_json``), parents first.
    tree: list[dict[str, Any]] = field(default_factory=list)

    def status_json(self) -> dict[str, Any]:
        return {"time": self.time, "policy": self.policy, "order": self.order_label,
                "tenants": [t.to_json() for t in self.tenants], "tree": self.tree}

    def pending_json(self) -> dict[str, Any]:
        return {"time": self.time, "policy": self.policy, "order": self.order_label,
                "pending": {t: [e.to_json() for e in entries] for t, entries in self.pending.items()},
                "groups": {t: [g.to_json() for g in groups] for t, groups in self.groups.items()}}


def _text(value: Any) -> str:
    """A demand or constraint as compact JSON, for messages."""
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def _finite(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else value


def explain(engine: Engine, held: Iterable[HeldEntry] = (), max_entries: int | None = None,
            forecast: tuple[int, int] | None = None) -> Explanation:
    """The engine's state now: every tenant's status and every pending request's reason
    (module docstring). ``held``: work its driver has not submitted yet (later stages).
    ``max_entries``: list at most so many entries per tenant (its first), the rest only in its
    groups: the cost is then the tenants and shapes, not the pending tasks. ``forecast``: (steps,
    tasks), each listed entry's ``expected_start`` from ``forecast.expected_starts`` looking so
    many steps ahead, on an engine of at most so many tasks (tasks end at their estimates,
    nothing new arrives)."""
    spec, params = engine.spec, engine.params
    snap = engine.snapshot()
    cycle = Cycle(snap, engine.policy)
    order = spec.ordering.order(snap, params) if spec.ordering.order is not None else dominant_share_order(snap)
    label = order.label if spec.ordering.order is not None else f"{order.label} (DRF's order, standing in: {spec.name} " \
                                                       f"has no tenant order of its own)"
    quota = spec.ordering.quota(snap, params) if spec.ordering.quota is not None else None
    acc = engine.accounting
    names = engine.resources.names
    live = snap.free[:, 0] >= 0 if len(snap.free) else np.zeros(0, dtype=bool)
    node_capacity = cast(np.ndarray, snap.node_capacity)  # (the engine's snapshots have it)

    keys = {tenant: order.key(cycle, tenant) for tenant in snap.pending}
    ranked = sorted(snap.pending, key=lambda t: keys[t])
    rank = {tenant: k + 1 for k, tenant in enumerate(ranked)}

    # Per tenant and shape: the reason its head waits, before the order is applied.
    verdicts: dict[tuple[str, int], tuple[WaitReason, str] | None] = {}
    room_limited: list[str] = []
    # Per tenant waiting for room, per waiting head: the nodes where room would serve it, and its demand.
    reach: dict[str, list[tuple[np.ndarray, tuple[float, ...], Task]]] = {}
    reserved_for = engine.reservation
    # Tenants ahead of the reservation's holder in the order: the pass serves them with the
    # reservation open (``placement.serve_in_order``), so the reserved node is in their reach.
    ahead_of_holder = set() if reserved_for is None or reserved_for.tenant not in keys else {
        tenant for tenant in snap.pending if keys[tenant] < keys[reserved_for.tenant]}

    def may_use(task: Task, now: bool = True) -> np.ndarray:
        """The live nodes that could hold ``task`` and that its constraints allow, and (``now``)
        the reservation: the reserved node serves its reserved task first, the tenants behind
        its holder after it."""
        mask = (live & cycle.nodes.eligible(task.constraints) & (node_capacity >= task.demand - EPSILON).all(axis=1)
                & cycle.nodes.below_job_limit(task.tenant, task))
        if (now and reserved_for is not None and reserved_for.shape != task.shape
                and task.tenant not in ahead_of_holder):
            mask = mask.copy()
            mask[list(reserved_for.rows)] = False
        return mask

    held_by_limit: dict[str, dict[str, tuple[WaitReason, str]]] = {}
    heads: dict[str, dict[int, Task]] = {}  # per tenant, per shape: the entry its pass tries first
    for tenant in ranked:
        limited = False
        held_by_limit[tenant] = held_jobs = _jobs_over_max_running(cycle, tenant, cycle.queues.job_queue(tenant))
        heads[tenant] = tenant_heads = _heads(snap.pending[tenant].groups, cycle.queues.job_queue(tenant), held_jobs)
        for shape, head in tenant_heads.items():
            verdicts[(tenant, shape)] = verdict = _shape_verdict(engine, cycle, quota, tenant, head, live)
            # Waiting for room: none has any, or the only room is kept for another's reserved task
            # or on nodes its constraints exclude (room freed on a node it may use goes to it in
            # its turn).
            if verdict is None or verdict[0] in _WAITS_FOR_ROOM:
                limited = True
                reach.setdefault(tenant, []).append((may_use(head), head.demand_values, head))
        if limited:
            room_limited.append(tenant)
    # Tenants starved past the preemption timeout: the pass's last stage makes room for them,
    # taking back from tenants above their share what the pass gave them (``preemption.reclaim``):
    # in their turn, they may take any room on a node they may use, whatever their tasks' size
    # (if victims there make up the rest of what their task needs).
    # A tenant at or above its fair share is a victim for them: room given to it in the pass is
    # taken back (withdrawn) for an overdue tenant whatever their order.
    # A reservation of a tenant at or above its fair share does not hold against them either
    # (``preemption._make_room``): the reserved node is in their reach.
    @functools.cache
    def ratios_now() -> np.ndarray:
        """Per tenant row, its share over its fair share now (made once, when first asked)."""
        return share_ratios(acc.allocation, acc.capacity, engine.fair_shares(), acc.config.resource)

    @functools.cache
    def victim_key_now():
        """The policy's own victim key on this state (``Ordering.victims``; made once)."""
        return spec.ordering.victims[1](snap)

    overdue: list[str] = []
    at_fair_share: set[str] = set()
    if engine.preemption is not None:
        timeout = engine.preemption.timeout
        # A tenant starved past its timeout whose next entry is a gang waiting to start whole
        # (``gang``) waits for room too: the stage may free room for the whole gang, taking
        # back what the pass gave others (``preemption._make_room_for_gang``). In the way, then,
        # as any overdue tenant (its gang heads in ``reach``), though its own reason is ``gang``.
        for tenant in ranked:
            if (tenant not in room_limited and tenant in engine.starved_since
                    and snap.time - engine.starved_since[tenant] >= timeout - EPSILON):
                gang_heads = [head for shape, head in heads[tenant].items()
                              if (v := verdicts.get((tenant, shape))) is not None and v[0] is WaitReason.GANG]
                if gang_heads:
                    reach.setdefault(tenant, []).extend((may_use(h), h.demand_values, h) for h in gang_heads)
                    room_limited.append(tenant)
        room_limited.sort(key=lambda t: rank[t])
        overdue = [t for t in room_limited if t in engine.starved_since
                   and snap.time - engine.starved_since[t] >= timeout - EPSILON]
        if overdue:
            ratios = ratios_now()
            at_fair_share = {t for t in snap.pending if ratios[snap.rows[t]] >= 1.0 - EPSILON}

    def may_be_victim(victim: str, starved: str, demand: np.ndarray) -> bool:
        """Whether what the pass gives ``victim`` (a task of ``demand``) may be taken back for
        overdue ``starved``: ``victim`` is at or above its fair share, and under a policy that
        picks victims by a key of its own (``Ordering.victims``: LTRF's long-term usage) its key
        with that task charged (one quantum of it, as the pass charges it) is above
        ``starved``'s, unless ``starved`` is below its min_share (``preemption._make_room``)."""
        if victim not in at_fair_share:
            return False
        if spec.ordering.victims is None or cycle.below_min_share(starved):
            return True
        row = snap.rows[victim]
        charged = snap.accumulated.copy()
        charged[row] = charged[row] + snap.quantum[row] * demand
        charged_key = spec.ordering.victims[1](replace(snap, accumulated=charged))
        return charged_key(victim, acc.allocation) > victim_key_now()(starved, acc.allocation)

    reservation_yields = reserved_for is not None and reserved_for.tenant in at_fair_share
    # Whether the reservation's holder has a task of the reserved shape its job limits let start:
    # if not (max_running holds them all), the pass gives the room kept there to the next task of
    # that shape, another tenant's, in its turn.
    holder_group = (None if reserved_for is None or reserved_for.tenant not in snap.pending
                    else snap.pending[reserved_for.tenant].groups.get(reserved_for.shape))
    holder_may_start = holder_group is not None and any(
        entry.job not in held_by_limit.get(reserved_for.tenant, {}) for entry in _pending_entries(holder_group))

    def in_the_way(other: str, task: Task, mask: np.ndarray) -> np.ndarray | None:
        """Of the nodes ``mask`` (those ``task`` may use), where ``other`` would take room freed
        for ``task``: those it waits for with a task no larger (it fits the room that fits
        ``task``), and the node reserved for it, whatever its size; None: none."""
        out = None
        limit = [x + EPSILON for x in task.demand_values]
        starved = other in overdue
        # (the reserved node too when the reservation yields, whichever task is explained: room
        # freed there for a task of the reserved shape, the holder's or another tenant's, goes to
        # a starved tenant ahead first, as to any other task's)
        widened = starved and reservation_yields
        for nodes, demand, head in reach[other]:
            if widened:
                nodes = may_use(head, now=False)
            if starved or all(d <= x for d, x in zip(demand, limit)):  # (overdue: ``in_the_way``)
                out = nodes & mask if out is None else out | (nodes & mask)
        # The room on ``other``'s reserved node is kept for it (if a task of it of that shape may
        # start), but not from ``task`` if it backfills there (another shape, expected to end
        # before the reserved task can start: ``reservation=backfill``).
        # Nor from an overdue tenant when the reservation yields (its holder at or above its fair
        # share): preemption's stage gives it the room there (``preemption._make_room``).
        if (reserved_for is not None and reserved_for.tenant == other and mask[list(reserved_for.rows)].any()
                and holder_may_start and not (task.shape != reserved_for.shape and cycle.nodes.ends_in_time(task))
                and not (reservation_yields and task.tenant in overdue)):
            out = np.zeros_like(mask) if out is None else out
            for row in reserved_for.rows:
                out[row] = bool(mask[row])  # the room there is kept for it
        return out if out is not None and out.any() else None

    what_if: dict[float, list] = {}  # per time, the decisions of a pass then on this state

    def reclaims_at(tenant: str, due: float) -> bool:
        """Whether the pass at ``due`` takes room back for ``tenant`` if nothing changes till
        then (what-if: the policy's pass on this state at that time, the running tasks given
        as the engine gives them to a pass with an overdue tenant; nothing changes)."""
        if due not in what_if:
            what_if[due] = spec.decide(replace(snap, time=due, running_tasks=engine.running_tasks()), params)
        return any(d.kind is DecisionKind.PLACE and d.code is ReasonCode.RECLAIMED and d.tenant == tenant
                   for d in what_if[due])

    def _preemption_due(tenant: str, due: float) -> str:
        """What its preemption timeout, running out at ``due``, does for ``tenant``: takes room
        back from tenants above their fair share (none now: it says so; none on a node it may
        use, as the pass then would find if nothing changes: says so too); under a policy that
        picks victims by a key of its own (``Ordering.victims``: LTRF's long-term usage), only
        from those with a higher key than it (unless it is below its min_share), named as they
        are now."""
        ratios = ratios_now()
        above = [t for t in sorted(snap.rows) if t != tenant and ratios[snap.rows[t]] > 1.0 + EPSILON]
        if not above:
            return (f": its preemption timeout runs out at {due:g}, but room is taken back only from tenants above "
                    f"their fair share, and none is now")
        if spec.ordering.victims is None or cycle.below_min_share(tenant):
            if reclaims_at(tenant, due):
                return f": preemption takes room back for it at {due:g}"
            return (f": its preemption timeout runs out at {due:g}, but as things stand no node it may use can be "
                    f"freed enough for it from tenants above their fair share (each keeps its own fair share)")
        victim_label, victim_key = spec.ordering.victims[0], victim_key_now()
        own = victim_key(tenant, acc.allocation)
        used_more = [t for t in above if victim_key(t, acc.allocation) > own]
        used_less = [t for t in above if t not in used_more]
        if used_more:
            now = f"now {', '.join(used_more)}"
        else:
            now = "none has now" + (f" ({', '.join(used_less)} above {'their' if len(used_less) != 1 else 'its'} "
                                    f"fair share used less)" if used_less else "")
        return (f": its preemption timeout runs out at {due:g}, but room is taken back for it only from tenants "
                f"above their fair share that have used more over the long term ({victim_label} above its "
                f"{own:.4g}): {now}")

    def first_for(tenant: str, task: Task) -> tuple[str, bool]:
        """The first tenant in line for room freed for ``task`` (the first in the order that
        waits for room it would fit, on a node both may use; ``tenant`` itself if none is
        ahead of it), and whether that tenant is ahead on some of ``task``'s nodes only."""
        mask = may_use(task, now=False)  # (on its node, the reserved task comes first)
        for other in overdue:
            nodes = (in_the_way(other, task, mask) if other != tenant and may_be_victim(tenant, other, task.demand)
                     else None)
            if nodes is not None:
                return other, bool((mask & ~nodes).any())
        for other in room_limited:
            if other == tenant:
                return tenant, False
            nodes = in_the_way(other, task, mask)
            if nodes is not None:
                # What the pass gives ``other`` there may be taken back for a tenant starved past
                # its timeout that waits for that room too (``other`` at or above its fair share:
                # ``preemption._make_room``): the room may end with that tenant, named instead.
                for starved in overdue:
                    if starved not in (tenant, other) and may_be_victim(other, starved, task.demand):
                        taken = in_the_way(starved, task, mask)
                        if taken is not None and (taken & nodes).any():
                            return starved, bool((mask & ~taken).any())
                return other, bool((mask & ~nodes).any())
        return tenant, False

    def gang_ahead(tenant: str, task: Task) -> tuple[str, Task, int, int] | None:
        """The first gang waiting to start whole (``gang``) of a tenant ahead of ``tenant`` in the
        order that room freed for ``task`` may let start, on a node both may use: (its tenant,
        its entry, how many of it fit now, its size); None if none. May: the room on one node
        freed to ``task``'s demand holds that many more of it at most, and it fits whole with
        them (an upper bound: the pass serves the gang first, and it starts if it then fits)."""
        if not waiting_gangs:
            return None
        mask = may_use(task, now=False)
        for other, head in waiting_gangs:
            if other == tenant or not keys[other] < keys[tenant]:
                break
            if (mask & may_use(head, now=False)).any():
                size = gangs.need(cycle, head)
                fit = sum(n for _, n in gangs.room(cycle, head, size))
                more = math.floor(min(((t + EPSILON) / d for t, d in zip(task.demand_values, head.demand_values)
                                       if d > EPSILON), default=float(size)))
                if fit + more >= size:
                    return other, head, fit, size
        return None

    # The gangs waiting to start whole (``gang``), in the order: only they may go first in
    # ``gang_ahead`` (usually none: then it costs nothing).
    waiting_gangs = [(other, head) for other in ranked for head in heads[other].values()
                     if (verdict := verdicts.get((other, head.shape))) is not None and verdict[0] is WaitReason.GANG]

    def in_line(tenant: str) -> str:
        """"first in line" when nothing is ahead of ``tenant`` in the order (rank 1); else what is
        true: tenants ahead of it wait for other room (limits, other shapes or nodes). An entry
        once said "first in line" at rank 2."""
        ahead = rank[tenant] - 1
        if ahead == 0:
            return "first in line"
        return (f"first in line for this room ({ahead} tenant{'s' if ahead != 1 else ''} ahead of it in the order "
                f"wait{'s' if ahead == 1 else ''} for other room or {'are' if ahead != 1 else 'is'} held by a limit)")

    def room_reason(tenant: str, task: Task) -> tuple[WaitReason, str, str | None, float | None]:
        need = _text(engine.resources.as_dict(task.demand))
        nowhere = "no node has room" if task.constraints.empty else "no node its constraints allow has room"
        since = engine.starved_since.get(tenant)
        if engine.preemption is not None and since is not None:
            due = since + engine.preemption.timeout
            if due > snap.time:
                below = f"{nowhere} for {need}; {tenant} is below {engine.preemption.threshold:g} x its fair share since {since:g}"
                return (WaitReason.PREEMPTION_PENDING, below + _preemption_due(tenant, due), None, None)
        if spec.ordering.efficiency is not None:
            return WaitReason.EFFICIENCY, f"{nowhere} for {need}; when room frees, {spec.ordering.efficiency}", None, None
        gang = gang_ahead(tenant, task)
        if gang is not None:
            other, head, fit, size = gang
            return (WaitReason.BEHIND_TENANTS,
                    f"{nowhere} for {need}; freed room may go first to {other}'s gang {gang_of(head)} "
                    f"({label} {order.value(keys[other]):.4g} against {tenant}'s {order.value(keys[tenant]):.4g}), "
                    f"if with it the gang starts whole ({fit} of its {size} fit now)", other,
                    order.value(keys[tenant]) - order.value(keys[other]))
        first, partly = first_for(tenant, task)
        if reserved_for is not None and reserved_for.tenant == tenant and reserved_for.shape == task.shape:
            lacking = np.maximum(task.demand - snap.free[reserved_for.node], 0.0)
            short = _text({r: round(float(x), 6) for r, x in zip(names, lacking.tolist()) if x > EPSILON})
            node = snap.node_ids[reserved_for.node]
            if first != tenant and first in overdue:  # (then ``tenant`` is at or above its fair share: ``first_for``)
                return (WaitReason.RESERVATION,
                        f"node {node} is reserved for {tenant}'s next task of this shape ({reserved_for.task}), and it "
                        f"needs {short} more there; room freed there is kept for it from the tenants behind it in line, but not from {first}, starved past "
                        f"its preemption timeout, as {tenant} is at or above its fair share: {first} may take it first "
                        f"({label} {order.value(keys[first]):.4g} against {tenant}'s {order.value(keys[tenant]):.4g})",
                        first, order.value(keys[tenant]) - order.value(keys[first]))
            reserved = (f"node {node} is reserved for {tenant}'s next task of this shape "
                        f"({reserved_for.task}): room freed there is kept for it from the tenants behind it in line, and it "
                        f"needs {short} more there")
            if tenant == first:
                return (WaitReason.RESERVATION, f"{reserved} ({in_line(tenant)}, {label} {order.value(keys[tenant]):.4g})",
                        None, None)
            # A tenant ahead of it waits for room that would fit it: on other nodes, or on this
            # one with a task of the same shape (the room there is kept for the shape).
            where = " on the nodes both may use" if partly else ""
            return (WaitReason.RESERVATION, f"{reserved}; freed room{where} goes first to {first} ({label} "
                                            f"{order.value(keys[first]):.4g} against {tenant}'s "
                                            f"{order.value(keys[tenant]):.4g})",
                    first, order.value(keys[tenant]) - order.value(keys[first]))
        if tenant == first:
            pieces = ("; room freed in smaller pieces goes to smaller tasks behind it (reservation is off)"
                      if not engine.reserving else "")
            return (WaitReason.NO_ROOM, f"{nowhere} for {need}; {tenant} is {in_line(tenant)}: the first room "
                                        f"that frees for it on one node goes to it ({label} "
                                        f"{order.value(keys[tenant]):.4g}){pieces}", None, None)
        gap = order.value(keys[tenant]) - order.value(keys[first])
        ahead = room_limited.index(tenant)
        on_both = " on the nodes both may use" if partly else ""
        # A tenant starved past its timeout is in the way whatever its tasks' size (``in_the_way``):
        # it takes the room only if its preemption stage can free the rest there, so "may". And
        # for a tenant starved past its timeout, one ahead at or above its fair share may be its
        # victim: what the pass gives it (its reservation's room too) may be taken back for this
        # tenant, if that keeps it at or above its fair share (``preemption._victims_on_node``).
        starved = ", starved past its preemption timeout: room is taken back for it" if first in overdue else ""
        victim = tenant in overdue and may_be_victim(first, tenant, task.demand)
        if victim:
            starved += (f"; {first} is at or above its fair share: what the pass gives it may be taken back for "
                        f"{tenant}, starved past its preemption timeout")
        goes = "may go first" if first in overdue or victim else "goes first"
        return (WaitReason.BEHIND_TENANTS,
                f"{nowhere} for {need}; freed room{on_both} {goes} to {first} ({label} "
                f"{order.value(keys[first]):.4g} against {tenant}'s {order.value(keys[tenant]):.4g}{starved}; "
                f"{ahead} waiting tenant{'s' if ahead != 1 else ''} ahead)", first, gap)

    pending: dict[str, list[PendingEntry]] = {}
    groups: dict[str, list[PendingGroup]] = {}
    limit = math.inf if max_entries is None else max_entries
    for tenant in ranked:
        why: dict[int, tuple[WaitReason, str, str | None, float | None]] = {}  # per shape, said once
        held_jobs = held_by_limit[tenant]
        for shape, head in heads[tenant].items():
            verdict = verdicts.get((tenant, shape))
            why[shape] = room_reason(tenant, head) if verdict is None else (*verdict, None, None)
        jobs = cycle.queues.job_queue(tenant)
        # Jobs that may not start (a max_running above the leaf is reached): their tasks wait
        # for that, whatever the rest of their shape waits for.
        groups[tenant] = []
        for shape, group in snap.pending[tenant].groups.items():
            if shape not in why:
                continue
            demand = dict(cast("Task", group.pending_at(0)[0]).demand_map)  # (a group listed has a pending head)
            if not held_jobs:  # the usual case: the whole shape waits for one reason
                groups[tenant].append(PendingGroup(tenant, group.count, sum(1 for _ in _pending_entries(group)),
                                                   demand, *why[shape]))
                continue
            entries = list(_pending_entries(group))
            waiting_for_room = [e for e in entries if e.job not in held_jobs]
            waiting_for_job = [e for e in entries if e.job in held_jobs]
            if waiting_for_room:
                groups[tenant].append(PendingGroup(tenant, sum(e.count for e in waiting_for_room),
                                                   len(waiting_for_room), demand, *why[shape]))
            if waiting_for_job:
                groups[tenant].append(PendingGroup(tenant, sum(e.count for e in waiting_for_job), len(waiting_for_job),
                                                   demand, *held_jobs[waiting_for_job[0].job], None, None))
        out: list[PendingEntry] = []
        position = 0
        # The tenant's queue in arrival order (its shapes' lists merged), or in its jobs' order
        # if it orders them (TenantSpec.ordering), as far as listed.
        if jobs is None or jobs.ordering == "fifo":
            queue = heapq.merge(*(_pending_entries(g) for g in snap.pending[tenant].groups.values()),
                                key=lambda t: t.seq)
        else:
            queue = (entry for job in jobs.jobs_in_order() for entry in jobs.entries[job])
        for task in queue:
            if len(out) >= limit:
                break
            reason = (*held_jobs[task.job], None, None) if task.job in held_jobs else why[task.shape]
            out.append(PendingEntry(tenant, task.id, task.job, task.count, task.task_id(), position,
                                    dict(task.demand_map), task.submit, *reason))
            position += task.count
        pending[tenant] = out
    if forecast is not None:
        starts = expected_starts(engine, (e.first for entries in pending.values() for e in entries), *forecast)
        if starts:
            pending = {tenant: [replace(e, expected_start=starts.get(e.first)) for e in entries]
                       for tenant, entries in pending.items()}
    for entry in held:  # after everything submitted: it arrives when its stage is released
        listed = pending.setdefault(entry.tenant, [])
        queued = sum(g.tasks for g in groups.get(entry.tenant, ())) + sum(
            e.tasks for e in listed if e.reason is WaitReason.STAGE)
        first_id = f"{entry.id}-0" if entry.tasks > 1 else entry.id
        stage = PendingEntry(entry.tenant, entry.id, entry.job, entry.tasks, first_id, queued, dict(entry.demand),
                             entry.submitted, WaitReason.STAGE, entry.message())
        if len(listed) < limit:
            listed.append(stage)
        groups.setdefault(entry.tenant, []).append(PendingGroup(entry.tenant, entry.tasks, 1, dict(entry.demand),
                                                                WaitReason.STAGE, stage.message))

    fair = engine.fair_shares()
    capacity = acc.capacity
    accumulated = acc.usage_keys(list(range(len(acc.ledgers))), snap.time)
    tenants = []
    for row, ledger in enumerate(acc.ledgers):
        name = ledger.name
        queue = engine.pending.get(name)
        waiting = queue.count if queue is not None else 0
        key = keys.get(name)
        if key is None and (waiting or ledger.running):
            key = order.key(cycle, name)
        share = {r: float(acc.allocation[row, i] / capacity[i]) if capacity[i] > 0 else 0.0
                 for i, r in enumerate(names)}
        spec_node = engine.tree.specs.get(name)
        tenants.append(TenantStatus(
            name, float(spec_node.weight) if spec_node is not None else 1.0, float(acc.fractions[row]),
            float(fair[row]), share, order.value(key) if key is not None else None, rank.get(name),
            float(acc.quantum(row)), int(ledger.running), int(waiting), float(accumulated[row]),
            engine.starved_since.get(name)))
    tree = [spec_to_json(engine.tree.specs[name]) for name in _parents_first(engine.tree)]
    return Explanation(snap.time, engine.policy, label, tenants, pending, groups, tree)


def _parents_first(tree) -> list[str]:
    """The tree's tenants depth first, children by name (a queue before what is below it)."""
    out: list[str] = []

    def walk(node: str) -> None:
        for child in sorted(tree.children.get(node, ())):
            out.append(child)
            walk(child)

    walk(ROOT)
    return out


def _jobs_over_max_running(cycle: Cycle, tenant: str, jobs) -> dict[str, tuple[WaitReason, str]]:
    """Per job of ``tenant`` that may not start now because a max_running on its path is
    reached: the reason and its sentence (``Cycle.over_cap``)."""
    if jobs is None or not cycle.job_limits:
        return {}
    out = {}
    for job, entries in jobs.entries.items():
        over = cycle.limits.over_cap(tenant, entries[0])
        if over is not None and over[0] == "max_running":
            out[job] = (WaitReason.MAX_RUNNING, over[1])
    return out


def _heads(groups, jobs, held_jobs) -> dict[int, Task]:
    """Per shape of a tenant's queue (``groups``: its shapes' lists), the entry a pass tries
    first: the first pending one whose job is not held by max_running (``held_jobs``), or, all
    held, the first. In arrival order; in its jobs' order if the pass serves it job by job
    (``jobs``, its ``JobQueue``): a later entry of the shape then goes first when its job does,
    and why it waits is why the shape waits (with backfill, its estimate keeps the shape off
    the reserved node's room for the tenant even if a later entry's would not)."""
    if jobs is None:
        return {shape: next((e for e in _pending_entries(group) if e.job not in held_jobs), head)
                for shape, group in groups.items() if (head := group.pending_at(0)[0]) is not None}
    first: dict[int, Task] = {}
    free: dict[int, Task] = {}
    for job in jobs.jobs_in_order():
        for entry in jobs.entries[job]:
            first.setdefault(entry.shape, entry)
            if job not in held_jobs:
                free.setdefault(entry.shape, entry)
    return {shape: free.get(shape, entry) for shape, entry in first.items()}


#: Verdicts of a task that waits for room all the same: its tenant is in line for room that
#: frees on a node it may use.
_WAITS_FOR_ROOM = frozenset({WaitReason.RESERVED_FOR_OTHER, WaitReason.CONSTRAINTS, WaitReason.MAX_PER_NODE})


def _no_backfill(engine: Engine, snap, head: Task) -> str:
    """Why ``head`` may not backfill the reserved node's room (``reservation=backfill``), or ""."""
    if engine.params.get("reservation") != "backfill":
        return ""
    if snap.backfill_until is None:
        return ("; it cannot backfill there: a task running there has no run-time estimate, so when the reserved "
                "task can start is unknown")
    # (Said of every entry of the shape: the head's estimate keeps them all off, since a
    # tenant's tasks of one shape start in its queue's order.)
    first = f"{head.task_id()}, the first of {head.tenant}'s tasks of this shape in its queue's order,"
    if head.estimate is None:
        return f"; it cannot backfill there: {first} has no run-time estimate (its tasks of one shape start in order)"
    return (f"; it cannot backfill there: {first} has an estimate ({head.estimate:g} s) that has it end at "
            f"{snap.time + head.estimate:g}, after {snap.backfill_until:g}, when the reserved task can start there "
            f"(its tasks of one shape start in order)")


def _pending_entries(group) -> Iterator[Task]:
    """The pending entries of one shape's list (``snapshot.TaskList``), in arrival order."""
    for task in group.tasks[group.head:]:
        if task.state is TaskState.PENDING:
            yield task


def _gang_verdict(cycle: Cycle, tenant: str, head: Task) -> tuple[WaitReason, str]:
    """Why gang ``head`` (none of it running) waits: a limit the whole gang would cross, or the
    free room holding fewer of its tasks than it needs at once (how many fit now and where, and
    the node held for it); ``next_pass`` if all of it fits now."""
    need = gangs.need(cycle, head)
    if cycle.capped and (over := cycle.limits.over_cap(tenant, gangs.sized(head, need))) is not None:
        return WaitReason(over[0]), f"gang {gang_of(head)} of {need} starts whole: {over[1]}"
    rows = gangs.room(cycle, head, need)
    fit = sum(n for _, n in rows)
    if fit >= need:
        return WaitReason.NEXT_PASS, f"room for the whole gang {gang_of(head)} of {need} now: the next pass starts it"
    snap = cycle.snapshot
    where = f" ({', '.join(f'{snap.node_ids[node]}: {n}' for node, n in rows)})" if rows else ""
    held = cycle.reservation
    kept = ""
    if held is not None and held.tenant == tenant and held.shape == head.shape:
        names = ", ".join(snap.node_ids[row] for row in held.rows)
        since = f" since {held.since:g}" if held.since is not None else ""
        kept = (f"; node{'s' if held.more else ''} {names} {'are' if held.more else 'is'} reserved for it{since}: room freed "
                f"there is kept for it from the tenants behind it in line"
                + (f" until {held.until:g}" if held.until != math.inf else ""))
    return (WaitReason.GANG, f"gang {gang_of(head)} of {need} ({_text(head.demand_map)} each) starts whole or not at "
                             f"all: {fit} fit{'s' if fit == 1 else ''} now{where}, it needs room for {need - fit} more "
                             f"at once{kept}")


def _shape_verdict(engine: Engine, cycle: Cycle, quota, tenant: str, head: Task,
                   live: np.ndarray) -> tuple[WaitReason, str] | None:
    """Why the head of one of ``tenant``'s shapes waits, unless only for room (None)."""
    unschedulable = engine.verdicts.reason(head.shape)
    if unschedulable is not None:
        return WaitReason.UNSCHEDULABLE, unschedulable
    over = cycle.limits.over_cap(tenant, head) if cycle.capped else None
    if over is not None:
        return WaitReason(over[0]), over[1]
    if quota is not None and not quota(cycle, tenant, head):
        return WaitReason.PARTITION, f"{tenant}'s partition is full: it waits for its own tasks to finish"
    if gangs.waits(cycle, head):
        return _gang_verdict(cycle, tenant, head)
    if cycle.nodes.find_node(head) is not None:
        return WaitReason.NEXT_PASS, "a node has room for it now: the next pass places it"
    held = cycle.reservation
    if (row := cycle.nodes.backfill_node(head)) is not None:
        assert held is not None  # (backfilled onto the reserved node)
        return (WaitReason.NEXT_PASS, f"node {cycle.snapshot.node_ids[row]} has room for it, reserved for "
                                      f"{held.tenant}'s task {held.task}, and it is expected to end before that task "
                                      f"can start: the next pass backfills it there")
    if cycle.nodes.kept_off_reserved_room(head):
        assert held is not None  # (kept off the reserved node's room)
        row = cast(int, cycle.nodes.reserved_room_for(head))
        until = f", until {held.until:g}" if held.until != math.inf else ""
        whose = f"gang {held.task.rpartition('-')[0]}{until}" if held.for_gang else f"task {held.task}"
        return (WaitReason.RESERVED_FOR_OTHER, f"node {cycle.snapshot.node_ids[row]} has room for it, but that "
                                               f"room is kept for {held.tenant}'s {whose}, reserved there"
                                               f"{_no_backfill(engine, cycle.snapshot, head)}")
    if cycle.nodes.held_by_job_limit(head):
        most = head.constraints.max_per_node
        full = int(cycle.nodes.nodes_held_by_job_limit(head).sum())
        return (WaitReason.MAX_PER_NODE, f"{full} node{'s' if full != 1 else ''} its constraints allow "
                                         f"{'have' if full != 1 else 'has'} room for it, but job {head.job} runs its "
                                         f"max_per_node {most} task{'s' if most != 1 else ''} on "
                                         f"{'each' if full != 1 else 'it'}: it waits for room on another node or for "
                                         f"one of those tasks to end")
    if not head.constraints.empty:
        free = cycle.free[live]
        with_room = int((free >= head.demand - EPSILON).all(axis=1).sum()) if len(free) else 0
        if with_room:
            reserved = (f"; node {', '.join(cycle.snapshot.node_ids[row] for row in held.rows)} is reserved for it"
                        if held is not None and held.tenant == tenant and held.shape == head.shape else "")
            return (WaitReason.CONSTRAINTS, f"{with_room} node{'s have' if with_room != 1 else ' has'} room for it, "
                                            f"but its constraints {_text(head.constraints.to_json())} exclude "
                                            f"{'them' if with_room != 1 else 'it'}{reserved}")
    return None


MAX_NODES_LISTED = 500


def node_status(engine: Engine, limit: int = MAX_NODES_LISTED) -> dict[str, Any]:
    """Every node as the page's per-node view shows it (docs/visibility.md): live or lost, its
    capacity and what running tasks use of it, and the reservation it holds, if any (for whom,
    which task or gang, since and until when). The nodes held for the reservation first, then
    the most used (the largest share of any resource), then by id: at most ``limit`` of them,
    with ``nodes_total``. Costs the nodes, once per explanation the worker writes."""
    registry = engine.registry
    names = engine.resources.names
    held = engine.reservation
    held_rows = set() if held is None else set(held.rows)
    reserved = None
    if held is not None:
        reserved = {"tenant": held.tenant, "task": held.task, "gang": held.for_gang,
                    "nodes": [registry.ids[row] for row in held.rows], "since": held.since,
                    "until": _finite(held.until)}
    capacity, used, alive = registry.capacity, registry.used, registry.alive
    with np.errstate(divide="ignore", invalid="ignore"):
        busy = np.where(capacity > 0, used / np.where(capacity > 0, capacity, 1.0), 0.0).max(axis=1) \
            if len(capacity) else np.zeros(0)
    order = sorted(range(len(registry.ids)), key=lambda row: (row not in held_rows, -float(busy[row]), registry.ids[row]))
    rows = []
    for row in order[:limit]:
        rows.append({"node": registry.ids[row], "alive": bool(alive[row]),
                     "capacity": dict(zip(names, capacity[row].tolist())), "used": dict(zip(names, used[row].tolist())),
                     "busy": float(busy[row]), "reserved": reserved if row in held_rows else None})
    return {"time": engine.time, "nodes": rows, "nodes_total": len(registry.ids), "reservation": reserved}


__all__ = ["WaitReason", "PendingEntry", "PendingGroup", "HeldEntry", "TenantStatus", "Explanation", "explain", "node_status"]

