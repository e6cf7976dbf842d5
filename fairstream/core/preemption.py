"""Preemption toward fair share: taking room back for a tenant starved past a timeout.

The rule operators know from YARN's Fair Scheduler (``fairSharePreemptionThreshold``,
``fairSharePreemptionTimeout``): a tenant that has pending work some node could hold, and has
stayed below ``threshold`` x its fair share for ``timeout`` seconds of event time, is *starved*;
the scheduler then kills running tasks of tenants above their share and gives the room to it.

What "fair share" means here: the one fair share (``fairness.fair_shares``, YARN's): the tree
divided queue by queue among the children with demand, by weight, each capped by its demand,
max_share and max_resources and raised to its min_share, measured in the policy's own resource
(``AccountingConfig.resource``: one resource, or the dominant share). A tenant's *share ratio*
is its current share over that: 1 is exactly its fair share. The demand counts what runs and
what waits, so moving a task from one to the other in a pass does not move the fair share.

``reclaim`` is the last stage of a pass, pure like the rest (it works on the pass's ``Cycle``):

- victims come from the tenants furthest above their share in the policy's own order
  (``victim_key``: the highest first; long-term usage for LTRF and H-LTRF; for the memoryless
  policies the share ratio itself), the youngest task first (latest start, then latest
  arrival: the least work lost); a tenant is a victim only while it is above its fair share
  *and* ahead of the starved tenant in that order, so preemption never undoes what the policy
  chose (LTRF serving first a tenant that used less over the long term); for a starved tenant
  below its min_share (or below a queue's), first in every fair policy's order, any tenant
  above its fair share may be a victim;
- a victim's tenant is never taken below its own fair share (its ratio stays >= 1), so never
  below its min_share either (the fair share is raised to it);
- this pass's own placements (of tenants that stay at or above their fair share without them)
  count as victims first: they are withdrawn, never started, with no decision at all. Room
  that frees at the very instant a tenant's timeout runs out would otherwise go, in the pass's
  first stage, to a tenant above its share, beyond this stage's reach. Any of them may go on
  its own, one of a request placed on several nodes too: the request's placements left then
  take its first task ids (``Cycle.settle``);
- room is made on one node at a time: for each node the task may use, the victims *on that
  node* in the order above, until the task fits; the node needing the fewest tasks killed wins
  (then the fewest placements withdrawn, then the lowest number). Only victims that go count against their tenant's share, so a tenant
  holding room on every node can give up a whole node's worth;
- a node reserved for another shape (``reservation=on``) is off limits only while the
  reservation's tenant is below its fair share (as the pass begins): one at or above it does
  not keep room from a starved tenant;
- no more is taken than the starved tenant's next task needs on one node, task by task, until
  it reaches its fair share or has nothing left that some node could hold;
- nothing is taken for a task no node could hold even with every allowed victim gone;
- each victim is a ``PREEMPT`` decision, followed by the placement it made room for
  (``RECLAIMED``), so a consumer applying decisions in order never over-commits a node.
- a gang (docs/workloads.md, "Gangs") is a victim whole (all its tasks, counted together
  against its tenant's share) or not at all, and room is freed for a waiting gang whole, over
  several nodes, or not at all (``_make_room_for_gang``).

The engine tracks since when each tenant is starved (its ``Starvation`` part,
``core/starvation.py``), hands the
running tasks to the snapshot only when someone is starved past the timeout, and applies a
``PREEMPT`` like a lost node's requeue: the task is pending again with the same id and starts
over when placed.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from fairstream.core import gangs
from fairstream.core.fairness import fair_shares, resource_shares
from fairstream.core.model import EPSILON, ReasonCode, Task, gang_of


@dataclass(frozen=True)
class PreemptionRule:
    """``threshold``: a tenant below this fraction of its fair share is starved (YARN's
    ``fairSharePreemptionThreshold``); ``timeout``: seconds of event time it must stay starved,
    with pending work some node could hold, before victims are chosen."""

    threshold: float
    timeout: float


@dataclass(frozen=True)
class RunningTask:
    """A running task as a preemption stage sees it (``Snapshot.running_tasks``)."""

    id: str
    job: str
    tenant: str
    node: int  # node row
    demand: np.ndarray
    demand_map: Mapping[str, float]
    start: float
    seq: int
    placed: bool = False  # placed in this very pass, not started: withdrawn rather than preempted
    gang: bool = False  # a task of a gang: never a victim alone (docs/preemption.md, "Gangs")


def snapshot_fair_shares(snap) -> np.ndarray:
    """The fair share (``fairness.fair_shares``) of every tenant row of a ``Snapshot``, in the
    policy's measure: demand is what runs plus what waits."""
    return fair_shares(snap.tree, snap.tenants, snap.allocation + snap.pending_demand, snap.capacity,
                       snap.accounting.resource, snap.resources.names)


