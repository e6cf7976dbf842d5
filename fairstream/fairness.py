"""One fairness vocabulary, reused by every policy and by the metrics.

Terms (LTRF paper, ICS'14, section 4.2; DRF, NSDI'11):

- *share* ``S_i = R * w_i / sum_k w_k`` (formula 2): the part of capacity ``R`` a tenant is
  entitled to; in a tree, ``w_i`` is the product of weight fractions along the path.
- *dominant share* of an allocation vector: ``max_r alloc_r / capacity_r``.
- *counted (discounted) allocation* ``g' = min(g, S) + eta * max(g - S, 0)`` (formula 7).
- *accumulated usage* ``f_i(t)``: integral of the counted allocation over the current window
  plus pseudo accumulated resources (formulas 8, 13); kept by ``fairstream.accounting``.

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
    positive = capacity > 0
    if not positive.any():
        return 0.0
    return float(np.max(allocation[positive] / capacity[positive]))


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
