"""FLEX's workload model, SLA measures and decision-tree model (the FLEX paper, sections 3-4).

- ``complementary_degree``: entropy of the dominant-resource types of the active jobs
  (formulas 1-4). Jobs here are tenants: each tenant's demand is what it runs plus what it has
  queued, as a share of the cluster (formula 5's R_i).
- ``makespan_reduction`` E and ``fairness_loss`` F against DRF (formulas 6-8), and a long-term
  variant of F from the LTRF fairness degrees (section 5.2.4).
- ``FlexModel``: one decision tree per SLA kind, features (complementary degree, threshold),
  stored as a versioned JSON file (plain data: nothing is unpickled) and evaluated without
  scikit-learn, which is only needed to train (``fairstream train-flex``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fairstream.core.model import ModelError

CANDIDATES = ("fifo", "fair", "drf", "perf")
SLA_KINDS = ("max_fairness_loss", "min_makespan_reduction")
MODEL_FORMAT = "fairstream-flex-model"
MODEL_VERSION = 1
DEFAULT_MODEL = Path(__file__).resolve().parents[1] / "models" / "flex-default.json"


def complementary_degree(job_demands: np.ndarray, capacity: np.ndarray) -> float:
    """Formulas 1-4: ``k_i = argmax_r D_ir / C_r`` per job, ``P(k)`` the fraction of jobs whose
    dominant resource is k, and ``d = -sum_k P(k) log2 P(k)``. Jobs without demand are ignored;
    0 for no jobs. Ties in a job's dominant resource go to the first resource."""
    if not len(job_demands):
        return 0.0
    shares = job_demands / np.where(capacity > 0, capacity, 1.0)
    active = shares.max(axis=1) > 0
    if not active.any():
        return 0.0
    dominant = shares[active].argmax(axis=1)
    p = np.bincount(dominant, minlength=len(capacity)) / active.sum()
    p = p[p > 0]
    return float(-(p * np.log2(p)).sum()) + 0.0  # + 0.0: no "-0.0"


def makespan_reduction(drf_makespan: float, makespan: float) -> float:
    """Formula 6: ``E = max((T - T*) / T, 0)`` with T under DRF."""
    return max((drf_makespan - makespan) / drf_makespan, 0.0) if drf_makespan > 0 else 0.0


def fairness_loss(drf_times: dict[str, float], times: dict[str, float]) -> float:
    """Formulas 7-8: the mean over users of ``max((t*_i - t_i) / t_i, 0)``, t_i under DRF."""
    slowdowns = [max((times[u] - t) / t, 0.0) for u, t in drf_times.items() if t and u in times]
    return float(sum(slowdowns) / len(slowdowns)) if slowdowns else 0.0


def long_term_fairness_loss(drf_degrees: dict[str, float], degrees: dict[str, float]) -> float:
    """Section 5.2.4's resource view: the mean over users of how far each user's long-term
    fairness degree (LTRF formula 3: received over entitled allocation, integrated over the
    run) falls below its degree under DRF."""
    losses = [max(d - degrees.get(u, d), 0.0) for u, d in drf_degrees.items()]
    return float(sum(losses) / len(losses)) if losses else 0.0


@dataclass
class Tree:
    """A fitted binary decision tree as plain arrays (scikit-learn's layout)."""

    children_left: list[int]
    children_right: list[int]
    feature: list[int]
    threshold: list[float]
    leaf_class: list[int]  # the class index a node predicts (used at leaves)

    def check(self, classes: int, features: int = 2) -> None:
        """Raise ValueError unless this is a tree ``predict`` can walk: arrays of one length,
        each inner node with two children further down the arrays (scikit-learn numbers nodes
        depth first, so a walk always ends), features and leaf classes in range."""
        size = len(self.children_left)
        if size == 0 or {len(self.children_right), len(self.feature), len(self.threshold), len(self.leaf_class)} != {size}:
            raise ValueError("inconsistent tree arrays")
        for node in range(size):
            left, right = self.children_left[node], self.children_right[node]
            if not all(isinstance(v, int) and not isinstance(v, bool) for v in (left, right, self.leaf_class[node])):
                raise ValueError(f"node {node}: children and classes are whole numbers")
            if left == -1 and right == -1:
                if not 0 <= self.leaf_class[node] < classes:
                    raise ValueError(f"node {node}: leaf class {self.leaf_class[node]} out of range")
                continue
            if not (node < left < size and node < right < size):
                raise ValueError(f"node {node}: children {left}, {right} must come after it in the arrays")
            threshold = self.threshold[node]
            if not (isinstance(self.feature[node], int) and 0 <= self.feature[node] < features):
                raise ValueError(f"node {node}: feature {self.feature[node]!r} out of range")
            if not isinstance(threshold, (int, float)) or isinstance(threshold, bool) or not np.isfinite(threshold):
                raise ValueError(f"node {node}: threshold {threshold!r} is not a finite number")

    def predict(self, features: Sequence[float]) -> int:
        node = 0
        while self.children_left[node] != -1:
            node = (self.children_left[node] if features[self.feature[node]] <= self.threshold[node]
                    else self.children_right[node])
        return self.leaf_class[node]


