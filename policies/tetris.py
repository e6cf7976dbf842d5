"""``tetris``: packing with a fairness knob f, as the QKnobler paper describes Tetris (Tang, Yu
and Li, section 4, "Flaws of existing fairness-efficiency schedulers"; Grandl et al., SIGCOMM'14).

Repeatedly, until nothing pending fits:

1. sort all pending tasks by DRF: tenants by weighted dominant share (then arrival, then id),
   each tenant's tasks in arrival order;
2. keep the first ``ceil((1 - f) * total)`` of them (at least one): f = 0 looks at every task
   (pure packing), f -> 1 only at the head of the DRF order;
3. place the task and node with the largest alignment score (``placement.alignment_scores``: the
   dot product of the node's idle resources and the task's demand, both in units of cluster
   capacity) among the kept tasks that fit somewhere.

If none of the kept tasks fits anywhere, the window widens to every pending task, so a pass is
work-conserving like every other policy here (the paper is silent on this case).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from fairstream.core import gangs
from fairstream.core.fairness import dominant_share, fair_key
from fairstream.core.model import EPSILON, Decision, ReasonCode, Task
from fairstream.core.placement import Cycle, alignment_scores, leaf_arrival
from fairstream.core.snapshot import Snapshot
from fairstream.policies.base import Ordering, Param, PolicySpec, parse_fraction

PARAMS = (
    Param("f", 0.2, parse_fraction, "fairness knob: the best-aligned task is chosen among the first (1 - f) "
                               "share of the DRF-sorted pending tasks"),
)


def decide(snapshot: Snapshot, params: Mapping[str, Any]) -> list[Decision]:
    f = params["f"]
    cycle = Cycle(snapshot, "tetris")
    drf = DrfOrder(cycle, snapshot.demanding())
    best_nodes = BestNodes()  # (``best_pair``'s, kept for the pass)
    gangs_wait = snapshot.gangs_waiting  # (none waiting: no candidate is of a gang that must start whole)
    while True:
        order, left, total = drf.order, drf.left, drf.total
        if total == 0:
            break
        window = max(1, math.ceil((1 - f) * total - 1e-9))
        candidates = candidates_in_window(cycle, order, left, window)
        if gangs_wait and any(gangs.waits(cycle, task) for _, task in candidates):
            # A gang starts whole or not at all, first in DRF order: not by alignment task by task.
            for tenant in gangs.start_gangs(cycle, candidates, f"tetris: a gang among the first {window} of {total} "
                                                         f"DRF-sorted tasks (f={f:g})", ReasonCode.PACKING):
                drf.placed(tenant)
            best_nodes.clear()
            continue
        choice = best_pair(cycle, candidates, best_nodes)
        if choice is None and window < total:
            wider = candidates_in_window(cycle, order, left, total)
            if gangs_wait and any(gangs.waits(cycle, task) for _, task in wider):
                for tenant in gangs.start_gangs(cycle, wider, f"tetris: a gang among the {total} DRF-sorted tasks",
                                          ReasonCode.PACKING):
                    drf.placed(tenant)
                best_nodes.clear()
                continue
            choice = best_pair(cycle, wider, best_nodes)
        if choice is None:
            break
        tenant, task, node, score = choice
        cycle.commit(tenant, task, node, f"tetris: best alignment {score:.4g} among the first {window} "
                                         f"of {total} DRF-sorted tasks (f={f:g})", ReasonCode.PACKING)
        best_nodes.placed_on(node)
        drf.placed(tenant)
    return cycle.decisions


class DrfOrder:
    """The demanding tenants of a pass in DRF order (weighted dominant share, then arrival, then
    id: no two tie), with how many of its tasks each has left to place (``left``) and their sum
    (``total``), kept through the pass's placements."""

    def __init__(self, cycle: Cycle, tenants: list[str]) -> None:
        self.cycle, self.tenants = cycle, tenants
        self.sort_all()

    def sort_all(self) -> None:
        """Every tenant's key and what it has left, made again."""
        self.keys = {t: self.key(t) for t in self.tenants}
        self.order = sorted(self.tenants, key=self.keys.__getitem__)
        self.left = {t: self.cycle.queues.pending_left(t) for t in self.order}
        self.total = sum(self.left.values())

    def key(self, tenant: str):
        cycle, snapshot = self.cycle, self.cycle.snapshot
        row = snapshot.rows[tenant]
        return fair_key(dominant_share(cycle.allocation[row], snapshot.capacity) / snapshot.share_fraction[row],
                        leaf_arrival(snapshot, tenant), tenant, cycle.below_min_share(tenant))

    def placed(self, tenant: str) -> None:
        """The pass placed a task of ``tenant``: only its key and what it has left moved, unless
        min shares are in play (a placement moves its queues' allocation, so its siblings' keys)."""
        if self.cycle.capped:
            self.sort_all()
            return
        self.order.remove(tenant)
        self.keys[tenant] = self.key(tenant)
        bisect.insort(self.order, tenant, key=self.keys.__getitem__)
        self.total -= self.left[tenant]
        self.left[tenant] = self.cycle.queues.pending_left(tenant)
        self.total += self.left[tenant]


