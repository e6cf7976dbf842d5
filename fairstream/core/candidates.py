"""The engine's part that says which tenants a pass of a tenant-local policy need consider.

A tenant-local policy (``Traits.tenant_local`` of its ``PolicySpec``: ``drf``, ``fair``, ``ltrf``, ``fifo``)
places a tenant's task by the tenant's own key and the nodes' room, so a tenant whose shapes
fitted no node when the last pass ended, and had no event since, cannot place anything unless
some node gained room. ``Changes`` records what changed since the last pass (node rows that
gained room, tenants with an event of their own, shapes queued) and turns it into the pass's
``Snapshot.candidates`` with ``grown_rows``, ``fresh_shapes`` and ``grown_demands``
(docs/architecture.md, "Placement"). A property test requires the decisions to equal those of
passes over every tenant (tests/core/test_properties.py).
"""

from __future__ import annotations

import numpy as np

from fairstream.core import native
from fairstream.core.model import EPSILON
from fairstream.core.nodes import Nodes
from fairstream.core.snapshot import Reservation
from fairstream.core.workload import Workload


class Changes:
    """What changed since the last pass: ``grown`` (node rows that gained free room),
    ``touched`` (tenants with an event of their own), ``fresh`` (shapes queued), and whether a
    pass ran since the start (``passed``; before it, everything is new)."""

    def __init__(self) -> None:
        self.grown: set[int] = set()
        self.touched: set[str] = set()
        self.passed = False
        self.fresh: set[int] = set()

    def pass_fields(self, workload: Workload, registry: Nodes, reservation: Reservation | None,
                    every_tenant: bool) -> dict:
        """The snapshot fields of the next pass, which starts a new record of changes: none (a
        pass over every tenant) for the first pass, after ``forget``, or when ``every_tenant``
        (a tree with limits: a tenant's room depends on others' use)."""
        fields = {}
        if self.passed and not every_tenant:
            alive = registry.storage_alive  # (the storage: not a view made per row)
            if reservation is not None:
                # Its room was kept from the tenants behind the holder when the last pass ended;
                # one ahead of the holder now (its key fell: its tasks ended) may take it, though
                # no room grew there (``placement.serve_in_order``). Found by the property test.
                self.grown.update(reservation.rows)
            grown = np.array(sorted(row for row in self.grown if alive[row]), dtype=np.int64)
            candidates, grown_demands = self.candidates(grown, workload, registry, reservation)
            fields = dict(candidates=candidates, grown_rows=grown, fresh_shapes=frozenset(self.fresh),
                          grown_demands=grown_demands)
        self.grown.clear()
        self.touched.clear()
        self.fresh.clear()
        self.passed = True
        return fields

    def forget(self) -> None:
        """The next pass goes over every tenant (placements were taken back: their room may be
        more than the starved task took, on nodes that did not gain room as far as the
        candidates know)."""
        self.passed = False

    def candidates(self, rows: np.ndarray, workload: Workload, registry: Nodes,
                   reservation: Reservation | None) -> tuple[frozenset[str], np.ndarray]:
        """The demanding tenants that may place anything now (``Snapshot.candidates``): those
        with an event since the last pass, and those with a task shape that fits the free room
        of a node of ``rows`` (the live rows that gained some since; constraints aside: a
        superset). Every other tenant's shapes fitted no node when the last pass ended, and no
        node has more room now. Also the demands of the queued shapes that fit such a node's
        room (``Snapshot.grown_demands``)."""
        out = set(self.touched)
        held = reservation
        if held is not None and held.tenant in workload.pending and workload.pending[held.tenant].count:
            out.add(held.tenant)  # its room may have grown on the reserved node
        holders = workload.holders()
        shape_demands = workload.shape_demands
        if not len(rows) or not holders:
            return frozenset(out), shape_demands[:0]
        capacity, used = registry.capacity, registry.used
        if native.enabled():  # the same scan, compiled (``native.shapes_that_fit``), the demands too
            room, demands = native.module.shapes_that_fit(holders, shape_demands, capacity, used, rows, EPSILON)
        else:
            shapes = np.fromiter(holders, dtype=np.int64, count=len(holders))  # the shapes that wait
            demands = shape_demands[shapes]
            free = capacity[rows] - used[rows] + EPSILON  # (live rows only)
            fits = (demands[:, None, :] <= free[None, :, :]).all(axis=2).any(axis=1)
            room, demands = shapes[fits].tolist(), demands[fits]
        for shape in room:
            out |= holders[shape]
        return frozenset(out), demands


__all__ = ["Changes"]