@dataclass
class FlexModel:
    """Which candidate to run for (complementary degree, SLA threshold), per SLA kind."""

    classes: list[str]
    trees: dict[str, Tree]
    metadata: dict = field(default_factory=dict)
    source: str = ""  # the file it was loaded from, as given (a run's record names it)

    def choose(self, sla: str, degree: float, threshold: float) -> str:
        if sla not in self.trees:
            raise ModelError(f"the FLEX model has no tree for {sla} (it has: {', '.join(self.trees)})")
        return self.classes[self.trees[sla].predict([degree, threshold])]

    def to_json(self) -> dict:
        return {"format": MODEL_FORMAT, "version": MODEL_VERSION, "classes": self.classes,
                "features": ["complementary_degree", "threshold"],
                "trees": {k: vars(t) for k, t in self.trees.items()}, "metadata": self.metadata}

    def save(self, path: Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=1))


def load_model(path: str | Path) -> FlexModel:
    """Read a model file; any problem is one ``ModelError`` line naming the file."""
    try:
        doc = json.loads(Path(path).read_text())
    except OSError as exc:
        raise ModelError(f"--param model={path}: cannot read ({exc.strerror})") from None
    except (ValueError, RecursionError) as exc:  # RecursionError: nested too deep to parse
        raise ModelError(f"--param model={path}: not JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != MODEL_FORMAT:
        raise ModelError(f"--param model={path}: not a FLEX model file (format {MODEL_FORMAT!r} expected)")
    if doc.get("version") != MODEL_VERSION:
        raise ModelError(f"--param model={path}: model version {doc.get('version')!r}, this fairstream reads {MODEL_VERSION}")
    try:
        classes = [str(c) for c in doc["classes"]]
        trees = {str(kind): Tree(**{k: list(v) for k, v in tree.items()}) for kind, tree in doc["trees"].items()}
        for kind, tree in trees.items():
            try:
                tree.check(len(classes))
            except ValueError as exc:
                raise ValueError(f"tree {kind}: {exc}") from None
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ModelError(f"--param model={path}: malformed model ({exc})") from None
    unknown = set(classes) - set(CANDIDATES)
    if unknown:
        raise ModelError(f"--param model={path}: unknown candidate schedulers {sorted(unknown)}")
    return FlexModel(classes, trees, doc.get("metadata", {}), source=str(path))


def from_sklearn(classifiers: dict, classes: Sequence[str], metadata: dict) -> FlexModel:
    """Plain-array trees from fitted ``DecisionTreeClassifier``s (one per SLA kind)."""
    trees = {}
    for kind, clf in classifiers.items():
        t = clf.tree_
        # Map the classifier's own class order onto ``classes``.
        order = [list(classes).index(str(c)) for c in clf.classes_]
        trees[kind] = Tree(t.children_left.tolist(), t.children_right.tolist(), t.feature.tolist(),
                           [float(x) for x in t.threshold], [order[int(np.argmax(v))] for v in t.value[:, 0, :]])
    return FlexModel(list(classes), trees, metadata)


__all__ = ["complementary_degree", "makespan_reduction", "fairness_loss", "long_term_fairness_loss",
           "FlexModel", "Tree", "load_model", "from_sklearn", "CANDIDATES", "SLA_KINDS", "DEFAULT_MODEL"]
