"""``perf``: FLEX's efficiency-oriented candidate (the FLEX paper, section 4.2: "Perf", a
Tetris-style packer): every pass places the best-aligned (task, node) pair among all pending
tasks, fairness ignored. It is ``tetris`` with ``f = 0``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fairstream.core.model import Decision
from fairstream.core.snapshot import Snapshot
from fairstream.policies import tetris
from fairstream.policies.base import Ordering, PolicySpec


def decide(snapshot: Snapshot, params: Mapping[str, Any]) -> list[Decision]:
    return [d._replace(policy="perf", reason=d.reason.replace("tetris:", "perf:", 1))
            for d in tetris.decide(snapshot, {"f": 0.0})]


SPEC = PolicySpec("perf", decide, "pure packing: best-aligned task and node among all pending (Tetris, f = 0)",
                  ordering=Ordering(efficiency="perf gives freed room to the best-aligned pending task, whoever's it is"))

__all__ = ["SPEC", "decide"]
