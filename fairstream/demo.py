"""The main job: the LTRF papers' four-queue macro-benchmark under static, fair and ltrf.

Our version of ICS'14 Figures 5 and 6: per-queue fairness degree, cluster sharing benefit and
loss over time, and per-queue speedup against static partitioning. Memory only, as YARN 2.2
scheduled it in the papers.
"""

from __future__ import annotations

import json
from pathlib import Path

import structlog

from fairstream.output import metrics_document, speedups, write_run
from fairstream.plots import plot_comparison
from fairstream.simulator import Simulator
from fairstream.traces.macro import macro_benchmark

POLICIES = ("static", "fair", "ltrf")


def run_demo(out: Path, seed: int = 1, scale: float = 1.0, progress: bool | None = None) -> int:
    log = structlog.get_logger("fairstream.demo")
    scenario = macro_benchmark(seed=seed, scale=scale, memory_only=True)
    out.mkdir(parents=True, exist_ok=True)
    log.info("demo.start", scenario=scenario.name, tasks=len(scenario.tasks), nodes=len(scenario.nodes), out=str(out))
    results = {}
    for policy in POLICIES:
        results[policy] = Simulator(scenario, policy, {}, progress=progress).run()
        log.info("demo.policy_done", policy=policy, makespan=results[policy].summary()["makespan"])
    static = results["static"]
    speedup = {p: {t: v["makespan"] for t, v in speedups(results[p], static)["tenants"].items()} for p in POLICIES}
    for policy, result in results.items():
        write_run(result, out / policy, None if policy == "static" else static)
    figures = plot_comparison(results, speedup, out)

    queues = sorted(static.metrics.series)
    lines = [f"fairstream demo: {scenario.name}, {len(scenario.tasks)} tasks on {len(scenario.nodes)} nodes", ""]
    header = f"{'queue':<10}" + "".join(f"{p + ' rho':>12}{p + ' speedup':>16}" for p in POLICIES)
    lines.append(header)
    degrees = {p: results[p].metrics.degrees() for p in POLICIES}
    for q in queues:
        row = f"{q:<10}"
        for p in POLICIES:
            sp = speedup[p].get(q)
            row += f"{degrees[p].get(q, 1.0):>12.3f}{(f'{sp:.2f}x' if sp else '-'):>16}"
        lines.append(row)
    lines.append("")
    for p in POLICIES:
        m = results[p].metrics
        omega = m.cluster["omega"]
        mean_loss = sum(omega) / len(omega) if omega else 0.0
        summary = results[p].summary()
        lines.append(
            f"{p:<7} sharing benefit {summary['sharing_benefit']:.3f}  sharing loss {summary['sharing_loss']:.3f}"
            f" (mean over time {mean_loss:.3f})  makespan {summary['makespan']:.0f}s"
            f"  memory used {summary['utilisation']['mem']:.0%}"
        )
    lines.append("")
    lines.append(f"plots: {', '.join(str(f) for f in figures)}; per-policy runs in {out}/<policy>/")
    text = "\n".join(lines)
    print(text)
    (out / "summary.txt").write_text(text + "\n")
    (out / "summary.json").write_text(json.dumps({p: metrics_document(results[p], None if p == "static" else static)["summary"] for p in POLICIES}, indent=1))
    return 0