def share_ratios(allocation: np.ndarray, capacity: np.ndarray, fair: np.ndarray, resource: int | None) -> np.ndarray:
    """Each tenant's current share over its fair share ``fair`` (module docstring): one row per
    tenant; inf for a tenant whose fair share is 0 (it is owed nothing)."""
    shares = resource_shares(allocation, capacity, resource)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(fair > 0, shares / np.where(fair > 0, fair, 1.0), np.inf)


def starved_past_timeout(starved_since: Mapping[str, float], now: float, rule: PreemptionRule) -> list[str]:
    """The tenants starved for ``rule.timeout`` or longer at ``now``, longest first (then by id)."""
    due = [(since, tenant) for tenant, since in starved_since.items() if now - since >= rule.timeout - EPSILON]
    return [tenant for _, tenant in sorted(due)]


VictimKey = Callable[[str, np.ndarray], float]


def reclaim(cycle, rule: PreemptionRule, victim_key: VictimKey | None = None) -> None:
    """The preemption stage of a pass on ``cycle`` (a ``placement.Cycle``), after the policy's
    own placements: for each tenant starved past the timeout and still below ``threshold`` x
    its fair share, preempt and place as the module docstring says.

    ``victim_key(tenant, allocation)``: the policy's order of who is furthest above its share,
    highest first, given the tenants' allocation matrix as the stage has it (a key that falls
    as victims go is read again after each); None: the share ratio to the fair share."""
    snap = cycle.snapshot
    if snap.running_tasks is None or not snap.starved_since:
        return
    starved = [t for t in starved_past_timeout(snap.starved_since, snap.time, rule) if t in snap.pending]
    if not starved:
        return
    fair = snapshot_fair_shares(snap)

    def ratios(allocation: np.ndarray) -> np.ndarray:
        return share_ratios(allocation, snap.capacity, fair, snap.accounting.resource)

    if victim_key is None:
        def victim_key(tenant: str, allocation: np.ndarray) -> float:
            return float(ratios(allocation)[snap.rows[tenant]])

    # Running tasks per node, youngest first (latest start, then latest arrival), after this
    # pass's own placements: they come first, and are withdrawn, never started (else room freed
    # at this instant could go to a tenant above its share, out of the stage's reach).
    by_node: dict[int, list[RunningTask]] = {}
    # A running gang is a victim whole or not at all: one of its tasks goes with every other
    # (``members``; docs/preemption.md, "Gangs"). This pass's own placements of a gang are not
    # taken back (it started whole in this pass).
    for decision, owner, entry, node in reversed(cycle.placed):
        if not entry.gang:
            by_node.setdefault(node, []).append(RunningTask(decision.task, entry.job, owner, node, entry.demand,
                                                            entry.demand_map, snap.time, entry.seq, placed=True))
    members: dict[str, list[RunningTask]] = {}
    for task in sorted(snap.running_tasks, key=lambda t: (t.start, t.seq, t.id), reverse=True):
        by_node.setdefault(task.node, []).append(task)
        if task.gang:
            members.setdefault(gang_id(task), []).append(task)
    taken: set[str] = set()
    for tenant in starved:
        row = snap.rows[tenant]
        if ratios(cycle.allocation)[row] >= rule.threshold - EPSILON:
            continue  # the pass's own placements lifted it: not starved any more
        waited = snap.time - snap.starved_since[tenant]
        while ratios(cycle.allocation)[row] < 1.0 - EPSILON:
            heads = [task for task in cycle.queues.shape_heads(tenant, every_shape=True)
                     if cycle.within_caps(tenant, gangs.sized(task, gangs.need(cycle, task)))]
            if not any(_make_room_for_gang(cycle, tenant, task, by_node, taken, victim_key, ratios, waited, members)
                       if gangs.waits(cycle, task) else
                       _make_room(cycle, tenant, task, by_node, taken, victim_key, ratios, waited, members)
                       for task in heads):
                break  # nothing of it fits anywhere, even with every allowed victim gone
    cycle.settle()  # (a request's placements left take its first ids)


def gang_id(task: RunningTask) -> str:
    """The gang a running task of a gang belongs to: its request's id."""
    return task.id.rpartition("-")[0]


