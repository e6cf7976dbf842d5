"""The visibility documents (issue "Operators can see why"), version ``v1``: what
``fairstream status`` and ``fairstream pending`` print, what the worker's HTTP API serves
(``/v1/clusters``, ``/v1/clusters/{c}/tenants``, ``/v1/clusters/{c}/pending``,
``/v1/clusters/{c}/history``) and what ``simulate --explain-at T`` writes: one format for all
of them, made here from an ``Explanation``'s JSON (``fairstream.core.explain``) and from what
the worker stored of it.

What the worker stores per cluster, with a commit at most every ``--explain-interval`` seconds
(view ``explain``, replaced whole each time): field ``status`` (the tenants' status) and one
field ``pending:<tenant>`` per tenant with pending work, holding its first
``--explain-max-entries`` pending entries (a single task or a whole request each: a request of
100,000 tasks is one entry) and its groups (every pending task by shape, with the reason they
share: nothing goes unexplained when entries are capped), with the totals; and one sample per
write in the cluster's history (its last ``HISTORY_SAMPLES``: each tenant's dominant share and
accumulated usage). A write costs the tenants, shapes and listed entries, not the pending tasks.

Pure functions over JSON-level data; importing this loads neither the engine nor Redis.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

API_VERSION = "v1"
DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000
DEFAULT_MAX_ENTRIES = 100


class DocumentError(ValueError):
    """A query the documents cannot answer (unknown tenant or task, bad page): one line."""


def tenant_pending(entries: list[dict], groups: list[dict]) -> dict[str, Any]:
    """What is kept of one tenant's pending work: its listed entries and its groups (every
    pending task by shape, with its reason), with the totals."""
    return {"entries": entries, "groups": groups, "entries_total": sum(g["entries"] for g in groups),
            "tasks_total": sum(g["tasks"] for g in groups)}


def stored_views(status: dict, pending: dict, nodes: dict | None = None) -> dict[str, str]:
    """The fields of the ``explain`` view for ``Explanation.status_json()`` and
    ``Explanation.pending_json()``, and ``explain.node_status`` (field ``nodes``)."""
    fields = {"status": json.dumps(status)}
    if nodes is not None:
        fields["nodes"] = json.dumps(nodes)
    for tenant, entries in pending["pending"].items():
        fields[f"pending:{tenant}"] = json.dumps(tenant_pending(entries, pending["groups"].get(tenant, [])))
    return fields


def below_fair_share(status: dict) -> set[str]:
    """The tenants of ``status`` below their fair share as closely as whole tasks allow, with
    work waiting: the simulator's rule for time to fair share (``sim.metrics``). A tenant is
    below when its dominant share is under its fair share and, if it runs anything, some tenant
    is above its own fair share by at least one of its tasks (its mean running task): room that
    could come to it without taking another below its share. (Three tenants of 1-GPU tasks on 256
    GPUs: 86, 86, 84 is at fair share; 85.33 each cannot be.)"""
    tenants = status["tenants"]
    share = {t["tenant"]: max(t["share"].values(), default=0.0) for t in tenants}
    excess = max((share[t["tenant"]] - t["fair_share"] for t in tenants), default=0.0)
    below = set()
    for t in tenants:
        held = share[t["tenant"]]
        if t["pending"] <= 0 or held >= t["fair_share"] - 1e-9:
            continue
        if t["running"] > 0 and excess < held / t["running"] - 1e-9:
            continue  # (no whole task of its could come to it)
        below.add(t["tenant"])
    return below


def history_sample(status: dict) -> str:
    """One point of a cluster's history: per tenant its dominant share and accumulated usage;
    ``below: true`` if it is below its fair share (``below_fair_share``), ``idle: true`` if
    nothing of it waits."""
    below = below_fair_share(status)
    tenants = {}
    for t in status["tenants"]:
        point = {"share": max(t["share"].values(), default=0.0), "accumulated": t["accumulated"]}
        if t["tenant"] in below:
            point["below"] = True
        elif t["pending"] <= 0:
            point["idle"] = True
        tenants[t["tenant"]] = point
    return json.dumps({"time": status["time"], "tenants": tenants})


def fair_share_times(samples: list[dict]) -> dict[str, dict[str, float | None]]:
    """Per tenant, from a history's samples (oldest first): ``below_since``, the time of the
    first sample of the stretch it is below its fair share in now (None: not below now); and
    ``time_to_fair_share`` with ``reached_at``, the length of its last stretch below that ended
    at its fair share (not with nothing waiting) and when it ended (None: none in the history). To within a sample (the
    worker's ``--explain-interval``); a stretch begun before the oldest sample kept counts from it."""
    out: dict[str, dict[str, float | None]] = {}
    started: dict[str, float] = {}
    for sample in samples:
        at = sample.get("time")
        if not isinstance(at, (int, float)):
            continue
        for tenant, point in (sample.get("tenants") or {}).items():
            row = out.setdefault(tenant, {"below_since": None, "time_to_fair_share": None, "reached_at": None})
            if point.get("below"):
                started.setdefault(tenant, at)
            elif tenant in started:
                since = started.pop(tenant)
                if not point.get("idle"):  # (a stretch that ended with nothing waiting reached nothing)
                    row["time_to_fair_share"], row["reached_at"] = at - since, at
    for tenant, since in started.items():
        out[tenant]["below_since"] = since
    return out


def cluster_summary(cluster: str, status: dict | None) -> dict[str, Any]:
    """One row of ``/v1/clusters``."""
    if status is None:
        return {"cluster": cluster, "time": None, "policy": None, "tenants": 0, "running": 0, "pending": 0}
    tenants = status["tenants"]
    return {"cluster": cluster, "time": status["time"], "policy": status["policy"], "tenants": len(tenants),
            "running": sum(t["running"] for t in tenants), "pending": sum(t["pending"] for t in tenants)}


def clusters_document(rows: list[dict]) -> dict[str, Any]:
    return {"api": API_VERSION, "clusters": rows}


def busiest_cluster(document: dict) -> str | None:
    """The cluster of ``/v1/clusters`` with the most tasks running and pending (the first by
    name among equals): the one the page opens on when none is named. None: no cluster."""
    rows = document["clusters"]
    if not rows:
        return None
    return min(rows, key=lambda row: (-(row["running"] + row["pending"]), row["cluster"]))["cluster"]


_LIMITS = ("min_share", "max_share", "max_resources", "max_running")


def tenants_document(cluster: str, status: dict) -> dict[str, Any]:
    """``/v1/clusters/{c}/tenants``: every tenant's status, in the policy's order (those with
    pending work by rank, then the others by name), with ``limits``: its own ``min_share``,
    ``max_share``, ``max_resources`` and ``max_running`` as configured (those set)."""
    specs = {spec["id"]: spec for spec in status.get("tree") or ()}
    tenants = sorted(({**t, "limits": {k: specs[t["tenant"]][k] for k in _LIMITS if k in specs.get(t["tenant"], {})}}
                      for t in status["tenants"]), key=lambda t: (t["rank"] is None, t["rank"] or 0, t["tenant"]))
    return {"api": API_VERSION, "cluster": cluster, "time": status["time"], "policy": status["policy"],
            "order": status["order"], "tenants": tenants}


#: The wait reasons (``fairstream.core.explain.WaitReason``'s values; a test keeps them equal):
#: here so that reading documents loads no engine.
WAIT_REASONS = ("unschedulable", "stage_not_released", "max_share", "max_resources", "max_running", "partition",
                "constraints", "max_per_node", "gang", "next_pass", "preemption_pending", "efficiency", "reservation",
                "reserved_for_other", "no_room", "behind_tenants")
#: Entries alike in all of these are one row of a grouped listing.
_GROUPED_BY = ("tenant", "job", "demand", "reason", "message", "waits_for", "gap")


def grouped_entries(entries: list[dict]) -> list[dict]:
    """Runs of consecutive entries of one tenant that are alike (same job, demand, reason and
    message: 50 tasks preempted from one request come back as 50 single tasks) as one row each:
    the first entry with ``entries`` (how many were merged), ``tasks`` (their tasks) and
    ``last`` (the last one's id); ``position`` stays the first's (tasks ahead of it in its
    tenant's line)."""
    rows: list[dict] = []
    for entry in entries:
        last = rows[-1] if rows else None
        if last is not None and all(last[k] == entry.get(k) for k in _GROUPED_BY) \
                and entry["position"] == last["position"] + last["tasks"]:
            last["entries"] += 1
            last["tasks"] += entry["tasks"]
            last["last"] = entry["id"]
        else:
            rows.append({**entry, "entries": 1, "last": entry["id"]})
    return rows


def queues_document(cluster: str, status: dict, pending: Mapping[str, dict]) -> dict[str, Any]:
    """``/v1/clusters/{c}/queues``: the tenant tree as an operator reads it, a row per queue
    and leaf, parents first: its weight, limits and ordering as configured; ``entitled``,
    ``fair_share``, ``running`` and ``pending`` summed over the leaves below it (a queue's fair
    share is what the tree's division gives its leaves, docs/policies.md "The fair share");
    ``share`` its dominant share of the cluster (the per-resource shares of its leaves summed,
    the largest); ``waiting``: its pending tasks by the reason they wait (every one, from the
    groups), largest first, and ``held_by`` the reason most of them wait for."""
    tree = status.get("tree") or [{"id": t["tenant"]} for t in status["tenants"]]
    parent = {spec["id"]: spec.get("parent") for spec in tree}
    rows: dict[str, dict] = {}
    for spec in tree:
        up, depth = spec.get("parent"), 0
        while up is not None and depth <= len(tree):
            depth, up = depth + 1, parent.get(up)
        rows[spec["id"]] = {"queue": spec["id"], "parent": spec.get("parent"), "depth": depth, "leaf": True,
                            "weight": spec.get("weight", 1.0), "ordering": spec.get("ordering"),
                            "limits": {k: spec[k] for k in _LIMITS if k in spec}, "entitled": 0.0, "fair_share": 0.0,
                            "resources": {}, "running": 0, "pending": 0, "waiting": {}}
    for row in rows.values():
        if row["parent"] in rows:
            rows[row["parent"]]["leaf"] = False

    def up_from(name: str):
        seen = 0
        while name in rows and seen <= len(rows):
            yield rows[name]
            name, seen = rows[name]["parent"], seen + 1

    for t in status["tenants"]:
        for row in up_from(t["tenant"]):
            row["entitled"] += t.get("entitled") or 0.0
            row["fair_share"] += t.get("fair_share") or 0.0
            row["running"] += t["running"]
            row["pending"] += t["pending"]
            for resource, value in t["share"].items():
                row["resources"][resource] = row["resources"].get(resource, 0.0) + value
    for name, kept in pending.items():
        for group in kept.get("groups", []):
            for row in up_from(name):
                row["waiting"][group["reason"]] = row["waiting"].get(group["reason"], 0) + group["tasks"]
    out = []
    for row in rows.values():
        resources = row.pop("resources")
        row["share"] = max(resources.values(), default=0.0)
        waiting: dict[str, float] = row["waiting"]
        row["waiting"] = dict(sorted(waiting.items(), key=lambda item: (-item[1], item[0])))
        row["held_by"] = next(iter(row["waiting"]), None)
        out.append(row)
    return {"api": API_VERSION, "cluster": cluster, "time": status["time"], "policy": status["policy"],
            "queues": out}


def pending_by_reason(groups: list[dict]) -> list[dict]:
    """The pending tasks of ``groups`` (``PendingGroup.to_json``: every pending task, nothing
    capped away) by the reason they wait: ``{"reason", "tasks", "tenants"}``, most tasks first."""
    tasks: dict[str, int] = {}
    tenants: dict[str, set] = {}
    for group in groups:
        tasks[group["reason"]] = tasks.get(group["reason"], 0) + group["tasks"]
        tenants.setdefault(group["reason"], set()).add(group["tenant"])
    return [{"reason": reason, "tasks": count, "tenants": sorted(tenants[reason])}
            for reason, count in sorted(tasks.items(), key=lambda item: (-item[1], item[0]))]


def pending_document(cluster: str, status: dict, pending: Mapping[str, dict], tenant: str | None = None,
                     task: str | None = None, page: int = 1, size: int = DEFAULT_PAGE_SIZE,
                     reason: str | None = None, group: bool = False) -> dict[str, Any]:
    """``/v1/clusters/{c}/pending``: pending entries with the reason each waits, ``size`` per
    page (page 1 first), of one tenant or of all in the policy's order (tenants by rank, each
    tenant's in its line); with ``task``, the entry that holds that task (a single task by id, a
    task ``<request>-<k>`` of a request) and its position in its tenant's queue. ``reason``:
    only entries (and groups) waiting for that reason; ``group``: alike entries as one row
    (``grouped_entries``). Each entry carries ``tenant_rank``, its tenant's rank among the
    waiting tenants. ``pending``: per tenant, as ``stored_views`` keeps it."""
    if not 1 <= size <= MAX_PAGE_SIZE:
        raise DocumentError(f"size {size}: must be 1 to {MAX_PAGE_SIZE}")
    if page < 1:
        raise DocumentError(f"page {page}: must be 1 or more")
    if reason is not None and reason not in WAIT_REASONS:
        raise DocumentError(f"reason {reason}: not a wait reason (reasons: {', '.join(WAIT_REASONS)})")
    head = {"api": API_VERSION, "cluster": cluster, "time": status["time"], "policy": status["policy"],
            "order": status["order"]}
    if tenant is not None and tenant not in pending:
        known = {t["tenant"] for t in status["tenants"]}
        if tenant not in known:
            raise DocumentError(f"tenant {tenant}: not a tenant of cluster {cluster}")
        pending = {}
    elif tenant is not None:
        pending = {tenant: pending[tenant]}
    ranks = {t["tenant"]: t["rank"] for t in status["tenants"]}
    ranked = [t["tenant"] for t in tenants_document(cluster, status)["tenants"] if t["tenant"] in pending]
    if task is not None:
        for name in ranked:
            for entry in pending[name]["entries"]:
                offset = _offset_in(entry, task)
                if offset is not None:
                    return {**head, "task": task, "position": entry["position"] + offset,
                            "entry": {**entry, "tenant_rank": ranks.get(name)}}
        raise DocumentError(f"task {task}: not pending in cluster {cluster}"
                            + (f" for tenant {tenant}" if tenant else "")
                            + " (or beyond the entries kept per tenant)")
    entries = [{**entry, "tenant_rank": ranks.get(name)} for name in ranked for entry in pending[name]["entries"]
               if reason is None or entry["reason"] == reason]
    groups = [g for name in ranked for g in pending[name]["groups"] if reason is None or g["reason"] == reason]
    if group:
        entries = grouped_entries(entries)
    start = (page - 1) * size
    # entries_total: every pending entry; entries_listed: those kept and paged (the first
    # max_entries of each tenant; rows when grouped); tasks_total: the tasks of every entry.
    # ``groups``: every pending task by tenant and shape with its reason, listed or not. With
    # ``reason``, the totals count that reason's groups.
    if reason is None:
        entries_total = sum(pending[name]["entries_total"] for name in ranked)
        tasks_total = sum(pending[name]["tasks_total"] for name in ranked)
    else:
        entries_total, tasks_total = sum(g["entries"] for g in groups), sum(g["tasks"] for g in groups)
    return {**head, "tenant": tenant, "reason": reason, "grouped": group, "page": page, "size": size,
            "entries_total": entries_total, "entries_listed": len(entries), "tasks_total": tasks_total,
            "by_reason": pending_by_reason(groups), "groups": groups, "entries": entries[start:start + size]}


def history_document(cluster: str, status: dict, samples: list[dict]) -> dict[str, Any]:
    """``/v1/clusters/{c}/history``: the cluster's kept ``history_sample``s, oldest first, and per
    tenant how long it has been, or last was, below its fair share (``fair_share_times``)."""
    return {"api": API_VERSION, "cluster": cluster, "policy": status["policy"], "samples": samples,
            "tenants": fair_share_times(samples)}


def nodes_document(cluster: str, status: dict, nodes: dict | None) -> dict[str, Any]:
    """``/v1/clusters/{c}/nodes``: its nodes (``explain.node_status``: the reserved first, then
    the most used, at most 500), each live or lost, its capacity and use, and the reservation
    it holds; with ``nodes_total`` and the ``reservation``."""
    nodes = nodes or {"nodes": [], "nodes_total": 0, "reservation": None}
    return {"api": API_VERSION, "cluster": cluster, "time": status["time"], "nodes": nodes["nodes"],
            "nodes_total": nodes["nodes_total"], "reservation": nodes["reservation"]}


def events_document(cluster: str, status: dict, recent: list[dict],
                    preempted: Mapping[str, tuple[int, float]] | None = None) -> dict[str, Any]:
    """``/v1/clusters/{c}/events``: the cluster's recent events (kept in the order recorded),
    newest first by event time, the last recorded first among equal times (recorded order is
    not event time: a step held open across batches is recorded when it closes, after a later
    tenant tree rejected meanwhile); and ``preempted``: per tenant, its tasks preempted and
    their work lost (task-seconds of event time) since the cluster's start, most work lost first."""
    def time_of(event: dict) -> float:
        at = event.get("time") if isinstance(event, dict) else None
        return at if isinstance(at, (int, float)) and not isinstance(at, bool) else -math.inf

    totals = sorted(((tenant, tasks, lost) for tenant, (tasks, lost) in (preempted or {}).items()),
                    key=lambda row: (-row[2], -row[1], row[0]))
    return {"api": API_VERSION, "cluster": cluster, "time": status["time"],
            "events": sorted(reversed(recent), key=time_of, reverse=True),
            "preempted": [{"tenant": tenant, "tasks": tasks, "work_lost": lost} for tenant, tasks, lost in totals]}


def _offset_in(entry: dict, task: str) -> int | None:
    """``task``'s place within ``entry`` (0 for a single task), or None if not one of its tasks."""
    if entry["tasks"] == 1 and entry["first"] == task:
        return 0
    prefix = entry["id"] + "-"
    if entry["tasks"] > 1 and task.startswith(prefix) and entry["first"].startswith(prefix):
        index, first = task[len(prefix):], entry["first"][len(prefix):]
        if index.isdigit() and first.isdigit() and 0 <= int(index) - int(first) < entry["tasks"]:
            return int(index) - int(first)
    return None


def pending_by_tenant(fields: Mapping[str, Any]) -> dict[str, dict]:
    """The ``pending:<tenant>`` fields of a stored ``explain`` view, by tenant."""
    return {name[len("pending:"):]: value for name, value in fields.items() if name.startswith("pending:")}


def explanation_documents(cluster: str, status: dict, pending: dict) -> dict[str, dict]:
    """What ``simulate --explain-at T`` writes for ``Explanation.status_json()`` and
    ``pending_json()``: ``tenants.json`` and ``pending.json`` (every entry, one page), as the API
    would serve them for the same state."""
    stored = {t: tenant_pending(e, pending["groups"].get(t, [])) for t, e in pending["pending"].items()}
    size = max(1, sum(len(e) for e in pending["pending"].values()))
    all_pending = pending_document(cluster, status, stored, size=min(size, MAX_PAGE_SIZE))
    if size > MAX_PAGE_SIZE:  # a file is not paged
        all_pending["entries"] = [e for t in (r["tenant"] for r in tenants_document(cluster, status)["tenants"])
                                  for e in pending["pending"].get(t, [])]
        all_pending["size"] = size
    return {"tenants.json": tenants_document(cluster, status), "pending.json": all_pending}


__all__ = ["API_VERSION", "DocumentError", "queues_document", "pending_by_reason", "history_document", "events_document", "grouped_entries", "tenant_pending", "stored_views", "history_sample", "cluster_summary", "clusters_document",
           "tenants_document", "pending_document", "pending_by_tenant", "explanation_documents"]
