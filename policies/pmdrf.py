"""``pmdrf``: per-machine DRF, one of the TSF paper's baselines (its Table 1, after Friedman,
Ghodsi and Psomas, EC'14, and Wang, Liang and Li: strategy-proof and envy-free, neither
sharing-incentive nor Pareto optimal under constraints).

Every machine is shared by DRF on its own: on each node, in node order, the tenant whose tasks
may run there with the lowest dominant share *of that node* (what it runs there over the node's
capacity, per weight) gets its earliest task that fits there, until nothing more fits the node.
A tenant's allocation elsewhere does not count, which is what costs Pareto optimality: a job
that can use many machines takes its DRF share on each of them.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from typing import Any

import numpy as np

from fairstream.core import gangs
from fairstream.core.fairness import dominant_share, fair_key
from fairstream.core.model import EPSILON, Decision, ReasonCode
from fairstream.core.placement import Cycle, dominant_share_order, leaf_arrival, order_code, room_for_any
from fairstream.core.snapshot import Snapshot
from fairstream.policies.base import PolicySpec, Traits


def decide(snapshot: Snapshot, params: Mapping[str, Any]) -> list[Decision]:
    cycle = Cycle(snapshot, "pmdrf")
    tenants = snapshot.demanding()
    share_nodes(cycle, tenants, nodes_with_room(snapshot))
    if snapshot.gangs_waiting:
        # A gang starts whole or not at all, across nodes: after every node's own turn, gangs in
        # the cluster's DRF order (weighted dominant share of the whole cluster); then the nodes
        # again, for the rest of a gang that started and what fits beside it.
        order = dominant_share_order(snapshot).key
        waiting = sorted((order(cycle, t), t) for t in tenants
                         if any(gangs.waits(cycle, e) for e in cycle.queues.shape_heads(t)))
        started = False
        for _, tenant in waiting:
            started |= bool(gangs.start_gangs(cycle, [(tenant, e) for e in cycle.queues.shape_heads(tenant)],
                                        "pmdrf: a gang starts whole, lowest dominant share/weight of the cluster first",
                                        ReasonCode.FAIR_ORDER))
        if started:
            share_nodes(cycle, tenants, np.flatnonzero((cycle.free > EPSILON).any(axis=1)).tolist(), again=True)
    return cycle.decisions


def share_nodes(cycle: Cycle, tenants: list[str], nodes: list[int], again: bool = False) -> None:
    """Each of ``nodes`` in turn shared by DRF among ``tenants`` on that node alone (their
    running tasks there, ``again``: with this pass's placements there too).

    A node's turn weighs only the tenants with a next task its free room could hold
    (``waiting_heads``: the others would be passed over there without effect), and the turns
    stop once nothing is left waiting: the same decisions as weighing every tenant on every
    node, at a cost that grows with what waits, not with the nodes (an idle cluster of 1,523
    nodes and one pod to place visited every node, issue 64)."""
    snapshot = cycle.snapshot
    node_capacity, allocation = snapshot.node_capacity, snapshot.node_allocation
    assert node_capacity is not None and allocation is not None  # (Traits.node_allocation: the engine gives both)
    owners: list[str] = []
    demands = np.zeros((0, len(cycle.free[0]) if len(cycle.free) else 0))
    stale = True
    for node in nodes:
        if stale:  # (what waits changed: a task placed or passed over)
            owners, demands = waiting_heads(cycle, tenants)
            stale = False
        if not owners:
            break  # nothing left to place: no later node's turn would place anything
        fit = (cycle.free[node] >= demands - EPSILON).all(axis=1)
        if not fit.any():
            continue
        chosen = {owner for owner, fits_here in zip(owners, fit.tolist()) if fits_here}
        candidates = [t for t in tenants if t in chosen]
        capacity = node_capacity[node]
        running = allocation.of(node)
        here = {t: running[t].copy() if t in running else np.zeros(len(capacity)) for t in candidates}
        if again:
            for _, placed_tenant, entry, placed_node in cycle.placed:
                if placed_node == node and placed_tenant in here:
                    here[placed_tenant] += entry.demand

        def key(tenant: str):
            share = dominant_share(here[tenant], capacity) / snapshot.share_fraction[snapshot.rows[tenant]]  # noqa: B023 (called before the loop moves on)
            return fair_key(share, leaf_arrival(snapshot, tenant), tenant, cycle.below_min_share(tenant))

        heap = [(key(t), t) for t in candidates]
        heapq.heapify(heap)
        while heap:
            tenant_key, tenant = heapq.heappop(heap)
            task = next((t for t in cycle.queues.shape_heads(tenant) if fits(cycle, t, node)), None)
            if task is None:
                continue  # nothing of this tenant fits this node any more
            stale = True
            if not cycle.within_caps(tenant, task):
                cycle.skip_for(tenant, task)
            else:
                cycle.commit(tenant, task, node, f"pmdrf: lowest dominant share/weight on {snapshot.node_ids[node]} "
                                                 f"({tenant_key.share:.4g})", order_code(tenant_key))
                here[tenant] += task.demand
            heapq.heappush(heap, (key(tenant), tenant))


def waiting_heads(cycle: Cycle, tenants: list[str]) -> tuple[list[str], np.ndarray]:
    """The next task of each shape of each of ``tenants`` the pass may still place: their
    tenants, and their demands (one row each)."""
    owners, rows = [], []
    for tenant in tenants:
        for head in cycle.queues.shape_heads(tenant):
            owners.append(tenant)
            rows.append(head.demand)
    return owners, (np.array(rows) if rows else np.zeros((0, len(cycle.free[0]) if len(cycle.free) else 0)))


def nodes_with_room(snapshot: Snapshot) -> list[int]:
    """The live node rows, in order, whose free room fits some waiting task's demand (constraints
    aside): the only ones a pass can place on, since room only shrinks in it and each node's
    turn changes only that node. (A pass visits these, not every node.)"""
    demands = []
    for queue in snapshot.pending.values():
        for group in queue.groups.values():
            head, _ = group.pending_at(0)
            if head is not None:
                demands.append(head.demand_values)
    if not demands or not len(snapshot.free):
        return []
    return np.flatnonzero(room_for_any(snapshot.free, np.unique(np.array(demands), axis=0))).tolist()


def fits(cycle: Cycle, task, node: int) -> bool:
    return (not gangs.waits(cycle, task) and bool(cycle.nodes.eligible(task.constraints)[node]) and bool((cycle.free[node] >= task.demand - EPSILON).all())
            and cycle.nodes.job_may_use(task, node))


SPEC = PolicySpec("pmdrf", decide, "per-machine DRF: each node shared by DRF on its own (TSF baseline)",
                  traits=Traits(node_allocation=True))

__all__ = ["SPEC", "decide"]