def _make_room(cycle, tenant: str, task: Task, by_node: dict[int, list[RunningTask]], taken: set[str],
               victim_key: VictimKey, ratios: Callable[[np.ndarray], np.ndarray], waited: float,
               members: Mapping[str, list[RunningTask]]) -> bool:
    """Free room for ``task`` of starved ``tenant`` on one node and place it there; False
    (nothing changed) if no node it may use can be freed enough."""
    snap = cycle.snapshot
    # Live nodes it may use, but one where its job runs its max_per_node (victims are other
    # tenants' tasks: that stays so), or one reserved for another shape by a tenant below its
    # fair share when the pass began. A reservation of a tenant at or above its fair share does
    # not hold against a starved tenant: kept for it, the room would wait while the starved
    # tenant does. (The pass's start, not the stage's allocation: ``explain`` tells the holder
    # so from the same state; its own placement there in this pass is a victim like any other.)
    reserved = cycle.reservation
    holder_owed = reserved is not None and ratios(snap.allocation)[snap.rows[reserved.tenant]] < 1.0 - EPSILON
    eligible = (cycle.nodes.eligible(task.constraints) & (snap.free > -0.5).all(axis=1)
                & (cycle.nodes.usable(task) if holder_owed else True) & cycle.nodes.below_job_limit(tenant, task))
    need = task.demand - EPSILON
    room = np.flatnonzero(eligible & (cycle.free >= need).all(axis=1))
    if len(room):  # left by an earlier victim of this stage: no victim needed
        cycle.commit(tenant, task, int(room[0]), f"reclaimed: placed for starved {tenant} on room freed for it",
                     ReasonCode.RECLAIMED)
        return True
    # A victim must come after the starved tenant in the policy's order (LTRF: have used more
    # over the long term), unless the starved tenant is below its min_share: then it is ahead of
    # every tenant that is not (the order's first class), and anyone above its fair share may go.
    own = -np.inf if cycle.below_min_share(tenant) else victim_key(tenant, cycle.allocation)
    # The node needing the fewest tasks killed, then the fewest of this pass's placements
    # withdrawn (they cost nothing: never started), then the lowest number.
    best: tuple[tuple[int, int], int, list[RunningTask]] | None = None  # ((killed, withdrawn), node, victims)
    for node in sorted(by_node):
        if not eligible[node]:
            continue
        here = [t for t in by_node[node] if t.id not in taken]
        if (cycle.free[node] + sum((t.demand for t in here), np.zeros_like(need)) < need).any():
            continue  # even every task on it gone would not make room
        victims = _victims_on_node(cycle, node, here, taken, need, own, victim_key, ratios,
                                   None if best is None else best[0], members)
        if victims is None:
            continue
        cost = (sum(not v.placed for v in victims), sum(v.placed for v in victims))
        if best is None or cost < best[0]:
            best = (cost, node, victims)
            if cost == (0, 1) or (cost == (1, 0) and not cycle.placed):
                break  # no node needs fewer
    if best is None:
        return False
    _, node, victims = best
    _take(cycle, victims, taken, f"preempt: frees room for {tenant}, below its fair share for {waited:.4g}s")
    if any(not v.placed for v in victims):
        how = "preempted for it"
    else:  # (no task killed: only this pass's placements taken back)
        how = f"this pass had given to {', '.join(sorted({v.tenant for v in victims}))}, taken back for it"
    cycle.commit(tenant, task, node, f"reclaimed: placed for starved {tenant} on room {how}", ReasonCode.RECLAIMED)
    return True


def _make_room_for_gang(cycle, tenant: str, head: Task, by_node: dict[int, list[RunningTask]], taken: set[str],
                        victim_key: VictimKey, ratios: Callable[[np.ndarray], np.ndarray], waited: float,
                        members: Mapping[str, list[RunningTask]]) -> bool:
    """Free room for the whole gang ``head`` of starved ``tenant`` (its size of tasks) and start
    it, or nothing: False, nothing changed. Node by node in order, each node the most tasks of
    the gang its free room and its allowed victims (``_victims_on_node``, as for one task) make
    room for, the victims counted against their tenants' shares as they are chosen, until the
    whole gang has room; only then are they preempted and the gang placed (``RECLAIMED``)."""
    snap = cycle.snapshot
    size = gangs.need(cycle, head)
    reserved = cycle.reservation
    holder_owed = reserved is not None and ratios(snap.allocation)[snap.rows[reserved.tenant]] < 1.0 - EPSILON
    eligible = (cycle.nodes.eligible(head.constraints) & (snap.free > -0.5).all(axis=1)
                & (cycle.nodes.usable(head) if holder_owed else True) & cycle.nodes.below_job_limit(tenant, head))
    own = -np.inf if cycle.below_min_share(tenant) else victim_key(tenant, cycle.allocation)
    allocation, free, gone = cycle.allocation.copy(), cycle.free.copy(), set(taken)
    plan: list[tuple[int, int]] = []  # (node, tasks of the gang there)
    victims: list[RunningTask] = []
    left = size
    most = head.constraints.max_per_node
    for node in np.flatnonzero(eligible).tolist():
        here = [t for t in by_node.get(node, []) if t.id not in gone]
        room = free[node] + sum((t.demand for t in here), np.zeros_like(head.demand))
        fits = int(np.floor(min(((r + EPSILON) / d for r, d in zip(room.tolist(), head.demand_values) if d > EPSILON),
                                default=float(left))))
        if most is not None:
            fits = min(fits, most - cycle.nodes.job_rows(tenant, head.job).get(node, 0))
        for k in range(min(left, fits), 0, -1):
            chosen = _victims_on_node(cycle, node, here, gone, head.demand * k - EPSILON, own, victim_key, ratios, None,
                                      members, allocation, free[node])
            if chosen is None:
                continue
            for victim in chosen:
                gone.add(victim.id)
                allocation[snap.rows[victim.tenant]] -= victim.demand
                free[victim.node] += victim.demand
            free[node] -= head.demand * k
            victims.extend(chosen)
            plan.append((node, k))
            left -= k
            break
        if not left:
            break
    if left:
        return False
    _take(cycle, victims, taken, f"preempt: frees room for {tenant}, below its fair share for {waited:.4g}s, to start "
                                 f"its gang {gang_of(head)} whole")
    where = ", ".join(f"{snap.node_ids[node]}: {k}" for node, k in plan)
    cycle.gangs_started.add(gang_of(head))
    for node, k in plan:
        for _ in range(k):
            cycle.commit(tenant, head, node, f"reclaimed: gang {gang_of(head)} of {size} starts whole ({where}) for "
                                             f"starved {tenant} on room preempted for it", ReasonCode.RECLAIMED)
    return True


