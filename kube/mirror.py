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
- Pods of a group that starts whole (a PodGroup of the ``gang`` policy, or a Kueue pod group)
  wait until as many exist as must start together (its ``minCount`` less those of it running),
  then go as one request with a gang of that size; each pod is task ``k`` of it, written on
  the pod (``fairstream.dev/gang``) with our finalizer, so a restart knows it again. A pod of
  the request deleted before any of it starts withdraws the whole request: the others wait
  for the group again. Pods of a PodGroup of the ``basic`` policy, and of a group whose gang
  runs, go one by one.
- ``preempt``: the pod is evicted (the Eviction API: PodDisruptionBudgets are honoured);
  ``requeue`` (its node lost): the pod is deleted, as Kubernetes' pod garbage collector deletes
  the pods of a deleted node. Either way its task ends with the pod, as ``killed``; the pod's
  controller (a Job, a ReplicaSet) makes a new pod, which waits as a new task.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fairstream.kube.translate import (
    DEFAULT_SCHEDULER,
    FINALIZER,
    GANG_ANNOTATION,
    QUEUE_LABEL,
    GroupRef,
    Untranslatable,
    capacity_of,
    gang_annotation,
    gang_request_id,
    gang_submission,
    group_of,
    kueue_group_size,
    node_open,
    node_ready,
    pod_requests,
    pod_terminal,
    podgroup_min,
    read_gang_annotation,
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
    completion before it in the same actions is sent); ``add`` None: neither (``annotations``
    alone). ``annotations`` are written in the same call. Several calls may share one ``then``
    (a gang's request): it is sent once, after them."""

    pod: PodRef
    add: bool | None
    then: Publish | None = None
    annotations: tuple[tuple[str, str], ...] = ()


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
    group: str | None = None  # the key of its group that starts whole (GroupRef.key), if any
    request: str | None = None  # the gang's request it is a task of, while none of that request runs

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
class GroupView:
    """A group of pods that starts whole, as the mirror knows it: its size (a PodGroup's
    ``minCount``, or a Kueue pod group's total; None until its PodGroup is seen), its live pods
    of ours (``members``), the latest object of each not yet bound (``pods``, in arrival order),
    and those waiting for enough of the group to go as one request (``gathering``)."""

    ref: GroupRef
    size: int | None = None
    basic: bool = False  # a PodGroup of the basic policy: its pods start one by one
    podgroup: bool = False  # its PodGroup object is seen
    members: set[str] = field(default_factory=set)
    pods: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    gathering: dict[str, None] = field(default_factory=dict)


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
    gangs: int = 0  # gangs' requests submitted
    gangs_withdrawn: int = 0  # gangs' requests withdrawn: a pod of theirs went before any started
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
        self.groups: dict[str, GroupView] = {}  # by GroupRef.key: groups with pods of ours, or a PodGroup
        self.requests: dict[str, list[str]] = {}  # a gang's request none of which runs -> its pods' uids, by index
        self.recovered: dict[str, tuple[str, int, int]] = {}  # request read off pods (a restart) -> (group, count, min)
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
                self._join_group(view, pod)
                if view.group is None or view.request is not None:
                    self.by_task[view.task] = uid
        out: list[Action] = []
        view.deleting = meta.get("deletionTimestamp") is not None
        view.finalizer = FINALIZER in (meta.get("finalizers") or ())
        terminal = pod_terminal(pod)
        node = spec.get("nodeName")
        group = None if view.group is None else self.groups[view.group]
        if group is not None and not node and not terminal and not view.left:
            group.pods[uid] = pod  # (made into a request from its latest)
        if view.ours and ((view.finalizer and (group is None or view.request is not None)) or (node and not terminal)):
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
            out += self._gathered_no_more(view, time)
        elif group is not None and not node and not view.submitted:
            out += self._gather(view, group, time)
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
        out = self._complete(view, "killed", time) + self._leave(view, time) + self._gathered_no_more(view, time)
        if view.ours:
            self.by_task.pop(view.task, None)
        if view.group is not None:
            group = self.groups[view.group]
            group.members.discard(view.ref.uid)
            if not group.members and not group.podgroup:
                del self.groups[view.group]  # (kept while it has pods or its PodGroup: not history)
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
        return out + self._recover(time)

    def _submit(self, pod: Mapping[str, Any], view: PodView, time: float) -> list[Action]:
        """The pod's submission, sent once its finalizer is on (``Finalize(then=...)``): a pod
        deleted while the connector is down then waits for it to say so to the worker. A pod
        that had the finalizer already (the connector restarted) is submitted again: the worker
        refuses what it knows as a duplicate, and learns what it does not."""
        try:
            made = submission(pod, self.cluster, time, self.resources, self.queue_label)
        except Untranslatable as exc:
            return self._unsupported([view], str(exc))
        view.submitted = view.known = True
        self.by_task[view.task] = view.ref.uid
        out: list[Action] = []
        if view.finalizer or not self.finalizer:
            out.append(Publish(SUBMITTED, made.message))
        else:
            view.finalizing = True
            out.append(Finalize(view.ref, add=True, then=Publish(SUBMITTED, made.message)))
        out += [Explain(view.ref, "InvalidEstimate", warning, warning=True, condition=False) for warning in made.warnings]
        return out

    # ------------------------------------------------------------------ groups that start whole

    def _group(self, ref: GroupRef) -> GroupView:
        group = self.groups.get(ref.key)
        if group is None:
            group = self.groups[ref.key] = GroupView(ref)
        return group

    def _join_group(self, view: PodView, pod: Mapping[str, Any]) -> None:
        """A new pod of ours: a member of its group, if it has one; if it carries the mark of a
        gang's request (a connector before this one made it), a task of that request again."""
        ref = group_of(pod)
        if ref is None:
            return
        group = self._group(ref)
        group.members.add(view.ref.uid)
        view.group = ref.key
        marked = read_gang_annotation(pod)
        if marked is None:
            return
        request, index, count, least = marked
        slots = self.requests.setdefault(request, [""] * count)
        if len(slots) != count or slots[index]:
            return  # (a mark that does not agree with its request's others: gathered anew)
        slots[index] = view.ref.uid
        view.task, view.request = f"{request}-{index}", request
        self.recovered.setdefault(request, (ref.key, count, least))

    def _recover(self, time: float) -> list[Action]:
        """The gangs' requests read off the pods' marks (``_join_group``), once all pods are
        listed: one of which a pod runs or ran is known to the worker (its other tasks wait
        there); one whose pods all wait is submitted again (the worker refuses it as a duplicate
        if it has it); one with a pod missing is withdrawn, its pods gathered anew."""
        out: list[Action] = []
        recovered, self.recovered = self.recovered, {}
        for request, (key, count, least) in recovered.items():
            slots = self.requests.get(request, [])
            views = [self.pods[uid] for uid in slots if uid in self.pods]
            group = self.groups[key]
            if any(v.node is not None or v.left or v.completed for v in views):
                self.requests.pop(request, None)
                for v in views:
                    v.request = None
                    v.submitted = v.known = True
                continue
            whole = len(views) == count and all(not v.deleting for v in views)
            if whole:
                try:
                    made = gang_submission([group.pods[v.ref.uid] for v in views], group.ref, request, least,
                                           self.cluster, time, self.resources, self.queue_label)
                except (Untranslatable, KeyError):
                    whole = False
            if whole:
                for v in views:
                    v.submitted = v.known = True
                out.append(Publish(SUBMITTED, made.message))
            else:
                for k, uid in enumerate(slots):
                    if not uid:  # (a pod of it gone unseen: its task may wait in the worker)
                        out.append(Publish(COMPLETED, {"cluster": self.cluster, "task": f"{request}-{k}",
                                                       "time": time, "status": "killed"}))
                        slots[k] = f"gone-{k}"
                out += self._withdraw(request, time)
        for key in dict.fromkeys(key for key, _, _ in recovered.values()):
            if key in self.groups:
                out += self._try_group(self.groups[key], time)
        return out

    def _gather(self, view: PodView, group: GroupView, time: float) -> list[Action]:
        """A waiting pod of a group: it waits for enough of its group (``_try_group``)."""
        if view.request is not None:
            return []  # (in a request read off its mark: ``_recover`` decides)
        group.gathering[view.ref.uid] = None
        return self._try_group(group, time)

    def _gathered_no_more(self, view: PodView, time: float) -> list[Action]:
        """A pod of a group is deleted or gone: it is gathered no more; if its gang's request
        has not started, the request is withdrawn whole and its other pods gathered again."""
        if view.group is None:
            return []
        group = self.groups[view.group]
        group.gathering.pop(view.ref.uid, None)
        group.pods.pop(view.ref.uid, None)
        out: list[Action] = []
        if view.request is not None and view.request in self.requests:
            out += self._withdraw(view.request, time)
        return out + self._try_group(group, time)

    def _withdraw(self, request: str, time: float) -> list[Action]:
        """A gang's request none of which runs loses a pod: its tasks are withdrawn from the
        worker (``killed``, as a deleted waiting pod's), and its other pods wait for the group
        again (under another request: ``gang_request_id``)."""
        self.counts.gangs_withdrawn += 1
        out: list[Action] = []
        for uid in self.requests.pop(request, ()):
            view = self.pods.get(uid)
            if view is None or view.request != request:
                continue
            if not view.completed and view.known:
                out.append(Publish(COMPLETED, {"cluster": self.cluster, "task": view.task, "time": time,
                                               "status": "killed"}))
            self.by_task.pop(view.task, None)
            view.task, view.request = task_id({"metadata": {"namespace": view.ref.namespace, "name": view.ref.name,
                                                            "uid": view.ref.uid}}), None
            view.submitted = view.known = False
            group = self.groups[view.group] if view.group is not None else None
            if group is not None and not view.ended and not view.deleting and uid in group.pods:
                group.gathering[uid] = None
        return out

    def _try_group(self, group: GroupView, time: float) -> list[Action]:
        """The group's gathered pods go if enough are there: as one request of all of them,
        ``size`` less those of the group running of which must start together; one by one if
        that is 1 or less (or the group's policy is basic). Else each says what it waits for."""
        gathered = [uid for uid in group.gathering if uid in self.pods and uid in group.pods
                    and not self.pods[uid].ended and not self.pods[uid].deleting and self.pods[uid].node is None]
        group.gathering = dict.fromkeys(gathered)
        if not gathered:
            return []
        size = group.size
        if group.ref.kueue:
            try:
                size = kueue_group_size(group.pods[gathered[-1]])
            except Untranslatable as exc:
                return self._unsupported([self.pods[uid] for uid in gathered], str(exc))
        if size is None and not group.basic:
            return self._explain_each(gathered, "WaitingForPodGroup",
                                      f"fairstream: waits for {group.ref}, which does not exist yet")
        running = sum(1 for uid in group.members
                      if uid in self.pods and self.pods[uid].node is not None and not self.pods[uid].ended)
        least = 1 if group.basic or size is None else size - running
        if least <= 1:  # (one by one: its policy is basic, or its gang runs)
            out: list[Action] = []
            for uid in gathered:
                del group.gathering[uid]
                out += self._submit(group.pods[uid], self.pods[uid], time)
            return out
        pending = [request for request, uids in self.requests.items()
                   if any(uid in self.pods and self.pods[uid].group == group.ref.key for uid in uids)]
        if pending:
            return self._explain_each(gathered, "WaitingForGang",
                                      f"fairstream: waits for the gang of its {group.ref} to start ({pending[0]})")
        if len(gathered) < least:
            return self._explain_each(gathered, "WaitingForGang",
                                      f"fairstream: waits for the pods of its {group.ref}: {len(gathered)} of the "
                                      f"{least} that must start together exist")
        return self._make_request(group, gathered, least, time)

    def _make_request(self, group: GroupView, uids: list[str], least: int, time: float) -> list[Action]:
        """``uids`` of ``group`` as one gang's request, ``least`` of which start together. Each
        pod gets our finalizer and its mark in one call; the request goes once they are made."""
        request = gang_request_id(group.ref, uids)
        try:
            made = gang_submission([group.pods[uid] for uid in uids], group.ref, request, least, self.cluster, time,
                                   self.resources, self.queue_label)
        except Untranslatable as exc:
            return self._unsupported([self.pods[uid] for uid in uids], str(exc))
        self.counts.gangs += 1
        publish = Publish(SUBMITTED, made.message)
        self.requests[request] = list(uids)
        out: list[Action] = []
        for k, uid in enumerate(uids):
            view = self.pods[uid]
            del group.gathering[uid]
            view.task, view.request = f"{request}-{k}", request
            view.submitted = view.known = True
            self.by_task[view.task] = uid
            view.finalizing = self.finalizer
            mark = ((GANG_ANNOTATION, gang_annotation(request, k, len(uids), least)),)
            out.append(Finalize(view.ref, add=True if self.finalizer else None, then=publish, annotations=mark))
        out += self._explain_each(uids, "Waiting", f"fairstream: its {group.ref} is submitted as one gang of "
                                                   f"{len(uids)} pods, {least} of which start together")
        first = self.pods[uids[0]]
        out += [Explain(first.ref, "InvalidEstimate", warning, warning=True, condition=False)
                for warning in made.warnings]
        return out

    def _unsupported(self, views: list[PodView], why: str) -> list[Action]:
        """``Unsupported`` with ``why`` on each of ``views`` not told so already, each counted once."""
        out: list[Action] = []
        for view in views:
            if self.explained.get(view.ref.uid, ("",))[0] != "Unsupported":
                self.counts.untranslatable += 1
                out += self._explain(view, "Unsupported", f"fairstream cannot schedule this pod: {why}", warning=True)
        return out

    def _explain_each(self, uids: list[str], reason: str, message: str) -> list[Action]:
        out: list[Action] = []
        for uid in uids:
            out += self._explain(self.pods[uid], reason, message)
        return out

    def podgroup_seen(self, podgroup: Mapping[str, Any], time: float) -> list[Action]:
        """A PodGroup listed, added or modified: its size (``minCount``; the basic policy: one
        by one) for its pods to come; those gathered may go now."""
        meta = podgroup["metadata"]
        group = self._group(GroupRef(meta["namespace"], meta["name"], kueue=False))
        least = podgroup_min(podgroup)
        group.podgroup, group.basic, group.size = True, least is None, least
        return self._try_group(group, time)

    def podgroup_gone(self, podgroup: Mapping[str, Any], time: float) -> list[Action]:
        """A PodGroup deleted: pods of it not yet submitted wait for it again."""
        meta = podgroup["metadata"]
        key = GroupRef(meta["namespace"], meta["name"], kueue=False).key
        group = self.groups.get(key)
        if group is None:
            return []
        group.podgroup, group.basic, group.size = False, False, None
        if not group.members:
            del self.groups[key]
            return []
        return self._try_group(group, time)

    def podgroups_listed(self, podgroups: list[Mapping[str, Any]], time: float) -> list[Action]:
        present = {GroupRef(p["metadata"]["namespace"], p["metadata"]["name"], kueue=False).key for p in podgroups}
        out: list[Action] = []
        for group in [g for g in self.groups.values() if g.podgroup and g.ref.key not in present]:
            out += self.podgroup_gone({"metadata": {"namespace": group.ref.namespace, "name": group.ref.name}}, time)
        for podgroup in podgroups:
            out += self.podgroup_seen(podgroup, time)
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
        tasks = decision.get("tasks") or [decision.get("task")]
        if kind == "unschedulable" and decision.get("task") in self.requests:  # (a gang's request: each pod)
            tasks = [self.pods[uid].task for uid in self.requests[decision["task"]] if uid in self.pods]
        for task in tasks:
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
        return self._bind(view, node, str(decision.get("id")), time)

    def _bind(self, view: PodView, node: str, ident: str, time: float) -> list[Action]:
        self._occupy(view, node)  # assumed now: the next placement there sees its room taken
        self.counts.bound += 1
        self.explained.pop(view.ref.uid, None)
        out: list[Action] = [Bind(view.ref, node, ident)]
        if view.group is not None:
            group = self.groups[view.group]
            group.pods.pop(view.ref.uid, None)
            if view.request is not None:  # its gang started: the rest of it are tasks as any
                for uid in self.requests.pop(view.request, ()):
                    if uid in self.pods:
                        self.pods[uid].request = None
                out += self._try_group(group, time)  # (pods that came after it may go now)
        return out

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
            out += self._bind(view, node, str(first.decision.get("id")), time)
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
                uids = self.requests.get(entry.get("id") or "", [])  # (a gang's request: each of its pods)
            else:
                uids = [self.by_task.get(entry.get("first") or entry.get("id") or "", "")]
            for uid in uids:
                view = self.pods.get(uid)
                if view is None or view.node is not None or view.ended or not view.submitted:
                    continue
                if self.explained.get(uid, ("", ""))[0] in ("WaitingForRoom", "Unsupported"):
                    continue
                reason = "Unschedulable" if entry.get("reason") == "unschedulable" else "Waiting"
                out += self._explain(view, reason, f"fairstream: {entry.get('message') or entry.get('reason')}")
        return out
