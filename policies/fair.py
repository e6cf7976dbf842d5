"""``fair``: memoryless weighted max-min fairness on one resource (YARN Fair Scheduler style).

The tenant with the lowest ``allocation_r / (capacity_r * w_i)`` gets the next task, where ``r``
is the configured resource (memory by default where the cluster has it, as YARN; else the
dominant share) and ``w_i`` the tenant's effective
share in the tree. This is MLRF in the LTRF paper's terms (section 4, Table 1a).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fairstream.core.fairness import fair_key, resource_share
from fairstream.core.model import Decision
from fairstream.core.placement import Cycle, FlatKey, Service, TenantOrder, leaf_arrival, serve_in_order
from fairstream.core.preemption import reclaim
from fairstream.core.snapshot import Snapshot
from fairstream.policies._common import (
    PREEMPTION_PARAMS,
    RESERVATION_PARAMS,
    RESOURCE_PARAM,
    preemption_rule,
    resource_accounting,
    resource_label,
)
from fairstream.policies.base import Needs, Ordering, PolicySpec, Traits


def order(snapshot: Snapshot, params: Mapping[str, Any]) -> TenantOrder:
    """Lowest current share of the resource per weight first."""
    resource = snapshot.accounting.resource  # made from params["resource"] (resource_accounting)

    def key(cycle: Cycle, tenant: str):
        row = snapshot.rows[tenant]
        share = resource_share(cycle.allocation[row], snapshot.capacity, resource) / snapshot.share_fraction[row]
        return fair_key(share, leaf_arrival(snapshot, tenant), tenant, cycle.below_min_share(tenant))

    return TenantOrder(f"{resource_label(snapshot)} share / weight", key)


def decide(snapshot: Snapshot, params: Mapping[str, Any]) -> list[Decision]:
    resource = snapshot.accounting.resource
    label = resource_label(snapshot)
    key = order(snapshot, params).key

    def reason(cycle: Cycle, tenant: str, k) -> str:
        return f"fair: lowest current {label} share/weight ({k.share:.4g})"


    cycle = Cycle(snapshot, "fair")
    rule = preemption_rule(params)
    flat = FlatKey(snapshot.allocation, resource, compiled=rule is None)  # (as drf)
    serve_in_order(snapshot, "fair", Service(key, reason, flat_key=flat), cycle=cycle)
    if rule is not None:
        reclaim(cycle, rule)  # victims: the furthest above their fair share
    return cycle.decisions


SPEC = PolicySpec("fair", decide, "memoryless weighted max-min on one resource", (RESOURCE_PARAM,) + PREEMPTION_PARAMS + RESERVATION_PARAMS,
                  ordering=Ordering(order=order), needs=Needs(accounting=resource_accounting, preemption=preemption_rule),
                  traits=Traits(tenant_local=True))
