"""The engine's part that holds the work: tasks, requests, queues and task shapes.

``Workload`` keeps the pending and running tasks by id, the pending requests (a job's
identical tasks as one entry with a count: docs/architecture.md, "Requests with a count"), the
ids of finished tasks for a while (to refuse a duplicate or a repeated completion), each
tenant's ``PendingQueue``, and the task shapes: a shape is an interned (demand, constraints)
pair, so tasks of one shape fit exactly the same nodes. It also keeps three indexes over them,
made when first asked for and then kept up to date (a workload that never asks never pays):
the tenants waiting with each shape (candidate selection), the tasks running on each node
(``pmdrf``'s per-node allocation), and how many tasks of each job run on each node
(``max_per_node``). It knows nothing of nodes' room, accounting or policies.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any, cast

import numpy as np

from fairstream.core.model import Constraints, Task, TaskState, TaskSubmitted, gang_of, split_task_id
from fairstream.core.snapshot import PendingQueue


class Workload:
    """Tasks, requests, finished ids, the tenants' pending queues and the task shapes."""

    def __init__(self, n_resources: int = 0, finished_retention: float = 3600.0) -> None:
        self.tasks: dict[str, Task] = {}  # pending and running tasks
        self.requests: dict[str, Task] = {}  # requests with tasks still pending, by request id
        # Finished tasks are forgotten but for their ids, kept ``finished_retention`` seconds of
        # event time (in finish order) to reject duplicate submissions and repeated completions.
        self.finished_ids: OrderedDict[str, float] = OrderedDict()
        self.finished_retention = finished_retention
        self.pending: dict[str, PendingQueue] = {}
        self.seq = 0  # arrival numbers: one per task, a request taking as many as it holds
        self.shapes: dict[tuple, int] = {}
        # Row k: the demand of shape k (spare rows beyond ``len(shapes)``; grows by doubling).
        self.shape_demands = np.zeros((0, n_resources))
        # Made on first use, then kept (``state.engine_snapshot`` does not store them):
        self._waiting: dict[str, PendingQueue] | None = None  # (``waiting``)
        self._holders: dict[int, set[str]] | None = None  # (``holders``)
        self._running_on: dict[int, dict[str, Task]] | None = None  # (``running_on``)
        self._job_rows: dict[tuple[str, str], dict[int, int]] | None = None  # (``job_rows``)
        self.gangs = Gangs()  # (derived: made again from the tasks and requests)
        # The last demand parsed and its parse (``admission.parsed_demand``), a cache:
        self.last_demand: tuple[dict, Any] | None = None  # (the raw demand, its ParsedDemand)
        self._finish_time: Any = None  # (``_shared_time``)

    # ------------------------------------------------------------ tasks in and out

    def forget_finished(self, horizon: float) -> None:
        """Drop the ids of tasks that finished before event time ``horizon``."""
        finished = self.finished_ids
        while finished and next(iter(finished.values())) < horizon:
            finished.popitem(last=False)

    def submit(self, event: TaskSubmitted, demand: np.ndarray, constraints: Constraints,
               demand_map: dict[str, float], demand_values: tuple[float, ...] | None = None) -> Task:
        """The task (or request, if ``event`` has a count) ``event`` submits, admitted with this
        demand and these constraints (``demand_values``: the demand as plain floats, if made
        already): numbered, stored and queued."""
        count = 1 if event.count is None else event.count
        gang = event.gang if event.gang is not None and event.gang > 1 and event.count is not None else 0  # (of one: none)
        task = Task(
            id=event.task,
            job=event.job,
            tenant=event.tenant,
            demand=demand,
            submit=event.time,
            constraints=constraints,
            estimate=None if event.estimate is None else float(event.estimate),
            seq=self.seq + 1,
            demand_map=demand_map,
            shape=self.shape_of(demand, constraints, event.tenant, event.job, gang),
            demand_values=tuple(demand.tolist()) if demand_values is None else demand_values,
            count=count,
            index=-1 if event.count is None else 0,
            gang=gang,
        )
        self.seq += count  # one number per task: a request orders as its tasks would
        if event.count is None:
            self.tasks[task.id] = task
        else:
            self.requests[task.id] = task
            self.gangs.waiting += gang > 0
        self.enqueue(task)
        return task

    def submit_like(self, event: TaskSubmitted, first: Task) -> Task:
        """The task ``event`` submits, admitted with the demand and constraints of ``first``
        (a task of its own, of the same tenant and job, submitted right before it, after
        tasks like it only): numbered and stored like ``submit``, queued by ``enqueue_more``."""
        self.seq += 1
        task = self.tasks[event.task] = Task(
            event.task, first.job, first.tenant, first.demand, event.time, first.constraints,
            estimate=None if event.estimate is None else float(event.estimate), seq=self.seq,
            demand_map=first.demand_map, shape=first.shape, demand_values=first.demand_values)
        return task

    def enqueue_more(self, tasks: list[Task]) -> None:
        """``enqueue`` of each of ``tasks`` (``submit_like``'s, in order), the queue and its
        shape looked up once: the first task like them waits in that queue already."""
        self.pending[tasks[0].tenant].add_more(tasks)

    def finish(self, task_id: str, time: float) -> Task | None:
        """Task ``task_id`` (pending or running, not in a request) ended at ``time``: it leaves
        the task table, its id kept among the finished. None if it is not in the table."""
        task = self.tasks.pop(task_id, None)
        if task is not None:
            self.finished_ids[task_id] = self._shared_time(time)
        return task

    def _shared_time(self, time: float) -> Any:
        """``time`` as one float object for all the ids that finish at that instant: compiled,
        a float is boxed anew each time it is stored (a million finished ids kept an hour took
        one float object each, 50-70 MB at the scale-16 day)."""
        if self._finish_time is None or self._finish_time != time:
            self._finish_time = time
        return self._finish_time

    def cancel_in_request(self, task_id: str, time: float) -> tuple[Task, Task, bool]:
        """Task ``task_id`` of a pending request ended (killed or failed) before it ran: the
        request holds one task less. Returns (the request, the task as one of its own, whether
        the request is now empty and forgotten)."""
        request, k = cast("tuple[Task, int]", self.in_request(task_id))  # (admitted: it is in one)
        self.finished_ids[task_id] = self._shared_time(time)
        if k == request.index:
            self.advance_request(request)
        else:
            request.cancelled = request.cancelled | {k}
            request.count -= 1
        retired = self.retire_request(request)
        self.dequeue(request)
        task = task_of(request, task_id)
        task.state = TaskState.DONE
        return request, task, retired

    def take(self, task_id: str) -> tuple[Task, Task | None] | None:
        """The pending task ``task_id`` a placement names and the request it is the next task of
        (None for a task of its own), or None if no such task is pending."""
        task = self.tasks.get(task_id)
        if task is not None:
            return (task, None) if task.state is TaskState.PENDING else None
        found = self.in_request(task_id)
        if found is None or found[1] != found[0].index:
            return None
        return task_of(found[0], task_id), found[0]

    def started(self, task: Task, request: Task | None, following: Sequence[str] = ()) -> tuple[list[Task], bool]:
        """``task`` (taken by ``take``) started, and with it, in order, the tasks of ``request``
        that come next in it, by id (``following``: ``request.task_ids(1, n)`` or a prefix):
        they leave the queue, and a request's tasks join the task table. Returns the tasks
        started and whether the request is now empty and forgotten."""
        if request is None:
            self.dequeue(task)
            return [task], False
        tasks = self.tasks
        tasks[task.id] = task
        self.advance_request(request)
        started = [task]
        if following and not request.cancelled:  # (arrival numbers one apart: moved on in one step)
            seq = request.seq
            for offset, task_id in enumerate(following):
                task = task_of(request, task_id, seq + offset)
                tasks[task_id] = task
                started.append(task)
            self.advance_request(request, len(following))
        else:
            for task_id in following:  # (each made as ``take`` makes it: the request's arrival number moves on)
                task = task_of(request, task_id)
                tasks[task_id] = task
                self.advance_request(request)
                started.append(task)
        retired = self.retire_request(request)
        self.dequeue(request, len(started))
        return started, retired

    def shape_of(self, demand: np.ndarray, constraints: Constraints, tenant: str, job: str, gang: int = 0) -> int:
        """The shape id of tasks of this demand and constraints: the job's own with ``max_per_node``
        (what fits depends on where it runs), its size's for a gang's (whole is not one)."""
        key: tuple = (demand.tobytes(), constraints) if constraints.max_per_node is None else \
            (demand.tobytes(), constraints, tenant, job)
        if gang:
            key = (*key, "gang", gang)
        shape = self.shapes.get(key)
        if shape is None:
            shape = self.shapes[key] = len(self.shapes)
            if shape == len(self.shape_demands):
                spare = np.zeros((max(16, shape), self.shape_demands.shape[1]))
                self.shape_demands = np.vstack([self.shape_demands, spare])
            self.shape_demands[shape] = demand
        return shape

    def enqueue(self, task: Task) -> None:
        """``task`` (or request) waits in its tenant's queue."""
        queue = self.pending.setdefault(task.tenant, PendingQueue())
        if not queue.count:
            self._waiting = None
        queue.add(task)
        if self._holders is not None:
            self._holders.setdefault(task.shape, set()).add(task.tenant)

    def dequeue(self, task: Task, n: int = 1) -> None:
        """``n`` tasks of ``task`` leave its tenant's queue (a request: its next ``n``)."""
        queue = self.pending[task.tenant]
        queue.removed(task, n)
        if not queue.count:
            self._waiting = None
        if task.shape not in queue.groups and self._holders is not None:
            holders = self._holders.get(task.shape)
            if holders is not None:
                holders.discard(task.tenant)
                if not holders:
                    del self._holders[task.shape]  # (kept to the shapes that wait: not history)

    def in_request(self, task: str) -> tuple[Task, int] | None:
        """The pending request that holds ``task`` (``<request>-<k>``, not yet placed) and k."""
        found = split_task_id(task) if self.requests else None
        if found is None:
            return None
        request = self.requests.get(found[0])
        if request is None:
            return None
        k = found[1]
        if k < request.index or k in request.cancelled:
            return None
        return (request, k) if k < request.index + request.count + len(request.cancelled) else None

    @staticmethod
    def advance_request(request: Task, n: int = 1) -> None:
        """The request's next ``n`` tasks left it: move on to the next index not cancelled."""
        if not request.cancelled:  # (each step moves the index and the arrival number by one)
            request.index += n
            request.seq += n
            request.count -= n
            return
        for _ in range(n):
            k = request.index + 1
            while k in request.cancelled:
                k += 1
            request.seq += k - request.index
            request.cancelled = frozenset(c for c in request.cancelled if c >= k)
            request.index = k
            request.count -= 1

    def retire_request(self, request: Task) -> bool:
        """Forget ``request`` if no task is left in it; returns whether it was."""
        if request.count:
            return False
        request.state = TaskState.DONE
        del self.requests[request.id]
        self.gangs.waiting -= request.gang > 0
        return True

    # ------------------------------------------------------------------ indexes

    def waiting(self) -> dict[str, PendingQueue]:
        """The queues with tasks, in ``pending``'s order (the snapshot's ``pending``): made
        again, as a new dict (snapshots keep theirs), only when a queue empties or fills."""
        if self._waiting is None:
            self._waiting = {t: q for t, q in self.pending.items() if q.count > 0}
        return self._waiting

    def holders(self) -> dict[int, set[str]]:
        """Per task shape, the tenants with tasks of it waiting."""
        if self._holders is None:
            holders: dict[int, set[str]] = {}
            for tenant, queue in self.pending.items():
                for shape in queue.groups:
                    holders.setdefault(shape, set()).add(tenant)
            self._holders = holders
        return self._holders

    def running_changed(self, row: int, task: Task, started: bool) -> None:
        """``task`` started (``started``) or stopped on node ``row``: the indexes of what runs
        where follow, if made."""
        if task.gang:
            self.gangs.changed(task, started)
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

    def running_changed_each(self, row: int, tasks: list[Task], started: bool) -> None:
        """``running_changed`` of each of ``tasks``, in turn (nothing to do until an index is
        made)."""
        if self._running_on is not None or self._job_rows is not None or tasks[0].gang:
            for task in tasks:
                self.running_changed(row, task, started)

    def running(self) -> list[Task]:
        """The running tasks, in the task table's order."""
        return [task for task in self.tasks.values() if task.state is TaskState.RUNNING]

    def running_on(self, node_row: Mapping[str, int]) -> dict[int, dict[str, Task]]:
        """Per node row (``node_row``: node id -> row), its running tasks by id."""
        if self._running_on is None:
            index: dict[int, dict[str, Task]] = {}
            for task in self.running():
                index.setdefault(node_row[cast(str, task.node)], {})[task.id] = task
            self._running_on = index
        return self._running_on

    def job_rows(self, node_row: Mapping[str, int]) -> dict[tuple[str, str], dict[int, int]]:
        """Per (tenant, job), how many of its tasks run on each node row (``max_per_node``)."""
        if self._job_rows is None:
            index: dict[tuple[str, str], dict[int, int]] = {}
            for task in self.running():
                rows = index.setdefault((task.tenant, task.job), {})
                row = node_row[cast(str, task.node)]
                rows[row] = rows.get(row, 0) + 1
            self._job_rows = index
        return self._job_rows


