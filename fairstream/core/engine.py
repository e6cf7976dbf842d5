"""The deterministic scheduling engine shared by the simulator and the streaming worker.

One call to ``Engine.step(time, events)``:

1. advance accounting to ``time`` (integrate allocations, open a new round if one began);
2. apply the events of this instant, in order (submitted, completed, heartbeat, lost);
   an event that cannot be applied is rejected with a reason and changes nothing;
3. take a snapshot and run the active policy once (one scheduling pass);
4. check every decision against the engine's own view (it fits the node, the constraints
   allow it, the task is pending) and apply it. A policy bug raises instead of over-committing.

Steps 2 and 4 are ``core/transitions.py`` (what an event or a decision does to the engine's
parts), checked by ``core/admission.py``; the parts are listed in ``Engine``'s docstring.

Decisions depend on the ordered input alone: the engine never reads a clock, and nothing in
it is random.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, cast

import numpy as np

from fairstream.core.accounting import Accounting
from fairstream.core.admission import Admission, EventRejected, new_tree, orderings_problem
from fairstream.core.candidates import Changes
from fairstream.core.fairness import fair_shares
from fairstream.core.jobs import Jobs
from fairstream.core.model import (
    CompletionStatus,
    Decision,
    DecisionKind,
    Event,
    ModelError,
    ResourceSpace,
    TenantsChanged,
)
from fairstream.core.nodes import Nodes
from fairstream.core.placement import Cycle
from fairstream.core.preemption import PreemptionRule, RunningTask
from fairstream.core.reservation import Reservations
from fairstream.core.snapshot import EMPTY_MAPPING, Snapshot
from fairstream.core.snapshot_builder import SnapshotBuilder
from fairstream.core.starvation import Starvation
from fairstream.core.tenants import TenantTree
from fairstream.core.transitions import PolicyViolation, StepResult, apply_decisions, apply_events, check_gangs
from fairstream.core.verdicts import Verdicts
from fairstream.core.workload import Workload

if TYPE_CHECKING:  # the core never imports the policies: the engine is handed one
    from fairstream.policies.base import PolicySpec


#: Passes at one instant at most: a pass that preempted is followed by another (``Engine.schedule``).
MAX_PASSES = 8


class Engine:
    """Cluster state plus the active policy: a facade over parts with one job each. Not
    thread-safe; one engine per cluster.

    The parts: ``registry`` (the nodes: ``core/nodes.py``), ``workload`` (tasks, requests,
    queues, shapes: ``core/workload.py``), ``accounting`` (usage and shares:
    ``core/accounting.py``), ``jobs`` (``core/jobs.py``), ``verdicts`` (unschedulable tasks:
    ``core/verdicts.py``), ``changes`` (a tenant-local pass's candidates:
    ``core/candidates.py``), ``reservations`` (``core/reservation.py``), ``starvation``
    (``core/starvation.py``) and the snapshot builder (``core/snapshot_builder.py``); admission checks
    events against them (``core/admission.py``). The engine applies events and decisions to
    its parts in order and runs the passes."""

    def __init__(
        self,
        resources: ResourceSpace,
        tree: TenantTree,
        policy: PolicySpec,
        params: Mapping[str, str] | None = None,
        auto_tenants: bool = True,
        finished_retention: float = 3600.0,
    ) -> None:
        """``policy``: the registered policy (``fairstream.policies.get(name)``, resolved where the
        engine is assembled); ``params``: its parameters as given (``{"quantum": "600"}``),
        parsed and checked here. The policy says what accounting it needs."""
        self.resources = resources
        self.tree = tree
        self.spec = policy
        self.params = policy.parse_params(params or {})
        self.auto_tenants = auto_tenants
        self.accounting = Accounting(len(resources), policy.accounting_config(resources, self.params))
        # Preemption toward fair share (``fairstream.core.preemption``): the policy's rule, or
        # None when off, and the watch of who is starved since when.
        self.preemption: PreemptionRule | None = policy.preemption_rule(self.params)
        self.starvation = Starvation(self.preemption) if self.preemption is not None else None
        self.time: float | None = None
        self.registry = Nodes(len(resources))
        self.workload = Workload(len(resources), finished_retention)
        self.jobs = Jobs(len(resources))
        self.verdicts = Verdicts()
        self.changes = Changes()
        self.reservations = Reservations()
        self.shares_stale = False
        self._snapshots = SnapshotBuilder(policy.traits.node_allocation)  # (not stored in snapshots: made again on reading)
        for leaf in tree.leaves:
            self.accounting.add_tenant(leaf, tree.path(leaf))
        self.refresh_shares()
        problem = orderings_problem(self.policy, self.hierarchical, tree)
        if problem is not None:
            raise ModelError(problem)

    # ------------------------------------------------------------------ reading

    @property
    def policy(self) -> str:
        return self.spec.name

    @property
    def hierarchical(self) -> bool:
        """The policy walks the tenant tree (``Traits.hierarchical``): it honours queue orderings."""
        return self.spec.traits.hierarchical

    tasks = property(lambda self: self.workload.tasks, doc="Pending and running tasks by id (``workload``).")
    requests = property(lambda self: self.workload.requests, doc="Requests with tasks still pending, by id.")
    pending = property(lambda self: self.workload.pending, doc="Each tenant's ``PendingQueue``.")
    finished_ids = property(lambda self: self.workload.finished_ids, doc="Finished task ids -> finish time.")
    nodes = property(lambda self: self.registry.nodes, doc="Every node seen, by row (``registry``).")
    node_row = property(lambda self: self.registry.row, doc="Node id -> row.")
    capacity = property(lambda self: self.registry.capacity, doc="Node x resource capacity (a view).")
    used = property(lambda self: self.registry.used, doc="Node x resource allocated to running tasks (a view).")
    alive = property(lambda self: self.registry.alive, doc="Per node row: alive (a view).")
    reservation = property(lambda self: self.reservations.held, doc="The node reserved, or None.")

    @property
    def reserving(self) -> bool:
        """The policy reserves nodes for the first task in line (``reservation=on`` or ``backfill``)."""
        return self.params.get("reservation") in ("on", "backfill")

    def backfill_until(self) -> float | None:
        """``reservation=backfill``: when the reserved task can start on its node
        (``Reservations.backfill_until``); None otherwise."""
        if self.params.get("reservation") != "backfill":
            return None
        return self.reservations.backfill_until(self.time, self.workload, self.registry)

    @property
    def starved_since(self) -> Mapping[str, float]:
        """Per starved tenant, since when (the starvation watch's; empty without a preemption rule)."""
        return self.starvation.since if self.starvation is not None else EMPTY_MAPPING

    def wake_at(self) -> float | None:
        """The next event time at which a pass could preempt though no event arrives
        (``Starvation.wake_at``), or a gang's hold of nodes runs out or may begin again
        (``Reservations.wake_at``), or None. The simulator steps the engine then, as the
        worker's heartbeats step it, so both take the same decisions."""
        if self.time is None:
            return None
        times = [self.starvation.wake_at(self.time) if self.starvation is not None else None,
                 self.reservations.wake_at(self.time) if self.reserving else None]
        return min((t for t in times if t is not None), default=None)

    def fair_shares(self, tree: TenantTree | None = None) -> np.ndarray:
        """Every tenant row's fair share now (``fairness.fair_shares``) in the policy's measure,
        under this engine's tree or, "what if", under ``tree`` with the same demand."""
        acc = self.accounting
        n = len(acc.ledgers)
        return fair_shares(tree or self.tree, [ledger.name for ledger in acc.ledgers],
                           acc.allocation[:n] + self.waiting_demand(), acc.capacity, acc.config.resource,
                           self.resources.names)

    def waiting_demand(self) -> np.ndarray:
        """Per tenant row, the summed demand of its pending tasks that some live node could hold
        (``Verdicts.waiting_demand``). A fresh array or view."""
        acc = self.accounting
        return self.verdicts.waiting_demand(acc.pending_demand[: len(acc.ledgers)], self.workload, acc.row)

    def running_tasks(self) -> tuple[RunningTask, ...]:
        """What preemption may choose victims from: every running task."""
        node_row = self.registry.row
        return tuple(RunningTask(task.id, task.job, task.tenant, node_row[cast(str, task.node)], task.demand, task.demand_map,
                                 cast(float, task.start), task.seq, gang=task.gang > 0) for task in self.workload.running())

    def snapshot(self, **pass_fields) -> Snapshot:
        """The state a pass reads (``SnapshotBuilder.build``)."""
        return self._snapshots.build(self, **pass_fields)

    def admissible(self, events: Iterable[Event]) -> list[str | None]:
        """Per event, in order, why applying it now would reject it (None: it would apply),
        taking the events before it as applied; nothing changes ("what if" without mutation)."""
        admission = self.admission()
        return [admission.check(event) for event in events]

    def admission_tree(self, event: TenantsChanged) -> TenantTree:
        """The tree ``event`` would give this engine, checked as ``step`` would (``EventRejected``
        if it would be rejected); nothing changes ("what if" without mutation)."""
        return new_tree(self, event)

    def admission(self) -> Admission:
        """Checks events one at a time against this state, each as if those it passed before
        were applied: the same checks ``step`` applies (``core/admission.py``), so a driver can
        keep an event that would be rejected out of a step, and its time off the clock."""
        return Admission(self)

    # ------------------------------------------------------------------ a step

    def step(self, time: float, events: Iterable[Event]) -> StepResult:
        """Apply the events of instant ``time``, then run one scheduling pass."""
        if self.time is not None and time < self.time:
            raise EventRejected(f"time {time} is before the engine clock {self.time}")
        self.time = time
        self.accounting.advance(time)
        self.workload.forget_finished(time - self.workload.finished_retention)
        result = StepResult()
        apply_events(self, events, result)
        if self.shares_stale:
            self.refresh_shares()
        if self.jobs.maybe_idle:
            self.jobs.forget_idle(self.workload.pending)
        result.decisions.extend(self.verdicts.report(self.time, self.workload, self.registry, self.resources,
                                                     self.policy))
        result.decisions.extend(self.schedule())
        if self.starvation is not None:
            self.starvation.track(self.time, self.accounting, self.fair_shares(), self.pending, self.verdicts,
                                  self.workload.shape_demands, self._held_by_limits() if self.tree.has_limits else None)
        return result

    def schedule(self) -> list[Decision]:
        """The scheduling pass at the current time. A pass that preempted, or whose reserved node
        was released or moved, is followed at once by another: preemption frees whole tasks, so
        room beyond what the starved tenant took may be left, and a pass keeps other shapes off
        the node it had reserved; that room goes, by the policy's order, before the instant ends
        (work conservation)."""
        decisions, again = self._pass()
        latest = decisions
        for _ in range(MAX_PASSES - 1):
            if not (again or (latest and any(d.kind is DecisionKind.PREEMPT for d in latest))):
                break
            latest, again = self._pass()
            decisions = decisions + latest
        return decisions

    def _pass(self) -> tuple[list[Decision], bool]:
        """One scheduling pass at the current time: its decisions, and whether the room of the
        node it had reserved opened to other shapes (its reservation ended or moved) while some
        waiting shape fits it (then ``schedule`` runs another)."""
        if not self.nodes or not self.workload.waiting():
            self.reservations.clear()
            return [], False
        fields = {}
        if self.spec.traits.tenant_local:
            fields = self.changes.pass_fields(self.workload, self.registry, self.reservation, self.tree.has_limits)
        snapshot = self.snapshot(**fields)
        decisions = self.spec.decide(snapshot, self.params)
        snapshot.expire()  # the decisions change the state its fields not read yet are made from
        if snapshot.gangs_waiting or snapshot.gangs_running:
            check_gangs(self, decisions)  # (a pass starts a gang whole or not at all, and stops one whole)
        requests = apply_decisions(self, decisions)
        again = bool(getattr(decisions, "withdrawn", 0))
        if again:
            self.changes.forget()  # placements taken back: the next pass goes over every tenant
        if self.reserving:
            before = self.reservation
            self.reservations.reserve(getattr(decisions, "blocked", None), self.workload, self.registry,
                                      self.verdicts, self.accounting.capacity, snapshot.time,
                                      self.params.get("gang_hold", math.inf))
            # The pass kept other shapes off the node it had reserved: if that reservation moved
            # or ended (its task placed), the room there goes in another pass at once, if some
            # waiting shape (constraints aside) fits it now, or if a tenant starved past the
            # preemption timeout waits: the reservation kept its preemption stage off that node
            # too, and what runs there may be taken for it now.
            if Reservations.moved(before, self.reservation, self.params.get("reservation") == "backfill",
                                  snapshot.backfill_until, self.backfill_until):
                self.changes.grown.update(before.rows)  # its room is open to every shape again
                shapes = self.workload.shape_demands[: len(self.workload.shapes)]  # (not the spare rows)
                again = (again or any(self.registry.room_for_some(row, shapes) for row in before.rows)
                         or snapshot.running_tasks is not None)  # (given to a pass only when one is overdue)
        if not any(requests):
            return decisions, again
        return _grouped(decisions, requests), again

    def _held_by_limits(self) -> Callable[[str], bool]:
        """Whether a tenant's own max_share, max_resources or max_running holds back every
        task it waits with now (then it is not starved): the pass's checks (``Cycle``), on a
        snapshot taken at the first ask."""
        cycle: list[Cycle] = []

        def held(tenant: str) -> bool:
            if not cycle:
                cycle.append(Cycle(self.snapshot(), self.policy))
            return not any(cycle[0].within_caps(tenant, task) for task in cycle[0].queues.shape_heads(tenant, every_shape=True))

        return held

    def refresh_shares(self) -> None:
        """The tenants' shares of the live nodes' capacity, computed again."""
        total = self.capacity[self.alive].sum(axis=0)
        self.accounting.set_shares(total, self.tree.effective_share)
        self.shares_stale = False


def _grouped(decisions: list[Decision], requests: list[str | None]) -> list[Decision]:
    """One decision per request and node: the placements of a pass that took tasks of one
    request to one node become one decision listing them (``Decision.tasks``), where the first
    of them was (a policy's decision of several, ``Decision.tasks``, joins it as its tasks);
    single tasks stay as they are."""
    groups: dict[tuple[str, str, int], list[Decision]] = {}
    order: list = []
    segment = 0  # placements after a preemption are not merged into ones before it
    for decision, request in zip(decisions, requests):
        if decision.kind is DecisionKind.PREEMPT:
            segment += 1
        if request is None:
            order.append(decision)
            continue
        key = (request, decision.node, segment)
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append(decision)
    out = []
    for item in order:
        if isinstance(item, Decision):
            out.append(item)
            continue
        group = groups[item]
        if len(group) == 1:
            out.append(group[0])
        else:
            tasks = tuple(task for decision in group for task in decision.task_ids)
            out.append(group[0]._replace(count=len(tasks), tasks=tasks))
    return out

__all__ = ["Engine", "EventRejected", "PolicyViolation", "StepResult", "CompletionStatus"]
