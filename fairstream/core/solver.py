"""Integer programs for the efficiency-oriented policies, solved in process through pulp.

One helper, ``solve_packing``, builds the variables and the base constraints (capacity per
resource, bounds per item), solves with HiGHS in process (``highspy``), checks the solver's
status and returns a typed result. A failed solve raises ``SolverError``: the caller decides, in
the open, what to do instead. Never print-and-continue.

The packing program is handed to HiGHS directly as arrays (a row-wise sparse matrix): it is
solved once per QKnobler pass, and building it through pulp's modelling objects cost more than
the solve (about 1 ms of a 4 ms pass at 100 tenants, against 0.2 ms for the solve; docs/benchmarks.md). pulp, with the
same HiGHS, stays for the divisible-task placement LP (``solve_placement_lp``), which is not on
the scheduling path. (pulp's bundled CBC starts a process per solve: about 4.7 ms each here.)

Determinism: HiGHS runs single-threaded with no time limit, so the same program always gives
the same answer. Instead of a time limit, ``abs_gap`` stops the search once the incumbent is
provably within that much objective of the optimum (QKnobler passes the value of its smallest
task: "optimal to within one task"). Without it, multi-dimensional knapsacks with a hundred item
kinds can take HiGHS seconds to prove optimality (measured: 4.4 s for 100 kinds, 3 resources).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

#: Integrality and capacity tolerance when reading the solver's values back.
TOLERANCE = 1e-6


_banner_silenced = False


def _new_highs():
    """A HiGHS solver. The first one built in a process prints HiGHS's banner on the process's
    standard output from C, before any option can turn it off; our commands print JSON there
    (``simulate``, ``bench``), so that one is built with the descriptor pointed at /dev/null."""
    import os
    import sys

    import highspy

    global _banner_silenced
    if _banner_silenced:
        return highspy.Highs()
    sys.stdout.flush()
    saved, devnull = os.dup(1), os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        solver = highspy.Highs()
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(devnull)
    _banner_silenced = True
    return solver


class SolverError(RuntimeError):
    """The solver did not return an optimal solution; the message names its status."""


@dataclass(frozen=True)
class PackingSolution:
    """``counts[i]`` items of kind ``i``; ``objective = values @ counts``."""

    counts: np.ndarray
    objective: float
    status: str  # "optimal" (within abs_gap), "rounded" (LP relaxation rounded) or "trivial" (no solve)
    bound: float = 0.0  # an upper bound on the optimum (the LP relaxation's value when rounded)


class PackingProgram:
    """The rows and extra variables ``solve_packing``'s ``extra`` callback may add.

    Variables are column indices: ``0 .. items-1`` are the item counts; ``add_binary`` adds more.
    A row is ``lower <= sum(coefficient * variable) <= upper`` (either side may be open)."""

    def __init__(self, items: int) -> None:
        self.columns = items  # the columns after the items are binaries
        self.rows: list[tuple[list[tuple[int, float]], float, float]] = []

    def add_binary(self) -> int:
        self.columns += 1
        return self.columns - 1

    def add_row(self, terms: list[tuple[int, float]], lower: float = -np.inf, upper: float = np.inf) -> None:
        self.rows.append(([(int(v), float(c)) for v, c in terms if c != 0.0], float(lower), float(upper)))


Extra = Callable[[PackingProgram, list[int]], None]


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
    ``n`` integer, plus whatever ``extra(program, variables)`` adds (``PackingProgram`` rows).

    Inputs: ``values`` (items), ``demands`` (items x resources), ``capacity`` (resources),
    ``upper`` (items, whole numbers). Raises ``SolverError`` unless the solve is optimal.
    With ``integer=False`` the LP relaxation is solved (about 1 ms for 100 items) and rounded:
    every count down, then the most valuable items first into what is left. With m resources a
    basic LP solution has at most m fractional counts, so the result is within m items' value of
    the optimum; ``bound`` is the LP's value, so the gap is known. ``extra`` is not applied then.
    """
    import highspy

    upper = np.floor(np.maximum(upper, 0.0) + TOLERANCE)
    items = len(values)
    if not items or not upper.any():
        return PackingSolution(np.zeros(items), 0.0, "trivial")
    program = PackingProgram(items)
    for k in range(demands.shape[1]):
        used = np.flatnonzero(demands[:, k] > 0)
        if len(used):
            program.add_row(list(zip(used.tolist(), demands[used, k].tolist())), upper=float(capacity[k]))
    if extra is not None and integer:
        extra(program, list(range(items)))

    if items == 1 and program.columns == 1 and len(program.rows) <= demands.shape[1] and values[0] > 0:
        # One item and its resource rows alone: n = min(upper, floor(min_k capacity_k / d_k)),
        # what the program's solve (or its LP's rounding) comes to, without building it.
        # (Most of a busy cluster's passes: qknobler's tasks of one shape share one item.)
        asked = demands[0] > 0
        room = float((capacity[asked] / demands[0][asked]).min()) if asked.any() else float(upper[0])
        count = min(float(upper[0]), float(np.floor(max(room, 0.0) + TOLERANCE)))
        value = float(values[0]) * count
        if integer:
            return PackingSolution(np.array([count]), value, "optimal")
        return PackingSolution(np.array([count]), value, "rounded", float(values[0]) * min(float(upper[0]), room))

    columns = program.columns
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = columns, len(program.rows)
    lp.sense_ = highspy.ObjSense.kMaximize
    lp.col_cost_ = np.concatenate([values, np.zeros(columns - items)]).astype(float)
    lp.col_lower_ = np.zeros(columns)
    lp.col_upper_ = np.concatenate([upper, np.ones(columns - items)]).astype(float)
    lp.row_lower_ = np.array([lower for _, lower, _ in program.rows], dtype=float)
    lp.row_upper_ = np.array([upper_ for _, _, upper_ in program.rows], dtype=float)
    starts: list[int] = [0]
    indices: list[int] = []
    coefficients: list[float] = []
    for terms, _, _ in program.rows:
        indices.extend(v for v, _ in terms)
        coefficients.extend(c for _, c in terms)
        starts.append(len(indices))
    lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
    lp.a_matrix_.num_col_, lp.a_matrix_.num_row_ = columns, len(program.rows)
    lp.a_matrix_.start_ = np.array(starts, dtype=np.int32)
    lp.a_matrix_.index_ = np.array(indices, dtype=np.int32)
    lp.a_matrix_.value_ = np.array(coefficients, dtype=np.float64)
    if integer:
        lp.integrality_ = [highspy.HighsVarType.kInteger] * columns

    solver = _new_highs()
    for option, value in (("output_flag", False), ("threads", 1), ("mip_rel_gap", 0.0),
                          ("mip_abs_gap", float(abs_gap))):
        solver.setOptionValue(option, value)
    try:
        solver.passModel(lp)
        solver.run()
    except Exception as exc:  # report it, do not hide it
        raise SolverError(f"HiGHS failed: {exc!r}") from exc
    status = solver.getModelStatus()
    if status != highspy.HighsModelStatus.kOptimal:
        raise SolverError(f"HiGHS status {solver.modelStatusToString(status)}")
    raw = np.array(solver.getSolution().col_value[:items])
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
    machines array); raises ``SolverError`` unless optimal. For ``fairstream.lab.divisible``."""
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


__all__ = ["PackingProgram", "PackingSolution", "SolverError", "solve_packing", "solve_placement_lp"]
