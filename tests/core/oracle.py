"""A slow, obviously correct reference for the fair share and for what every pass must keep.

Plain Python on plain floats, recomputed from scratch from an engine's tasks: no numpy, no
incremental state, no engine helper. The property tests hold ``fairness.fair_shares`` and the
engine's passes to it (tests/core/test_oracle.py)."""

from __future__ import annotations

from fairstream.core.model import ROOT, TaskState


def dominant(vector: list[float], capacity: list[float]) -> float:
    return max((v / c for v, c in zip(vector, capacity) if c > 0), default=0.0)


def measure(vector: list[float], capacity: list[float], resource: int | None) -> float:
    if resource is None:
        return dominant(vector, capacity)
    return vector[resource] / capacity[resource] if capacity[resource] > 0 else 0.0


def fair_shares(specs: dict, demand: dict[str, list[float]], capacity: list[float], resource: int | None,
                resources: list[str]) -> dict[str, float]:
    """The fair share of every leaf by its definition (docs/policies.md, "The fair share"):
    ``specs``: id -> TenantSpec; ``demand``: leaf -> what it runs plus what it waits for."""
    children: dict[str, list[str]] = {ROOT: []}
    for spec in specs.values():
        children.setdefault(spec.parent, []).append(spec.id)

    def capped(node: str) -> list[float]:
        """The node's demand vector: its own or its children's summed, scaled into its limits."""
        kids = children.get(node, [])
        if kids:
            vector = [sum(column) for column in zip(*(capped(k) for k in kids))] or [0.0] * len(capacity)
        else:
            vector = list(demand.get(node, [0.0] * len(capacity)))
        spec = specs[node]
        factor = 1.0
        if spec.max_share < 1 and dominant(vector, capacity) > spec.max_share:
            factor = spec.max_share / dominant(vector, capacity)
        for name, limit in (spec.max_resources or {}).items():
            amount = vector[resources.index(name)]
            if amount > limit:
                factor = min(factor, limit / amount)
        return [v * factor for v in vector]

    def low(node: str) -> float:
        """What the node is guaranteed: its min_share or its children's, within its demand."""
        vector = capped(node)
        high = measure(vector, capacity, resource)
        guaranteed = min(high, sum(low(k) for k in children.get(node, [])))
        floor = specs[node].min_share
        if floor > 0 and high > 0:
            d = dominant(vector, capacity)
            own = high if d <= floor else measure([v * floor / d for v in vector], capacity, resource)
            guaranteed = max(guaranteed, own)
        return guaranteed

    out = {leaf: 0.0 for leaf in specs if not children.get(leaf)}

    def divide(queue: str, amount: float) -> None:
        kids = [k for k in children.get(queue, []) if measure(capped(k), capacity, resource) > 0]
        if not kids:
            return
        high = {k: measure(capped(k), capacity, resource) for k in kids}
        lows = {k: low(k) for k in kids}
        weight = {k: specs[k].weight for k in kids}
        if sum(high.values()) <= amount:
            given = dict(high)
        elif amount <= 0:  # the queue's guarantees above took everything: nothing for it
            given = {k: 0.0 for k in kids}
        elif sum(lows.values()) >= amount:
            given = {k: lows[k] * amount / sum(lows.values()) for k in kids}
        else:  # bisection on r: sum of clamp(r * w, low, high) grows with r
            lo_r, hi_r = 0.0, max(high[k] / weight[k] for k in kids)
            for _ in range(200):
                r = (lo_r + hi_r) / 2
                if sum(min(max(r * weight[k], lows[k]), high[k]) for k in kids) < amount:
                    lo_r = r
                else:
                    hi_r = r
            given = {k: min(max(hi_r * weight[k], lows[k]), high[k]) for k in kids}
        for kid, share in given.items():
            if children.get(kid):
                divide(kid, share)
            else:
                out[kid] = share

    divide(ROOT, 1.0)
    return out


def live_capacity(engine) -> list[float]:
    """The summed capacity of the engine's live nodes, node by node."""
    capacity = [0.0] * len(engine.resources)
    for node in engine.nodes:
        if node.alive:
            capacity = [c + float(x) for c, x in zip(capacity, node.capacity)]
    return capacity


