"""``fairstream train-flex``: labelled data from simulations, a decision tree, a report.

Workloads (seeded): ``tenants`` tenants on ``nodes`` nodes of <16 cpu, 32 GB>; each tenant is
CPU-heavy (tasks <4, 2>) or memory-heavy (<1, 8>), the share of CPU-heavy tenants sweeping the
complementary degree from 0 to 1; job sizes and arrivals follow one of two mixes:

- ``facebook``: many small jobs and a few large ones (1-100 tasks, after the FB-2009 bins of the
  QKnobler paper's Table 1), arrivals in the first 20 s, tasks 5-30 s;
- ``google``: jobs of 5-40 tasks with demands jittered ±50 % around the two shapes, arrivals in
  the first minute, tasks 10-120 s.

Four nodes for about 8 × 3-6 jobs keep the cluster contended, so that makespan depends on the
scheduler rather than on the last arrival.

Every workload is simulated under each candidate (FIFO, Fair, DRF, Perf). Against DRF each
candidate has a makespan reduction E and a fairness loss F (formulas 6-8; per-tenant completion
time = the tenant's makespan), and a long-term F (section 5.2.4, from the LTRF fairness
degrees), which ``long_term=True`` (``--long-term-fairness``) uses for the labels instead. For every SLA threshold on a grid, the label is the candidate
that meets it best: for ``max_fairness_loss=F`` the largest E among candidates with loss at most
F (DRF, loss 0, always qualifies); for ``min_makespan_reduction=E`` the smallest F among those
reaching E (none: the largest E). Ties go to DRF, then Fair, FIFO, Perf. Features are
(complementary degree, threshold), as in the paper's records (d, s, Y).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from fairstream.core.flex import (
    CANDIDATES,
    SLA_KINDS,
    complementary_degree,
    fairness_loss,
    from_sklearn,
    long_term_fairness_loss,
    makespan_reduction,
)
from fairstream.lab.parallel import run_all

#: The FLEX paper's Table 4 (best grid-search setting); random-state fixed for repeatable models.
TABLE_4 = {"criterion": "entropy", "splitter": "best", "max_features": 2, "max_depth": 3,
           "min_samples_split": 10, "min_samples_leaf": 5, "max_leaf_nodes": 20, "random_state": 0}
THRESHOLDS = {"max_fairness_loss": [0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0],
              "min_makespan_reduction": [0.0, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3]}
PREFERENCE = ("drf", "fair", "fifo", "perf")  # tie-breaks


# Nodes <16 cpu, 32 GB>; tasks a sizeable part of a node, as YARN containers are. With tasks of
# a few per cent of a node (the first generator: <4, 2> and <1, 8>) every candidate kept the
# nodes full and makespans differed by at most 3.5 %, so there was no trade-off to learn; at
# these sizes, with sizes varying from job to job, where a task goes decides whether the next
# one fits, and packing (Perf) finishes up to 13 % sooner than DRF at a fairness loss of about
# 0.1-0.4 (docs/flex.md).
NODE = np.array([16.0, 32.0])
CPU_HEAVY = np.array([10.0, 5.0])
MEMORY_HEAVY = np.array([2.5, 20.0])


def workload(seed: int, cpu_share: float, mix: str, tenants: int = 8, nodes: int = 4):
    """A seeded scenario: ``cpu_share`` of the tenants CPU-heavy, the rest memory-heavy."""
    from fairstream.core.model import ResourceSpace, TenantSpec
    from fairstream.core.tenants import TenantTree
    from fairstream.sim.scenario import Scenario, TaskSpec, uniform_nodes

    rng = np.random.default_rng(seed)
    cpu_heavy = int(round(cpu_share * tenants))
    tasks = []
    for t in range(tenants):
        base = CPU_HEAVY if t < cpu_heavy else MEMORY_HEAVY
        jobs = int(rng.integers(3, 7))
        for j in range(jobs):
            if mix == "facebook":
                size = int(rng.choice([1, 2, 10, 50, 100], p=[0.35, 0.25, 0.2, 0.15, 0.05]))
                submit = float(rng.uniform(0, 20))
                duration = lambda: float(rng.uniform(5, 30))
            else:
                size = int(rng.integers(5, 41))
                submit = float(rng.uniform(0, 60))
                duration = lambda: float(rng.uniform(10, 120))
            # Each job's tasks within +-50 % of their tenant type's size, per resource: with one
            # size per type, Facebook-like workloads showed no packing gain at all.
            demand = np.minimum(np.round(base * rng.uniform(0.5, 1.5, size=2), 2), NODE)
            for k in range(size):
                tasks.append(TaskSpec(f"u{t}-j{j}-{k}", f"u{t}-j{j}", f"u{t}", round(submit, 3), round(duration(), 3),
                                      {"cpu": float(demand[0]), "mem": float(demand[1])}))
    tree = TenantTree.from_specs([TenantSpec(f"u{t}") for t in range(tenants)])
    return Scenario(ResourceSpace(("cpu", "mem")), tree, uniform_nodes(nodes, {"cpu": float(NODE[0]), "mem": float(NODE[1])}), tasks,
                    name=f"flex-{mix}-{seed}-{cpu_share:.2f}")


def evaluate(args: tuple[int, float, str]) -> dict:
    """Simulate one workload under every candidate: degree, E, F and long-term F per candidate."""
    from fairstream.sim.simulator import Simulator

    seed, cpu_share, mix = args
    scenario = workload(seed, cpu_share, mix)
    demands: dict[str, Any] = {}
    for task in scenario.tasks:
        demands[task.tenant] = demands.get(task.tenant, 0) + np.array([task.demand["cpu"], task.demand["mem"]])
    capacity = NODE
    degree = complementary_degree(np.array(list(demands.values())), capacity)
    runs = {}
    for policy in CANDIDATES:
        summary = Simulator(scenario, policy, {}).run().summary()
        runs[policy] = {"makespan": summary["makespan"],
                        "tenant_times": {t: v["makespan"] for t, v in summary["tenants"].items() if v.get("makespan")},
                        "degrees": {t: v["fairness_degree"] for t, v in summary["tenants"].items()}}
    base = runs["drf"]
    out: dict[str, Any] = {"seed": seed, "mix": mix, "cpu_share": cpu_share, "degree": degree, "candidates": {}}
    for policy, run in runs.items():
        out["candidates"][policy] = {
            "E": makespan_reduction(base["makespan"], run["makespan"]),
            "F": fairness_loss(base["tenant_times"], run["tenant_times"]),
            "F_long_term": long_term_fairness_loss(base["degrees"], run["degrees"]),
        }
    return out


def label(candidates: dict[str, dict], kind: str, threshold: float, loss: str = "F") -> str:
    """The best candidate for the SLA; ``loss`` is ``F`` (formula 8) or ``F_long_term`` (5.2.4)."""
    rank = {p: i for i, p in enumerate(PREFERENCE)}
    if kind == "max_fairness_loss":
        ok = [p for p, m in candidates.items() if m[loss] <= threshold + 1e-12]
        return min(ok, key=lambda p: (-round(candidates[p]["E"], 9), rank[p]))
    ok = [p for p, m in candidates.items() if m["E"] >= threshold - 1e-12]
    if not ok:
        return min(candidates, key=lambda p: (-round(candidates[p]["E"], 9), rank[p]))
    return min(ok, key=lambda p: (round(candidates[p][loss], 9), rank[p]))


def dataset(results: list[dict], kind: str, loss: str = "F") -> tuple[np.ndarray, list[str]]:
    rows, labels = [], []
    for result in results:
        for threshold in THRESHOLDS[kind]:
            rows.append([result["degree"], threshold])
            labels.append(label(result["candidates"], kind, threshold, loss))
    return np.array(rows), labels


def train(out: Path, workloads: int = 48, seed: int = 1, grid: bool = False, workers: int | None = None,
          progress: bool | None = None, held_out: int = 0, long_term: bool = False) -> dict:
    """Simulate, label, fit one tree per SLA kind, cross-validate, write the model and a report."""
    from sklearn.metrics import classification_report, confusion_matrix
    from sklearn.model_selection import GridSearchCV, StratifiedKFold, cross_val_predict
    from sklearn.tree import DecisionTreeClassifier

    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    plan = [(int(rng.integers(1, 2**31)), float(share), mix)
            for i, (share, mix) in enumerate((s, m) for s in np.linspace(0, 1, max(workloads // 2, 2))
                                             for m in ("facebook", "google"))]
    results = run_all(evaluate, plan, workers, progress, "simulating", unit="workload")
    (out / "training-data.json").write_text(json.dumps(results, indent=1))
    loss = "F_long_term" if long_term else "F"
    classifiers: dict[str, Any] = {}
    report: dict[str, Any] = {"workloads": len(results), "fairness_loss": loss, "parameters": {}, "per_sla": {}}
    for kind in SLA_KINDS:
        x, y = dataset(results, kind, loss)
        params = dict(TABLE_4)
        if grid:
            search = GridSearchCV(DecisionTreeClassifier(random_state=0), {
                "criterion": ["gini", "entropy"], "max_depth": [2, 3, 4, 6], "min_samples_leaf": [1, 5, 10],
                "min_samples_split": [2, 10, 20], "max_leaf_nodes": [8, 20, None]}, cv=5, scoring="f1_macro")
            search.fit(x, y)
            params = {**TABLE_4, **search.best_params_}
        folds = min(5, min(y.count(c) for c in set(y)))
        predicted = cross_val_predict(DecisionTreeClassifier(**params), x, y,
                                      cv=StratifiedKFold(folds, shuffle=True, random_state=0)) if folds >= 2 else y
        classes = sorted(set(y))
        report["parameters"][kind] = params
        report["per_sla"][kind] = {
            "samples": len(y), "classes": classes,
            "cross_validation": classification_report(y, predicted, labels=classes, output_dict=True, zero_division=0),
            "confusion_matrix": confusion_matrix(y, predicted, labels=classes).tolist(),
        }
        classifiers[kind] = DecisionTreeClassifier(**params).fit(x, y)
        _confusion_png(report["per_sla"][kind]["confusion_matrix"], classes, out / f"confusion-{kind}.png", kind)
    model = from_sklearn(classifiers, list(CANDIDATES), {"workloads": len(results), "seed": seed, "grid": grid,
                                                           "fairness_loss": loss, "parameters": report["parameters"]})
    model.save(out / "flex-model.json")
    if held_out:
        report["against_tetris"] = evaluate_model(out / "flex-model.json", held_out, seed, workers, progress)
    (out / "report.json").write_text(json.dumps(report, indent=1))
    return report


EVAL_LOSS = (0.1, 0.2, 0.5)
EVAL_REDUCTION = (0.02, 0.05, 0.1)


def evaluate_against_tetris(args: tuple[int, float, str, str]) -> dict:
    """One held-out workload: ``flex`` (with the model at ``model_path``) under each SLA
    threshold against ``tetris`` (f = 0.2), both measured against DRF (the paper's section 5.2:
    makespan reduction of FLEX over Tetris for fairness-loss thresholds, fairness-loss reduction
    for makespan-reduction thresholds)."""
    from fairstream.sim.simulator import Simulator

    seed, cpu_share, mix, model_path = args
    scenario = workload(seed, cpu_share, mix)

    def run(policy: str, **params) -> dict:
        summary = Simulator(scenario, policy, {k: str(v) for k, v in params.items()}).run().summary()
        return {"makespan": summary["makespan"],
                "times": {t: v["makespan"] for t, v in summary["tenants"].items() if v.get("makespan")}}

    drf, tetris = run("drf"), run("tetris", f=0.2)
    tetris_loss = fairness_loss(drf["times"], tetris["times"])
    out = {"seed": seed, "mix": mix, "cpu_share": cpu_share, "tetris_makespan": tetris["makespan"],
           "tetris_fairness_loss": tetris_loss, "makespan_reduction_vs_tetris": {}, "fairness_loss_reduction_vs_tetris": {}}
    for threshold in EVAL_LOSS:
        flex = run("flex", max_fairness_loss=threshold, model=model_path)
        out["makespan_reduction_vs_tetris"][str(threshold)] = (tetris["makespan"] - flex["makespan"]) / tetris["makespan"]
    for threshold in EVAL_REDUCTION:
        flex = run("flex", min_makespan_reduction=threshold, model=model_path)
        loss = fairness_loss(drf["times"], flex["times"])
        out["fairness_loss_reduction_vs_tetris"][str(threshold)] = (
            (tetris_loss - loss) / tetris_loss if tetris_loss > 0 else None)
    return out


def evaluate_model(model_path: Path, workloads: int, seed: int, workers: int | None = None,
                   progress: bool | None = None) -> dict:
    """Held-out workloads (their own seed): FLEX against Tetris, averaged per threshold."""
    rng = np.random.default_rng(seed + 1000)
    plan = [(int(rng.integers(1, 2**31)), float(share), mix, str(model_path))
            for share in np.linspace(0, 1, max(workloads // 2, 1)) for mix in ("facebook", "google")]
    results = run_all(evaluate_against_tetris, plan, workers, progress, "evaluating", unit="workload")

    def mean(key: str, threshold: str) -> float | None:
        values = [r[key][threshold] for r in results if r[key][threshold] is not None]
        return float(np.mean(values)) if values else None

    return {"held_out_workloads": len(results),
            "makespan_reduction_vs_tetris": {str(t): mean("makespan_reduction_vs_tetris", str(t)) for t in EVAL_LOSS},
            "fairness_loss_reduction_vs_tetris": {str(t): mean("fairness_loss_reduction_vs_tetris", str(t))
                                                  for t in EVAL_REDUCTION},
            "per_workload": results}


def _confusion_png(matrix: list[list[int]], classes: list[str], path: Path, title: str) -> None:
    from fairstream.sim.plots import plt

    fig, ax = plt.subplots(figsize=(4.5, 4))
    ax.imshow(np.array(matrix), cmap="Blues")
    ax.set_xticks(range(len(classes)), classes)
    ax.set_yticks(range(len(classes)), classes)
    ax.set_xlabel("predicted")
    ax.set_ylabel("labelled")
    ax.set_title(f"FLEX tree, {title}")
    for i, row in enumerate(matrix):
        for j, value in enumerate(row):
            ax.text(j, i, str(value), ha="center", va="center", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


__all__ = ["train", "workload", "evaluate", "label", "dataset", "TABLE_4"]
