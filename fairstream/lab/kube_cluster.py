"""A real Kubernetes control plane for the connector's tests and ``fairstream bench kubernetes``:
``scripts/kube.sh`` starts etcd, kube-apiserver and kwok (built from source, cached outside the
checkout), and ``Cluster`` makes nodes and pods on it as a user would, through lightkube.

kwok plays the kubelets: a node labelled ``type=kwok`` is Ready at once, a bound pod Running at
once, and a pod with ``run_seconds`` (kwok's annotation ``pod-complete.stage.kwok.x-k8s.io/delay``)
Succeeded that long after it started.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
KUBE_SH = ROOT / "scripts" / "kube.sh"
RUN_TIME_ANNOTATION = "pod-complete.stage.kwok.x-k8s.io/delay"


@dataclass(frozen=True)
class ControlPlane:
    admin_kubeconfig: Path
    connector_kubeconfig: Path  # the ServiceAccount fairstream/fairstream-connector's token
    bin: Path  # etcd, kube-apiserver, kube-scheduler, kubectl, kwok

    def tool(self, name: str) -> str:
        return str(self.bin / name)


def start_control_plane() -> ControlPlane:
    """Builds (the first time, about 7.5 minutes) and starts the control plane, or finds it up."""
    if not KUBE_SH.is_file():
        raise RuntimeError("the control plane comes with a fairstream checkout (scripts/kube.sh)")
    done = subprocess.run(["bash", str(KUBE_SH), "start"], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"scripts/kube.sh start failed: {done.stderr[-2000:]}")
    state = ROOT / ".services" / "kube"
    return ControlPlane(state / "admin.kubeconfig", state / "connector.kubeconfig",
                        Path((state / "bin.path").read_text().strip()))


def wait_until(condition: Callable[[], Any], timeout: float, what: str, every: float = 0.2) -> Any:
    """``condition()``'s first true value, polled until ``timeout`` seconds pass (then fails,
    saying ``what`` it waited for)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout} s for {what}")
        time.sleep(every)


