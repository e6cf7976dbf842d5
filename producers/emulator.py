"""Trace replay and a cluster emulator for the streaming worker.

``replay``: publishes a workload's node heartbeats, then its submissions at their trace times,
on a clock ``speed`` times faster than real time. Tasks that wait for something (a later stage
of their job, or a whole other job) are not published by replay: the emulator releases them.

``emulate``: plays the cluster. It consumes decisions, runs each placed task for its trace
duration and publishes its completion when the accelerated clock gets there, with that event
time; a requeued or preempted task's pending completion is cancelled. A task starts at its decision's time,
or, as on a real cluster, when the emulator hears of the decision if that is later (the
worker's latency times ``speed``): so nothing it publishes goes back in its own time. It releases
held-back tasks when what they wait for has completed, and sends every node's heartbeat every
``heartbeat_interval`` seconds of event time. With ``replay=True`` it also does replay's part,
so one process drives a whole run (the demo and the end-to-end tests).

Decisions are idempotent by id: a decision seen twice (the worker republishes after a crash)
is applied once.
"""

from __future__ import annotations

import asyncio
import heapq
import json
import math
import time as wall
from dataclasses import dataclass, field
from typing import cast

import structlog

from fairstream.producers.client import Publisher
from fairstream.sim.scenario import Scenario, TaskSpec, spec_of_task
from fairstream.sim.simulator import ReleaseGates
from fairstream.wire.kafka import ensure_topics, kafka_security
from fairstream.wire.topics import Topics

log = structlog.get_logger("fairstream.emulator")

PROGRESS_EVERY = 10.0  # wall seconds between the emulator's progress lines (on a terminal or not)


@dataclass
class EmulatorReport:
    submitted: int = 0
    placed: int = 0
    completed: int = 0
    requeued: int = 0
    preempted: int = 0  # tasks killed by preempt decisions (they run again when placed again)
    duplicates_ignored: int = 0
    moved: int = 0  # placed again on another node while running (after the worker lost state)
    stale_ignored: int = 0  # placed again after it had finished (after the worker lost state)
    max_node_use: dict[str, dict[str, float]] = field(default_factory=dict)
    over_committed: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {k: v for k, v in vars(self).items() if k != "max_node_use"}


