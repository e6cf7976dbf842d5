"""A pass's view of the tenant tree's limits: what runs below each queue, against its caps.

A queue's ``max_share`` (a fraction of the cluster, by dominant share), ``max_resources``
(absolute amounts of named resources) and ``max_running`` (jobs) cap what may run below it;
``min_share`` lifts a tenant below it ahead of the others (YARN's Fair Scheduler's queue
properties, Kueue's nominal quotas). ``QueueLimits`` starts from the snapshot's allocations and
running jobs and follows the pass's placements, so a cap holds for what the pass itself adds.
A tree without limits costs nothing: ``capped`` is False and nothing is tracked (unless a
queue orders its children, hltrf, which reads what runs below each queue: ``tracks_groups``).
"""

from __future__ import annotations

import numpy as np

from fairstream.core.fairness import dominant_share
from fairstream.core.model import EPSILON, Task
from fairstream.core.snapshot import Snapshot


class QueueLimits:
    """What runs below each queue in this pass (``group_allocation``), the queues' absolute
    caps (``resource_caps``; unnamed resources unbounded) and job limits (``job_limits``), and
    the jobs running below each such queue (``group_jobs``), those this pass started included."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot
        tree = snapshot.tree
        self.capped = tree.has_limits  # min or max shares: keys and caps read the queue allocations
        self.tracks_groups = self.capped or bool(tree.queue_orderings)
        self.group_allocation: dict[str, np.ndarray] = {}
        self.resource_caps: dict[str, np.ndarray] = {}
        self.job_limits: dict[str, int] = {}
        self.group_jobs: dict[str, int] = {}
        self.started_jobs: set[tuple[str, str]] = set()  # (tenant, job) this pass started
        if self.tracks_groups:
            for tenant, row in snapshot.rows.items():
                if not tree.is_leaf(tenant):
                    continue  # a tenant whose row outlived a tree change (it has no work)
                for node in tree.path(tenant):
                    prev = self.group_allocation.get(node)
                    alloc = snapshot.allocation[row]
                    self.group_allocation[node] = alloc.copy() if prev is None else prev + alloc
        if self.capped:
            for node, spec in tree.specs.items():
                if spec.max_resources:
                    cap = np.full(len(snapshot.capacity), np.inf)
                    for name, value in spec.max_resources.items():
                        cap[snapshot.resources.index(name)] = value
                    self.resource_caps[node] = cap
                if spec.max_running is not None:
                    self.job_limits[node] = spec.max_running
                    self.group_jobs[node] = 0
            if self.job_limits:
                for tenant, jobs in snapshot.running_jobs.items():
                    if tree.is_leaf(tenant):
                        for node in tree.path(tenant):
                            if node in self.group_jobs:
                                self.group_jobs[node] += len(jobs)

    def over_cap(self, tenant: str, task: Task) -> tuple[str, str] | None:
        """Which limit the task would take its tenant or a queue above it over (the first, top
        down) and a sentence saying so: ``("max_share" | "max_resources" | "max_running", text)``;
        None if none."""
        tree, cap = self.snapshot.tree, self.snapshot.capacity
        new_job = bool(self.job_limits) and self.new_job(tenant, task)
        for node in tree.path(tenant):
            limit = tree.specs[node].max_share
            if limit < 1 and (after := dominant_share(self.group_allocation[node] + task.demand, cap)) > limit + EPSILON:
                # (The numbers as they are: "at its max_share" once said so of a queue at 0.25
                # whose next task, of 8 cpu, would take it to 0.45.)
                now = dominant_share(self.group_allocation[node], cap)
                return "max_share", (f"{node} holds {now:.4g} of the cluster (dominant share) and this task would take "
                                     f"it to {after:.4g}, over its max_share {limit:g}")
            caps = self.resource_caps.get(node)
            if caps is not None and ((with_task := self.group_allocation[node] + task.demand) > caps + EPSILON).any():
                resources = self.snapshot.resources
                named = {k: v for k, v in resources.as_dict(caps).items() if v != np.inf}
                over = [r for r in map(resources.index, named) if with_task[r] > caps[r] + EPSILON]
                using = {resources.names[r]: round(float(self.group_allocation[node][r]), 6) for r in over}
                taken_to = {resources.names[r]: round(float(with_task[r]), 6) for r in over}
                return "max_resources", (f"{node} uses {using} and this task would take it to {taken_to}, over its "
                                         f"max_resources {named}")
            jobs = self.job_limits.get(node)
            if new_job and jobs is not None and self.group_jobs[node] + 1 > jobs:
                running = self.group_jobs[node]
                them = "one of them" if running != 1 else "it"
                return ("max_running", f"{node} runs {running} job{'s' if running != 1 else ''}, its max_running: "
                                       f"job {task.job} waits for {them} to end")
        return None

    def new_job(self, tenant: str, task: Task) -> bool:
        """Whether placing ``task`` starts a job that runs nothing yet."""
        return (task.job not in self.snapshot.running_jobs.get(tenant, ())
                and (tenant, task.job) not in self.started_jobs)

    def below_min_share(self, tenant: str) -> bool:
        """True if the tenant or one of its queues is below its guaranteed min_share."""
        if not self.capped:
            return False
        tree, cap = self.snapshot.tree, self.snapshot.capacity
        return any(
            tree.specs[node].min_share > 0
            and dominant_share(self.group_allocation[node], cap) < tree.specs[node].min_share - EPSILON
            for node in tree.path(tenant)
        )

    def placed(self, tenant: str, task: Task) -> None:
        """The pass placed ``task`` of ``tenant``: its queues run it (and its job, if new)."""
        if not self.tracks_groups:  # (no limits and no queue ordering: nothing to follow)
            return
        path = self.snapshot.tree.path(tenant)
        if self.capped and self.job_limits and self.new_job(tenant, task):
            self.started_jobs.add((tenant, task.job))
            for group in path:
                if group in self.group_jobs:
                    self.group_jobs[group] += 1
        for group in path:
            self.group_allocation[group] += task.demand

    def released(self, tenant: str, demand: np.ndarray) -> None:
        """A task of ``tenant`` using ``demand`` stopped, or a placement was taken back."""
        if self.tracks_groups:
            for group in self.snapshot.tree.path(tenant):
                self.group_allocation[group] -= demand

    def unstarted(self, tenant: str, job: str) -> None:
        """The pass's only start of ``job`` was taken back: it runs nothing again (max_running)."""
        if (tenant, job) in self.started_jobs:
            self.started_jobs.discard((tenant, job))
            for group in self.snapshot.tree.path(tenant):
                if group in self.group_jobs:
                    self.group_jobs[group] -= 1


__all__ = ["QueueLimits"]
