"""Gangs in a pass: a distributed job's tasks start together or not at all (docs/workloads.md,
"Gangs"; issue 62).

A gang is a request whose ``Task.gang`` is its size. While none of it runs, the pass places
that many of its tasks at once or none (``place``): ``Cycle.try_place`` sends such an entry
here, so every policy that places through it starts gangs whole; policies that choose a node
task by task leave gangs to ``start_gangs``. Once it runs, its other tasks start as any task.
Pure functions of the pass's ``Cycle``: nothing here changes the engine.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from fairstream.core.model import EPSILON, ReasonCode, Task, gang_of

# (``cycle``: the pass's ``placement.Cycle``, untyped here as in ``preemption``: placement
# imports this module.)


def need(cycle, task: Task) -> int:
    """How many tasks of ``task``'s entry must start together now: 1 unless it is a gang none
    of which runs nor was placed in this pass; then its size, or all its tasks left if fewer
    (some ended)."""
    if not task.gang:
        return 1
    gang = gang_of(task)
    if gang in cycle.gangs_started or cycle.snapshot.gangs_running.get(gang):
        return 1  # (started whole: the rest of it start as they fit)
    return min(task.gang, task.count)


def waits(cycle, task: Task) -> bool:
    """Whether ``task`` is of a gang that must start whole (``need`` > 1): only
    ``Cycle.try_place`` may place it, never a policy's own choice of node task by task."""
    return bool(task.gang) and need(cycle, task) > 1


def place(cycle, tenant: str, task: Task, size: int, reason: str | Callable[[], str], code: ReasonCode) -> bool:
    """Start ``size`` tasks of gang entry ``task`` together, on nodes in first-fit order
    (``rows``), or none: False, its shape then passed over for the tenant in this
    pass, and the gang first in line if it is the first entry the pass found short of room.
    Limits count the whole gang, and so does its tenant's charge (``Cycle.last_count``)."""
    if cycle.capped and cycle.limits.over_cap(tenant, sized(task, size)) is not None:
        cycle.skip_for(tenant, task)
        return False
    where_to = rows(cycle, task, size)
    if where_to is None:
        cycle.skip_for(tenant, task)
        if cycle.decisions.blocked is None and cycle.short_of_room(task):
            cycle.decisions.blocked = (tenant, task)
        return False
    where = ", ".join(f"{cycle.snapshot.node_ids[node]}: {n}" for node, n in where_to)
    text = f"{reason() if callable(reason) else reason}; gang {gang_of(task)} of {size} starts whole ({where})"
    cycle.gangs_started.add(gang_of(task))
    for node, n in where_to:
        for _ in range(n):
            cycle.commit(tenant, task, node, text, code)
    cycle.last_count = size
    return True


def rows(cycle, task: Task, size: int) -> list[tuple[int, int]] | None:
    """Where ``size`` tasks of ``task``'s shape fit together in the pass's free room: (node row,
    how many there) in first-fit order (the policy's ``node_order`` if set), each node taking as
    many as fit it before the next (fewest nodes for the lowest numbers: a distributed job's
    workers close together), within its constraints, its job's ``max_per_node`` and the
    reservation (``NodeFit.usable``); None if they do not all fit."""
    found = room(cycle, task, size)
    return found if sum(n for _, n in found) == size else None


def room(cycle, task: Task, up_to: int) -> list[tuple[int, int]]:
    """Up to ``up_to`` tasks of ``task``'s shape that fit together in the pass's free room, as
    ``rows`` places them: (node row, how many there). Counted as ``Cycle.commit`` subtracts
    each task's demand (the same float operations), so what is counted is what the pass places."""
    nodes, free = cycle.nodes, cycle.free
    if not len(free):
        return []
    want = (task.demand - EPSILON).tolist()
    fits = (free >= task.demand - EPSILON).all(axis=1)
    if not task.constraints.empty:
        fits &= nodes.eligible(task.constraints)
    fits &= nodes.usable(task)
    order = np.flatnonzero(fits)
    if nodes.node_order is not None:
        rank = np.empty(len(nodes.node_order), dtype=np.int64)
        rank[nodes.node_order] = np.arange(len(nodes.node_order))
        order = order[np.argsort(rank[order], kind="stable")]
    most = task.constraints.max_per_node
    running = nodes.job_rows(task.tenant, task.job) if most is not None else None
    demand = task.demand_values
    out: list[tuple[int, int]] = []
    left = up_to
    for node in order.tolist():
        have = free[node].tolist()
        limit = left if running is None or most is None else min(left, most - running.get(node, 0))
        n = 0
        while n < limit and all(h >= w for h, w in zip(have, want)):
            have = [h - d for h, d in zip(have, demand)]
            n += 1
        if n:
            out.append((node, n))
            left -= n
            if not left:
                break
    return out


def start_gangs(cycle, candidates: list[tuple[str, Task]], reason: str, code: ReasonCode) -> list[str]:
    """Try each of ``candidates`` (tenant, entry) in turn that is a gang waiting to start whole,
    through ``Cycle.try_place``: for policies that choose a node task by task (Tetris,
    per-machine DRF), which leave gangs to this. Returns the tenants that started one."""
    started = []
    for tenant, task in candidates:
        if waits(cycle, task) and cycle.try_place(tenant, task, reason, code):
            started.append(tenant)
    return started


def sized(task: Task, n: int) -> Task:
    """``task`` with ``n`` times its demand: what a limit counts of a gang of ``n`` starting."""
    return Task(task.id, task.job, task.tenant, task.demand * n, task.submit, task.constraints, seq=task.seq,
                shape=task.shape, count=task.count, index=task.index, gang=task.gang)


__all__ = ["need", "place", "room", "rows", "sized", "start_gangs", "waits"]
