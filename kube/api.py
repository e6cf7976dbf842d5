"""The calls the connector makes to a Kubernetes API server, through lightkube.

Why lightkube (docs/kubernetes.md, "The client library"): it is asynchronous on the same event
loop as aiokafka, typed, small, reads kubeconfig and in-cluster configuration alike, and has the
pod's ``binding`` and ``eviction`` subresources and server-side apply with a dry run. The
official ``kubernetes`` client is synchronous (a thread per watch), and it and its asynchronous
port ``kubernetes_asyncio`` fail while reading a Binding's reply (a ``Status``) although the
Binding was made; ``kr8s`` is asynchronous too but untyped, and adds a layer we do not need.

Every call here is one request; what to do when it fails is said by what it returns:
``BindResult``, ``EvictResult``. A connection that fails (the API server away) raises
``Unreachable``, which the connector waits out.
"""

from __future__ import annotations

import enum
import time as wall
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import httpx2
import msgspec
from lightkube import ALL_NS, ApiError, AsyncClient, KubeConfig
from lightkube.models.core_v1 import EventSource, ObjectReference
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Event, Node, Pod
from lightkube.resources.scheduling_v1beta1 import PodGroup
from lightkube.types import PatchType

from fairstream.kube.mirror import PodRef
from fairstream.kube.translate import FINALIZER

COMPONENT = "fairstream"


class Unreachable(Exception):
    """The API server did not answer (refused, reset, timed out)."""


class BindResult(enum.Enum):
    BOUND = "bound"
    ALREADY_BOUND = "already_bound"  # to the same node: done
    BOUND_ELSEWHERE = "bound_elsewhere"
    GONE = "gone"


class EvictResult(enum.Enum):
    EVICTED = "evicted"
    REFUSED = "refused"  # a PodDisruptionBudget allows no disruption now (429)
    GONE = "gone"


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def client_config(kubeconfig: str | None) -> KubeConfig:
    """A kubeconfig file's, else the in-cluster ServiceAccount's, else ``$KUBECONFIG`` or
    ``~/.kube/config``."""
    if kubeconfig:
        return KubeConfig.from_file(kubeconfig)
    return KubeConfig.from_env()


