"""The TSF paper's allocation rules in its own model: divisible tasks, one task shape per job,
placement constraints (Wang, Li, Liang and Li, SIGMETRICS'16, section 2 and Table 1).

Used to check the sharing properties of the *rules* themselves by brute force on small
instances (``tests/policies/test_tsf.py``), apart from what whole tasks do to them in the scheduler.

An instance is ``capacity`` (machines x resources), ``demands`` (jobs x resources) and
``allowed`` (jobs x machines, bool). An allocation is ``x`` (jobs x machines): how many tasks of
each job run on each machine, fractional. Every rule here is *progressive filling* of a
per-job share ``alpha_i * sum_m x_im``: raise the lowest shares together (a linear program per
level) and freeze the jobs that cannot grow further, until all are frozen:

- ``tsf``: ``alpha_i = 1 / h_i``, h_i = tasks job i could run on the whole cluster alone with its
  constraints removed (the task share);
- ``drfh``: ``alpha_i = max_r d_ir / C_r``, C = the whole cluster's capacity (global dominant share);
- ``cdrf``: ``alpha_i = max_r d_ir / P_ir``, P_i = the capacity of the machines job i may use;
- ``pmdrf``: each machine on its own, ``alpha_im = max_r d_ir / c_mr`` (per-machine DRF).
"""

from __future__ import annotations

import itertools

import numpy as np

from fairstream.core.solver import SolverError, solve_placement_lp

TOLERANCE = 1e-7


def progressive_filling(capacity: np.ndarray, demands: np.ndarray, allowed: np.ndarray,
                        alpha: np.ndarray) -> np.ndarray:
    """Lexicographic max-min of ``alpha_i * sum_m x_im`` (jobs with alpha 0 get nothing)."""
    import pulp

    jobs = len(demands)
    frozen: dict[int, float] = {i: 0.0 for i in range(jobs) if alpha[i] <= 0 or not allowed[i].any()}
    def share(x_vars, i):
        return pulp.lpSum(x_vars[i, m] for m in range(allowed.shape[1]) if (i, m) in x_vars) * float(alpha[i])

    while len(frozen) < jobs:
        def keep(problem, x_vars, level, raise_all=True):
            for i in range(jobs):
                if i in frozen:
                    problem += share(x_vars, i) == frozen[i]
                elif raise_all:
                    problem += share(x_vars, i) >= level
        top, x = solve_placement_lp(lambda x_vars, level: level, capacity, demands, allowed, keep)
        grew = False
        for j in [i for i in range(jobs) if i not in frozen]:
            def others_at_top(problem, x_vars, level, j=j):
                problem += level == 0  # unused here
                for i in range(jobs):
                    if i in frozen:
                        problem += share(x_vars, i) == frozen[i]
                    elif i != j:
                        problem += share(x_vars, i) >= top  # noqa: B023 (called before the loop moves on)
            best, _ = solve_placement_lp(lambda x_vars, level, j=j: share(x_vars, j), capacity, demands, allowed, others_at_top)
            if best <= top + TOLERANCE:
                frozen[j] = top
            else:
                grew = True
        if not grew and len(frozen) < jobs:  # numerical corner: freeze the rest at the level
            frozen.update({i: top for i in range(jobs) if i not in frozen})
    def at_levels(problem, x_vars, level):
        problem += level == 0
        for i in range(jobs):
            problem += share(x_vars, i) == frozen[i]

    _, x = solve_placement_lp(lambda x_vars, level: pulp.lpSum(x_vars.values()), capacity, demands, allowed, at_levels)
    return x


def monopoly(capacity: np.ndarray, demand: np.ndarray) -> float:
    """h_i in the divisible model: sum over machines of min_r c_mr / d_r."""
    need = demand > 0
    return float((capacity[:, need] / demand[need]).min(axis=1).sum())


def pool_tasks(capacity: np.ndarray, demands: np.ndarray, allowed: np.ndarray, pools: np.ndarray) -> np.ndarray:
    """k_i: tasks job i could run in its dedicated pool (``pools``: jobs x machines fractions)."""
    out = np.zeros(len(demands))
    for i, d in enumerate(demands):
        mine = (pools[i][:, None] * capacity)[allowed[i]]
        out[i] = monopoly(mine, d) if len(mine) else 0.0
    return out


def weights(rule: str, capacity, demands, allowed, pools) -> np.ndarray:
    """TSF: Theorem 1's ``w_i = k_i / h_i``; the DRF variants: equal weights (their setting)."""
    if rule != "tsf":
        return np.ones(len(demands))
    return np.array([k / monopoly(capacity, d) for k, d in zip(pool_tasks(capacity, demands, allowed, pools), demands)])


