"""Starvation: which tenants are starved since when under the preemption rule, and when a pass
could next preempt though no event arrives (YARN's Fair Scheduler: ``fairSharePreemptionThreshold``
and ``fairSharePreemptionTimeout``; ``core/preemption.py`` says what a starved tenant gets).

The engine's ``Starvation`` part, updated after every pass from the values it is handed
(``track``); a pass's ``reclaim`` reads its ``since``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from fairstream.core.accounting import Accounting
from fairstream.core.fairness import resource_shares
from fairstream.core.model import EPSILON
from fairstream.core.preemption import PreemptionRule, share_ratios
from fairstream.core.snapshot import PendingQueue
from fairstream.core.verdicts import Verdicts

#: The shortest wait between two preemption checks for a tenant starved past its timeout
#: (``Starvation.wake_at``), in seconds of event time, when preemption_timeout is shorter.
RECHECK_MIN = 1.0


class Starvation:
    """The engine's part that watches its tenants for starvation under ``rule``: who is starved
    since when (``since``; what a pass's ``reclaim`` reads), and whether preemption could still
    serve one of them (``victims_exist``: some tenant is above its fair share by at least the
    smallest task a starved tenant waits with). Updated after every pass (``track``)."""

    __slots__ = ("rule", "since", "victims_exist")

    def __init__(self, rule: PreemptionRule) -> None:
        self.rule = rule
        self.since: dict[str, float] = {}
        self.victims_exist = False

    def track(self, now: float, accounting: Accounting, fair: np.ndarray, pending: Mapping[str, PendingQueue],
              verdicts: Verdicts, shape_demands: np.ndarray,
              held_by_limits: Callable[[str], bool] | None = None) -> None:
        """After a pass at ``now``: a tenant with pending work some live node could hold within
        its limits, below the rule's threshold x its fair share, is starved since now unless it
        already was; any other tenant is not. ``fair``: every tenant row's fair share
        (``Engine.fair_shares``); ``held_by_limits``: whether a tenant's own max_share,
        max_resources or max_running holds back every task it waits with (None: the tree has no
        limits)."""
        acc, rule = accounting, self.rule
        ratios = share_ratios(acc.allocation, acc.capacity, fair, acc.config.resource)
        starved = {}
        for tenant, queue in pending.items():
            if not queue.count or ratios[acc.row[tenant]] >= rule.threshold - EPSILON:
                continue
            if not any(verdicts.verdict(shape) is None for shape in queue.groups):
                continue  # no node could ever hold any of it
            if held_by_limits is not None and held_by_limits(tenant):
                continue
            starved[tenant] = self.since.get(tenant, now)
        self.since = starved
        # Could preemption still serve one of them? Only if some tenant is above its fair share
        # by at least the smallest task a starved tenant waits with (in the policy's measure).
        self.victims_exist = False
        if starved:
            shares = resource_shares(acc.allocation, acc.capacity, acc.config.resource)
            surplus = float((shares - fair).max()) if len(fair) else 0.0
            demands = shape_demands[[shape for t in starved for shape in pending[t].groups]]
            smallest = float(resource_shares(demands, acc.capacity, acc.config.resource).min())
            self.victims_exist = surplus >= smallest - EPSILON

    def wake_at(self, now: float) -> float | None:
        """The next event time after ``now`` at which a pass could preempt though no event
        arrives, or None: a starved tenant's timeout runs out; or, for a tenant starved past it
        that preemption could not lift to its fair share while some tenant stays above its own,
        the next check, ``preemption_timeout`` later (at least ``RECHECK_MIN`` seconds): the
        policy's order of victims moves with time (LTRF's long-term usage), so a victim that was
        not ahead of it may be now."""
        due = [since + self.rule.timeout for since in self.since.values()]
        later = [t for t in due if t > now]
        if len(later) < len(due) and self.victims_exist:
            later.append(now + max(self.rule.timeout, RECHECK_MIN))
        return min(later) if later else None
