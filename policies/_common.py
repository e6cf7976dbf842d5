"""Helpers shared by several policies: parameter sets and key arithmetic."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from fairstream.core.accounting import AccountingConfig
from fairstream.core.fairness import marginal_counted, normalised_usage
from fairstream.core.model import ModelError, ResourceSpace, Task
from fairstream.core.placement import Cycle
from fairstream.core.preemption import PreemptionRule, snapshot_fair_shares
from fairstream.core.snapshot import Snapshot
from fairstream.policies.base import Param, parse_choice, parse_fraction, parse_name, parse_non_negative, parse_positive

RESOURCE_PARAM = Param(
    "resource", "auto", parse_name,
    "resource the policy is fair on (single-resource mode); 'dominant' for the dominant share; 'auto': mem where "
    "the cluster has it (as YARN's memory), else the dominant share",
)

#: Parameters of the long-term family; ``long_term_accounting`` makes the engine's accounting from them.
LONG_TERM_PARAMS = (
    RESOURCE_PARAM,
    Param("quantum", 60.0, parse_non_negative, "initial task time quantum Q0 in seconds (formula 15)"),
    Param("quantum_mode", "adaptive", parse_choice("adaptive", "fixed"),
          "adaptive: the Quantum Updater tunes Q per queue from finished tasks; fixed: Q0 always"),
    Param("round", math.inf, parse_positive, "round length L in seconds (S-LTMM, formula 12); inf = F-LTMM"),
    Param("discount", 1.0, parse_fraction, "eta, the rate at which resources beyond the share are counted (formula 7)"),
    Param("half_life", math.inf, parse_positive,
          "seconds of event time in which accumulated usage decays by half (Slurm's PriorityDecayHalfLife); "
          "inf = no decay"),
)


def parse_threshold(text: str) -> float:
    """A preemption threshold: in (0, 1]. 0 would call no tenant starved, so nothing would ever
    be preempted: that is ``preemption=off``, said so."""
    value = parse_fraction(text)
    if value == 0:
        raise ValueError("must be > 0: no tenant is below 0 x its fair share, so nothing would ever be preempted "
                         "(to turn preemption off, set preemption=off)")
    return value


#: Preemption toward fair share (``fairstream.core.preemption``), for fair, drf, ltrf, hltrf.
PREEMPTION_PARAMS = (
    Param("preemption", "off", parse_choice("off", "on"),
          "on: take room back from tenants above their fair share for a tenant starved past preemption_timeout"),
    Param("preemption_timeout", 60.0, parse_non_negative,
          "seconds of event time a tenant must stay below preemption_threshold x its fair share, with pending "
          "work some node could hold, before victims are chosen (YARN's fairSharePreemptionTimeout)"),
    Param("preemption_threshold", 0.5, parse_threshold,
          "a tenant below this fraction of its fair share is starved (YARN's fairSharePreemptionThreshold)"),
)


#: Node reservation for the first task in line that fits no node's free room (YARN Fair
#: Scheduler's reservation; with ``backfill``, Slurm's backfill): the engine keeps the room that
#: frees on one node for it (``Snapshot.reservation``).
RESERVATION_PARAM = Param(
    "reservation", "on", parse_choice("on", "backfill", "off"),
    "on: the first task in the policy's order that fits no node's free room reserves one node; room freed there "
    "is kept for it; backfill: the same, but a task that fits nowhere else may take room there if its run-time "
    "estimate says it ends before the reserved task can start (by the estimates of the tasks running there); "
    "off: freed room goes to whatever fits it")
GANG_HOLD_PARAM = Param(
    "gang_hold", 300.0, parse_non_negative,
    "seconds a gang first in line (reservation on or backfill) may keep the room of the nodes it waits for "
    "from others; then it holds nothing for as long (docs/workloads.md, Gangs)")
#: The reservation and how long a gang may hold nodes (``RESERVATION_PARAM``, ``GANG_HOLD_PARAM``).
RESERVATION_PARAMS = (RESERVATION_PARAM, GANG_HOLD_PARAM)


def preemption_rule(params: Mapping[str, Any]) -> PreemptionRule | None:
    """The rule ``PREEMPTION_PARAMS`` ask for, None when ``preemption=off``."""
    if params["preemption"] != "on":
        return None
    return PreemptionRule(threshold=params["preemption_threshold"], timeout=params["preemption_timeout"])


def resource_index(resources: ResourceSpace, name: str) -> int | None:
    """Index of the named resource, or None for 'dominant'; the one check of ``--param resource``.
    'auto' (the default) is mem where the cluster has it, else 'dominant': a default that works on
    every cluster (it was mem, which a cpu-only cluster refused though no ``--param`` was given)."""
    if name == "auto":
        return resources.index("mem") if "mem" in resources.names else None
    if name == "dominant":
        return None
    if name not in resources.names:
        known = ", ".join(resources.names)
        raise ModelError(f"--param resource={name}: not a resource of this cluster (known: {known}, dominant, auto)")
    return resources.index(name)


def resource_label(snapshot) -> str:
    """The name of the resource ``snapshot``'s policy is fair on (``resource_index``), or 'dominant'."""
    index = snapshot.accounting.resource
    return "dominant" if index is None else snapshot.resources.names[index]


def resource_accounting(resources: ResourceSpace, params: Mapping[str, Any]) -> AccountingConfig:
    """A memoryless policy fair on one resource: only the resource is set (the policy reads
    ``Snapshot.accounting.resource``)."""
    return AccountingConfig(resource=resource_index(resources, params["resource"]))


def long_term_accounting(resources: ResourceSpace, params: Mapping[str, Any]) -> AccountingConfig:
    """The accounting ``LONG_TERM_PARAMS`` ask for: round length L (formula 12), discount eta
    (formula 7), time quantum Q0 and whether it adapts (formula 15), and the resource keyed on."""
    return AccountingConfig(
        round_length=params["round"],
        discount=params["discount"],
        quantum=params["quantum"],
        adaptive_quantum=params["quantum_mode"] == "adaptive",
        resource=resource_index(resources, params["resource"]),
        half_life=params["half_life"],
    )


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

    def per_weight(self) -> Callable[[str, Any], float]:
        """A preemption victim key (``preemption.reclaim``'s): the tenant's usage per its
        weight (effective share), LTRF's own order (formula 11): the most served go first."""
        rows, fraction = self.snapshot.rows, self.snapshot.share_fraction

        def key(tenant: str, allocation) -> float:
            return self.key(rows[tenant]) / fraction[rows[tenant]]

        return key

    def per_fair_share(self) -> Callable[[str, Any], float]:
        """A preemption victim key (``preemption.reclaim``'s): the tenant's usage per its fair
        share (``snapshot_fair_shares``, made when first asked), inf with none. ``hltrf``'s: its
        walk gives an idle sibling's part to the busy ones, so the leaf it served must not look
        furthest ahead by a weight it no longer has."""
        rows = self.snapshot.rows
        fair: list[np.ndarray] = []  # made on the first ask

        def key(tenant: str, allocation) -> float:
            if not fair:
                fair.append(snapshot_fair_shares(self.snapshot))
            share = fair[0][rows[tenant]]
            return self.key(rows[tenant]) / share if share > 0 else float("inf")

        return key
