"""The deterministic scheduling engine shared by the simulator and the streaming worker.

One call to ``Engine.step(time, events)``:

1. advance accounting to ``time`` (integrate allocations, open a new round if one began);
2. apply the events of this instant, in order (submitted, completed, heartbeat, lost);
   an event that cannot be applied is rejected with a reason and changes nothing;
3. take a snapshot and run the active policy once (one scheduling pass);
4. check every decision against the engine's own view (it fits the node, the constraints
   allow it, the task is pending) and apply it. A policy bug raises instead of over-committing.

Decisions depend on the ordered input alone: the engine never reads a clock, and nothing in
it is random.
"""

from __future__ import annotations

import dataclasses
import math
from collections import OrderedDict
from types import MappingProxyType
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterable, Mapping

import numpy as np

from fairstream.core import native
from fairstream.core.admission import Admission, EventRejected, admit, new_tree, orderings_problem, split_task_id
from fairstream.core.accounting import Accounting
from fairstream.core.jobs import Jobs, orders_jobs
from fairstream.core.nodes import Nodes
from fairstream.core.model import (
    EPSILON,
    CompletionStatus,
    Constraints,
    Decision,
    DecisionKind,
    Event,
    ModelError,
    Node,
    NodeHeartbeat,
    NodeLost,
    ReasonCode,
    ResourceSpace,
    Task,
    TaskCompleted,
    TaskState,
    TaskSubmitted,
    TenantsChanged,
    MAX_COUNT,
    event_time,
    request_task_id,
)
from fairstream.core.fairness import fair_shares
from fairstream.core.preemption import PreemptionRule, RunningTask, Starvation, starved_past_timeout
from fairstream.core.snapshot import EMPTY_MAPPING, JobRows, Later, NodeAllocation, PendingQueue, Reservation, Snapshot
from fairstream.core.tenants import TenantTree

if TYPE_CHECKING:  # the core never imports the policies: the engine is handed one
    from fairstream.policies.base import PolicySpec


#: Passes at one instant at most: a pass that preempted is followed by another (``Engine.schedule``).
MAX_PASSES = 8


class PolicyViolation(RuntimeError):
    """A policy returned a decision that would break an invariant (a bug, never input)."""


@dataclass
class StepResult:
    decisions: list[Decision] = field(default_factory=list)
    rejected: list[tuple[Event, str]] = field(default_factory=list)
    finished: list[Task] = field(default_factory=list)


