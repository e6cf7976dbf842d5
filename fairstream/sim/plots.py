"""PNG plots of a run, in the style of the LTRF paper's Figures 4, 5, 6 and 7 (matplotlib, Agg)."""

from __future__ import annotations

from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt

MAX_LINES = 10


def _save(fig, path: Path) -> Path:
    """Lay out, write and close ``fig``; returns ``path``."""
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _per_tenant(ax, series: dict, field: str, title: str, ylabel: str) -> None:
    names = sorted(series)
    if len(names) > MAX_LINES:
        # Many tenants: draw the ones that used the cluster most, and say so in the title.
        names = sorted(names, key=lambda n: -(series[n].f_raw[-1] if series[n].f_raw else 0))[:MAX_LINES]
        title += f" (top {MAX_LINES} of {len(series)} tenants by usage)"
    for name in sorted(names):
        s = series[name]
        ax.plot(s.time, getattr(s, field), label=name, linewidth=1.2)
    ax.set_title(title)
    ax.set_xlabel("time (s)")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def _sharing(ax, metrics, title: str) -> None:
    """Sharing benefit Psi and loss Omega over time (formulas 4-5)."""
    ax.plot(metrics.cluster["time"], metrics.cluster["psi"], label="sharing benefit Psi")
    ax.plot(metrics.cluster["time"], metrics.cluster["omega"], label="sharing loss Omega")
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)


def plot_run(result, out: Path) -> list[Path]:
    """Accumulated usage, current allocation, fairness degree per tenant; cluster Psi/Omega;
    preemptions, work lost and time to fair share per tenant when anything was preempted."""
    m = result.metrics
    unit = m.metric_resource if m.metric_resource != "dominant" else "dominant share"
    written = []
    figures = [
        ("accumulated.png", "f_policy", f"{result.policy}: accumulated usage as the policy counts it", f"{unit} x seconds / capacity"),
        ("allocation.png", "g", f"{result.policy}: current allocation g_i(t)", f"{unit} share of cluster"),
        ("fairness.png", "rho", f"{result.policy}: fairness degree rho_i(t) (formula 3)", "rho"),
    ]
    for filename, field, title, ylabel in figures:
        fig, ax = plt.subplots(figsize=(8, 4.5))
        _per_tenant(ax, m.series, field, title, ylabel)
        if field == "rho":
            ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
        written.append(_save(fig, out / filename))

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    _sharing(top, m, f"{result.policy}: sharing benefit and loss (formulas 4-5)")
    for key in m.cluster:
        if key.startswith("util_"):
            bottom.plot(m.cluster["time"], m.cluster[key], label=key[5:])
    bottom.set_ylabel("utilisation")
    bottom.set_xlabel("time (s)")
    bottom.set_ylim(0, 1.05)
    bottom.legend(fontsize=8)
    bottom.grid(alpha=0.3)
    written.append(_save(fig, out / "cluster.png"))
    if m.preemptions:
        written.append(plot_preemption(m, result.policy, out / "preemption.png"))
    return written


def plot_comparison(results: dict, speedups: dict, out: Path) -> list[Path]:
    """Figure 5 (fairness degree per queue and Psi/Omega per policy) and Figure 6 (speedup)."""
    policies = list(results)
    tenants = sorted(next(iter(results.values())).metrics.series)
    fig, axes = plt.subplots(len(policies), 2, figsize=(12, 3.2 * len(policies)), squeeze=False)
    for i, policy in enumerate(policies):
        m = results[policy].metrics
        left, right = axes[i]
        _sharing(left, m, f"{policy}: sharing benefit / loss")
        _per_tenant(right, m.series, "rho", f"{policy}: fairness degree per queue", "rho")
        right.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    written = [_save(fig, out / "figure5_fairness.png")]

    fig, ax = plt.subplots(figsize=(8, 4.5))
    width = 0.8 / max(len(policies), 1)
    for i, policy in enumerate(policies):
        values = [speedups[policy].get(t) or 0.0 for t in tenants]
        ax.bar([k + i * width for k in range(len(tenants))], values, width=width, label=policy)
    ax.set_xticks([k + width * (len(policies) - 1) / 2 for k in range(len(tenants))], tenants)
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_ylabel("speedup vs static (makespan)")
    ax.set_title("Figure 6: per-queue speedup relative to static partitioning")
    ax.legend(fontsize=8)
    return written + [_save(fig, out / "figure6_speedup.png")]


