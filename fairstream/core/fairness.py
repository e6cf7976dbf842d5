"""One fairness vocabulary, reused by every policy and by the metrics.

Terms (LTRF paper, ICS'14, section 4.2; DRF, NSDI'11):

- *share* ``S_i = R * w_i / sum_k w_k`` (formula 2): the part of capacity ``R`` a tenant is
  entitled to; in a tree, ``w_i`` is the product of weight fractions along the path.
- *instantaneous fair share*: ``w_i`` renormalised over the tenants with running or pending
  work (YARN's), what preemption restores (``fairstream.core.preemption``).
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

from typing import NamedTuple

import numpy as np

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


def instantaneous_fair_shares(fractions: np.ndarray, active: np.ndarray) -> np.ndarray:
    """Each tenant's instantaneous fair share, as YARN's: its weight fraction (``S_i / R``)
    renormalised over the ``active`` tenants (those with running or pending work), 0 for the
    others. Preemption measures starvation against it; the metrics' time to fair share too."""
    weights = np.where(active, fractions, 0.0)
    total = weights.sum()
    return weights / total if total > 0 else weights


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
