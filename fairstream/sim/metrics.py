"""Fairness and efficiency metrics of a run (LTRF paper, section 4.2).

Per tenant over time, in units of the *metric resource* (a fraction of the cluster's
capacity of one resource, or the dominant share):

- ``g``: current allocation g_i(t); ``d``: current demand d_i(t) (pending + running);
- ``S``: share S_i(t) (formula 2, the leaf's effective share of the tree);
- ``f_raw`` = int g (formula 1), ``f_counted`` = int g' with the discount (formula 8);
- ``f_policy``: the accumulated usage the policy orders by (quantum top-up and PAR included);
- ``rho`` = int g / int min(d, S) (formula 3).

Cluster-wide: sharing benefit Psi(t) and loss Omega(t) (formulas 4-5), utilisation per
resource, and the soft fairness degree of QKnobler's formula 12, ``max_{i,j} |s_i/w_i - s_j/w_j|``
over the tenants with pending tasks (s: dominant share of the current allocation, w: share
fraction). Integrals are exact (allocations are piecewise constant between events); the time
series are sampled on a regular grid for plotting.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from fairstream.core import native
from fairstream.core.fairness import (
    counted_allocation,
    fair_shares,
    fairness_degree,
    fairness_degrees,
    resource_shares,
    sharing_benefit,
    sharing_loss,
    soft_fairness_degree,
)


@dataclass
class TenantSeries:
    time: list[float] = field(default_factory=list)
    g: list[float] = field(default_factory=list)
    d: list[float] = field(default_factory=list)
    S: list[float] = field(default_factory=list)
    f_raw: list[float] = field(default_factory=list)
    f_counted: list[float] = field(default_factory=list)
    f_policy: list[float] = field(default_factory=list)
    rho: list[float] = field(default_factory=list)

    @property
    def columns(self) -> tuple[list[float], ...]:
        """The sampled columns but ``time``, in ``MetricsRecorder._sample``'s order."""
        return self.g, self.d, self.S, self.f_raw, self.f_counted, self.f_policy, self.rho


