"""``tsf``: Task Share Fairness under placement constraints (Wang, Li, Liang and Li,
SIGMETRICS'16: "task share", weighted TSF, Theorem 1).

A tenant's *task share* is the tasks it runs divided by ``h_i``, the tasks it could run if it had
the whole cluster with its constraints removed (``fairness.monopoly_tasks``, from the demand of
its next pending task, over the live nodes). TSF is max-min over task shares divided by weights:
the tenant with the lowest weighted task share gets its next task, one at a time, until nothing
fits (progressive filling; the last tie-breaks are arrival and id, as everywhere).

Where a task goes matters under constraints: a task placed on a node that other tenants can use
while a node only it can use is free takes room they cannot get back. So each task goes to the
fitting node that the fewest other demanding tenants may use (their constraints allow it),
first fit among equals. On the paper's toy example this gives its allocation (6, 1, 3 tasks,
task shares 3/7, 1/7, 3/7); in general it is a heuristic for the max-min allocation, which is a
packing problem.

Weights are the tenants' effective shares, unless dedicated pools are given
(``--param pools=A:0.5,B:0.25``: each listed tenant was promised that fraction of every machine):
then Theorem 1's ``w_i = k_i / h_i``, with ``k_i`` the tasks the tenant could run in its pool on
the nodes it may use, so its weighted task share is simply ``tasks / k_i`` and sharing never
leaves it below what its pool would run (in the paper's divisible model; one task per machine of
rounding here).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, cast

import numpy as np

from fairstream.core.fairness import fair_key, monopoly_tasks, task_share
from fairstream.core.model import Decision, Task
from fairstream.core.placement import Cycle, Service, TenantOrder, leaf_arrival, serve_in_order
from fairstream.core.snapshot import Snapshot
from fairstream.policies.base import Ordering, Param, PolicySpec


def parse_pools(text: str) -> dict[str, float]:
    """``"A:0.5,B:0.25"`` -> ``{"A": 0.5, "B": 0.25}``; fractions in (0, 1], at most 1 in all."""
    pools: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        tenant, sep, fraction = part.rpartition(":")
        if not sep or not tenant:
            raise ValueError(f"expected tenant:fraction, got {part!r}")
        value = float(fraction)
        if not 0 < value <= 1:
            raise ValueError(f"{tenant}: a pool is a fraction in (0, 1], got {fraction}")
        pools[tenant] = value
    if sum(pools.values()) > 1 + 1e-9:
        raise ValueError("pools add up to more than the cluster")
    return pools


PARAMS = (
    Param("pools", {}, parse_pools, "dedicated pools as tenant:fraction of every machine; those tenants' "
                                    "weights become k_i / h_i (Theorem 1)"),
)


def task_share_order(snapshot: Snapshot, params: Mapping[str, Any], cycle: Cycle,
                     placed: Mapping[str, int]) -> tuple[TenantOrder, Callable[[str], int]]:
    """Lowest task share per weight first: tasks running and ``placed`` in this pass over
    ``h``, the tasks the tenant could run alone on the whole cluster without constraints (a
    tenant with a dedicated pool: over ``k``, its pool's tasks, Theorem 1). Also returns ``h``."""
    live = snapshot.free[:, 0] >= 0  # lost nodes carry -1 everywhere
    node_capacity = cast(np.ndarray, snapshot.node_capacity)  # (the engine's snapshots have it)
    capacities = node_capacity[live]
    running = snapshot.running if snapshot.running is not None else np.zeros(len(snapshot.tenants))
    monopoly: dict[str, int] = {}

    def h(tenant: str) -> int:
        if tenant not in monopoly:
            task = cycle.queues.next_task(tenant)
            monopoly[tenant] = monopoly_tasks(task.demand, capacities) if task is not None else 0
        return monopoly[tenant]

    pools = params["pools"]
    pool_tasks: dict[str, int] = {}

    def k(tenant: str) -> int:
        """Tasks the tenant's dedicated pool would run, on the nodes it may use."""
        if tenant not in pool_tasks:
            task = cycle.queues.next_task(tenant)
            if task is None:
                pool_tasks[tenant] = 0
            else:
                usable = cycle.nodes.eligible(task.constraints) & live
                pool_tasks[tenant] = monopoly_tasks(task.demand, node_capacity[usable] * pools[tenant])
        return pool_tasks[tenant]

    def key(c: Cycle, tenant: str):
        row = snapshot.rows[tenant]
        tasks = running[row] + placed.get(tenant, 0)
        if tenant in pools:  # Theorem 1: task share / (k_i / h_i) = tasks / k_i
            share = tasks / k(tenant) if k(tenant) > 0 else float("inf")
        else:
            share = task_share(tasks, h(tenant)) / snapshot.share_fraction[row]
        return fair_key(share, leaf_arrival(snapshot, tenant), tenant, c.below_min_share(tenant))

    return TenantOrder("task share / weight", key), h


def decide(snapshot: Snapshot, params: Mapping[str, Any]) -> list[Decision]:
    live = snapshot.free[:, 0] >= 0  # lost nodes carry -1 everywhere
    tenants = snapshot.demanding()
    cycle = Cycle(snapshot, "tsf")
    placed: dict[str, int] = {}

    # How many demanding tenants may use each node: the contention a placement there causes.
    contention = np.zeros(len(snapshot.node_ids))
    for tenant in tenants:
        allowed = np.zeros(len(snapshot.node_ids), dtype=bool)
        for task in cycle.queues.shape_heads(tenant):
            allowed |= cycle.nodes.eligible(task.constraints)
        contention += allowed & live

    order, h = task_share_order(snapshot, params, cycle, placed)

    def charge(c: Cycle, tenant: str, task: Task) -> None:
        placed[tenant] = placed.get(tenant, 0) + 1

    def reason(c: Cycle, tenant: str, k) -> str:
        return f"tsf: lowest task share/weight ({k.share:.4g}; h={h(tenant)} tasks with the whole cluster)"

    cycle.node_order = np.lexsort((np.arange(len(contention)), contention))  # least contended first
    return serve_in_order(snapshot, "tsf", Service(order.key, reason, charge=charge), cycle=cycle)


SPEC = PolicySpec("tsf", decide, "max-min over task shares: tasks run / tasks it could run alone without constraints",
                  PARAMS, ordering=Ordering(order=lambda snapshot, params: task_share_order(
                      snapshot, params, Cycle(snapshot, "tsf"), {})[0]))

__all__ = ["SPEC", "decide"]
