"""``fairstream bench kubernetes``: fairstream (the worker and the connector) beside kube-scheduler
on one real control plane (``scripts/kube.sh``: etcd, kube-apiserver, kwok; kube-scheduler built
from the same ``k8s.io/kubernetes`` module), in one run.

Three phases, each for both schedulers in turn, on the same ``nodes`` kwok nodes (32 cores,
256 GiB, 110 pods each):

- ``burst``: ``pods`` pods of 1 core made as fast as the API server takes them (100 creations in
  flight), all of which fit: pods bound per second (from the first creation to the last
  binding) and the latency from a pod's creation to its binding (p50, p99);
- ``rate``: pods made at ``rate`` a second for ``rate_seconds``: the same latency at an offered
  load;
- ``fairness``: ``fair_pods`` pods of 16 cores from queues a (weight 2) and b (weight 1), made
  alternately while the scheduler is stopped (so all wait at once when it starts), where two fit
  a node: what each queue holds once no more fit, beside its fair share (fairstream's ``drf``
  with the weights; kube-scheduler has no queues: it binds in the order pods came).

Times are the bench's clock: a pod's creation is when its request was sent, its binding when the
bench's own watch saw its ``nodeName``. Between phases every pod is deleted and the next waits
for the API server to have none.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import structlog

from fairstream.core.model import ModelError
from fairstream.lab.kube_cluster import pod_manifest, start_control_plane

log = structlog.get_logger("fairstream.bench")

NODE_CPU, NODE_MEMORY = "32", "256Gi"
# drf with queues a:2, b:1; preemption takes back what a queue got above its fair share while the
# other's pods were still arriving (a backlog is submitted in several messages).
WORKER_ARGS = ("--param", "preemption=on", "--param", "preemption_timeout=10")
PHASES = ("burst", "rate", "fairness")
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


def _percentiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50_ms": None, "p99_ms": None, "max_ms": None}
    array = np.array(values) * 1000
    return {"p50_ms": round(float(np.percentile(array, 50)), 1), "p99_ms": round(float(np.percentile(array, 99)), 1),
            "max_ms": round(float(array.max()), 1)}


class _Watcher:
    """When each pod of a namespace was first seen bound (the bench's clock)."""

    def __init__(self, client, namespace: str) -> None:
        self.client, self.namespace = client, namespace
        self.bound_at: dict[str, float] = {}
        self.task: asyncio.Task | None = None

    async def start(self) -> None:
        from lightkube.resources.core_v1 import Pod

        listed = self.client.list(Pod, namespace=self.namespace)
        async for pod in listed:
            if pod.spec.nodeName:
                self.bound_at.setdefault(pod.metadata.name, time.time())
        version = listed.resourceVersion

        async def watch():
            async for _, pod in self.client.watch(Pod, namespace=self.namespace, resource_version=version):
                if pod.spec.nodeName and pod.metadata.name not in self.bound_at:
                    self.bound_at[pod.metadata.name] = time.time()

        self.task = asyncio.ensure_future(watch())

    async def stop(self) -> None:
        if self.task:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)


async def _create(client, manifests: list[dict], in_flight: int, rate: float | None) -> dict[str, float]:
    """Creates the pods (at ``rate`` a second, or as fast as taken); returns when each was sent."""
    from lightkube.resources.core_v1 import Pod

    sent: dict[str, float] = {}
    gate = asyncio.Semaphore(in_flight)
    start = time.monotonic()

    async def one(k: int, manifest: dict) -> None:
        if rate is not None:
            delay = start + k / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
        async with gate:
            sent[manifest["metadata"]["name"]] = time.time()
            await client.create(Pod.from_dict(manifest))

    await asyncio.gather(*(one(k, m) for k, m in enumerate(manifests)))
    return sent


async def _wait_bound(watcher: _Watcher, want: int, timeout: float, settle: float = 30.0) -> None:
    """Until ``want`` pods are bound, or none more for ``settle`` seconds (then the phase says
    how many were)."""
    deadline = time.monotonic() + timeout
    last, last_change = -1, time.monotonic()
    while time.monotonic() < deadline:
        count = len(watcher.bound_at)
        if count >= want:
            return
        if count != last:
            last, last_change = count, time.monotonic()
        elif time.monotonic() - last_change > settle:
            return
        await asyncio.sleep(0.1)


