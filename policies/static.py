"""``static``: static partitioning by weight, the no-sharing baseline.

Each tenant may use at most its share ``S_i = capacity * w_i`` of every resource, even while
the rest of the cluster is idle. Fairness degrees (formula 3) and speedups are measured
against this policy. Partitions are quotas over the pooled capacity, as YARN queues with
max = min = share; the nodes themselves are not split.
"""

from __future__ import annotations

from typing import Any, Mapping

from fairstream.core.fairness import dominant_share, fair_key
from fairstream.core.model import EPSILON, Decision, ReasonCode, Task
from fairstream.core.placement import Cycle, leaf_arrival, serve_in_order
from fairstream.core.snapshot import Snapshot
from fairstream.policies.base import PolicySpec


def decide(snapshot: Snapshot, params: Mapping[str, Any]) -> list[Decision]:
    def key(cycle: Cycle, tenant: str):
        row = snapshot.rows[tenant]
        share = dominant_share(cycle.allocation[row], snapshot.capacity) / snapshot.share_fraction[row]
        return fair_key(share, leaf_arrival(snapshot, tenant), tenant)

    def admit(cycle: Cycle, tenant: str, task: Task) -> bool:
        row = snapshot.rows[tenant]
        return bool((cycle.allocation[row] + task.demand <= snapshot.share[row] + EPSILON).all())

    def reason(cycle: Cycle, tenant: str, k) -> str:
        return "static: fits in the tenant's own partition"

    return serve_in_order(snapshot, "static", key, reason, admit=admit, code=ReasonCode.PARTITION)


SPEC = PolicySpec("static", decide, "static partitioning by weight (no sharing)")
