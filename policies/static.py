"""``static``: static partitioning by weight, the no-sharing baseline.

Each tenant may use at most its share ``S_i = capacity * w_i`` of every resource, even while
the rest of the cluster is idle. Fairness degrees (formula 3) and speedups are measured
against this policy. Partitions are quotas over the pooled capacity, as YARN queues with
max = min = share; the nodes themselves are not split.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from fairstream.core.fairness import dominant_share, fair_key
from fairstream.core.model import EPSILON, Decision, ReasonCode, Task
from fairstream.core.placement import Cycle, Service, TenantOrder, leaf_arrival, serve_in_order
from fairstream.core.snapshot import Snapshot
from fairstream.policies.base import Ordering, PolicySpec


def order(snapshot: Snapshot, params: Mapping[str, Any]) -> TenantOrder:
    """Lowest weighted dominant share first (within each tenant's partition)."""

    def key(cycle: Cycle, tenant: str):
        row = snapshot.rows[tenant]
        share = dominant_share(cycle.allocation[row], snapshot.capacity) / snapshot.share_fraction[row]
        return fair_key(share, leaf_arrival(snapshot, tenant), tenant)

    return TenantOrder("dominant share / weight", key)


def quota(snapshot: Snapshot, params: Mapping[str, Any]) -> Callable[[Cycle, str, Task], bool]:
    """Whether a task fits in its tenant's partition ``S_i`` after the pass's placements."""

    def admit(cycle: Cycle, tenant: str, task: Task) -> bool:
        row = snapshot.rows[tenant]
        return bool((cycle.allocation[row] + task.demand <= snapshot.share[row] + EPSILON).all())

    return admit


def decide(snapshot: Snapshot, params: Mapping[str, Any]) -> list[Decision]:
    def reason(cycle: Cycle, tenant: str, k) -> str:
        return "static: fits in the tenant's own partition"

    return serve_in_order(snapshot, "static", Service(order(snapshot, params).key, reason, admit=quota(snapshot, params),
                                                     code=ReasonCode.PARTITION), only=within_partition(snapshot))


def within_partition(snapshot: Snapshot) -> list[str]:
    """The tenants the pass serves (the engine's candidates, else every demanding one) less those
    whose partition can take none of their tasks (one vectorised check of a task of each of their
    shapes): serving one of those would try each of its shapes and refuse each (a tenant over its
    partition with a thousand shapes waiting did so on every pass, issue 64). Placements only add
    to a tenant's allocation, so none of them could take a task later in the pass either."""
    tenants = ([t for t in snapshot.pending if t in snapshot.candidates] if snapshot.candidates is not None
               else snapshot.demanding())
    kept = []
    for tenant in tenants:
        groups = snapshot.pending[tenant].groups.values()
        heads = [group.tasks[group.head].demand_values for group in groups if group.head < len(group.tasks)]
        if heads:
            row = snapshot.rows[tenant]
            if not (snapshot.allocation[row] + np.array(heads) <= snapshot.share[row] + EPSILON).all(axis=1).any():
                continue  # (no task of it fits its partition)
        kept.append(tenant)
    return kept


SPEC = PolicySpec("static", decide, "static partitioning by weight (no sharing)",
                  ordering=Ordering(order=order, quota=quota))
