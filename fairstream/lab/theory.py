"""``fairstream explain``: the fairness-efficiency theory of QKnobler for a scenario.

For every tenant with tasks: its average task demand ``D_i`` (over all its tasks), weight
``w_i`` (share fraction of the tenant tree, renormalised over these tenants) and, for the
cluster's total capacity ``R``: ``phi`` and ``s_i^max = w_i / phi`` (formula 11), the tasks DRF
would run, theta of Theorem 1 for each knob value asked for, and the smallest knob that is
sharing-incentive (Theorem 2). The paper's model assumes a single pooled machine, divisible
tasks of one size per user and an unbounded queue; these numbers are its predictions, which the
measured ``soft_fairness`` of a run (metrics.json) can be held against.
"""

from __future__ import annotations

import numpy as np

from fairstream.core.fairness import drf_max_shares, drf_max_tasks, drf_phi, sharing_incentive_rho, soft_fairness_theta
from fairstream.sim.scenario import Scenario


def scenario_demands(scenario: Scenario) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
    """(tenants, average demand per tenant, weights summing to 1, total capacity)."""
    sums: dict[str, np.ndarray] = {}
    counts: dict[str, int] = {}
    for task in scenario.tasks:
        sums[task.tenant] = sums.get(task.tenant, 0) + scenario.resources.vector(task.demand) * task.tasks
        counts[task.tenant] = counts.get(task.tenant, 0) + task.tasks
    tenants = sorted(sums)
    demands = np.array([sums[t] / counts[t] for t in tenants]) if tenants else np.zeros((0, len(scenario.resources)))
    fractions = np.array([scenario.tree.effective_share.get(t, 0.0) for t in tenants])
    weights = fractions / fractions.sum() if fractions.sum() > 0 else fractions
    capacity = sum((scenario.resources.vector(node.capacity, "capacity") for node in scenario.nodes),
                   np.zeros(len(scenario.resources)))
    return tenants, demands, weights, capacity


def knob_theory(scenario: Scenario, rhos: list[float]) -> dict:
    tenants, demands, weights, capacity = scenario_demands(scenario)
    names = scenario.resources.names
    return {
        "model": "QKnobler section 5.1: one pooled machine, each tenant's tasks of its average demand",
        "capacity": dict(zip(names, capacity.tolist())),
        "phi": drf_phi(demands, weights, capacity),
        "sharing_incentive_rho": sharing_incentive_rho(demands, weights, capacity),
        "theta": {f"{rho:g}": soft_fairness_theta(demands, weights, capacity, rho) for rho in rhos},
        "tenants": {
            tenant: {"weight": float(w), "average_demand": dict(zip(names, d.tolist())),
                     "drf_max_share": float(s), "drf_tasks": float(n)}
            for tenant, w, d, s, n in zip(tenants, weights, demands, drf_max_shares(demands, weights, capacity),
                                          drf_max_tasks(demands, weights, capacity))
        },
    }


__all__ = ["knob_theory", "scenario_demands"]
