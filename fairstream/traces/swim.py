"""SWIM Facebook 2009 workloads (``FB-2009_samples_24_times_1hr_*.tsv``) as tasks.

The trace gives per job: submit time and bytes read by maps, shuffled, written. It has no task
counts, durations or CPU/memory figures, so we turn bytes into tasks the way Hadoop does:

- one map task per input block of ``block_mb`` MB (64 MB, as SWIM's replay scripts);
  a job always has at least one map;
- one reduce task per ``reduce_gb`` GB of shuffle (1 GB); no shuffle means a map-only job;
- a task runs ``overhead_s`` (3 s) plus its bytes over ``rate_mb_s`` (8 MB/s): a full 64 MB map
  takes 11 s, the Facebook average task time the LTRF paper reports (section 6.5);
  a reduce moves its part of the shuffle and writes its part of the output;
- maps ask <1 cpu, 1 GB>, reduces <1 cpu, 2 GB>; reduces start when all maps finished (stage 1);
- jobs go to ``tenants`` queues round robin by job number (``q0``, ``q1``, ...).

Options: ``limit`` (first N jobs), ``max_tasks_per_job`` (cap the largest jobs, as the LTRF
paper did to fit its cluster), ``nodes``/``node_cpu``/``node_mem`` for the default cluster
(50 nodes of <12 cpu, 24 GB>).
"""

from __future__ import annotations

import math
from pathlib import Path

from fairstream.model import ModelError, ResourceSpace, TenantSpec
from fairstream.scenario import Scenario, TaskSpec
from fairstream.tenants import TenantTree
from fairstream.traces import uniform_nodes

MB = 1024 * 1024


def read_swim(path: str | Path, limit: int | None = None) -> list[tuple[str, float, int, int, int]]:
    """Rows ``(job, submit_s, map_bytes, shuffle_bytes, output_bytes)``; bad lines raise
    ``ModelError`` naming the file and line."""
    rows = []
    try:
        handle = open(path)
    except OSError as exc:
        raise ModelError(f"{path}: cannot read ({exc.strerror})") from None
    with handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            parts = line.rstrip("\n").split("\t")
            if len(parts) != 6:
                raise ModelError(f"{path}:{number}: expected 6 tab-separated columns, got {len(parts)}")
            try:
                rows.append((parts[0], float(parts[1]), int(parts[3]), int(parts[4]), int(parts[5])))
            except ValueError:
                raise ModelError(f"{path}:{number}: submit time and byte counts must be numbers") from None
            if limit is not None and len(rows) >= limit:
                break
    return rows


def load_swim(
    path: str,
    limit: int | None = None,
    tenants: int = 4,
    block_mb: float = 64.0,
    reduce_gb: float = 1.0,
    rate_mb_s: float = 8.0,
    overhead_s: float = 3.0,
    max_tasks_per_job: int | None = None,
    nodes: int = 50,
    node_cpu: float = 12.0,
    node_mem: float = 24.0,
) -> Scenario:
    return swim_scenario(read_swim(path, limit), f"swim:{Path(path).name}", tenants, block_mb, reduce_gb, rate_mb_s,
                         overhead_s, max_tasks_per_job, nodes, node_cpu, node_mem)


def swim_day(paths: list[str], scale: float = 1.0, nodes: int = 50, hours: float | None = None, **options) -> Scenario:
    """One day of SWIM traces played together: the jobs of every file (each spans 24 hours),
    ids prefixed by the file's position (``0-job12``), in submit order, with every byte count
    multiplied by ``scale`` (``scale`` 16 turns the two FB-2009 samples, 12,532 jobs and about
    950,000 tasks, into about 15 million tasks, the largest job 118k x 16 maps). ``hours``
    keeps the jobs submitted in the first that many hours (a shorter history, the same load)."""
    rows = []
    for number, path in enumerate(paths):
        rows += [(f"{number}-{job}", submit, int(m * scale), int(s * scale), int(o * scale))
                 for job, submit, m, s, o in read_swim(path) if hours is None or submit < hours * 3600]
    rows.sort(key=lambda row: row[1])
    return swim_scenario(rows, f"swim-day:{len(paths)} files x{scale:g}", nodes=nodes, **options)


def swim_scenario(rows, name: str, tenants: int = 4, block_mb: float = 64.0, reduce_gb: float = 1.0,
                  rate_mb_s: float = 8.0, overhead_s: float = 3.0, max_tasks_per_job: int | None = None,
                  nodes: int = 50, node_cpu: float = 12.0, node_mem: float = 24.0) -> Scenario:
    """SWIM rows ``(job, submit_s, map_bytes, shuffle_bytes, output_bytes)`` as a scenario."""
    if tenants < 1:
        raise ModelError("tenants: must be >= 1")
    if max_tasks_per_job is not None and max_tasks_per_job < 1:
        raise ModelError(f"max_tasks_per_job: must be >= 1 (got {max_tasks_per_job})")
    block = block_mb * MB
    tasks: list[TaskSpec] = []
    for index, (job, submit, map_bytes, shuffle, output) in enumerate(rows):
        tenant = f"q{index % tenants}"
        maps = max(1, math.ceil(map_bytes / block))
        reduces = math.ceil(shuffle / (reduce_gb * 1024 * MB)) if shuffle > 0 else 0
        if max_tasks_per_job is not None:
            maps = min(maps, max_tasks_per_job)
            reduces = min(reduces, max_tasks_per_job)
        map_written = output / maps if reduces == 0 else 0.0
        # Requests with a count: the maps that read a full block are one request (ids
        # <job>-m-<k>), the last map, which reads the rest, a task of its own; the reduces are
        # one request (<job>-r-<k>).
        if maps > 1:
            seconds = overhead_s + (block + map_written) / (rate_mb_s * MB)
            tasks.append(TaskSpec(f"{job}-m", job, tenant, submit, round(seconds, 3), {"cpu": 1.0, "mem": 1.0},
                                  count=maps - 1))
        rest = max(map_bytes - (maps - 1) * block, 0)
        seconds = overhead_s + (rest + map_written) / (rate_mb_s * MB)
        tasks.append(TaskSpec(f"{job}-m-{maps - 1}", job, tenant, submit, round(seconds, 3), {"cpu": 1.0, "mem": 1.0}))
        if reduces:
            seconds = overhead_s + (shuffle + output) / reduces / (rate_mb_s * MB)
            tasks.append(TaskSpec(f"{job}-r", job, tenant, submit, round(seconds, 3), {"cpu": 1.0, "mem": 2.0}, stage=1,
                                  count=reduces))
    tree = TenantTree.from_specs([TenantSpec(f"q{k}") for k in range(min(tenants, max(len(rows), 1)))])
    return Scenario(
        ResourceSpace(("cpu", "mem")), tree, uniform_nodes(nodes, {"cpu": node_cpu, "mem": node_mem}), tasks,
        name=name,
    )
