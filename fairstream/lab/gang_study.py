"""``fairstream compare-gangs``: the same workload with its distributed jobs as gangs and not
(issue 62, its evaluation; docs/workloads.md, "Gangs").

Workload: ``philly`` (``fairstream/sim/traces/late_tenants.py``): Philly run times, ``vc0``'s
backlog on 32 nodes of 8 GPUs, three tenants arriving three hours apart; a job of 2, 4 or 8
GPUs is a request of that many 1-GPU tasks, a gang with ``gangs`` on. Each policy runs with
gangs off and on, for every seed, with preemption off, or on at ``timeout`` seconds (threshold
0.5: the preemption study's; a gang is preempted whole or not at all, docs/preemption.md).

Per run: GPU utilisation over the first ``WINDOW_H`` hours (while ``vc0``'s backlog waits and
the others arrive: over the whole run, Philly's tail of jobs of weeks makes every policy's a few
per cent), mean job completion time (all jobs, and the multi-GPU ones), the
late tenants' mean time to their fair share, makespan, and the GPU-hours that multi-GPU jobs
held idle while they waited for the rest of their tasks to start: for each such job, each task
counts from its start to the start of the job's last task (with gangs on this is 0 by
construction). With preemption on, a task may start several times: those two are not measured
then, and the table gives the preemptions and the work they lost instead. Writes ``study.json`` and ``table.md``; the table gives the mean over the seeds
and the range.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fairstream.sim.traces.late_tenants import DEFAULT_PHILLY

POLICIES = ("ltrf", "hltrf", "drf", "fair")
WINDOW_H = 12.0
MEASURED = ("gpu_utilisation", "mean_jct", "mean_jct_multi", "late_ttfs_mean", "makespan", "partial_idle_gpu_hours",
            "preemptions", "work_lost_pct")


@dataclass(frozen=True)
class Setting:
    policy: str
    gangs: bool
    seed: int = 1
    trace: str = str(DEFAULT_PHILLY)
    limit: int | None = None  # jobs per late tenant (the backlog ten times that); None: 100
    timeout: float | None = None  # preemption on at this timeout (None: off)


def simulate(setting: Setting) -> dict:
    """Run one setting; its row."""
    from fairstream.sim.metrics import job_statistics
    from fairstream.sim.simulator import Simulator
    from fairstream.sim.traces.late_tenants import load_philly

    scenario = load_philly(setting.trace, seed=setting.seed, limit=setting.limit, gangs=setting.gangs)
    workers = {spec.job: spec.tasks for spec in scenario.tasks}
    work = sum(spec.tasks * spec.duration for spec in scenario.tasks)
    durations = {spec.job: spec.duration for spec in scenario.tasks}
    starts: dict[str, list[float]] = {}  # per job, its tasks' starts (preemption is off: one each)

    def seen(decision) -> None:
        if decision.kind.value == "place":
            starts.setdefault(decision.job, []).extend([decision.time] * len(decision.task_ids))

    params = {"resource": "gpu"} if setting.policy != "drf" else {}
    if setting.timeout is not None:
        params |= {"preemption": "on", "preemption_timeout": f"{setting.timeout:g}", "preemption_threshold": "0.5"}
    result = Simulator(scenario, setting.policy, params, on_decision=seen).run()
    summary = result.summary()
    jobs, _ = job_statistics(result.jobs)
    tenants = summary["tenants"]
    late = [name for name in tenants if name != "vc0"]
    ttfs = [tenants[name]["time_to_fair_share"] or summary["makespan"] for name in late]
    idle = sum(max(times) - t for job, times in starts.items() if workers[job] > 1 for t in times)  # 1 GPU a task
    window = WINDOW_H * 3600.0
    busy = sum(max(0.0, min(t + durations[job], window) - t) for job, times in starts.items() for t in times
               if t < window)
    gpus = sum(node.capacity.get("gpu", 0.0) for node in scenario.nodes)

    def mean_jct(multi: bool) -> float | None:
        values = [job["completion_time"] for name, job in jobs.items()
                  if job["done"] and (not multi or workers.get(name, 1) > 1)]
        return float(np.mean(values)) if values else None

    # (Both read each task's one start: with preemption a task may start several times, so
    # neither is measured then.)
    measured = setting.timeout is None
    return {"policy": setting.policy, "gangs": "on" if setting.gangs else "off", "seed": setting.seed,
            "gpu_utilisation": busy / (gpus * window) if measured else None, "mean_jct": mean_jct(False),
            "mean_jct_multi": mean_jct(True), "late_ttfs_mean": float(np.mean(ttfs)) if ttfs else None,
            "makespan": summary["makespan"], "partial_idle_gpu_hours": idle / 3600.0 if measured else None,
            "unfinished_tasks": summary["unfinished_tasks"], "preemptions": summary["preemptions"],
            "work_lost_pct": 100.0 * summary["work_lost"] / work if work else 0.0}


def aggregate(runs: list[dict]) -> list[dict]:
    """One row per (policy, gangs): the mean over the seeds of every measured figure, and its
    range as ``<field>_range``."""
    groups: dict[tuple, list[dict]] = {}
    for run in runs:
        groups.setdefault((run["policy"], run["gangs"]), []).append(run)
    rows = []
    for (policy, gangs), group in groups.items():
        row: dict = {"policy": policy, "gangs": gangs, "seeds": len(group)}
        for key in MEASURED:
            values = [r[key] for r in group if r[key] is not None]
            row[key] = float(np.mean(values)) if values else None
            row[f"{key}_range"] = (min(values), max(values)) if values else None
        rows.append(row)
    return rows


def table(rows: list[dict]) -> str:
    """The markdown table: per policy, gangs off then on."""
    def cell(row: dict, key: str, scale: float = 1.0, digits: int = 0) -> str:
        value, spread = row[key], row[f"{key}_range"]
        if value is None:
            return "-"
        text = f"{value / scale:,.{digits}f}"
        if row["seeds"] > 1 and spread is not None and round(spread[0] / scale, digits) != round(spread[1] / scale, digits):
            text += f" ({spread[0] / scale:,.{digits}f}-{spread[1] / scale:,.{digits}f})"
        return text

    lines = [f"| policy | gangs | GPU utilisation, first {WINDOW_H:g} h | mean JCT (h) | mean JCT, multi-GPU jobs (h) | late tenants' time "
             "to fair share (h) | makespan (h) | GPU-hours held idle by jobs partly started | preemptions | "
             "work lost (%) |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        percent = " %" if row["gpu_utilisation"] is not None else ""
        lines.append(f"| {row['policy']} | {row['gangs']} | {cell(row, 'gpu_utilisation', 0.01, 1)}{percent} | "
                     f"{cell(row, 'mean_jct', 3600, 2)} | {cell(row, 'mean_jct_multi', 3600, 2)} | "
                     f"{cell(row, 'late_ttfs_mean', 3600, 2)} | {cell(row, 'makespan', 3600, 1)} | "
                     f"{cell(row, 'partial_idle_gpu_hours', 1, 0)} | {cell(row, 'preemptions', 1, 0)} | "
                     f"{cell(row, 'work_lost_pct', 1, 2)} |")
    return "\n".join(lines) + "\n"


def study(out: Path, policies: Sequence[str] = POLICIES, seeds: Sequence[int] = (1, 2, 3),
          trace: str = str(DEFAULT_PHILLY), limit: int | None = None, workers: int | None = None,
          progress: bool | None = None, timeout: float | None = None) -> dict:
    """Run every (policy, gangs, seed) and write the study (module docstring); returns it."""
    from fairstream.core.model import ModelError
    from fairstream.lab.parallel import run_all
    from fairstream.policies import REGISTRY
    from fairstream.sim.traces.late_tenants import read_runtimes

    for policy in policies:
        if policy not in REGISTRY:
            raise ModelError(f"--policies {policy}: unknown policy (known: {', '.join(REGISTRY)})")
    if not seeds or not policies:
        raise ModelError("--seeds and --policies: give at least one")
    read_runtimes(trace)  # a bad file is one line now, not a traceback from a worker process
    if timeout is not None and not timeout >= 0:
        raise ModelError(f"--timeout {timeout:g}: seconds must be >= 0")
    plan = [Setting(policy, gangs, seed, trace, limit, timeout) for policy in policies for gangs in (False, True)
            for seed in seeds]
    runs = run_all(simulate, plan, workers, progress, desc="simulating")
    rows = aggregate(runs)
    out.mkdir(parents=True, exist_ok=True)
    document = {"policies": list(policies), "seeds": list(seeds), "limit": limit, "timeout": timeout, "rows": rows,
                "runs": runs}
    (out / "study.json").write_text(json.dumps(document, indent=1))
    (out / "table.md").write_text(table(rows))
    return document


__all__ = ["POLICIES", "Setting", "aggregate", "simulate", "study", "table"]
