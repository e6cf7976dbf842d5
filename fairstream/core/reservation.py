"""The engine's part that reserves a node for the first task in line (``reservation=on|backfill``).

After a pass, the first waiting task the pass tried that fitted no node's free room (the
pass's ``blocked``) gets a node reserved: the one it had, if the same tenant's same shape held
one that can still hold it, else the live node it may use that lacks least. The next passes
keep other shapes off the room there (``Cycle``), so the task is not starved by smaller ones
(YARN's reservations, Slurm's backfill). With ``backfill``, other tasks may take that room if
they are expected to end before the reserved task can start there (``backfill_until``).
docs/policies.md, "Reservations".
"""

from __future__ import annotations

import math
from typing import cast

import numpy as np

from fairstream.core import native
from fairstream.core.model import EPSILON, Task, TaskState, event_time, tasks_fitting
from fairstream.core.nodes import Nodes
from fairstream.core.snapshot import Reservation
from fairstream.core.verdicts import Verdicts, allowed
from fairstream.core.workload import Workload


class Reservations:
    """The reservation held (``held``), and with backfill the reserved task's start as last
    worked out (made again when the reservation or the tasks on its node change)."""

    def __init__(self) -> None:
        self.held: Reservation | None = None
        # Gangs whose hold ran out (request id -> the event time from which one may hold again).
        self.lapsed: dict[str, float] = {}
        self._backfill: tuple[Reservation, float | None] | None = None  # (not stored in snapshots)

    def clear(self) -> None:
        self.held = None

    def node_changed(self, row: int) -> None:
        """A task started or stopped on node ``row``: the reserved task's start there is made
        again."""
        if self._backfill is not None and row in self._backfill[0].rows:
            self._backfill = None

    def node_lost(self, row: int) -> None:
        if self.held is not None and row in self.held.rows:
            self.held = None

    def wake_at(self, now: float) -> float | None:
        """The next event time after ``now`` at which a gang's hold runs out or a gang may hold
        again (a pass then changes what is kept), or None."""
        times = [t for t in self.lapsed.values() if t > now]
        if self.held is not None and now < self.held.until < math.inf:
            times.append(self.held.until)
        return min(times, default=None)

    def backfill_until(self, now: float | None, workload: Workload, registry: Nodes) -> float | None:
        """The time the reserved task can start on its node by the estimates of the tasks
        running there (the earliest expected end after which enough of them have ended for it
        to fit; ``now`` if it fits now). Other tasks may take room there if they are expected
        to end by then (Slurm's backfill: they do not delay it). None: no reservation, or a
        task it must wait for has no estimate. For a gang's nodes: when they hold the whole gang
        together (``_gang_start``)."""
        held = self.held
        if held is None:
            return None
        at = now if now is not None else 0.0
        cached = self._backfill  # (not for a gang: its size moves with its pending tasks, not its nodes)
        if cached is not None and cached[0] == held and not held.for_gang:
            return None if cached[1] is None else max(cached[1], at)  # (a task past its estimate ends now at the earliest)
        demand = workload.shape_demands[held.shape]
        size = 1
        if held.for_gang:
            request = workload.requests.get(held.task.rpartition("-")[0])
            if request is None:
                return None
            size = min(request.gang, request.count)
        free = {row: registry.capacity[row] - registry.used[row] for row in held.rows}
        if _holds(free, demand, size):
            return now  # it fits now: nothing else goes first
        ids = {registry.nodes[row].id: row for row in held.rows}
        ends = sorted((math.inf if task.estimate is None else event_time(cast(float, task.start) + task.estimate), task.seq, task)
                      for task in workload.tasks.values() if task.state is TaskState.RUNNING and task.node in ids)
        until = None
        for end, _, task in ends:
            if end == math.inf:
                break  # it must wait for a task of unknown end: its start is unknown
            row = ids[cast(str, task.node)]
            free[row] = free[row] + task.demand
            if _holds(free, demand, size):
                until = end
                break
        self._backfill = (held, until)
        return None if until is None else max(until, at)

    def reserve(self, blocked: tuple[str, Task] | None, workload: Workload, registry: Nodes, verdicts: Verdicts,
                total: np.ndarray, now: float = 0.0, hold: float = math.inf) -> None:
        """After a pass: reserve a node for ``blocked``, the first entry the pass tried that
        fitted no node's free room (None: no reservation). The node kept if the same tenant's
        same shape held one that can still hold it; else the live node it may use that lacks
        least (summed over resources, as shares of the cluster's ``total`` capacity), the
        lowest number on ties. A gang none of which runs holds several nodes for at most
        ``hold`` seconds from ``now`` (``_hold_for_gang``)."""
        for gang in [gang for gang, at in self.lapsed.items() if at <= now]:
            del self.lapsed[gang]  # (kept to the gangs still waiting out their lapse: not history)
        if blocked is None:
            self.held = None
            return
        tenant, entry = blocked
        if entry.state is not TaskState.PENDING or verdicts.verdict(entry.shape) is not None:
            self.held = None  # placed after all (a later stage), or no node could ever hold it
            return
        if entry.gang and not workload.gangs.running(workload).get(entry.id):
            self._hold_for_gang(tenant, entry, workload, registry, now, hold)
            return
        most = entry.constraints.max_per_node
        # Nodes where its job runs its most: room kept there could not take it.
        full = () if most is None else [row for row, running in
                                        workload.job_rows(registry.row).get((tenant, entry.job), {}).items()
                                        if running >= most]
        held = self.held
        if (held is not None and held.tenant == tenant and held.shape == entry.shape and registry.storage_alive[held.node]
                and all(have >= want - EPSILON  # (plain floats: numpy costs more on two or three)
                        for have, want in zip(registry.storage_capacity[held.node].tolist(), entry.demand.tolist()))
                and held.node not in full):
            task_id = entry.task_id()
            if task_id != held.task:
                self.held = Reservation(held.node, tenant, entry.shape, task_id)
            return  # the same wait: the same node (it could hold the shape when reserved)
        capacity, used = registry.capacity, registry.used
        usable = registry.alive
        if not entry.constraints.empty or full:
            usable = usable.copy()
            if not entry.constraints.empty:
                usable &= allowed(entry.constraints, registry, range(len(registry.nodes)))
            for row in full:
                usable[row] = False
        if native.enabled():  # the same choice, compiled (``native.least_lacking_node``; a total not > 0 counts as 1 there too)
            node = native.module.least_lacking_node(usable, capacity, used, entry.demand, total, EPSILON)
        else:
            total = np.where(total > 0, total, 1.0)
            rows = np.flatnonzero(usable & (capacity >= entry.demand - EPSILON).all(axis=1))
            lacking = (np.maximum(entry.demand - (capacity[rows] - used[rows]), 0.0) / total).sum(axis=1)
            node = int(rows[int(np.argmin(lacking))]) if len(rows) else None  # argmin: the first, the lowest row on ties
        if node is None:
            self.held = None
            return
        self.held = Reservation(node, tenant, entry.shape, entry.task_id())

    def _hold_for_gang(self, tenant: str, entry: Task, workload: Workload, registry: Nodes, now: float,
                       hold: float) -> None:
        """Hold nodes for gang ``entry`` (first in line): the same as before while they can hold
        it and its hold lasts; else the live nodes it may use with the most room for its tasks
        now (then the most when idle, then the lowest number), as many as together hold the
        whole gang when idle, kept for it until ``now + hold``. When the hold runs out it ends,
        and the gang holds nothing for as long again (``lapsed``): its room goes to others in
        their turn, and two gangs never keep each other waiting for good (Kubernetes gives a pod
        group a time to be scheduled in, YuniKorn a placeholder timeout)."""
        if entry.id in self.lapsed:
            self.held = None
            return
        held = self.held
        if held is not None and held.for_gang and held.tenant == tenant and held.shape == entry.shape:
            if now >= held.until - EPSILON:
                self.held = None
                self.lapsed[entry.id] = event_time(now + hold)
                return
            if all(registry.storage_alive[row] for row in held.rows):
                return  # the same wait, the same nodes
        size = min(entry.gang, entry.count)
        usable = registry.alive & (registry.capacity >= entry.demand - EPSILON).all(axis=1)
        if not entry.constraints.empty:
            usable = usable & allowed(entry.constraints, registry, range(len(registry.nodes)))
        asked = entry.demand > EPSILON
        rows = np.flatnonzero(usable)
        if not asked.any() or not len(rows):
            self.held = None
            return
        idle = tasks_fitting(registry.capacity[rows], entry.demand)
        fit_now = tasks_fitting(registry.capacity[rows] - registry.used[rows], entry.demand)
        most = entry.constraints.max_per_node
        if most is not None:
            idle, fit_now = np.minimum(idle, most), np.minimum(fit_now, most)
        order = np.lexsort((rows, -idle, -fit_now))  # most room now first, then most when idle, lowest row
        chosen, total = [], 0
        for k in order.tolist():
            chosen.append(int(rows[k]))
            total += int(idle[k])
            if total >= size:
                until = event_time(now + hold)
                self.held = Reservation(chosen[0], tenant, entry.shape, entry.task_id(), tuple(chosen[1:]), until,
                                        now)
                return
        self.held = None  # (never whole on these nodes: its verdict says so)

    @staticmethod
    def moved(before: Reservation | None, after: Reservation | None, backfill: bool,
              until_before: float | None, until_after) -> bool:
        """Whether a pass that began with reservation ``before`` and ended with ``after`` opened
        the room of ``before``'s node to other shapes: it ended or moved, or (``backfill``) its
        task or when that can start changed (``until_before``: the pass's ``backfill_until``;
        ``until_after()`` works out the new one), so what may backfill is known only now."""
        if before is None:
            return False
        return (after is None or (after.rows, after.tenant, after.shape) != (before.rows, before.tenant, before.shape)
                or (backfill and (after.task != before.task or until_after() != until_before)))


def _holds(free: dict[int, np.ndarray], demand: np.ndarray, size: int) -> bool:
    """Whether the free room ``free`` (per node row) holds ``size`` tasks of ``demand`` (one
    task: on one node; a gang's: together)."""
    need = demand - EPSILON
    if size == 1:
        return any(bool((room >= need).all()) for room in free.values())
    asked = demand > EPSILON
    if not asked.any():
        return True
    return sum(int(tasks_fitting(room, demand)) for room in free.values()) >= size


__all__ = ["Reservations"]