class Engine:
    """Cluster state plus the active policy. Not thread-safe; one engine per cluster."""

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
        # None when off; then since when each starved tenant has been starved (event time).
        self.preemption: PreemptionRule | None = policy.preemption_rule(self.params)
        # Who is starved since when, and whether preemption could still serve them (core/preemption.py).
        self.starvation = Starvation(self.preemption) if self.preemption is not None else None
        # The node reserved for the first waiting task that fitted nowhere (``reservation=on``),
        # and with backfill the time its task can start there (``backfill_until``), kept while
        # the reservation and the tasks on its node stay as they are.
        self.reservation: Reservation | None = None
        self._backfill: tuple[Reservation, float | None] | None = None
        self.time: float | None = None
        self.registry = Nodes(len(resources))  # the nodes, their rows, capacity, use and liveness
        self._tenant_view: tuple | None = None  # the snapshot's tenant names, rows and arrivals
        self._shares_stale = False
        self.tasks: dict[str, Task] = {}  # pending and running tasks
        self.requests: dict[str, Task] = {}  # requests with tasks still pending, by request id
        # Finished tasks are forgotten but for their ids, kept ``finished_retention`` seconds of
        # event time (in finish order) to reject duplicate submissions and repeated completions.
        self.finished_ids: OrderedDict[str, float] = OrderedDict()
        self.finished_retention = finished_retention
        self.pending: dict[str, PendingQueue] = {}
        # The snapshot's ``pending``: the queues with tasks, in ``pending``'s order; made again
        # (a new dict: snapshots keep theirs) only when a queue empties or fills.
        self._waiting: dict[str, PendingQueue] | None = None
        # Per leaf, its jobs with running tasks and how many (a queue's max_running counts them),
        # and for a leaf that orders its jobs (fair, drf, ltrf), their running demand and
        # accumulated usage (``fairstream.core.jobs``); a job leaves once nothing of it runs or waits.
        self.jobs = Jobs(len(resources))
        self._seq = 0
        self._shapes: dict[tuple, int] = {}
        # Tasks no live node could ever hold (reported once), tasks to check, and whether the
        # set of nodes changed (then every pending task is checked again).
        self._unschedulable: set[str] = set()
        self._to_check: list[Task] = []
        self._nodes_changed = False
        # Verdict per task shape (demand, constraints), valid until the set of nodes changes:
        # most tasks share a few shapes, so checking a new task is usually a lookup.
        self._verdicts: dict[int, str | None] = {}
        # For tenant-local policies (PolicySpec.tenant_local): what changed since the last
        # pass. ``_grown``: node rows that gained free capacity; ``_touched``: tenants with an
        # event of their own. ``_passed``: a pass ran since the start (before it, all are new).
        self._grown: set[int] = set()
        self._touched: set[str] = set()
        self._passed = False
        self._fresh: set[int] = set()  # shapes queued since the last pass
        self._shape_holders: dict[int, set[str]] | None = None  # (``_holders``)
        self._running_on: dict[int, dict[str, Task]] | None = None  # (``_tasks_on_nodes``)
        self._job_rows: dict[tuple[str, str], dict[int, int]] | None = None  # (``_jobs_on_nodes``)
        # Row k: the demand of shape k (spare rows beyond ``len(self._shapes)``; grows by doubling).
        self._shape_demands = np.zeros((0, len(resources)))
        for leaf in tree.leaves:
            self.accounting.add_tenant(leaf, tree.path(leaf))
        self._refresh_shares()
        problem = orderings_problem(self.spec, tree)
        if problem is not None:
            raise ModelError(problem)

    # ------------------------------------------------------------------ public

    @property
    def policy(self) -> str:
        return self.spec.name

    @property
    def reserving(self) -> bool:
        """The policy reserves nodes for the first task in line (``reservation=on`` or ``backfill``)."""
        return self.params.get("reservation") in ("on", "backfill")

    def backfill_until(self) -> float | None:
        """``reservation=backfill``: the time the reserved task can start on its node by the
        estimates of the tasks running there (the earliest expected end after which enough of
        them have ended for it to fit; now if it fits now). Other tasks may take room there if
        they are expected to end by then (Slurm's backfill: they do not delay it). None: no
        backfill (another setting, no reservation, or a task it must wait for has no
        estimate). Made again only when the reservation or the tasks on its node change."""
        held = self.reservation
        if held is None or self.params.get("reservation") != "backfill":
            return None
        row = held.node
        need = self._shape_demands[held.shape] - EPSILON
        free = self.capacity[row] - self.used[row]
        if (free >= need).all():
            return self.time  # it fits now: nothing else goes first
        now = self.time if self.time is not None else 0.0
        cached = self._backfill
        if cached is not None and cached[0] == held:
            return None if cached[1] is None else max(cached[1], now)  # (a task past its estimate ends now at the earliest)
        node_id = self.nodes[row].id
        ends = sorted((math.inf if task.estimate is None else event_time(task.start + task.estimate), task.seq, task)
                      for task in self.tasks.values() if task.state is TaskState.RUNNING and task.node == node_id)
        until = None
        for end, _, task in ends:
            if end == math.inf:
                break  # it must wait for a task of unknown end: its start is unknown
            free = free + task.demand
            if (free >= need).all():
                until = end
                break
        self._backfill = (held, until)
        return None if until is None else max(until, now)

    def _tasks_changed_on(self, row: int, task: Task, started: bool) -> None:
        """``task`` started (``started``) or stopped on node ``row``: the reserved task's start
        there is made again, and the index of what runs on each node is kept."""
        if self._backfill is not None and self._backfill[0].node == row:
            self._backfill = None
        if self._running_on is not None:
            if started:
                self._running_on.setdefault(row, {})[task.id] = task
            else:
                self._running_on.get(row, {}).pop(task.id, None)
        if self._job_rows is not None:
            rows = self._job_rows.setdefault((task.tenant, task.job), {})
            left = rows.get(row, 0) + (1 if started else -1)
            if left:
                rows[row] = left
            else:
                del rows[row]
                if not rows:
                    del self._job_rows[(task.tenant, task.job)]  # (kept to the jobs that run: not history)

    def _tasks_on_nodes(self) -> dict[int, dict[str, Task]]:
        """Per node row, its running tasks by id (made from the tasks when first needed, then
        kept by ``_tasks_changed_on``)."""
        if self._running_on is None:
            index: dict[int, dict[str, Task]] = {}
            for task in self.tasks.values():
                if task.state is TaskState.RUNNING:
                    index.setdefault(self.node_row[task.node], {})[task.id] = task
            self._running_on = index
        return self._running_on

    def _jobs_on_nodes(self) -> dict[tuple[str, str], dict[int, int]]:
        """Per (tenant, job), how many of its tasks run on each node row, for ``max_per_node``
        (made from the tasks when a pass first needs it, then kept by ``_tasks_changed_on``: a
        workload without that constraint never pays for it)."""
        if self._job_rows is None:
            index: dict[tuple[str, str], dict[int, int]] = {}
            for task in self.tasks.values():
                if task.state is TaskState.RUNNING:
                    rows = index.setdefault((task.tenant, task.job), {})
                    row = self.node_row[task.node]
                    rows[row] = rows.get(row, 0) + 1
            self._job_rows = index
        return self._job_rows

    def step(self, time: float, events: Iterable[Event]) -> StepResult:
        """Apply the events of instant ``time``, then run one scheduling pass."""
        if self.time is not None and time < self.time:
            raise EventRejected(f"time {time} is before the engine clock {self.time}")
        self.time = time
        self.accounting.advance(time)
        horizon = time - self.finished_retention
        while self.finished_ids and next(iter(self.finished_ids.values())) < horizon:
            self.finished_ids.popitem(last=False)
        result = StepResult()
        for event in events:
            try:
                self._apply(event, result)
            except ModelError as exc:
                result.rejected.append((event, str(exc)))
        if self._shares_stale:
            self._refresh_shares()
        if self.jobs.maybe_idle:
            self.jobs.forget_idle(self.pending)
        result.decisions.extend(self._report_unschedulable())
        result.decisions.extend(self.schedule())
        if self.starvation is not None:
            self.starvation.track(self)
        return result

    def wake_at(self) -> float | None:
        """The next event time at which a pass could preempt though no event arrives, or None:
        a starved tenant's timeout runs out; or, for a tenant starved past it that preemption
        could not lift to its fair share while some tenant stays above its own, the next
        check, ``preemption_timeout`` later (at least ``RECHECK_MIN`` seconds): the policy's
        order of victims moves with time (LTRF's long-term usage), so a victim that was not
        ahead of it may be now. The simulator steps the engine then, as the worker's heartbeats
        step it, so both take the same preemptions."""
        if self.starvation is None or self.time is None:
            return None
        return self.starvation.wake_at(self.time)

    @property
    def starved_since(self) -> Mapping[str, float]:
        """Per starved tenant, since when (the starvation watch's; empty without a preemption rule)."""
        return self.starvation.since if self.starvation is not None else EMPTY_MAPPING

    def verdict(self, shape: int) -> str | None:
        """Why no live node could ever hold a task of ``shape`` (as last checked), or None."""
        return self._verdicts.get(shape)

    def shape_demands(self, shapes: list[int]) -> np.ndarray:
        """The demand vectors of ``shapes``, one row each."""
        return self._shape_demands[shapes]

    def fair_shares(self, tree: TenantTree | None = None) -> np.ndarray:
        """Every tenant row's fair share now (``fairness.fair_shares``) in the policy's measure,
        under this engine's tree or, "what if", under ``tree`` with the same demand."""
        acc = self.accounting
        n = len(acc.ledgers)
        return fair_shares(tree or self.tree, [ledger.name for ledger in acc.ledgers],
                           acc.allocation[:n] + self.waiting_demand(), acc.capacity, acc.config.resource,
                           self.resources.names)

    def waiting_demand(self) -> np.ndarray:
        """Per tenant row, the summed demand of its pending tasks that some live node could hold:
        a task no node can ever hold (``unschedulable``) asks for no share. A fresh array or view."""
        acc = self.accounting
        pending = acc.pending_demand[: len(acc.ledgers)]
        if not self._unschedulable:
            return pending[:]
        pending = pending.copy()
        for task_id in self._unschedulable:
            task = self.tasks.get(task_id) or self.requests.get(task_id)
            if task is not None and task.state is TaskState.PENDING:
                pending[acc.row[task.tenant]] -= task.demand * task.count
        return np.maximum(pending, 0.0, out=pending)

    def _running_tasks(self) -> tuple[RunningTask, ...]:
        return tuple(RunningTask(task.id, task.job, task.tenant, self.node_row[task.node], task.demand, task.demand_map,
                                 task.start, task.seq)
                     for task in self.tasks.values() if task.state is TaskState.RUNNING)

    def _report_unschedulable(self) -> list[Decision]:
        """An ``UNSCHEDULABLE`` decision for each pending task that fits no live node its
        constraints allow even when idle: new tasks, or all pending ones when nodes changed."""
        if not self._to_check and not self._nodes_changed:
            return []
        live = np.flatnonzero(self.alive)
        if not len(live):  # no cluster yet: judge when the first node arrives
            self._to_check.clear()
            return []
        if self._nodes_changed:
            candidates = [t for t in self.tasks.values() if t.state is TaskState.PENDING]
            candidates += self.requests.values()
        else:
            candidates = [t for t in self._to_check if t.state is TaskState.PENDING]
        self._to_check.clear()
        if self._nodes_changed:
            self._verdicts.clear()
        self._nodes_changed = False
        capacity = self.capacity[live]
        verdicts = self._verdicts
        decisions = []
        for task in sorted(candidates, key=lambda t: t.seq):
            if task.shape not in verdicts:
                verdicts[task.shape] = self._why_unschedulable(task, live, capacity)
            why = verdicts[task.shape]
            if why is None:
                self._unschedulable.discard(task.id)
            elif task.id not in self._unschedulable:
                self._unschedulable.add(task.id)
                code, text = why
                decisions.append(Decision(self.time, task.id, task.job, task.tenant, "", task.demand_map,
                                          self.policy, text, code, DecisionKind.UNSCHEDULABLE, task.count))
        return decisions

    def unschedulable_reason(self, shape: int) -> str | None:
        """Why no live node could ever hold tasks of ``shape`` (its ``unschedulable`` decision's
        reason), or None if one could (or it was not judged: no live node yet)."""
        verdict = self._verdicts.get(shape)
        return None if verdict is None else verdict[1]

    def _allowed(self, constraints: Constraints, rows) -> np.ndarray:
        """Per node row of ``rows``: do ``constraints`` allow it?"""
        ids, labels = self.registry.ids, self.registry.labels
        return np.array([constraints.allows(ids[r], labels[r]) for r in rows], dtype=bool)

    def _why_unschedulable(self, task: Task, live: np.ndarray, capacity: np.ndarray) -> tuple[ReasonCode, str] | None:
        eligible = self._allowed(task.constraints, live)
        if not eligible.any():
            return (ReasonCode.NO_MATCHING_NODE,
                    f"unschedulable: no live node matches its constraints {task.constraints.to_json()}")
        large = (capacity[eligible] >= task.demand - EPSILON).all(axis=1)
        if large.any():
            return None
        biggest = self.resources.as_dict(capacity[eligible].max(axis=0))
        return (ReasonCode.TOO_LARGE, f"unschedulable: none of the {int(eligible.sum())} live nodes it may use is "
                                      f"large enough (needs {task.demand_map}; largest per resource {biggest})")

    def schedule(self) -> list[Decision]:
        """The scheduling pass at the current time. A pass that preempted, or whose reserved node
        was released or moved, is followed at once by another: preemption frees whole tasks, so
        room beyond what the starved tenant took may be left, and a pass keeps other shapes off
        the node it had reserved; that room goes, by the policy's order, before the instant ends
        (work conservation)."""
        decisions, again = self._pass()
        latest = decisions
        for _ in range(MAX_PASSES - 1):
            if not (again or any(d.kind is DecisionKind.PREEMPT for d in latest)):
                break
            latest, again = self._pass()
            decisions = decisions + latest
        return decisions

    def _pass(self) -> tuple[list[Decision], bool]:
        """One scheduling pass at the current time: its decisions, and whether the room of the
        node it had reserved opened to other shapes (its reservation ended or moved) while some
        waiting shape fits it (then ``schedule`` runs another)."""
        if not self.nodes or not self._waiting_queues():
            self.reservation = None
            return [], False
        fields = {}
        if self.spec.tenant_local:
            if self._passed and not self.tree.has_limits:
                alive = self.registry.storage_alive  # (the storage: not a view made per row)
                grown = np.array(sorted(row for row in self._grown if alive[row]), dtype=np.int64)
                candidates, grown_demands = self._candidates(grown)
                fields = dict(candidates=candidates, grown_rows=grown, fresh_shapes=frozenset(self._fresh),
                              grown_demands=grown_demands)
            self._grown.clear()
            self._touched.clear()
            self._fresh.clear()
            self._passed = True
        snapshot = self.snapshot(**fields)
        decisions = self.spec.decide(snapshot, self.params)
        snapshot.expire()  # the decisions change the state its fields not read yet are made from
        requests = [self._preempt(decision) if decision.kind is DecisionKind.PREEMPT else self._start(decision)
                    for decision in decisions]
        again = bool(getattr(decisions, "withdrawn", 0))
        if again:
            # Placements taken back: their room may be more than the starved task took, on
            # nodes that did not gain room as far as the candidate tenants know: a full pass.
            self._passed = False
        if self.reserving:
            before = self.reservation
            self._reserve(getattr(decisions, "blocked", None))
            # The pass kept other shapes off the node it had reserved: if that reservation moved
            # or ended (its task placed), the room there goes in another pass at once, if some
            # waiting shape (constraints aside) fits it now.
            after = self.reservation
            moved = before is not None and (
                after is None or (after.node, after.tenant, after.shape) != (before.node, before.tenant, before.shape)
                # With backfill, when the reserved task can start may have changed in the pass
                # (the task placed, or its room taken by one of its shape): what may backfill
                # is known only now.
                or (self.params.get("reservation") == "backfill"
                    and (after.task != before.task or self.backfill_until() != snapshot.backfill_until)))
            if moved:
                self._grown.add(before.node)  # its room is open to every shape again (``_candidates``)
                again = again or bool(self.alive[before.node]) and bool(
                    (self._shape_demands[: len(self._shapes)] <= self.capacity[before.node] - self.used[before.node]
                     + EPSILON).all(axis=1).any())
        if not any(requests):
            return decisions, again
        return _grouped(decisions, requests), again

    def _reserve(self, blocked: tuple[str, Task] | None) -> None:
        """After a pass: reserve a node for ``blocked``, the first entry the pass tried that
        fitted no node's free room (None: no reservation). The node kept if the same tenant's
        same shape held one that can still hold it; else the live node it may use that lacks
        least (summed over resources, as shares of the cluster), the lowest number on ties."""
        if blocked is None:
            self.reservation = None
            return
        tenant, entry = blocked
        if entry.state is not TaskState.PENDING or self._verdicts.get(entry.shape) is not None:
            self.reservation = None  # placed after all (a later stage), or no node could ever hold it
            return
        most = entry.constraints.max_per_node
        # Nodes where its job runs its most: room kept there could not take it.
        full = () if most is None else [row for row, running in
                                        self._jobs_on_nodes().get((tenant, entry.job), {}).items() if running >= most]
        held = self.reservation
        if (held is not None and held.tenant == tenant and held.shape == entry.shape and self.registry.storage_alive[held.node]
                and all(have >= want - EPSILON  # (plain floats: numpy costs more on two or three)
                        for have, want in zip(self.registry.storage_capacity[held.node].tolist(), entry.demand.tolist()))
                and held.node not in full):
            task_id = entry.task_ids(0, 1)[0]
            if task_id != held.task:
                self.reservation = Reservation(held.node, tenant, entry.shape, task_id)
            return  # the same wait: the same node (it could hold the shape when reserved)
        usable = self.alive
        if not entry.constraints.empty or full:
            usable = usable.copy()
            if not entry.constraints.empty:
                usable &= self._allowed(entry.constraints, range(len(self.nodes)))
            for row in full:
                usable[row] = False
        total = np.where(self.accounting.capacity > 0, self.accounting.capacity, 1.0)
        if native.enabled():  # the same choice, compiled (``native.least_lacking_node``)
            node = native.module.least_lacking_node(usable, self.capacity, self.used, entry.demand, total, EPSILON)
        else:
            rows = np.flatnonzero(usable & (self.capacity >= entry.demand - EPSILON).all(axis=1))
            lacking = (np.maximum(entry.demand - (self.capacity[rows] - self.used[rows]), 0.0) / total).sum(axis=1)
            node = int(rows[int(np.argmin(lacking))]) if len(rows) else None  # argmin: the first, the lowest row on ties
        if node is None:
            self.reservation = None
            return
        task_id = entry.task_ids(0, 1)[0]
        self.reservation = Reservation(node, tenant, entry.shape, task_id)

    def _enqueue(self, task: Task) -> None:
        """``task`` (or request) waits in its tenant's queue."""
        queue = self.pending.setdefault(task.tenant, PendingQueue())
        if not queue.count:
            self._waiting = None
        queue.add(task)
        if self._shape_holders is not None:
            self._shape_holders.setdefault(task.shape, set()).add(task.tenant)

    def _dequeue(self, task: Task) -> None:
        """One task of ``task`` (a request: its next) leaves its tenant's queue."""
        queue = self.pending[task.tenant]
        queue.removed(task)
        if not queue.count:
            self._waiting = None
        if task.shape not in queue.groups and self._shape_holders is not None:
            holders = self._shape_holders.get(task.shape)
            if holders is not None:
                holders.discard(task.tenant)
                if not holders:
                    del self._shape_holders[task.shape]  # (kept to the shapes that wait: not history)

    def _holders(self) -> dict[int, set[str]]:
        """Per task shape, the tenants with tasks of it waiting (made from the queues when
        first needed, then kept by ``_enqueue`` and ``_dequeue``)."""
        if self._shape_holders is None:
            holders: dict[int, set[str]] = {}
            for tenant, queue in self.pending.items():
                for shape in queue.groups:
                    holders.setdefault(shape, set()).add(tenant)
            self._shape_holders = holders
        return self._shape_holders

    def _candidates(self, rows: np.ndarray) -> tuple[frozenset[str], np.ndarray]:
        """The demanding tenants that may place anything now (``Snapshot.candidates``): those
        with an event since the last pass, and those with a task shape that fits the free room
        of a node that gained some since (constraints aside: a superset). Every other tenant's
        shapes fitted no node when the last pass ended, and no node has more room now. Also the
        demands of the queued shapes that fit such a node's room (``Snapshot.grown_demands``)."""
        out = set(self._touched)
        held = self.reservation
        if held is not None and held.tenant in self.pending and self.pending[held.tenant].count:
            out.add(held.tenant)  # its room may have grown on the reserved node
        holders = self._holders()
        if not len(rows) or not holders:
            return frozenset(out), self._shape_demands[:0]
        if native.enabled():  # the same scan, compiled (``native.shapes_that_fit``)
            room = native.module.shapes_that_fit(list(holders), self._shape_demands, self.capacity, self.used, rows,
                                                 EPSILON)
        else:
            shapes = np.fromiter(holders, dtype=np.int64, count=len(holders))  # the shapes that wait
            demands = self._shape_demands[shapes]
            free = self.capacity[rows] - self.used[rows] + EPSILON  # (live rows only)
            fits = (demands[:, None, :] <= free[None, :, :]).all(axis=2).any(axis=1)
            room = shapes[fits].tolist()
        for shape in room:
            out |= holders[shape]
        return frozenset(out), self._shape_demands[np.array(room, dtype=np.int64)]

    def _waiting_queues(self) -> dict[str, PendingQueue]:
        if self._waiting is None:
            self._waiting = {t: q for t, q in self.pending.items() if q.count > 0}
        return self._waiting

    def snapshot(self, **pass_fields) -> Snapshot:
        """The state a pass reads (``Snapshot``); ``pass_fields``: what the engine knows of this
        pass only (``candidates``, ``grown_rows``, ...). What only some policies read is made on
        first read (``snapshot.Later``) from the state as it is now: ``Snapshot.expire`` before
        the state changes."""
        acc = self.accounting
        now = self.time if self.time is not None else 0.0
        free = self.capacity - self.used
        free[~self.alive] = -1.0
        n = len(acc.ledgers)
        if self._tenant_view is None or self._tenant_view[0] != (n, acc.arrivals):
            # made again only when a tenant joins or first arrives
            self._tenant_view = ((n, acc.arrivals), [ledger.name for ledger in acc.ledgers], dict(acc.row),
                                 np.array([math.inf if l.first_arrival is None else l.first_arrival
                                           for l in acc.ledgers]))
            self._tenant_view[3].flags.writeable = False
        _, names, rows, arrival = self._tenant_view
        node_ids, node_labels = self.registry.view()
        starved_since, running_tasks = EMPTY_MAPPING, None
        if self.starvation is not None and self.starvation.since:
            starved_since = MappingProxyType(dict(self.starvation.since))
            if starved_past_timeout(self.starvation.since, now, self.preemption):
                running_tasks = self._running_tasks()
        return Snapshot(
            time=now,
            resources=self.resources,
            node_ids=node_ids,
            node_labels=node_labels,
            free=free,
            capacity=acc.capacity.copy(),
            tree=self.tree,
            tenants=names,
            rows=rows,
            share_fraction=acc.fractions.copy(),
            allocation=acc.allocation.copy(),
            share=acc.share.copy(),
            accumulated=Later(lambda: acc.accumulated_rows(None, now)),
            pseudo_accumulated=Later(lambda: acc.pseudo_rows(None, now)),
            quantum=Later(lambda: acc.quanta_by_row().copy()),
            arrival=arrival,
            waiting_since=Later(lambda: np.array([math.nan if l.waiting_since is None else l.waiting_since
                                                  for l in acc.ledgers])),
            pending=self._waiting_queues(),
            accounting=acc.config,
            running=Later(lambda: np.array([ledger.running for ledger in acc.ledgers], dtype=float)),
            node_capacity=self.capacity,
            node_allocation=(NodeAllocation(lambda row: self._tasks_on_nodes().get(row, {}).values())
                             if self.spec.needs_node_allocation else None),
            job_rows=JobRows(self._jobs_on_nodes),
            starved_since=starved_since,
            running_tasks=running_tasks,
            running_jobs=self.jobs.running if self.tree.has_limits else EMPTY_MAPPING,
            job_usage=self.jobs.usage if self.tree.orders_jobs else EMPTY_MAPPING,
            pending_demand=self.waiting_demand() if self.preemption is not None else None,  # the fair share's
            reservation=self.reservation,
            reserving=self.reserving,
            backfill_until=self.backfill_until(),
            **pass_fields,
        )

    # ------------------------------------------------------------------ events

    def _apply(self, event: Event, result: StepResult) -> None:
        if isinstance(event, TaskSubmitted):
            self._submit(event)
        elif isinstance(event, TaskCompleted):
            task = self._complete(event)
            result.finished.append(task)
        elif isinstance(event, NodeHeartbeat):
            self._heartbeat(event)
        elif isinstance(event, NodeLost):
            result.decisions.extend(self._lose(event))
        elif isinstance(event, TenantsChanged):
            self._configure(event)
        else:  # pragma: no cover - the type union is closed
            raise EventRejected(f"unknown event type {type(event).__name__}")

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

    def _configure(self, event: TenantsChanged) -> None:
        """Apply a new tenant tree: accumulated usage, quanta and running tasks are kept; new
        leaves get accounting of their own; every share is computed again."""
        old = self.tree
        self.tree = admit(self, event)
        self.jobs.retrack(self.tree, old, [t for t in self.tasks.values() if t.state is TaskState.RUNNING])
        for leaf in self.tree.leaves:
            self.accounting.add_tenant(leaf, self.tree.path(leaf))
            self.accounting.quanta.initialise(self.tree.path(leaf))
        self._refresh_shares()
        self._touched.update(self.pending)  # every tenant's key may have moved: all are candidates

    def in_request(self, task: str) -> tuple[Task, int] | None:
        """The pending request that holds ``task`` (``<request>-<k>``, not yet placed) and k."""
        found = split_task_id(task) if self.requests else None
        request = self.requests.get(found[0]) if found is not None else None
        if request is None:
            return None
        k = found[1]
        if k < request.index or k in request.cancelled:
            return None
        return (request, k) if k < request.index + request.count + len(request.cancelled) else None

    def _submit(self, event: TaskSubmitted) -> Task:
        demand, constraints = admit(self, event)
        if self.tree.ensure_leaf(event.tenant):
            self.accounting.add_tenant(event.tenant, self.tree.path(event.tenant))
            self._refresh_shares()  # at once: the new tenant's PAR below reads shares
        count = 1 if event.count is None else event.count
        self._seq += 1
        task = Task(
            id=event.task,
            job=event.job,
            tenant=event.tenant,
            demand=demand,
            submit=event.time,
            constraints=constraints,
            estimate=None if event.estimate is None else float(event.estimate),
            seq=self._seq,
            demand_map=self.resources.as_dict(demand),
            shape=self._shape_of(demand, constraints, event.tenant, event.job),
            demand_values=tuple(demand.tolist()),
            count=count,
            index=-1 if event.count is None else 0,
        )
        self._seq += count - 1  # one number per task: a request orders as its tasks would
        if event.count is None:
            self.tasks[task.id] = task
        else:
            self.requests[task.id] = task
        self._to_check.append(task)
        self._touched.add(task.tenant)
        self._fresh.add(task.shape)
        self._enqueue(task)
        self.accounting.on_submit(self.accounting.row[task.tenant], demand, event.time, count)
        return task

    def _shape_of(self, demand: np.ndarray, constraints: Constraints, tenant: str, job: str) -> int:
        """The shape id of tasks of this demand and constraints: tasks of one shape fit exactly
        the same nodes. With ``max_per_node`` that depends on where the job runs, so the shape
        is the job's own."""
        key = (demand.tobytes(), constraints) if constraints.max_per_node is None else \
            (demand.tobytes(), constraints, tenant, job)
        shape = self._shapes.get(key)
        if shape is None:
            shape = self._shapes[key] = len(self._shapes)
            if shape == len(self._shape_demands):
                spare = np.zeros((max(16, shape), self._shape_demands.shape[1]))
                self._shape_demands = np.vstack([self._shape_demands, spare])
            self._shape_demands[shape] = demand
        return shape

    def _complete(self, event: TaskCompleted) -> Task:
        admit(self, event)
        if event.task not in self.tasks:
            return self._cancel_in_request(event)
        task = self.tasks[event.task]
        row = self.accounting.row[task.tenant]
        self.finished_ids[task.id] = event.time
        del self.tasks[task.id]
        self._unschedulable.discard(task.id)
        if task.state is TaskState.PENDING:
            # Killed (or failed) before it ever ran: it leaves the queue.
            task.state = TaskState.DONE
            self._dequeue(task)
            self.accounting.on_cancel_pending(row, task.demand)
            self.jobs.left(task.tenant, task.job)
            return task
        node = self.node_row[task.node]
        self.used[node] -= task.demand
        np.maximum(self.used[node], 0.0, out=self.used[node])
        self._tasks_changed_on(node, task, started=False)
        self._grown.add(node)
        self._touched.add(task.tenant)
        task.state = TaskState.DONE
        self.jobs.stopped(task.tenant, task.job, task.demand, event.time)
        self.accounting.on_finish(row, task.running_entry, event.time, self.tree)
        return task

    def _cancel_in_request(self, event: TaskCompleted) -> Task:
        """A task of a pending request completed (killed or failed) before it ran: the
        request holds one task less."""
        request, k = self.in_request(event.task)
        self.finished_ids[event.task] = event.time
        if k == request.index:
            self._advance_request(request)
        else:
            request.cancelled = request.cancelled | {k}
            request.count -= 1
        self._retire_request(request)
        self._dequeue(request)
        self.accounting.on_cancel_pending(self.accounting.row[request.tenant], request.demand)
        self.jobs.left(request.tenant, request.job)
        task = _task_of(request, event.task)
        task.state = TaskState.DONE
        return task

    def _advance_request(self, request: Task) -> None:
        """The request's next task left it: move on to the next index not cancelled."""
        k = request.index + 1
        while k in request.cancelled:
            k += 1
        request.seq += k - request.index
        request.cancelled = frozenset(c for c in request.cancelled if c >= k) if request.cancelled else request.cancelled
        request.index = k
        request.count -= 1

    def _retire_request(self, request: Task) -> None:
        if request.count == 0:
            request.state = TaskState.DONE
            del self.requests[request.id]
            self._unschedulable.discard(request.id)

    def _heartbeat(self, event: NodeHeartbeat) -> None:
        capacity = admit(self, event)
        labels = dict(event.labels or {})
        row = self.node_row.get(event.node)
        if event.weights is not None:  # named resources change; the others keep theirs (1 on a new node)
            node_weights = self.nodes[row].weights if row is not None else None
            node_weights = np.ones(len(self.resources)) if node_weights is None else node_weights.copy()
            for name, value in event.weights.items():
                node_weights[self.resources.index(name)] = float(value)
            if row is not None:
                self.nodes[row].weights = None if (node_weights == 1.0).all() else node_weights
        if row is None:
            weights = None if event.weights is None or (node_weights == 1.0).all() else node_weights
            row, changed = self.registry.join(Node(event.node, capacity, labels, True, event.time, weights)), True
        else:
            changed, relabelled = self.registry.update(row, capacity, None if event.labels is None else labels,
                                                       event.time)
            if not (changed or relabelled):
                return
        # Its room, or where constraints match (new labels), changed: every pending task is
        # checked again and the node watched by the next pass.
        self._nodes_changed = True
        self._grown.add(row)
        if changed:
            self._shares_stale = True

    @property
    def nodes(self) -> list[Node]:
        """Every node seen, by row (``registry``)."""
        return self.registry.nodes

    @property
    def node_row(self) -> dict[str, int]:
        return self.registry.row

    @property
    def capacity(self) -> np.ndarray:
        """Node x resource capacity (a view: writes go to the registry's storage)."""
        return self.registry.capacity

    @property
    def used(self) -> np.ndarray:
        """Node x resource allocated to running tasks (a view)."""
        return self.registry.used

    @property
    def alive(self) -> np.ndarray:
        return self.registry.alive

    def _lose(self, event: NodeLost) -> list[Decision]:
        admit(self, event)
        row = self.node_row[event.node]
        if not self.registry.lose(row):
            return []
        self._nodes_changed = True
        if self.reservation is not None and self.reservation.node == row:
            self.reservation = None
        requeued = []
        for task in self.tasks.values():
            if task.state is TaskState.RUNNING and task.node == event.node:
                requeued.append(task)
        requeued.sort(key=lambda t: t.seq)
        decisions = []
        for task in requeued:
            self._back_to_pending(task, row, event.time)
            decisions.append(
                Decision(event.time, task.id, task.job, task.tenant, event.node, task.demand_map,
                         self.policy, f"requeue: node {event.node} lost", ReasonCode.NODE_LOST, DecisionKind.REQUEUE)
            )
        self.used[row] = 0.0
        self._shares_stale = True
        return decisions

    # --------------------------------------------------------------- decisions

    def _back_to_pending(self, task: Task, row: int, time: float) -> None:
        """A running task stops (its node lost, or preempted) and waits again, same id."""
        self.used[row] -= task.demand
        self._tasks_changed_on(row, task, started=False)
        self.accounting.on_requeue(self.accounting.row[task.tenant], task.running_entry, time)
        task.state, task.node, task.start, task.running_entry = TaskState.PENDING, None, None, None
        self._enqueue(task)  # before the job stops: it waits, so its usage is kept
        self.jobs.stopped(task.tenant, task.job, task.demand, time)
        self._touched.add(task.tenant)
        self._fresh.add(task.shape)

    def _preempt(self, decision: Decision) -> None:
        """Apply one ``PREEMPT``: the task stops and is pending again; its room is free at once."""
        task = self.tasks.get(decision.task)
        if task is None or task.state is not TaskState.RUNNING or task.node != decision.node:
            raise PolicyViolation(f"{decision.policy} preempted task {decision.task!r}, not running on {decision.node}")
        row = self.node_row[decision.node]
        self._back_to_pending(task, row, decision.time)
        self._grown.add(row)

    def _start(self, decision: Decision) -> str | None:
        """Apply one placement; returns the id of the request it took a task of (or None)."""
        task = self.tasks.get(decision.task)
        request = None
        if task is None:
            found = self.in_request(decision.task)
            if found is None or found[1] != found[0].index:
                raise PolicyViolation(f"{decision.policy} placed task {decision.task!r} that is not pending")
            request = found[0]
            task = _task_of(request, decision.task)
        elif task.state is not TaskState.PENDING:
            raise PolicyViolation(f"{decision.policy} placed task {decision.task!r} that is not pending")
        row = self.node_row[decision.node]
        node = self.nodes[row]
        if not node.alive:
            raise PolicyViolation(f"{decision.policy} placed {task.id} on lost node {node.id}")
        if not task.constraints.allows(node.id, node.labels):
            raise PolicyViolation(f"{decision.policy} placed {task.id} on {node.id} against its constraints")
        most = task.constraints.max_per_node
        if most is not None and self._jobs_on_nodes().get((task.tenant, task.job), {}).get(row, 0) >= most:
            raise PolicyViolation(f"{decision.policy} placed {task.id} on {node.id}, where job {task.job} already runs "
                                  f"its max_per_node {most}")
        used = self.registry.storage_used
        if _over(used[row].tolist(), task.demand.tolist(), self.registry.storage_capacity[row].tolist()):
            raise PolicyViolation(f"{decision.policy} over-commits node {node.id} with {task.id}")
        used[row] += task.demand
        self._tasks_changed_on(row, task, started=True)
        task.state, task.node, task.start = TaskState.RUNNING, node.id, decision.time
        self.jobs.started(task.tenant, task.job, task.demand, decision.time,
                          self.tree.orders_jobs and orders_jobs(self.tree, task.tenant))
        if request is None:
            self._unschedulable.discard(task.id)
            self._dequeue(task)
        else:
            self.tasks[task.id] = task
            self._advance_request(request)
            self._retire_request(request)
            self._dequeue(request)
        # Formula 9: accounted usage is the demand times the node's resource weights.
        weighted = task.demand if node.weights is None else task.demand * node.weights
        task.running_entry = self.accounting.on_start(self.accounting.row[task.tenant], task.demand, decision.time,
                                                      weighted)
        return request.id if request is not None else None

    def _refresh_shares(self) -> None:
        total = self.capacity[self.alive].sum(axis=0)
        self.accounting.set_shares(total, self.tree.effective_share)
        self._shares_stale = False