class MetricsRecorder:
    """Integrates per-tenant allocations between events and samples them on a grid.

    Per step it costs a few array operations over the tenants (one row per tenant, as the
    accounting's), not a Python loop: the simulator calls it at every event instant."""

    def __init__(self, engine, metric_resource: str, sample_interval: float) -> None:
        self.engine = engine
        names = engine.resources.names
        self.metric_resource = metric_resource
        self.resource = None if metric_resource == "dominant" else names.index(metric_resource)
        self.sample_interval = sample_interval
        self.clock: float | None = None
        self.next_sample = 0.0
        # Per tenant row: int g, int min(d, S), int g' (grown as tenants arrive).
        self._integrals = np.zeros((3, 0))
        self._entitled_shares: tuple | None = None  # (tree's share table, tenants) -> S per row
        self._series: dict[str, TenantSeries] = {}  # (``series``: with the blocks not read yet)
        self._blocks: list[tuple[float, list[str], np.ndarray]] = []  # per sample: time, tenants, values
        self.cluster: dict[str, list[float]] = {"time": [], "psi": [], "omega": [], "soft_fairness": [],
                                                **{f"util_{r}": [] for r in names}}
        self.soft_fairness_integral = 0.0
        self.soft_fairness_time = 0.0
        self.soft_fairness_max = 0.0
        self.busy_integral = np.zeros(len(names))
        self.capacity_integral = np.zeros(len(names))
        # Preemption (issue "Preemption toward fair share"): per tenant, when it first wanted
        # anything, how long until it first held its fair share, and what preemption cost it.
        self._wanting_since = np.zeros(0)  # per tenant row; nan until it first wants anything
        self._reached = np.zeros(0, dtype=bool)  # per tenant row: held its fair share once
        self._unreached = 0  # how many rows have not (a count: ``_reached.all()`` per event cost 2 % of a run)
        self.time_to_fair_share: dict[str, float] = {}
        self.preemptions: dict[str, int] = {}
        self.work_lost: dict[str, float] = {}  # task-seconds of work killed by preemption

    def record_preemption(self, tenant: str, lost: float) -> None:
        """A task of ``tenant`` was preempted after running ``lost`` seconds (work lost)."""
        self.preemptions[tenant] = self.preemptions.get(tenant, 0) + 1
        self.work_lost[tenant] = self.work_lost.get(tenant, 0.0) + lost

    def _watch_fair_share(self, at: float, g: np.ndarray, d: np.ndarray) -> None:
        """Time to fair share: from a tenant's first demand to the first instant it holds its
        fair share as closely as whole tasks allow, in the metric resource: min(its
        instantaneous fair share, what it asks for), or, holding something, no tenant above its
        own share by a whole task of this tenant's size (its mean running task), so no task
        could come to it without taking another tenant below its share. (256 GPUs over three
        tenants of 1-GPU tasks: 86, 86, 84 is fair share reached; 85.33 each is not possible.)
        The fair share is the one preemption restores (``fairness.fair_shares``), in the
        metric resource."""
        acc = self.engine.accounting
        n = len(g)
        if len(self._reached) < n:  # tenants joined
            grown = len(self._reached)
            self._wanting_since = np.concatenate([self._wanting_since, np.full(n - grown, np.nan)])
            self._reached = np.concatenate([self._reached, np.zeros(n - grown, dtype=bool)])
            self._unreached += n - grown
        if not n or not self._unreached:
            return
        active = d > 0
        self._wanting_since[active & np.isnan(self._wanting_since)] = at
        waiting = active & ~self._reached
        if not waiting.any():
            return  # (nobody to watch: the fair shares are not needed)
        capacity = acc.capacity
        fair = fair_shares(self.engine.tree, [ledger.name for ledger in acc.ledgers[:n]],
                           acc.allocation[:n] + self.engine.waiting_demand()[:n], capacity, self.resource,
                           self.engine.resources.names)
        reached = waiting & (g >= np.minimum(fair, d) - 1e-9)
        short = np.flatnonzero(waiting & ~reached & (g > 0))
        if len(short):  # holding something but below: is the rest only a fraction of a task away?
            running = np.array([acc.ledgers[row].running for row in short.tolist()], dtype=float)
            task = np.divide(g[short], running, out=np.full(len(short), np.inf), where=running > 0)
            largest_excess = float(np.max(g - fair))
            reached[short[largest_excess < task - 1e-9]] = True
        for row in np.flatnonzero(reached).tolist():  # once per tenant in a run
            self._reached[row] = True
            self._unreached -= 1
            self.time_to_fair_share[acc.ledgers[row].name] = at - float(self._wanting_since[row])

    def _by_name(self, which: int) -> dict[str, float]:
        ledgers = self.engine.accounting.ledgers
        values = self._integrals[which].tolist()
        return {ledgers[row].name: value for row, value in enumerate(values)}

    @property
    def integral_g(self) -> dict[str, float]:
        return self._by_name(0)

    @property
    def integral_entitled(self) -> dict[str, float]:
        return self._by_name(1)

    @property
    def integral_counted(self) -> dict[str, float]:
        return self._by_name(2)

    def _state(self) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray], float | None, np.ndarray | None]:
        """Per tenant row: g, d, S and counted g', in metric units; and the soft fairness degree
        (``soft_fairness``) and what runs per resource summed over tenants when they came with
        them (the compiled ``native.metric_state``), else None and None."""
        acc = self.engine.accounting
        cap = acc.capacity
        n = len(acc.ledgers)
        entitled = self._entitled()
        if n and native.enabled():
            g, d, counted, degree, running = native.module.metric_state(
                n, acc.allocation, acc.share, acc.pending_demand, np.asarray(cap, dtype=np.float64), acc.fractions,
                float(acc.config.discount), self.resource)
            return (g, d, entitled, counted), degree, running
        allocation = acc.allocation[:n]
        counted = counted_allocation(allocation, acc.share[:n], acc.config.discount) if n else allocation
        g = resource_shares(allocation, cap, self.resource)
        d = resource_shares(allocation + acc.pending_demand[:n], cap, self.resource)
        return (g, d, entitled, resource_shares(counted, cap, self.resource)), None, None

    def _entitled(self) -> np.ndarray:
        """S per tenant row (formula 2: the leaf's effective share), made again when the tree
        or the tenants change."""
        acc = self.engine.accounting
        table = self.engine.tree.effective_share
        if (self._entitled_shares is None or self._entitled_shares[0] is not table
                or len(self._entitled_shares[1]) != len(acc.ledgers)):
            self._entitled_shares = (table, np.array([float(table.get(ledger.name, 0.0)) for ledger in acc.ledgers]))
        return self._entitled_shares[1]

    def soft_fairness(self) -> float:
        """Formula 12's degree now, over the active tenants (QKnobler's C1: those with pending
        tasks; a tenant that wants nothing more is not wronged by a low share)."""
        acc = self.engine.accounting
        if len(acc.ledgers) < 2:
            return 0.0
        active = acc.pending_demand.sum(axis=1) > 0
        if active.sum() < 2:
            return 0.0
        shares = resource_shares(acc.allocation[active], acc.capacity, None)
        return soft_fairness_degree(shares, acc.fractions[active])

    def advance(self, now: float) -> None:
        """Account for the interval since the last call (state constant over it)."""
        if self.clock is None:
            self.clock = now
            self.next_sample = now
        acc = self.engine.accounting
        n = len(acc.ledgers)
        if (n and native.enabled() and self.next_sample >= now and not self._unreached and len(self._reached) == n
                and self._integrals.shape[1] == n):
            # Most steps: no sample is due and no tenant is left to watch reach its fair share,
            # so the state is only integrated: one compiled call, the same float operations as
            # ``_state`` and ``integrate_metrics`` below.
            dt = now - self.clock
            if dt > 0:
                degree = native.module.advance_metrics(
                    n, acc.allocation, acc.share, acc.pending_demand, np.asarray(acc.capacity, dtype=np.float64),
                    acc.fractions, float(acc.config.discount), self.resource, self._entitled(), float(dt),
                    self._integrals, self.busy_integral, self.capacity_integral)
                self._integrate_soft_fairness(dt, degree)
            self.clock = now
            return
        state, degree, running = self._state()
        self._watch_fair_share(self.clock, state[0], state[1])  # the state as of the last step
        n = len(state[0])
        if self._integrals.shape[1] < n:
            grown = np.zeros((3, n))
            grown[:, : self._integrals.shape[1]] = self._integrals
            self._integrals = grown
        # (``degree``: the soft fairness degree, constant until ``now``: computed once, if not with the state)
        while self.next_sample < now:
            if degree is None:
                degree = self.soft_fairness()
            self._sample(self.next_sample, state, degree)
            self.next_sample += self.sample_interval
        dt = now - self.clock
        if dt > 0:
            g, d, entitled, counted = state
            capacity = self.engine.accounting.capacity
            if running is not None:  # the compiled state: the integrals in one compiled call, the same
                native.module.integrate_metrics(self._integrals, g, d, entitled, counted, float(dt), self.busy_integral,
                                                running, self.capacity_integral,
                                                np.asarray(capacity, dtype=np.float64))
            else:
                self._integrals[0] += dt * g
                self._integrals[1] += dt * np.minimum(d, entitled)
                self._integrals[2] += dt * counted
                # What runs, summed over tenants rather than over nodes: the same total, and the
                # cluster has far more nodes than tenants.
                self.busy_integral += dt * self.engine.accounting.allocation.sum(axis=0)
                self.capacity_integral += dt * capacity
            self._integrate_soft_fairness(dt, self.soft_fairness() if degree is None else degree)
        self.clock = now

    def _integrate_soft_fairness(self, dt: float, degree: float) -> None:
        self.soft_fairness_integral += dt * degree
        self.soft_fairness_time += dt
        self.soft_fairness_max = max(self.soft_fairness_max, degree)

    def _sample(self, at: float, state, soft_fairness: float) -> None:
        assert self.clock is not None  # (set by the first ``advance``)
        dt = at - self.clock
        engine = self.engine
        g, d, entitled, counted = state
        f_raw = self._integrals[0] + dt * g
        owed = self._integrals[1] + dt * np.minimum(d, entitled)
        f_counted = self._integrals[2] + dt * counted
        acc = engine.accounting
        f_policy = acc.usage_keys(list(range(len(acc.ledgers))), max(at, acc.clock or at))  # one vectorised call
        rho = fairness_degrees(f_raw, owed)
        degrees = rho.tolist()
        # One block per sample, a row per quantity in ``TenantSeries.columns``' order (copies:
        # ``state``'s arrays are buffers); ``series`` makes the tenants' lists from the blocks.
        self._blocks.append((at, self._tenant_names(acc.ledgers),
                             np.array([g, d, entitled, f_raw, f_counted, f_policy, rho])))
        self.cluster["time"].append(at)
        self.cluster["psi"].append(sharing_benefit(degrees))
        self.cluster["omega"].append(sharing_loss(degrees))
        self.cluster["soft_fairness"].append(soft_fairness)
        cap = engine.accounting.capacity
        used = engine.used.sum(axis=0) if len(engine.used) else np.zeros(len(cap))
        for i, r in enumerate(engine.resources.names):
            self.cluster[f"util_{r}"].append(float(used[i] / cap[i]) if cap[i] > 0 else 0.0)

    def _tenant_names(self, ledgers: list) -> list[str]:
        """The tenants of the accounting's rows, one list object until one joins (or a new
        accounting comes): samples sharing it are read as one run (``series``)."""
        seen, names = self.__dict__.get("_names", (None, []))
        if seen is not ledgers or len(names) != len(ledgers):
            names = [ledger.name for ledger in ledgers]
            self._names = (ledgers, names)
        return names

    @property
    def series(self) -> dict[str, TenantSeries]:
        """Per tenant, its sampled series from its first sample on (in the order tenants were
        first sampled). The samples' blocks are turned into lists here, a run of samples over
        the same tenants at a time: a sample is then one array, not a Python loop over tenants."""
        blocks, self._blocks = self._blocks, []
        start = 0
        while start < len(blocks):
            names, end = blocks[start][1], start
            while end < len(blocks) and blocks[end][1] is names:
                end += 1
            times = [at for at, _, _ in blocks[start:end]]
            values = np.stack([block for _, _, block in blocks[start:end]], axis=2)  # quantity, tenant, sample
            for row, name in enumerate(names):
                series = self._series.setdefault(name, TenantSeries())
                series.time.extend(times)
                for column, sampled in zip(series.columns, values[:, row, :].tolist()):
                    column.extend(sampled)
            start = end
        return self._series

    def degrees(self) -> dict[str, float]:
        owed = self.integral_entitled
        return {name: fairness_degree(used, owed[name]) for name, used in self.integral_g.items()}

    def accumulated_at(self, time: float) -> dict[str, float]:
        """Each tenant's accumulated usage f_raw (formula 1) at ``time``, read off the sampled
        series (linear between samples, which holds where the allocation does not change)."""
        return {name: float(np.interp(time, s.time, s.f_raw)) if s.time else 0.0 for name, s in self.series.items()}

    def soft_fairness_summary(self) -> dict[str, float]:
        """Time-weighted mean and maximum of the soft fairness degree over the run."""
        mean = self.soft_fairness_integral / self.soft_fairness_time if self.soft_fairness_time > 0 else 0.0
        return {"mean": mean, "max": self.soft_fairness_max}

    def utilisation(self) -> dict[str, float]:
        names = self.engine.resources.names
        return {
            r: float(self.busy_integral[i] / self.capacity_integral[i]) if self.capacity_integral[i] > 0 else 0.0
            for i, r in enumerate(names)
        }


