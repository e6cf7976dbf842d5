"""``drf``: memoryless weighted Dominant Resource Fairness (Ghodsi et al., NSDI'11).

The tenant with the lowest ``max_r allocation_r / capacity_r`` divided by its weight gets the
next task; tasks go to real nodes (next fit), not to one pooled super-machine.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fairstream.core.model import Decision
from fairstream.core.placement import Cycle, FlatKey, Service, dominant_share_order, serve_in_order
from fairstream.core.preemption import PreemptionRule, reclaim
from fairstream.core.snapshot import Snapshot
from fairstream.policies._common import PREEMPTION_PARAMS, RESERVATION_PARAMS, preemption_rule
from fairstream.policies.base import Needs, Ordering, PolicySpec, Traits


def decide(snapshot: Snapshot, params: Mapping[str, Any]) -> list[Decision]:
    return dominant_share_pass(snapshot, "drf", preemption_rule(params))


def dominant_share_pass(snapshot: Snapshot, policy: str, rule: PreemptionRule | None = None) -> list[Decision]:
    """Lowest weighted dominant share of the whole cluster first, first fit on real nodes; with
    a preemption ``rule``, then room taken back for starved tenants from those furthest above
    their fair share."""

    key = dominant_share_order(snapshot).key

    def reason(cycle: Cycle, tenant: str, k) -> str:
        return f"{policy}: lowest dominant share/weight ({k.share:.4g})"

    # The key as data: the compiled pass may serve by it, but not before a preemption stage,
    # which reads the pass's working state.
    flat = FlatKey(snapshot.allocation, None, compiled=rule is None)
    cycle = Cycle(snapshot, policy)
    serve_in_order(snapshot, policy, Service(key, reason, flat_key=flat), cycle=cycle)
    if rule is not None:
        reclaim(cycle, rule)  # victims: the furthest above their fair share
    return cycle.decisions


SPEC = PolicySpec("drf", decide, "memoryless weighted dominant resource fairness", PREEMPTION_PARAMS + RESERVATION_PARAMS,
                  ordering=Ordering(order=lambda snapshot, params: dominant_share_order(snapshot)),
                  needs=Needs(preemption=preemption_rule), traits=Traits(tenant_local=True))
