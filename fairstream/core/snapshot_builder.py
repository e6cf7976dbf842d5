"""Making each pass's ``Snapshot`` (``core/snapshot.py``) from an engine's parts: the engine's
``SnapshotBuilder``, which reads what ``EngineView`` names and nothing else.
"""

from __future__ import annotations

import math
from dataclasses import MISSING, fields
from types import MappingProxyType
from typing import Protocol

import numpy as np

from fairstream.core.accounting import Accounting
from fairstream.core.jobs import Jobs
from fairstream.core.model import ResourceSpace
from fairstream.core.nodes import Nodes
from fairstream.core.preemption import PreemptionRule, RunningTask, starved_past_timeout
from fairstream.core.snapshot import EMPTY_MAPPING, JobRows, NodeAllocation, Reservation, Snapshot
from fairstream.core.starvation import Starvation
from fairstream.core.tenants import TenantTree
from fairstream.core.workload import Workload


class EngineView(Protocol):
    """What a pass's snapshot is made from (``Engine`` is one): the clock, the parts, the
    preemption rule and starvation watch, the node reservation, and three values worked out on
    ask (when the reserved task can start, the running tasks, the waiting demand)."""

    time: float | None
    resources: ResourceSpace
    tree: TenantTree
    accounting: Accounting
    registry: Nodes
    workload: Workload
    jobs: Jobs
    preemption: PreemptionRule | None
    starvation: Starvation | None

    @property
    def reservation(self) -> Reservation | None: ...

    @property
    def reserving(self) -> bool: ...

    def backfill_until(self) -> float | None: ...

    def running_tasks(self) -> tuple[RunningTask, ...]: ...

    def waiting_demand(self) -> np.ndarray: ...


class SnapshotBuilder:
    """The engine's part that makes each pass's ``Snapshot`` from the engine's parts. It keeps
    the tenant names, rows and arrivals between passes (made again only when a tenant joins or
    first arrives); what only some policies read is made on first read (``Later``) from the
    state as it is when read, so the engine ``expire``s a snapshot before it changes that state."""

    def __init__(self, node_allocation: bool) -> None:
        """``node_allocation``: the policy reads each node's running tasks (``Traits.node_allocation``)."""
        self.node_allocation = node_allocation
        self._tenants: tuple | None = None  # ((tenants, first arrivals), names, rows, arrival array)

    def build(self, engine: EngineView, **pass_fields) -> Snapshot:
        """The snapshot of ``engine`` now; ``pass_fields``: what the engine knows of this pass
        only (``candidates``, ``grown_rows``, ...).

        The object ``Snapshot(...)`` makes of these fields (a test holds them field for
        field), made without the frozen dataclass's ``__init__``, which sets its 35 fields one
        call each, and without its generic steps: the fields in one dict display, the arrays
        made here locked as they are made, the fields made on first read handed over as the
        functions that make them, not ``Later``s to look for (a pass of ``drf`` made its
        snapshot in about 10 µs, most of it those steps)."""
        acc = engine.accounting
        now = engine.time if engine.time is not None else 0.0
        registry = engine.registry
        node_capacity = registry.capacity
        free = node_capacity - registry.used
        if registry.lost:
            free[~registry.alive] = -1.0
        n = len(acc.ledgers)
        if self._tenants is None or self._tenants[0] != (n, acc.arrivals):
            self._tenants = ((n, acc.arrivals), [ledger.name for ledger in acc.ledgers], dict(acc.row),
                             np.array([math.inf if ledger.first_arrival is None else ledger.first_arrival for ledger in acc.ledgers]))
            self._tenants[3].flags.writeable = False
        _, names, rows, arrival = self._tenants
        node_ids, node_labels = registry.view()
        workload, starvation, tree = engine.workload, engine.starvation, engine.tree
        starved_since, running_tasks = EMPTY_MAPPING, None
        if starvation is not None and starvation.since:
            starved_since = MappingProxyType(dict(starvation.since))
            if starved_past_timeout(starvation.since, now, starvation.rule):
                running_tasks = engine.running_tasks()
        node_row = registry.row
        capacity, fractions, allocation, share = (acc.capacity.copy(), acc.fractions.copy(), acc.allocation.copy(),
                                                  acc.share.copy())
        pending_demand = engine.waiting_demand() if engine.preemption is not None else None  # the fair share's
        for array in (free, capacity, fractions, allocation, share, node_capacity):
            array.setflags(write=False)  # (``node_capacity``: a fresh view; the storage stays writable)
        if pending_demand is not None:
            pending_demand.setflags(write=False)
        for name in ("grown_rows", "grown_demands"):
            if pass_fields.get(name) is not None:
                pass_fields[name].setflags(write=False)
        values = {
            **_BUILT_DEFAULTS,
            "time": now,
            "resources": engine.resources,
            "node_ids": node_ids,
            "node_labels": node_labels,
            "free": free,
            "capacity": capacity,
            "tree": tree,
            "tenants": names,
            "rows": rows,
            "share_fraction": fractions,
            "allocation": allocation,
            "share": share,
            "arrival": arrival,
            "pending": workload.waiting(),
            "accounting": acc.config,
            "node_capacity": node_capacity,
            "node_allocation": (NodeAllocation(lambda row: workload.running_on(node_row).get(row, {}).values())
                                if self.node_allocation else None),
            "job_rows": JobRows(lambda: workload.job_rows(node_row)),
            "starved_since": starved_since,
            "running_tasks": running_tasks,
            "running_jobs": engine.jobs.running if tree.has_limits else EMPTY_MAPPING,
            "job_usage": engine.jobs.usage if tree.orders_jobs else EMPTY_MAPPING,
            "pending_demand": pending_demand,
            "reservation": engine.reservation,
            "reserving": engine.reserving,
            "backfill_until": engine.backfill_until(),
            "gangs_waiting": workload.gangs.waiting > 0,
            "gangs_running": workload.gangs.running(workload) or EMPTY_MAPPING,
            **pass_fields,
            # What most policies never read, made on first read (``Snapshot.__getattr__``).
            "_later": {
                "accumulated": lambda: acc.accumulated_rows(None, now),
                "pseudo_accumulated": lambda: acc.pseudo_rows(None, now),
                "quantum": lambda: acc.quanta_by_row().copy(),
                "waiting_since": lambda: np.array([math.nan if ledger.waiting_since is None else ledger.waiting_since
                                                   for ledger in acc.ledgers]),
                "running": lambda: np.array([ledger.running for ledger in acc.ledgers], dtype=float),
            },
        }
        snapshot = object.__new__(Snapshot)
        snapshot.__dict__.update(values)
        return snapshot


# The builder's defaults, as ``__init__`` gives them (a factory's value is a shared read-only
# mapping), less those of the fields it gives as made on first read (``running`` has one): they must
# not be in the snapshot's dict.
_BUILT_DEFAULTS = {f.name: f.default if f.default is not MISSING else f.default_factory()  # type: ignore[misc]
                   for f in fields(Snapshot) if (f.default is not MISSING or f.default_factory is not MISSING)
                   and f.name not in ("accumulated", "pseudo_accumulated", "quantum", "waiting_since", "running")}