def _task_of(request: Task, task_id: str) -> Task:
    """Task ``task_id`` of ``request`` as a task of its own (pending), with the request's
    current arrival number: a request makes an object for a task only when the task leaves it."""
    return Task(task_id, request.job, request.tenant, request.demand, request.submit, request.constraints,
                estimate=request.estimate, seq=request.seq, demand_map=request.demand_map, shape=request.shape,
                demand_values=request.demand_values)


def _over(used: list[float], demand: list[float], capacity: list[float]) -> bool:
    """Whether ``demand`` on a node with ``used`` of its ``capacity`` over-commits it: the
    float operations of ``(used + demand > capacity + EPSILON).any()``, in plain floats (numpy
    costs several times more on a vector of two or three)."""
    for have, want, room in zip(used, demand, capacity):
        if have + want > room + EPSILON:
            return True
    return False


def _grouped(decisions: list[Decision], requests: list[str | None]) -> list[Decision]:
    """One decision per request and node: the placements of a pass that took tasks of one
    request to one node become one decision listing them (``Decision.tasks``), where the first
    of them was; single tasks stay as they are."""
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
            out.append(group[0]._replace(count=len(group), tasks=tuple(d.task for d in group)))
    return out

__all__ = ["Engine", "EventRejected", "PolicyViolation", "StepResult", "CompletionStatus"]
