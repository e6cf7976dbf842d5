"""Which node a task may take in one pass: first fit over the nodes with room, constraints,
a job's ``max_per_node``, and the node reserved for the first task in line.

Free room only shrinks within a pass (until a placement is withdrawn or a task evicted), so a
node that cannot take a task shape now cannot take it later in the pass: the first time a
shape is placed, one vectorised scan lists the nodes it fits on, and the pass walks that list
forward, dropping nodes that have filled up (``NodeFit.find_node``). With ``affinity`` (QKnobler
C3, Tetris) the best-aligned node goes first instead (``alignment_scores``).
"""

from __future__ import annotations

from typing import cast

import numpy as np

from fairstream.core.model import EPSILON, Constraints, Task, event_time
from fairstream.core.snapshot import Reservation, Snapshot


class NodeFit:
    """The nodes a pass may place on. ``free`` is the pass's free room (node x resource, its
    own array, changed by the pass); ``placed`` its placements so far (``Cycle.placed``);
    ``node_order``: first fit walks nodes in this order if a policy sets it (TSF: least
    contended first)."""

    def __init__(self, snapshot: Snapshot, free: np.ndarray, placed: list, affinity: bool) -> None:
        self.snapshot = snapshot
        self.free = free
        self.placed = placed
        self.affinity = affinity
        self.node_order: np.ndarray | None = None
        # The node reserved for one waiting task (``Snapshot.reservation``): no other shape goes there
        # (None while the pass serves tenants ahead of its holder: ``suspend_reservation``).
        self.reservation = snapshot.reservation
        self._suspended: Reservation | None = None
        # Rows of ``free`` as plain floats, made on first use: checking one node is then a few
        # float compares instead of numpy calls on a 2-element array.
        self.free_rows: dict[int, list[float]] = {}
        # Per shape: [the nodes it fitted when first tried, in first-fit order; how far the pass
        # walked them; its demand less EPSILON as floats].
        self.first_fit: dict[int, list] = {}
        self._masks: dict[Constraints, np.ndarray] = {}
        # Per (tenant, job) of a task with a ``max_per_node``: its running tasks per node row,
        # this pass's placements included (``job_rows``).
        self._job_rows_: dict[tuple[str, str], dict[int, int]] = {}
        # Per shape of a task without constraints: [every node's alignment score, -inf where it
        # does not fit or may not go; how many of ``_changed`` it reflects] (``aligned_scores``).
        self._aligned: dict[int, list] = {}
        self._changed: list[int] = []  # the nodes whose free room the pass changed, in turn

    def took(self, node: int, tenant: str, job: str) -> None:
        """The pass placed a task of ``tenant``'s ``job`` on ``node`` (``free`` already less)."""
        self.free_rows[node] = self.free[node].tolist()
        if self._job_rows_:
            self.count_on(tenant, job, node, 1)
        if self._aligned:
            self._changed.append(node)

    def gave_back(self, node: int, tenant: str, job: str) -> None:
        """A task of ``tenant``'s ``job`` left ``node`` in this pass (``free`` already more):
        the first-fit lists, made with less room, are made again."""
        self.free_rows[node] = self.free[node].tolist()
        if self._job_rows_:
            self.count_on(tenant, job, node, -1)
        self.first_fit.clear()
        if self._aligned:
            self._changed.append(node)

    def eligible(self, constraints: Constraints) -> np.ndarray:
        """Per node: do ``constraints`` allow it? (Made once per constraints in a pass.)"""
        mask = self._masks.get(constraints)
        if mask is None and constraints.nodes is None and not constraints.labels:
            mask = self._masks[constraints] = np.ones(len(self.snapshot.node_ids), dtype=bool)  # (every node: no walk)
        if mask is None:
            snap = self.snapshot
            mask = np.fromiter(
                (constraints.allows(nid, labels) for nid, labels in zip(snap.node_ids, snap.node_labels)),
                dtype=bool,
                count=len(snap.node_ids),
            )
            self._masks[constraints] = mask
        return mask

    def job_rows(self, tenant: str, job: str) -> dict[int, int]:
        """Node row -> how many tasks of ``tenant``'s ``job`` run there, this pass's placements
        included (made on first ask; counts only grow in a pass, but for a withdrawal)."""
        key = (tenant, job)
        rows = self._job_rows_.get(key)
        if rows is None:
            known = self.snapshot.job_rows
            rows = self._job_rows_[key] = dict(known.of(tenant, job)) if known is not None else {}
            for _, placed_tenant, entry, node in self.placed:
                if placed_tenant == tenant and entry.job == job:
                    rows[node] = rows.get(node, 0) + 1
        return rows

    def below_job_limit(self, tenant: str, task: Task) -> np.ndarray | bool:
        """The nodes where ``task``'s job runs fewer tasks than its ``max_per_node`` (True: it
        has none)."""
        most = task.constraints.max_per_node
        if most is None:
            return True
        mask = np.ones(len(self.free), dtype=bool)
        for row, running in self.job_rows(tenant, task.job).items():
            if running >= most:
                mask[row] = False
        return mask

    def count_on(self, tenant: str, job: str, node: int, change: int) -> None:
        """One task of ``tenant``'s ``job`` more (``change`` 1) or less (-1) on ``node``."""
        rows = self._job_rows_.get((tenant, job))
        if rows is not None:  # (not asked yet: made with this pass's placements when asked)
            rows[node] = rows.get(node, 0) + change

    def suspend_reservation(self) -> None:
        """Let every task take the reserved node's room until ``resume_reservation``: the pass
        serves tenants ahead of the reservation's holder in line, whom it must not hold room
        against (a small task's reservation once kept a big task first in line off the room
        it waited for, and smaller tasks behind took it)."""
        if self.reservation is not None:
            self._suspended, self.reservation = self.reservation, None

    def resume_reservation(self) -> None:
        """Keep other shapes off the reserved node's room again (the pass reached its holder):
        what the pass cached while it was open (first-fit lists, alignment scores) loses the node."""
        held, self._suspended = self._suspended, None
        if held is None:
            return
        self.reservation = held
        for row in held.rows:
            for shape, entry in self.first_fit.items():
                if shape != held.shape and row in entry[0]:
                    at = entry[0].index(row)
                    del entry[0][at]
                    if at < entry[1]:
                        entry[1] -= 1
            for shape, entry in self._aligned.items():
                if shape != held.shape:
                    entry[0][row] = -np.inf

    def usable(self, task: Task) -> np.ndarray | bool:
        """The nodes ``task`` may take room on as far as a reservation goes: all but a node
        reserved for another shape (True: no reservation stands in its way)."""
        reserved = self.reservation
        if reserved is None or reserved.shape == task.shape:
            return True
        mask = np.ones(len(self.free), dtype=bool)
        mask[list(reserved.rows)] = False
        return mask

    def find_node(self, task: Task) -> int | None:
        """First fit: the lowest-numbered node with room that the task may use, or None
        (with ``affinity``: the best-aligned such node, lowest number on ties)."""
        if self.affinity:
            return self.best_aligned_node(task)
        entry = self.first_fit.get(task.shape)
        if entry is None:
            if not len(self.free):
                return None
            need = task.demand - EPSILON
            grown = self.snapshot.grown_rows
            if grown is not None and task.shape not in self.snapshot.fresh_shapes and not task.gang:
                # It fitted no node when the last pass ended: only those that gained room may
                # take it now (``Snapshot.grown_rows``); first fit over them is first fit. (Not
                # a gang's: it may have waited for room for all of it, one fitting anywhere.)
                fits = (self.free[grown] >= need).all(axis=1)
                if not task.constraints.empty:
                    fits &= self.eligible(task.constraints)[grown]
                nodes = grown[fits]
            else:
                fits = (self.free >= need).all(axis=1)
                if not task.constraints.empty:
                    fits &= self.eligible(task.constraints)
                nodes = np.flatnonzero(fits)
            reserved = self.reservation
            if reserved is not None and reserved.shape != task.shape:
                nodes = nodes[nodes != reserved.node] if not reserved.more else nodes[~np.isin(nodes, reserved.rows)]
            if self.node_order is not None:
                rank = np.empty(len(self.node_order), dtype=np.int64)
                rank[self.node_order] = np.arange(len(self.node_order))
                nodes = nodes[np.argsort(rank[nodes], kind="stable")]
            entry = self.first_fit[task.shape] = [nodes.tolist(), 0, need.tolist()]
        candidates, i, need = entry
        rows = self.free_rows
        most = task.constraints.max_per_node
        # With a max_per_node, its job's tasks on a node only grow in a pass: a node where the job
        # runs its most is passed over for good, as one without room.
        running = self.job_rows(task.tenant, task.job) if most is not None else None
        most_here = most if most is not None else 0  # (read only with ``running``)
        while i < len(candidates):
            node = candidates[i]
            row = rows.get(node)
            if row is None:
                row = rows[node] = self.free[node].tolist()
            if all(have >= want for have, want in zip(row, need)) and (running is None or running.get(node, 0) < most_here):
                entry[1] = i
                return node
            i += 1
        entry[1] = i
        return None

    def best_aligned_node(self, task: Task) -> int | None:
        """The node whose idle resources align best with ``task`` (``alignment_scores``) among
        those it fits and may use, the lowest number on ties; None if none."""
        if not len(self.free):
            return None
        if task.constraints.empty:
            scores = self.aligned_scores(task)
            node = int(np.argmax(scores))  # the first maximum: the lowest node number
            return None if scores[node] == -np.inf else node
        # With constraints (its job's max_per_node moves with the pass's placements): a scan each time.
        fits = (self.free >= task.demand - EPSILON).all(axis=1) & self.usable(task)
        fits &= self.eligible(task.constraints) & self.below_job_limit(task.tenant, task)
        if not fits.any():
            return None
        scores = alignment_scores(self.free, task.demand, self.snapshot.capacity)
        scores[~fits] = -np.inf
        return int(np.argmax(scores))  # argmax takes the first maximum: the lowest node number

    def aligned_scores(self, task: Task) -> np.ndarray:
        """Every node's alignment score with ``task``, a task without constraints
        (``alignment_scores``), -inf on the nodes whose free room it does not fit or that it
        may not use (``usable``): the pass's own array, to read, not to change.

        Made for its shape in one scan when first asked in the pass, then kept: when asked
        again, only the nodes whose free room the pass changed since are scored again, each
        alone (``node_alignment``), which gives the bits of a scan."""
        entry = self._aligned.get(task.shape)
        changed = self._changed
        if entry is not None and len(changed) - entry[1] <= len(self.free) // 8:
            scores, seen, need, scale, weights = entry
            if seen < len(changed):
                usable, rows = self.usable(task), self.free_rows
                allowed = None if usable is True else cast(np.ndarray, usable)  # (None: every node)
                for node in set(changed[seen:]):
                    row = rows[node]  # (made again by ``took`` and ``gave_back``)
                    if all(have >= want for have, want in zip(row, need)) and (allowed is None or allowed[node]):
                        scores[node] = node_alignment(row, scale, weights)
                    else:
                        scores[node] = -np.inf
                entry[1] = len(changed)
            return scores
        # (also when most nodes changed since: one scan costs less than scoring them one by one)
        need = task.demand - EPSILON
        fits = (self.free >= need).all(axis=1) & self.usable(task)
        scores = alignment_scores(self.free, task.demand, self.snapshot.capacity)
        scores[~fits] = -np.inf
        scale, weights = alignment_factors(task.demand, self.snapshot.capacity)
        self._aligned[task.shape] = [scores, len(changed), need.tolist(), scale.tolist(), weights]
        return scores

    def held_by_job_limit(self, task: Task) -> bool:
        """``task`` would fit the free room of a node its constraints allow where its job
        already runs its ``max_per_node`` (reserved for another or not: the limit holds it first)."""
        return task.constraints.max_per_node is not None and bool(self.nodes_held_by_job_limit(task).any())

    def nodes_held_by_job_limit(self, task: Task) -> np.ndarray:
        """The nodes its constraints allow whose free room fits ``task`` but where its job runs its
        ``max_per_node`` (a task with one)."""
        fits = (self.free >= task.demand - EPSILON).all(axis=1) & self.eligible(task.constraints)
        return fits & ~self.below_job_limit(task.tenant, task)

    def job_may_use(self, task: Task, node: int) -> bool:
        """Its job runs fewer than ``task``'s ``max_per_node`` tasks on ``node`` (True: it has none)."""
        most = task.constraints.max_per_node
        return most is None or self.job_rows(task.tenant, task.job).get(node, 0) < most

    def kept_off_reserved_room(self, task: Task) -> bool:
        """``task`` would fit the free room of the node reserved for another shape, and may not
        backfill there."""
        return self.fits_reserved_room(task) and not self.ends_in_time(task)

    def backfill_node(self, task: Task) -> int | None:
        """With backfill (``Snapshot.backfill_until`` set): the node reserved for another shape,
        if ``task`` fits its free room and is expected to end by the time the reserved task
        can start there (its estimate from now), so it does not delay it; else None."""
        if self.reservation is not None and self.ends_in_time(task):
            return self.reserved_room_for(task)
        return None

    def ends_in_time(self, task: Task) -> bool:
        """With backfill: ``task`` is expected to end by the time the reserved task can start."""
        until = self.snapshot.backfill_until
        return (until is not None and task.estimate is not None
                and event_time(self.snapshot.time + task.estimate) <= until)

    def fits_reserved_room(self, task: Task) -> bool:
        """``task`` (another shape than the reserved one) fits the free room of a reserved node
        and may go there (its constraints, its job's max_per_node)."""
        return self.reserved_room_for(task) is not None

    def reserved_room_for(self, task: Task) -> int | None:
        """The first reserved node (a gang's hold may keep several) whose free room ``task``, of
        another shape than the reserved one, fits and may use; None if none."""
        held = self.reservation
        snap = self.snapshot
        if held is None or held.shape == task.shape:
            return None
        for row in held.rows:
            if (all(have >= want - EPSILON for have, want in zip(self.free[row].tolist(), task.demand_values))
                    and task.constraints.allows(snap.node_ids[row], snap.node_labels[row]) and self.job_may_use(task, row)):
                return row
        return None


