"""A busy shared cluster, seeded: the end-to-end workload of ``fairstream bench e2e``.

``tenants`` equal queues share ``nodes`` nodes of <16 cpu, 64 GB>. ``jobs`` jobs of
``tasks_per_job`` identical tasks each (one container size per job, 1-4 cpu and 1-16 GB; every
task of a job runs 10-300 s, drawn per task) arrive uniformly over ``arrival_s`` seconds, job k
to queue k mod ``tenants``. With the defaults (1,000 jobs of 50 tasks over 1,000 s) the work is
about 1.2 times what the cluster can run in that time, so it stays busy and a backlog builds.

A job is one request with a count when its tasks share a duration, else its tasks one by one;
``durations="per-job"`` draws one duration per job (so every job is one request).
"""

from __future__ import annotations

import numpy as np

from fairstream.core.model import ResourceSpace, TenantSpec
from fairstream.core.tenants import TenantTree
from fairstream.sim.scenario import Scenario, TaskSpec, uniform_nodes


def busy_cluster(seed: int = 1, tenants: int = 100, nodes: int = 1000, jobs: int = 1000, tasks_per_job: int = 50,
                 arrival_s: float = 1000.0, durations: str = "per-task") -> Scenario:
    rng = np.random.default_rng(seed)
    specs: list[TaskSpec] = []
    submits = np.sort(rng.uniform(0.0, arrival_s, jobs))
    for k, submit in enumerate(submits.tolist()):
        job = f"j{k}"
        demand = {"cpu": float(rng.integers(1, 5)), "mem": float(rng.integers(1, 17))}
        tenant = f"q{k % tenants}"
        submit = round(submit, 3)
        if durations == "per-job":
            seconds = round(float(rng.uniform(10.0, 300.0)), 3)
            specs.append(TaskSpec(job, job, tenant, submit, seconds, demand, count=tasks_per_job))
            continue
        for t, seconds in enumerate(rng.uniform(10.0, 300.0, tasks_per_job).tolist()):
            specs.append(TaskSpec(f"{job}-{t}", job, tenant, submit, round(seconds, 3), dict(demand)))
    tree = TenantTree.from_specs([TenantSpec(f"q{k}") for k in range(tenants)])
    return Scenario(ResourceSpace(("cpu", "mem")), tree, uniform_nodes(nodes, {"cpu": 16.0, "mem": 64.0}), specs,
                    name=f"busy:{tenants}q-{nodes}n-{jobs * tasks_per_job}t")
