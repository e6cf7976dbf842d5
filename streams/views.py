"""What the worker writes to the store for operators to read: per-tenant accumulated usage in
the current round, quanta and the node registry (README, "Reading the state")."""

from __future__ import annotations

from fairstream.core.engine import Engine
from fairstream.wire.jsoncodec import dumps_text


def touched_nodes(steps: list[dict]) -> set[str]:
    """Nodes whose registry entry (capacity, liveness, last heartbeat, labels) ``steps`` may
    have changed: those their events name (a placement changes none of these)."""
    nodes: set[str] = set()
    for step in steps:
        nodes.update(e["node"] for e in step["events"] if "node" in e)
    return nodes


def views(engine: Engine, tenants: set[str] | None = None, nodes: set[str] | None = None,
          written_quanta: dict[str, float] | None = None) -> dict[str, dict[str, str]]:
    """Readable state for operators: accumulated usage per tenant in the current round (as of
    the tenant's last event or decision), quanta, and the node registry (JSON strings per
    field); only for ``tenants`` and ``nodes`` if given. With ``written_quanta`` (the quanta
    already in the store, updated here), only quanta that differ from it: they change only
    when the Quantum Updater moves them."""

    acc = engine.accounting
    now = engine.time or 0.0
    names = engine.resources.names
    usage = {}
    quanta = {}
    if tenants is None:
        rows = list(range(len(acc.ledgers)))
    else:  # by name, not a scan of every tenant: a pass touches a few of thousands
        rows = sorted(acc.row[name] for name in tenants if name in acc.row)
    keys = acc.usage_keys(rows, now)  # one vectorised call for all of them
    raw, counted, allocation = (acc.raw_usage[rows].tolist(), acc.counted_usage[rows].tolist(),
                                acc.allocation[rows].tolist())
    for i, row in enumerate(rows):
        name = acc.ledgers[row].name
        usage[name] = dumps_text({
            "round_start": acc.round_start,
            "raw": dict(zip(names, raw[i])),
            "counted": dict(zip(names, counted[i])),
            "allocation": dict(zip(names, allocation[i])),
            "usage_key": keys[i],
        })
        quantum = acc.quantum(row)
        if written_quanta is None or written_quanta.get(name) != quantum:
            quanta[name] = dumps_text(quantum)
            if written_quanta is not None:
                written_quanta[name] = quantum
    node_view = {
        n.id: dumps_text({"capacity": dict(zip(names, n.capacity.tolist())), "alive": n.alive,
                          "last_heartbeat": n.last_heartbeat, "labels": n.labels})
        for n in engine.nodes if nodes is None or n.id in nodes
    }
    return {f"usage:{acc.round_start:g}": usage, "quanta": quanta, "nodes": node_view}
