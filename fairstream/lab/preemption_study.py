"""``fairstream compare-preemption``: policies with and without preemption on workloads where
tenants arrive to a busy cluster (issue "Preemption toward fair share", its evaluation).

Workloads (``fairstream/sim/traces/late_tenants.py``): ``philly``, run times drawn from the
Microsoft Philly job log, and ``long-tasks``, run times of 1 to 8 hours. In both, ``vc0`` fills
32 nodes of 8 GPUs at t = 0 with a backlog and ``vc1``, ``vc2``, ``vc3`` arrive three hours apart,
each with a burst of 100 jobs. Each workload is drawn with every seed in ``seeds``.

Each policy runs without preemption and with it at every timeout in ``timeouts`` (threshold
``threshold``). Per run: each tenant's time to fair share (``MetricsRecorder``), preemptions,
work lost (task-seconds, and as a percentage of the workload's task-seconds), makespan and mean
job completion time (over all jobs, and per tenant). Every run is an ordinary simulation
(no Kafka, no Redis), in worker processes, one per core. The table gives, per setting, the mean
over the seeds and the range (min-max). Writes ``study.json`` (every run), ``table.md``,
``table.csv`` and the figures (``sim/plots.py``: ``preemption_figures``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fairstream.sim.traces.late_tenants import DEFAULT_PHILLY

WORKLOADS = ("philly", "long-tasks")
#: Allocation series kept per run for the figures: the first ``SERIES_HOURS`` of event time, in
#: at most ``SERIES_POINTS`` samples.
SERIES_HOURS = 10
SERIES_POINTS = 600
SAMPLE_S = 60.0

FIELDS = ("workload", "policy", "preemption", "timeout", "threshold", "seeds", "late_ttfs_mean", "late_ttfs_max",
          "preemptions", "work_lost", "work_lost_pct", "makespan", "mean_jct", "mean_jct_vc0", "mean_jct_late")
#: The figures averaged over seeds (the others name the setting).
MEASURED = FIELDS[6:]


@dataclass(frozen=True)
class Setting:
    """One simulation: a workload, a policy and its preemption (None: off)."""

    workload: str
    policy: str
    timeout: float | None
    threshold: float = 0.5
    seed: int = 1
    trace: str = str(DEFAULT_PHILLY)

    @property
    def label(self) -> str:
        return f"{self.policy}, off" if self.timeout is None else f"{self.policy}, on {self.timeout:g} s"

    def params(self) -> dict[str, str]:
        params = {"resource": "gpu"} if self.policy not in ("drf",) else {}
        if self.timeout is not None:
            params.update(preemption="on", preemption_timeout=f"{self.timeout:g}",
                          preemption_threshold=f"{self.threshold:g}")
        return params


def build_scenario(setting: Setting):
    from fairstream.sim.traces.late_tenants import late_tenants, read_runtimes

    if setting.workload == "philly":
        return late_tenants(read_runtimes(setting.trace), name="philly", seed=setting.seed)
    return late_tenants(None, name="long-tasks", seed=setting.seed)


def _early(times: list[float], values: list[float]) -> tuple[list, list]:
    """The samples of the first ``SERIES_HOURS``, at most ``SERIES_POINTS`` of them."""
    keep = sum(1 for t in times if t <= SERIES_HOURS * 3600)
    step = max(1, keep // SERIES_POINTS)
    return times[:keep:step], values[:keep:step]


def simulate(setting: Setting) -> dict:
    """Run one setting; its row, with per-tenant figures and allocation series."""
    from fairstream.sim.metrics import job_statistics
    from fairstream.sim.simulator import Simulator

    scenario = build_scenario(setting)
    work = sum(spec.tasks * spec.duration for spec in scenario.tasks)
    # Samples a minute apart: the figures show the first hours, whatever the run's length.
    result = Simulator(scenario, setting.policy, setting.params(), on_decision=lambda decision: None,
                       sample_interval=SAMPLE_S).run()
    summary = result.summary()
    jobs, _ = job_statistics(result.jobs)
    tenants = summary["tenants"]
    late = [name for name in tenants if name != "vc0"]
    ttfs = [tenants[name]["time_to_fair_share"] for name in late]

    def mean_jct(names) -> float | None:
        values = [job["completion_time"] for job in jobs.values() if job["tenant"] in names and job["done"]]
        return float(np.mean(values)) if values else None

    # A late tenant that never reached its share counts as the whole run (an upper bound).
    ttfs = [t if t is not None else summary["makespan"] for t in ttfs]
    return {
        "workload": setting.workload, "policy": setting.policy, "label": setting.label, "seed": setting.seed,
        "preemption": "off" if setting.timeout is None else "on", "timeout": setting.timeout,
        "threshold": setting.threshold if setting.timeout is not None else None,
        "late_ttfs_mean": float(np.mean(ttfs)) if ttfs else None, "late_ttfs_max": max(ttfs) if ttfs else None,
        "preemptions": summary["preemptions"], "work_lost": summary["work_lost"],
        "work_lost_pct": 100.0 * summary["work_lost"] / work if work else 0.0,
        "makespan": summary["makespan"], "mean_jct": mean_jct(set(tenants)), "mean_jct_vc0": mean_jct({"vc0"}),
        "mean_jct_late": mean_jct(set(late)),
        "tenants": {name: {key: tenants[name].get(key) for key in
                           ("time_to_fair_share", "preemptions", "work_lost", "mean_jct", "makespan")}
                    for name in tenants},
        "allocation": {name: {**dict(zip(("time", "g"), _early(series.time, series.g))),
                              "arrival": next((t for t, d in zip(series.time, series.d) if d > 0), None)}
                       for name, series in result.metrics.series.items()},
    }


def plan(workloads: list[str], policies: list[str], timeouts: list[float], threshold: float, seeds: list[int],
         trace: str) -> list[Setting]:
    return [Setting(workload, policy, timeout, threshold, seed, trace)
            for workload in workloads for policy in policies for timeout in [None, *timeouts] for seed in seeds]


def aggregate(rows: list[dict]) -> list[dict]:
    """One row per setting (workload, policy, preemption): the mean over its seeds of every
    measured figure, its range as ``<field>_range`` (min, max), and per tenant the mean time
    to fair share; the first seed's allocation series."""
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault((row["workload"], row["label"]), []).append(row)
    merged = []
    for runs in groups.values():
        first = runs[0]
        row = {k: first[k] for k in ("workload", "policy", "label", "preemption", "timeout", "threshold")}
        row["seeds"] = len(runs)
        row["seed_list"] = [r["seed"] for r in runs]
        for key in MEASURED:
            values = [r[key] for r in runs if r[key] is not None]
            row[key] = float(np.mean(values)) if values else None
            row[f"{key}_range"] = (min(values), max(values)) if values else None
        row["tenants"] = {name: {"time_to_fair_share": float(np.mean([r["tenants"][name]["time_to_fair_share"]
                                                                       or r["makespan"] for r in runs]))}
                          for name in first["tenants"]}
        row["allocation"] = first["allocation"]
        merged.append(row)
    return merged


