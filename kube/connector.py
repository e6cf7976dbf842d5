"""``fairstream kubernetes``: joins a Kubernetes cluster to the worker through its topics.

A thin loop around ``ClusterMirror`` (``kube/mirror.py``, where the rules are):

- lists nodes, PodGroups (if the API server serves them) and pods, then watches them from the
  lists' resourceVersion; a watch that breaks (the API server away, a version too old) lists
  again, and what the list lacks is gone;
- publishes what the mirror makes of them (submissions, completions, heartbeats), each topic's
  messages of a moment as one message (a JSON array: the worker's cost is per message);
- sends a node's heartbeat every ``heartbeat_interval`` seconds (round robin; a node's change
  goes at once): the worker's clock moves with event time, and this keeps it moving (a
  preemption timeout fires while nothing else happens);
- consumes the decisions topic in a consumer group of its own and carries each decision out
  (Binding, Eviction, deletion), acknowledging a decision's offset only once it is done: a
  placement held for its node's room, or a call that failed, is read again after a restart;
- every ``explain_interval`` seconds reads why pods wait from the worker's ``/v1`` API and puts
  it on them (``PodScheduled=False`` and an Event), at most ``explain_rate`` writes a second.

Event times are the wall clock's (Unix seconds): they go on across restarts of either side.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time as wall
from dataclasses import dataclass, field
from typing import Any

import structlog

from fairstream.kube.api import BindResult, EvictResult, KubeApi, Unreachable
from fairstream.kube.mirror import (
    COMPLETED,
    HEARTBEAT,
    SUBMITTED,
    Action,
    Bind,
    ClusterMirror,
    DeletePod,
    Evict,
    Explain,
    Finalize,
    Publish,
)
from fairstream.kube.translate import DEFAULT_SCHEDULER, QUEUE_LABEL
from fairstream.wire.retry import backoff, waiting_for
from fairstream.wire.topics import Topics

log = structlog.get_logger("fairstream.kubernetes")


@dataclass
class ConnectorConfig:
    cluster: str
    broker: str = "127.0.0.1:9092"
    topics: Topics = field(default_factory=Topics)
    kubeconfig: str | None = None
    context: str | None = None
    resources: tuple[str, ...] = ("cpu", "mem")
    node_selector: dict[str, str] = field(default_factory=dict)  # the nodes it schedules (default: all)
    scheduler_name: str = DEFAULT_SCHEDULER
    queue_label: str = QUEUE_LABEL
    heartbeat_interval: float = 10.0
    lost_after: float = 300.0
    worker_url: str | None = "http://127.0.0.1:9464"
    explain_interval: float = 5.0
    explain_rate: float = 20.0
    group: str | None = None  # the decisions' consumer group (default: fairstream-kubernetes.<cluster>)
    max_in_flight: int = 64  # API calls at once
    finalizer: bool = True  # our finalizer on pods of ours (docs/kubernetes.md, "Restarts and outages")
    kafka_options: dict[str, Any] = field(default_factory=dict)

    @property
    def consumer_group(self) -> str:
        return self.group or f"fairstream-kubernetes.{self.cluster}"


class Connector:
    """One cluster's connector: ``await Connector(config).run(stop)``."""

    def __init__(self, config: ConnectorConfig) -> None:
        self.config = config
        self.mirror = ClusterMirror(config.cluster, config.resources, config.scheduler_name, config.queue_label,
                                    config.lost_after, finalizer=config.finalizer)
        self.api: KubeApi | None = None  # (made by ``run``; a test may hand its own)
        self.publisher: Any = None  # the producer of the topics (``run``: a ``Publisher``)
        self.outbox: dict[str, list[dict[str, Any]]] = {SUBMITTED: [], COMPLETED: [], HEARTBEAT: []}
        self.explanations: dict[str, Explain] = {}  # by pod uid: the newest to write
        self.explained = asyncio.Event()
        self.in_flight = asyncio.Semaphore(config.max_in_flight)
        self.changes: asyncio.Queue = asyncio.Queue()  # (kind, ADDED|MODIFIED|DELETED, object) from the watches
        self.tasks: set[asyncio.Task] = set()
        self.stats = {"binds": 0, "evictions_refused": 0, "api_errors": 0}

    def _api(self) -> KubeApi:
        """The API server's client (``run`` makes it before any call)."""
        assert self.api is not None
        return self.api

    # ------------------------------------------------------------------ publishing

    def _take(self, actions: list[Action]) -> list[Action]:
        """Queues the mirror's messages; returns the API calls to make."""
        calls: list[Action] = []
        for action in actions:
            if isinstance(action, Publish):
                self.outbox[action.kind].append(action.message)
            elif isinstance(action, Explain):
                self.explanations[action.pod.uid] = action
                self.explained.set()
            else:
                calls.append(action)
        return calls

    async def flush(self) -> None:
        """Sends what is queued, each topic's as one message (heartbeats first: a submission
        may need the node they bring). A cluster's messages stay in order per topic."""
        topics = {HEARTBEAT: self.config.topics.heartbeats, SUBMITTED: self.config.topics.submitted,
                  COMPLETED: self.config.topics.completed}
        for kind in (HEARTBEAT, SUBMITTED, COMPLETED):
            queued, self.outbox[kind] = self.outbox[kind], []
            if queued:
                await self.publisher.send_many(topics[kind], queued)  # (in messages the worker takes)

    async def apply(self, actions: list[Action]) -> None:
        """Publishes the mirror's messages, then makes its API calls (all at once, bounded)."""
        calls = self._take(actions)
        await self.flush()
        if calls:
            outcomes = await asyncio.gather(*(self._call(call) for call in calls))
            # Submissions sent once their finalizer is on go in the mirror's order, not in the
            # order the calls came back: a tenant's pods wait in the order they came. A gang's
            # request, after its pods' calls, goes once.
            self._take(list({id(then): then for then in outcomes if then is not None}.values()))
            await self.flush()

    # ------------------------------------------------------------------ API calls

    async def _retrying(self, what: str, make):
        """``await make()`` until the API server answers (it may be away for a while)."""

        async def call():
            async with self.in_flight:
                return await make()

        return await waiting_for(call, "kubernetes.api_unreachable", retry_on=Unreachable, logger=log,
                                 call=what)

    async def _call(self, call: Action) -> Publish | None:
        """Makes ``call``; returns the message to send after it (a submission whose pod now has
        our finalizer), if any."""
        try:
            if isinstance(call, Bind):
                result = await self._retrying("bind", lambda: self._api().bind(call.pod, call.node))
                if result is BindResult.BOUND:
                    self.stats["binds"] += 1
                elif result is BindResult.ALREADY_BOUND:
                    log.info("kubernetes.already_bound", pod=str(call.pod), node=call.node, decision=call.decision)
                else:
                    self.mirror.bind_failed(call.pod.uid, call.node)
                    log.warning("kubernetes.bind_not_made", pod=str(call.pod), node=call.node,
                                decision=call.decision, why=result.value)
            elif isinstance(call, Finalize):
                present = await self._retrying("finalizer", lambda: self._api().finalizer(
                    call.pod, call.add, dict(call.annotations)))
                view = self.mirror.pods.get(call.pod.uid)
                if view is not None:
                    view.finalizing = False
                if present and call.then is not None:
                    return call.then
            elif isinstance(call, Evict):
                self._spawn(self._evict(call))
            elif isinstance(call, DeletePod):
                await self._retrying("delete", lambda: self._api().delete(call.pod))
                log.info("kubernetes.deleted", pod=str(call.pod), decision=call.decision, why="its node was lost")
        except Exception as exc:  # an answer we did not expect: logged, the decision read again at restart
            self.stats["api_errors"] += 1
            log.error("kubernetes.api_error", call=type(call).__name__, pod=str(getattr(call, "pod", "")),
                      error=f"{type(exc).__name__}: {exc}")
            if isinstance(call, Finalize) and call.pod.uid in self.mirror.pods:
                view = self.mirror.pods[call.pod.uid]
                view.finalizing = False
                if call.then is not None and view.request is None:
                    view.submitted = False  # (not sent: its next change tries again)
        return None

    async def _evict(self, call: Evict) -> None:
        """Evicts, and while a PodDisruptionBudget refuses, tries again (as ``kubectl drain``
        does) until it is allowed or the pod is gone or runs again for the worker."""
        waits = backoff(2.0, 30.0)
        said = False
        while True:
            view = self.mirror.pods.get(call.pod.uid)
            if view is None or view.ended:
                return
            result = await self._retrying("evict", lambda: self._api().evict(call.pod))
            if result is not EvictResult.REFUSED:
                log.info("kubernetes.evicted", pod=str(call.pod), decision=call.decision, result=result.value)
                return
            self.stats["evictions_refused"] += 1
            if not said:
                said = True
                log.warning("kubernetes.eviction_refused", pod=str(call.pod), decision=call.decision,
                            why="a PodDisruptionBudget allows no disruption now; trying again")
                self._take([Explain(call.pod, "EvictionRefused",
                                    "fairstream preempts this pod for a tenant below its fair share; a "
                                    "PodDisruptionBudget refuses the eviction now: it runs on, and the "
                                    "eviction is tried again", warning=True, condition=False)])
            await asyncio.sleep(next(waits))

    def _spawn(self, coroutine) -> None:
        task = asyncio.ensure_future(coroutine)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    # ------------------------------------------------------------------ watching

    async def _sync(self, kind: str) -> str | None:
        """Lists ``kind`` (node, podgroup, pod) into the mirror; the list's resourceVersion, or
        None if the API server does not serve it (PodGroups without their feature gate)."""
        api = self._api()
        found = await self._retrying(f"list {kind}s", {"node": api.list_nodes, "pod": api.list_pods,
                                                       "podgroup": api.list_podgroups}[kind])
        if found is None:
            log.info("kubernetes.no_podgroups", why="the API server serves no scheduling.k8s.io/v1beta1 "
                     "PodGroups (feature gate GenericWorkload off); Kueue's pod groups are still read")
            return None
        listed, version = found
        now = wall.time()
        listing = {"node": self.mirror.nodes_listed, "pod": self.mirror.pods_listed,
                   "podgroup": self.mirror.podgroups_listed}[kind]
        await self.apply(listing(listed, now))
        log.info("kubernetes.listed", kind=kind, count=len(listed), resource_version=version)
        return version

    async def _watch(self, kind: str, version: str) -> None:
        """Watches ``kind`` from ``version`` into the queue of changes; lists again whenever the
        watch breaks."""
        waits = backoff(0.5, 10.0)
        while True:
            try:
                async for event, obj in self._api().watch(kind, version):
                    waits = backoff(0.5, 10.0)
                    version = obj["metadata"].get("resourceVersion", version)
                    self.changes.put_nowait((kind, event, obj))
                # The server closed the watch (its timeout): go on from the same version.
            except Exception as exc:
                delay = next(waits)
                log.warning("kubernetes.watch_broken", kind=kind, error=f"{type(exc).__name__}: {exc}",
                            relist_in_s=delay)
                await asyncio.sleep(delay)
                version = await self._sync(kind) or version

    async def _apply_changes(self) -> None:
        """The watches' changes, as many at a time as have come (one flush, the calls together):
        under load, a pod's events cost a share of one round trip, not one each."""
        while True:
            changes = [await self.changes.get()]
            while not self.changes.empty() and len(changes) < 5000:
                changes.append(self.changes.get_nowait())
            now = wall.time()
            actions: list[Action] = []
            for kind, event, obj in changes:
                if kind == "node":
                    actions += (self.mirror.node_gone(obj["metadata"]["name"], now) if event == "DELETED"
                                else self.mirror.node_seen(obj, now))
                elif kind == "podgroup":
                    actions += (self.mirror.podgroup_gone(obj, now) if event == "DELETED"
                                else self.mirror.podgroup_seen(obj, now))
                else:
                    actions += self.mirror.pod_gone(obj, now) if event == "DELETED" else self.mirror.pod_seen(obj, now)
            if actions:
                await self.apply(actions)

    # ------------------------------------------------------------------ decisions

    async def _decisions(self, consumer) -> None:
        from aiokafka import TopicPartition
        from aiokafka.structs import OffsetAndMetadata

        while True:
            batch = await consumer.getmany(timeout_ms=500, max_records=2000)
            ends: dict[Any, int] = {}
            actions: list[Action] = []
            now = wall.time()
            for tp, records in batch.items():
                for record in records:
                    ends[tp] = record.offset + 1
                    try:
                        decision = json.loads(record.value)
                    except ValueError:
                        log.error("kubernetes.undecodable_decision", partition=tp.partition, offset=record.offset)
                        continue
                    if decision.get("cluster") != self.config.cluster:
                        continue
                    counted = self.mirror.counts.as_dict()
                    actions += self.mirror.decision(decision, now, position=(tp, record.offset))
                    _log_not_carried_out(decision, counted, self.mirror.counts.as_dict())
            if actions:
                await self.apply(actions)
            # Acknowledged up to the first placement still held in each partition (read again
            # after a restart), else to the end of what was read.
            held = self.mirror.held_positions()
            commits = {}
            for tp in set(ends) | {tp for tp, _ in held}:
                waiting = [offset for (held_tp, offset) in held if held_tp == tp]
                position = min(waiting) if waiting else ends.get(tp)
                if position is not None:
                    commits[TopicPartition(tp.topic, tp.partition)] = OffsetAndMetadata(position, "")
            if commits:
                await consumer.commit(commits)

    # ------------------------------------------------------------------ periodic work

    async def _heartbeats(self) -> None:
        while True:
            await asyncio.sleep(self.config.heartbeat_interval)
            await self.apply(self.mirror.heartbeats(wall.time()))

    async def _pending_reasons(self) -> None:
        """Why pods wait, from the worker's API, onto the pods whose reason changed."""
        import aiohttp

        url = f"{(self.config.worker_url or '').rstrip('/')}/v1/clusters/{self.config.cluster}/pending"
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
            while True:
                await asyncio.sleep(self.config.explain_interval)
                try:
                    async with session.get(url, params={"size": "1000"}) as reply:
                        if reply.status != 200:
                            continue  # (no such cluster yet: nothing decided)
                        document = await reply.json()
                except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
                    log.warning("kubernetes.worker_api_unreachable", url=url, error=f"{type(exc).__name__}: {exc}")
                    continue
                self._take(self.mirror.pending_reasons(document.get("entries") or []))

    async def _write_explanations(self) -> None:
        """Writes the newest reason of each pod, at most ``explain_rate`` a second."""
        gap = 1.0 / self.config.explain_rate
        while True:
            await self.explained.wait()
            self.explained.clear()
            while self.explanations:
                uid = next(iter(self.explanations))
                note = self.explanations.pop(uid)
                view = self.mirror.pods.get(uid)
                if view is None or (view.node is not None and note.condition):
                    continue  # (gone, or bound meanwhile: no longer waiting)
                try:
                    await self._retrying("explain", lambda: self._api().explain(note.pod, note.reason, note.message,  # noqa: B023 (called before the loop moves on)
                                                                             note.warning, note.condition))  # noqa: B023 (called before the loop moves on)
                except Exception as exc:
                    log.warning("kubernetes.explain_failed", pod=str(note.pod), error=f"{type(exc).__name__}: {exc}")
                await asyncio.sleep(gap)

    # ------------------------------------------------------------------ the whole

    async def run(self, stop: asyncio.Event | None = None) -> None:
        from aiokafka import AIOKafkaConsumer

        from fairstream.producers.client import Publisher
        from fairstream.wire.kafka import ensure_topics, kafka_security

        stop = stop or asyncio.Event()
        config = self.config
        self.api = KubeApi(config.kubeconfig, config.context, node_selector=config.node_selector)
        await ensure_topics(config.broker, config.topics.names)
        consumer = AIOKafkaConsumer(config.topics.decisions, bootstrap_servers=config.broker,
                                    group_id=config.consumer_group, enable_auto_commit=False,
                                    auto_offset_reset="earliest", **kafka_security(config.kafka_options))
        async with Publisher(config.broker, config.topics, **config.kafka_options) as publisher:
            self.publisher = publisher
            await consumer.start()
            try:
                node_version = await self._sync("node")
                podgroup_version = await self._sync("podgroup")  # (before the pods: they find their groups)
                pod_version = await self._sync("pod")
                log.info("kubernetes.started", cluster=config.cluster, nodes=len(self.mirror.nodes),
                         pods=len(self.mirror.pods), scheduler=config.scheduler_name)
                assert node_version is not None and pod_version is not None
                workers = [self._watch("node", node_version), self._watch("pod", pod_version), self._apply_changes(),
                           self._decisions(consumer), self._heartbeats(), self._write_explanations()]
                if podgroup_version is not None:
                    workers.append(self._watch("podgroup", podgroup_version))
                if config.worker_url:
                    workers.append(self._pending_reasons())
                running = [asyncio.ensure_future(w) for w in workers]
                stopping = asyncio.ensure_future(stop.wait())
                done, _ = await asyncio.wait([*running, stopping], return_when=asyncio.FIRST_COMPLETED)
                for task in running + [stopping] + list(self.tasks):
                    task.cancel()
                await asyncio.gather(*running, stopping, *self.tasks, return_exceptions=True)
                for task in done:
                    failure = None if task is stopping else task.exception()
                    if failure is not None:
                        raise failure
            finally:
                await consumer.stop()
                await self._api().close()
                log.info("kubernetes.stopped", counts=self.mirror.counts.as_dict(), **self.stats)


NOT_CARRIED_OUT = ("pod_gone", "already_bound", "bound_elsewhere", "duplicate_decisions")


def _log_not_carried_out(decision: dict[str, Any], before: dict[str, int], after: dict[str, int]) -> None:
    """A decision that asked for nothing to be done (its pod gone or ended, already bound, seen
    before) is logged with why; ``kubernetes.stopped`` has the counts."""
    for why in NOT_CARRIED_OUT:
        if after[why] != before[why]:
            (log.warning if why == "bound_elsewhere" else log.info)(
                "kubernetes.decision_not_carried_out", decision=decision.get("id"), kind=decision.get("kind"),
                task=decision.get("task"), node=decision.get("node"), why=why)


def run(config: ConnectorConfig) -> None:
    """The command: runs until SIGTERM or SIGINT."""

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await Connector(config).run(stop)

    asyncio.run(main())
