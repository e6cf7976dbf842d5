"""Per-tenant accounting: current allocation, windowed accumulated usage and adaptive quanta.

Implements the Resource Controller and Quantum Updater of LTYARN (LTRF paper, ICS'14, 5.1-5.2):

- accumulated usage ``f_i(t) = int_{t_s}^{t} g'_i + phi_i`` (formula 13) where ``g'`` is the
  counted allocation with discount ``eta`` (formula 7) and ``phi_i`` the Pseudo Accumulated
  Resources of a late arrival (formula 16);
- rounds of length ``L``: ``t_s = floor(t / L) * L`` (formula 12); ``L = inf`` is the fully
  long-term model F-LTMM, a finite ``L`` the semi-long-term S-LTMM;
- the time-quantum approach (formula 15): a running task counts ``max(Q, elapsed)`` of time, a
  finished task its real run time. We keep ``int g'`` exactly (tasks are charged as time
  passes) and add a *top-up* of ``demand * max(0, Q - elapsed)`` for running tasks;
- the adaptive task quantum (section 5.2.1): top-down initialisation from the parent queue,
  bottom-up self-tuning from completed tasks' run times;
- optionally, usage that decays by half every ``half_life`` seconds (Slurm's
  ``PriorityDecayHalfLife``, Kueue's ``usageHalfLifeTime``; not in the LTRF papers):
  ``f_i(t) = int g'_i(s) 2^{-(t - s)/h} ds``, integrated exactly over the intervals between events
  (the allocation is constant over each), and a late arrival's PAR decays alike from the moment
  it is set. The quantum top-up of running tasks is not decayed (it is at most ``Q`` seconds of
  their demand).

Accumulated usage is kept per resource (resource-seconds). A policy reads it as a scalar key,
normalised by cluster capacity: one resource (``resource=mem``, the paper's single-resource
mode) or the dominant share of the accumulated vector (``resource=dominant``, long-term DRF).

No clock is read here: every method takes the event time it applies to.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from numpy import ndarray  # (compiled, a dataclass's fields are looked up by their names: ``np.ndarray`` is not one)

from fairstream.core import native
from fairstream.core.fairness import counted_allocation, resource_shares
from fairstream.core.model import ROOT, subtract_each_floored, subtract_floored
from fairstream.core.tenants import TenantTree


@dataclass(frozen=True)
class AccountingConfig:
    """How accumulated usage is counted. See ``docs/policies.md`` for defaults and meaning."""

    round_length: float = math.inf  # L; inf = F-LTMM
    discount: float = 1.0  # eta in [0, 1]; 1 = no discount
    quantum: float = 60.0  # Q0, seconds
    adaptive_quantum: bool = True
    resource: int | None = None  # index of the single resource, None = dominant share
    half_life: float = math.inf  # usage decays by half every half_life seconds; inf = never

    def __post_init__(self) -> None:
        if not self.round_length > 0:
            raise ValueError("round must be > 0 (use inf for fully long-term)")
        if not self.half_life > 0:
            raise ValueError("half_life must be > 0 (use inf for no decay)")
        if not 0 <= self.discount <= 1:
            raise ValueError("discount must be in [0, 1]")
        if not self.quantum >= 0:
            raise ValueError("quantum must be >= 0")

    def __deepcopy__(self, memo: dict) -> AccountingConfig:
        # Immutable: a copy may share it ("what if" copies of an engine). (Compiled, a frozen
        # class cannot be copied field by field into a blank one.)
        return self


class QuantumTree:
    """The adaptive task quantum over the tenant tree (LTRF paper 5.2.1, Figure 3).

    Top-down: a new queue or leaf starts with its parent's quantum (the root starts at Q0).
    Bottom-up: when a leaf's task finishes, the leaf's quantum becomes the mean run time of
    its finished tasks, then every ancestor's the mean of its children's quanta.
    With ``adaptive=False`` every quantum stays Q0 (the fixed-quantum baseline of Figure 7a).

    A parent keeps the sum and count of its children's quanta, so an update costs the depth
    of the tree, not the number of siblings.
    """

    def __init__(self, initial: float = 60.0, adaptive: bool = True) -> None:
        self.initial = initial
        self.adaptive = adaptive
        self.quantum: dict[str, float] = {ROOT: initial}
        self._children_sum: dict[str, float] = {}
        self._children_count: dict[str, int] = {}
        self._finished: dict[str, tuple[int, float]] = {}
        self.version = 0  # changes whenever any quantum may have changed

    def initialise(self, path: tuple[str, ...]) -> None:
        parent = ROOT
        for node in path:
            if node not in self.quantum:
                self.quantum[node] = self.quantum[parent]
                self._children_sum[parent] = self._children_sum.get(parent, 0.0) + self.quantum[node]
                self._children_count[parent] = self._children_count.get(parent, 0) + 1
            parent = node

    def record(self, tree: TenantTree, leaf: str, run_times: list[float]) -> None:
        """Tasks of ``leaf`` finished after these run times, in turn: each moves the leaf's
        mean and then every ancestor's (the float operations of one call per task, the leaf's
        path looked up once)."""
        if not self.adaptive:
            return
        self.version += len(run_times)
        count, total = self._finished.get(leaf, (0, 0.0))
        path = (ROOT,) + tree.path(leaf)
        parent = path[-2]
        quantum, sums, counts = self.quantum, self._children_sum, self._children_count
        for run_time in run_times:
            count, total = count + 1, total + run_time
            value = total / count
            sums[parent] += value - quantum[leaf]  # (the sum over the parent's children follows)
            quantum[leaf] = value
            for depth in range(len(path) - 2, -1, -1):
                node = path[depth]
                mean = sums[node] / counts[node]
                if node == ROOT:
                    quantum[ROOT] = mean
                else:
                    sums[path[depth - 1]] += mean - quantum[node]
                    quantum[node] = mean
        self._finished[leaf] = (count, total)

    def of(self, leaf: str) -> float:
        return self.quantum.get(leaf, self.quantum[ROOT]) if self.adaptive else self.initial


@dataclass(eq=False, slots=True)
class _Running:
    start: float = 0.0
    demand: ndarray = field(default_factory=lambda: np.zeros(0))
    done: bool = False
    recent: bool = True  # inside the top-up suffix (still within its quantum)
    values: tuple[float, ...] = ()  # the demand as plain floats
    # What it counts per second if not its demand: the demand times its node's resource
    # weights (LTRF formula 9); None: its demand.
    counted_values: tuple[float, ...] | None = None

    @property
    def counted(self) -> tuple[float, ...]:
        return self.values if self.counted_values is None else self.counted_values


class RecentTasks:
    """A tenant's running tasks in start order, for the quantum top-up (formula 15).

    Only tasks that have run less than the quantum add a top-up, and they are a suffix of the
    start-ordered list. ``boundary`` marks that suffix; ``demand`` and ``weighted`` are the
    sums of ``d`` and ``d * effective_start`` over its live tasks (plain floats: updating two
    numbers is far cheaper than numpy calls on 2-element arrays), so every tenant's
    ``top_up = sum d * (Q - (now - s)) = (Q - now) * demand + weighted`` is one vectorised
    expression over all tenants, and moving the boundary is O(1) amortised.
    """

    def __init__(self, n_resources: int = 0) -> None:
        self.demand = [0.0] * n_resources
        self.weighted = [0.0] * n_resources
        self.entries: list[_Running] = []
        self.boundary = 0
        self.done = 0
        self.round_start = 0.0

    def __bool__(self) -> bool:
        return len(self.entries) > self.done

    def _effective(self, entry: _Running) -> float:
        return max(self.round_start, entry.start)

    def _add(self, entry: _Running) -> None:
        entry.recent = True
        self._count(entry, 1.0)

    def _remove(self, entry: _Running) -> None:
        entry.recent = False
        self._count(entry, -1.0)

    def _count(self, entry: _Running, sign: float) -> None:
        """Add (``sign`` 1.0) or take away (-1.0, exact: the same bits as subtracting) the
        entry's ``d`` and ``d * effective_start``. ``_effective`` and ``counted`` are written
        out: this runs for every start and every task that reaches its quantum."""
        round_start = self.round_start
        start = entry.start if entry.start > round_start else round_start  # (max(round_start, start))
        values = entry.values if entry.counted_values is None else entry.counted_values
        demand, weighted = self.demand, self.weighted
        for k, value in enumerate(values):
            demand[k] += sign * value
            weighted[k] += sign * (value * start)

    def extend(self, entries: list[_Running]) -> None:
        """A run of tasks just started (one start time, one demand: ``Accounting.on_start``),
        always within the quantum (the boundary moves lazily). The sums take each task's
        ``d`` and ``d * effective_start`` in turn, as ``_add`` once per task would (the same
        bits), without a call per task."""
        if not entries:
            return
        self.entries.extend(entries)
        first = entries[0]
        round_start = self.round_start
        start = first.start if first.start > round_start else round_start
        values = first.values if first.counted_values is None else first.counted_values
        demand, weighted, tasks = self.demand, self.weighted, range(len(entries))
        for k, value in enumerate(values):
            total, total_weighted, value_start = demand[k], weighted[k], value * start
            for _ in tasks:
                total += value
                total_weighted += value_start
            demand[k], weighted[k] = total, total_weighted

    def retire(self, entries: list[_Running]) -> None:
        """These tasks ended, in turn: each leaves the sums if inside the suffix; the list is
        compacted once most of it has ended (checked after each, as one call each would)."""
        for entry in entries:
            entry.done = True
            self.done += 1
            if entry.recent:
                self._remove(entry)
            if self.done > 64 and self.done * 2 > len(self.entries):
                self._rebuild()

    def _rebuild(self) -> None:
        self.entries = [e for e in self.entries if not e.done]
        self.done = 0
        self.boundary = 0
        self.demand = [0.0] * len(self.demand)
        self.weighted = [0.0] * len(self.weighted)
        for entry in self.entries:
            self._add(entry)

    def new_round(self, round_start: float) -> None:
        self.round_start = round_start
        self._rebuild()

    def next_move(self, quantum: float) -> float:
        """The earliest time at which ``advance`` with this ``quantum`` may move the boundary:
        when the oldest task inside it reaches its quantum. A hair early rather than late
        (``advance`` itself tests exactly); inf when nothing is inside."""
        if self.boundary >= len(self.entries):
            return math.inf
        due = self._effective(self.entries[self.boundary]) + quantum
        return due - 1e-9 * (1.0 + abs(due))

    def advance(self, now: float, quantum: float) -> None:
        """Move the boundary to the tasks that have run less than ``quantum`` at ``now``."""
        entries = self.entries
        # Tasks that have now run a full quantum leave the suffix...
        while self.boundary < len(entries) and now - self._effective(entries[self.boundary]) >= quantum:
            if entries[self.boundary].recent:
                self._remove(entries[self.boundary])
            self.boundary += 1
        # ...and come back if the quantum grew (adaptive quanta move both ways).
        while self.boundary > 0 and now - self._effective(entries[self.boundary - 1]) < quantum:
            self.boundary -= 1
            if not entries[self.boundary].done:
                self._add(entries[self.boundary])


class _TopUpIndex:
    """Every tenant's quantum and top-up sums as arrays (one row per tenant), and when each
    row's boundary next moves. Derived from the ledgers, never in a snapshot: a scheduling pass
    then costs the rows that changed (a task started or finished, a quantum moved, a task
    reached its quantum) instead of a Python loop over every tenant."""

    def __init__(self, n_resources: int = 0) -> None:
        self.quanta = np.zeros(0)
        self.demand = np.zeros((0, n_resources))
        self.weighted = np.zeros((0, n_resources))
        self.due = np.zeros(0)  # earliest time each row's boundary may move
        self.dirty: set[int] = set()  # rows whose tasks or quantum changed since the last refresh
        self.at = -math.inf  # the time of the last refresh

    def refresh(self, rows: list[int], recent: list[RecentTasks], now: float) -> None:
        """Move the boundary of ``rows`` (their tenants' ``recent`` tasks, in the same order)
        to ``now`` and write their sums; the index is then current at ``now``."""
        if rows:
            # (Many rows, a thousand tenants running: each sum read and written for all of them
            # in one numpy call. A few, as a pass's usually are: row by row, a quarter of the cost
            # of those calls.)
            few = len(rows) <= 8
            quanta = [self.quanta.item(row) for row in rows] if few else self.quanta[rows].tolist()
            demand, weighted, due = [], [], []
            for tasks, quantum in zip(recent, quanta):
                if tasks:
                    tasks.advance(now, quantum)
                demand.append(tasks.demand)
                weighted.append(tasks.weighted)
                due.append(tasks.next_move(quantum))
            if few:
                for row, row_demand, row_weighted, row_due in zip(rows, demand, weighted, due):
                    self.demand[row], self.weighted[row], self.due[row] = row_demand, row_weighted, row_due
            else:
                self.demand[rows] = demand
                self.weighted[rows] = weighted
                self.due[rows] = due
        self.dirty.clear()
        self.at = now

    def rows_to_refresh(self, now: float) -> list[int]:
        """The rows whose boundary ``refresh`` must move to ``now``: those that changed and those
        whose oldest recent task reached its quantum by ``now``; all of them if ``now`` is
        before the last refresh (a boundary moves back then)."""
        if now < self.at:
            return list(range(len(self.quanta)))
        due = native.module.rows_due(self.due, now) if native.enabled() else np.flatnonzero(self.due <= now).tolist()
        return list(self.dirty.union(due))

    def top_ups(self, rows: list[int] | None, now: float) -> np.ndarray:
        """``max((Q - now) * demand + weighted, 0)`` for ``rows`` (all if None), as of the last
        refresh: the top-ups before any discount, a new array (every row's in one compiled
        call, ``native.top_ups``, the same float operations)."""
        if rows is None and native.enabled():
            return native.module.top_ups(self.quanta, self.demand, self.weighted, now)
        pick = slice(None) if rows is None else rows
        extra = (self.quanta[pick] - now)[:, None] * self.demand[pick] + self.weighted[pick]
        np.maximum(extra, 0.0, out=extra)  # float dust, and rows with nothing recent
        return extra

    def grow(self, quanta: list[float]) -> None:
        """Rows for tenants added since (their quanta given), to be refreshed."""
        start, extra = len(self.quanta), len(quanta)
        self.quanta = np.concatenate([self.quanta, quanta])
        self.demand = np.vstack([self.demand, np.zeros((extra, self.demand.shape[1]))])
        self.weighted = np.vstack([self.weighted, np.zeros((extra, self.weighted.shape[1]))])
        self.due = np.concatenate([self.due, np.full(extra, -math.inf)])
        self.dirty.update(range(start, start + extra))


@dataclass
class TenantLedger:
    """Mutable accounting of one leaf tenant."""

    name: str = ""
    pending: int = 0
    running: int = 0
    first_arrival: float | None = None
    round_arrival: float | None = None
    pseudo_accumulated: float = 0.0  # phi_i, in key units (normalised), as of ``pseudo_at``
    pseudo_at: float = 0.0  # when phi_i was set (it decays from then with a half-life)
    waiting_since: float | None = None  # when it last got a task or became demanding
    recent: RecentTasks = field(default_factory=RecentTasks)  # (``Accounting.add_tenant`` gives its own)

    @property
    def active(self) -> bool:
        return self.pending + self.running > 0


def _read_only(array: np.ndarray) -> np.ndarray:
    array.setflags(write=False)
    return array


def decay(elapsed: float, h: float) -> tuple[float, float]:
    """Over ``elapsed`` seconds with a half-life ``h``: the factor usage so far is kept by,
    ``2^(-elapsed/h)``, and what a constant allocation of 1 adds meanwhile, decayed to its end,
    ``int_0^elapsed 2^(-(elapsed - s)/h) ds = h / ln 2 (1 - 2^(-elapsed/h))``."""
    kept = 2.0 ** (-elapsed / h)
    return kept, h / math.log(2.0) * (1.0 - kept)


def _pending_added(pending: np.ndarray, row: int, values: tuple[float, ...], count: int) -> None:
    """``count`` tasks' demand ``values`` join row ``row`` of ``pending``, task by task in
    plain floats (the float operations of one task at a time), the row read and written once."""
    waiting = pending[row].tolist()
    for _ in range(count):
        for k, value in enumerate(values):
            waiting[k] += value
    pending[row] = waiting


def _pending_to_allocated(pending: np.ndarray, allocation: np.ndarray, row: int, values: tuple[float, ...],
                          count: int) -> None:
    """``count`` tasks' demand ``values`` leave row ``row`` of ``pending`` and join that of
    ``allocation``, task by task in plain floats (the float operations of one task at a time),
    each row read and written once."""
    waiting, allocated = pending[row].tolist(), allocation[row].tolist()
    for _ in range(count):
        for k, value in enumerate(values):
            waiting[k] -= value
            allocated[k] += value
    pending[row] = waiting
    allocation[row] = allocated


class Accounting:
    """Current allocation and accumulated usage of every leaf tenant, as plain arrays: rows
    are tenants in registration order, columns resources."""

    _index: _TopUpIndex | None  # derived, not in snapshots (absent in one read back): ``_index_of_all``
    _pseudo: np.ndarray | None  # derived as ``_index``: every row's PAR between passes (``pseudo_rows``)

    def __init__(self, n_resources: int = 0, config: AccountingConfig = AccountingConfig()) -> None:
        self.config = config
        self.n_resources = n_resources
        self.ledgers: list[TenantLedger] = []
        self.row: dict[str, int] = {}
        self.allocation = np.zeros((0, n_resources))  # g_i(t)
        # g_i(t) as accumulated usage counts it, with nodes' resource weights (formula 9);
        # None while every task ran on nodes of weight 1 (then it is ``allocation``).
        self.weighted_allocation: np.ndarray | None = None
        self.pending_demand = np.zeros((0, n_resources))  # sum of pending demands
        self.share = np.zeros((0, n_resources))  # S_i(t) = capacity * effective share
        self.counted_usage = np.zeros((0, n_resources))  # int_{t_s}^t g'_i
        self.raw_usage = np.zeros((0, n_resources))  # int_{t_s}^t g_i
        self.capacity = np.zeros(n_resources)
        self.fractions = np.zeros(0)  # effective share of each tenant row
        self.clock: float | None = None
        self.round_start = 0.0
        self.quanta = QuantumTree(config.quantum, config.adaptive_quantum)

    # ----------------------------------------------------------------- structure

    def add_tenant(self, name: str, path: tuple[str, ...]) -> int:
        if name in self.row:
            return self.row[name]
        self.row[name] = len(self.ledgers)
        ledger = TenantLedger(name, recent=RecentTasks(self.n_resources))
        self.ledgers.append(ledger)
        grow = np.zeros((1, self.n_resources))
        self.allocation = np.vstack([self.allocation, grow])
        if self.weighted_allocation is not None:
            self.weighted_allocation = np.vstack([self.weighted_allocation, grow])
        self.pending_demand = np.vstack([self.pending_demand, grow])
        self.share = np.vstack([self.share, grow])
        self.counted_usage = np.vstack([self.counted_usage, grow])
        self.raw_usage = np.vstack([self.raw_usage, grow])
        self.quanta.initialise(path)
        return self.row[name]

    def set_shares(self, capacity: np.ndarray, effective_share: dict[str, float]) -> None:
        """Formula 2 per resource: ``S_i = R * w_i`` with ``w_i`` the leaf's effective share."""
        self.capacity = capacity.copy()
        self.fractions = np.array([effective_share.get(ledger.name, 0.0) for ledger in self.ledgers])
        self.share = self.fractions[:, None] * capacity[None, :] if self.ledgers else self.share

    # --------------------------------------------------------------------- time

    def round_of(self, time: float) -> float:
        """Formula 12: the start of the round containing ``time``."""
        length = self.config.round_length
        return 0.0 if math.isinf(length) else math.floor(time / length) * length

    def advance(self, now: float) -> None:
        """Integrate counted and raw allocation up to ``now``; open a new round if one began."""
        if self.clock is None:
            self.clock = now
            self.round_start = self.round_of(now)
            return
        if now <= self.clock:
            return
        new_round = self.round_of(now)
        if new_round > self.round_start:
            # Inter-round phase: forget the previous round (S-LTMM). Usage restarts at t_s.
            self.round_start = new_round
            self.counted_usage[:] = 0.0
            self.raw_usage[:] = 0.0
            self._index = None  # every effective start moved
            for ledger in self.ledgers:
                ledger.recent.new_round(new_round)
                ledger.pseudo_accumulated = 0.0
                ledger.round_arrival = new_round if ledger.active else None
            self._pseudo = None
            elapsed = now - new_round
        else:
            elapsed = now - self.clock
        if elapsed > 0 and self.ledgers:
            used = self.used_rows(None)
            if math.isinf(self.config.half_life) and native.enabled():  # the same, in one compiled call
                native.module.accumulate_usage(used, self.share, float(self.config.discount), float(elapsed),
                                               self.counted_usage, self.raw_usage)
            else:
                counted = counted_allocation(used, self.share, self.config.discount)
                if math.isinf(self.config.half_life):
                    self.counted_usage += elapsed * counted
                    self.raw_usage += elapsed * used
                else:
                    kept, gained = decay(elapsed, self.config.half_life)
                    self.counted_usage *= kept
                    self.counted_usage += gained * counted
                    self.raw_usage *= kept
                    self.raw_usage += gained * used
        self.clock = now

    def used_rows(self, rows: list[int] | None) -> np.ndarray:
        """What accumulates per second, per tenant row (all if None): the allocation, each task
        counted with its node's resource weights (formula 9)."""
        used = self.allocation if self.weighted_allocation is None else self.weighted_allocation
        return used if rows is None else used[rows]

    def pseudo_rows(self, rows: list[int] | None, now: float) -> np.ndarray:
        """Each tenant's PAR (formula 16) at ``now``, decayed since it was set if usage decays."""
        ledgers = self.ledgers if rows is None else [self.ledgers[r] for r in rows]
        if not math.isinf(self.config.half_life):
            h = self.config.half_life
            return np.array([ledger.pseudo_accumulated * 2.0 ** (-max(now - ledger.pseudo_at, 0.0) / h)
                             for ledger in ledgers])
        if rows is not None:
            return np.array([ledger.pseudo_accumulated for ledger in ledgers])
        # Every row's (a pass of ltrf reads them all): kept, read-only, until one is set again
        # (``_arrive``, a new round) or a tenant joins; absent in an engine read back.
        kept = getattr(self, "_pseudo", None)
        if kept is None or len(kept) != len(ledgers):
            kept = self._pseudo = _read_only(np.array([ledger.pseudo_accumulated for ledger in ledgers]))
        return kept

    # ------------------------------------------------------------- task events

    def on_submit(self, row: int, demand: np.ndarray, now: float, count: int = 1,
                  values: tuple[float, ...] | None = None) -> None:
        """``count`` tasks of ``demand`` arrive: a request's, in one call; or, given ``values``
        (the demand as plain floats), single tasks one after another (a run of a job's
        submissions: the same state, to the bit, as one call each, the demand joining the
        pending total task by task)."""
        ledger = self.ledgers[row]
        if not ledger.active:
            self._arrive(row, now)
        if ledger.pending == 0:
            ledger.waiting_since = now
        ledger.pending += count
        if values is None:
            self.pending_demand[row] += demand * count
        else:
            _pending_added(self.pending_demand, row, values, count)

    def _arrive(self, row: int, now: float) -> None:
        """A tenant becomes active. On its first activity of the round it gets its PAR (16)."""
        ledger = self.ledgers[row]
        if ledger.first_arrival is None:
            ledger.first_arrival = now
            self._arrivals = self.arrivals + 1
        if ledger.round_arrival is None:
            ledger.round_arrival = now
            earlier = [
                k for k, other in enumerate(self.ledgers)
                if other.active and other.round_arrival is not None and other.round_arrival < now
            ]
            # Early bird privilege: a late arrival starts level with the most-served earlier one,
            # frozen at its arrival (see docs/paper-notes.md for why not re-evaluated later).
            ledger.pseudo_accumulated = max(self.usage_keys(earlier, now), default=0.0)
            ledger.pseudo_at = now
            self._pseudo = None

    def on_start(self, row: int, demand: np.ndarray, values: tuple[float, ...], now: float,
                 weighted: np.ndarray | None = None, count: int = 1) -> list[_Running]:
        """``count`` tasks of ``demand`` (``values``: the same as plain floats) start (a run of
        one request's tasks on one node: one call, the same state to the bit as one call each);
        returns their running entries, to hand back on finish or requeue. ``weighted``: the
        demand times its node's resource weights (formula 9), if not 1."""
        ledger = self.ledgers[row]
        ledger.pending -= count
        ledger.running += count
        ledger.waiting_since = now if ledger.pending > 0 else None
        counted_values = None
        if weighted is not None and weighted is not demand and not np.array_equal(weighted, demand):
            if self.weighted_allocation is None:
                self.weighted_allocation = self.allocation.copy()
            counted_values = tuple(weighted.tolist())
        _pending_to_allocated(self.pending_demand, self.allocation, row, values, count)
        if self.weighted_allocation is not None:
            for _ in range(count):
                self.weighted_allocation[row] += demand if counted_values is None else weighted
        entries = [_Running(now, demand, False, True, values, counted_values) for _ in range(count)]
        ledger.recent.extend(entries)
        self._changed(row)
        return entries

    def on_finish(self, row: int, finished: list[tuple[_Running, float]], tree: TenantTree) -> None:
        """Tasks of tenant ``row`` finished: each one's running entry and end time, in order
        (several in one call: the same state, to the bit, as one call each)."""
        ledger = self.ledgers[row]
        ledger.running -= len(finished)
        subtract_each_floored(self.allocation[row], [entry.values for entry, _ in finished])  # (float dust cleared)
        # (each task's weighted allocation, recent sums and quantum are apart: each in turn)
        if self.weighted_allocation is not None:
            for entry, _ in finished:
                self._release_weighted(row, entry)
        ledger.recent.retire([entry for entry, _ in finished])
        self.quanta.record(tree, ledger.name, [now - entry.start for entry, now in finished])
        # A leaf's quantum moves only with its own finished tasks (section 5.2.1, bottom-up).
        self._changed(row, quantum=True)

    def on_requeue(self, row: int, entry: _Running, now: float) -> None:
        """A running task goes back to pending (its node was lost)."""
        ledger = self.ledgers[row]
        demand = entry.demand
        ledger.running -= 1
        subtract_floored(self.allocation[row], entry.values)
        self._release_weighted(row, entry)
        ledger.recent.retire([entry])
        self._changed(row)
        if ledger.pending == 0:
            ledger.waiting_since = now
        ledger.pending += 1
        self.pending_demand[row] += demand

    def _release_weighted(self, row: int, entry: _Running) -> None:
        if self.weighted_allocation is not None:
            subtract_floored(self.weighted_allocation[row], entry.counted)

    def on_cancel_pending(self, row: int, demand: np.ndarray) -> None:
        ledger = self.ledgers[row]
        ledger.pending -= 1
        subtract_floored(self.pending_demand[row], demand.tolist())
        if ledger.pending == 0:
            ledger.waiting_since = None

    # ----------------------------------------------------------------- reading

    def quantum(self, row: int) -> float:
        return self.quanta.of(self.ledgers[row].name)

    @property
    def arrivals(self) -> int:
        """First arrivals counted since this object was made or read back (snapshots' arrivals)."""
        return getattr(self, "_arrivals", 0)  # (absent in one read back: ``_arrive`` counts again)

    def top_ups(self, rows: list[int] | None, now: float) -> np.ndarray:
        """Formula 15 for running tasks, for the given tenant rows (all if None):
        ``sum demand * max(0, Q - elapsed_in_round)``, counted at each tenant's current
        discount rate. One row per tenant, in resource-seconds."""
        extra = self._refreshed(now).top_ups(rows, now)
        if self.config.discount < 1.0:
            pick = slice(None) if rows is None else rows
            alloc = self.allocation[pick]
            counted = counted_allocation(alloc, self.share[pick], self.config.discount)
            extra *= np.divide(counted, alloc, out=np.ones_like(alloc), where=alloc > 0)  # the rate
        return extra

    def quanta_by_row(self) -> np.ndarray:
        """Every tenant's current quantum, one per row (kept current as tasks finish)."""
        return self._index_of_all().quanta

    def _index_of_all(self) -> _TopUpIndex:
        index = getattr(self, "_index", None)  # absent in an engine read from a snapshot: rebuilt here
        if index is None:
            index = self._index = _TopUpIndex(self.n_resources)
        if len(index.quanta) < len(self.ledgers):
            index.grow([self.quantum(row) for row in range(len(index.quanta), len(self.ledgers))])
        return index

    def _changed(self, row: int, quantum: bool = False) -> None:
        """Row ``row``'s running tasks (and, with ``quantum``, its quantum) changed."""
        index = getattr(self, "_index", None)
        if index is None or row >= len(index.quanta):
            return  # refreshed in full when next read
        index.dirty.add(row)
        if quantum:
            index.quanta[row] = self.quantum(row)

    def _refreshed(self, now: float) -> _TopUpIndex:
        """The index with every row's boundary moved to ``now`` (``rows_to_refresh``)."""
        index = self._index_of_all()
        rows = index.rows_to_refresh(now)
        index.refresh(rows, [self.ledgers[row].recent for row in rows], now)
        return index

    def accumulated_rows(self, rows: list[int] | None, now: float) -> np.ndarray:
        """Counted accumulated usage in resource-seconds at ``now``, PAR excluded, one row per
        tenant in ``rows`` (all if None): the round's integral plus the quantum top-up.

        ``now`` may lie after the last event (metrics sample between events): the allocation
        has been constant since, so the integral is extended to ``now``."""
        counted = self.counted_usage if rows is None else self.counted_usage[rows]
        if self.clock is not None and now > self.clock:
            allocation = self.used_rows(rows)
            share = self.share if rows is None else self.share[rows]
            rate = counted_allocation(allocation, share, self.config.discount)
            if math.isinf(self.config.half_life):
                counted = counted + (now - self.clock) * rate
            else:
                kept, gained = decay(now - self.clock, self.config.half_life)
                counted = counted * kept + gained * rate
        return counted + self.top_ups(rows, now)

    def usage_keys(self, rows: list[int], now: float) -> list[float]:
        """``usage_key`` for many tenants at once (one vectorised normalisation)."""
        if not rows:
            return []
        keys = resource_shares(self.accumulated_rows(rows, now), self.capacity, self.config.resource)
        return (keys + self.pseudo_rows(rows, now)).tolist()

    def usage_key(self, row: int, now: float) -> float:
        """``f_i(t)`` as a scalar (unweighted): normalised accumulated usage plus PAR."""
        return self.usage_keys([row], now)[0]
