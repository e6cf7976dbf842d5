"""``fifo``: tasks in global arrival order, skipping those that fit nowhere (backfill).

The memoryless baseline of the LTRF and FLEX papers: no notion of tenants at all.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fairstream.core.model import Decision, ReasonCode
from fairstream.core.placement import Cycle, Service, TenantOrder, serve_in_order
from fairstream.core.snapshot import Snapshot
from fairstream.policies.base import Ordering, PolicySpec, Traits


def _key(cycle: Cycle, tenant: str) -> tuple:
    task = cycle.queues.next_task(tenant)
    return (task.seq if task is not None else float("inf"), tenant)


def _reason(cycle: Cycle, tenant: str, key: tuple) -> str:
    # The task being placed, not the key: the key was taken when the tenant went into the heap,
    # and its head may since have been passed over as fitting nowhere (a shape found too big).
    task = cycle.queues.next_task(tenant)
    assert task is not None  # (asked as it is placed)
    return f"fifo: earliest pending task (arrival #{task.seq})"


def decide(snapshot: Snapshot, params: Mapping[str, Any]) -> list[Decision]:
    return serve_in_order(snapshot, "fifo", Service(_key, _reason, key_reads_queue=True, code=ReasonCode.ARRIVAL_ORDER))


SPEC = PolicySpec("fifo", decide, "first come, first served over all tenants",
                  ordering=Ordering(order=lambda snapshot, params: TenantOrder("arrival number of its earliest pending task",
                                                                               _key)),
                  traits=Traits(tenant_local=True))
