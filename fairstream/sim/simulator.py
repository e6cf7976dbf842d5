"""The embedded discrete-event simulator: the engine driven by a scenario, no Kafka, no Redis.

Events are kept by instant (``Agenda``: a heap of the distinct times), each instant's in
(kind, sequence) order. All events of one instant are handed to ``Engine.step`` together, then the engine runs one scheduling pass. A placed task
finishes ``duration`` later; its completion is the next event for it. Stages and
``after_job`` hold tasks back until what they wait for has finished, the way map and reduce
phases or chained jobs behave.

The run is a function of the scenario, the policy and its parameters alone.
"""

from __future__ import annotations

import heapq
import itertools
import math
import operator
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

from fairstream import policies  # type: ignore[attr-defined]  # (installed from policies/: mypy does not follow)
from fairstream.core.engine import Engine, StepResult
from fairstream.core.model import (
    Decision,
    DecisionKind,
    Event,
    ModelError,
    NodeHeartbeat,
    NodeLost,
    TaskCompleted,
    TaskSubmitted,
    TenantsChanged,
    event_time,
)
from fairstream.core.tenants import specs_from_json
from fairstream.sim.metrics import MetricsRecorder, job_statistics
from fairstream.sim.scenario import Scenario, TaskSpec, spec_of_task

if TYPE_CHECKING:
    from fairstream.core.explain import Explanation

# Order of event kinds within one instant (all are applied before the pass anyway).
_COMPLETE, _NODE, _SUBMIT, _WAKE = 0, 1, 2, 3


class Agenda:
    """The run's events to come, by instant: a heap of the distinct times, and per time its
    events as ``(kind, order, payload)``. ``pop`` gives the earliest instant's events in
    (kind, order) order: the order of one heap of ``(time, kind, order, payload)`` entries,
    with floats compared on the heap instead of tuples (a run's heap holds about one entry per
    running placement: the tuples' comparisons were 2.5 % of a busy run)."""

    __slots__ = ("times", "events")

    def __init__(self) -> None:
        self.times: list[float] = []
        self.events: dict[float, list[tuple]] = {}

    def add(self, time: float, kind: int, order: tuple[int, int], payload) -> None:
        """An event at ``time`` (rounded already: ``event_time``); ``order`` breaks ties within a kind."""
        bucket = self.events.get(time)
        if bucket is None:
            self.events[time] = [(kind, order, payload)]
            heapq.heappush(self.times, time)
        else:
            bucket.append((kind, order, payload))

    def next_time(self) -> float:
        """The earliest instant with events (inf: none)."""
        return self.times[0] if self.times else math.inf

    def pop(self) -> tuple[float, list[tuple]]:
        """The earliest instant and its events, in (kind, order) order; they leave the agenda."""
        time = heapq.heappop(self.times)
        events = self.events.pop(time)
        if len(events) > 1:
            events.sort(key=_kind_and_order)  # (never the payloads: kind and order are unique)
        return time, events


_kind_and_order = operator.itemgetter(0, 1)


@dataclass
class JobRecord:
    """What a run keeps of a job: memory per job, not per task (a day of millions of tasks)."""

    tenant: str
    submit: float  # its first task's submission
    tasks: int = 0  # submitted so far
    finished: int = 0
    finish: float | None = None  # its last task's finish so far


@dataclass
class SimResult:
    policy: str
    params: dict
    decisions: list[Decision]  # empty when the run handed them to ``on_decision`` instead
    jobs: dict[str, JobRecord]
    metrics: MetricsRecorder
    end_time: float
    events: list = field(default_factory=list)  # the ordered engine input, when recorded
    placements: int = 0  # place decisions
    placed_tasks: int = 0  # tasks placed at least once
    task_placements: int = 0  # tasks placed, counting again a task placed again after a preemption or a lost node

    def summary(self) -> dict:
        jobs, tenants = job_statistics(self.jobs)
        degrees = self.metrics.degrees()
        usage, counted = self.metrics.integral_g, self.metrics.integral_counted  # each a dict built per read
        submits = [job.submit for job in self.jobs.values()]
        finishes = [job.finish for job in self.jobs.values() if job.finish is not None]
        unfinished = sum(job.tasks - job.finished for job in self.jobs.values())
        return {
            "policy": self.policy,
            "params": policies.get(self.policy).params_json(self.params),
            "metric_resource": self.metrics.metric_resource,
            "tasks": sum(job.tasks for job in self.jobs.values()),
            "unfinished_tasks": unfinished,
            "decisions": self.placements,
            "placed_tasks": self.placed_tasks,
            "task_placements": self.task_placements,
            "makespan": (max(finishes) - min(submits)) if finishes else None,
            "utilisation": self.metrics.utilisation(),
            # (floats, 0.0 too: compiled, ``max(x, 0)`` is a float either way; from source, an int 0)
            "sharing_benefit": sum(max(r - 1, 0.0) for r in degrees.values()),
            "sharing_loss": sum(min(r - 1, 0.0) for r in degrees.values()),
            "soft_fairness": self.metrics.soft_fairness_summary(),
            "preemptions": sum(self.metrics.preemptions.values()),
            "work_lost": sum(self.metrics.work_lost.values()),
            "tenants": {
                name: {
                    "fairness_degree": degrees.get(name, 1.0),
                    "accumulated_usage": usage.get(name, 0.0),
                    "accumulated_counted": counted.get(name, 0.0),
                    "time_to_fair_share": self.metrics.time_to_fair_share.get(name),
                    "preemptions": self.metrics.preemptions.get(name, 0),
                    "work_lost": self.metrics.work_lost.get(name, 0.0),
                    **tenants.get(name, {}),
                }
                for name in sorted(set(degrees) | set(tenants))
            },
        }


