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
from fairstream.core.model import EPSILON, Task, TaskState, event_time
from fairstream.core.nodes import Nodes
from fairstream.core.snapshot import Reservation
from fairstream.core.verdicts import Verdicts, allowed
from fairstream.core.workload import Workload


class Reservations:
    """The reservation held (``held``), and with backfill the reserved task's start as last
    worked out (made again when the reservation or the tasks on its node change)."""

    def __init__(self) -> None:
        self.held: Reservation | None = None
        self._backfill: tuple[Reservation, float | None] | None = None  # (not stored in snapshots)

    def clear(self) -> None:
        self.held = None

    def node_changed(self, row: int) -> None:
        """A task started or stopped on node ``row``: the reserved task's start there is made
        again."""
        if self._backfill is not None and self._backfill[0].node == row:
            self._backfill = None

    def node_lost(self, row: int) -> None:
        if self.held is not None and self.held.node == row:
            self.held = None

    def backfill_until(self, now: float | None, workload: Workload, registry: Nodes) -> float | None:
        """The time the reserved task can start on its node by the estimates of the tasks
        running there (the earliest expected end after which enough of them have ended for it
        to fit; ``now`` if it fits now). Other tasks may take room there if they are expected
        to end by then (Slurm's backfill: they do not delay it). None: no reservation, or a
        task it must wait for has no estimate."""
        held = self.held
        if held is None:
            return None
        row = held.node
        need = workload.shape_demands[held.shape] - EPSILON
        free = registry.capacity[row] - registry.used[row]
        if (free >= need).all():
            return now  # it fits now: nothing else goes first
        at = now if now is not None else 0.0
        cached = self._backfill
        if cached is not None and cached[0] == held:
            return None if cached[1] is None else max(cached[1], at)  # (a task past its estimate ends now at the earliest)
        node_id = registry.nodes[row].id
        ends = sorted((math.inf if task.estimate is None else event_time(cast(float, task.start) + task.estimate), task.seq, task)
                      for task in workload.tasks.values() if task.state is TaskState.RUNNING and task.node == node_id)
        until = None
        for end, _, task in ends:
            if end == math.inf:
                break  # it must wait for a task of unknown end: its start is unknown
            free = free + task.demand
            if (free >= need).all():
                until = end
                break
        self._backfill = (held, until)
        return None if until is None else max(until, at)

    def reserve(self, blocked: tuple[str, Task] | None, workload: Workload, registry: Nodes, verdicts: Verdicts,
                total: np.ndarray) -> None:
        """After a pass: reserve a node for ``blocked``, the first entry the pass tried that
        fitted no node's free room (None: no reservation). The node kept if the same tenant's
        same shape held one that can still hold it; else the live node it may use that lacks
        least (summed over resources, as shares of the cluster's ``total`` capacity), the
        lowest number on ties."""
        if blocked is None:
            self.held = None
            return
        tenant, entry = blocked
        if entry.state is not TaskState.PENDING or verdicts.verdict(entry.shape) is not None:
            self.held = None  # placed after all (a later stage), or no node could ever hold it
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

    @staticmethod
    def moved(before: Reservation | None, after: Reservation | None, backfill: bool,
              until_before: float | None, until_after) -> bool:
        """Whether a pass that began with reservation ``before`` and ended with ``after`` opened
        the room of ``before``'s node to other shapes: it ended or moved, or (``backfill``) its
        task or when that can start changed (``until_before``: the pass's ``backfill_until``;
        ``until_after()`` works out the new one), so what may backfill is known only now."""
        if before is None:
            return False
        return (after is None or (after.node, after.tenant, after.shape) != (before.node, before.tenant, before.shape)
                or (backfill and (after.task != before.task or until_after() != until_before)))


__all__ = ["Reservations"]
