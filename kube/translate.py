"""Kubernetes objects to fairstream's wire events: pure functions over the API's JSON.

Everything here reads plain dicts as the API server sends them (a pod, a node) and returns the
wire messages of ``fairstream/wire/events.py`` or a reason it cannot; no client, clock or I/O.

- Quantities (``"500m"``, ``"1.5Gi"``, ``"2e3"``) are read exactly as ``Fraction``s
  (``parse_quantity``), then converted to the worker's units: ``cpu`` in cores, ``memory`` as
  ``mem`` in MiB (both exact for any whole number of millicores or bytes up to 2^53), any other
  resource (``nvidia.com/gpu``) in its own unit.
- A pod's demand is Kubernetes' own rule (``k8s.io/component-helpers/resource.PodRequests``):
  the containers' requests summed, with restartable init containers (sidecars) added; at least
  each ordinary init container's request plus the sidecars started before it; plus the pod's
  ``overhead``.
- Its tenant is its queue label (Kueue's ``kueue.x-k8s.io/queue-name``, configurable), else its
  namespace; its job the ``fairstream.dev/job`` label, else a JobSet's name label, else its
  controller (``Job``, ``ReplicaSet``, ...), else the pod itself.
- ``nodeSelector`` and required node affinity of one term of ``In`` expressions become
  ``constraints.labels`` (a list of values: one of them); ``metadata.name`` ``In`` in
  ``matchFields`` becomes ``constraints.nodes``. Anything else cannot be expressed: the pod is
  not submitted, and says why.
- A pod of a group that starts whole (``group_of``: Kubernetes' PodGroup named by
  ``spec.schedulingGroup.podGroupName``, or Kueue's ``kueue.x-k8s.io/pod-group-name`` label)
  is a task of its gang's request (``gang_submission``): pods of one shape, one tenant.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"  # Kueue's: a pod's LocalQueue
JOB_LABEL = "fairstream.dev/job"
JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"
ESTIMATE_ANNOTATION = "fairstream.dev/estimate"  # expected run time: seconds, or "90s", "1h30m"
DEFAULT_SCHEDULER = "fairstream"
# Pod groups that start whole: Kubernetes' PodGroup (scheduling.k8s.io/v1beta1, behind the
# GenericWorkload feature gate), which pods name in spec.schedulingGroup.podGroupName; and
# Kueue's plain pod groups, a label naming the group and an annotation its size.
KUEUE_GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
KUEUE_GROUP_SIZE = "kueue.x-k8s.io/pod-group-total-count"
# On each pod of a gang's request, with our finalizer: which task of which request it is (so a
# connector that restarts knows them again).
GANG_ANNOTATION = "fairstream.dev/gang"
# On every pod of ours until its completion is sent: a pod deleted while the connector is down
# stays (Terminating) until the connector is back to say so (Kueue's pod integration does the same).
FINALIZER = "fairstream.dev/completion"

# Kubernetes resource name -> the worker's; and the factor from the API's base unit.
WORKER_NAME = {"memory": "mem"}
MIB = Fraction(1, 2**20)

_QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?\d+)?$")
_SUFFIX = {
    None: Fraction(1), "n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000),
    "k": Fraction(10**3), "M": Fraction(10**6), "G": Fraction(10**9), "T": Fraction(10**12),
    "P": Fraction(10**15), "E": Fraction(10**18),
    "Ki": Fraction(2**10), "Mi": Fraction(2**20), "Gi": Fraction(2**30), "Ti": Fraction(2**40),
    "Pi": Fraction(2**50), "Ei": Fraction(2**60),
}


class Untranslatable(ValueError):
    """A pod or node fairstream cannot schedule as it is; the message says why, for the pod."""


def parse_quantity(text: Any) -> Fraction:
    """A Kubernetes quantity (``resource.Quantity``'s text: ``"100m"``, ``"1.5Gi"``, ``"1e3"``,
    ``"2"``) exactly. Raises ``Untranslatable`` for anything else."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return Fraction(text)
    if not isinstance(text, str):
        raise Untranslatable(f"quantity {text!r}: not a quantity")
    match = _QUANTITY.match(text.strip())
    if match is None:
        raise Untranslatable(f"quantity {text!r}: not a quantity")
    number, suffix = Fraction(match.group(1)), match.group(2)
    if suffix is not None and len(suffix) > 1 and suffix[0] in "eE":  # (a lone "E" is exa)
        exponent = int(suffix[1:])
        if abs(exponent) > 30:  # (beyond any resource; and 10**huge would take forever)
            raise Untranslatable(f"quantity {text!r}: out of range")
        return number * Fraction(10) ** exponent
    return number * _SUFFIX[suffix]


