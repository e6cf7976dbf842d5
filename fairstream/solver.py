"""Integer programs for the efficiency-oriented policies, solved in process through pulp.

One helper, ``solve_packing``, builds the variables and the base constraints (capacity per
resource, bounds per item), solves with HiGHS through pulp (``highspy``: in process, about
0.4 ms fixed cost per solve here, against about 4.7 ms for pulp's bundled CBC, which starts a
process per solve), checks the solver's status and returns a typed result. A failed solve raises
``SolverError``: the caller decides, in the open, what to do instead. Never print-and-continue.

Determinism: HiGHS runs single-threaded with no time limit, so the same program always gives
the same answer. Instead of a time limit, ``abs_gap`` stops the search once the incumbent is
provably within that much objective of the optimum (QKnobler passes the value of its smallest
task: "optimal to within one task"). Without it, multi-dimensional knapsacks with a hundred item
kinds can take HiGHS seconds to prove optimality (measured: 4.4 s for 100 kinds, 3 resources).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

#: Integrality and capacity tolerance when reading the solver's values back.
TOLERANCE = 1e-6


class SolverError(RuntimeError):
    """The solver did not return an optimal solution; the message names its status."""


@dataclass(frozen=True)
class PackingSolution:
    """``counts[i]`` items of kind ``i``; ``objective = values @ counts``."""

    counts: np.ndarray
    objective: float
    status: str  # "optimal" (within abs_gap), "rounded" (LP relaxation rounded) or "trivial" (no solve)
    bound: float = 0.0  # an upper bound on the optimum (the LP relaxation's value when rounded)


Extra = Callable[[object, list], None]


def solve_packing(
    values: np.ndarray,
    demands: np.ndarray,
    capacity: np.ndarray,
    upper: np.ndarray,
    *,
    abs_gap: float = 0.0,
    extra: Extra | None = None,
    integer: bool = True,
) -> PackingSolution:
    """Maximise ``values @ n`` subject to ``demands.T @ n <= capacity``, ``0 <= n <= upper``,
    ``n`` integer, plus whatever ``extra(problem, variables)`` adds (pulp constraints).

    Inputs: ``values`` (items), ``demands`` (items x resources), ``capacity`` (resources),
    ``upper`` (items, whole numbers). Raises ``SolverError`` unless the solve is optimal.
    With ``integer=False`` the LP relaxation is solved (about 1 ms for 100 items) and rounded:
    every count down, then the most valuable items first into what is left. With m resources a
    basic LP solution has at most m fractional counts, so the result is within m items' value of
    the optimum; ``bound`` is the LP's value, so the gap is known. ``extra`` is not applied then.
    """
    import pulp

    upper = np.floor(np.maximum(upper, 0.0) + TOLERANCE)
    if not len(values) or not upper.any():
        return PackingSolution(np.zeros(len(values)), 0.0, "trivial")
    problem = pulp.LpProblem("packing", pulp.LpMaximize)
    category = pulp.LpInteger if integer else pulp.LpContinuous
    variables = [problem.add_variable(f"n{i}", 0, int(bound), cat=category) for i, bound in enumerate(upper)]
    problem += pulp.LpAffineExpression(list(zip(variables, values.tolist())))
    for k in range(demands.shape[1]):
        column = demands[:, k]
        used = [(variables[i], float(column[i])) for i in np.flatnonzero(column > 0)]
        if used:
            problem += pulp.LpAffineExpression(used) <= float(capacity[k]), f"capacity_{k}"
    if extra is not None and integer:
        extra(problem, variables)
    solver = pulp.HiGHS(msg=False, threads=1, gapRel=0.0, gapAbs=float(abs_gap))
    try:
        status = problem.solve(solver)
    except Exception as exc:  # e.g. a HiGHS status pulp cannot map; report it, do not hide it
        raise SolverError(f"HiGHS through pulp failed: {exc!r}") from exc
    if status != pulp.LpStatusOptimal or problem.sol_status != pulp.LpSolutionOptimal:
        raise SolverError(f"HiGHS status {pulp.LpStatus.get(status, status)} "
                          f"(solution: {pulp.LpSolution.get(problem.sol_status, problem.sol_status)})")
    raw = np.array([v.varValue or 0.0 for v in variables])
    if not integer:
        return _rounded(raw, values, demands, capacity, upper)
    counts = np.round(raw)
    if np.abs(raw - counts).max() > TOLERANCE or (demands.T @ counts > capacity + TOLERANCE).any():
        raise SolverError("HiGHS returned a solution that is not integral or not within capacity")
    return PackingSolution(counts, float(values @ counts), "optimal")


def solve_placement_lp(objective, capacity: np.ndarray, demands: np.ndarray, allowed: np.ndarray, rows):
    """A linear program over fractional placements ``x[i, m]`` (job i's tasks on machine m, only
    where ``allowed``) within every machine's capacity, plus a free variable ``level``: maximise
    ``objective(x, level)`` subject to ``rows(problem, x, level)``. Returns (optimum, x as a jobs x
    machines array); raises ``SolverError`` unless optimal. For ``fairstream.divisible``."""
    import pulp

    jobs, machines = allowed.shape
    problem = pulp.LpProblem("placement", pulp.LpMaximize)
    x = {(i, m): problem.add_variable(f"x_{i}_{m}", 0) for i in range(jobs) for m in range(machines) if allowed[i, m]}
    level = problem.add_variable("level", None)
    problem += objective(x, level)
    for m in range(machines):
        for r in range(capacity.shape[1]):
            used = [(x[i, m], float(demands[i, r])) for i in range(jobs) if (i, m) in x and demands[i, r] > 0]
            if used:
                problem += pulp.LpAffineExpression(used) <= float(capacity[m, r])
    rows(problem, x, level)
    status = problem.solve(pulp.HiGHS(msg=False, threads=1))
    if status != pulp.LpStatusOptimal:
        raise SolverError(f"HiGHS status {pulp.LpStatus.get(status, status)}")
    out = np.zeros((jobs, machines))
    for (i, m), variable in x.items():
        out[i, m] = variable.varValue or 0.0
    return pulp.value(problem.objective), out


def _rounded(raw: np.ndarray, values: np.ndarray, demands: np.ndarray, capacity: np.ndarray,
             upper: np.ndarray) -> PackingSolution:
    counts = np.minimum(np.floor(raw + TOLERANCE), upper)
    left = (capacity - demands.T @ counts).tolist()
    rows, bounds, taken = demands.tolist(), upper.tolist(), counts.tolist()
    for i in sorted(range(len(rows)), key=lambda i: (-values[i], i)):  # most valuable first
        room = min((have / need for have, need in zip(left, rows[i]) if need > 0), default=bounds[i])
        more = max(0.0, min(bounds[i] - taken[i], float(int(room + TOLERANCE))))
        if more:
            taken[i] += more
            left = [have - more * need for have, need in zip(left, rows[i])]
    counts = np.array(taken)
    return PackingSolution(counts, float(values @ counts), "rounded", float(values @ raw))


__all__ = ["PackingSolution", "SolverError", "solve_packing", "solve_placement_lp"]
