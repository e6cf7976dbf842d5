"""``fairstream sweep``: policies and knob values over one workload, as a table and plots.

Two workloads, after the QKnobler paper's evaluation (section 7):

- ``macro``: the four-queue macro-benchmark (``traces/macro.py``) with weights 1:2:3:4 as in
  section 7.2.1. Figure 6: QKnobler's makespan speedup over rho = 1 and its soft fairness
  (measured, and Theorem 1's theta) against rho. Figure 7: makespan speedup over static
  partitioning of DRF, Tetris (f = knob) and QKnobler (rho = knob).
- ``google``: the real Google 2011 sample (``traces/google.py``) with CPU, memory and disk, the
  first ``users`` users on ``nodes`` machines of <0.5, 0.5, 0.5>. Figure 8: QKnobler's speedup
  over rho = 1 and soft fairness against rho, at 100 users. Figure 9: speedup over static against the number
  of users, Tetris and QKnobler at knob 0.2.

The policies compared (Figures 7 and 9) are the paper's, DRF, Tetris and QKnobler, unless
``policies`` names others: any registered policy; those with a knob parameter (``KNOBS``) are
run at every knob value, the others once, and ``static`` always runs as the speedup baseline.

Every run is an ordinary simulation (the engine, no Kafka, no Redis); runs go to worker
processes, one per core. Writes ``sweep.json``, ``table.md``, ``table.csv`` and PNG figures.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import cast

# The knob parameter of the policies that have one (the paper's two).
KNOBS = {"qknobler": "rho", "tetris": "f"}
PAPER_POLICIES = ("drf", "tetris", "qknobler")

FIELDS = ("figure", "workload", "users", "policy", "knob", "makespan", "mean_jct", "speedup", "soft_fairness_mean",
          "soft_fairness_max", "theta", "util_cpu", "util_mem")


@dataclass(frozen=True)
class Run:
    """One simulation: a workload, a policy and its knob."""

    workload: str  # "macro" or "google"
    policy: str
    knob: float | None
    users: int | None = None
    options: tuple = ()  # workload options as (name, value) pairs

    def params(self) -> dict[str, str]:
        if self.knob is None:
            return {}
        return {KNOBS[self.policy]: str(self.knob)}


def build_scenario(run: Run):
    options = dict(run.options)
    if run.workload == "macro":
        from fairstream.sim.traces.macro import macro_benchmark

        return macro_benchmark(seed=options.get("seed", 1), weights=(1, 2, 3, 4), scale=options.get("scale", 1.0))
    from fairstream.sim.traces.google import load_google

    return load_google(options["trace"], users=run.users, nodes=options.get("nodes", 1000), disk=True,
                       limit=options.get("limit"))


def simulate(run: Run) -> dict:
    """Run one simulation and return its row (without speedup, which needs the others)."""
    import numpy as np

    from fairstream.lab.theory import knob_theory
    from fairstream.sim.simulator import Simulator

    scenario = build_scenario(run)
    result = Simulator(scenario, run.policy, run.params()).run()
    summary = result.summary()
    jcts = [t["mean_jct"] for t in summary["tenants"].values() if t.get("mean_jct") is not None]
    theta = None
    if run.policy == "qknobler":
        knob = cast(float, run.knob)  # (qknobler's runs have one)
        theta = knob_theory(scenario, [knob])["theta"][f"{knob:g}"]
    return {
        "workload": run.workload, "users": run.users or len(scenario.tree.effective_share), "policy": run.policy,
        "knob": run.knob, "makespan": summary["makespan"], "mean_jct": float(np.mean(jcts)) if jcts else None,
        "soft_fairness_mean": summary["soft_fairness"]["mean"], "soft_fairness_max": summary["soft_fairness"]["max"],
        "theta": theta, "util_cpu": summary["utilisation"].get("cpu"), "util_mem": summary["utilisation"].get("mem"),
    }


def plan(workload: str, knobs: list[float], users: list[int], options: dict,
         policies: tuple[str, ...] = PAPER_POLICIES) -> list[tuple[str, Run]]:
    """(figure, run) pairs; a run shared by two figures is listed once per figure. Figure 6/8
    (QKnobler against its knob) when QKnobler is among ``policies``, at 100 users (the paper's)
    if that is among ``users``, else the largest count. Figure 7/9: ``static`` and every policy,
    a knob policy at every knob (macro) or at 0.2 (google, as the paper's Figure 9)."""
    opts = tuple(sorted(options.items()))
    first = (100 if 100 in users else max(users)) if users else None
    fig_knob, fig_policies = ("fig6", "fig7") if workload == "macro" else ("fig8", "fig9")
    compared = ["static"] + [p for p in dict.fromkeys(policies) if p != "static"]
    runs = [(fig_knob, Run(workload, "qknobler", k, first, opts)) for k in knobs] if "qknobler" in compared else []
    counts: list[int | None] = list(users) if workload == "google" else [None]
    for count in counts:
        for policy in compared:
            policy_knobs: list[float | None] = ([0.2] if workload == "google" else list(knobs)) if policy in KNOBS else [None]
            runs += [(fig_policies, Run(workload, policy, knob, count, opts)) for knob in policy_knobs]
    return runs


def sweep(workload: str, knobs: list[float], users: list[int], options: dict, out: Path,
          workers: int | None = None, progress: bool | None = None, policies: tuple[str, ...] = PAPER_POLICIES) -> dict:
    from fairstream.core.model import ModelError
    from fairstream.lab.parallel import run_all
    from fairstream.policies import REGISTRY

    unknown = [p for p in policies if p not in REGISTRY]
    if unknown:  # one line, before any run starts
        raise ModelError(f"--policies {','.join(unknown)}: unknown policy (known: {', '.join(REGISTRY)})")
    out.mkdir(parents=True, exist_ok=True)
    planned = plan(workload, knobs, users, options, policies)
    unique = list(dict.fromkeys(run for _, run in planned))
    results: dict[Run, dict] = {}
    results = dict(zip(unique, run_all(simulate, unique, workers, progress, desc="sweeping")))
    rows = [{"figure": figure, **results[run]} for figure, run in planned]
    add_speedups(rows)
    document = {"workload": workload, "options": {k: v for k, v in options.items()}, "knobs": knobs,
                "users": users, "policies": list(dict.fromkeys(run.policy for _, run in planned)), "rows": rows}
    (out / "sweep.json").write_text(json.dumps(document, indent=1))
    write_tables(rows, out)
    from fairstream.sim.plots import sweep_figures

    document["figures"] = [str(p) for p in sweep_figures(rows, out)]
    return document


def add_speedups(rows: list[dict]) -> None:
    """Figures 6 and 8: makespan over QKnobler's at rho = 1; Figures 7 and 9: over static's
    (same workload and number of users)."""
    for row in rows:
        if row["figure"] in ("fig6", "fig8"):
            base = next((r for r in rows if r["figure"] == row["figure"] and r["knob"] == 1.0), None)
        else:
            base = next((r for r in rows if r["figure"] == row["figure"] and r["policy"] == "static"
                         and r["users"] == row["users"]), None)
        row["speedup"] = base["makespan"] / row["makespan"] if base and base["makespan"] and row["makespan"] else None


def write_tables(rows: list[dict], out: Path) -> None:
    from fairstream.sim.output import write_csv

    write_csv(rows, FIELDS, out / "table.csv")

    def cell(value):
        if value is None:
            return "-"
        return f"{value:.4g}" if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(FIELDS) + " |", "|" + "---|" * len(FIELDS)]
    lines += ["| " + " | ".join(cell(row.get(k)) for k in FIELDS) + " |" for row in rows]
    (out / "table.md").write_text("\n".join(lines) + "\n")


__all__ = ["Run", "plan", "sweep", "simulate", "add_speedups"]
