"""The LTRF papers' four-queue macro-benchmark, generated with a seed.

ICS'14 section 6.1 and TSC section 7.1 run four queues on a 9-node YARN cluster (each node two
6-core CPUs and 24 GB): Facebook, Purdue, Spark and TPC-H. What the papers give, we keep;
what they leave open, we choose and say so here and in ``docs/workloads.md``.

- Cluster: 9 nodes of <12 cpu, 24 GB>.
- Facebook: 100 jobs in the 9 bins of ICS'14 Table 3, with the per-task demands of the
  QKnobler paper's Table 1 (e.g. bin 9: 800 maps of <2, 0.5 GB>, 60 reduces of <1, 3 GB>).
  Jobs are assigned to bins by a seeded shuffle; inter-arrival gaps are the first 100 of
  SWIM's ``FB-2009_samples_24_times_1hr_1.tsv`` (the trace the paper names). Task times are
  not given: maps 6-16 s (mean 11 s, the Facebook average of ICS'14 6.5), reduces 20-40 s.
- Purdue: WordCount, TeraSort, Grep, InvertedIndex, HistogramMovies on 40 GB each
  (320 maps of 128 MB), submitted every 3 minutes; maps <1, 1 GB> of 20-40 s, reduces
  <1, 2 GB> of 60-120 s.
- TPC-H: Q1, Q9, Q12, Q17, five instances each, each launched when the previous finished
  (round robin); maps <1, 2 GB> of 15-30 s (the TSC paper measures 23.6 s on average),
  reduces <2, 4 GB> of 30-60 s.
- Spark: 10 kmeans and 10 ALS instances, alternating, each submitted 2 minutes after the
  previous finished; 100 workers each, <2, 2 GB> (kmeans) and <1, 2 GB> (ALS) as the QKnobler
  paper configures them, running 60-90 s and 90-120 s.

``weights`` sets queue weights (1:1:1:1 in the LTRF papers, 1:2:3:4 in QKnobler's 7.2.1);
``scale`` shrinks every task count (the tests use it to stay fast). ``memory_only`` drops the
CPU dimension: YARN 2.2, on which both LTRF papers ran, scheduled memory alone, and the
papers' fairness figures are in memory.
"""

from __future__ import annotations

import math

import numpy as np

from fairstream.core.model import ResourceSpace, TenantSpec
from fairstream.core.tenants import TenantTree
from fairstream.sim.scenario import Scenario, TaskSpec, uniform_nodes

QUEUES = ("Facebook", "Purdue", "Spark", "TPC-H")

# ICS'14 Table 3 sizes with QKnobler Table 1 demands: (maps, map <cpu, GB>, reduces, reduce <cpu, GB>, jobs)
FACEBOOK_BINS = (
    (1, (1, 1.0), 0, None, 38),
    (2, (1, 1.5), 0, None, 18),
    (10, (2, 0.5), 2, (4, 2.0), 14),
    (50, (4, 1.0), 0, None, 10),
    (100, (2, 1.5), 10, (2, 2.0), 6),
    (200, (3, 2.0), 0, None, 6),
    (400, (2, 1.0), 0, None, 4),
    (400, (1, 2.0), 30, (2, 0.5), 2),
    (800, (2, 0.5), 60, (1, 3.0), 2),
)

# The first 100 inter-arrival gaps (s) of SWIM FB-2009_samples_24_times_1hr_1.tsv, column 3.
SWIM_GAPS = (
    23, 103, 9, 19, 17, 12, 1, 0, 2, 1, 2, 3, 10, 3, 17, 52, 11, 4, 38, 22, 8, 1, 32, 15, 46, 25, 7,
    5, 31, 8, 44, 8, 9, 2, 46, 20, 2, 30, 7, 21, 6, 1, 35, 18, 11, 6, 2, 21, 5, 20, 9, 29, 25, 13, 33,
    11, 6, 56, 28, 10, 42, 29, 23, 16, 13, 49, 39, 6, 56, 6, 10, 11, 18, 1, 15, 3, 13, 1, 8, 1, 1, 0,
    1, 1, 0, 1, 2, 9, 12, 14, 3, 29, 22, 6, 37, 8, 1, 4, 39, 7,
)