class Simulator:
    """Runs one policy over one scenario."""

    def __init__(
        self,
        scenario: Scenario,
        policy: str,
        params: dict[str, str] | None = None,
        metric_resource: str | None = None,
        sample_interval: float | None = None,
        progress: bool | None = False,
        record_events: bool = False,
        on_decision: Callable[[Decision], None] | None = None,
        on_step: Callable[[Engine, StepResult], None] | None = None,
        explain_at: float | None = None,
    ) -> None:
        """``on_decision``: given, each decision goes to it as it is taken and the result keeps
        none (a day-long run writes them out instead of holding millions). ``on_step``: called
        with the engine and the step's result after every step (the property tests watch the
        engine's invariants through it; the run's own loop is the one loop there is).
        ``explain_at``: event time T at which ``explanation`` is taken (``fairstream.core.explain``:
        every tenant's status and why each pending task waits, as the worker's API shows them),
        the state after the last step at or before T."""
        self.scenario = scenario
        self.engine = Engine(scenario.resources, _fresh_tree(scenario), policies.get(policy), params)
        if metric_resource is None:
            metric_resource = "mem" if "mem" in scenario.resources.names else "dominant"
        if metric_resource != "dominant" and metric_resource not in scenario.resources.names:
            raise ModelError(f"--metric-resource {metric_resource}: not a resource of this cluster")
        if sample_interval is None:
            sample_interval = _default_interval(scenario)
        self.metrics = MetricsRecorder(self.engine, metric_resource, sample_interval)
        self.progress = progress
        self.record_events = record_events
        self.on_decision = on_decision
        self.on_step = on_step
        self.explain_at = explain_at
        self.explanation: Explanation | None = None

    def run(self) -> SimResult:
        scenario, engine = self.scenario, self.engine
        agenda = Agenda()
        counter = 0

        # The workload's own submissions come in workload order (0, position), before what the
        # run pushes at the same instant (1, n).
        def push(time: float, kind: int, payload) -> None:
            nonlocal counter
            counter += 1
            agenda.add(event_time(time), kind, (1, counter), payload)

        bar = progress_bar(scenario.task_count, self.progress)  # before the run's own pass over the workload
        lazy = not isinstance(scenario.tasks, list)
        if lazy:
            # A workload read as the run reaches it (a trace loader): specs are known from
            # when they are pulled, and forgotten once all their tasks finished.
            gates = ReleaseGates([])
            upcoming = gates.stream(iter(scenario.tasks))
            specs: dict[str, TaskSpec] = {}
            left: dict[str, int] = {}
        else:
            gates = ReleaseGates(scenario.tasks)
            upcoming = iter(sorted(gates.initially_released(), key=lambda spec: event_time(spec.submit)))
            specs = {t.id: t for t in scenario.tasks}

        def spec_of(task_id: str) -> TaskSpec:
            spec = spec_of_task(specs, task_id)
            if spec is None:
                raise KeyError(task_id)
            return spec

        for node in scenario.nodes:
            push(0.0, _NODE, NodeHeartbeat(0.0, node.id, node.capacity, node.labels, node.weights or None))
        for ev in scenario.events:
            event: Event
            if ev.type == "tenants":  # (each type's fields are there: ``parse_scenario`` checked)
                event = TenantsChanged(ev.time, tuple(specs_from_json(cast(list, ev.tenants))))
            elif ev.type == "node_heartbeat":
                event = NodeHeartbeat(ev.time, ev.node, cast(dict, ev.capacity), ev.labels)
            else:
                event = NodeLost(ev.time, ev.node)
            push(ev.time, _NODE, event)
        pulled = 0
        following = next(upcoming, None)
        following_at = math.inf if following is None else event_time(following.submit)  # (rounded once)

        def pull(until: float) -> None:
            """Push the workload's submissions due by ``until``."""
            nonlocal following, following_at, pulled
            while following is not None and following_at <= until:
                agenda.add(following_at, _SUBMIT, (0, pulled), following)
                pulled += 1
                following = next(upcoming, None)
                following_at = math.inf if following is None else event_time(following.submit)

        jobs: dict[str, JobRecord] = {}
        attempts: dict[str, int] = {}  # running tasks' attempt numbers (a requeue makes another)
        woken: set[float] = set()  # times a pass was asked for with no event (preemption timeouts)
        decisions: list[Decision] = []
        keep = decisions.append if self.on_decision is None else self.on_decision
        placements = placed_tasks = task_placements = 0
        recorded: list = []
        now = 0.0
        while True:
            due = agenda.next_time()
            if following is not None:
                due = min(due, following_at)
                pull(due)
            if not agenda.times:
                break
            now, events = agenda.pop()
            if self.explain_at is not None and self.explanation is None and now > self.explain_at:
                self.explanation = _explain(engine, gates, self.explain_at)
            batch: list[Event] = []
            for kind, _, payload in events:
                if kind == _COMPLETE:  # the tasks of one placement, with their attempt numbers
                    for task_id, attempt in payload:
                        if attempts.get(task_id) != attempt:
                            continue  # the attempt was requeued by a node loss, or preempted
                        del attempts[task_id]
                        batch.append(TaskCompleted(now, task_id))
                elif kind == _SUBMIT:
                    spec: TaskSpec = payload
                    if lazy:
                        specs[spec.id] = spec
                        left[spec.id] = spec.tasks
                    job = jobs.get(spec.job)
                    if job is None:
                        job = jobs[spec.job] = JobRecord(spec.tenant, now)
                    job.tasks += spec.tasks
                    batch.append(TaskSubmitted(now, spec.id, spec.job, spec.tenant, spec.demand, spec.constraints,
                                               spec.count, spec.estimate, spec.gang))
                elif kind == _NODE:
                    batch.append(payload)
                # _WAKE: no event, a pass at this time (a starved tenant's preemption timeout)
            self.metrics.advance(now)
            if self.record_events:
                recorded.append((now, batch))
            result = engine.step(now, batch)
            if result.rejected:
                _, why = result.rejected[0]
                raise ModelError(f"event at t={now}: {why}")
            if self.on_step is not None:
                self.on_step(engine, result)
            # The finished tasks of one spec in a row (a run of a request's) count as one.
            for spec, tasks in itertools.groupby(result.finished, key=lambda task: spec_of(task.id)):
                ended = sum(1 for _ in tasks)
                job = jobs[spec.job]
                job.finished += ended
                job.finish = now
                bar.update(ended)
                for released in gates.finished(spec, now, ended):
                    push(max(released.submit, gates.release_time(released, now)), _SUBMIT, released)
                if lazy:
                    left[spec.id] -= ended
                    if not left[spec.id]:
                        del left[spec.id], specs[spec.id]
            for decision in result.decisions:
                keep(decision)
                if decision.kind is DecisionKind.REQUEUE or decision.kind is DecisionKind.PREEMPT:
                    attempts[decision.task] += 1
                    if decision.kind is DecisionKind.PREEMPT:  # the decision says when the task started
                        self.metrics.record_preemption(decision.tenant, now - cast(float, decision.started))
                    continue
                if decision.kind is not DecisionKind.PLACE:
                    continue  # unschedulable: reported, still pending
                placements += 1
                task_placements += decision.count
                duration = spec_of(decision.task).duration
                ending = []
                for task_id in decision.task_ids:
                    attempt = attempts.get(task_id)
                    if attempt is None:  # its first placement (a preempted or requeued task keeps its number)
                        placed_tasks += 1
                        attempt = 0
                    attempts[task_id] = attempt = attempt + 1
                    ending.append((task_id, attempt))
                # One entry for the placement's tasks, which end together: popped in their
                # order, where their own consecutive entries would have been.
                push(now + duration, _COMPLETE, ending)
            wake = engine.wake_at()
            if wake is not None and wake not in woken:
                woken.add(wake)
                push(wake, _WAKE, None)
        bar.close()
        if self.explain_at is not None and self.explanation is None:
            self.explanation = _explain(engine, gates, self.explain_at)
        self.metrics.advance(now + self.metrics.sample_interval)
        return SimResult(self.engine.policy, dict(self.engine.params), decisions, jobs, self.metrics, now, recorded,
                         placements, placed_tasks, task_placements)