class KubeApi:
    """The API server, as the connector uses it."""

    def __init__(self, kubeconfig: str | None = None, context: str | None = None, timeout: float = 30.0,
                 node_selector: dict[str, str] | None = None) -> None:
        self.node_selector = node_selector or None
        config: Any = client_config(kubeconfig)  # (a KubeConfig, or one of its contexts)
        if context:
            chosen = config.get(context)
            if chosen is None:
                raise ValueError(f"--context {context}: not a context of the kubeconfig")
            config = chosen
        self.client = AsyncClient(config=config, timeout=httpx2.Timeout(timeout), field_manager=COMPONENT)

    async def close(self) -> None:
        await self.client.close()

    async def _call(self, call):
        try:
            return await call
        except ApiError:
            raise
        except (httpx2.TransportError, OSError) as exc:
            raise Unreachable(f"{type(exc).__name__}: {exc}") from exc

    async def list_nodes(self) -> tuple[list[dict[str, Any]], str]:
        """Every node, and the list's resourceVersion to watch from."""
        return await self._list(Node, None, self.node_selector)

    async def list_pods(self) -> tuple[list[dict[str, Any]], str]:
        return await self._list(Pod, ALL_NS)

    async def list_podgroups(self) -> tuple[list[dict[str, Any]], str] | None:
        """Every PodGroup (``scheduling.k8s.io/v1beta1``), or None if the API server does not
        serve them (the ``GenericWorkload`` feature gate off: then no pod names one either)."""
        try:
            return await self._list(PodGroup, ALL_NS)
        except ApiError as exc:
            if exc.status.code == 404:
                return None
            raise

    async def _list(self, kind, namespace, labels=None) -> tuple[list[dict[str, Any]], str]:
        async def listed():
            found = self.client.list(kind, namespace=namespace, chunk_size=500) if namespace is not None \
                else self.client.list(kind, chunk_size=500, labels=labels)
            items = [item.to_dict() async for item in found]
            return items, found.resourceVersion

        return await self._call(listed())

    async def watch(self, kind: str, resource_version: str) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """``(ADDED|MODIFIED|DELETED, object)`` from ``resource_version`` on, until the watch ends
        or fails (``ApiError`` 410 when that version is too old: list again)."""
        res: Any = {"node": Node, "pod": Pod, "podgroup": PodGroup}[kind]
        kwargs: dict[str, Any] = {"labels": self.node_selector} if kind == "node" else {"namespace": ALL_NS}
        try:
            async for event, obj in self.client.watch(res, resource_version=resource_version, **kwargs):
                yield event, obj.to_dict()
        except ApiError:
            raise
        except (httpx2.TransportError, OSError) as exc:
            raise Unreachable(f"{type(exc).__name__}: {exc}") from exc

    async def bind(self, pod: PodRef, node: str) -> BindResult:
        """A Binding of ``pod`` to ``node``. Made twice (a retry after a lost reply, a restart),
        the second finds it bound and says whether to the same node."""
        binding = Pod.Binding(metadata=ObjectMeta(name=pod.name, namespace=pod.namespace, uid=pod.uid),
                              target=ObjectReference(apiVersion="v1", kind="Node", name=node))
        try:
            await self._call(self.client.create(binding, name=pod.name, namespace=pod.namespace))
            return BindResult.BOUND
        except msgspec.ValidationError:
            # The API server answers a Binding with a Status, which the client then fails to
            # read as a Binding: the answer was a success (errors are raised before reading).
            return BindResult.BOUND
        except ApiError as exc:
            code = exc.status.code
            if code == 404:
                return BindResult.GONE
            if code == 409:  # already bound (to which node?), or a uid precondition failed
                try:
                    now = await self._call(self.client.get(Pod, pod.name, namespace=pod.namespace))
                except ApiError as again:
                    if again.status.code == 404:
                        return BindResult.GONE
                    raise
                if now.metadata.uid != pod.uid:
                    return BindResult.GONE
                if now.spec.nodeName == node:
                    return BindResult.ALREADY_BOUND
                return BindResult.BOUND_ELSEWHERE if now.spec.nodeName else BindResult.GONE
            raise

    async def finalizer(self, pod: PodRef, add: bool | None, annotations: dict[str, str] | None = None) -> bool:
        """Puts our finalizer on the pod (``add``), or takes it off (``add`` False), and writes
        ``annotations``, in one call; False if the pod is gone (or is another of the same name)."""
        meta: dict[str, Any] = {"uid": pod.uid}
        if add:
            meta["finalizers"] = [FINALIZER]
        elif add is not None:
            meta["$deleteFromPrimitiveList/finalizers"] = [FINALIZER]
        if annotations:
            meta["annotations"] = dict(annotations)
        try:
            await self._call(self.client.patch(Pod, pod.name, {"metadata": meta}, namespace=pod.namespace,
                                               patch_type=PatchType.STRATEGIC))
            return True
        except ApiError as exc:
            if exc.status.code in (404, 409, 422):  # gone; or a new pod of that name (its uid differs)
                return False
            raise

    async def evict(self, pod: PodRef) -> EvictResult:
        eviction = Pod.Eviction(metadata=ObjectMeta(name=pod.name, namespace=pod.namespace))
        try:
            await self._call(self.client.create(eviction, name=pod.name, namespace=pod.namespace))
            return EvictResult.EVICTED
        except ApiError as exc:
            if exc.status.code == 404:
                return EvictResult.GONE
            if exc.status.code == 429:
                return EvictResult.REFUSED
            raise

    async def delete(self, pod: PodRef) -> bool:
        """Deletes the pod at once (grace 0: its node is gone, nothing there will stop it)."""
        try:
            await self._call(self.client.delete(Pod, pod.name, namespace=pod.namespace, grace_period=0))
            return True
        except ApiError as exc:
            if exc.status.code == 404:
                return False
            raise

    async def explain(self, pod: PodRef, reason: str, message: str, warning: bool, condition: bool = True) -> None:
        """The pod's ``PodScheduled`` condition (False with ``reason`` and ``message``, if
        ``condition``) and an Event, as kube-scheduler does: ``kubectl describe pod`` shows both."""
        if condition:
            patch = {"status": {"conditions": [{"type": "PodScheduled", "status": "False", "reason": reason,
                                                "message": message, "lastTransitionTime": _now()}]}}
            try:
                await self._call(self.client.patch(Pod.Status, pod.name, patch, namespace=pod.namespace,
                                                   patch_type=PatchType.STRATEGIC))
            except ApiError as exc:
                if exc.status.code == 404:
                    return
                raise
        await self.event(pod, reason, message, warning)

    async def event(self, pod: PodRef, reason: str, message: str, warning: bool) -> None:
        now = _now()
        event = Event(
            metadata=ObjectMeta(name=f"{pod.name}.{wall.time_ns():x}", namespace=pod.namespace),
            involvedObject=ObjectReference(apiVersion="v1", kind="Pod", name=pod.name, namespace=pod.namespace,
                                           uid=pod.uid),
            reason=reason, message=message[:1024], type="Warning" if warning else "Normal",
            source=EventSource(component=COMPONENT), reportingComponent=COMPONENT, reportingInstance=COMPONENT,
            firstTimestamp=now, lastTimestamp=now, count=1)  # type: ignore[arg-type]  # (sent as written: RFC 3339)
        try:
            await self._call(self.client.create(event, namespace=pod.namespace))  # type: ignore[call-overload]
        except ApiError as exc:
            if exc.status.code not in (404, 409):  # (its namespace being deleted; a same-named one)
                raise