def worker_amount(name: str, amount: Fraction) -> float:
    """``amount`` of Kubernetes resource ``name`` in the worker's unit: cores for ``cpu``, MiB
    for ``memory``, the resource's own unit otherwise."""
    return float(amount * MIB) if name == "memory" else float(amount)


def worker_resource(name: str) -> str:
    return WORKER_NAME.get(name, name)


def _requests(container: Mapping[str, Any]) -> dict[str, Fraction]:
    requests = ((container.get("resources") or {}).get("requests")) or {}
    return {name: parse_quantity(value) for name, value in requests.items()}


def _add(total: dict[str, Fraction], more: Mapping[str, Fraction]) -> None:
    for name, amount in more.items():
        total[name] = total.get(name, Fraction(0)) + amount


def pod_requests(spec: Mapping[str, Any]) -> dict[str, Fraction]:
    """A pod's requests by Kubernetes' rule, in the API's base units (cores, bytes)."""
    total: dict[str, Fraction] = {}
    for container in spec.get("containers") or []:
        _add(total, _requests(container))
    sidecars: dict[str, Fraction] = {}
    init_peak: dict[str, Fraction] = {}
    for container in spec.get("initContainers") or []:
        own = _requests(container)
        if container.get("restartPolicy") == "Always":  # a sidecar: runs beside what follows
            _add(sidecars, own)
            during = dict(sidecars)
        else:
            during = dict(sidecars)
            _add(during, own)
        for name, amount in during.items():
            init_peak[name] = max(init_peak.get(name, Fraction(0)), amount)
    _add(total, sidecars)
    for name, amount in init_peak.items():
        total[name] = max(total.get(name, Fraction(0)), amount)
    _add(total, {name: parse_quantity(value) for name, value in (spec.get("overhead") or {}).items()})
    return total


def demand_of(spec: Mapping[str, Any], resources: tuple[str, ...]) -> dict[str, float]:
    """The pod's demand in the worker's resources and units. A request of an extended resource
    (a name with a domain, ``nvidia.com/gpu``) the worker does not schedule raises
    ``Untranslatable``; other requests it does not schedule (``ephemeral-storage``, ``pods``,
    ``hugepages-*``) are left out, as the worker cannot count them."""
    demand = {name: 0.0 for name in resources}
    for name, amount in pod_requests(spec).items():
        ours = worker_resource(name)
        if ours in demand:
            demand[ours] = worker_amount(name, amount)
        elif "/" in name and amount > 0:
            raise Untranslatable(f"requests {name}, which this scheduler does not schedule "
                                 f"(its resources: {', '.join(resources)})")
    return demand


def capacity_of(node: Mapping[str, Any], resources: tuple[str, ...]) -> dict[str, float]:
    """A node's allocatable in the worker's resources and units (0 for what it lacks)."""
    allocatable = ((node.get("status") or {}).get("allocatable")) or {}
    capacity = {name: 0.0 for name in resources}
    for name, value in allocatable.items():
        ours = worker_resource(name)
        if ours in capacity:
            capacity[ours] = worker_amount(name, parse_quantity(value))
    return capacity


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(h|ms|m|s)")


