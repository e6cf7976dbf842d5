"""``fairstream bench stream``: the worker on loopback Kafka and Redis, end to end.

Starts a worker (its own topic prefix, consumer group and Redis keys), gives it ``nodes``
nodes, then publishes input at ``rate`` events/s for ``duration`` seconds: half submissions,
half completions of tasks submitted ``hold`` seconds earlier, so the cluster stays in a steady
state. Every ``send_interval`` seconds the events due are sent as one record batch per topic
(a producer's linger), one event per message or, with ``per_message`` > 1, up to that many per
message (a JSON array, as an agent sending bursts would). Measures, from the broker's append
timestamps (the bench's topics use LogAppendTime), the time from a submission's append to its
decision's append (``p50_ms``, ``p99_ms``), the input rate the worker kept up with
(``events_per_s``: input events over the time until the last decision was appended), and the
worker's resident memory every second. Needs ``scripts/services.sh start``.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from collections import deque
from pathlib import Path

import numpy as np

from fairstream.wire.jsoncodec import dumps, loads
from fairstream.core.model import ModelError
from fairstream.producers.client import Publisher
from fairstream.wire.kafka import ensure_topics
from fairstream.streams.config import WorkerConfig
from fairstream.wire.topics import Topics


def _rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def _cpu_times() -> list[int] | None:
    """The machine's CPU time counters (``/proc/stat``), or None where there are none."""
    try:
        with open("/proc/stat") as stat:
            return [int(x) for x in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return None


_IDLE, _STEAL = (3, 4), (7,)  # columns of /proc/stat's cpu line: idle + iowait, steal


def _share_pct(before: list[int] | None, after: list[int] | None, columns: tuple[int, ...] = _STEAL) -> float | None:
    """Share of the machine's CPU time in between spent in ``columns`` of ``/proc/stat``.
    Steal (the 8th counter) is what the hypervisor gave to other machines: a run on a
    contended virtual machine is not comparable with others. Idle says whether the cores the
    worker shares with Kafka, Redis and the load generator were saturated."""
    if not before or not after or len(before) < 8 or len(after) < 8:
        return None
    total = sum(after[:8]) - sum(before[:8])
    spent = sum(after[c] - before[c] for c in columns)
    return round(100 * spent / total, 1) if total > 0 else None


def _process_cpu_s(pid: int) -> float | None:
    """CPU seconds (user + system) process ``pid`` has used, or None if unreadable."""
    try:
        # Fields after the command name (which may hold spaces); utime and stime are 14th and 15th.
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _logged_at(log_path: Path, event: str, since_s: float) -> list[float]:
    """Seconds after ``since_s`` (epoch) at which the worker's log has ``event`` (its JSON lines'
    ``timestamp``), to set a slow second beside what the worker was doing then."""
    from datetime import datetime

    seconds = []
    for line in log_path.read_text(errors="replace").splitlines():
        start = line.find("{")  # Faust's logger may prefix our JSON with its own fields
        if start < 0 or event not in line:  # most lines: not worth parsing
            continue
        try:
            entry = loads(line[start:])
        except ValueError:
            continue
        if isinstance(entry, dict) and entry.get("event") == event and "timestamp" in entry:
            seconds.append(round(datetime.fromisoformat(entry["timestamp"]).timestamp() - since_s, 1))
    return seconds


def _port_open(port: int) -> bool:
    import socket

    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _task_of(value: bytes) -> str:
    return loads(value)["task"]


class _BatchSender:
    """Messages keyed ``bench`` gathered per topic and sent as record batches (aiokafka's
    ``create_batch``/``send_batch``), on the partition the default partitioner gives the key."""

    KEY = b"bench"

    def __init__(self, producer, per_message: int = 1) -> None:
        from aiokafka.partitioner import DefaultPartitioner

        self.producer = producer
        self.per_message = per_message
        self.partitioner = DefaultPartitioner()
        self.partition: dict[str, int] = {}
        self.open: dict[str, object] = {}
        self.ready: list[tuple[str, object]] = []
        self.acks: list = []
        self.messages = 0

    def add_events(self, topic: str, events: list[dict]) -> None:
        """``events`` as messages of up to ``per_message`` events (a JSON array when more than one)."""
        if self.per_message == 1:
            for event in events:
                self.add(topic, dumps(event))
            return
        for start in range(0, len(events), self.per_message):
            self.add(topic, dumps(events[start:start + self.per_message]))

    def add(self, topic: str, value: bytes) -> None:
        self.messages += 1
        batch = self.open.get(topic)
        if batch is None or batch.append(key=self.KEY, value=value, timestamp=None) is None:
            if batch is not None:  # full: it goes out with the next flush
                self.ready.append((topic, batch))
            batch = self.open[topic] = self.producer.create_batch()
            batch.append(key=self.KEY, value=value, timestamp=None)

    async def flush(self) -> None:
        self.ready.extend(self.open.items())
        self.open.clear()
        for topic, batch in self.ready:
            if topic not in self.partition:
                partitions = sorted(await self.producer.partitions_for(topic))
                self.partition[topic] = self.partitioner(self.KEY, partitions, partitions)
            batch.close()
            self.acks.append(await self.producer.send_batch(batch, topic, partition=self.partition[topic]))
        self.ready.clear()
        if len(self.acks) > 200:  # bound what is in flight
            await self.wait()

    async def wait(self) -> None:
        await asyncio.gather(*self.acks)
        self.acks.clear()


async def _clean_up(broker: str, redis_url: str, app_id: str) -> None:
    """Remove what the run left: its topics (and the worker's internal ones) and its Redis keys,
    so repeated runs do not fill the broker's disk and Redis's memory."""
    from aiokafka.admin import AIOKafkaAdminClient

    from fairstream.state.store import redis_client

    admin = AIOKafkaAdminClient(bootstrap_servers=broker)
    await admin.start()
    try:
        mine = [name for name in await admin.list_topics() if name.startswith(app_id)]
        if mine:
            await admin.delete_topics(mine)
    finally:
        await admin.close()
    client = redis_client(redis_url)
    try:
        keys = [key async for key in client.scan_iter(match=f"{app_id}:*", count=1000)]
        for start in range(0, len(keys), 1000):
            await client.delete(*keys[start:start + 1000])
    finally:
        await client.aclose()


async def _run(broker: str, redis: str, rate: float, duration: float, nodes: int, tenants: int, hold: float,
               policy: str, log_path: Path, retention: float, batch_window: float, per_message: int,
               send_interval: float) -> dict:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    app_id = f"bench{uuid.uuid4().hex[:8]}"
    topics = Topics().with_prefix(app_id)
    # The broker stamps each record when it appends it (LogAppendTime), so the latency is from
    # a submission's append to its decision's, whatever delays either producer had before.
    await ensure_topics(broker, topics.names, config={"message.timestamp.type": "LogAppendTime"})
    with open(log_path, "w") as log:
        worker = subprocess.Popen(
            [sys.executable, "-m", "fairstream.cli", "worker", "--policy", policy, "--app-id", app_id,
             "--topic-prefix", app_id, "--broker", broker, "--redis", redis, "--metrics-port", "0",
             "--max-lateness", "1e9", "--finished-retention", str(retention), "--batch-window", str(batch_window)], stdout=log, stderr=subprocess.STDOUT)
    memory: list[tuple[float, float]] = []
    submitted_at: dict[str, int] = {}
    decided_at: dict[str, int] = {}
    consumer = AIOKafkaConsumer(bootstrap_servers=broker, enable_auto_commit=False)
    await consumer.start()
    try:
        await consumer._client.force_metadata_update()
        parts = [TopicPartition(topics.decisions, p) for p in sorted(consumer.partitions_for_topic(topics.decisions) or [0])]
        consumer.assign(parts)
        await consumer.seek_to_beginning(*parts)

        async with Publisher(broker, topics) as pub:
            for n in range(nodes):
                await pub.heartbeat("bench", f"n{n}", 0, {"cpu": 64, "mem": 256})
            # Wait for the worker to join its group: the first decision comes back.
            await pub.submit("bench", "warm-up", "t0", {"cpu": 1, "mem": 1}, 0)
            start_wait = time.monotonic()
            while "warm-up" not in decided_at and time.monotonic() - start_wait < 120:
                for records in (await consumer.getmany(timeout_ms=500)).values():
                    for r in records:
                        decided_at[_task_of(r.value)] = r.timestamp
            if "warm-up" not in decided_at:
                raise ModelError(f"the worker did not answer within 120 s (log: {log_path})")

            producer = pub.producer
            sender = _BatchSender(producer, per_message)
            interval = 2.0 / rate  # one submission and one completion per interval
            begin = time.monotonic()
            cpu_before = _cpu_times()
            sent = 0
            pending_completion: deque[tuple[float, str]] = deque()
            k = 0
            next_sample = begin
            last_sample = None  # (time, machine counters, worker CPU s) at the previous sample
            every_second: dict[str, list[float | None]] = {"steal": [], "idle": [], "worker": []}
            next_send = begin
            while time.monotonic() - begin < duration:
                now = time.monotonic()
                due = max(begin + k * interval, next_send)
                if now < due:
                    # Read decisions while waiting, so the consumer keeps up.
                    for records in (await consumer.getmany(timeout_ms=max(1, int((due - now) * 1000)))).values():
                        for r in records:
                            decided_at.setdefault(_task_of(r.value), r.timestamp)
                    continue
                # Everything due by now goes out in one batch per topic, every ``send_interval``
                # (the way a cluster agent with a linger would send): fewer, larger requests for
                # the broker and less of the load generator's own CPU on the cores it shares
                # with the worker.
                next_send = now + send_interval
                event_time = now - begin
                submissions, completions = [], []
                while begin + k * interval <= now:
                    name = f"b{k}"
                    submissions.append({"cluster": "bench", "task": name, "job": f"j{k // 50}", "tenant": f"t{k % tenants}",
                                        "demand": {"cpu": 1, "mem": 2}, "time": event_time})
                    pending_completion.append((now + hold, name))
                    k += 1
                while pending_completion and pending_completion[0][0] <= now:
                    _, done = pending_completion.popleft()
                    completions.append({"cluster": "bench", "task": done, "time": event_time})
                sender.add_events(topics.submitted, submissions)
                sender.add_events(topics.completed, completions)
                sent += len(submissions) + len(completions)
                await sender.flush()
                if now >= next_sample:
                    rss = _rss_mb(worker.pid)
                    if rss is not None:
                        memory.append((round(now - begin, 1), round(rss, 1)))
                    machine, worker_cpu = _cpu_times(), _process_cpu_s(worker.pid)
                    if last_sample is not None:
                        span = now - last_sample[0]
                        every_second["steal"].append(_share_pct(last_sample[1], machine))
                        every_second["idle"].append(_share_pct(last_sample[1], machine, _IDLE))
                        every_second["worker"].append(
                            round(100 * (worker_cpu - last_sample[2]) / span, 1)
                            if worker_cpu is not None and last_sample[2] is not None and span > 0 else None)
                    last_sample = (now, machine, worker_cpu)
                    next_sample += 1.0
            await sender.flush()
            await sender.wait()
            sent_total, messages_total = sent, sender.messages
            offered = sent / (time.monotonic() - begin)
            steal = _share_pct(cpu_before, _cpu_times())
        # Collect the submissions' append timestamps and the rest of the decisions.
        sub = AIOKafkaConsumer(bootstrap_servers=broker, enable_auto_commit=False)
        await sub.start()
        await sub._client.force_metadata_update()
        sub_parts = [TopicPartition(topics.submitted, p) for p in sorted(sub.partitions_for_topic(topics.submitted) or [0])]
        sub.assign(sub_parts)
        await sub.seek_to_beginning(*sub_parts)
        idle = 0
        while idle < 3:
            batch = await sub.getmany(timeout_ms=1000)
            idle = idle + 1 if not batch else 0
            for records in batch.values():
                for r in records:
                    doc = loads(r.value)
                    for event in doc if isinstance(doc, list) else [doc]:
                        submitted_at[event["task"]] = r.timestamp
        await sub.stop()
        wanted = set(submitted_at) - {"warm-up"}
        deadline = time.monotonic() + 120
        while not wanted <= set(decided_at) and time.monotonic() < deadline:
            for records in (await consumer.getmany(timeout_ms=1000)).values():
                for r in records:
                    decided_at.setdefault(_task_of(r.value), r.timestamp)
    finally:
        await consumer.stop()
        worker.terminate()
        try:
            worker.wait(20)
        except subprocess.TimeoutExpired:
            worker.kill()
        await _clean_up(broker, redis, app_id)
    latency = {t: decided_at[t] - submitted_at[t] for t in wanted if t in decided_at}
    latencies = list(latency.values())
    first = min(submitted_at[t] for t in wanted)
    by_second: dict[int, list[int]] = {}
    for t, ms in latency.items():
        by_second.setdefault((submitted_at[t] - first) // 1000, []).append(ms)
    last = max(decided_at[t] for t in latency)
    return {
        "benchmark": "stream",
        "setup": {"rate_target": rate, "duration_s": duration, "nodes": nodes, "tenants": tenants,
                  "hold_s": hold, "policy": policy, "finished_retention_s": retention,
                  "batch_window_s": batch_window, "events_per_message_max": per_message,
                  "send_interval_s": send_interval},
        "input_events": sent_total,
        "input_messages": messages_total,
        "events_per_message_mean": round(sent_total / max(messages_total, 1), 2),
        "decided": len(latencies),
        "undecided": len(wanted) - len(latencies),
        "events_per_s": round(sent_total / max((last - first) / 1000, 1e-9), 1),
        # What the generator sent per second: below the target rate by hold / (2 duration),
        # as completions start only after ``hold`` seconds; events_per_s equal to it means
        # the worker kept up.
        "offered_events_per_s": round(offered, 1),
        # When the worker stored a background snapshot, in seconds from the first submission
        # (the same origin as p99_ms_by_second's index).
        "snapshots_stored_s": _logged_at(log_path, "worker.snapshot_stored", first / 1000),
        "p50_ms": float(np.percentile(latencies, 50)) if latencies else None,
        "p99_ms": float(np.percentile(latencies, 99)) if latencies else None,
        "worker_rss_mb": memory,
        "cpu_steal_pct": steal,
        # Every second (between memory samples): the hypervisor's steal and the machine's idle
        # share, and the worker's CPU use (100 = one core), to tell a slow second caused by
        # the worker from one caused by a busy or contended machine.
        "cpu_steal_pct_by_second": every_second["steal"],
        "cpu_idle_pct_by_second": every_second["idle"],
        "worker_cpu_pct_by_second": every_second["worker"],
        # Latency over the run (99th percentile of submissions appended in each second):
        # shows when a backlog built up, which the overall percentiles do not.
        "p99_ms_by_second": [float(np.percentile(by_second[k], 99)) for k in sorted(by_second)],
    }


def bench_stream(rate: float = 5000, duration: float = 60, nodes: int = 200, tenants: int = 100, hold: float = 2.0,
                 policy: str = "ltrf", broker: str | None = None, redis: str | None = None,
                 retention: float = WorkerConfig.finished_retention, batch_window: float = WorkerConfig.batch_window, per_message: int = 1,
                 send_interval: float = 0.005) -> dict:
    if per_message < 1:
        raise ModelError(f"--events-per-message must be at least 1, not {per_message}")
    broker = broker or os.environ.get("FAIRSTREAM_BROKER", "127.0.0.1:9092")
    redis = redis or os.environ.get("FAIRSTREAM_REDIS_URL", "redis://127.0.0.1:6379/0")
    if not (_port_open(int(broker.rsplit(":", 1)[1])) and _port_open(int(redis.rsplit(":", 1)[1].split("/")[0]))):
        raise ModelError("bench stream needs Kafka and Redis: run scripts/services.sh start")
    log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"fairstream-bench-worker-{os.getpid()}.log"
    return asyncio.run(_run(broker, redis, rate, duration, nodes, tenants, hold, policy, log_path, retention, batch_window, per_message,
                            send_interval))
