"""Preemption toward fair share: taking room back for a tenant starved past a timeout.

The rule operators know from YARN's Fair Scheduler (``fairSharePreemptionThreshold``,
``fairSharePreemptionTimeout``): a tenant that has pending work some node could hold, and has
stayed below ``threshold`` x its fair share for ``timeout`` seconds of event time, is *starved*;
the scheduler then kills running tasks of tenants above their share and gives the room to it.

What "fair share" means here: the tenant's *instantaneous* fair share, as YARN's, its weight
fraction (``Snapshot.share_fraction``) renormalised over the *active* tenants (those with
running or pending work), measured in the policy's own resource (``AccountingConfig.resource``:
one resource, or the dominant share). A tenant's *share ratio* is its current share over that:
1 is exactly its fair share.

``reclaim`` is the last stage of a pass, pure like the rest (it works on the pass's ``Cycle``):

- victims come from the tenants furthest above their share in the policy's own order
  (``victim_key``: the highest first; long-term usage for LTRF, dominant share for DRF), the
  youngest task first (latest start, then latest arrival: the least work lost); a tenant is a
  victim only while it is above its fair share *and* ahead of the starved tenant in that order,
  so preemption never undoes what the policy chose (LTRF serving first a tenant that used less
  over the long term);
- a victim's tenant is never taken below its own share (its ratio stays >= 1);
- no more is taken than the starved tenant's next task needs on one node, task by task, until
  it reaches its fair share or has nothing left that some node could hold;
- nothing is taken for a task no node could hold even with every allowed victim gone;
- each victim is a ``PREEMPT`` decision, followed by the placement it made room for
  (``RECLAIMED``), so a consumer applying decisions in order never over-commits a node.

The engine tracks since when each tenant is starved (``Engine.starved_since``), hands the
running tasks to the snapshot only when someone is starved past the timeout, and applies a
``PREEMPT`` like a lost node's requeue: the task is pending again with the same id and starts
over when placed.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np

from fairstream.core.fairness import instantaneous_fair_shares, resource_shares
from fairstream.core.model import EPSILON, ReasonCode, Task


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


def active_tenants(tenants: Sequence[str], running: Sequence[float], pending: Mapping) -> np.ndarray:
    """Per tenant row: has it running tasks or pending ones (``pending``: tenant -> queue)?"""
    return np.array([r > 0 or (t in pending and pending[t].count > 0) for t, r in zip(tenants, running)], dtype=bool)


def share_ratios(allocation: np.ndarray, capacity: np.ndarray, fractions: np.ndarray, active: np.ndarray,
                 resource: int | None) -> np.ndarray:
    """Each tenant's current share over its instantaneous fair share (module docstring): one
    row per tenant; inf for an inactive tenant (it is owed nothing)."""
    fair = instantaneous_fair_shares(fractions, active)
    shares = resource_shares(allocation, capacity, resource)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(fair > 0, shares / np.where(fair > 0, fair, 1.0), np.inf)


def starved_past_timeout(starved_since: Mapping[str, float], now: float, rule: PreemptionRule) -> list[str]:
    """The tenants starved for ``rule.timeout`` or longer at ``now``, longest first (then by id)."""
    due = [(since, tenant) for tenant, since in starved_since.items() if now - since >= rule.timeout - EPSILON]
    return [tenant for _, tenant in sorted(due)]


VictimKey = Callable[[str, np.ndarray], float]


def reclaim(cycle, rule: PreemptionRule, victim_key: VictimKey) -> None:
    """The preemption stage of a pass on ``cycle`` (a ``placement.Cycle``), after the policy's
    own placements: for each tenant starved past the timeout and still below ``threshold`` x
    its fair share, preempt and place as the module docstring says.

    ``victim_key(tenant, allocation)``: the policy's order of who is furthest above its share,
    highest first, given the tenants' allocation matrix as the stage has it (a key that falls
    as victims go is read again after each)."""
    snap = cycle.snapshot
    if snap.running_tasks is None or not snap.starved_since:
        return
    starved = [t for t in starved_past_timeout(snap.starved_since, snap.time, rule) if t in snap.pending]
    if not starved:
        return
    active = active_tenants(snap.tenants, snap.running, snap.pending)

    def ratios(allocation: np.ndarray) -> np.ndarray:
        return share_ratios(allocation, snap.capacity, snap.share_fraction, active, snap.accounting.resource)

    # Running tasks per tenant, oldest first (the youngest is taken first, from the end).
    by_tenant: dict[str, list[RunningTask]] = {}
    for task in sorted(snap.running_tasks, key=lambda t: (t.start, t.seq, t.id)):
        by_tenant.setdefault(task.tenant, []).append(task)
    taken: set[str] = set()
    for tenant in starved:
        row = snap.rows[tenant]
        if ratios(cycle.allocation)[row] >= rule.threshold - EPSILON:
            continue  # the pass's own placements lifted it: not starved any more
        waited = snap.time - snap.starved_since[tenant]
        while ratios(cycle.allocation)[row] < 1.0 - EPSILON:
            heads = [task for task in cycle.shape_heads(tenant, every_shape=True) if cycle.within_caps(tenant, task)]
            if not any(_make_room(cycle, tenant, task, by_tenant, taken, victim_key, ratios, waited) for task in heads):
                break  # nothing of it fits anywhere, even with every allowed victim gone


def _make_room(cycle, tenant: str, task: Task, by_tenant: dict[str, list[RunningTask]], taken: set[str],
               victim_key: VictimKey, ratios: Callable[[np.ndarray], np.ndarray], waited: float) -> bool:
    """Free room for ``task`` of starved ``tenant`` on one node and place it there; False
    (nothing changed) if no node it may use can be freed enough."""
    snap = cycle.snapshot
    eligible = cycle.eligible(task.constraints) & (snap.free > -0.5).all(axis=1)  # live nodes it may use
    need = task.demand - EPSILON
    room = np.flatnonzero(eligible & (cycle.free >= need).all(axis=1))
    if len(room):  # left by an earlier victim of this stage: no victim needed
        cycle.commit(tenant, task, int(room[0]), f"reclaimed: placed for starved {tenant} on room freed for it",
                     ReasonCode.RECLAIMED)
        return True
    # Take victims tentatively, furthest-above tenant first and its youngest useful task first,
    # until one node the task may use has room; then only the victims on that node go.
    allocation = cycle.allocation.copy()
    freed = np.zeros_like(cycle.free)
    chosen: dict[int, list[RunningTask]] = {}
    left = {victim: len(tasks) for victim, tasks in by_tenant.items()}
    # A victim is above its share and ahead of the starved tenant in the policy's own order
    # (for LTRF: more long-term usage), so preemption never undoes what the policy chose.
    own = victim_key(tenant, allocation)
    above = ratios(allocation)
    heap = [(-key, v) for v in by_tenant
            if v != tenant and above[snap.rows[v]] > 1.0 + EPSILON and (key := victim_key(v, allocation)) > own]
    heapq.heapify(heap)
    node = None
    while heap and node is None:
        _, victim = heapq.heappop(heap)
        row = snap.rows[victim]
        found = None
        while left[victim] > 0 and found is None:
            left[victim] -= 1
            candidate = by_tenant[victim][left[victim]]
            if candidate.id in taken or not eligible[candidate.node]:
                continue  # gone already, or on a node this task may not use
            allocation[row] -= candidate.demand
            if ratios(allocation)[row] < 1.0 - EPSILON:
                allocation[row] += candidate.demand  # would take it below its share: an older, smaller one may do
                continue
            found = candidate
        if found is None:
            continue  # nothing more of this tenant can go
        freed[found.node] += found.demand
        chosen.setdefault(found.node, []).append(found)
        if (cycle.free[found.node] + freed[found.node] >= need).all():
            node = found.node
        elif left[victim] > 0 and ratios(allocation)[row] > 1.0 + EPSILON and victim_key(victim, allocation) > own:
            heapq.heappush(heap, (-victim_key(victim, allocation), victim))
    if node is None:
        return False
    for victim_task in chosen[node]:
        taken.add(victim_task.id)
        cycle.evict(victim_task, f"preempt: frees room for {tenant}, below its fair share for {waited:.4g}s "
                                 f"(preemption_timeout reached); {victim_task.tenant} stays at or above its own share",
                    ReasonCode.FAIR_SHARE_PREEMPTION)
    cycle.commit(tenant, task, node, f"reclaimed: placed for starved {tenant} on room preempted for it",
                 ReasonCode.RECLAIMED)
    return True


__all__ = ["PreemptionRule", "RunningTask", "active_tenants", "share_ratios", "starved_past_timeout",
           "reclaim"]
