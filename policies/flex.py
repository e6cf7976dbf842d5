"""``flex``: the FLEX meta-scheduler (the FLEX paper, Algorithm 1): at every pass, characterise
the active workload by its complementary degree (formulas 1-4), ask the trained decision tree
which candidate (FIFO, Fair, DRF, Perf) best meets the SLA, and let that candidate decide.

Algorithm 1 switches the scheduler when the degree changes (jobs arrive or finish); since the
model is deterministic and the policies keep no state, choosing at every pass is the same
thing. Each decision names the candidate that made it in ``policy`` and FLEX's choice in its
reason. The engine owns the accounting (usage, quanta, shares), so a switch leaves it as it was.

SLA, one of: ``max_fairness_loss=F`` (maximise the makespan reduction E with fairness loss at
most F) or ``min_makespan_reduction=E`` (minimise F with E at least that), both against DRF
(formulas 6-8). With ``max_fairness_loss=0`` only DRF qualifies, whatever the model says.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fairstream.core.flex import DEFAULT_MODEL, FlexModel, complementary_degree, load_model
from fairstream.core.model import Decision, ModelError
from fairstream.core.snapshot import Snapshot
from fairstream.policies import drf, fair, fifo, perf
from fairstream.policies.base import Ordering, Param, PolicySpec, parse_non_negative

CANDIDATE_SPECS = {"fifo": fifo.SPEC, "fair": fair.SPEC, "drf": drf.SPEC, "perf": perf.SPEC}


def _optional(text: str):
    return None if text in ("", "none") else parse_non_negative(text)


def _model(text: str) -> FlexModel:
    try:
        return load_model(text)
    except ModelError as exc:
        raise ValueError(str(exc).split(": ", 1)[-1]) from None


PARAMS = (
    Param("max_fairness_loss", None, _optional, "SLA: fairness loss F (formula 8, vs DRF) at most this; "
                                                "the default SLA is max_fairness_loss=0.1"),
    Param("min_makespan_reduction", None, _optional, "SLA: makespan reduction E (formula 6, vs DRF) at least this"),
    Param("model", str(DEFAULT_MODEL), _model, "decision-tree model file (fairstream train-flex); a trained one ships",
          show=lambda model: model.source if isinstance(model, FlexModel) else model),
)


def sla(params: Mapping[str, Any]) -> tuple[str, float]:
    loss, reduction = params["max_fairness_loss"], params["min_makespan_reduction"]
    if loss is not None and reduction is not None:
        raise ModelError("flex: give max_fairness_loss or min_makespan_reduction, not both")
    if reduction is not None:
        return "min_makespan_reduction", reduction
    return "max_fairness_loss", 0.1 if loss is None else loss


def prepare(params: dict[str, Any]) -> None:
    """Check the SLA and load the default model (given models were loaded when parsed); the
    model must have a tree for the SLA, or every pass would fail."""
    kind, _ = sla(params)
    if isinstance(params["model"], str):
        params["model"] = load_model(params["model"])
    model = params["model"]
    if kind not in model.trees:
        raise ModelError(f"--param model={model.source}: no tree for the SLA {kind} (it has: {', '.join(model.trees) or 'none'})")


def workload_degree(snapshot: Snapshot) -> float:
    """Complementary degree of the tenants with running or pending tasks."""
    demand = snapshot.allocation.copy()
    for tenant, queue in snapshot.pending.items():
        row = snapshot.rows[tenant]
        for group in queue.groups.values():
            task, _ = group.pending_at(0)
            if task is not None:
                demand[row] += task.demand * group.count
    return complementary_degree(demand, snapshot.capacity)


def decide(snapshot: Snapshot, params: Mapping[str, Any]) -> list[Decision]:
    model = params["model"]  # loaded when the parameters were parsed: no file I/O here
    kind, threshold = sla(params)
    degree = workload_degree(snapshot)
    chosen = "drf" if kind == "max_fairness_loss" and threshold <= 0 else model.choose(kind, degree, threshold)
    spec = CANDIDATE_SPECS[chosen]
    note = f"flex: degree {degree:.3g}, {kind}={threshold:g} -> {chosen}; "
    return [d._replace(reason=note + d.reason) for d in spec.decide(snapshot, spec.parse_params({}))]


SPEC = PolicySpec("flex", decide, "meta-scheduler: a decision tree picks FIFO, Fair, DRF or Perf for the workload "
                                  "and SLA", PARAMS, check=prepare,
                  ordering=Ordering(efficiency="flex runs FIFO, Fair, DRF or Perf (packing) as its decision tree "
                                               "picks for the workload"))

__all__ = ["SPEC", "decide", "workload_degree", "sla"]
