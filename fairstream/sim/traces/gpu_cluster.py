"""A large shared GPU cluster over a day, seeded: the second workload of ``fairstream bench
spread`` (issue 64), of the shape of the public GPU cluster trace a user measured us on (8,152
pods on 1,523 nodes, fractional GPU requests). The numbers are ours, not the trace's.

Nodes (``nodes``, 1,523 by default), by share of the cluster:

| share | GPUs | cpu | mem (GB) |
|---:|---:|---:|---:|
| 70 % | 8 | 96 | 768 |
| 10 % | 4 | 64 | 512 |
| 6 % | 2 | 32 | 256 |
| 4 % | 1 | 16 | 128 |
| 10 % | 0 | 96 | 384 |

Pods (``pods``, 8,152 by default), each one task of its own job: 15 % ask for no GPU (4-32 cpu,
8-128 GB); 35 % for a fraction of one (0.1, 0.2, 0.25, 0.3, 0.5, 0.6 or 0.75 of a GPU, 2-8 cpu,
8-32 GB: GPU sharing); 40 % for one GPU, 5 % two, 3 % four, 2 % eight (8 cpu and 64 GB per
GPU). 40 % are there at the start (a cluster already running), the rest arrive over
``hours``, more by day than by night. Run times are log-normal, a median of 4 hours, at most
36. ``tenants`` teams, the first ones busier (Zipf, exponent 1.2), pod k of its team's job
``<team>-j<k>``.
"""

from __future__ import annotations

import numpy as np

from fairstream.core.model import ResourceSpace, TenantSpec
from fairstream.core.tenants import TenantTree
from fairstream.sim.scenario import NodeSpec, Scenario, TaskSpec

NODE_TYPES = [  # (share of nodes, capacity)
    (0.70, {"cpu": 96.0, "mem": 768.0, "gpu": 8.0}),
    (0.10, {"cpu": 64.0, "mem": 512.0, "gpu": 4.0}),
    (0.06, {"cpu": 32.0, "mem": 256.0, "gpu": 2.0}),
    (0.04, {"cpu": 16.0, "mem": 128.0, "gpu": 1.0}),
    (0.10, {"cpu": 96.0, "mem": 384.0, "gpu": 0.0}),
]
FRACTIONS = [0.1, 0.2, 0.25, 0.3, 0.5, 0.6, 0.75]
POD_KINDS: list[tuple[str, int, float]] = [  # (kind, whole GPUs, share of pods)
    ("cpu", 0, 0.15), ("fraction", 0, 0.35), ("whole", 1, 0.40), ("whole", 2, 0.05), ("whole", 4, 0.03),
    ("whole", 8, 0.02)]


def gpu_cluster(seed: int = 1, nodes: int = 1523, pods: int = 8152, tenants: int = 24,
                hours: float = 24.0) -> Scenario:
    """The workload (module docstring) as a ``Scenario``: the same for the same arguments."""
    rng = np.random.default_rng(seed)
    shares = np.array([share for share, _ in NODE_TYPES])
    counts = np.floor(shares * nodes).astype(int)
    counts[0] += nodes - int(counts.sum())  # (the rounding's rest: 8-GPU nodes)
    kinds = np.repeat(np.arange(len(NODE_TYPES)), counts)
    rng.shuffle(kinds)  # (mixed along the node order, as racks of a real cluster are)
    width = len(str(nodes - 1))
    node_specs = [NodeSpec(f"g{k:0{width}d}", dict(NODE_TYPES[kind][1])) for k, kind in enumerate(kinds.tolist())]

    weights = 1.0 / np.arange(1, tenants + 1) ** 1.2
    teams = rng.choice(tenants, size=pods, p=weights / weights.sum())
    kind = rng.choice(len(POD_KINDS), size=pods, p=[p for _, _, p in POD_KINDS])
    at_start = rng.random(pods) < 0.4
    # Arrivals over the day: more by day (a sine over 24 h, twice as many at its peak as at night).
    day = hours * 3600.0
    drawn = rng.uniform(0.0, day, pods * 3)
    keep = rng.random(pods * 3) < (2.0 + np.sin(2 * np.pi * drawn / 86400.0 - np.pi / 2)) / 3.0
    arrivals = np.sort(drawn[keep][:pods])
    arrivals = np.concatenate([arrivals, rng.uniform(0.0, day, max(0, pods - len(arrivals)))])
    durations = np.minimum(np.exp(rng.normal(np.log(4 * 3600.0), 1.0, pods)), 36 * 3600.0)

    specs: list[TaskSpec] = []
    per_team = [0] * tenants
    for k in range(pods):
        team = int(teams[k])
        what, whole, _ = POD_KINDS[int(kind[k])]
        if what == "cpu":
            demand = {"cpu": float(rng.integers(4, 33)), "mem": float(rng.integers(8, 129)), "gpu": 0.0}
        elif what == "fraction":
            demand = {"cpu": float(rng.integers(2, 9)), "mem": float(rng.integers(8, 33)),
                      "gpu": float(FRACTIONS[int(rng.integers(len(FRACTIONS)))])}
        else:
            demand = {"cpu": 8.0 * whole, "mem": 64.0 * whole, "gpu": float(whole)}
        name = f"t{team:02d}"
        job = f"{name}-j{per_team[team]}"
        per_team[team] += 1
        submit = 0.0 if at_start[k] else round(float(arrivals[k]), 3)
        specs.append(TaskSpec(job, job, name, submit, round(float(durations[k]), 3), demand))
    specs.sort(key=lambda spec: spec.submit)
    tree = TenantTree.from_specs([TenantSpec(f"t{k:02d}") for k in range(tenants)])
    return Scenario(ResourceSpace(("cpu", "mem", "gpu")), tree, node_specs, specs,
                    name=f"gpu-cluster:{nodes}n-{pods}p-{tenants}t")


__all__ = ["gpu_cluster"]
