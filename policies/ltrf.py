"""``ltrf``: long-term max-min fairness over accumulated usage (LTRF, ICS'14, Algorithm 1).

The demanding tenant with the smallest weighted accumulated usage ``f_i / w_i`` (formula 11)
gets the next task, and its usage grows by the task's assumed cost right away (Algorithm 1,
line 10), so a pass hands out tasks the way the paper's loop does. Accumulated usage comes from
the engine's accounting (``fairstream.core.accounting``): time quantum, adaptive quanta, rounds,
pseudo accumulated resources and discount are all parameters.

``resource=mem`` (default) is the paper's single-resource mode; ``resource=dominant`` counts
accumulated usage as a dominant share of the accumulated vector (long-term DRF).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fairstream.core.fairness import fair_key
from fairstream.core.model import Decision, Task
from fairstream.core.placement import Cycle, FlatKey, ReasonFn, Service, TenantOrder, leaf_arrival, serve_in_order
from fairstream.core.preemption import reclaim
from fairstream.core.snapshot import Snapshot
from fairstream.policies._common import (
    LONG_TERM_PARAMS,
    PREEMPTION_PARAMS,
    RESERVATION_PARAMS,
    LongTermUsage,
    long_term_accounting,
    preemption_rule,
)
from fairstream.policies.base import Needs, Ordering, PolicySpec, Traits


def usage_order(snapshot: Snapshot, usage: LongTermUsage) -> TenantOrder:
    """Lowest weighted accumulated usage ``f_i / w_i`` first (formula 11), as ``usage`` charges
    a pass's placements; a tenant below its min share before the others."""

    def key(cycle: Cycle, tenant: str):
        row = snapshot.rows[tenant]
        weighted = usage.key(row) / snapshot.share_fraction[row]
        return fair_key(weighted, leaf_arrival(snapshot, tenant), tenant,
                        cycle.below_min_share(tenant))

    return TenantOrder("accumulated usage / weight", key)


def decide(snapshot: Snapshot, params: Mapping[str, Any]) -> list[Decision]:
    return usage_pass(snapshot, params, "ltrf",
                      lambda cycle, tenant, k: f"ltrf: lowest accumulated usage/weight ({k.share:.4g})")


def usage_pass(snapshot: Snapshot, params: Mapping[str, Any], policy: str, reason: ReasonFn,
               victims_per_fair_share: bool = False) -> list[Decision]:
    """The flat pass by the lowest weighted accumulated usage (``usage_order``), charging each
    placement as Algorithm 1 does, then preemption if ``params`` ask for it (victims: the most
    served first). ``policy`` names the decisions, ``reason`` gives each one's reason (as
    ``Service.reason``). ``hltrf`` makes it for a tree of one level (its victims' usage is
    weighed by their fair shares, ``LongTermUsage.per_fair_share``, not their share fractions)."""
    usage = LongTermUsage(snapshot)
    key = usage_order(snapshot, usage).key

    def charge(cycle: Cycle, tenant: str, task: Task) -> None:
        usage.charge(cycle, snapshot.rows[tenant], task)

    cycle = Cycle(snapshot, policy)
    rule = preemption_rule(params)
    # (As drf; a discounted charge is not linear in the demand: the Python loop's.)
    flat = FlatKey(usage.vectors, usage.resource, charge=snapshot.quantum, extra=snapshot.pseudo_accumulated,
                   compiled=rule is None and usage.discount == 1.0)
    serve_in_order(snapshot, policy, Service(key, reason, charge=charge, flat_key=flat), cycle=cycle)
    if rule is not None:
        reclaim(cycle, rule, usage.per_fair_share() if victims_per_fair_share else usage.per_weight())
    return cycle.decisions


SPEC = PolicySpec("ltrf", decide, "long-term max-min over accumulated usage (LTRF)", LONG_TERM_PARAMS + PREEMPTION_PARAMS + RESERVATION_PARAMS,
                  ordering=Ordering(order=lambda snapshot, params: usage_order(snapshot, LongTermUsage(snapshot)),
                                    victims=("accumulated usage / weight",
                                             lambda snapshot: LongTermUsage(snapshot).per_weight())),
                  needs=Needs(accounting=long_term_accounting, preemption=preemption_rule),
                  traits=Traits(tenant_local=True))