def alignment_scores(free: np.ndarray, demand: np.ndarray, capacity: np.ndarray) -> np.ndarray:
    """Tetris's alignment score of one task against every node: the dot product of the node's
    idle resources and the task's demand, both in units of the cluster's total capacity so that
    no resource outweighs another by its unit (cores vs GB). QKnobler's affinity (C3) is the same
    product.

    The sum runs over resources in their order, one elementwise step each, never through a
    matrix product: BLAS sums in an order of its own, which differs between builds and CPUs
    (and between one row and the same row of a larger matrix), so decisions that compare
    scores would depend on the machine (principle 1) and one node's score could not be made
    again alone. Each node's score here is the same bits however many nodes are scored.
    ``free``: node x resource, or one node's row."""
    scale, weights = alignment_factors(demand, capacity)
    idle = np.maximum(free, 0.0) / scale
    scores = idle[..., 0] * weights[0]
    for k in range(1, len(weights)):
        scores = scores + idle[..., k] * weights[k]
    return scores


def alignment_factors(demand: np.ndarray, capacity: np.ndarray) -> tuple[np.ndarray, list[float]]:
    """What ``alignment_scores`` divides idle room by per resource (the cluster's capacity, 1
    where it has none) and weighs it by (the demand over that, as plain floats)."""
    scale = np.where(capacity > 0, capacity, 1.0)
    return scale, (demand / scale).tolist()


def node_alignment(free: list[float], scale: list[float], weights: list[float]) -> float:
    """One node's ``alignment_scores`` from its free room as plain floats (``alignment_factors``
    for the rest): the same IEEE operations in the same order, so the same bits. (Not
    Python's ``max(have, 0.0)``: it keeps -0.0 where numpy's ``maximum`` gives 0.0.)"""
    score = 0.0
    for k, (have, over, weight) in enumerate(zip(free, scale, weights)):
        term = ((have if have > 0.0 or have != have else 0.0) / over) * weight
        score = term if k == 0 else score + term
    return score


__all__ = ["NodeFit", "alignment_factors", "alignment_scores", "node_alignment"]
