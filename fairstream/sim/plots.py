"""PNG plots of a run, in the style of the LTRF paper's Figures 4, 5, 6 and 7 (matplotlib, Agg)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


MAX_LINES = 10


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
    """Accumulated usage, current allocation, fairness degree per tenant; cluster Psi/Omega."""
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
        fig.tight_layout()
        fig.savefig(out / filename, dpi=110)
        plt.close(fig)
        written.append(out / filename)

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
    fig.tight_layout()
    fig.savefig(out / "cluster.png", dpi=110)
    plt.close(fig)
    written.append(out / "cluster.png")
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
    fig.tight_layout()
    fig.savefig(out / "figure5_fairness.png", dpi=110)
    plt.close(fig)

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
    fig.tight_layout()
    fig.savefig(out / "figure6_speedup.png", dpi=110)
    plt.close(fig)
    return [out / "figure5_fairness.png", out / "figure6_speedup.png"]


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
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def sweep_figures(rows: list[dict], out: Path) -> list[Path]:
    """The QKnobler paper's Figures 6-9 from ``fairstream sweep`` rows (those present)."""
    written = []
    for figure, against_rho in (("fig6", True), ("fig8", True)):
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
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
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
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
