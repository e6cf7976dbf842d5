"""``hltrf``: hierarchical LTRF with starvation timeout (Tang et al., IEEE TSC, 5.2, Algorithm 2).

Each allocation either
- goes to the *starved* leaf: the demanding leaf with the lowest weighted accumulated usage,
  if it has waited at least ``t_wait`` since its last allocation (or since it became demanding);
- or walks down the tree from the root, at each level taking the demanding child with the
  lowest weighted total usage (a queue's usage is the sum of its leaves'), the naive
  recursive approach of 5.2.1; a queue with an ``ordering`` of its own picks its child by it
  instead (``fifo``: the earliest waiting task below; ``fair``, ``drf``: the lowest current
  allocation per weight), as YARN's parent queues apply their ``schedulingPolicy``.

Beyond the paper: a leaf below its ``min_share`` (or below a queue's) is served before both,
the lowest usage / weight of such leaves first, as every other fair policy keeps the guarantee
(``FairKey``'s class; issue 59: a tenant guaranteed 0.6 held nothing for 210 s).

``t_wait=inf`` is the naive approach; ``t_wait=0`` allocates exactly as flat ``ltrf`` over the
leaves (Theorem 1). The paper's test is ``wait > T_wait``; we use ``>=`` so Theorem 1 holds in
discrete event time too (with ``>``, a leaf served at this instant has waited 0 and the
hierarchy would take over, see docs/paper-notes.md).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from fairstream.core.fairness import BELOW_MIN_SHARE, fair_key, normalised_usage, resource_share
from fairstream.core.model import ROOT, Decision, ReasonCode
from fairstream.core.placement import Cycle, TenantOrder
from fairstream.core.preemption import reclaim
from fairstream.core.queues import ordering_resource
from fairstream.core.snapshot import Snapshot
from fairstream.policies._common import (
    LONG_TERM_PARAMS,
    PREEMPTION_PARAMS,
    RESERVATION_PARAMS,
    LongTermUsage,
    long_term_accounting,
    preemption_rule,
)
from fairstream.policies.base import Needs, Ordering, Param, PolicySpec, Traits, parse_non_negative
from fairstream.policies.ltrf import usage_pass


class _TreeWalk:
    """The keys hltrf walks the tree by, on one pass's ``Cycle``: queue usage U(G) = the sum of
    its leaves' accumulated vectors and PARs, weight = their share fractions (``node_key``);
    a queue with an ``ordering`` of its own orders its children by it (``child_key``).
    ``demanding_below``: per tree node, how many demanding leaves are below it (leaves drop out
    of the walk when nothing of theirs fits)."""

    def __init__(self, snapshot: Snapshot, cycle: Cycle, usage: LongTermUsage, demanding: list[str]) -> None:
        self.snapshot, self.cycle, self.usage = snapshot, cycle, usage
        self.starved: str | None = None  # the leaf starved past t_wait this pass (``walk_of``), if any
        tree, rows = snapshot.tree, snapshot.rows
        self.group_vector: dict[str, np.ndarray] = {}
        self.group_par: dict[str, float] = {}
        self.group_fraction: dict[str, float] = {}
        self.group_arrival: dict[str, float] = {}
        for leaf, row in rows.items():
            for node in tree.path(leaf)[:-1]:
                self.group_vector[node] = self.group_vector.get(node, 0) + usage.vectors[row]
                self.group_par[node] = self.group_par.get(node, 0.0) + float(snapshot.pseudo_accumulated[row])
                self.group_fraction[node] = self.group_fraction.get(node, 0.0) + float(snapshot.share_fraction[row])
                self.group_arrival[node] = min(self.group_arrival.get(node, math.inf), float(snapshot.arrival[row]))
        self.demanding = demanding
        self.demanding_below: dict[str, int] = {}
        for leaf in demanding:
            for node in (ROOT,) + tree.path(leaf):
                self.demanding_below[node] = self.demanding_below.get(node, 0) + 1
        # Queues that order their children their own way (TenantSpec.ordering; YARN's per-queue
        # schedulingPolicy): fifo by the earliest waiting task below a child, fair / drf by the
        # child's current allocation per weight, ltrf (the default) by usage per weight as above.
        # The cycle keeps what runs below each queue (Cycle.tracks_groups).
        self.orderings = tree.queue_orderings

    def node_key(self, node: str):
        snapshot = self.snapshot
        if snapshot.tree.is_leaf(node):
            row = snapshot.rows[node]
            return fair_key(self.usage.key(row) / snapshot.share_fraction[row], float(snapshot.arrival[row]), node)
        used = normalised_usage(self.group_vector[node], snapshot.capacity, self.usage.resource) + self.group_par[node]
        return fair_key(used / self.group_fraction[node], self.group_arrival[node], node)

    def allocation_key(self, node: str, ordering: str):
        snapshot, cycle = self.snapshot, self.cycle
        resource = ordering_resource(snapshot, ordering)
        if snapshot.tree.is_leaf(node):
            row = snapshot.rows[node]
            share = resource_share(cycle.allocation[row], snapshot.capacity, resource) / snapshot.share_fraction[row]
            return fair_key(share, float(snapshot.arrival[row]), node)
        share = resource_share(cycle.group_allocation[node], snapshot.capacity, resource) / self.group_fraction[node]
        return fair_key(share, self.group_arrival[node], node)

    def earliest_waiting(self, node: str):
        tree = self.snapshot.tree
        heads = [self.cycle.queues.next_task(leaf) for leaf in self.demanding
                 if self.demanding_below.get(leaf, 0) > 0 and node in tree.path(leaf)]
        seqs = [head.seq for head in heads if head is not None]  # (all: ``demanding`` has a next task each)
        return (min(seqs), node)

    def child_key(self, parent: str):
        ordering = self.orderings.get(parent)
        if ordering is None or ordering == "ltrf":
            return self.node_key
        if ordering == "fifo":
            return self.earliest_waiting
        return lambda node: self.allocation_key(node, ordering)

    def path_key(self, leaf: str) -> tuple:
        """The leaf's place in the walk: its tree nodes' keys, each as its parent orders it."""
        path = self.snapshot.tree.path(leaf)
        return tuple(self.child_key(parent)(node) for parent, node in zip((ROOT,) + path[:-1], path))


def tree_walk_order(snapshot: Snapshot, params: Mapping[str, Any]) -> TenantOrder:
    """hltrf's order of its demanding leaves as its pass serves them at this instant: leaves
    below their min_share first (by usage / weight; not in the paper: the guarantee every other
    fair policy keeps), then the starved leaf (the lowest by weighted usage, if it has waited ``t_wait``), then the
    tree walk: by the keys of the tree nodes on each leaf's path, level by level (``_TreeWalk``).
    The number shown is the leaf's own accumulated usage / weight."""
    usage = LongTermUsage(snapshot)
    walks: dict[int, _TreeWalk] = {}  # per cycle asking (one explanation: one)

    def walk_of(cycle: Cycle) -> _TreeWalk:
        walk = walks.get(id(cycle))
        if walk is None:
            demanding = [leaf for leaf in snapshot.demanding() if cycle.queues.next_task(leaf) is not None]
            walk = walks[id(cycle)] = _TreeWalk(snapshot, cycle, usage, demanding)
            starved = None
            if demanding and not math.isinf(params["t_wait"]):
                lowest = min(demanding, key=walk.node_key)
                if snapshot.time - float(snapshot.waiting_since[snapshot.rows[lowest]]) >= params["t_wait"]:
                    starved = lowest
            walk.starved = starved
        return walk

    def key(cycle: Cycle, tenant: str) -> tuple:
        walk = walk_of(cycle)
        if tenant not in walk.demanding_below:
            return (3, (), walk.node_key(tenant))  # nothing of it fits: after every demanding leaf
        if cycle.below_min_share(tenant):
            return (0, (), walk.node_key(tenant))  # below its min_share: first, by usage / weight
        return (1 if tenant == walk.starved else 2, walk.path_key(tenant), walk.node_key(tenant))

    return TenantOrder("accumulated usage / weight", key, value_of=lambda k: float(k[-1].share))


