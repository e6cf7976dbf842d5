"""The connector's view of one Kubernetes cluster, and what each change or decision asks of it.

``ClusterMirror`` is pure and synchronous (no client, Kafka, clock or asyncio): the connector's
loop (``kube/connector.py``) feeds it the API server's nodes and pods (listed, then watched)
and the worker's decisions, with the time, and carries out what it returns:

- ``Publish``: a wire message for an input topic (a pod became a submission or a completion, a
  node a heartbeat, or lost);
- ``Bind``, ``Evict``, ``DeletePod``: calls to the API server;
- ``Explain``: the pod's ``PodScheduled=False`` condition and an Event, with a reason.

The rules (docs/kubernetes.md):

- A pod is ours when its ``spec.schedulerName`` is ours. An unbound, live pod of ours is
  submitted once; a bound one counts as running (the worker placed it); when it ends
  (Succeeded, Failed) or is deleted, its completion is published once. A pod deleted while it
  waits is completed as ``killed``: the worker withdraws it.
- Nodes: Ready and not cordoned, a heartbeat with its allocatable less what pods of other
  schedulers request there; cordoned or NotReady, a heartbeat of no room (nothing new goes
  there, what runs stays); NotReady for ``lost_after`` seconds or deleted, lost (the worker
  requeues its tasks).
- A placement is bound only when the node's real free room (allocatable less every live pod
  bound or being bound there) holds the pod: a preempted pod still terminating, or one whose
  eviction a PodDisruptionBudget refused, keeps its room until it is gone, as kube-scheduler's
  nominated pods wait for their victims. Until then the placement is held (``held``), and its
  decision is not acknowledged, so a restart reads it again.
- A decision for a pod that is gone, has ended, or is already bound is counted
  (``counts``) and logged, never retried; one already bound to the same node counts as done.
- ``preempt``: the pod is evicted (the Eviction API: PodDisruptionBudgets are honoured);
  ``requeue`` (its node lost): the pod is deleted, as Kubernetes' pod garbage collector deletes
  the pods of a deleted node. Either way its task ends with the pod, as ``killed``; the pod's
  controller (a Job, a ReplicaSet) makes a new pod, which waits as a new task.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fairstream.kube.translate import (
    DEFAULT_SCHEDULER,
    FINALIZER,
    QUEUE_LABEL,
    Untranslatable,
    capacity_of,
    node_open,
    node_ready,
    pod_requests,
    pod_terminal,
    submission,
    task_id,
    worker_amount,
    worker_resource,
)

SUBMITTED, COMPLETED, HEARTBEAT = "submitted", "completed", "heartbeat"


@dataclass(frozen=True)
class PodRef:
    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class Publish:
    kind: str  # SUBMITTED, COMPLETED or HEARTBEAT
    message: dict[str, Any]


@dataclass(frozen=True)
class Bind:
    pod: PodRef
    node: str
    decision: str  # the decision's id


@dataclass(frozen=True)
class Finalize:
    """Puts our finalizer on the pod (``add``), then sends ``then``; or takes it off (after the
    completion before it in the same actions is sent)."""

    pod: PodRef
    add: bool
    then: Publish | None = None


@dataclass(frozen=True)
class Evict:
    pod: PodRef
    decision: str


@dataclass(frozen=True)
class DeletePod:
    pod: PodRef
    decision: str


@dataclass(frozen=True)
class Explain:
    """``PodScheduled=False`` with ``reason`` and ``message`` on the pod, and an Event of the
    same (``warning``: a Warning Event, else Normal); without ``condition``, the Event alone (a
    note about a pod that may run: an estimate ignored, an eviction refused)."""

    pod: PodRef
    reason: str
    message: str
    warning: bool = False
    condition: bool = True


Action = Publish | Bind | Evict | DeletePod | Explain | Finalize


@dataclass
class PodView:
    ref: PodRef
    task: str
    ours: bool
    demand: tuple[float, ...]  # in the worker's units, every resource the mirror counts
    node: str | None = None  # the node it takes room on: bound there, or being bound (assumed)
    submitted: bool = False  # submitted by this connector (since it started)
    known: bool = False  # the worker knows its task: submitted, seen running, or it has our finalizer
    completed: bool = False  # its completion is sent (or needs none)
    left: bool = False  # it ended or is gone: it takes no room
    deleting: bool = False
    finalizer: bool = False  # our finalizer is on it (as last seen)
    finalizing: bool = False  # a call to put it on is made

    @property
    def ended(self) -> bool:
        return self.completed or self.left


@dataclass
class NodeView:
    name: str
    allocatable: tuple[float, ...]
    labels: dict[str, str]
    ready: bool
    open: bool
    not_ready_since: float | None = None
    lost: bool = False


@dataclass
class Held:
    """A placement waiting for its node's real room (``position``: where its decision was read,
    the caller's, for what it may acknowledge)."""

    decision: dict[str, Any]
    pod: str  # uid
    node: str
    position: Any = None


