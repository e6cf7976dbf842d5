"""``qknobler``: fairness-efficiency scheduling with a knob rho (Tang, Yu and Li, "Fairness-
Efficiency Scheduling for Cloud Computing with Soft Fairness Guarantees": section 5.2,
Algorithm 1, and the practical considerations C1-C3 of section 6.1).

One pass, on a ``Cycle`` (what-if copy):

1. Active users (C1) are the tenants with pending tasks. Each one's current average task demand
   (C2, First-Fit estimate): its running tasks plus the pending tasks that would just fill the
   idle space, counted in queue order (shape group by shape group, in the order of each group's
   first task).
2. ``phi`` and ``s_i^max = w_i / phi`` (formula 11) from those averages. Fairness-oriented stage
   (Algorithm 1, lines 8-10): serve the active tenant with the lowest ``s_i / w_i`` while
   ``s_i < rho * s_i^max``, i.e. ``s_i / w_i < rho / phi``.
3. Efficiency-oriented stage (lines 11-14): one integer program per pass (formulas 15-17) on the
   idle resources left: how many more tasks ``n_i`` of each tenant maximise
   ``sum_i n_i sum_k d_ik / r_k`` within the idle resources. Tenants whose demands point the
   same way keep equal weighted shares (formula 16): identical demands share one variable,
   split by weighted water-filling; same direction, different size, are held to within one
   task of each other unless one runs out of pending tasks (a big-M constraint). Beyond
   ``exact_items`` distinct demands the program's LP relaxation is rounded instead (within one
   task per resource of the optimum; the big-M constraints are then left out), because proving
   optimality of a 100-kind knapsack can take HiGHS tens of milliseconds or more per pass.
4. Placement by affinity (C3): each task goes to the fitting node whose idle resources align
   best with its demand (``placement.alignment_scores``).
5. Fill: tasks that still fit anywhere (the average-demand estimate can leave room) are placed,
   lowest weighted dominant share first, so the pass is work-conserving.

If the solver fails, the efficiency stage is skipped and every decision of the fill stage says
so in its reason: nothing is hidden, and the pass still places what fits.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from fairstream.core.fairness import dominant_share, drf_phi, fair_key, resource_shares, task_dominant_shares
from fairstream.core.model import EPSILON, Decision, ReasonCode
from fairstream.core.placement import Cycle, Service, leaf_arrival, order_code, serve_in_order
from fairstream.core.snapshot import Snapshot
from fairstream.core.solver import SolverError, solve_packing
from fairstream.policies.base import Ordering, Param, PolicySpec, parse_fraction, parse_positive

PARAMS = (
    Param("rho", 0.5, parse_fraction, "the knob: the fairness stage fills each tenant to rho * s_i^max "
                                 "(1 = DRF, 0 = efficiency only)"),
    Param("gap", 0.5, parse_positive, "the integer program stops within gap x (the smallest task's value) of "
                                 "its optimum; smaller is exact but slower (see solver.py)"),
    Param("exact_items", 8, lambda text: int(parse_positive(text)),
          "solve the integer program exactly up to this many distinct demands per pass; beyond, round its LP "
          "relaxation (within one task per resource of the optimum, about 1 ms; see solver.py)"),
)


@dataclass
class Demands:
    """Per active tenant: C2's average demand (running + counted pending), the counted pending
    tasks' average demand and the number of pending tasks; and every (tenant, shape) group's
    demand, for the vectorised "can anything still be placed" checks of the later stages."""

    overall: np.ndarray
    pending_avg: np.ndarray
    pending_count: np.ndarray
    shape_owner: np.ndarray  # index into the tenant list, one per shape group
    shape_demand: np.ndarray  # shape groups x resources
    shape_constrained: np.ndarray  # True: the group has constraints (checked by the loops)


def average_demands(snapshot: Snapshot, tenants: list[str]) -> Demands:
    """C2 for each tenant: pending tasks are counted in queue order until they would overfill
    the cluster's idle space. Plain floats per tenant (a tenant has a few shapes), one
    vectorised step for all tenants at the end."""
    idle = np.maximum(snapshot.free, 0.0).sum(axis=0).tolist()
    width = len(idle)
    totals, counts, pending_counts = [], [], []
    owners, shapes, constrained = [], [], []
    for i, tenant in enumerate(tenants):
        heads = []
        for group in snapshot.pending[tenant].groups.values():
            task, _ = group.pending_at(0)
            if task is not None:
                heads.append((task.seq, task.demand_values, group.count))
                owners.append(i)
                shapes.append(task.demand_values)
                constrained.append(not task.constraints.empty)
        if len(heads) > 1:
            heads.sort()
        pending_counts.append(sum(head[2] for head in heads))
        room, counted, total = list(idle), 0, [0.0] * width
        for _, demand, available in heads:
            fits = min([have / need for have, need in zip(room, demand) if need > 0] or [float(available)])
            take = max(0, min(available, int(fits + 1e-9)))
            if take:
                total = [t + take * d for t, d in zip(total, demand)]
                room = [r - take * d for r, d in zip(room, demand)]
                counted += take
            if take < available:
                break
        if counted == 0 and heads:  # not even one fits the idle space: estimate from the first task
            total, counted = list(heads[0][1]), 1
        totals.append(total)
        counts.append(counted)
    total_pending = np.array(totals, dtype=float).reshape(len(tenants), width)
    counted_pending = np.array(counts, dtype=float)
    rows = [snapshot.rows[t] for t in tenants]
    running = snapshot.running[rows] if snapshot.running is not None else np.zeros(len(tenants))
    overall = (snapshot.allocation[rows] + total_pending) / np.maximum(running + counted_pending, 1.0)[:, None]
    pending_avg = total_pending / np.maximum(counted_pending, 1.0)[:, None]
    return Demands(overall, pending_avg, np.array(pending_counts, dtype=float), np.array(owners, dtype=int),
                   np.array(shapes).reshape(len(shapes), width), np.array(constrained, dtype=bool))


def decide(snapshot: Snapshot, params: Mapping[str, Any]) -> list[Decision]:
    tenants = snapshot.demanding()
    if not tenants:
        return []
    rho = params["rho"]
    capacity = snapshot.capacity
    cycle = Cycle(snapshot, "qknobler", affinity=True)
    rows = [snapshot.rows[t] for t in tenants]
    weights = snapshot.share_fraction[rows]
    demands = average_demands(snapshot, tenants)
    phi = drf_phi(demands.overall, weights, capacity)
    limit = rho / phi if phi > 0 else 0.0  # the fairness stage's bound on s_i / w_i

    def weighted_share(tenant: str) -> float:
        row = snapshot.rows[tenant]
        return dominant_share(cycle.allocation[row], capacity) / snapshot.share_fraction[row]

    def key(c: Cycle, tenant: str):
        return fair_key(weighted_share(tenant), leaf_arrival(snapshot, tenant), tenant, c.below_min_share(tenant))

    def weighted_shares() -> np.ndarray:
        """Every tenant row's s_i / w_i at once (for the start of a stage)."""
        return resource_shares(cycle.allocation, capacity, None) / snapshot.share_fraction

    def heap_of(names: list[str]) -> list:
        if cycle.capped:  # min shares change the priority class: key each one
            heap = [(key(cycle, t), t) for t in names]
        else:
            shares = weighted_shares()
            heap = [(fair_key(float(shares[snapshot.rows[t]]), leaf_arrival(snapshot, t), t), t) for t in names]
        heapq.heapify(heap)
        return heap

    # 1. Fairness-oriented stage: progressive filling up to rho * s_i^max.
    heap = heap_of(tenants)
    while heap:
        tenant_key, tenant = heapq.heappop(heap)
        if tenant_key.share >= limit - 1e-12:
            break  # the lowest is at its bound, so every tenant is
        task = cycle.queues.next_task(tenant)
        if task is None:
            continue
        cycle.try_place(tenant, task, lambda: f"qknobler: fairness stage (s/w {tenant_key.share:.4g} < rho/phi {limit:.4g})",  # noqa: B023 (called before the loop moves on)
                        order_code(tenant_key))
        heapq.heappush(heap, (key(cycle, tenant), tenant))

    # 2. Efficiency-oriented stage: one integer program over the idle resources left, for the
    # tenants that can place a task now at all (none: the pass is over, nothing fits).
    placeable = set(tenants_with_a_fitting_task(cycle, tenants, demands))
    if not placeable:
        return cycle.decisions
    note = ""
    try:
        candidates = np.array([t in placeable for t in tenants])
        quotas, status = efficiency_quotas(cycle, tenants, weights, demands.pending_avg,
                                           np.where(candidates, demands.pending_count, 0),
                                           params["gap"], params["exact_items"])
    except SolverError as exc:
        quotas, note = {}, f"; efficiency stage skipped: {exc}"
    else:
        planned = dict(quotas)
        heap = heap_of([t for t in tenants if quotas.get(t, 0) > 0])
        while heap:
            _, tenant = heapq.heappop(heap)
            task = cycle.queues.next_task(tenant)
            if task is None:
                continue
            if cycle.try_place(tenant, task, lambda: f"qknobler: efficiency stage ({status} integer program: "
                                                     f"{int(planned[tenant])} tasks of {tenant})", ReasonCode.PACKING):  # noqa: B023 (called before the loop moves on)
                quotas[tenant] -= cycle.last_count
            if quotas[tenant] > 0:
                heapq.heappush(heap, (key(cycle, tenant), tenant))

    # 3. Fill: whatever still fits, lowest weighted dominant share first.
    def reason(c: Cycle, tenant: str, k) -> str:
        return f"qknobler: fill (lowest dominant share/weight {k.share:.4g}){note}"

    fill = tenants_with_a_fitting_task(cycle, tenants, demands)
    if not fill:  # the usual case: skip the per-tenant loop
        return cycle.decisions
    return serve_in_order(snapshot, "qknobler", Service(key, reason), cycle=cycle, only=fill,
                          initial_shares=weighted_shares())


