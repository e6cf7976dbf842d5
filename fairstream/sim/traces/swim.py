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

import heapq
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from fairstream.core.model import ModelError, ResourceSpace, TenantSpec
from fairstream.core.tenants import TenantTree
from fairstream.sim.scenario import Scenario, TaskSpec, uniform_nodes
from fairstream.sim.traces.files import open_text

MB = 1024 * 1024


def iter_swim(path: str | Path, limit: int | None = None) -> Iterator[tuple[str, float, int, int, int]]:
    """Rows ``(job, submit_s, map_bytes, shuffle_bytes, output_bytes)``, read as they are asked
    for; bad lines raise ``ModelError`` naming the file and line."""
    handle = open_text(path)
    rows = 0
    with handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            parts = line.rstrip("\n").split("\t")
            if len(parts) != 6:
                raise ModelError(f"{path}:{number}: expected 6 tab-separated columns, got {len(parts)}")
            try:
                row = (parts[0], float(parts[1]), int(parts[3]), int(parts[4]), int(parts[5]))
            except ValueError:
                raise ModelError(f"{path}:{number}: submit time and byte counts must be numbers") from None
            yield row
            rows += 1
            if limit is not None and rows >= limit:
                return


def read_swim(path: str | Path, limit: int | None = None) -> list[tuple[str, float, int, int, int]]:
    """``iter_swim``'s rows as a list."""
    return list(iter_swim(path, limit))


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
    """The trace as a scenario whose workload is read from the file as the simulation reaches
    it (``SwimWorkload``); the file is checked whole first, so a bad line is one error at once."""
    sizing = _Sizing(block_mb, reduce_gb, rate_mb_s, overhead_s, max_tasks_per_job, tenants)
    return _scenario(SwimWorkload([str(path)], sizing, limit=limit), f"swim:{Path(path).name}", sizing, nodes,
                     node_cpu, node_mem)


def swim_day(paths: list[str], scale: float = 1.0, nodes: int = 50, hours: float | None = None,
             tenants: int = 4, max_tasks_per_job: int | None = None, node_cpu: float = 12.0,
             node_mem: float = 24.0) -> Scenario:
    """One day of SWIM traces played together: the jobs of every file (each spans 24 hours),
    ids prefixed by the file's position (``0-job12``), merged in submit order, with every byte
    count multiplied by ``scale`` (``scale`` 16 turns the two FB-2009 samples, 12,532 jobs and
    about 950,000 tasks, into about 15 million tasks, the largest job 118k x 16 maps). ``hours``
    keeps the jobs submitted in the first that many hours (a shorter history, the same load).
    Read lazily, as ``load_swim``."""
    sizing = _Sizing(max_tasks_per_job=max_tasks_per_job, tenants=tenants)
    workload = SwimWorkload([str(p) for p in paths], sizing, scale=scale, hours=hours)
    return _scenario(workload, f"swim-day:{len(paths)} files x{scale:g}", sizing, nodes, node_cpu, node_mem)


@dataclass(frozen=True)
class _Sizing:
    """How bytes become tasks (the module docstring's table)."""

    block_mb: float = 64.0
    reduce_gb: float = 1.0
    rate_mb_s: float = 8.0
    overhead_s: float = 3.0
    max_tasks_per_job: int | None = None
    tenants: int = 4

    def check(self) -> None:
        if self.tenants < 1:
            raise ModelError("tenants: must be >= 1")
        if self.max_tasks_per_job is not None and self.max_tasks_per_job < 1:
            raise ModelError(f"max_tasks_per_job: must be >= 1 (got {self.max_tasks_per_job})")

    def job(self, index: int, row: tuple[str, float, int, int, int]) -> list[TaskSpec]:
        """The requests of job ``index`` of the trace: the maps that read a full block are one
        request (ids ``<job>-m-<k>``), the last map, which reads the rest, a task of its own,
        and the reduces one request (``<job>-r-<k>``)."""
        job, submit, map_bytes, shuffle, output = row
        tenant = f"q{index % self.tenants}"
        block = self.block_mb * MB
        rate = self.rate_mb_s * MB
        maps = max(1, math.ceil(map_bytes / block))
        reduces = math.ceil(shuffle / (self.reduce_gb * 1024 * MB)) if shuffle > 0 else 0
        if self.max_tasks_per_job is not None:
            maps = min(maps, self.max_tasks_per_job)
            reduces = min(reduces, self.max_tasks_per_job)
        map_written = output / maps if reduces == 0 else 0.0
        specs = []
        if maps > 1:
            seconds = self.overhead_s + (block + map_written) / rate
            specs.append(TaskSpec(f"{job}-m", job, tenant, submit, round(seconds, 3), {"cpu": 1.0, "mem": 1.0},
                                  count=maps - 1))
        rest = max(map_bytes - (maps - 1) * block, 0)
        seconds = self.overhead_s + (rest + map_written) / rate
        specs.append(TaskSpec(f"{job}-m-{maps - 1}", job, tenant, submit, round(seconds, 3), {"cpu": 1.0, "mem": 1.0}))
        if reduces:
            seconds = self.overhead_s + (shuffle + output) / reduces / rate
            specs.append(TaskSpec(f"{job}-r", job, tenant, submit, round(seconds, 3), {"cpu": 1.0, "mem": 2.0},
                                  stage=1, count=reduces))
        return specs


class SwimWorkload:
    """A SWIM workload read as it is iterated: jobs in submit order (files merged), each as its
    requests (``_Sizing.job``), so a day-long trace is never in memory at once. Iterable again
    (each pass reads the files again); ``jobs`` is counted, and every line checked, up front."""

    def __init__(self, paths: list[str], sizing: _Sizing, limit: int | None = None, scale: float = 1.0,
                 hours: float | None = None) -> None:
        sizing.check()
        self.paths, self.sizing, self.limit, self.scale, self.hours = paths, sizing, limit, scale, hours
        self.jobs = sum(1 for _ in self._rows())

    def _rows(self) -> Iterator[tuple[str, float, int, int, int]]:
        scale, hours = self.scale, self.hours
        if len(self.paths) == 1 and scale == 1:
            rows = iter_swim(self.paths[0], self.limit)
        else:
            def scaled(number: int, path: str):
                for job, submit, m, s, o in iter_swim(path):
                    yield f"{number}-{job}", submit, int(m * scale), int(s * scale), int(o * scale)

            rows = heapq.merge(*(scaled(n, p) for n, p in enumerate(self.paths)), key=lambda row: row[1])
        for row in rows:
            if hours is not None and row[1] >= hours * 3600:
                continue
            yield row

    def __iter__(self) -> Iterator[TaskSpec]:
        for index, row in enumerate(self._rows()):
            yield from self.sizing.job(index, row)


def _scenario(workload: SwimWorkload, name: str, sizing: _Sizing, nodes: int, node_cpu: float,
              node_mem: float) -> Scenario:
    tree = TenantTree.from_specs([TenantSpec(f"q{k}") for k in range(min(sizing.tenants, max(workload.jobs, 1)))])
    return Scenario(ResourceSpace(("cpu", "mem")), tree, uniform_nodes(nodes, {"cpu": node_cpu, "mem": node_mem}),
                    workload, name=name)
