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
import shlex
import subprocess
import sys
import time
import uuid
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np

from fairstream.core.model import ModelError
from fairstream.producers.client import Publisher
from fairstream.streams.config import WorkerConfig
from fairstream.wire.jsoncodec import dumps, loads
from fairstream.wire.kafka import ensure_topics
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


def _process_cpu_s(pid: int | str) -> float | None:
    """CPU seconds (user + system) process ``pid`` (or ``"pid/task/tid"``, a thread) has used,
    or None if unreadable."""
    try:
        # Fields after the command name (which may hold spaces); utime and stime are 14th and 15th.
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _thread_cpu_s(pid: int) -> tuple[float, float] | None:
    """CPU seconds of process ``pid``'s main thread and of its other threads (Faust's consumer
    thread fetches there), or None if unreadable."""
    main = other = 0.0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    for tid in tasks:
        cpu = _process_cpu_s(f"{pid}/task/{tid}")
        if cpu is None:
            continue
        if tid == str(pid):
            main = cpu
        else:
            other += cpu
    return main, other


def _service_pids() -> dict[str, list[int]]:
    """Pids of the machine's Kafka broker and Redis server (by command line), to show what
    they took of the cores the worker shares with them."""
    found: dict[str, list[int]] = {"kafka": [], "redis": []}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            command = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if b"kafka.Kafka" in command:
            found["kafka"].append(int(entry))
        elif command.startswith(b"redis-server") or b"/redis-server" in command.split(b"\0", 1)[0]:
            found["redis"].append(int(entry))
    return found


def python_loop_ms() -> float:
    """The machine's speed as the bench saw it: the fastest of three runs of a fixed pure-Python
    loop, in milliseconds (this VM's speed varies run to run; set figures beside it)."""
    def loop() -> int:
        total = 0
        for i in range(1_000_000):
            total += i * i % 7
        return total

    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        loop()
        best = min(best, time.perf_counter() - started)
    return round(best * 1000, 1)