def study(out: Path, workloads: list[str], policies: list[str], timeouts: list[float], threshold: float = 0.5,
          seeds: Sequence[int] = (1, 2, 3), trace: str = str(DEFAULT_PHILLY), workers: int | None = None,
          progress: bool | None = None) -> dict:
    """Run every setting of ``plan`` and write the study (module docstring); returns it."""
    from fairstream.core.model import ModelError
    from fairstream.lab.parallel import run_all
    from fairstream.policies import REGISTRY
    from fairstream.sim.plots import preemption_figures
    from fairstream.sim.traces.late_tenants import read_runtimes

    unknown = [w for w in workloads if w not in WORKLOADS]
    if unknown or not workloads:
        raise ModelError(f"--workloads {','.join(unknown)}: unknown workload (known: {', '.join(WORKLOADS)})")
    preempting = [name for name, spec in REGISTRY.items() if "preemption" in {p.name for p in spec.params}]
    for policy in policies or [""]:
        if policy not in preempting:
            raise ModelError(f"--policies {policy}: not a policy with preemption (those: {', '.join(preempting)})")
    if any(not t >= 0 for t in timeouts):
        raise ModelError("--timeouts: seconds must be >= 0")
    if not 0 < threshold <= 1:
        raise ModelError(f"--threshold {threshold:g}: must be in (0, 1]")
    if not seeds:
        raise ModelError("--seeds: give at least one seed")
    if "philly" in workloads:
        read_runtimes(trace)  # a bad file is one line now, not a traceback from a worker process
    out.mkdir(parents=True, exist_ok=True)
    runs = run_all(simulate, plan(workloads, policies, timeouts, threshold, list(seeds), trace), workers, progress,
                   desc="simulating")
    rows = aggregate(runs)
    document = {"workloads": workloads, "policies": policies, "timeouts": timeouts, "threshold": threshold,
                "seeds": list(seeds), "rows": rows, "runs": runs}
    (out / "study.json").write_text(json.dumps(document, indent=1))
    write_tables(rows, out)
    document["figures"] = [str(p) for p in preemption_figures(rows, out)]
    return document


def write_tables(rows: list[dict], out: Path) -> None:
    from fairstream.sim.output import write_csv

    write_csv(rows, FIELDS, out / "table.csv")

    def cell(value, digits: int = 0) -> str:
        if value is None:
            return "-"
        return f"{value:,.{digits}f}" if isinstance(value, float) else f"{value:,}"

    def spread(row: dict, key: str, digits: int = 0) -> str:
        low, high = row[f"{key}_range"] or (None, None)
        if low is None or high is None or row["seeds"] == 1 or round(low, digits) == round(high, digits):
            return cell(row[key], digits)
        return f"{cell(row[key], digits)} ({cell(low, digits)}-{cell(high, digits)})"

    header = ("| workload | policy, preemption | late tenants' time to fair share (s) | preemptions "
              "| work lost (% of the work) | makespan (s) | mean JCT (s) | mean JCT, vc0 / late (s) |")
    lines = [header, "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['workload']} | {r['label']} | {spread(r, 'late_ttfs_mean')} | {spread(r, 'preemptions')} "
                     f"| {spread(r, 'work_lost_pct', 2)} | {cell(r['makespan'])} | {cell(r['mean_jct'])} "
                     f"| {cell(r['mean_jct_vc0'])} / {cell(r['mean_jct_late'])} |")
    (out / "table.md").write_text("\n".join(lines) + "\n")


__all__ = ["Setting", "plan", "simulate", "aggregate", "study", "WORKLOADS"]