def engine_fair_shares(engine) -> dict[str, float]:
    """The reference fair share of every leaf of a live engine, from its tasks one by one."""
    width = len(engine.resources)
    capacity = live_capacity(engine)
    demand: dict[str, list[float]] = {}
    unschedulable = engine.verdicts.unschedulable
    entries = list(engine.tasks.values()) + list(engine.requests.values())
    for task in entries:
        if task.state is TaskState.DONE:
            continue
        if task.state is TaskState.PENDING and task.id in unschedulable:
            continue  # no live node could ever hold it: it asks for no share
        count = task.count if task.state is TaskState.PENDING else 1
        row = demand.setdefault(task.tenant, [0.0] * width)
        for i, amount in enumerate(task.demand.tolist()):
            row[i] += amount * count
    return fair_shares(engine.tree.specs, demand, capacity, engine.accounting.config.resource,
                       list(engine.resources.names))


def engine_shares(engine) -> dict[str, float]:
    """Every tenant's current share of the cluster in the policy's measure, from its running tasks."""
    width = len(engine.resources)
    capacity = live_capacity(engine)
    running: dict[str, list[float]] = {}
    for task in engine.tasks.values():
        if task.state is TaskState.RUNNING:
            row = running.setdefault(task.tenant, [0.0] * width)
            for i, amount in enumerate(task.demand.tolist()):
                row[i] += amount
    return {tenant: measure(vector, capacity, engine.accounting.config.resource) for tenant, vector in running.items()}


def gang_reserved_start(engine, held) -> float | None:
    """When the gang held on nodes ``held.node`` and ``held.more`` can start there by the
    estimates of the tasks running there: the earliest time (the engine's, or an expected end)
    at which, every task due by then ended, those nodes' free room holds the whole gang (its
    size, or its tasks left if fewer) together; None if that needs a task with no estimate.
    Node by node and task by task, from the engine's tasks."""
    request = engine.requests.get(held.task.rpartition("-")[0])
    if request is None:
        return None
    size = min(request.gang, request.count)
    rows = [held.node, *held.more]
    ids = {engine.nodes[r].id for r in rows}
    running = [t for t in engine.tasks.values() if t.state is TaskState.RUNNING and t.node in ids]

    def whole_after(time: float) -> bool:
        fits = 0
        for row in rows:
            node = engine.nodes[row]
            busy = [0.0] * len(node.capacity)
            for task in running:
                if task.node == node.id and (task.estimate is None or task.start + task.estimate > time + 1e-6):
                    busy = [b + d for b, d in zip(busy, task.demand_values)]
            room = [c - b for c, b in zip(node.capacity.tolist(), busy)]
            fits += min((int((r + 1e-9) // d) for r, d in zip(room, request.demand_values) if d > 0), default=size)
        return fits >= size

    return _earliest(engine, running, whole_after)


def reserved_start(engine, held) -> float | None:
    """When the task reserved on node ``held.node`` can start by the estimates of the tasks
    running there: the earliest expected end at which it fits once
    every task due by then has ended (the engine's time if it fits now); None if that needs a
    task with no estimate. Task by task, from the engine's tasks."""
    node_id = engine.nodes[held.node].id
    need = None
    for group in engine.pending[held.tenant].groups.values():
        for entry in group.tasks:
            if entry.shape == held.shape:
                need = list(entry.demand_values)
    capacity = engine.nodes[held.node].capacity.tolist()
    running = [t for t in engine.tasks.values()
               if t.state is TaskState.RUNNING and t.node == node_id]

    def fits_after(time: float) -> bool:
        busy = [0.0] * len(capacity)
        for task in running:
            if task.estimate is None or task.start + task.estimate > time + 1e-6:
                busy = [b + d for b, d in zip(busy, task.demand_values)]
        return all(c - b >= n - 1e-9 for c, b, n in zip(capacity, busy, need))

    return _earliest(engine, running, fits_after)


def _earliest(engine, running, holds) -> float | None:
    """The engine's time if ``holds(it)``, else the earliest expected end of one of ``running``
    at which ``holds``; None if none (a task with no estimate never ends by its estimate)."""
    if holds(engine.time):
        return engine.time
    for time in sorted(t.start + t.estimate for t in running if t.estimate is not None):
        if holds(time):
            return time
    return None
