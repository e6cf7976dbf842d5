"""The main job, in two parts.

1. The LTRF papers' four-queue macro-benchmark under static, fair and ltrf: our version of
   ICS'14 Figures 5 and 6 (per-queue fairness degree, cluster sharing benefit and loss over
   time, per-queue speedup against static partitioning). Memory only, as YARN 2.2 scheduled it
   in the papers. Its queues are rarely idle while others are busy, so fair and ltrf come out
   within a few per cent of each other there (docs/paper-notes.md).
2. What long-term fairness buys: the LTRF paper's Table 1 at cluster scale
   (``traces/come_and_go.py``), B alone first, then A and B both wanting the whole cluster,
   under fair and ltrf side by side, with each tenant's part of the memory used until the
   contention ends (fair: a third for A, ltrf: half).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import structlog

from fairstream.sim.output import metrics_document, speedups, write_run
from fairstream.sim.plots import plot_comparison, plot_side_by_side
from fairstream.sim.simulator import Simulator
from fairstream.sim.traces.come_and_go import come_and_go
from fairstream.sim.traces.macro import macro_benchmark

POLICIES = ("static", "fair", "ltrf")
# Part 2: 50 nodes of 4 GB; B alone from 0 s, A from 300 s, both until 900 s.
COME_AND_GO: dict[str, Any] = {"nodes": 50, "task_seconds": 10.0, "a_arrives": 300.0, "contended_until": 900.0}


def come_and_go_part(out: Path, progress: bool | None) -> tuple[list[str], dict, Path]:
    """Part 2: summary lines, figures for summary.json, and the side-by-side figure."""
    scenario = come_and_go(**COME_AND_GO)
    until, arrives = COME_AND_GO["contended_until"], COME_AND_GO["a_arrives"]
    results = {p: Simulator(scenario, p, {}, progress=progress).run() for p in ("fair", "ltrf")}
    parts = {}
    for policy, result in results.items():
        used = result.metrics.accumulated_at(until)
        total = sum(used.values())
        parts[policy] = {tenant: used[tenant] / total for tenant in sorted(used)}
        write_run(result, out / "come-and-go" / policy, plots=False)
    figure = plot_side_by_side(results, {"A arrives": arrives, "both stop submitting": until},
                               out / "come_and_go.png")
    lines = [
        f"What long-term fairness buys ({scenario.name}; {COME_AND_GO['nodes']} nodes, LTRF Table 1 at cluster scale):",
        f"  of the memory used until {until:g} s, A got {parts['fair']['A']:.0%} under fair and "
        f"{parts['ltrf']['A']:.0%} under ltrf (B: {parts['fair']['B']:.0%} and {parts['ltrf']['B']:.0%}):",
        "  fair lends A's idle share to B for good; ltrf pays it back once A asks (Table 1: 160/240 vs 200/200).",
    ]
    return lines, {"contended_until": until, "share_of_use_until_then": parts}, figure


def run_demo(out: Path, seed: int = 1, scale: float = 1.0, progress: bool | None = None) -> int:
    log = structlog.get_logger("fairstream.sim.demo")
    scenario = macro_benchmark(seed=seed, scale=scale, memory_only=True)
    out.mkdir(parents=True, exist_ok=True)
    log.info("demo.start", scenario=scenario.name, tasks=scenario.task_count, nodes=len(scenario.nodes), out=str(out))
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
    lines = [f"fairstream demo: {scenario.name}, {scenario.task_count} tasks on {len(scenario.nodes)} nodes", ""]
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
        if p == "static" and summary["sharing_loss"] < 0:
            lines.append("        (static's loss below 0: a queue's quota is its share of the pooled memory, and whole "
                         "tasks,\n         each on one node, seldom add up to it exactly, so a queue with work waiting "
                         "holds a little under its share)")
    lines.append("")
    contention_lines, contention, side_by_side = come_and_go_part(out, progress)
    log.info("demo.come_and_go_done", **contention)
    lines += contention_lines
    lines.append("")
    lines.append(f"plots: {', '.join(str(f) for f in [*figures, side_by_side])}; per-policy runs in {out}/<policy>/ "
                 f"and {out}/come-and-go/<policy>/")
    text = "\n".join(lines)
    print(text)
    (out / "summary.txt").write_text(text + "\n")
    document = {p: metrics_document(results[p], None if p == "static" else static)["summary"] for p in POLICIES}
    document["come_and_go"] = contention
    (out / "summary.json").write_text(json.dumps(document, indent=1))
    return 0