def plot_side_by_side(results: dict, marks: dict[str, float], path: Path) -> Path:
    """Per-tenant accumulated usage (formula 1) and current allocation over time, one row per
    policy on shared axes, with dashed lines at ``marks`` (label -> time)."""
    fig, axes = plt.subplots(len(results), 2, figsize=(12, 3.4 * len(results)), squeeze=False, sharex=True,
                             sharey="col")
    for (policy, result), (left, right) in zip(results.items(), axes):
        unit = result.metrics.metric_resource
        _per_tenant(left, result.metrics.series, "f_raw", f"{policy}: accumulated usage", f"{unit} share x seconds")
        _per_tenant(right, result.metrics.series, "g", f"{policy}: current allocation", f"{unit} share of cluster")
        for ax in (left, right):
            for label, at in marks.items():
                ax.axvline(at, color="grey", linewidth=0.8, linestyle="--")
                ax.annotate(label, (at, 1.0), xycoords=("data", "axes fraction"), fontsize=7, ha="left", va="top",
                            xytext=(3, -3), textcoords="offset points")
    return _save(fig, path)


def sweep_figures(rows: list[dict], out: Path) -> list[Path]:
    """The QKnobler paper's Figures 6-9 from ``fairstream sweep`` rows (those present)."""
    written = []
    for figure, _against_rho in (("fig6", True), ("fig8", True)):
        mine = sorted((r for r in rows if r["figure"] == figure), key=lambda r: r["knob"])
        if not mine:
            continue
        fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
        knobs = [r["knob"] for r in mine]
        left.plot(knobs, [r["speedup"] for r in mine], marker="o")
        left.set_title(f"{figure}(a): QKnobler makespan speedup over rho = 1")
        left.set_xlabel("knob rho")
        left.set_ylabel("speedup")
        right.plot(knobs, [r["soft_fairness_mean"] for r in mine], marker="o", label="measured (time mean)")
        right.plot(knobs, [r["soft_fairness_max"] for r in mine], marker=".", linestyle=":", label="measured (max)")
        right.plot(knobs, [r["theta"] for r in mine], marker="x", linestyle="--", label="theta (Theorem 1)")
        right.set_title(f"{figure}(b): soft fairness degree")
        right.set_xlabel("knob rho")
        right.legend(fontsize=8)
        for ax in (left, right):
            ax.grid(alpha=0.3)
        path = out / f"{figure}-knob.png"
        written.append(_save(fig, path))
    seven = [r for r in rows if r["figure"] == "fig7"]
    if seven:
        knobs = sorted({r["knob"] for r in seven if r["knob"] is not None}) or [1.0]
        lines = []
        for policy in dict.fromkeys(r["policy"] for r in seven):
            mine = sorted((r for r in seven if r["policy"] == policy), key=lambda r: r["knob"] or 0.0)
            if mine[0]["knob"] is None:  # no knob: a flat line
                lines.append((policy, knobs, [mine[0]["speedup"]] * len(knobs), "--"))
            else:
                lines.append((policy, [r["knob"] for r in mine], [r["speedup"] for r in mine], "-"))
        written.append(_line_figure(out / "fig7-policies.png", "fig7: makespan speedup over static partitioning",
                                    "knob (rho for QKnobler, f for Tetris)", lines))
    nine = [r for r in rows if r["figure"] == "fig9"]
    if nine:
        lines = []
        for policy in dict.fromkeys(r["policy"] for r in nine):
            mine = sorted((r for r in nine if r["policy"] == policy), key=lambda r: r["users"])
            lines.append((policy, [r["users"] for r in mine], [r["speedup"] for r in mine], "-"))
        written.append(_line_figure(out / "fig9-users.png", "fig9: makespan speedup over static vs users (knob 0.2)",
                                    "users", lines))
    return written


def _line_figure(path: Path, title: str, xlabel: str, lines: list[tuple[str, list, list, str]]) -> Path:
    """One plot of (label, xs, ys, line style) speedup lines."""
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, xs, ys, style in lines:
        ax.plot(xs, ys, marker="o" if style == "-" else None, linestyle=style, label=label)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("speedup")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def plot_preemption(metrics, policy: str, path: Path) -> Path:
    """Preemptions and work lost (task-seconds) per tenant, with each tenant's time to fair share."""
    names = sorted(set(metrics.preemptions) | set(metrics.time_to_fair_share))
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    left.bar(names, [metrics.preemptions.get(n, 0) for n in names], color="tab:red", label="preemptions")
    left.set_ylabel("tasks preempted")
    twin = left.twinx()
    twin.plot(names, [metrics.work_lost.get(n, 0.0) for n in names], "ko", label="work lost")
    twin.set_ylabel("work lost (task-seconds)")
    left.set_title(f"{policy}: preemptions and work lost per tenant")
    right.bar(names, [metrics.time_to_fair_share.get(n, float("nan")) for n in names], color="tab:blue")
    right.set_ylabel("seconds")
    right.set_title(f"{policy}: time to fair share per tenant")
    for ax in (left, right):
        ax.tick_params(axis="x", labelrotation=45, labelsize=8)
        ax.grid(alpha=0.3, axis="y")
    return _save(fig, path)


