"""What each job of a leaf that orders its jobs has running and has used (``TenantSpec.ordering``).

A leaf with ordering ``fair``, ``drf`` or ``ltrf`` serves its jobs by their current allocation
or their accumulated usage, as YARN's leaf queues order their applications by their
``schedulingPolicy``. The engine keeps, per such job, the demand of its running tasks and its
accumulated usage ``∫ allocation dt`` in closed form: ``accumulated(t) = rate * t + offset``,
where a task starting at ``s`` adds its demand to ``rate`` and ``-demand * s`` to ``offset``, and
ending at ``e`` takes its demand off ``rate`` and adds ``demand * e``. An update is two vector
additions; nothing is integrated between events. A job is forgotten once nothing of it runs or
waits.
"""

from __future__ import annotations

import numpy as np


class JobUsage:
    """One job's running demand (``allocation``) and accumulated usage (resource-seconds)."""

    __slots__ = ("allocation", "offset")

    def __init__(self, n_resources: int = 0) -> None:
        self.allocation = np.zeros(n_resources)
        self.offset = np.zeros(n_resources)

    def start(self, demand: np.ndarray, time: float) -> None:
        self.allocation += demand
        self.offset -= demand * time

    def stop(self, demand: np.ndarray, time: float) -> None:
        self.allocation -= demand
        np.maximum(self.allocation, 0.0, out=self.allocation)  # float noise never leaves a negative
        self.offset += demand * time

    def accumulated(self, time: float) -> np.ndarray:
        """``∫ allocation dt`` from the job's first task to ``time``."""
        return self.allocation * time + self.offset


class Jobs:
    """The engine's part that knows jobs: per leaf, how many tasks of each job run
    (``running``: what a queue's ``max_running`` of jobs and a leaf's job ordering read), and for
    a leaf that orders its jobs by usage, each job's ``JobUsage`` (``usage``). A job whose last
    task stopped or left the queue is forgotten at the end of the instant's events, unless
    something of it still runs or waits (``forget_idle``)."""

    __slots__ = ("n_resources", "running", "usage", "maybe_idle")

    def __init__(self, n_resources: int = 0) -> None:
        self.n_resources = n_resources
        self.running: dict[str, dict[str, int]] = {}  # leaf -> job -> running tasks
        self.usage: dict[str, dict[str, JobUsage]] = {}  # leaf that orders its jobs -> job -> usage
        self.maybe_idle: set[tuple[str, str]] = set()  # (leaf, job) that stopped or lost a task this step

    def started(self, tenant: str, job: str, demand: np.ndarray, time: float, orders_jobs: bool,
                count: int = 1) -> None:
        """``count`` tasks of ``job`` of leaf ``tenant`` started at ``time``; ``orders_jobs``:
        its leaf orders its jobs by usage."""
        jobs = self.running.setdefault(tenant, {})
        jobs[job] = jobs.get(job, 0) + count
        if orders_jobs:
            for _ in range(count):  # (one at a time: the usage's float bits)
                self._usage_started(tenant, job, demand, time)

    def _usage_started(self, tenant: str, job: str, demand: np.ndarray, time: float) -> None:
        jobs = self.usage.setdefault(tenant, {})
        usage = jobs.get(job)
        if usage is None:
            usage = jobs[job] = JobUsage(self.n_resources)
        usage.start(demand, time)

    def stopped(self, tenant: str, job: str, demand: np.ndarray, time: float) -> None:
        """One running task of ``job`` stopped at ``time`` (finished, requeued or preempted)."""
        self.stopped_each(tenant, [(job, demand, time)])

    def stopped_each(self, tenant: str, ended: list[tuple[str, np.ndarray, float]]) -> None:
        """Running tasks of leaf ``tenant`` stopped, each ``(job, demand, time)``, in turn."""
        jobs, usage = self.running[tenant], self.usage.get(tenant)
        for job, demand, time in ended:
            left = jobs[job] - 1
            if left:
                jobs[job] = left
            else:
                del jobs[job]
            if usage is not None and job in usage:
                usage[job].stop(demand, time)
                self.left(tenant, job)

    def left(self, tenant: str, job: str) -> None:
        """A task of the job stopped or left the queue: its usage may be dropped at the end of
        the instant's events (a job whose maps end as its reduces are queued is not idle)."""
        if tenant in self.usage:
            self.maybe_idle.add((tenant, job))

    def forget_idle(self, pending) -> None:
        """Drop the usage of jobs of which, after this instant's events, nothing runs or waits
        (``pending``: leaf -> its queue, whose ``jobs`` are the jobs waiting)."""
        for tenant, job in sorted(self.maybe_idle):
            jobs = self.usage.get(tenant)
            if jobs is None or job not in jobs:
                continue
            queue = pending.get(tenant)
            if job in self.running.get(tenant, ()) or (queue is not None and job in queue.jobs):
                continue
            del jobs[job]
            if not jobs:
                del self.usage[tenant]
        self.maybe_idle.clear()

    def retrack(self, tree, old, tasks) -> None:
        """After a tree change (``old`` to ``tree``): leaves that now order their jobs start from
        their running ``tasks`` (usage of tasks that ended before is not known); leaves that no
        longer do forget theirs."""
        for leaf in list(self.usage):
            if not orders_jobs(tree, leaf):
                del self.usage[leaf]
        new = {leaf for leaf in tree.leaves if orders_jobs(tree, leaf)
               and not (old.is_leaf(leaf) and old.job_ordering(leaf) != "fifo")}
        if not new:
            return
        for task in tasks:
            if task.tenant in new:
                self._usage_started(task.tenant, task.job, task.demand, task.start)


def orders_jobs(tree, leaf: str) -> bool:
    """``leaf`` serves its jobs by their usage (``TenantSpec.ordering`` other than fifo)."""
    return tree.orders_jobs and tree.is_leaf(leaf) and tree.job_ordering(leaf) != "fifo"


__all__ = ["JobUsage", "Jobs", "orders_jobs"]
