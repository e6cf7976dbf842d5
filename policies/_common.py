"""Helpers shared by several policies: parameter sets and key arithmetic."""

from __future__ import annotations

import math

import numpy as np

from fairstream.core.fairness import marginal_counted, normalised_usage
from fairstream.core.model import ModelError, Task
from fairstream.core.placement import Cycle
from fairstream.core.snapshot import Snapshot
from fairstream.policies.base import Param, parse_choice, parse_float, parse_name


def _positive(text: str) -> float:
    value = parse_float(text)
    if value <= 0:
        raise ValueError("must be > 0")
    return value


def _non_negative(text: str) -> float:
    value = parse_float(text)
    if value < 0:
        raise ValueError("must be >= 0")
    return value


def _fraction(text: str) -> float:
    value = parse_float(text)
    if not 0 <= value <= 1:
        raise ValueError("must be in [0, 1]")
    return value


RESOURCE_PARAM = Param(
    "resource", "mem", parse_name,
    "resource the policy is fair on (single-resource mode, as YARN's memory); 'dominant' for the dominant share",
)

#: Parameters of the long-term family. The engine's accounting is configured from these.
LONG_TERM_PARAMS = (
    RESOURCE_PARAM,
    Param("quantum", 60.0, _non_negative, "initial task time quantum Q0 in seconds (formula 15)"),
    Param("quantum_mode", "adaptive", parse_choice("adaptive", "fixed"),
          "adaptive: the Quantum Updater tunes Q per queue from finished tasks; fixed: Q0 always"),
    Param("round", math.inf, _positive, "round length L in seconds (S-LTMM, formula 12); inf = F-LTMM"),
    Param("discount", 1.0, _fraction, "eta, the rate at which resources beyond the share are counted (formula 7)"),
)


def resource_index(snapshot: Snapshot, name: str) -> int | None:
    """Index of the named resource, or None for 'dominant'."""
    if name == "dominant":
        return None
    if name not in snapshot.resources.names:
        known = ", ".join(snapshot.resources.names)
        raise ModelError(f"--param resource={name}: not a resource of this cluster (known: {known}, dominant)")
    return snapshot.resources.index(name)


class LongTermUsage:
    """Accumulated usage of every tenant as a pass charges placements to it (what-if copy)."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot
        self.vectors = snapshot.accumulated.copy()
        self.resource = snapshot.accounting.resource
        self.discount = snapshot.accounting.discount

    def key(self, row: int) -> float:
        """``f_i``: normalised accumulated usage plus PAR (unweighted)."""
        snap = self.snapshot
        return normalised_usage(self.vectors[row], snap.capacity, self.resource) + float(snap.pseudo_accumulated[row])

    def charge(self, cycle: Cycle, row: int, task: Task) -> np.ndarray:
        """Count a new placement as ``Q * (g'(g + d) - g'(g))``: the task's assumed time (one
        quantum, formula 15) at the counted rate of formula 7. Returns the added vector."""
        snap = self.snapshot
        if self.discount == 1.0:  # nothing is discounted: the marginal count is the demand
            added = snap.quantum[row] * task.demand
        else:
            before = cycle.allocation[row] - task.demand
            added = snap.quantum[row] * marginal_counted(before, snap.share[row], task.demand, self.discount)
        self.vectors[row] += added
        return added