async def run_emulator(
    scenario: Scenario,
    cluster: str,
    broker: str = "127.0.0.1:9092",
    topics: Topics = Topics(),
    speed: float = 100.0,
    heartbeat_interval: float = 30.0,
    replay: bool = True,
    timeout: float | None = None,
    delivery_timeout: float | None = None,
) -> EmulatorReport:
    """Drive ``scenario`` through the worker until every task has completed (or ``timeout``
    seconds of wall time pass). Returns what it saw, including any node over-commitment.
    ``delivery_timeout``: the publisher's (``Publisher``; None: its default)."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    report = EmulatorReport()
    specs = {t.id: t for t in scenario.tasks}  # a request's tasks are <id>-<k>: spec_of
    total = scenario.task_count

    def spec_of(task_id: str) -> TaskSpec | None:
        return spec_of_task(specs, task_id)

    gates = ReleaseGates(scenario.tasks)
    partitions = await ensure_topics(broker, topics.names)  # each with a leader for every partition
    consumer = AIOKafkaConsumer(bootstrap_servers=broker, enable_auto_commit=False, **kafka_security())
    await consumer.start()
    # Read the decisions topic from its current end, positioned before anything is published.
    assigned = [TopicPartition(topics.decisions, p) for p in range(partitions[topics.decisions])]
    consumer.assign(assigned)
    await consumer.seek_to_end(*assigned)
    for tp in assigned:  # resolve the end offsets now, not lazily after our first publish
        await consumer.position(tp)

    heap: list = []  # (event_time, order, kind, payload)
    order = 0

    def schedule(at: float, kind: str, payload) -> None:
        nonlocal order
        order += 1
        heapq.heappush(heap, (at, order, kind, payload))

    schedule(0.0, "heartbeat", None)  # nodes first: the worker can place what arrives at t=0
    for spec in gates.initially_released():
        if replay:
            schedule(spec.submit, "submit", spec)
    attempts: dict[str, int] = {}
    seen: set[str] = set()
    use: dict[str, list[float]] = {n.id: [0.0] * len(scenario.resources.names) for n in scenario.nodes}
    capacity = {n.id: [n.capacity.get(r, 0.0) for r in scenario.resources.names] for n in scenario.nodes}
    running: dict[str, tuple[str, list[float]]] = {}
    finished: set[str] = set()

    def release(task_id: str) -> None:
        """``task_id`` stops running: its node gets its demand back."""
        node, demand = running.pop(task_id)
        use[node] = [u - d for u, d in zip(use[node], demand)]

    origin = wall.monotonic()
    deadline = None if timeout is None else origin + timeout
    names = scenario.resources.names

    def place(decision: dict, task_id: str):
        """Apply ``decision`` to one of its tasks; returns the completion to schedule, if any."""
        if decision["kind"] in ("requeue", "preempt"):
            # Its node was lost, or it is killed for a starved tenant: it stops, its pending
            # completion is cancelled, and it runs again from the start when placed again.
            attempts[task_id] = attempts.get(task_id, 0) + 1
            if task_id in running:
                release(task_id)
            if decision["kind"] == "preempt":
                report.preempted += 1
            else:
                report.requeued += 1
            return None
        if decision["kind"] != "place":
            return None  # unschedulable: nothing to run
        spec = spec_of(task_id)
        if spec is None:
            return None
        if task_id in finished:
            # Decided again after it finished (a worker whose Redis lost writes read the
            # input again): nothing to run.
            report.stale_ignored += 1
            return None
        if task_id in running:
            # Placed again elsewhere (a worker whose Redis lost writes decided it again):
            # move it, as the docs ask of an agent, restarting its run.
            release(task_id)
            report.moved += 1
        attempts[task_id] = attempts.get(task_id, 0) + 1
        demand = [float(decision["demand"].get(r, 0.0)) for r in names]
        node = decision["node"]
        running[task_id] = (node, demand)
        use[node] = [u + d for u, d in zip(use[node], demand)]
        if any(u > c + 1e-9 for u, c in zip(use[node], capacity[node])):
            report.over_committed.append(f"{node} at t={decision['time']}: {use[node]} > {capacity[node]}")
        peak = report.max_node_use.setdefault(node, dict.fromkeys(names, 0.0))
        for r, u in zip(names, use[node]):
            peak[r] = max(peak[r], u)
        report.placed += 1
        started = max(decision["time"], (wall.monotonic() - origin) * speed)
        return started + spec.duration, "complete", (task_id, attempts[task_id])

    said_at = wall.monotonic()  # when the last progress line was logged
    try:
        async with Publisher(broker, topics, delivery_timeout) as pub:
            while report.completed < total:
                now_wall = wall.monotonic()
                now_event = (now_wall - origin) * speed
                if now_wall - said_at >= PROGRESS_EVERY:  # a run of minutes says how far it is
                    said_at = now_wall
                    log.info("emulator.progress", submitted=report.submitted, placed=report.placed,
                             completed=report.completed, tasks=total, event_time=round(now_event, 1),
                             elapsed_s=round(said_at - origin, 1))
                while heap and heap[0][0] <= now_event:
                    at, _, kind, payload = heapq.heappop(heap)
                    if kind == "heartbeat":
                        for node in scenario.nodes:
                            await pub.heartbeat(cluster, node.id, at, node.capacity, node.labels or None, node.weights or None)
                        if report.completed < total:
                            schedule(at + heartbeat_interval, "heartbeat", None)
                    elif kind == "submit":
                        submitted: TaskSpec = payload
                        await pub.submit(cluster, submitted.id, submitted.tenant, submitted.demand, at, job=submitted.job,
                                         constraints=submitted.constraints, count=submitted.count,
                                         estimate=submitted.estimate, gang=submitted.gang)
                        report.submitted += submitted.tasks
                    elif kind == "complete":
                        task_id, attempt = payload
                        if attempts.get(task_id) != attempt:
                            continue  # requeued meanwhile
                        release(task_id)
                        await pub.complete(cluster, task_id, at)
                        report.completed += 1
                        finished.add(task_id)
                        for released in gates.finished(cast(TaskSpec, spec_of(task_id)), at):  # (a task it submitted)
                            schedule(max(released.submit, gates.release_time(released, at)), "submit", released)
                next_at = heap[0][0] if heap else now_event + speed
                wait = max(0.0, min((next_at - now_event) / speed, 0.2))
                batch = await consumer.getmany(timeout_ms=int(wait * 1000))
                for records in batch.values():
                    for record in records:
                        decision = json.loads(record.value)
                        if decision.get("cluster") != cluster:
                            continue
                        if decision["id"] in seen:
                            report.duplicates_ignored += 1
                            continue
                        seen.add(decision["id"])
                        for task_id in decision.get("tasks") or [decision["task"]]:
                            completion = place(decision, task_id)
                            if completion is not None:
                                schedule(*completion)
                if deadline is not None and wall.monotonic() > deadline:
                    log.warning("emulator.timeout", completed=report.completed, tasks=total)
                    break
    finally:
        await consumer.stop()
    return report


def run(scenario: Scenario, cluster: str, broker: str, topics: Topics, speed: float, heartbeat_interval: float,
        replay: bool, timeout: float | None, delivery_timeout: float | None = None) -> EmulatorReport:
    return asyncio.run(run_emulator(scenario, cluster, broker, topics, speed, heartbeat_interval, replay, timeout,
                                    delivery_timeout))


async def replay_only(scenario: Scenario, cluster: str, broker: str, topics: Topics, speed: float,
                      delivery_timeout: float | None = None) -> int:
    """``fairstream replay``: heartbeats, then the ungated submissions at their trace times."""
    gates = ReleaseGates(scenario.tasks)
    released = sorted(gates.initially_released(), key=lambda t: t.submit)
    origin = wall.monotonic()
    async with Publisher(broker, topics, delivery_timeout) as pub:
        for node in scenario.nodes:
            await pub.heartbeat(cluster, node.id, 0.0, node.capacity, node.labels or None, node.weights or None)
        for spec in released:
            delay = spec.submit / speed - (wall.monotonic() - origin) if math.isfinite(speed) else 0
            if delay > 0:
                await asyncio.sleep(delay)
            await pub.submit(cluster, spec.id, spec.tenant, spec.demand, spec.submit, job=spec.job,
                             constraints=spec.constraints, count=spec.count,
                             estimate=spec.estimate, gang=spec.gang)
    return sum(spec.tasks for spec in released)