class Gangs:
    """A workload's gangs (docs/workloads.md, "Gangs"): how many wait with tasks pending
    (``waiting``: gang requests), and per gang with tasks running (its request's id) those
    tasks by id (``running``, made from the running tasks when first asked, then kept to the
    gangs that run: not history)."""

    def __init__(self) -> None:
        self.waiting = 0
        self._running: dict[str, dict[str, Task]] | None = None

    def running(self, workload: Workload) -> dict[str, dict[str, Task]]:
        if self._running is None:
            self._running = {}
            for task in workload.running():
                if task.gang:
                    self._running.setdefault(gang_of(task), {})[task.id] = task
        return self._running

    def changed(self, task: Task, started: bool) -> None:
        """``task`` of a gang started or stopped."""
        if self._running is None:
            return
        gang = gang_of(task)
        if started:
            self._running.setdefault(gang, {})[task.id] = task
            return
        members = self._running.get(gang, {})
        members.pop(task.id, None)
        if not members:
            self._running.pop(gang, None)


def back_into_request(workload: Workload, task: Task) -> Task:
    """Running ``task`` of a gang stopped (its gang stopped whole) and waits again, in its
    request: a gang's pending tasks are one entry, so that the pass places them together.
    The request is made again if it had placed every task (its arrival number is the task's
    own: ``seq`` is the request's first number plus the index). Returns the request."""
    request_id, k = cast(tuple[str, int], split_task_id(task.id))
    workload.tasks.pop(task.id, None)
    old = workload.requests.get(request_id)
    if old is None:
        indices = [k]
        workload.gangs.waiting += 1
    else:
        indices = sorted({k, *old.pending_indices()})
        old.state = TaskState.DONE  # (left in its queue's list as done; passed over there)
        workload.dequeue(old, old.count)
    first = indices[0]
    request = Task(request_id, task.job, task.tenant, task.demand, task.submit, task.constraints,
                   estimate=task.estimate, seq=task.seq - k + first, demand_map=task.demand_map, shape=task.shape,
                   demand_values=task.demand_values, count=len(indices), index=first,
                   cancelled=frozenset(range(first, indices[-1] + 1)) - frozenset(indices), gang=task.gang)
    workload.requests[request_id] = request
    workload.enqueue(request)
    return request


def task_of(request: Task, task_id: str, seq: int | None = None) -> Task:
    """Task ``task_id`` of ``request`` as a task of its own (pending), with the request's
    current arrival number (or ``seq``): a request makes an object for a task only when the
    task leaves it."""
    return Task(task_id, request.job, request.tenant, request.demand, request.submit, request.constraints,
                estimate=request.estimate, seq=request.seq if seq is None else seq, demand_map=request.demand_map,
                shape=request.shape, demand_values=request.demand_values, gang=request.gang)


__all__ = ["Gangs", "Workload", "back_into_request", "task_of"]
