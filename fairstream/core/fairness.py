"""One fairness vocabulary, reused by every policy and by the metrics.

Terms (LTRF paper, ICS'14, section 4.2; DRF, NSDI'11):

- *share* ``S_i = R * w_i / sum_k w_k`` (formula 2): the part of capacity ``R`` a tenant is
  entitled to; in a tree, ``w_i`` is the product of weight fractions along the path.
- *fair share* (``fair_shares``): YARN's, on the tree: each queue's share divided among its
  children with demand by weight, capped by their demand, max_share and max_resources, raised
  to their min_share. Preemption restores it; explain, status, the page and the metrics show it.
- *dominant share* of an allocation vector: ``max_r alloc_r / capacity_r``.
- *counted (discounted) allocation* ``g' = min(g, S) + eta * max(g - S, 0)`` (formula 7).
- *accumulated usage* ``f_i(t)``: integral of the counted allocation over the current window
  plus pseudo accumulated resources (formulas 8, 13); kept by ``fairstream.core.accounting``.

Ordering: tenants are served lowest ``FairKey`` first. The key is a total order with explicit
tie-breaks: priority class (below min share first), then the weighted share value, then arrival
time, then id. Every policy builds its keys with ``fair_key`` so ties resolve the same way
everywhere.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from fairstream.core.model import ROOT

if TYPE_CHECKING:
    from fairstream.core.tenants import TenantTree

#: Priority classes: tenants below their guaranteed minimum share are served before the rest.
BELOW_MIN_SHARE = 0
NORMAL = 1


class FairKey(NamedTuple):
    """Total order for "who is served next": smaller is served first."""

    priority: int
    share: float
    arrival: float
    tenant: str


def fair_key(share: float, arrival: float, tenant: str, below_min_share: bool = False) -> FairKey:
    """Build the key: (priority class, share, arrival, id). ``share`` is already weighted."""
    return FairKey(BELOW_MIN_SHARE if below_min_share else NORMAL, share, arrival, tenant)


def dominant_share(allocation: np.ndarray, capacity: np.ndarray) -> float:
    """``max_r allocation_r / capacity_r`` over resources with capacity > 0 (0 if none)."""
    # Plain floats: called once per placement on vectors of a few resources, where numpy's
    # per-call overhead is several times the arithmetic.
    best = None
    for used, total in zip(allocation.tolist(), capacity.tolist()):
        if total > 0:
            share = used / total
            if best is None or share > best:
                best = share
    return 0.0 if best is None else best


def fair_shares(tree: TenantTree, tenants: Sequence[str], demand: np.ndarray, capacity: np.ndarray,
                resource: int | None, resources: Sequence[str] = ()) -> np.ndarray:
    """THE fair share of every tenant row, as a fraction of the cluster in one measure (one
    ``resource``'s share, or the dominant share when it is None): YARN Fair Scheduler's fair
    share, which is Armada's demand-capped "adjusted fair share" on a tree.

    Inputs: the tenant ``tree``; ``tenants`` the row names; ``demand`` one row per tenant, what
    it runs plus what it waits for (resource amounts); the cluster's ``capacity``; the measure;
    ``resources`` the resource names, for ``max_resources``.

    Definition, top down from the root, which divides the whole cluster (1):

    1. a tenant's or queue's *demand* is its own (a leaf) or its children's (a queue), capped
       by its ``max_share`` (of the dominant share) and ``max_resources``: the demand vector is
       scaled down until it is within both;
    2. a queue's share is divided among its children with some demand (the others get 0) by
       water-filling: child ``k`` gets ``clamp(r * w_k, low_k, demand_k)`` with the one ``r``
       that hands out the whole share, or everything demanded if that is less; ``low_k`` is
       what it is guaranteed: its ``min_share`` (a fraction of the cluster) or, a queue, the
       sum of its children's if more, capped by its demand;
    3. if the children's ``low`` add up to more than the share, they get it in proportion to
       their ``low``.

    A queue with one busy child gives it all its share (an idle sibling's part stays in the
    queue, as YARN's does), a capped child's leftover goes to its siblings first. The shares of
    all tenants add up to at most 1, less only when everything demanded is less.
    """
    out = np.zeros(len(tenants))
    if not len(tenants) or not (capacity > 0).any():
        return out
    row_of = {name: row for row, name in enumerate(tenants) if tree.is_leaf(name)}
    children = tree.children
    # Post order: every node after its children, so its demand is their capped sum.
    order, stack = [], [ROOT]
    while stack:
        node = stack.pop()
        order.append(node)
        stack.extend(children.get(node, ()))
    vectors: dict[str, np.ndarray] = {}
    zero = np.zeros(len(capacity))
    for node in reversed(order):
        kids = children.get(node, ())
        if node != ROOT and not kids:
            row = row_of.get(node)
            vector = demand[row] if row is not None else zero
        else:
            vector = sum((vectors[k] for k in kids), zero)
        if node != ROOT and tree.has_limits:
            vector = _capped(vector, tree.specs[node], capacity, resources)
        vectors[node] = vector

    def measure(vector: np.ndarray) -> float:
        return resource_share(vector, capacity, resource)

    # Guaranteed part of each node, bottom up: its own min_share and what its children are
    # guaranteed (min_share is a fraction of the cluster wherever it is set), capped by demand.
    lows: dict[str, float] = {}
    if tree.has_limits:
        for node in reversed(order):
            if node == ROOT:
                continue
            high = measure(vectors[node])
            low = min(high, sum(lows.get(k, 0.0) for k in children.get(node, ())))
            floor = tree.specs[node].min_share
            if floor > 0 and high > 0:
                dominant = dominant_share(vectors[node], capacity)
                low = max(low, high if dominant <= floor else measure(vectors[node] * (floor / dominant)))
            lows[node] = low

    def divide(queue: str, amount: float) -> None:
        kids = [k for k in children.get(queue, ()) if measure(vectors[k]) > 0]
        if not kids:
            return
        high = np.array([measure(vectors[k]) for k in kids])
        weights = np.array([tree.specs[k].weight for k in kids], dtype=float)
        low = np.array([lows.get(k, 0.0) for k in kids])
        for kid, share in zip(kids, water_fill(amount, weights, low, high).tolist()):
            if kid in row_of:
                out[row_of[kid]] = share
            elif children.get(kid):
                divide(kid, share)

    divide(ROOT, 1.0)
    return out


def _capped(vector: np.ndarray, spec, capacity: np.ndarray, resources: Sequence[str]) -> np.ndarray:
    """``vector`` scaled down (keeping its proportions) to within ``spec``'s max_share (of the
    dominant share) and max_resources."""
    factor = 1.0
    if spec.max_share < 1:
        dominant = dominant_share(vector, capacity)
        if dominant > spec.max_share:
            factor = spec.max_share / dominant
    for name, limit in (spec.max_resources or {}).items():
        if name in resources:
            amount = float(vector[list(resources).index(name)])
            if amount > limit:
                factor = min(factor, limit / amount)
    return vector * factor if factor < 1 else vector


def water_fill(amount: float, weights: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """``clamp(r * weights, low, high)`` with the ``r`` whose sum is ``amount``; ``high`` if all
    of it is less than ``amount``; ``low`` scaled down to ``amount`` if it is more. Exact: the
    sum is piecewise linear in ``r`` between the points where a clamp starts or stops."""
    if high.sum() <= amount:
        return high.copy()
    if low.sum() >= amount:
        return low * (amount / low.sum()) if low.sum() > 0 else low.copy()

    def total(r: float) -> float:
        return float(np.clip(r * weights, low, high).sum())

    points = np.unique(np.concatenate([low / weights, high / weights]))
    values = np.array([total(r) for r in points.tolist()])
    k = int(np.searchsorted(values, amount))  # values[k - 1] < amount <= values[k]
    if k == 0:
        r = float(points[0])
    elif k == len(values):
        # ``amount`` is short of ``high.sum()`` by float dust only, and the sum at the last
        # point is below it by as little (``high / weights * weights`` may round below
        # ``high``): give that, never more than ``amount``.
        r = float(points[-1])
    else:
        r0, r1, v0, v1 = points[k - 1], points[k], values[k - 1], values[k]
        r = float(r0 + (r1 - r0) * (amount - v0) / (v1 - v0)) if v1 > v0 else float(r1)
    return np.clip(r * weights, low, high)


def resource_share(allocation: np.ndarray, capacity: np.ndarray, resource: int | None) -> float:
    """Share of one resource (``resource`` index) or the dominant share (``resource is None``)."""
    if resource is None:
        return dominant_share(allocation, capacity)
    cap = capacity[resource]
    return float(allocation[resource] / cap) if cap > 0 else 0.0


def resource_shares(matrix: np.ndarray, capacity: np.ndarray, resource: int | None) -> np.ndarray:
    """``resource_share`` for every row of a tenant x resource matrix at once."""
    if not len(matrix):
        return np.zeros(0)
    if resource is None:
        positive = capacity > 0
        if not positive.any():
            return np.zeros(len(matrix))
        return (matrix[:, positive] / capacity[positive]).max(axis=1)
    cap = capacity[resource]
    return matrix[:, resource] / cap if cap > 0 else np.zeros(len(matrix))


def normalised_usage(usage: np.ndarray, capacity: np.ndarray, resource: int | None) -> float:
    """Accumulated usage (resource-seconds) as one number in cluster-seconds: the share of
    ``resource`` (single-resource mode) or the dominant share (long-term DRF)."""
    return resource_share(usage, capacity, resource)


def counted_allocation(allocation: np.ndarray, share: np.ndarray, discount: float) -> np.ndarray:
    """Formula 7: ``min(g, S) + eta * max(g - S, 0)``, per resource. Works row-wise on matrices."""
    return np.minimum(allocation, share) + discount * np.maximum(allocation - share, 0.0)


def marginal_counted(allocation: np.ndarray, share: np.ndarray, demand: np.ndarray, discount: float) -> np.ndarray:
    """How much the counted allocation grows when ``demand`` is added to ``allocation``."""
    return counted_allocation(allocation + demand, share, discount) - counted_allocation(allocation, share, discount)


def fairness_degree(accumulated_allocation: float, accumulated_entitlement: float) -> float:
    """Formula 3: ``rho_i = int g_i / int min(d_i, S_i)``; 1.0 while nothing was owed yet."""
    if accumulated_entitlement <= 0:
        return 1.0
    return accumulated_allocation / accumulated_entitlement


def fairness_degrees(accumulated_allocation: np.ndarray, accumulated_entitlement: np.ndarray) -> np.ndarray:
    """``fairness_degree`` of every row at once, to the bit (one float division each)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(accumulated_entitlement <= 0, 1.0, accumulated_allocation / accumulated_entitlement)


def sharing_benefit(degrees: list[float]) -> float:
    """Formula 4: ``Psi = sum max(rho_i - 1, 0)``."""
    return float(sum(max(rho - 1.0, 0.0) for rho in degrees))


def sharing_loss(degrees: list[float]) -> float:
    """Formula 5: ``Omega = sum min(rho_i - 1, 0)`` (never positive)."""
    return float(sum(min(rho - 1.0, 0.0) for rho in degrees))


# --------------------------------------------------------------------------------------------
# Multi-resource fairness-efficiency (QKnobler, Tang, Yu and Li, section 5). Inputs are one row
# per user: ``demands`` the per-task demand vector D_i, ``weights`` w_i (share fractions here,
# summing to 1 over the users considered), ``capacity`` R. Users with an all-zero demand take
# no part (they cannot run "a task" in the paper's sense).


def task_dominant_shares(demands: np.ndarray, capacity: np.ndarray) -> np.ndarray:
    """``max_k d_ik / r_k`` per user: the dominant share of one task."""
    positive = capacity > 0
    if not len(demands) or not positive.any():
        return np.zeros(len(demands))
    return (demands[:, positive] / capacity[positive]).max(axis=1)


def drf_phi(demands: np.ndarray, weights: np.ndarray, capacity: np.ndarray) -> float:
    """phi of formula 11: ``max_k (1/r_k) sum_j w_j d_jk / max_k' (d_jk'/r_k')``.

    DRF's progressive filling stops when the first resource is full; phi is how full the most
    loaded resource would be if every user had weighted dominant share 1."""
    dom = task_dominant_shares(demands, capacity)
    users = dom > 0
    positive = capacity > 0
    if not users.any() or not positive.any():
        return 0.0
    load = (weights[users, None] * demands[users] / dom[users, None]).sum(axis=0)
    return float((load[positive] / capacity[positive]).max())


def drf_max_shares(demands: np.ndarray, weights: np.ndarray, capacity: np.ndarray) -> np.ndarray:
    """``s_i^max = w_i / phi`` (formula 11): each user's dominant share under DRF."""
    phi = drf_phi(demands, weights, capacity)
    return weights / phi if phi > 0 else np.zeros(len(weights))


def drf_max_tasks(demands: np.ndarray, weights: np.ndarray, capacity: np.ndarray) -> np.ndarray:
    """``N_i(U_i^max) = w_i / (phi * max_k d_ik/r_k)``: tasks each user runs under DRF."""
    dom = task_dominant_shares(demands, capacity)
    phi = drf_phi(demands, weights, capacity)
    out = np.zeros(len(weights))
    ok = dom > 0
    if phi > 0:
        out[ok] = weights[ok] / (phi * dom[ok])
    return out


def soft_fairness_theta(demands: np.ndarray, weights: np.ndarray, capacity: np.ndarray, rho: float) -> float:
    """theta of Theorem 1: QKnobler with knob ``rho`` keeps ``|s_i/w_i - s_j/w_j| <= theta``.

    ``theta = max_i (max_k d_ik/r_k) / max_k (w_i d_ik / r'_k)`` with the resources the fairness
    stage leaves, ``r'_k = r_k - rho * sum_j N_j^max d_jk``; 0 when rho = 1. The term of user i
    is the weighted dominant share it would reach by taking all of R' alone (0 if some resource
    it needs is already exhausted)."""
    if rho >= 1:
        return 0.0
    dom = task_dominant_shares(demands, capacity)
    remaining = capacity - rho * (drf_max_tasks(demands, weights, capacity)[:, None] * demands).sum(axis=0)
    theta = 0.0
    for i in np.flatnonzero((dom > 0) & (weights > 0)):
        needs = demands[i] > 0
        if (remaining[needs] <= EPS_RESOURCE).any():
            continue
        worst = (weights[i] * demands[i][needs] / remaining[needs]).max()
        theta = max(theta, float(dom[i] / worst))
    return theta


def sharing_incentive_rho(demands: np.ndarray, weights: np.ndarray, capacity: np.ndarray) -> float:
    """Theorem 2: QKnobler is sharing-incentive for ``rho >= phi / sum_j w_j``."""
    total = float(weights[task_dominant_shares(demands, capacity) > 0].sum())
    return drf_phi(demands, weights, capacity) / total if total > 0 else 0.0


def soft_fairness_degree(shares: np.ndarray, weights: np.ndarray) -> float:
    """Formula 12's degree: ``max_{i,j} |s_i/w_i - s_j/w_j|`` = max - min of ``s_i/w_i`` over
    users with a weight (0 for fewer than two)."""
    keep = weights > 0
    if keep.sum() < 2:
        return 0.0
    weighted = shares[keep] / weights[keep]
    return float(weighted.max() - weighted.min())


#: Amounts of a resource below this count as exhausted in the theory functions above.
EPS_RESOURCE = 1e-9


# --------------------------------------------------------------------------------------------
# Task share (TSF, Wang, Li, Liang and Li, SIGMETRICS'16 poster / "Multi-resource fair sharing
# for datacenter jobs with placement constraints").


def monopoly_tasks(demand: np.ndarray, node_capacities: np.ndarray) -> int:
    """``h_i``: how many tasks of ``demand`` the whole cluster could run for one job alone with
    its constraints removed: ``sum over nodes of floor(min_k capacity_nk / d_k)``."""
    need = demand > 0
    if not need.any() or not len(node_capacities):
        return 0
    per_node = np.floor(np.min(node_capacities[:, need] / demand[need], axis=1) + 1e-9)
    return int(np.maximum(per_node, 0).sum())


def task_share(tasks: float, monopoly: int) -> float:
    """Tasks allocated over ``h_i``; a job that could run nothing anywhere has share 0."""
    return tasks / monopoly if monopoly > 0 else 0.0
