"""``cdrf``: constrained DRF, one of the TSF paper's baselines (its Table 1, after Friedman,
Ghodsi and Psomas, EC'14: sharing-incentive and Pareto optimal, neither strategy-proof nor
envy-free under constraints).

Our reading (the TSF paper names CDRF without defining it): a job's dominant share is measured
against the capacity of the servers its constraints allow, ``max_r allocation_r / (sum over
allowed servers of capacity_r)``, and the lowest (per weight) gets the next task, first fit.
A job confined to a small pool thus counts as "rich" early, which is what lets a job gain by
declaring narrower constraints than it needs (no strategy-proofness).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import numpy as np

from fairstream.core.fairness import dominant_share, fair_key
from fairstream.core.model import Decision
from fairstream.core.placement import Cycle, Service, TenantOrder, leaf_arrival, serve_in_order
from fairstream.core.snapshot import Snapshot
from fairstream.policies.base import Ordering, PolicySpec


def order(snapshot: Snapshot, params: Mapping[str, Any]) -> TenantOrder:
    """Lowest dominant share of the servers a tenant's constraints allow, per weight, first."""
    cycle = Cycle(snapshot, "cdrf")
    live = snapshot.free[:, 0] >= 0
    pools: dict[str, np.ndarray] = {}

    def pool(tenant: str) -> np.ndarray:
        """The capacity of the live servers its pending tasks may use (all live ones if it
        has none pending: its key is then read, not served by)."""
        if tenant not in pools:
            heads = cycle.queues.shape_heads(tenant)
            allowed = np.zeros(len(snapshot.node_ids), dtype=bool) if heads else np.ones(len(snapshot.node_ids), bool)
            for task in heads:
                allowed |= cycle.nodes.eligible(task.constraints)
            pools[tenant] = cast(np.ndarray, snapshot.node_capacity)[allowed & live].sum(axis=0)
        return pools[tenant]

    for tenant in snapshot.demanding():  # as the pass starts: before it takes any task
        pool(tenant)

    def key(c: Cycle, tenant: str):
        row = snapshot.rows[tenant]
        share = dominant_share(c.allocation[row], pool(tenant)) / snapshot.share_fraction[row]
        return fair_key(share, leaf_arrival(snapshot, tenant), tenant, c.below_min_share(tenant))

    return TenantOrder("dominant share of its allowed servers / weight", key)


def decide(snapshot: Snapshot, params: Mapping[str, Any]) -> list[Decision]:
    def reason(c: Cycle, tenant: str, k) -> str:
        return f"cdrf: lowest dominant share of its allowed servers/weight ({k.share:.4g})"

    return serve_in_order(snapshot, "cdrf", Service(order(snapshot, params).key, reason))


SPEC = PolicySpec("cdrf", decide, "constrained DRF: dominant share of the servers a job may use",
                  ordering=Ordering(order=order))

__all__ = ["SPEC", "decide"]