def tenants_with_a_fitting_task(cycle: Cycle, tenants: list[str], demands: Demands) -> list[str]:
    """Tenants with a shape group whose demand fits some node's idle resources now, in
    vectorised checks (groups with constraints count as fitting: the loops check those; a group
    this pass already emptied may count too, and the loops find it empty)."""
    if not len(demands.shape_owner) or not len(cycle.free):
        return []
    # The nodes with the most free room of some resource first: on a cluster with room most
    # shapes fit one of them. The rest are checked against every node with room for the
    # smallest of them (every shape against every such node cost a third of a pass on a
    # cluster of 1,523 nodes, issue 64).
    free, need = cycle.free, demands.shape_demand - EPSILON
    probes = free[np.unique(free.argmax(axis=0))]
    fits = (probes[None, :, :] >= need[:, None, :]).all(axis=2).any(axis=1)
    unsure = np.flatnonzero(~fits & ~demands.shape_constrained)
    if len(unsure):
        rest = need[unsure]
        free = free[(free >= rest.min(axis=0)).all(axis=1)]
        fits[unsure] = (free[None, :, :] >= rest[:, None, :]).all(axis=2).any(axis=1)
    chosen = set(demands.shape_owner[fits | demands.shape_constrained].tolist())
    return [t for i, t in enumerate(tenants) if i in chosen]


