"""The tenant tree: queues with weights and optional min/max shares; leaves run tasks.

A flat list of tenants is a one-level tree under ``root``. The tree is append-only: tenants
seen for the first time (``ensure_leaf``) join under the root with weight 1, as a production
scheduler's default queue would.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from fractions import Fraction

from fairstream.core.model import ORDERINGS, ROOT, ModelError, TenantSpec


@dataclass
class TenantTree:
    """Parent/child structure plus derived per-leaf effective shares.

    ``effective_share[leaf]`` is the product of ``w / sum(sibling w)`` along the path from the
    root (formula 2 applied level by level); the effective shares of all leaves sum to 1.
    """

    specs: dict[str, TenantSpec] = field(default_factory=dict)
    children: dict[str, list[str]] = field(default_factory=lambda: {ROOT: []})
    effective_share: dict[str, float] = field(default_factory=dict)
    has_limits: bool = False  # some tenant or queue has a min or max share, max_resources or max_running
    orders_jobs: bool = False  # some leaf orders its jobs other than by arrival (``TenantSpec.ordering``)
    # Queues (tenants with children) that set an ordering of their children, and that ordering.
    queue_orderings: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_specs(cls, specs: list[TenantSpec]) -> TenantTree:
        tree = cls()
        pending = list(specs)
        # Parents may be declared after their children; resolve in passes.
        while pending:
            progressed = False
            rest = []
            for spec in pending:
                if spec.parent == ROOT or spec.parent in tree.specs:
                    tree._add(spec)
                    progressed = True
                else:
                    rest.append(spec)
            if not progressed:
                raise ModelError(_unresolved(rest))
            pending = rest
        tree._recompute()
        return tree

    def _add(self, spec: TenantSpec) -> None:
        if spec.id == ROOT:
            raise ModelError(f"tenants: {ROOT!r} is reserved for the tree's root")
        if spec.id in self.specs:
            raise ModelError(f"tenants[{spec.id}]: declared twice")
        if not spec.weight > 0:
            raise ModelError(f"tenants[{spec.id}].weight: must be > 0, got {spec.weight}")
        if not 0 <= spec.min_share <= spec.max_share <= 1:
            raise ModelError(f"tenants[{spec.id}]: need 0 <= min_share <= max_share <= 1")
        if spec.max_running is not None and not (isinstance(spec.max_running, int) and spec.max_running >= 1):
            raise ModelError(f"tenants[{spec.id}].max_running: must be a whole number >= 1, got {spec.max_running!r}")
        if spec.ordering is not None and spec.ordering not in ORDERINGS:
            raise ModelError(f"tenants[{spec.id}].ordering: {spec.ordering!r} is not one of {', '.join(ORDERINGS)}")
        for name, value in (spec.max_resources or {}).items():
            if not 0 <= value < float("inf"):
                raise ModelError(f"tenants[{spec.id}].max_resources.{name}: must be a finite number >= 0")
        self.specs[spec.id] = spec
        self.children.setdefault(spec.parent, []).append(spec.id)
        self.children.setdefault(spec.id, [])

    def _recompute(self) -> None:
        # Exact rationals: a tree and its flattened equivalent give bit-identical shares, so
        # ties between tenants break the same way in both (H-LTRF Theorem 1 relies on it).
        self.effective_share = {}

        def walk(node: str, fraction: Fraction) -> None:
            kids = self.children.get(node, [])
            total = sum(Fraction(self.specs[k].weight) for k in kids)
            for kid in kids:
                share = fraction * Fraction(self.specs[kid].weight) / total
                if self.children[kid]:
                    walk(kid, share)
                else:
                    self.effective_share[kid] = float(share)

        walk(ROOT, Fraction(1))
        self.has_limits = any(s.max_share < 1 or s.min_share > 0 or s.max_resources or s.max_running is not None
                              for s in self.specs.values())
        self._paths = {leaf: self._path(leaf) for leaf in self.effective_share}
        self.orders_jobs = any(self.job_ordering(leaf) != "fifo" for leaf in self.effective_share)
        self.queue_orderings = self._queue_orderings()

    def _path(self, leaf: str) -> tuple[str, ...]:
        path = [leaf]
        while self.specs[path[-1]].parent != ROOT:
            path.append(self.specs[path[-1]].parent)
        return tuple(reversed(path))

    # ------------------------------------------------------------------ queries

    def is_leaf(self, tenant: str) -> bool:
        return tenant in self.effective_share

    @property
    def leaves(self) -> list[str]:
        return list(self.effective_share)

    def path(self, leaf: str) -> tuple[str, ...]:
        """Ancestors of ``leaf`` from the top level down to the leaf itself (root excluded)."""
        return self._paths[leaf]

    def ensure_leaf(self, tenant: str, weight: float = 1.0) -> bool:
        """Add an unknown tenant as a leaf under the root; returns True if it was added."""
        if tenant in self.specs:
            if not self.is_leaf(tenant):
                raise ModelError(f"tenant: {tenant!r} is a queue with children, tasks go to leaves")
            return False
        self._add(TenantSpec(id=tenant, parent=ROOT, weight=weight))
        self._recompute()
        return True

    def job_ordering(self, leaf: str) -> str:
        """How ``leaf`` orders its jobs: its ``ordering``, ``fifo`` when it has none."""
        return self.specs[leaf].ordering or "fifo"

    def _queue_orderings(self) -> dict[str, str]:
        return {q: spec.ordering for q, spec in self.specs.items() if spec.ordering is not None and self.children.get(q)}

    @property
    def depth(self) -> int:
        return max((len(p) for p in self._paths.values()), default=0)


def _unresolved(rest: list[TenantSpec]) -> str:
    """Why these specs hang from no tree: a parent that is not declared, or a cycle (named)."""
    parents = {spec.id: spec.parent for spec in rest}
    for spec in rest:
        if spec.parent not in parents:
            return f"tenants[{spec.id}].parent: unknown tenant {spec.parent!r}"
    start = rest[0].id
    seen: list[str] = []
    node = start
    while node not in seen:  # every parent here is in ``rest``: the walk must come round
        seen.append(node)
        node = parents[node]
    cycle = seen[seen.index(node):] + [node]
    return f"tenants[{cycle[0]}].parent: the tree has a cycle {' -> '.join(cycle)} (each is its own ancestor)"


def guaranteed_total(tree: TenantTree) -> float:
    """How much of the cluster the tree guarantees in min_shares: each top-level tenant's own
    min_share or its children's together, whichever is more. Above 1, every guarantee is scaled
    down in proportion (``fairness.fair_shares``)."""

    def guaranteed(node: str) -> float:
        below = sum(guaranteed(kid) for kid in tree.children.get(node, []))
        return max(tree.specs[node].min_share, below)

    return sum(guaranteed(kid) for kid in tree.children.get(ROOT, []))


def min_share_warning(tree: TenantTree) -> str | None:
    """One line when the tree's min_shares add up to more than the cluster, else None."""
    total = guaranteed_total(tree)
    if total <= 1 + 1e-9:
        return None
    return (f"min_share adds up to {total:.4g} of the cluster: no guarantee can be kept whole, each is scaled "
            f"down in proportion (to {1 / total:.3g} of it)")


