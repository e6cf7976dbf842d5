"""Tenants arriving to a busy cluster: the workload of the preemption evaluation.

Preemption matters when one tenant fills the cluster with long tasks and others arrive later
(issue "Preemption toward fair share"). This generator builds that situation, seeded:

- ``nodes`` nodes of <``gpus_per_node`` gpu, 8 GB per GPU> (Philly's servers had 8 GPUs);
- tenant ``vc0`` submits ``backlog_jobs`` jobs at t = 0, far more than the cluster holds, so it
  fills every node and keeps a backlog for the whole arrival period: by the time the others
  arrive, what runs is what a long-busy cluster runs (with Philly's run times, mostly the long
  jobs: the short ones have come and gone);
- tenant ``vc<k>`` (k >= 1) arrives at k x ``stagger_s`` with ``jobs_per_tenant`` jobs at once
  (a sweep of training runs: it wants more than its share at once), or, with ``gap_s`` > 0,
  its first job then and the others with exponential gaps of mean ``gap_s``;
- a job asks for 1, 2, 4 or 8 GPUs (probabilities ``GPU_MIX``) as one request of that many
  tasks of <1 gpu, 8 GB>, all running the job's run time (at least 1 s).

Run times come from ``runtimes``, drawn with replacement (seeded):

- ``philly``: the Microsoft Philly job run times (``../shared/traces/microsoft-philly-derived``,
  83,154 values, median 1,186 s, 90th percentile 12,859 s, longest 53.6 days). That file has
  nothing but run times, so the arrivals, tenants and GPU counts above are ours, not Philly's;
- ``long-tasks``: uniform between 1 and 8 hours (long batch or training tasks).

A job's tasks are independent tasks here unless ``gangs``: then a job of several GPUs is a gang
(docs/workloads.md, "Gangs"), its tasks start together and stop together.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fairstream.core.model import ModelError, ResourceSpace, TenantSpec
from fairstream.core.tenants import TenantTree
from fairstream.sim.scenario import Scenario, TaskSpec, uniform_nodes
from fairstream.sim.traces.files import open_text, whole_or_excerpt

#: GPUs per job and their probabilities: our assumption (the derived Philly file has no GPU
#: counts); most jobs on one GPU, a tail of distributed jobs.
GPU_MIX = ((1, 0.7), (2, 0.1), (4, 0.1), (8, 0.1))
MEM_PER_GPU = 8.0
LONG_TASKS = (3600.0, 8 * 3600.0)
#: The Philly run-time file in this project's sibling ``shared/traces`` folder.
DEFAULT_PHILLY = whole_or_excerpt("microsoft-philly-derived/philly_runtime.csv", "philly_runtime.head100.csv")


def read_runtimes(path: str | Path) -> np.ndarray:
    """Run times in seconds from a one-column CSV with the header ``runtime`` (the Philly
    file); a bad line is a ``ModelError`` naming the file and line."""
    handle = open_text(path)
    values = []
    with handle:
        header = handle.readline().strip()
        if header != "runtime":
            raise ModelError(f"{path}:1: expected the header 'runtime', got {header[:40]!r}")
        for number, line in enumerate(handle, 2):
            text = line.strip()
            if not text:
                continue
            try:
                value = float(text)
            except ValueError:
                raise ModelError(f"{path}:{number}: a run time must be a number, got {text[:40]!r}") from None
            if not value >= 0 or value == float("inf"):
                raise ModelError(f"{path}:{number}: a run time must be finite and >= 0, got {text[:40]!r}")
            values.append(value)
    if not values:
        raise ModelError(f"{path}: no run times")
    return np.array(values)


def late_tenants(runtimes: np.ndarray | None = None, name: str = "long-tasks", seed: int = 1, tenants: int = 4,
                 nodes: int = 32, gpus_per_node: int = 8, backlog_jobs: int = 1000, jobs_per_tenant: int = 100,
                 stagger_s: float = 3 * 3600.0, gap_s: float = 0.0, gangs: bool = False) -> Scenario:
    """The workload of the module docstring; ``runtimes`` None draws long tasks (1-8 hours);
    ``gangs``: a job of several GPUs is a gang (all its tasks start together, and stop together).

    Output: a scenario with resources (gpu, mem), tenants ``vc0`` ... ``vc<tenants-1>`` of
    equal weight and jobs ``vc<k>-j<n>`` in submit order."""
    if tenants < 1 or nodes < 1 or gpus_per_node < 1 or backlog_jobs < 0 or jobs_per_tenant < 1:
        raise ModelError("late tenants: tenants, nodes, gpus_per_node and jobs_per_tenant must be >= 1, "
                         "backlog_jobs >= 0")
    rng = np.random.default_rng(seed)
    sizes, weights = zip(*GPU_MIX)

    def draw_runtimes(n: int) -> list[float]:
        if runtimes is None:
            return rng.uniform(*LONG_TASKS, n).round(0).tolist()
        return runtimes[rng.integers(0, len(runtimes), n)].tolist()

    jobs: list[tuple[float, int, int, int, float]] = []  # (submit, tenant, number, gpus, seconds)
    for tenant in range(tenants):
        count = backlog_jobs if tenant == 0 else jobs_per_tenant
        if tenant == 0:
            submits = np.zeros(count)
        else:
            gaps = rng.exponential(gap_s, count) if gap_s > 0 else np.zeros(count)
            gaps[0] = 0.0
            submits = tenant * stagger_s + np.cumsum(gaps)
        gpus = rng.choice(sizes, size=count, p=weights)
        for number, (submit, g, seconds) in enumerate(zip(submits.tolist(), gpus.tolist(), draw_runtimes(count))):
            jobs.append((round(submit, 3), tenant, number, int(g), max(float(seconds), 1.0)))
    jobs.sort()
    specs = []
    for submit, tenant, number, workers, seconds in jobs:
        job = f"vc{tenant}-j{number}"
        demand = {"gpu": 1.0, "mem": MEM_PER_GPU}
        several = workers > 1
        specs.append(TaskSpec(job, job, f"vc{tenant}", submit, seconds, demand, count=workers if several else None,
                              gang=workers if gangs and several else None))
    tree = TenantTree.from_specs([TenantSpec(f"vc{k}") for k in range(tenants)])
    cluster = uniform_nodes(nodes, {"gpu": float(gpus_per_node), "mem": MEM_PER_GPU * gpus_per_node})
    return Scenario(ResourceSpace(("gpu", "mem")), tree, cluster, specs,
                    name=f"{name}{'-gangs' if gangs else ''}:{tenants}t-{nodes}n-seed{seed}")


def load_philly(path: str, seed: int = 1, tenants: int = 4, nodes: int = 32, limit: int | None = None,
                gangs: bool = False) -> Scenario:
    """``late_tenants`` with run times drawn from the Philly file at ``path``; ``limit`` is the
    jobs of each late tenant (the backlog is ten times that); ``gangs``: multi-GPU jobs are gangs."""
    options = {} if limit is None else {"jobs_per_tenant": limit, "backlog_jobs": 10 * limit}
    return late_tenants(read_runtimes(path), name="philly", seed=seed, tenants=tenants, nodes=nodes, gangs=gangs,
                        **options)