PURDUE_JOBS = (("wordcount", 30), ("terasort", 60), ("grep", 1), ("invertedindex", 30), ("histogrammovies", 10))
TPCH_QUERIES = (("q1", 120, 16), ("q9", 160, 24), ("q12", 100, 12), ("q17", 140, 20))


def macro_benchmark(seed: int = 1, weights: tuple[float, ...] = (1, 1, 1, 1), scale: float = 1.0,
                    memory_only: bool = False) -> Scenario:
    rng = np.random.default_rng(seed)
    tasks: list[TaskSpec] = []

    def count(n: int) -> int:
        return max(1, int(math.ceil(n * scale))) if n else 0

    def add_job(queue: str, job: str, submit: float, maps: int, map_demand, map_s, reduces=0, reduce_demand=None,
                reduce_s=(0, 0), after: str | None = None, delay: float = 0.0) -> None:
        for k in range(count(maps)):
            tasks.append(TaskSpec(f"{job}-m{k}", job, queue, submit, round(float(rng.uniform(*map_s)), 2),
                                  {"cpu": float(map_demand[0]), "mem": float(map_demand[1])}, after_job=after, delay=delay))
        for k in range(count(reduces)):
            tasks.append(TaskSpec(f"{job}-r{k}", job, queue, submit, round(float(rng.uniform(*reduce_s)), 2),
                                  {"cpu": float(reduce_demand[0]), "mem": float(reduce_demand[1])}, stage=1,
                                  after_job=after, delay=delay))

    # Facebook: 100 jobs, bins shuffled with the seed, SWIM arrival gaps.
    bins = [b for b, spec in enumerate(FACEBOOK_BINS) for _ in range(spec[4])]
    rng.shuffle(bins)
    submit = 0.0
    for j, b in enumerate(bins):
        submit += SWIM_GAPS[j]
        maps, map_demand, reduces, reduce_demand, _ = FACEBOOK_BINS[b]
        add_job("Facebook", f"fb{j:03d}-bin{b + 1}", submit, maps, map_demand, (6, 16), reduces, reduce_demand, (20, 40))

    for j, (name, reduces) in enumerate(PURDUE_JOBS):
        add_job("Purdue", f"purdue-{name}", 180.0 * j, 320, (1, 1.0), (20, 40), reduces, (1, 2.0), (60, 120))

    previous = None
    for instance in range(5):
        for name, maps, reduces in TPCH_QUERIES:
            job = f"tpch-{name}-{instance}"
            add_job("TPC-H", job, 0.0, maps, (1, 2.0), (15, 30), reduces, (2, 4.0), (30, 60), after=previous)
            previous = job

    previous = None
    for instance in range(10):
        for name, demand, seconds in (("kmeans", (2, 2.0), (60, 90)), ("als", (1, 2.0), (90, 120))):
            job = f"spark-{name}-{instance}"
            add_job("Spark", job, 0.0, 100, demand, seconds, after=previous, delay=120.0 if previous else 0.0)
            previous = job

    if len(weights) != len(QUEUES):
        raise ValueError(f"weights: need {len(QUEUES)} values, got {len(weights)}")
    tree = TenantTree.from_specs([TenantSpec(q, weight=float(w)) for q, w in zip(QUEUES, weights)])
    capacity = {"cpu": 12.0, "mem": 24.0}
    resources: tuple[str, ...] = ("cpu", "mem")
    if memory_only:
        resources, capacity = ("mem",), {"mem": 24.0}
        for task in tasks:
            task.demand = {"mem": task.demand["mem"]}
    return Scenario(
        ResourceSpace(resources), tree, uniform_nodes(9, capacity), tasks,
        name=f"macro-benchmark(seed={seed}, weights={':'.join(f'{w:g}' for w in weights)}, scale={scale}"
        f"{', memory only' if memory_only else ''})",
    )
