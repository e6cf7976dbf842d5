"""Small builders of Kubernetes objects as the API server sends them (plain dicts)."""

from __future__ import annotations

import uuid
from typing import Any


def container(name: str = "c", restartPolicy: str | None = None, **requests: str) -> dict[str, Any]:
    made: dict[str, Any] = {"name": name, "image": "registry.k8s.io/pause:3.10"}
    if requests:
        made["resources"] = {"requests": dict(requests)}
    if restartPolicy:
        made["restartPolicy"] = restartPolicy
    return made


def pod(name: str, namespace: str = "default", uid: str | None = None, labels: dict | None = None,
        annotations: dict | None = None, owner: tuple[str, str] | None = None, node_selector: dict | None = None,
        containers: list | None = None, scheduler: str = "fairstream", node: str | None = None,
        phase: str = "Pending", deleting: bool = False, group: str | None = None, **requests: str) -> dict[str, Any]:
    """A pod; ``requests`` (``cpu="1"``) make its one container's requests; ``group``: the
    PodGroup it names (``spec.schedulingGroup.podGroupName``)."""
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": uid or str(uuid.uuid4()),
                            "labels": labels or {}, "annotations": annotations or {}}
    if owner:
        meta["ownerReferences"] = [{"apiVersion": "batch/v1", "kind": owner[0], "name": owner[1], "uid": "x",
                                    "controller": True}]
    if deleting:
        meta["deletionTimestamp"] = "2026-11-29T00:00:00Z"
    spec: dict[str, Any] = {"schedulerName": scheduler,
                            "containers": containers or [container(**(requests or {"cpu": "1"}))]}
    if node_selector:
        spec["nodeSelector"] = node_selector
    if node:
        spec["nodeName"] = node
    if group:
        spec["schedulingGroup"] = {"podGroupName": group}
    return {"metadata": meta, "spec": spec, "status": {"phase": phase}}


def podgroup(name: str, min_count: int | None = None, namespace: str = "default") -> dict[str, Any]:
    """A PodGroup (``scheduling.k8s.io/v1beta1``): the gang policy with ``min_count``, else the
    basic policy."""
    policy = {"basic": {}} if min_count is None else {"gang": {"minCount": min_count}}
    return {"apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup",
            "metadata": {"name": name, "namespace": namespace}, "spec": {"schedulingPolicy": policy}}


def node(name: str, ready: bool = True, unschedulable: bool = False, labels: dict | None = None,
         taints: list | None = None, **allocatable: str) -> dict[str, Any]:
    spec: dict[str, Any] = {"unschedulable": True} if unschedulable else {}
    if taints:
        spec["taints"] = taints
    return {"metadata": {"name": name, "labels": labels or {}},
            "spec": spec,
            "status": {"allocatable": allocatable or {"cpu": "4", "memory": "8Gi"},
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}