def walks_one_level(snapshot: Snapshot, params: Mapping[str, Any]) -> bool:
    """Whether this pass's walk is the flat pass by usage (``ltrf.usage_pass``): a tree of one
    level (every leaf under the root, which has no ordering of its own), walked without a
    timeout. Each placement then goes to the demanding leaf of the lowest ``node_key``, and
    charging it moves no other leaf's key, so a heap of the leaves gives the walk's order, and
    the pass may run compiled. (With a timeout the leaf would be the same, its reason not.) A
    property test holds it to the walk (``tests/core/test_oracle.py``)."""
    return math.isinf(params["t_wait"]) and snapshot.tree.depth <= 1 and not snapshot.tree.queue_orderings


def _one_level_reason(cycle: Cycle, leaf: str, key) -> str:
    """The walk's reason for a leaf on a tree of one level (``walks_one_level``), as ``decide``'s."""
    if key.priority == BELOW_MIN_SHARE:
        return f"hltrf: below its min_share, lowest usage/weight of those ({leaf})"
    return f"hltrf: lowest usage/weight at each level ({leaf})"


def decide(snapshot: Snapshot, params: Mapping[str, Any]) -> list[Decision]:
    t_wait = params["t_wait"]
    if walks_one_level(snapshot, params):
        return usage_pass(snapshot, params, "hltrf", _one_level_reason, victims_per_fair_share=True)
    tree, rows, now = snapshot.tree, snapshot.rows, snapshot.time
    cycle = Cycle(snapshot, "hltrf")
    usage = LongTermUsage(snapshot)
    demanding = [leaf for leaf in snapshot.demanding() if cycle.queues.next_task(leaf) is not None]
    walk = _TreeWalk(snapshot, cycle, usage, demanding)
    node_key, demanding_below, orderings = walk.node_key, walk.demanding_below, walk.orderings
    group_vector = walk.group_vector
    waiting_since = {leaf: float(snapshot.waiting_since[rows[leaf]]) for leaf in demanding}
    lowest = [(node_key(leaf), leaf) for leaf in demanding]
    heapq.heapify(lowest)
    # A reservation holds room only against leaves behind its holder in the walk: it is open
    # while the walk serves leaves ahead of it (``NodeFit.suspend_reservation``), as in the
    # flat pass (``placement.serve_in_order``).
    held = snapshot.reservation
    holder_below_min = False
    if held is not None and held.tenant in rows:
        cycle.nodes.suspend_reservation()
        holder_below_min = cycle.below_min_share(held.tenant)
    # Leaves below their min_share (or below a queue's) go first, the lowest usage / weight of
    # them first, as under every policy but fifo and static (``FairKey``'s class).
    min_shares = cycle.capped and any(spec.min_share > 0 for spec in tree.specs.values())

    def ahead_of_holder(leaf: str, code: ReasonCode) -> bool:
        """Whether ``leaf``, served now with ``code``, comes before the reservation's holder in
        the walk's order (``tree_walk_order``): the reservation is open to it."""
        assert held is not None  # (asked only of a pass with a node reserved)
        if code is ReasonCode.MIN_SHARE:
            return leaf != held.tenant and (not holder_below_min or node_key(leaf) < node_key(held.tenant))
        if holder_below_min:
            return False
        return code is ReasonCode.STARVED or (leaf != held.tenant and walk.path_key(leaf) < walk.path_key(held.tenant))

    def drop(leaf: str) -> None:
        for node in (ROOT,) + tree.path(leaf):
            demanding_below[node] -= 1

    def descend() -> tuple[str, str]:
        node, route = ROOT, []
        while not tree.is_leaf(node):
            parent = node
            node = min((k for k in tree.children[node] if demanding_below.get(k, 0) > 0), key=walk.child_key(parent))
            route.append(f"{node} [{orderings[parent]} in {parent}]" if parent in orderings else node)
        return node, "hltrf: lowest usage/weight at each level (" + " > ".join(route) + ")"

    while demanding_below.get(ROOT, 0) > 0:
        # Starvation detection: only the lowest demanding leaf is a candidate (Algorithm 2, 13-22).
        while lowest and (demanding_below.get(lowest[0][1], 0) == 0 or lowest[0][0] != node_key(lowest[0][1])):
            heapq.heappop(lowest)  # stale entry: leaf dropped out or its key has grown
        leaf, reason, code = None, "", ReasonCode.FAIR_ORDER
        if min_shares:
            below = [k for k in demanding if demanding_below.get(k, 0) > 0 and cycle.below_min_share(k)]
            if below:
                leaf = min(below, key=node_key)
                reason, code = f"hltrf: below its min_share, lowest usage/weight of those ({leaf})", ReasonCode.MIN_SHARE
        if leaf is None and lowest and not math.isinf(t_wait):
            candidate = lowest[0][1]
            waited = now - waiting_since[candidate]
            if waited >= t_wait:
                leaf, reason, code = candidate, f"hltrf: starved leaf waited {waited:.4g}s >= t_wait", ReasonCode.STARVED
        if leaf is None:
            leaf, reason = descend()
        if held is not None and not ahead_of_holder(leaf, code):
            cycle.nodes.resume_reservation()  # (the walk's keys only grow: behind the holder from here on)
            held = None
        task = cycle.queues.next_task(leaf)
        if task is None:
            drop(leaf)
            continue
        if cycle.try_place(leaf, task, reason, code):
            row = rows[leaf]
            for _ in range(cycle.last_count):  # (a gang's charge is the whole gang's)
                added = usage.charge(cycle, row, task)
                for node in tree.path(leaf)[:-1]:
                    group_vector[node] = group_vector[node] + added
            waiting_since[leaf] = now
            heapq.heappush(lowest, (node_key(leaf), leaf))
        if cycle.queues.next_task(leaf) is None:
            drop(leaf)
    if held is not None:
        cycle.nodes.resume_reservation()
    rule = preemption_rule(params)
    if rule is not None:
        # Victims: the leaves of the highest long-term usage per fair share, not per static
        # effective share (``fairness.fair_shares`` keeps an idle sibling's part in its queue).
        reclaim(cycle, rule, usage.per_fair_share())
    return cycle.decisions


def _t_wait(text: str) -> float:
    return parse_non_negative(text)


SPEC = PolicySpec(
    "hltrf",
    decide,
    "hierarchical LTRF with starvation timeout t_wait (H-LTRF)",
    LONG_TERM_PARAMS + (Param("t_wait", math.inf, _t_wait, "starvation timeout T_wait in seconds; inf = naive recursive approach"),) + PREEMPTION_PARAMS
    + RESERVATION_PARAMS,
    ordering=Ordering(order=tree_walk_order, victims=("accumulated usage / fair share",
                                                      lambda snapshot: LongTermUsage(snapshot).per_fair_share())),
    needs=Needs(accounting=long_term_accounting, preemption=preemption_rule),
    traits=Traits(hierarchical=True),
)