@dataclass
class Counts:
    """Decisions that asked for nothing to be done, by why (logged as they happen)."""

    bound: int = 0
    already_bound: int = 0  # bound to the same node before: done
    bound_elsewhere: int = 0  # bound to another node: the worker's view and the cluster's differ
    pod_gone: int = 0  # the pod is gone, or has ended
    evicted: int = 0
    deleted: int = 0
    unschedulable: int = 0
    untranslatable: int = 0  # pods that cannot be submitted as they are (said on the pod)
    duplicate_decisions: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(vars(self))


class ClusterMirror:
    """One cluster's nodes and pods as the connector knows them (see the module's docstring).

    ``resources``: the worker's resource names (``cpu`` in cores, ``mem`` in MiB, others in
    their own units); ``lost_after``: seconds a node may be NotReady before it is lost;
    ``finalizer``: whether pods of ours get ours (see ``_submit``)."""

    def __init__(self, cluster: str, resources: tuple[str, ...] = ("cpu", "mem"),
                 scheduler_name: str = DEFAULT_SCHEDULER, queue_label: str = QUEUE_LABEL,
                 lost_after: float = 300.0, remembered_decisions: int = 100_000, finalizer: bool = True) -> None:
        self.finalizer = finalizer  # (without: one API write less a pod; a pod deleted while the connector is down is not seen)
        self.cluster, self.resources, self.scheduler_name = cluster, tuple(resources), scheduler_name
        self.queue_label, self.lost_after = queue_label, lost_after
        self.index = {name: k for k, name in enumerate(self.resources)}
        self.pods: dict[str, PodView] = {}  # by uid
        self.by_task: dict[str, str] = {}  # task id -> uid
        self.nodes: dict[str, NodeView] = {}
        self.used: dict[str, list[float]] = {}  # node -> requests of every live pod on it
        self.foreign: dict[str, list[float]] = {}  # node -> requests of live pods not ours
        self.held: dict[str, list[Held]] = {}  # node -> placements waiting for room there, in order
        self.counts = Counts()
        self.seen_decisions: OrderedDict[str, None] = OrderedDict()
        self.remembered_decisions = remembered_decisions
        self.explained: dict[str, tuple[str, str]] = {}  # uid -> the (reason, message) last put on it
        self.tick = -1  # the node whose heartbeat the last tick sent

    # ------------------------------------------------------------------ pods

    def _requests(self, spec: Mapping[str, Any]) -> tuple[float, ...]:
        """Every request the mirror counts, leniently (for room, not for submissions)."""
        vector = [0.0] * len(self.resources)
        try:
            requests = pod_requests(spec)
        except Untranslatable:
            return tuple(vector)
        for name, amount in requests.items():
            k = self.index.get(worker_resource(name))
            if k is not None:
                vector[k] = worker_amount(name, amount)
        return tuple(vector)

    def pod_seen(self, pod: Mapping[str, Any], time: float) -> list[Action]:
        """A pod listed, added or modified."""
        meta, spec = pod["metadata"], pod.get("spec") or {}
        uid = meta["uid"]
        view = self.pods.get(uid)
        if view is None:
            ours = spec.get("schedulerName") == self.scheduler_name
            view = PodView(PodRef(meta["namespace"], meta["name"], uid), task_id(pod), ours, self._requests(spec))
            self.pods[uid] = view
            if ours:
                self.by_task[view.task] = uid
        out: list[Action] = []
        view.deleting = meta.get("deletionTimestamp") is not None
        view.finalizer = FINALIZER in (meta.get("finalizers") or ())
        terminal = pod_terminal(pod)
        node = spec.get("nodeName")
        if view.ours and (view.finalizer or (node and not terminal)):
            view.known = True  # (the finalizer is on before the submission goes: see _submit)
        if node and view.node is None and not terminal and not view.left:
            self._occupy(view, node)
            if not view.ours and node in self.nodes:  # its room is not the worker's to give: say so
                out += self._node_message(self.nodes[node], time)
        if terminal:
            status = "failed" if pod["status"]["phase"] == "Failed" else "succeeded"
            out += self._complete(view, status, time)
            out += self._leave(view, time)
        elif view.deleting:
            out += self._complete(view, "killed", time)
        elif view.ours and not node and not view.submitted:
            out += self._submit(pod, view, time)
        elif view.ours and self.finalizer and not view.finalizer and not view.finalizing:
            view.finalizing = True  # (a pod of ours without it, bound before: it gets one too)
            out.append(Finalize(view.ref, add=True))
        return out

    def pod_gone(self, pod: Mapping[str, Any], time: float) -> list[Action]:
        """A pod deleted: a running or waiting task of ours ends as ``killed``; its room is free."""
        view = self.pods.pop(pod["metadata"]["uid"], None)
        if view is None:
            return []
        view.finalizer = False  # (nothing to take off a pod that is gone)
        out = self._complete(view, "killed", time) + self._leave(view, time)
        if view.ours:
            self.by_task.pop(view.task, None)
        self.explained.pop(view.ref.uid, None)
        for node, waiting in list(self.held.items()):
            self.held[node] = [h for h in waiting if h.pod != view.ref.uid]
        return out

    def pods_listed(self, pods: list[Mapping[str, Any]], time: float) -> list[Action]:
        """A full list (at start, or after a watch broke): pods not in it are gone."""
        present = {p["metadata"]["uid"] for p in pods}
        out: list[Action] = []
        for uid in [uid for uid in self.pods if uid not in present]:
            view = self.pods[uid]
            out += self.pod_gone({"metadata": {"uid": uid, "namespace": view.ref.namespace, "name": view.ref.name}}, time)
        # In the order they were made (the list's is by name): a tenant's pods wait in line so.
        for pod in sorted(pods, key=lambda p: (p["metadata"].get("creationTimestamp") or "", p["metadata"]["name"])):
            out += self.pod_seen(pod, time)
        return out

    def _submit(self, pod: Mapping[str, Any], view: PodView, time: float) -> list[Action]:
        """The pod's submission, sent once its finalizer is on (``Finalize(then=...)``): a pod
        deleted while the connector is down then waits for it to say so to the worker. A pod
        that had the finalizer already (the connector restarted) is submitted again: the worker
        refuses what it knows as a duplicate, and learns what it does not."""
        try:
            made = submission(pod, self.cluster, time, self.resources, self.queue_label)
        except Untranslatable as exc:
            if self.explained.get(view.ref.uid, ("",))[0] == "Unsupported":
                return []
            self.counts.untranslatable += 1
            return self._explain(view, "Unsupported", f"fairstream cannot schedule this pod: {exc}", warning=True)
        view.submitted = view.known = True
        out: list[Action] = []
        if view.finalizer or not self.finalizer:
            out.append(Publish(SUBMITTED, made.message))
        else:
            view.finalizing = True
            out.append(Finalize(view.ref, add=True, then=Publish(SUBMITTED, made.message)))
        out += [Explain(view.ref, "InvalidEstimate", warning, warning=True, condition=False) for warning in made.warnings]
        return out

    def _complete(self, view: PodView, status: str, time: float) -> list[Action]:
        """The task's completion, once, if the worker knows it; then the finalizer comes off
        (the connector makes that call after the completion is sent)."""
        if view.completed or not view.ours:
            return []
        view.completed = True
        out: list[Action] = []
        if view.known:
            out.append(Publish(COMPLETED, {"cluster": self.cluster, "task": view.task, "time": time, "status": status}))
        if view.finalizer:
            out.append(Finalize(view.ref, add=False))
        return out

    def _leave(self, view: PodView, time: float) -> list[Action]:
        """The pod stops taking room on its node (it ended, or is gone): placements held there
        may go."""
        view.left = True
        if view.node is None:
            return []
        node, view.node = view.node, None
        self._change(node, view, -1)
        out = self._node_message(self.nodes[node], time) if not view.ours and node in self.nodes else []
        return out + self._retry_held(node, time)

    def _occupy(self, view: PodView, node: str) -> None:
        view.node = node
        self._change(node, view, +1)

    def _change(self, node: str, view: PodView, sign: int) -> None:
        used = self.used.setdefault(node, [0.0] * len(self.resources))
        for k, amount in enumerate(view.demand):
            used[k] += sign * amount
        if not view.ours:
            foreign = self.foreign.setdefault(node, [0.0] * len(self.resources))
            for k, amount in enumerate(view.demand):
                foreign[k] += sign * amount

    # ------------------------------------------------------------------ nodes

    def node_seen(self, node: Mapping[str, Any], time: float) -> list[Action]:
        """A node listed, added or modified: a heartbeat when what the worker knows of it changed."""
        name = node["metadata"]["name"]
        capacity = capacity_of(node, self.resources)
        view = self.nodes.get(name)
        before = None if view is None else (view.allocatable, view.labels, view.open, view.lost)
        ready = node_ready(node)
        if view is None:
            view = NodeView(name, tuple(capacity[r] for r in self.resources), {}, ready, False)
            self.nodes[name] = view
        view.allocatable = tuple(capacity[r] for r in self.resources)
        view.labels = {k: str(v) for k, v in ((node["metadata"].get("labels")) or {}).items()}
        view.ready, view.open = ready, node_open(node)
        if ready:
            view.not_ready_since = None
        elif view.not_ready_since is None:
            view.not_ready_since = time
        if view.lost and ready:
            view.lost = False  # back: its next heartbeat makes it live again
        out: list[Action] = []
        if before != (view.allocatable, view.labels, view.open, view.lost):
            out += self._node_message(view, time)
            out += self._retry_held(name, time)
        return out

    def node_gone(self, name: str, time: float) -> list[Action]:
        view = self.nodes.pop(name, None)
        if view is None or view.lost:
            return []
        view.lost = True
        return [self._lost(name, time)]

    def nodes_listed(self, nodes: list[Mapping[str, Any]], time: float) -> list[Action]:
        present = {n["metadata"]["name"] for n in nodes}
        out: list[Action] = []
        for name in [name for name in self.nodes if name not in present]:
            out += self.node_gone(name, time)
        for node in nodes:
            out += self.node_seen(node, time)
        return out

    def _lost(self, node: str, time: float) -> Publish:
        return Publish(HEARTBEAT, {"cluster": self.cluster, "node": node, "time": time, "lost": True})

    def _node_message(self, view: NodeView, time: float) -> list[Action]:
        if view.lost:
            return []
        if not view.open:
            capacity = dict.fromkeys(self.resources, 0.0)  # nothing new goes there; what runs stays
        else:
            foreign = self.foreign.get(view.name, [0.0] * len(self.resources))
            capacity = {r: max(0.0, a - f) for r, a, f in zip(self.resources, view.allocatable, foreign)}
        return [Publish(HEARTBEAT, {"cluster": self.cluster, "node": view.name, "time": time,
                                    "capacity": capacity, "labels": view.labels})]

    def heartbeats(self, time: float) -> list[Action]:
        """The periodic tick: nodes NotReady too long are lost, and one live node's heartbeat
        goes, round robin. One is enough to move the worker's clock (so timeouts such as
        preemption's fire while nothing else happens); every change of a node goes at once
        anyway. A tick costs the same with 10 nodes or 10,000 (all of them every tick, 1,000
        heartbeats each 10 s, stalled the worker for about a second: docs/benchmarks.md)."""
        out: list[Action] = []
        for view in list(self.nodes.values()):
            if (not view.lost and view.not_ready_since is not None
                    and time - view.not_ready_since >= self.lost_after):
                view.lost = True
                out.append(self._lost(view.name, time))
        live = [view for view in self.nodes.values() if not view.lost]
        if live:
            self.tick = (self.tick + 1) % len(live)
            out += self._node_message(live[self.tick], time)
        return out

    # ------------------------------------------------------------------ decisions

    def decision(self, decision: Mapping[str, Any], time: float, position: Any = None) -> list[Action]:
        """One decision of the worker for this cluster: what to do about it. ``position``: where
        it was read (kept with a placement that waits: ``held_positions``)."""
        ident = decision.get("id")
        if ident is not None:
            if ident in self.seen_decisions:
                self.counts.duplicate_decisions += 1
                return []
            self.seen_decisions[ident] = None
            if len(self.seen_decisions) > self.remembered_decisions:
                self.seen_decisions.popitem(last=False)
        kind = decision.get("kind")
        out: list[Action] = []
        for task in decision.get("tasks") or [decision.get("task")]:
            uid = self.by_task.get(task)
            view = None if uid is None else self.pods.get(uid)
            if kind == "place":
                out += self._place(decision, view, time, position)
            elif view is None or view.ended:
                self.counts.pod_gone += 1
            elif kind == "preempt":
                self.counts.evicted += 1
                out.append(Evict(view.ref, str(ident)))
            elif kind == "requeue":
                self.counts.deleted += 1
                out.append(DeletePod(view.ref, str(ident)))
            elif kind == "unschedulable":
                self.counts.unschedulable += 1
                out += self._explain(view, "Unschedulable", decision.get("reason") or "no node can ever hold it")
        return out

    def _place(self, decision: Mapping[str, Any], view: PodView | None, time: float,
               position: Any = None) -> list[Action]:
        node = decision.get("node")
        if view is None or view.ended or view.deleting:
            self.counts.pod_gone += 1
            return []
        if view.node is not None:
            if view.node == node:
                self.counts.already_bound += 1
            else:
                self.counts.bound_elsewhere += 1
            return []
        if node not in self.nodes or self.nodes[node].lost:
            self.counts.pod_gone += 1  # (its node went: the worker requeues what it placed there)
            return []
        if self.held.get(node) or not self._fits(view, node):
            self.held.setdefault(node, []).append(Held(dict(decision), view.ref.uid, node, position))
            return self._explain(view, "WaitingForRoom",
                                 f"placed on node {node} by fairstream; waits for the pods leaving it "
                                 f"(preempted or terminating) to free its room")
        return self._bind(view, node, str(decision.get("id")))

    def _bind(self, view: PodView, node: str, ident: str) -> list[Action]:
        self._occupy(view, node)  # assumed now: the next placement there sees its room taken
        self.counts.bound += 1
        self.explained.pop(view.ref.uid, None)
        return [Bind(view.ref, node, ident)]

    def _fits(self, view: PodView, node: str) -> bool:
        used = self.used.get(node, [0.0] * len(self.resources))
        room = self.nodes[node].allocatable
        return all(u + d <= c + 1e-9 for u, d, c in zip(used, view.demand, room))

    def _retry_held(self, node: str, time: float) -> list[Action]:
        """Placements held on ``node``, in order, while they fit."""
        waiting = self.held.get(node)
        out: list[Action] = []
        while waiting:
            first = waiting[0]
            view = self.pods.get(first.pod)
            if view is None or view.ended or view.node is not None:
                waiting.pop(0)
                continue
            if node not in self.nodes or not self._fits(view, node):
                break
            waiting.pop(0)
            out += self._bind(view, node, str(first.decision.get("id")))
        if not waiting:
            self.held.pop(node, None)
        return out

    def bind_failed(self, uid: str, node: str) -> None:
        """The API refused a binding (the pod is gone, or bound elsewhere meanwhile): its room
        is not taken after all."""
        view = self.pods.get(uid)
        if view is not None and view.node == node and not view.ended:
            view.node = None
            self._change(node, view, -1)

    def held_positions(self) -> list[Any]:
        """Where the decisions of placements still waiting were read: not to be acknowledged."""
        return [h.position for waiting in self.held.values() for h in waiting]

    def held_decisions(self) -> list[str]:
        """Ids of decisions whose placement still waits (not acknowledged to Kafka)."""
        return [str(h.decision.get("id")) for waiting in self.held.values() for h in waiting]

    # ------------------------------------------------------------------ explanations

    def _explain(self, view: PodView, reason: str, message: str, warning: bool = False) -> list[Action]:
        if self.explained.get(view.ref.uid) == (reason, message):
            return []
        self.explained[view.ref.uid] = (reason, message)
        return [Explain(view.ref, reason, message, warning)]

    def pending_reasons(self, entries: list[Mapping[str, Any]]) -> list[Action]:
        """The worker's pending entries (``/v1/clusters/{c}/pending``): each waiting pod's reason
        onto it, when it changed."""
        out: list[Action] = []
        for entry in entries:
            if entry.get("tasks", 1) != 1:
                continue
            uid = self.by_task.get(entry.get("first") or entry.get("id") or "")
            view = None if uid is None else self.pods.get(uid)
            if uid is None or view is None or view.node is not None or view.ended or not view.submitted:
                continue
            if self.explained.get(uid, ("", ""))[0] in ("WaitingForRoom", "Unsupported"):
                continue
            reason = "Unschedulable" if entry.get("reason") == "unschedulable" else "Waiting"
            out += self._explain(view, reason, f"fairstream: {entry.get('message') or entry.get('reason')}")
        return out