def efficiency_quotas(cycle: Cycle, tenants: list[str], weights: np.ndarray, demands: np.ndarray,
                      pending_count: np.ndarray, gap: float, exact_items: int) -> tuple[dict[str, float], str]:
    """Formulas 15-17 on the pooled idle resources of ``cycle``: tasks per tenant."""
    snapshot = cycle.snapshot
    capacity = snapshot.capacity
    idle = np.maximum(cycle.free, 0.0).sum(axis=0)
    scale = np.where(capacity > 0, capacity, 1.0)
    with np.errstate(divide="ignore"):
        fits = np.where(demands > 0, idle / np.where(demands > 0, demands, 1.0), np.inf).min(axis=1)
    fits[~(demands > 0).any(axis=1)] = 0.0
    upper = np.minimum(pending_count, np.floor(np.minimum(fits, 1e12) + 1e-9))
    live = np.flatnonzero(upper > 0)
    if not len(live):
        return {}, "trivial"
    # Identical demand vectors share one variable (exchanging their tasks changes nothing).
    items: dict[tuple, list[int]] = {}
    for i, key in zip(live.tolist(), map(tuple, np.round(demands[live], 9).tolist())):
        items.setdefault(key, []).append(i)
    members = list(items.values())
    item_demand = np.array([demands[m[0]] for m in members])
    item_upper = np.array([upper[m].sum() for m in members])
    item_weight = np.array([weights[m].sum() for m in members])
    values = (item_demand / scale).sum(axis=1)  # formula 15: sum_k d_ik / r_k per task

    def same_direction_shares(program, variables):
        """Formula 16 for items whose demands point the same way but differ in size."""
        if len(members) < 2:
            return  # (one item: no other to keep level with)
        dom = task_dominant_shares(item_demand, capacity)
        unit = item_demand / np.linalg.norm(item_demand, axis=1, keepdims=True)
        classes: dict[tuple, list[int]] = {}
        for a in range(len(members)):
            classes.setdefault(tuple(np.round(unit[a], 9)), []).append(a)
        for group in (g for g in classes.values() if len(g) > 1):
            saturated = {b: program.add_binary() for b in group}  # b has run out of tasks
            for b in group:  # n_b >= upper_b * saturated_b
                program.add_row([(variables[b], 1.0), (saturated[b], -float(item_upper[b]))], lower=0.0)
            for a in group:
                step_a = dom[a] / item_weight[a]  # one task of a, in weighted share
                for b in group:
                    if a != b:  # a may lead b by more than one task only once b has run out:
                        # step_a n_a - step_b n_b <= step_a + step_a upper_a saturated_b
                        program.add_row([(variables[a], step_a), (variables[b], -dom[b] / item_weight[b]),
                                         (saturated[b], -step_a * float(item_upper[a]))], upper=float(step_a))

    if (values > 0).all() and (item_demand.T @ item_upper <= idle + 1e-9).all():
        # Every pending task fits the idle room at once: taking them all is feasible (formula
        # 16's rows too, each item saturated) and, every value positive, the one optimum, as
        # the program would find at its root. An idle cluster's passes solved it each time
        # (issue 64: 4,895 programs for 8,152 pods on 1,523 nodes).
        counts, status = item_upper, "optimal"
    else:
        solution = solve_packing(values, item_demand, idle, item_upper, abs_gap=gap * float(values.min()),
                                 extra=same_direction_shares, integer=len(members) <= exact_items)
        counts, status = solution.counts, solution.status
    quotas: dict[str, float] = {}
    for item, count in zip(members, counts):
        quotas.update(water_fill(int(count), item, weights, upper, tenants))
    return quotas, status


def water_fill(count: int, members: list[int], weights: np.ndarray, upper: np.ndarray,
               tenants: list[str]) -> dict[str, float]:
    """Split ``count`` tasks of identical demand among ``members`` so that tasks per weight stay
    as equal as their pending tasks allow (formula 16); ties go to the earlier tenant."""
    given = {i: 0 for i in members}
    heap = [(0.0, i) for i in members if upper[i] > 0]
    heapq.heapify(heap)
    for _ in range(count):
        if not heap:
            break
        _, i = heapq.heappop(heap)
        given[i] += 1
        if given[i] < upper[i]:
            heapq.heappush(heap, (given[i] / weights[i], i))
    return {tenants[i]: float(n) for i, n in given.items()}


SPEC = PolicySpec("qknobler", decide, "fairness stage to rho * DRF share, then an integer program for efficiency",
                  PARAMS, ordering=Ordering(efficiency="qknobler serves tenants in DRF order up to rho x their DRF "
                                                       "share, then gives the rest of the room by an integer program "
                                                       "for efficiency"))

__all__ = ["SPEC", "decide", "average_demands", "water_fill"]