def parse_estimate(text: Any) -> float:
    """A run-time estimate: seconds (``"90"``, ``"1.5"``) or a duration (``"90s"``, ``"1h30m"``)."""
    if not isinstance(text, str) or not text.strip():
        raise Untranslatable(f"{ESTIMATE_ANNOTATION}={text!r}: not a duration")
    text = text.strip()
    try:
        seconds = float(text)
    except ValueError:
        parts = _DURATION.findall(text)
        if not parts or "".join(number + unit for number, unit in parts) != text:
            raise Untranslatable(f"{ESTIMATE_ANNOTATION}={text!r}: not a duration (seconds, or e.g. 90s, 1h30m)") from None
        seconds = sum(float(number) * {"h": 3600, "m": 60, "s": 1, "ms": 0.001}[unit] for number, unit in parts)
    if not 0 <= seconds < 1e15:
        raise Untranslatable(f"{ESTIMATE_ANNOTATION}={text!r}: not a duration")
    return seconds


def constraints_of(spec: Mapping[str, Any]) -> dict[str, Any] | None:
    """``nodeSelector`` and required node affinity as wire ``constraints`` (None: none)."""
    labels: dict[str, Any] = dict(spec.get("nodeSelector") or {})
    nodes: list[str] | None = None
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution")) or {}
    terms = required.get("nodeSelectorTerms") or []
    if len(terms) > 1:
        raise Untranslatable("required node affinity with several nodeSelectorTerms (any of them) "
                             "cannot be expressed: give one term")
    for term in terms:
        for expression in term.get("matchExpressions") or []:
            key, operator, values = expression.get("key"), expression.get("operator"), expression.get("values") or []
            if operator != "In" or not values:
                raise Untranslatable(f"required node affinity {key} {operator}: only In is supported")
            wanted = set(values)
            if key in labels:  # nodeSelector and affinity both: the node must match both
                have = set(labels[key]) if isinstance(labels[key], list) else {labels[key]}
                wanted &= have
                if not wanted:
                    raise Untranslatable(f"nodeSelector and node affinity on {key} exclude each other")
            labels[key] = sorted(wanted) if len(wanted) > 1 else next(iter(wanted))
        for expression in term.get("matchFields") or []:
            if expression.get("key") != "metadata.name" or expression.get("operator") != "In":
                raise Untranslatable(f"required node affinity on field {expression.get('key')} "
                                     f"{expression.get('operator')}: only metadata.name In is supported")
            names = set(expression.get("values") or [])
            nodes = sorted(names if nodes is None else names & set(nodes))
    out: dict[str, Any] = {}
    if labels:
        out["labels"] = labels
    if nodes is not None:
        out["nodes"] = nodes
    return out or None


def task_id(pod: Mapping[str, Any]) -> str:
    """The pod's task id: ``namespace/name/uid-prefix``. The uid's first 8 digits keep a pod made
    again under the same name (a StatefulSet's) from being taken for the finished one."""
    meta = pod["metadata"]
    return f"{meta['namespace']}/{meta['name']}/{meta['uid'][:8]}"


def tenant_of(pod: Mapping[str, Any], queue_label: str = QUEUE_LABEL) -> str:
    meta = pod["metadata"]
    return (meta.get("labels") or {}).get(queue_label) or meta["namespace"]


def job_of(pod: Mapping[str, Any]) -> str:
    meta = pod["metadata"]
    labels = meta.get("labels") or {}
    if labels.get(JOB_LABEL):
        return f"{meta['namespace']}/{labels[JOB_LABEL]}"
    if labels.get(JOBSET_LABEL):
        return f"{meta['namespace']}/JobSet/{labels[JOBSET_LABEL]}"
    for owner in meta.get("ownerReferences") or []:
        if owner.get("controller"):
            return f"{meta['namespace']}/{owner['kind']}/{owner['name']}"
    return task_id(pod)