def allocate(rule: str, capacity: np.ndarray, demands: np.ndarray, allowed: np.ndarray,
             pools: np.ndarray | None = None, fixed_weights: np.ndarray | None = None) -> np.ndarray:
    """The allocation ``rule`` (tsf, drfh, cdrf, pmdrf) gives, jobs x machines; ``pools`` are
    the jobs' dedicated pools (default: 1/n of every machine), which set TSF's weights."""
    if pools is None:
        pools = np.full(allowed.shape, 1.0 / len(demands))
    if rule == "pmdrf":
        x = np.zeros(allowed.shape)
        for m in range(allowed.shape[1]):
            alpha = (demands / capacity[m]).max(axis=1) * allowed[:, m]
            only_here = np.zeros_like(allowed)
            only_here[:, m] = allowed[:, m]
            x[:, m] = progressive_filling(capacity, demands, only_here, alpha)[:, m]
        return x
    if rule == "tsf":  # task share over weight: x_i / h_i / (k_i / h_i)
        w = fixed_weights if fixed_weights is not None else weights(rule, capacity, demands, allowed, pools)
        alpha = np.array([1.0 / (monopoly(capacity, d) * wi) if wi > 0 else 0.0 for d, wi in zip(demands, w)])
    elif rule == "drfh":
        alpha = (demands / capacity.sum(axis=0)).max(axis=1)
    elif rule == "cdrf":
        alpha = np.array([(d / capacity[allowed[i]].sum(axis=0)).max() for i, d in enumerate(demands)])
    else:
        raise ValueError(f"unknown rule {rule!r}")
    return progressive_filling(capacity, demands, allowed, alpha)


# ------------------------------------------------------------------------------ properties


def sharing_incentive(capacity, demands, allowed, x, pools, w) -> str | None:
    """Each job runs at least what it could in its dedicated pool."""
    for i, alone in enumerate(pool_tasks(capacity, demands, allowed, pools)):
        if x[i].sum() < alone - TOLERANCE:
            return f"j{i} runs {x[i].sum():.4g} < {alone:.4g} in its dedicated pool"
    return None


def envy_free(capacity, demands, allowed, x, pools, w) -> str | None:
    """No job could run more with another's allocation, per weight: n_i >= (w_i/w_j) n_{i<->j}."""
    for i, j in itertools.permutations(range(len(demands)), 2):
        need = demands[i] > 0
        bundles = x[j][:, None] * demands[j][None, :]  # machines x resources job j holds
        theirs = float((bundles[allowed[i]][:, need] / demands[i][need]).min(axis=1).sum()) if allowed[i].any() else 0.0
        theirs *= w[i] / w[j] if w[j] > 0 else 0.0
        if theirs > x[i].sum() + TOLERANCE:
            return f"j{i} runs {x[i].sum():.4g} but would run {theirs:.4g} with j{j}'s allocation"
    return None


def pareto_optimal(capacity, demands, allowed, x, pools, w) -> str | None:
    """No allocation gives every job at least as much and the jobs more in total."""
    import pulp

    totals = x.sum(axis=1)

    def at_least(problem, x_vars, level):
        problem += level == 0
        for i in range(len(demands)):
            problem += pulp.lpSum(v for (j, _), v in x_vars.items() if j == i) >= float(totals[i]) - TOLERANCE

    best, _ = solve_placement_lp(lambda x_vars, level: pulp.lpSum(x_vars.values()), capacity, demands, allowed, at_least)
    if best > totals.sum() + 1e-5:
        return f"{best:.4g} tasks possible with nobody worse off, {totals.sum():.4g} allocated"
    return None


def strategy_proof(rule, capacity, demands, allowed, x, pools) -> str | None:
    """No job runs more of its real tasks by reporting a larger demand or other machines."""
    machines = allowed.shape[1]
    for i, d in enumerate(demands):
        honest = x[i].sum()
        lies = [("demand", d + np.eye(len(d))[r] * d.max(), allowed[i]) for r in range(len(d))]
        lies += [("constraints", d, np.array([m in subset for m in range(machines)]))
                 for size in range(1, machines + 1) for subset in itertools.combinations(range(machines), size)
                 if not np.array_equal(np.array([m in subset for m in range(machines)]), allowed[i])]
        for what, told_demand, told_allowed in lies:
            told_demands, told_allowed_all = demands.copy(), allowed.copy()
            told_demands[i], told_allowed_all[i] = told_demand, told_allowed
            # The weights come from the pools the operator gave, not from what a job tells.
            lied = allocate(rule, capacity, told_demands, told_allowed_all, pools,
                            fixed_weights=weights(rule, capacity, demands, allowed, pools))
            need = d > 0
            # Real tasks it can run in what it got, on the machines it can really use.
            got = lied[i][:, None] * told_demand[None, :]
            useful = float((got[allowed[i]][:, need] / d[need]).min(axis=1).sum()) if allowed[i].any() else 0.0
            if useful > honest + 1e-5:
                return (f"j{i} runs {useful:.4g} > {honest:.4g} by reporting {what} "
                        f"{told_demand.tolist()} on machines {np.flatnonzero(told_allowed).tolist()}")
    return None


def violations(rule: str, capacity: np.ndarray, demands: np.ndarray, allowed: np.ndarray,
               pools: np.ndarray | None = None) -> dict[str, str]:
    """The properties ``rule`` breaks on this instance, each with a one-line counterexample."""
    if pools is None:
        pools = np.full(allowed.shape, 1.0 / len(demands))
    x = allocate(rule, capacity, demands, allowed, pools)
    w = weights(rule, capacity, demands, allowed, pools)
    found = {}
    for name, check in (("SI", sharing_incentive), ("EF", envy_free), ("PO", pareto_optimal)):
        why = check(capacity, demands, allowed, x, pools, w)
        if why:
            found[name] = why
    why = strategy_proof(rule, capacity, demands, allowed, x, pools)
    if why:
        found["SP"] = why
    return found


__all__ = ["allocate", "violations", "progressive_filling", "monopoly", "pool_tasks", "weights", "SolverError"]