def _take(cycle, victims: list[RunningTask], taken: set[str], why: str) -> None:
    """Take ``victims`` from their tenants: this pass's own placements withdrawn, running tasks
    preempted, each decision saying ``why`` and that its tenant keeps its fair share."""
    for victim in victims:
        taken.add(victim.id)
        if victim.placed:
            cycle.withdraw(victim.id)
            continue
        whole = f"; its gang {gang_id(victim)} stops whole" if victim.gang else ""
        cycle.evict(victim, f"{why} (preemption_timeout reached); {victim.tenant} stays at or above its own fair "
                            f"share{whole}", ReasonCode.FAIR_SHARE_PREEMPTION)


def _victims_on_node(cycle, node: int, here: list[RunningTask], taken: set[str], need: np.ndarray, own: float,
                     victim_key: VictimKey, ratios: Callable[[np.ndarray], np.ndarray], most: tuple[int, int] | None,
                     members: Mapping[str, list[RunningTask]], allocation: np.ndarray | None = None,
                     free: np.ndarray | None = None) -> list[RunningTask] | None:
    """The victims on ``node`` (its running tasks ``here``, youngest first) that make room for
    ``need``, taken tenant by tenant furthest above its share first, each tenant's youngest
    task that keeps it at or above its fair share; None if they cannot (or need more than
    ``most``). Only these victims count against their tenants' shares. A task of a gang goes
    with its whole gang (``members``: its tasks on other nodes too), which counts whole
    against its tenant's share and in the tasks killed; the room only this node's part of it.
    ``allocation`` and ``free`` (this node's row): the state to start from, if not the cycle's."""
    snap = cycle.snapshot
    # (``allocation`` and ``free``, the node's: as a caller planning several nodes has them.)
    allocation = (cycle.allocation if allocation is None else allocation).copy()
    free = (cycle.free[node] if free is None else free).copy()
    left: dict[str, list[RunningTask]] = {}
    for task in here:
        left.setdefault(task.tenant, []).append(task)
    chosen: list[RunningTask] = []

    def eligible_victim(victim: str) -> bool:
        return bool(left[victim]) and ratios(allocation)[snap.rows[victim]] > 1.0 + EPSILON \
            and victim_key(victim, allocation) > own

    heap = [(-victim_key(v, allocation), v) for v in left if eligible_victim(v)]
    heapq.heapify(heap)
    while heap and (free < need).any():
        if most is not None and (sum(not c.placed for c in chosen), sum(c.placed for c in chosen)) >= most:
            return None
        _, victim = heapq.heappop(heap)
        row = snap.rows[victim]
        found = None
        for candidate in left[victim]:  # youngest first; an older, smaller one may keep it at its share
            unit = [candidate] if not candidate.gang else [m for m in members[gang_id(candidate)] if m.id not in taken]
            total = sum((m.demand for m in unit), np.zeros_like(need))
            allocation[row] -= total
            if ratios(allocation)[row] >= 1.0 - EPSILON:
                found = unit
                break
            allocation[row] += total
        if found is None:
            continue  # nothing more of this tenant can go
        for m in found:
            if m.node == node:
                left[victim].remove(m)
                free += m.demand
        chosen.extend(found)
        if eligible_victim(victim):
            heapq.heappush(heap, (-victim_key(victim, allocation), victim))
    return chosen if (free >= need).all() else None


__all__ = ["PreemptionRule", "RunningTask", "snapshot_fair_shares", "share_ratios",
           "starved_past_timeout", "reclaim"]