def job_statistics(records: dict) -> tuple[dict[str, dict], dict[str, dict]]:
    """From per-job records (``simulator.JobRecord``: tenant, submit, tasks, finished,
    finish): per-job and per-tenant completion figures. A job's completion time runs from its
    first submission to its last finish; a tenant's makespan from its first submission to its
    last finish."""
    jobs: dict[str, dict] = {}
    for name, rec in records.items():
        done = rec.finished == rec.tasks
        jobs[name] = {"tenant": rec.tenant, "submit": rec.submit, "tasks": rec.tasks, "done": done,
                      "finish": rec.finish if rec.finish is not None else -math.inf}
    tenants: dict[str, dict] = {}
    for job in jobs.values():
        job["completion_time"] = job["finish"] - job["submit"] if job["done"] else None
        t = tenants.setdefault(job["tenant"], {"jobs": 0, "first_submit": math.inf, "last_finish": -math.inf, "jct": []})
        t["jobs"] += 1
        t["first_submit"] = min(t["first_submit"], job["submit"])
        if job["done"]:
            t["last_finish"] = max(t["last_finish"], job["finish"])
            t["jct"].append(job["completion_time"])
    for t in tenants.values():
        jct = t.pop("jct")
        t["mean_jct"] = float(np.mean(jct)) if jct else None
        t["makespan"] = t["last_finish"] - t["first_submit"] if jct else None
    return jobs, tenants