async def _scrape(port: int) -> dict[str, float]:
    """The worker's Prometheus counters of where batches' time goes (``streams/stages.py``):
    ``{"cpu:<stage>": s, "wall:<stage>": s, "events": n, "batches": n}``."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        await writer.drain()
        body = (await reader.read()).decode(errors="replace")
    finally:
        writer.close()
    values: dict[str, float] = {}
    names = {"fairstream_stage_cpu_seconds_total": "cpu", "fairstream_stage_wall_seconds_total": "wall"}
    for line in body.splitlines():
        if line.startswith("#") or " " not in line:
            continue
        name, _, value = line.rpartition(" ")
        metric, _, labels = name.partition("{")
        if metric in names and 'stage="' in labels:
            stage = labels.split('stage="')[1].split('"')[0]
            values[f"{names[metric]}:{stage}"] = float(value)
        elif metric == "fairstream_input_events_applied_total":
            values["events"] = float(value)
        elif metric == "fairstream_batches_applied_total":
            values["batches"] = float(value)
    return values


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _CpuSplit:
    """The worker's, the services' and the load generator's CPU time, and the worker's stage
    counters, read at the start and the end of the load."""

    def __init__(self, worker_pid: int, metrics_port: int) -> None:
        self.worker_pid, self.metrics_port = worker_pid, metrics_port
        self.services = _service_pids()
        self.start: dict | None = None

    async def read(self) -> dict:
        return {"at": time.monotonic(), "machine": _cpu_times(), "worker": _process_cpu_s(self.worker_pid),
                "threads": _thread_cpu_s(self.worker_pid), "self": time.process_time(),
                "services": {name: sum(_process_cpu_s(p) or 0.0 for p in pids) for name, pids in self.services.items()},
                "stages": await _scrape(self.metrics_port)}

    async def begin(self) -> None:
        self.start = await self.read()

    async def end(self) -> dict:
        """Per input event applied in between: main-thread CPU microseconds per stage, the rest
        of the worker's main thread and its other threads; the worker's CPU share; each
        process's share of the machine; and per batch, each stage's wall milliseconds."""
        a, b = self.start, await self.read()
        assert a is not None
        events = b["stages"].get("events", 0) - a["stages"].get("events", 0)
        batches = b["stages"].get("batches", 0) - a["stages"].get("batches", 0)
        span = b["at"] - a["at"]
        if events <= 0 or span <= 0:
            return {}

        def delta(key: str) -> float:
            return b["stages"].get(key, 0.0) - a["stages"].get(key, 0.0)

        stages = sorted({k.split(":", 1)[1] for k in b["stages"] if ":" in k})
        cpu_us = {s: round(1e6 * delta(f"cpu:{s}") / events, 1) for s in stages if delta(f"cpu:{s}") > 0}
        out: dict = {"events": int(events), "batches": int(batches), "events_per_batch": round(events / max(batches, 1), 1),
                     "stage_cpu_us_per_event": cpu_us}
        if a["threads"] and b["threads"]:
            main = b["threads"][0] - a["threads"][0]
            out["main_thread_rest_us_per_event"] = round(1e6 * main / events - sum(cpu_us.values()), 1)
            out["other_threads_us_per_event"] = round(1e6 * (b["threads"][1] - a["threads"][1]) / events, 1)
        if a["worker"] is not None and b["worker"] is not None:
            out["worker_us_per_event"] = round(1e6 * (b["worker"] - a["worker"]) / events, 1)
            out["worker_cpu_pct"] = round(100 * (b["worker"] - a["worker"]) / span, 1)
        out["stage_wall_ms_per_batch"] = {s: round(1e3 * delta(f"wall:{s}") / max(batches, 1), 2) for s in stages
                                          if delta(f"wall:{s}") > 0}
        # Of the machine's cores (100 = one core): who used them.
        machine = {"worker": out.get("worker_cpu_pct"),
                   "load_generator": round(100 * (b["self"] - a["self"]) / span, 1)}
        for name in a["services"]:
            machine[name] = round(100 * (b["services"][name] - a["services"][name]) / span, 1)
        idle = _share_pct(a["machine"], b["machine"], _IDLE)
        if idle is not None:
            machine["idle"] = round(idle * (os.cpu_count() or 1), 1)
        out["cpu_pct_of_a_core"] = machine
        return out


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
        self.open: dict[str, Any] = {}  # per topic, aiokafka's batch being filled
        self.ready: list[tuple[str, Any]] = []
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
               send_interval: float, worker_args: str) -> dict:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    app_id = f"bench{uuid.uuid4().hex[:8]}"
    topics = Topics().with_prefix(app_id)
    # The broker stamps each record when it appends it (LogAppendTime), so the latency is from
    # a submission's append to its decision's, whatever delays either producer had before.
    await ensure_topics(broker, topics.names, config={"message.timestamp.type": "LogAppendTime"})
    metrics_port = _free_port()
    with open(log_path, "w") as log:
        worker = subprocess.Popen(
            [sys.executable, "-m", "fairstream.cli", "worker", "--policy", policy, "--app-id", app_id,
             "--topic-prefix", app_id, "--broker", broker, "--redis", redis, "--metrics-port", str(metrics_port),
             "--max-lateness", "1e9", "--finished-retention", str(retention), "--batch-window", str(batch_window),
             *shlex.split(worker_args)], stdout=log, stderr=subprocess.STDOUT)
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
            split = _CpuSplit(worker.pid, metrics_port)
            await split.begin()
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
        where_time_goes = await split.end()
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
                  "send_interval_s": send_interval, "worker_args": worker_args},
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
        # Where the worker's time went while the load ran (streams/stages.py): main-thread CPU
        # per input event in each stage of applying batches, the rest of the main thread
        # (Faust's delivery, aiokafka's producer, the event loop), its other threads (the
        # consumer's fetches), who used the machine's cores, and each stage's wall time a batch.
        "where_time_goes": where_time_goes,
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
                 send_interval: float = 0.005, worker_args: str = "") -> dict:
    if per_message < 1:
        raise ModelError(f"--events-per-message must be at least 1, not {per_message}")
    broker = broker or os.environ.get("FAIRSTREAM_BROKER", "127.0.0.1:9092")
    redis = redis or os.environ.get("FAIRSTREAM_REDIS_URL", "redis://127.0.0.1:6379/0")
    if not (_port_open(int(broker.rsplit(":", 1)[1])) and _port_open(int(redis.rsplit(":", 1)[1].split("/")[0]))):
        raise ModelError("bench stream needs Kafka and Redis: run scripts/services.sh start")
    log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"fairstream-bench-worker-{os.getpid()}.log"
    speed = python_loop_ms()
    result = asyncio.run(_run(broker, redis, rate, duration, nodes, tenants, hold, policy, log_path, retention,
                              batch_window, per_message, send_interval, worker_args))
    result["python_loop_ms"] = speed  # the machine's speed just before (lower is faster)
    return result


def saturation_curve(runs: list[dict]) -> dict:
    """Runs at several rates as one document: each run whole (``runs``) and, per offered rate,
    what the worker kept, its latency and its CPU share (``curve``): where it saturates."""
    curve = []
    for run in runs:
        where = run.get("where_time_goes") or {}
        curve.append({"rate_target": run["setup"]["rate_target"], "offered_events_per_s": run["offered_events_per_s"],
                      "events_per_s": run["events_per_s"], "undecided": run["undecided"], "p50_ms": run["p50_ms"],
                      "p99_ms": run["p99_ms"], "worker_cpu_pct": where.get("worker_cpu_pct"),
                      "worker_us_per_event": where.get("worker_us_per_event"), "cpu_steal_pct": run["cpu_steal_pct"]})
    return {"benchmark": "stream-curve", "python_loop_ms": [run.get("python_loop_ms") for run in runs],
            "curve": curve, "runs": runs}