class ReleaseGates:
    """Holds back tasks of later stages and chained jobs until what they wait for finished.
    Specs may be requests: they count as their tasks and are released whole."""

    def __init__(self, tasks: Iterable[TaskSpec]) -> None:
        self.remaining: dict[str, dict[int, int]] = {}
        self.job_left: dict[str, int] = {}
        self.held_stage: dict[str, dict[int, list[TaskSpec]]] = {}
        self.held_after: dict[str, list[TaskSpec]] = {}
        self.tasks = list(tasks)
        for t in self.tasks:
            self._count(t)

    def _count(self, t: TaskSpec) -> None:
        """``t``'s tasks are still to finish, in its job and stage."""
        self.remaining.setdefault(t.job, {}).setdefault(t.stage, 0)
        self.remaining[t.job][t.stage] += t.tasks
        self.job_left[t.job] = self.job_left.get(t.job, 0) + t.tasks

    def _first_stage(self, job: str) -> int:
        return min(self.remaining[job])

    def stream(self, specs: Iterator[TaskSpec]) -> Iterator[TaskSpec]:
        """Register specs as a lazy workload yields them (in submit order, a job's lower stages
        before its higher ones) and yield those released at once; the others are held as by
        ``initially_released``. A job finished before a spec chained to it arrives releases it
        at once."""
        for t in specs:
            self._count(t)
            if t.after_job is not None and self.job_left.get(t.after_job, 1) > 0:
                self.held_after.setdefault(t.after_job, []).append(t)
            elif any(left > 0 for stage, left in self.remaining[t.job].items() if stage < t.stage):
                self.held_stage.setdefault(t.job, {}).setdefault(t.stage, []).append(t)
            else:
                yield t

    def initially_released(self) -> list[TaskSpec]:
        out = []
        for t in self.tasks:
            if t.after_job is not None:
                self.held_after.setdefault(t.after_job, []).append(t)
            elif t.stage != self._first_stage(t.job):
                self.held_stage.setdefault(t.job, {}).setdefault(t.stage, []).append(t)
            else:
                out.append(t)
        return out

    def release_time(self, spec: TaskSpec, now: float) -> float:
        return now + spec.delay if spec.after_job is not None else now

    def finished(self, spec: TaskSpec, now: float, count: int = 1) -> list[TaskSpec]:
        """``count`` tasks of ``spec`` finished: the specs this releases (as many calls of
        one would: a count reaches zero at the last of them)."""
        released: list[TaskSpec] = []
        job, stage = spec.job, spec.stage
        self.remaining[job][stage] -= count
        self.job_left[job] -= count
        if self.remaining[job][stage] == 0:
            # The next stage of this job goes once every lower stage is done.
            held = self.held_stage.get(job, {})
            for s in sorted(held):
                if all(self.remaining[job][lower] == 0 for lower in self.remaining[job] if lower < s):
                    released.extend(self._release_job_stage(job, s))
                break
        if self.job_left[job] == 0:
            for t in self.held_after.pop(job, []):
                if t.stage == self._first_stage(t.job):
                    released.append(t)
                else:
                    self.held_stage.setdefault(t.job, {}).setdefault(t.stage, []).append(t)
        return released

    def _release_job_stage(self, job: str, stage: int) -> list[TaskSpec]:
        return self.held_stage.get(job, {}).pop(stage, [])