@dataclass
class Submission:
    """What a pod becomes: its wire message, and the warnings to post on it (a bad estimate)."""

    message: dict[str, Any]
    warnings: list[str] = field(default_factory=list)


def submission(pod: Mapping[str, Any], cluster: str, time: float, resources: tuple[str, ...],
               queue_label: str = QUEUE_LABEL) -> Submission:
    """A pending pod as a ``tasks.submitted`` message. Raises ``Untranslatable`` when it cannot
    be scheduled as it is (an extended resource not scheduled, an affinity not expressible)."""
    spec = pod.get("spec") or {}
    message: dict[str, Any] = {"cluster": cluster, "task": task_id(pod), "job": job_of(pod),
                               "tenant": tenant_of(pod, queue_label), "demand": demand_of(spec, resources),
                               "time": time}
    if not any(message["demand"].values()):
        # The worker needs some demand; kube-scheduler too counts a pod without requests as
        # asking for little (for its scores): the least we can express, a millicore.
        message["demand"]["cpu" if "cpu" in resources else resources[0]] = 0.001
    constraints = constraints_of(spec)
    if constraints:
        message["constraints"] = constraints
    warnings = []
    estimate = ((pod["metadata"].get("annotations")) or {}).get(ESTIMATE_ANNOTATION)
    if estimate is not None:
        try:
            message["estimate"] = parse_estimate(estimate)
        except Untranslatable as exc:
            warnings.append(f"{exc}: ignored, the pod is scheduled without an estimate")
    return Submission(message, warnings)


def node_ready(node: Mapping[str, Any]) -> bool:
    for condition in ((node.get("status") or {}).get("conditions")) or []:
        if condition.get("type") == "Ready":
            return condition.get("status") == "True"
    return False


def node_open(node: Mapping[str, Any]) -> bool:
    """Whether new pods may go to the node: Ready, not cordoned, and without a ``NoSchedule`` or
    ``NoExecute`` taint (the worker cannot weigh tolerations, so no pod of ours goes to a
    tainted node: a control-plane node, one being drained)."""
    spec = node.get("spec") or {}
    if spec.get("unschedulable", False) or not node_ready(node):
        return False
    return not any(taint.get("effect") in ("NoSchedule", "NoExecute") for taint in spec.get("taints") or [])


def pod_terminal(pod: Mapping[str, Any]) -> bool:
    return ((pod.get("status") or {}).get("phase")) in ("Succeeded", "Failed")


# ---------------------------------------------------------------------- pod groups


@dataclass(frozen=True)
class GroupRef:
    """The group a pod belongs to: a PodGroup object (``kueue`` False) or a Kueue pod group
    (a label; its size on each pod)."""

    namespace: str
    name: str
    kueue: bool

    @property
    def key(self) -> str:
        return f"{self.namespace}/{'pod-group' if self.kueue else 'PodGroup'}/{self.name}"

    def __str__(self) -> str:
        return f"{'Kueue pod group' if self.kueue else 'PodGroup'} {self.name}"


def group_of(pod: Mapping[str, Any]) -> GroupRef | None:
    """The pod's group: its ``spec.schedulingGroup.podGroupName``, else its Kueue pod-group
    label; None if it has neither."""
    meta = pod["metadata"]
    name = (((pod.get("spec") or {}).get("schedulingGroup")) or {}).get("podGroupName")
    if name:
        return GroupRef(meta["namespace"], str(name), kueue=False)
    label = (meta.get("labels") or {}).get(KUEUE_GROUP_LABEL)
    return GroupRef(meta["namespace"], str(label), kueue=True) if label else None