def preemption_figures(rows: list[dict], out: Path) -> list[Path]:
    """``fairstream compare-preemption``: per workload, (a) each late tenant's time to fair share
    per setting, (b) what it costs: the late tenants' mean time to fair share against the work
    lost, one point per setting (bars: the range over seeds), and (c) the first late tenant's
    share of the cluster over time per setting (one seed)."""
    written = []
    for workload in dict.fromkeys(r["workload"] for r in rows):
        mine = [r for r in rows if r["workload"] == workload]
        late = sorted(n for n in mine[0]["tenants"] if n != "vc0")
        fig, (bars, cost, share) = plt.subplots(1, 3, figsize=(17, 4.6))
        width = 0.8 / len(mine)
        for k, row in enumerate(mine):
            xs = [i + (k - (len(mine) - 1) / 2) * width for i in range(len(late))]
            values = [row["tenants"][n]["time_to_fair_share"] or row["makespan"] for n in late]
            bars.bar(xs, values, width=width, label=row["label"])
        bars.set_xticks(range(len(late)), late)
        bars.set_yscale("log")
        bars.set_ylabel("seconds (log)")
        bars.set_title(f"{workload}: time to fair share of the late tenants")
        bars.legend(fontsize=7)
        for row in mine:  # bars: the range over seeds, when the rows were aggregated
            x, y = row["work_lost_pct"], row["late_ttfs_mean"]
            (xlo, xhi), (ylo, yhi) = row.get("work_lost_pct_range") or (x, x), row.get("late_ttfs_mean_range") or (y, y)
            cost.errorbar([x], [y], xerr=[[x - xlo], [xhi - x]], yerr=[[y - ylo], [yhi - y]], capsize=3,
                          marker="s" if row["preemption"] == "off" else "o", linestyle="", label=row["label"])
        cost.set_yscale("symlog", linthresh=10)
        cost.set_xlabel("work lost to preemption (% of the workload's task-seconds)")
        cost.set_ylabel("late tenants' mean time to fair share (s)")
        cost.set_title(f"{workload}: what preemption buys and costs")
        cost.legend(fontsize=7)
        first = late[0]
        arrival = min((row["allocation"][first]["arrival"] for row in mine
                       if row["allocation"].get(first, {}).get("arrival") is not None), default=0.0)
        for row in mine:
            series = row["allocation"].get(first)
            if series:
                share.step(series["time"], series["g"], where="post", label=row["label"], linewidth=1.1)
        share.set_xlim(max(arrival - 600, 0), arrival + 6 * 3600)
        share.set_xlabel("time (s)")
        share.set_ylabel("share of the cluster")
        share.set_title(f"{workload}: {first}'s share, first 6 hours after it arrives")
        share.legend(fontsize=7)
        for ax in (bars, cost, share):
            ax.grid(alpha=0.3)
        path = out / f"preemption-{workload}.png"
        written.append(_save(fig, path))
    return written


def forgetting_figure(rows: list[dict], a_arrives: float, contended_until: float, path: Path) -> Path:
    """``fairstream compare-forgetting``: A's share of the cluster over time, and A's and B's
    accumulated usage as each policy counts it, per way of forgetting."""
    fig, (share, usage) = plt.subplots(1, 2, figsize=(14, 4.8))
    for row in rows:
        line, = share.step(row["time"], row["a_share"], where="post", label=row["label"], linewidth=1.2)
        usage.plot(row["time"], np.array(row["a_usage"]) - np.array(row["b_usage"]), color=line.get_color(),
                   label=row["label"], linewidth=1.2)
    for ax in (share, usage):
        for at, text in ((a_arrives, "A arrives"), (contended_until, "contention ends")):
            ax.axvline(at, color="grey", linewidth=0.8, linestyle="--")
            ax.annotate(text, (at, 1.0), xycoords=("data", "axes fraction"), fontsize=7, ha="left", va="top",
                        xytext=(3, -3), textcoords="offset points")
        ax.set_xlim(0, contended_until * 1.6)
        ax.set_xlabel("time (s)")
        ax.grid(alpha=0.3)
    share.set_ylabel("A's share of the cluster's memory")
    share.set_title("A's allocation under each way of forgetting")
    share.legend(fontsize=7)
    usage.axhline(0, color="black", linewidth=0.8)
    usage.set_ylabel("A's accumulated usage less B's (as the policy counts it)")
    usage.set_title("How far behind B A is counted")
    return _save(fig, path)
