"""What each job of a leaf that orders its jobs has running and has used (``TenantSpec.ordering``).

A leaf with ordering ``fair``, ``drf`` or ``ltrf`` serves its jobs by their current allocation
or their accumulated usage, as YARN's leaf queues order their applications by their
``schedulingPolicy``. The engine keeps, per such job, the demand of its running tasks and its
accumulated usage ``∫ allocation dt`` in closed form: ``accumulated(t) = rate * t + offset``,
where a task starting at ``s`` adds its demand to ``rate`` and ``-demand * s`` to ``offset``, and
ending at ``e`` takes its demand off ``rate`` and adds ``demand * e``. An update is two vector
additions; nothing is integrated between events. A job is forgotten once nothing of it runs or
waits.
"""

from __future__ import annotations

import numpy as np


class JobUsage:
    """One job's running demand (``allocation``) and accumulated usage (resource-seconds)."""

    __slots__ = ("allocation", "offset")

    def __init__(self, n_resources: int) -> None:
        self.allocation = np.zeros(n_resources)
        self.offset = np.zeros(n_resources)

    def start(self, demand: np.ndarray, time: float) -> None:
        self.allocation += demand
        self.offset -= demand * time

    def stop(self, demand: np.ndarray, time: float) -> None:
        self.allocation -= demand
        np.maximum(self.allocation, 0.0, out=self.allocation)  # float noise never leaves a negative
        self.offset += demand * time

    def accumulated(self, time: float) -> np.ndarray:
        """``∫ allocation dt`` from the job's first task to ``time``."""
        return self.allocation * time + self.offset


__all__ = ["JobUsage"]
