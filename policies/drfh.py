"""``drfh``: DRF for heterogeneous servers (Wang, Liang and Li, IEEE TPDS 2015), one of the TSF
paper's baselines (its Table 1: strategy-proof, envy-free, Pareto optimal, not sharing-incentive
under constraints).

A job's *global dominant share* is ``max_r allocation_r / (sum over all servers of capacity_r)``;
the lowest (per weight) gets the next task, placed on a server its constraints allow. That is
exactly what ``drf`` does here (it never pools servers into one), so this module is ``drf``
under the name the TSF paper uses, for side-by-side runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fairstream.core.model import Decision
from fairstream.core.placement import dominant_share_order
from fairstream.core.snapshot import Snapshot
from fairstream.policies.base import Ordering, PolicySpec
from fairstream.policies.drf import dominant_share_pass


def decide(snapshot: Snapshot, params: Mapping[str, Any]) -> list[Decision]:
    return dominant_share_pass(snapshot, "drfh")


SPEC = PolicySpec("drfh", decide, "DRF over heterogeneous servers: global dominant share, real servers (= drf)",
                  ordering=Ordering(order=lambda snapshot, params: dominant_share_order(snapshot)))

__all__ = ["SPEC", "decide"]