async def _delete_all(client, namespace: str, strip_finalizers: bool = False) -> None:
    """Every pod of the namespace, at once. The connector takes its finalizer off each once it has
    told the worker; ``strip_finalizers`` (at the end, the connector gone) takes them off here."""
    from lightkube import ApiError
    from lightkube.resources.core_v1 import Pod
    from lightkube.types import PatchType

    names = [(p.metadata.name, bool(p.metadata.finalizers)) async for p in client.list(Pod, namespace=namespace)]
    gate = asyncio.Semaphore(100)

    async def one(name: str, finalized: bool) -> None:
        async with gate:
            try:
                if finalized and strip_finalizers:
                    await client.patch(Pod, name, {"metadata": {"finalizers": None}}, namespace=namespace,
                                       patch_type=PatchType.MERGE)
                await client.delete(Pod, name, namespace=namespace, grace_period=0)
            except ApiError:
                pass

    await asyncio.gather(*(one(n, f) for n, f in names))
    for _ in range(1200):
        if not [p async for p in client.list(Pod, namespace=namespace)]:
            return
        await asyncio.sleep(0.5)


class _Scheduler:
    """One scheduler's processes for the bench: fairstream's worker and connector, or
    kube-scheduler."""

    def __init__(self, name: str, plane, bench_id: str, work: Path, broker: str, redis: str,
                 kube_scheduler_qps: float | None, connector_args: tuple[str, ...] = (),
                 worker_args: tuple[str, ...] = ()) -> None:
        self.connector_args, self.worker_args = connector_args, worker_args
        self.name, self.plane, self.work = name, plane, work
        self.processes: list[subprocess.Popen] = []
        self.scheduler_name = f"{name}-{bench_id}"
        self.bench_id, self.broker, self.redis, self.qps = bench_id, broker, redis, kube_scheduler_qps
        self.app_id = f"kbench{bench_id}"

    def _spawn(self, args: list[str], log_name: str) -> subprocess.Popen:
        out = open(self.work / log_name, "a")
        process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
        self.processes.append(process)
        return process

    def _wait_log(self, log_name: str, text: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in (self.work / log_name).read_text():
                return
            if any(p.poll() is not None for p in self.processes):
                raise ModelError(f"{self.name} exited: {(self.work / log_name).read_text()[-1500:]}")
            time.sleep(0.2)
        raise ModelError(f"{self.name}: no {text!r} within {timeout} s (log: {self.work / log_name})")

    def start(self) -> None:
        if self.name == "fairstream":
            tenants = self.work / "tenants.json"
            tenants.write_text(json.dumps({"tenants": [{"id": "a", "weight": 2}, {"id": "b", "weight": 1}]}))
            self._spawn([sys.executable, "-m", "fairstream.cli", "worker", "--policy", "drf", "--resources", "cpu,mem",
                         "--app-id", self.app_id, "--topic-prefix", self.app_id, "--broker", self.broker,
                         "--redis", self.redis, "--metrics-port", "0", "--tenants", str(tenants),
                         *self.worker_args], "worker.log")
            self._wait_log("worker.log", '"event": "worker.partitions_assigned"')
            self._spawn([sys.executable, "-m", "fairstream.cli", "kubernetes", "--cluster", "bench",
                         "--kubeconfig", str(self.plane.connector_kubeconfig), "--scheduler-name", self.scheduler_name,
                         "--node-selector", f"fairstream.dev/bench={self.bench_id}", "--broker", self.broker,
                         "--topic-prefix", self.app_id, "--worker-url", "", *self.connector_args], "connector.log")
            self._wait_log("connector.log", '"event": "kubernetes.started"')
        else:
            config = self.work / "kube-scheduler.yaml"
            connection = f"clientConnection: {{kubeconfig: {self.plane.admin_kubeconfig}"
            connection += f", qps: {self.qps}, burst: {int(2 * self.qps)}}}" if self.qps else "}"
            config.write_text("apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n"
                              f"{connection}\nleaderElection: {{leaderElect: false}}\n"
                              f"profiles:\n- schedulerName: {self.scheduler_name}\n")
            self._spawn([self.plane.tool("kube-scheduler"), "--config", str(config), "--secure-port", "0", "-v", "1"],
                        "kube-scheduler.log")
            time.sleep(3)  # (it lists nodes and pods, then schedules: no log line to wait on that says so)

    def stop(self) -> None:
        for process in reversed(self.processes):
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(20)
                except subprocess.TimeoutExpired:
                    process.kill()
        self.processes.clear()


async def _phase(client, scheduler: _Scheduler, namespace: str, name: str, manifests: list[dict],
                 rate: float | None, want: int, timeout: float, waiting_first: bool = False) -> dict[str, Any]:
    """One phase: the pods made (with ``waiting_first``, all of them while the scheduler is
    stopped, then it starts: every pod waits at once), until ``want`` are bound or no more are."""
    watcher = _Watcher(client, namespace)
    await watcher.start()
    if waiting_first:
        scheduler.stop()
    begin = time.time()
    sent = await _create(client, manifests, 100, rate)
    created_s = time.time() - begin
    if waiting_first:
        await asyncio.get_running_loop().run_in_executor(None, scheduler.start)
    await _wait_bound(watcher, want, timeout, settle=30.0 if name == "fairness" else 60.0)
    await watcher.stop()
    bound = watcher.bound_at
    latencies = [bound[n] - sent[n] for n in bound if n in sent]
    out: dict[str, Any] = {"pods": len(manifests), "bound": len(bound), "created_per_s": round(len(manifests) / created_s, 1)}
    if bound:
        span = max(bound.values()) - min(sent.values())
        out["bound_per_s"] = round(len(bound) / span, 1) if span > 0 else None
        out["latency"] = _percentiles(latencies)
    if name == "fairness":
        # What each queue holds at the end (fairstream's preemption may have evicted some of
        # what was bound first: those pods are gone).
        from lightkube.resources.core_v1 import Pod

        holding = [p.metadata.name async for p in client.list(Pod, namespace=namespace)
                   if p.spec.nodeName and not p.metadata.deletionTimestamp]
        out["bound_by_queue"] = {q: sum(1 for n in holding if n.startswith(f"{q}-")) for q in ("a", "b")}
        out["evicted"] = len(bound) - len(holding)
    log.info("bench.kubernetes.phase", scheduler=scheduler.name, phase=name, **{k: v for k, v in out.items()
                                                                               if k != "latency"})
    await _delete_all(client, namespace)
    return out


async def _run(nodes: int, pods: int, rate: float, rate_seconds: float, fair_pods: int, schedulers: list[str],
               broker: str, redis: str, kube_scheduler_qps: float | None, which: tuple[str, ...],
               finalizer: bool) -> dict[str, Any]:
    from lightkube import AsyncClient, KubeConfig
    from lightkube.resources.core_v1 import Namespace, Node

    plane = start_control_plane()
    client = AsyncClient(config=KubeConfig.from_file(plane.admin_kubeconfig), field_manager="fairstream-bench")
    bench_id = uuid.uuid4().hex[:8]
    work = Path(tempfile.mkdtemp(prefix=f"fairstream-bench-kube-{bench_id}-"))
    namespace = f"bench-{bench_id}"
    await client.create(Namespace.from_dict({"metadata": {"name": namespace}}))  # type: ignore[call-overload]  # (lightkube's from_dict is typed as returning its base class)
    node_names = [f"bench-{bench_id}-{k}" for k in range(nodes)]
    allocatable = {"cpu": NODE_CPU, "memory": NODE_MEMORY, "pods": "110"}
    gate = asyncio.Semaphore(100)

    async def make_node(name: str) -> None:
        async with gate:
            await client.create(Node.from_dict({  # type: ignore[call-overload]  # (lightkube's from_dict is typed as returning its base class)
                "metadata": {"name": name, "labels": {"type": "kwok", "fairstream.dev/bench": bench_id},
                             "annotations": {"kwok.x-k8s.io/node": "fake"}},
                "status": {"allocatable": allocatable, "capacity": allocatable}}))

    began = time.time()
    await asyncio.gather(*(make_node(n) for n in node_names))
    result: dict[str, Any] = {"nodes": nodes, "node": allocatable, "pods": pods, "rate": rate,
                              "rate_seconds": rate_seconds, "fair_pods": fair_pods, "nodes_made_s": round(time.time() - began, 1),
                              "kube_scheduler_qps": kube_scheduler_qps or "its default (50, burst 100)",
                              "fairstream": {"worker": " ".join(WORKER_ARGS), "finalizer": finalizer}, "phases": list(which),
                              "machine": {"cpus": os.cpu_count()}, "schedulers": {}}
    try:
        for name in schedulers:
            scheduler = _Scheduler(name, plane, bench_id, work, broker, redis, kube_scheduler_qps,
                                   connector_args=() if finalizer else ("--no-finalizer",),
                                   worker_args=WORKER_ARGS)
            scheduler.start()
            try:
                phases: dict[str, Any] = {}

                def made(prefix: str, count: int, cpu: str = "1", queues=("a", "b")) -> list[dict]:
                    return [pod_manifest(namespace, f"{queues[k % len(queues)]}-{prefix}-{k}", scheduler.scheduler_name,  # noqa: B023 (called before the loop moves on)
                                         cpu=cpu, memory="1Gi", labels={QUEUE_LABEL: queues[k % len(queues)]})
                            for k in range(count)]

                if "burst" in which:
                    phases["burst"] = await _phase(client, scheduler, namespace, "burst", made("burst", pods), None, pods,
                                               timeout=max(300.0, pods / 10))
                count = int(rate * rate_seconds)
                if "rate" in which:
                    phases["rate"] = await _phase(client, scheduler, namespace, "rate", made("rate", count), rate, count,
                                              timeout=rate_seconds + 120)
                # 16-core pods, two to a node: nodes * 2 fit. a (weight 2) and b (weight 1) ask for
                # more than that, alternately, all waiting when the scheduler starts; drf's fair
                # share: a 2/3 of what fits, b 1/3.
                fits = 2 * nodes
                # (Until no pod is bound for 30 s: fairstream's preemption takes back what a queue
                # above its fair share got while the other's pods were still being submitted.)
                if "fairness" in which:
                    phases["fairness"] = await _phase(client, scheduler, namespace, "fairness",
                                                      made("fair", fair_pods, "16"), None, fair_pods, timeout=900,
                                                      waiting_first=True)
                    phases["fairness"]["fair_share"] = {"a": min(fair_pods // 2, round(fits * 2 / 3)),
                                                    "b": min(fair_pods // 2, fits - min(fair_pods // 2, round(fits * 2 / 3)))}
                result["schedulers"][name] = phases
            finally:
                scheduler.stop()
    finally:
        await _delete_all(client, namespace, strip_finalizers=True)
        gate2 = asyncio.Semaphore(100)

        async def drop_node(name: str) -> None:
            async with gate2:
                try:
                    await client.delete(Node, name)
                except Exception:
                    pass

        await asyncio.gather(*(drop_node(n) for n in node_names))
        try:
            await client.delete(Namespace, namespace)
        except Exception:
            pass
        await client.close()
    result["logs"] = str(work)
    return result


def bench_kubernetes(nodes: int = 1000, pods: int = 10000, rate: float = 100.0, rate_seconds: float = 30.0,
                     fair_pods: int | None = None, schedulers: tuple[str, ...] = ("fairstream", "kube-scheduler"),
                     broker: str | None = None, redis: str | None = None,
                     kube_scheduler_qps: float | None = None, phases: tuple[str, ...] = PHASES,
                     finalizer: bool = True) -> dict[str, Any]:
    unknown = [s for s in schedulers if s not in ("fairstream", "kube-scheduler")]
    if unknown:
        raise ModelError(f"--schedulers: unknown {unknown[0]!r} (fairstream, kube-scheduler)")
    if not phases or not set(phases) <= set(PHASES):
        raise ModelError(f"--kube-phases: some of {', '.join(PHASES)}")
    broker = broker or os.environ.get("FAIRSTREAM_BROKER", "127.0.0.1:9092")
    redis = redis or os.environ.get("FAIRSTREAM_REDIS_URL", "redis://127.0.0.1:6379/0")
    fair_pods = fair_pods if fair_pods is not None else 3 * nodes
    try:
        return asyncio.run(_run(nodes, pods, rate, rate_seconds, fair_pods, list(schedulers), broker, redis,
                                kube_scheduler_qps, tuple(phases), finalizer))
    except RuntimeError as exc:
        raise ModelError(str(exc)) from None