def specs_from_json(items: list[dict]) -> list[TenantSpec]:
    """Tenant specs from their JSON form (a scenario file's ``tenants``, a ``tenants.config``
    message's): ``id``, ``parent`` (default: the root), ``weight`` (1), ``min_share`` (0),
    ``max_share`` (1), ``max_resources``, ``max_running`` and ``ordering`` (none)."""
    return [TenantSpec(id=t["id"], parent=t.get("parent", ROOT), weight=float(t.get("weight", 1.0)),
                       min_share=float(t.get("min_share", 0.0)), max_share=float(t.get("max_share", 1.0)),
                       max_resources={k: float(v) for k, v in t["max_resources"].items()} if "max_resources" in t
                       else None, max_running=t.get("max_running"), ordering=t.get("ordering"))
            for t in items]


def spec_changes(before: TenantSpec | None, after: TenantSpec | None) -> dict[str, list]:
    """The settings that differ between two specs of one tenant (None: the tenant is not there,
    every setting None), as ``{setting: [before, after]}`` (what a new tree would change:
    ``configure --dry-run``, and what a tenant left out would lose, ``admission.new_tree``)."""
    settings = [f.name for f in fields(TenantSpec) if f.name != "id"]
    return {name: [getattr(before, name, None), getattr(after, name, None)] for name in settings
            if getattr(before, name, None) != getattr(after, name, None)}


def spec_to_json(spec: TenantSpec) -> dict:
    """``specs_from_json``'s inverse (the root parent and default values left out)."""
    out: dict = {"id": spec.id}
    if spec.parent != ROOT:
        out["parent"] = spec.parent
    if spec.weight != 1.0:
        out["weight"] = spec.weight
    if spec.min_share != 0.0:
        out["min_share"] = spec.min_share
    if spec.max_share != 1.0:
        out["max_share"] = spec.max_share
    if spec.max_resources is not None:
        out["max_resources"] = dict(spec.max_resources)
    if spec.max_running is not None:
        out["max_running"] = spec.max_running
    if spec.ordering is not None:
        out["ordering"] = spec.ordering
    return out