def candidates_in_window(cycle: Cycle, order: list[str], left: dict[str, int], window: int) -> list[tuple[str, Task]]:
    """One task per (tenant, shape): the next of that shape, if it is among the first ``window``
    tasks of the DRF-sorted list."""
    out: list[tuple[str, Task]] = []
    before = 0  # tasks of the tenants ahead in the DRF order
    for tenant in order:
        if before >= window:
            break
        if before + left[tenant] <= window:
            out.extend((tenant, task) for task in cycle.queues.shape_heads(tenant))
        else:  # (the tenant the window's end falls in)
            out.extend((tenant, task) for task in cycle.queues.heads_within(tenant, window - before))
        before += left[tenant]
    return out


class BestNodes:
    """Per task shape without constraints, its best node and score as a pass found them
    (``found``), until that node takes a placement (``placed_on``); then the score it had, which
    its best can no longer exceed (``bound``: within a pass free room only shrinks, and with it
    every score)."""

    def __init__(self) -> None:
        self.found: dict[int, tuple[int, float]] = {}
        self.bound: dict[int, float] = {}

    def placed_on(self, node: int) -> None:
        for shape in [shape for shape, (best, _) in self.found.items() if best == node]:
            self.bound[shape] = self.found.pop(shape)[1]  # its best node lost room: scored again when it could win

    def clear(self) -> None:
        self.found.clear()
        self.bound.clear()


def best_pair(cycle: Cycle, candidates: list[tuple[str, Task]], best_nodes: BestNodes | None = None):
    """The (tenant, task, node, score) with the largest alignment among candidates that fit a
    node their constraints and caps allow; candidates that fit nowhere are dropped for the pass.

    ``best_nodes``: per task shape without constraints, its best node and score, as this pass
    found them (filled here; the caller says which node took a placement). A placement changes
    one node's free room, and only lowers its score and its fit, so every other shape's best
    node stays the first of the highest score: the scan of every node is made once per shape
    and best node, not once per candidate and placement. A shape whose best node took a
    placement is scored again only when its old score could beat the best candidate found so
    far (on an idle cluster every shape's best node is the same, and scoring every candidate
    again after each placement cost most of a pass, issue 64); the decision is the same, and a
    candidate that fits nowhere may then stay in the list for longer, at no effect."""
    best = None
    capacity = cycle.snapshot.capacity
    capped = cycle.capped  # (uncapped: every candidate is within its caps)
    lazy = best_nodes is not None and not cycle.snapshot.gangs_waiting  # (a gang's shape may be another's: see below)
    found_for = best_nodes.found if best_nodes is not None else {}
    bound_for = best_nodes.bound if best_nodes is not None else {}
    for tenant, task in candidates:
        if capped and not cycle.within_caps(tenant, task):
            cycle.skip_for(tenant, task)
            continue
        kept = best_nodes is not None and task.constraints.empty  # (a job's max_per_node moves with its placements)
        found = found_for.get(task.shape) if kept else None
        if found is None and lazy and kept and best is not None:
            bound = bound_for.get(task.shape)
            if bound is not None and bound <= best[3] + 1e-12:
                # Its score can only have fallen, so it cannot beat ``best`` (nor any later
                # best): no need to score it now. (Not with gangs waiting: the skip below, when
                # it fits nowhere, also keeps a waiting gang of its shape out of the window.)
                continue
        if found is None:
            if kept:  # (every node's score, kept for the pass: only nodes that changed are scored again)
                scores = cycle.nodes.aligned_scores(task)
                node = int(np.argmax(scores))
                if scores[node] == -np.inf:
                    cycle.skip_for(tenant, task)  # free capacity only shrinks within a pass
                    continue
            else:
                fits = (cycle.free >= task.demand - EPSILON).all(axis=1)
                if not task.constraints.empty:
                    fits &= cycle.nodes.eligible(task.constraints) & cycle.nodes.below_job_limit(tenant, task)
                if not fits.any():
                    cycle.skip_for(tenant, task)  # free room (and room under a max_per_node) only shrinks in a pass
                    continue
                scores = alignment_scores(cycle.free, task.demand, capacity)
                scores[~fits] = -np.inf
                node = int(np.argmax(scores))
            found = (node, float(scores[node]))
            if kept:
                found_for[task.shape] = found
                bound_for.pop(task.shape, None)
        # Larger score wins; ties keep the earlier candidate (DRF order, then arrival).
        if best is None or found[1] > best[3] + 1e-12:
            best = (tenant, task, *found)
    return best


SPEC = PolicySpec("tetris", decide, "best-aligned task among the first (1 - f) of the DRF-sorted tasks", PARAMS,
                  ordering=Ordering(efficiency="tetris gives freed room to the best-aligned task among the first "
                                               "(1 - f) of the tasks in DRF order"))

__all__ = ["SPEC", "decide"]
