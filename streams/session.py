"""One cluster's state in the worker: its engine and what the worker knows of the cluster's
log and views in the store. Forgetting a cluster is dropping its session."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from fairstream.core.engine import Engine
from fairstream.streams.snapshots import Snapshotting


@dataclass
class ClusterSession:
    engine: Engine
    log_base: int  # log steps trimmed off the head: the kept log replays from this step
    checkpoints: list[tuple[int, float]]  # (log steps, event time) of the kept checkpoints
    steps_taken: int  # log steps the store holds, as this worker left it (fencing)
    steps_at_snapshot: int  # log steps the last snapshot holds
    events_since_snapshot: int  # events in the log after it: the cost of a recovery's replay
    time_at_snapshot: float  # event time of the last snapshot
    # The latest ``Incoming.produced`` of the events the cluster applied (kept in the store's
    # "clock" view, so a restarted worker tells late producers from its own backlog).
    produced: float
    written_quanta: dict[str, float] = field(default_factory=dict)  # what the store's quanta view holds
    snapshotting: Snapshotting | None = None  # a snapshot being encoded in a child
    # The explanation view (``streams.processor.Processor._explain``): when it was last written
    # (monotonic seconds), and whether the cluster changed since.
    explained_at: float = -math.inf
    explain_due: bool = False