def kueue_group_size(pod: Mapping[str, Any]) -> int:
    """A Kueue pod group's size, from the pod's ``kueue.x-k8s.io/pod-group-total-count``: all
    of them start together. Raises ``Untranslatable`` when it is missing or not a count."""
    text = ((pod["metadata"].get("annotations")) or {}).get(KUEUE_GROUP_SIZE)
    try:
        size = int(str(text).strip())
    except ValueError:
        size = 0
    if size < 1:
        raise Untranslatable(f"{KUEUE_GROUP_LABEL} without a {KUEUE_GROUP_SIZE} annotation of 1 or more "
                             f"(got {text!r})")
    return size


def podgroup_min(podgroup: Mapping[str, Any]) -> int | None:
    """How many pods of a PodGroup must start together: its gang policy's ``minCount``; None for
    the basic policy (its pods start one by one)."""
    gang = (((podgroup.get("spec") or {}).get("schedulingPolicy")) or {}).get("gang")
    if gang is None:
        return None
    count = gang.get("minCount")
    return count if isinstance(count, int) and not isinstance(count, bool) and count >= 1 else 1


def gang_request_id(group: GroupRef, uids: Sequence[str]) -> str:
    """The request id of a gang made of the pods ``uids`` of ``group``:
    ``namespace/name:gang/<8 hex digits of the pods' uids>``; another set of pods (one gone,
    one come) makes another id. No pod's task id has a colon."""
    digest = hashlib.sha256("\n".join(sorted(uids)).encode()).hexdigest()[:8]
    return f"{group.namespace}/{group.name}:gang/{digest}"


def gang_submission(pods: Sequence[Mapping[str, Any]], group: GroupRef, request: str, least: int, cluster: str,
                    time: float, resources: tuple[str, ...], queue_label: str = QUEUE_LABEL) -> Submission:
    """The pods of ``group`` as one ``tasks.submitted`` request ``request`` of ``len(pods)``
    tasks, ``least`` of which must start together (``gang.min``; the request's task ``k`` is
    ``pods[k]``). The engine's gang is tasks of one shape: pods of different demand,
    constraints or queue raise ``Untranslatable``. The job is the pods' one, else the group;
    the estimate the longest of theirs."""
    made = [submission(pod, cluster, time, resources, queue_label) for pod in pods]
    first = made[0].message
    for field_name, what in (("demand", "resources"), ("constraints", "nodes"), ("tenant", "queues")):
        if any(m.message.get(field_name) != first.get(field_name) for m in made[1:]):
            raise Untranslatable(f"the pods of {group} ask for different {what}: fairstream starts a group whole "
                                 f"only if its pods are alike")
    message = {key: value for key, value in first.items() if key != "estimate"}
    message["task"] = request
    message["count"] = len(pods)
    message["gang"] = {"min": least}
    jobs = {m.message["job"] for m in made}
    message["job"] = first["job"] if len(jobs) == 1 else group.key
    estimates = [m.message["estimate"] for m in made if "estimate" in m.message]
    if estimates:
        message["estimate"] = max(estimates)
    return Submission(message, [w for m in made for w in m.warnings])


def gang_annotation(request: str, index: int, count: int, least: int) -> str:
    """What ``GANG_ANNOTATION`` holds on task ``index`` of a gang's request."""
    return json.dumps({"request": request, "index": index, "count": count, "min": least},
                      separators=(",", ":"), sort_keys=True)


def read_gang_annotation(pod: Mapping[str, Any]) -> tuple[str, int, int, int] | None:
    """``(request, index, count, min)`` from the pod's ``GANG_ANNOTATION``; None if it has none
    or it is not ours to read (written by hand: then the pod is gathered again)."""
    text = ((pod["metadata"].get("annotations")) or {}).get(GANG_ANNOTATION)
    if not text:
        return None
    try:
        doc = json.loads(text)
        request, index, count, least = doc["request"], doc["index"], doc["count"], doc["min"]
    except (ValueError, TypeError, KeyError):
        return None
    if not (isinstance(request, str) and all(isinstance(n, int) and not isinstance(n, bool)
                                             for n in (index, count, least)) and 0 <= index < count and least >= 1):
        return None
    return request, index, count, least