def _explain(engine: Engine, gates: ReleaseGates, at: float) -> Explanation:
    """``explain`` of the engine as it stands, with the later stages and chained jobs submitted
    by ``at`` that the run still holds back."""
    from fairstream.core.explain import HeldEntry, explain

    held = [spec for stages in gates.held_stage.values() for specs in stages.values() for spec in specs]
    held += [spec for specs in gates.held_after.values() for spec in specs]
    entries = [HeldEntry(spec.tenant, spec.id, spec.job, spec.tasks, dict(spec.demand), spec.submit, spec.stage,
                         spec.after_job)
               for spec in sorted(held, key=lambda s: (s.submit, s.id)) if spec.submit <= at]
    from fairstream.core.forecast import MAX_STEPS, MAX_TASKS

    return explain(engine, entries, forecast=(MAX_STEPS, MAX_TASKS))


def _fresh_tree(scenario: Scenario):
    from fairstream.core.tenants import TenantTree

    return TenantTree.from_specs([type(s)(**vars(s)) for s in scenario.tree.specs.values()])


def _default_interval(scenario: Scenario) -> float:
    first, last = math.inf, -math.inf
    for t in scenario.tasks:  # one pass: a lazy workload is read again for it
        first, last = min(first, t.submit), max(last, t.submit + t.duration)
    if first == math.inf:
        return 1.0
    return max((last - first) / 400.0, 1e-3)


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def progress_bar(total: int, enabled: bool | None, unit: str = "task", desc: str = "simulating"):
    if enabled is False:
        return _NoBar()
    try:
        from tqdm import tqdm
    except ModuleNotFoundError:  # (tqdm comes with fairstream[lab]; the worker runs without it)
        return _NoBar()

    # enabled=None: show it only on a terminal (tqdm's own rule).
    return tqdm(total=total, unit=unit, desc=desc, disable=None if enabled is None else False, leave=False)