class Cluster:
    """Nodes and pods on the control plane, made and read as a user would (admin rights)."""

    def __init__(self, plane: ControlPlane) -> None:
        from lightkube import Client, KubeConfig

        self.plane = plane
        self.client = Client(config=KubeConfig.from_file(plane.admin_kubeconfig), field_manager="fairstream-tests")

    def apply_file(self, path: Path, dry_run: bool = False) -> list[Any]:
        """Server-side apply of every object in a YAML file (``kubectl apply --server-side``),
        or its dry run: the API server validates and admits each as if applied, changing nothing."""
        from lightkube import codecs

        applied = []
        for obj in codecs.load_all_yaml(path.read_text()):
            applied.append(self.client.apply(obj, field_manager="fairstream-tests", force=True, dry_run=dry_run))
        return applied

    def make_nodes(self, names: list[str], cpu: str = "4", memory: str = "8Gi",
                   labels: dict[str, str] | None = None, extra: dict[str, str] | None = None) -> list[str]:
        from lightkube.resources.core_v1 import Node

        allocatable = {"cpu": cpu, "memory": memory, "pods": "110", **(extra or {})}
        for name in names:
            self.client.create(Node.from_dict({  # type: ignore[call-overload]  # (lightkube's from_dict is typed as returning its base class)
                "metadata": {"name": name, "labels": {"type": "kwok", **(labels or {})},
                             "annotations": {"kwok.x-k8s.io/node": "fake"}},
                "status": {"allocatable": allocatable, "capacity": allocatable}}))
        return names

    def delete_nodes(self, names: list[str]) -> None:
        from lightkube import ApiError
        from lightkube.resources.core_v1 import Node

        for name in names:
            try:
                self.client.delete(Node, name)
            except ApiError as exc:
                if exc.status.code != 404:
                    raise

    def make_namespace(self, name: str) -> str:
        from lightkube.resources.core_v1 import Namespace

        self.client.create(Namespace.from_dict({"metadata": {"name": name}}))  # type: ignore[call-overload]  # (lightkube's from_dict is typed as returning its base class)
        return name

    def delete_namespace(self, name: str) -> None:
        """Its pods first, at once (no kubelet of a deleted node would ever confirm them)."""
        from lightkube import ApiError
        from lightkube.resources.core_v1 import Namespace, Pod
        from lightkube.types import PatchType

        for pod in self.client.list(Pod, namespace=name):
            meta = pod.metadata
            if meta is None or meta.name is None:
                continue
            try:
                if meta.finalizers:  # (the connector's, with no connector left to take it off)
                    self.client.patch(Pod, meta.name, {"metadata": {"finalizers": None}}, namespace=name,
                                      patch_type=PatchType.MERGE)
                self.client.delete(Pod, meta.name, namespace=name, grace_period=0)
            except ApiError:
                pass
        try:
            self.client.delete(Namespace, name)
        except ApiError:
            pass

    def make_pod(self, namespace: str, name: str, scheduler: str, cpu: str = "1", memory: str | None = None,
                 run_seconds: float | None = None, labels: dict[str, str] | None = None,
                 annotations: dict[str, str] | None = None, node_selector: dict[str, str] | None = None,
                 extra: dict[str, str] | None = None, pod_group: str | None = None) -> dict[str, Any]:
        """A pod of one container requesting ``cpu``, ``memory`` and ``extra`` (``{"nvidia.com/gpu": "1"}``);
        of PodGroup ``pod_group`` if given."""
        from lightkube.resources.core_v1 import Pod

        return self.client.create(Pod.from_dict(pod_manifest(namespace, name, scheduler, cpu, memory, run_seconds,  # type: ignore[call-overload]  # (lightkube's from_dict is typed as returning its base class)
                                                             labels, annotations, node_selector, extra,
                                                             pod_group))).to_dict()

    def make_podgroup(self, namespace: str, name: str, min_count: int | None) -> None:
        """A PodGroup (``scheduling.k8s.io/v1beta1``): the gang policy with ``min_count``, or the
        basic policy (None)."""
        from lightkube.resources.scheduling_v1beta1 import PodGroup

        policy = {"basic": {}} if min_count is None else {"gang": {"minCount": min_count}}
        self.client.create(PodGroup.from_dict({"metadata": {"name": name, "namespace": namespace},  # type: ignore[call-overload]  # (lightkube's from_dict is typed as returning its base class)
                                               "spec": {"schedulingPolicy": policy}}))

    def pods(self, namespace: str) -> list[dict[str, Any]]:
        from lightkube.resources.core_v1 import Pod

        return [pod.to_dict() for pod in self.client.list(Pod, namespace=namespace)]

    def pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        from lightkube import ApiError
        from lightkube.resources.core_v1 import Pod

        try:
            return self.client.get(Pod, name, namespace=namespace).to_dict()
        except ApiError as exc:
            if exc.status.code == 404:
                return None
            raise

    def events(self, namespace: str, pod: str) -> list[dict[str, Any]]:
        from lightkube.resources.core_v1 import Event

        return [e.to_dict() for e in self.client.list(Event, namespace=namespace,
                                                      fields={"involvedObject.name": pod})]


def pod_manifest(namespace: str, name: str, scheduler: str, cpu: str = "1", memory: str | None = None,
                 run_seconds: float | None = None, labels: dict[str, str] | None = None,
                 annotations: dict[str, str] | None = None, node_selector: dict[str, str] | None = None,
                 extra: dict[str, str] | None = None, pod_group: str | None = None) -> dict[str, Any]:
    requests = {"cpu": cpu, **({"memory": memory} if memory else {}), **(extra or {})}
    notes = dict(annotations or {})
    if run_seconds is not None:
        notes[RUN_TIME_ANNOTATION] = f"{run_seconds}s"
    spec: dict[str, Any] = {"schedulerName": scheduler, "terminationGracePeriodSeconds": 0,
                            "containers": [{"name": "work", "image": "registry.k8s.io/pause:3.10",
                                            "resources": {"requests": requests,
                                                          # (extended resources are not overcommitted:
                                                          # their limit is their request)
                                                          "limits": dict(extra or {})}}]}
    if node_selector:
        spec["nodeSelector"] = node_selector
    if pod_group:
        spec["schedulingGroup"] = {"podGroupName": pod_group}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": labels or {}, "annotations": notes},
            "spec": spec}


def bound_node(pod: dict[str, Any]) -> str | None:
    return (pod.get("spec") or {}).get("nodeName")


def phase(pod: dict[str, Any] | None) -> str | None:
    return None if pod is None else (pod.get("status") or {}).get("phase")


def scheduled_condition(pod: dict[str, Any]) -> dict[str, Any] | None:
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled":
            return condition
    return None
