"""Chaos drills: the worker under hostile input and outages, on a real Kafka and Redis.

Each drill starts a worker (``fairstream worker``, a process of its own), plays a cluster with
the emulator (``producers/emulator.py``: nodes, submissions, each placed task run for its
duration and completed), and does one bad thing meanwhile (``FAULTS``). Then it checks what
an operator would: every valid task placed once and completed (``lost``, ``placed_twice``), no
node over-committed, every hostile message dead-lettered with a reason, and the worker's
recorded input replayed by the simulator giving exactly the decisions it published. The
Redis drills run a Redis of their own (``redis-server`` on a free port), the others the one
given.

``fairstream drill`` runs them and prints a table; ``tests/live/test_drills.py`` runs each small
in CI; docs/benchmarks.md ("Drills") has the figures.
"""

from __future__ import annotations

import asyncio
import json
import os
import pickle
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from fairstream.core.model import ModelError
from fairstream.producers.client import Publisher
from fairstream.sim.scenario import Scenario, parse_scenario
from fairstream.wire.kafka import ensure_topics, kafka_security
from fairstream.wire.topics import Topics

CLUSTER = "drill"


@dataclass
class DrillReport:
    """What one drill measured (one row of ``fairstream drill``'s table)."""

    drill: str
    tasks: int
    messages: int = 0  # submissions, completions and hostile messages published (heartbeats aside)
    hostile: int = 0
    dead_letters: int = 0
    dead_letters_without_reason: int = 0
    lost: int = 0  # tasks never completed
    placed_twice: int = 0  # place decisions (distinct ids) beyond one per task
    over_committed: int = 0
    # The recorded input replays to exactly the published decisions: after a store that lost
    # writes too, rebuilt from Kafka by the journal's batches (docs/architecture.md, "Redis durability").
    replay_equal: bool = False
    recovery_s: float | None = None  # from the fault's end to the next decision published
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return (self.lost == 0 and self.placed_twice == 0 and self.over_committed == 0 and self.replay_equal
                and not self.notes
                and self.dead_letters >= self.hostile and self.dead_letters_without_reason == 0)

    def to_json(self) -> dict:
        return {**asdict(self), "passed": self.passed}


def drill_scenario(tasks: int, seed: int = 1) -> Scenario:
    """Four nodes and three tenants; a task every half second of event time, each asking for
    one cpu and two memory for 5 to 11 seconds: the cluster is busy but keeps up."""
    rng = random.Random(seed)
    return parse_scenario({
        "version": 1, "name": "drill", "resources": ["cpu", "mem"],
        "nodes": [{"id": f"n{k}", "capacity": {"cpu": 8, "mem": 16}} for k in range(4)],
        "tenants": [{"id": f"u{k}"} for k in range(3)],
        "tasks": [{"id": f"t{k}", "job": f"j{k // 10}", "tenant": f"u{k % 3}", "submit": k * 0.5,
                   "duration": 5 + rng.randrange(7), "demand": {"cpu": 1, "mem": 2}} for k in range(tasks)],
    })


# ------------------------------------------------------------------------------- hostile input

def poison_messages() -> list[tuple[str, bytes]]:
    """The issue's poison shapes, each of which once stalled a partition for good: (topic kind,
    raw message)."""
    good = {"cluster": CLUSTER, "task": "p", "job": "p", "tenant": "u0", "time": 1, "demand": {"cpu": 1}}

    def body(**changes) -> bytes:
        return json.dumps({**good, **changes}).encode()

    return [
        ("submitted", body(task="p-time-400-digits").replace(b'"time": 1', b'"time": ' + b"9" * 400)),
        ("submitted", body(task="p-int-5000-digits").replace(b'"time": 1', b'"time": ' + b"1" * 5000)),
        ("submitted", b"[" * 5000 + b"]" * 5000),
        ("submitted", body(task="p-surrogate").replace(b'"u0"', b'"\\ud800"')),
        ("submitted", body(task="p-huge-demand").replace(b'"cpu": 1}', b'"cpu": ' + b"9" * 300 + b"}")),
        ("heartbeat", json.dumps({"cluster": CLUSTER, "node": "p-node", "time": 1,
                                  "capacity": {"cpu": 1}}).encode().replace(b'"cpu": 1', b'"cpu": ' + b"9" * 300)),
    ]


def fuzzed_messages(count: int, seed: int = 7) -> list[tuple[str, bytes]]:
    """``count`` messages that are not valid events: random bytes, and valid submissions with
    one field broken (removed, mistyped, out of range, or a task id reused)."""
    rng = random.Random(seed)
    kinds = ("submitted", "completed", "heartbeat")
    breakers = [
        lambda d: d.pop("time"), lambda d: d.update(time="soon"), lambda d: d.update(time=-5),
        lambda d: d.update(demand={"cpu": -1}), lambda d: d.update(demand={"gpu": 1}), lambda d: d.update(demand=[]),
        lambda d: d.update(tenant=7), lambda d: d.update(task=None), lambda d: d.update(time=float("inf")),
        lambda d: d.update(demand={"cpu": 1e300}), lambda d: d.update(task="t0"),  # a duplicate of a valid task
    ]
    out = []
    for k in range(count):
        if k % 3 == 0:
            out.append((rng.choice(kinds), bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200)))))
            continue
        body = {"cluster": CLUSTER, "task": f"f{k}", "job": "f", "tenant": "u1", "time": 1, "demand": {"cpu": 1}}
        rng.choice(breakers)(body)
        out.append(("submitted", json.dumps(body, allow_nan=True).encode()))
    return out


def oversize_message() -> tuple[str, bytes]:
    """A legal 60 KB message of control characters: about six times that once escaped in a
    dead letter (the issue's 200 KB one was over the worker's 64 KiB input limit)."""
    return "submitted", json.dumps({"cluster": CLUSTER, "task": "x" + "\x01" * 60_000, "tenant": "u0",
                                    "time": 1, "demand": {"cpu": 1}}).encode()


# ------------------------------------------------------------------------------------ services

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """A Redis of the drill's own, persisted to ``dump.rdb`` in ``directory``."""

    def __init__(self, directory: Path) -> None:
        self.directory, self.port = directory, free_port()
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.directory),
             "--save", "", "--appendonly", "no"], stdout=subprocess.DEVNULL)
        _wait(lambda: _answers(self.port), 10, "redis-server to answer")
        return self

    def command(self, *args: str) -> str:
        return subprocess.run(["redis-cli", "-p", str(self.port), *args], capture_output=True, text=True,
                              check=True).stdout.strip()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()  # as a crash: nothing saved on the way out
            self.process.wait()


class WorkerProcess:
    """``fairstream worker`` in a process of its own, its log in ``directory``."""

    def __init__(self, app_id: str, broker: str, redis_url: str, directory: Path, *extra: str) -> None:
        self.app_id, self.broker, self.redis_url, self.directory, self.extra = app_id, broker, redis_url, directory, extra
        self.process: subprocess.Popen | None = None
        self.logs: list[Path] = []

    def start(self) -> WorkerProcess:
        log_path = self.directory / f"worker-{len(self.logs)}.log"
        self.logs.append(log_path)
        process = self.process = subprocess.Popen(
            [sys.executable, "-m", "fairstream.cli", "worker", "--policy", "drf", "--app-id", self.app_id,
             "--topic-prefix", self.app_id, "--broker", self.broker, "--redis", self.redis_url, "--metrics-port", "0",
             *self.extra], stdout=open(log_path, "w"), stderr=subprocess.STDOUT)
        _wait(lambda: "worker.partitions_assigned" in log_path.read_text() or process.poll() is not None,
              120, "the worker to be assigned its partitions")
        if process.poll() is not None:
            raise RuntimeError(f"the worker exited: {log_path.read_text()[-2000:]}")
        return self

    def kill9(self) -> None:
        assert self.process is not None  # (started)
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.kill9()

    def events(self, name: str) -> int:
        return sum(log.read_text().count(f'"event": "{name}"') for log in self.logs)


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def _wait(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout} s for {what}")
        time.sleep(0.1)


# -------------------------------------------------------------------------------------- faults

@dataclass
class Context:
    """What a fault can reach: the worker, the Redis it uses, the input topics."""

    worker: WorkerProcess
    redis: RedisServer | None
    topics: Topics
    broker: str
    speed: float
    directory: Path
    sent: Callable[[], int]  # decisions published so far (to act mid-run)
    hostile: int = 0
    fault_ended: float | None = None  # wall clock
    notes: list[str] = field(default_factory=list)

    @property
    def own_redis(self) -> RedisServer:
        """The Redis server the drill started (a fault on Redis needs one)."""
        assert self.redis is not None
        return self.redis


async def _publish_hostile(ctx: Context, messages: list[tuple[str, bytes]], spread: float = 3.0) -> None:
    topic = {"submitted": ctx.topics.submitted, "completed": ctx.topics.completed, "heartbeat": ctx.topics.heartbeats}
    async with Publisher(ctx.broker, ctx.topics) as pub:
        for k, (kind, raw) in enumerate(messages):
            # Keyed by the cluster: in the valid traffic's own partition, where a stall would show.
            await pub.send_raw(topic[kind], CLUSTER, raw)
            ctx.hostile += 1
            if k % max(1, len(messages) // 10) == 0:
                await asyncio.sleep(spread / 10)


async def _after_decisions(ctx: Context, count: int) -> None:
    while ctx.sent() < count:
        await asyncio.sleep(0.1)


async def fault_poison(ctx: Context, fuzz: list[tuple[str, bytes]] | None = None) -> None:
    """The poison shapes, 2,000 seeded fuzzed messages and ``fuzz`` (more, from hypothesis in
    the tests), keyed by the cluster: in the partitions of its valid traffic."""
    await _after_decisions(ctx, 5)
    await _publish_hostile(ctx, poison_messages() + fuzzed_messages(2000) + (fuzz or []))


async def fault_oversize(ctx: Context) -> None:
    await _after_decisions(ctx, 5)
    await _publish_hostile(ctx, [oversize_message()] * 3)


async def fault_far_future(ctx: Context) -> None:
    # With --node-timeout: a clock moved to 10^12 would declare every node lost.
    await _after_decisions(ctx, 5)
    await _publish_hostile(ctx, [("completed", json.dumps({"cluster": CLUSTER, "task": "nobody", "time": 1e12}).encode()),
                                 ("heartbeat", json.dumps({"cluster": CLUSTER, "node": "n0", "time": 1e12,
                                                           "capacity": {"cpu": 8, "mem": 16}}).encode())])


async def fault_kill_9(ctx: Context) -> None:
    # Down for longer than --max-lateness (60 s of event time by default) at the emulator's speed.
    await _after_decisions(ctx, 10)
    ctx.worker.kill9()
    await asyncio.sleep(90 / ctx.speed + 1)
    ctx.fault_ended = time.monotonic()  # recovery counts the new worker's joining the group
    await asyncio.to_thread(ctx.worker.start)


async def fault_redis_empty(ctx: Context) -> None:
    await _after_decisions(ctx, 10)
    ctx.own_redis.stop()
    await asyncio.to_thread(ctx.own_redis.start)  # nothing saved: it comes back empty
    ctx.fault_ended = time.monotonic()


async def fault_redis_older(ctx: Context) -> None:
    await _after_decisions(ctx, 10)
    ctx.own_redis.command("SAVE")  # the file it is restored from
    await _after_decisions(ctx, ctx.sent() + 15)
    ctx.own_redis.stop()
    await asyncio.to_thread(ctx.own_redis.start)  # loads dump.rdb: the state of 15 decisions ago
    ctx.fault_ended = time.monotonic()


async def fault_kill_9_redis_lost(ctx: Context, older: bool = False) -> None:
    # kill -9 while Kafka's committed offsets lag the journal (Faust commits every few
    # seconds), then Redis forgets while the worker is down: restarted empty, or from a file
    # saved 15 decisions before the kill.
    await _after_decisions(ctx, 10)
    if older:
        ctx.own_redis.command("SAVE")
        await _after_decisions(ctx, ctx.sent() + 15)
    ctx.worker.kill9()
    ctx.own_redis.stop()
    if not older:
        (ctx.directory / "dump.rdb").unlink(missing_ok=True)
    await asyncio.to_thread(ctx.own_redis.start)
    ctx.fault_ended = time.monotonic()
    await asyncio.to_thread(ctx.worker.start)


async def fault_kill_9_redis_older(ctx: Context) -> None:
    await fault_kill_9_redis_lost(ctx, older=True)


async def fault_planted_snapshot(ctx: Context) -> None:
    await _after_decisions(ctx, 10)
    ctx.worker.stop()
    marker = ctx.directory / "planted-ran"

    class Planted:
        def __reduce__(self):
            return os.system, (f"touch {marker}",)

    key = f"{ctx.worker.app_id}:c:{CLUSTER}:snapshot"
    blob = pickle.dumps(Planted())
    import redis

    client = redis.Redis.from_url(ctx.worker.redis_url)
    try:
        steps = client.llen(f"{ctx.worker.app_id}:c:{CLUSTER}:log")
        client.set(key, blob)
        client.set(f"{ctx.worker.app_id}:c:{CLUSTER}:snapshot_steps", steps)
    finally:
        client.close()
    ctx.fault_ended = time.monotonic()
    await asyncio.to_thread(ctx.worker.start)
    await _after_decisions(ctx, ctx.sent() + 5)
    if marker.exists():
        ctx.notes.append("the planted snapshot ran code")
    if ctx.worker.events("worker.snapshot_unreadable") < 1:
        ctx.notes.append("the planted snapshot was not reported unreadable")


async def fault_kafka_restart(ctx: Context) -> None:
    # The broker of scripts/services.sh (this project's checkout), stopped and started with its data.
    script = Path(__file__).resolve().parents[2] / "scripts" / "services.sh"
    if not script.exists():
        raise ModelError(f"the kafka-restart drill restarts the broker with {script}, which this install lacks")
    await _after_decisions(ctx, 10)
    done = await asyncio.to_thread(subprocess.run, ["bash", str(script), "restart-kafka"], capture_output=True,
                                   text=True)
    if done.returncode != 0:  # (it refuses a broker this checkout did not start: its one line says so)
        said = (done.stderr.strip() or done.stdout.strip() or f"exit {done.returncode}").splitlines()[-1]
        raise ModelError(f"kafka-restart: scripts/services.sh restart-kafka failed: {said}")
    ctx.fault_ended = time.monotonic()


FAULTS: dict[str, tuple[Callable, tuple[str, ...], bool]] = {
    # name: (fault, extra worker flags, whether it needs a Redis of its own)
    "poison": (fault_poison, (), False),
    "oversize": (fault_oversize, (), False),
    "far-future": (fault_far_future, ("--node-timeout", "120"), False),
    "kill-9": (fault_kill_9, (), False),
    "redis-empty": (fault_redis_empty, (), True),
    "redis-older": (fault_redis_older, (), True),
    "kill-9-redis-empty": (fault_kill_9_redis_lost, (), True),
    "kill-9-redis-older": (fault_kill_9_redis_older, (), True),
    "planted-snapshot": (fault_planted_snapshot, (), False),
    "kafka-restart": (fault_kafka_restart, (), False),
}


# ------------------------------------------------------------------------------------ the drill

def run_drill(name: str, broker: str = "127.0.0.1:9092", redis_url: str = "redis://127.0.0.1:6379/0",
              tasks: int = 150, speed: float = 20.0, directory: Path | None = None, timeout: float = 240.0,
              **fault_options) -> DrillReport:
    """Run drill ``name`` (one of ``FAULTS``) and check its outcome."""
    fault, flags, own_redis = FAULTS[name]
    scratch = Path(directory or tempfile.mkdtemp(prefix=f"drill-{name}-"))
    scratch.mkdir(parents=True, exist_ok=True)
    app_id = f"drill{uuid.uuid4().hex[:8]}"
    topics = Topics().with_prefix(app_id)
    scenario = drill_scenario(tasks)
    report = DrillReport(name, tasks)
    redis = RedisServer(scratch).start() if own_redis else None
    worker = WorkerProcess(app_id, broker, redis.url if redis else redis_url, scratch, *flags)
    started = time.monotonic()
    try:
        asyncio.run(ensure_topics(broker, topics.names, 4))
        worker.start()
        decided = _DecisionCounter(broker, topics)
        ctx = Context(worker, redis, topics, broker, speed, scratch, decided.count)
        emulated = asyncio.run(_play(scenario, topics, broker, speed, timeout, decided, fault(ctx, **fault_options)))
        report.hostile, report.notes = ctx.hostile, ctx.notes
        report.over_committed = len(emulated.over_committed)
        report.lost = tasks - emulated.completed
        report.messages = emulated.submitted + emulated.completed + ctx.hostile
        # The emulator ends with its last task, while the worker may still be on input after it
        # (a hostile message published last) or publishing what it committed: wait for both.
        behind = asyncio.run(_until_caught_up(broker, topics, worker.redis_url, app_id, timeout=60))
        if behind:
            report.notes.append(f"the worker did not catch up within 60 s: {behind}")
        worker.stop()
        decisions = asyncio.run(_read(broker, topics.decisions))
        dead = asyncio.run(_read(broker, topics.deadletter))
        report.dead_letters = len(dead)
        report.dead_letters_without_reason = sum(1 for _, d in dead if not d.get("reason"))
        places: dict[str, set[str]] = {}
        for _, d in decisions:
            if d.get("kind") == "place":
                places.setdefault(d["task"], set()).add(d["id"])
        report.placed_twice = sum(len(ids) - 1 for ids in places.values())
        if ctx.fault_ended is not None:
            after = [stamp for stamp, _ in decisions if stamp >= ctx.fault_ended]
            report.recovery_s = round(min(after) - ctx.fault_ended, 2) if after else None
        published = {d["id"]: d for _, d in decisions}
        replayed = _replayed(worker, scratch)
        report.replay_equal = set(replayed) == set(published)
    finally:
        worker.stop()
        if redis is not None:
            redis.stop()
        report.seconds = round(time.monotonic() - started, 1)
    if directory is None:
        shutil.rmtree(scratch, ignore_errors=True)
    return report


class _DecisionCounter:
    """How many decisions the worker has published, read from the topic in the background."""

    def __init__(self, broker: str, topics: Topics) -> None:
        self.broker, self.topics, self.seen = broker, topics, 0

    def count(self) -> int:
        return self.seen

    async def follow(self, stop: asyncio.Event) -> None:
        from aiokafka import AIOKafkaConsumer

        consumer = AIOKafkaConsumer(self.topics.decisions, bootstrap_servers=self.broker, group_id=None,
                                    auto_offset_reset="earliest", enable_auto_commit=False, **kafka_security())
        await consumer.start()
        try:
            while not stop.is_set():
                batch = await consumer.getmany(timeout_ms=200)
                self.seen += sum(len(records) for records in batch.values())
        finally:
            await consumer.stop()


async def _play(scenario, topics, broker, speed, timeout, decided: _DecisionCounter, fault):
    from fairstream.producers.emulator import run_emulator

    stop = asyncio.Event()
    follower = asyncio.create_task(decided.follow(stop))
    faulting = asyncio.create_task(fault)
    try:
        report = await run_emulator(scenario, CLUSTER, broker, topics, speed=speed, heartbeat_interval=30.0,
                                    replay=True, timeout=timeout)
        await asyncio.wait_for(faulting, timeout=60)
        return report
    finally:
        stop.set()
        faulting.cancel()
        await asyncio.gather(follower, faulting, return_exceptions=True)


async def _until_caught_up(broker: str, topics: Topics, redis_url: str, app_id: str, timeout: float) -> str:
    """Wait until the worker's store has applied every input message Kafka holds and its outbox
    is empty (everything it committed published). Returns "" then, else what is still behind."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    from fairstream.state.store import RedisStore, redis_client

    consumer = AIOKafkaConsumer(bootstrap_servers=broker, group_id=None, enable_auto_commit=False, **kafka_security())
    await consumer.start()
    client = redis_client(redis_url)
    store = RedisStore(client, prefix=app_id)
    deadline = time.monotonic() + timeout
    try:
        counts = await ensure_topics(broker, list(topics.inputs))
        ends = await consumer.end_offsets([TopicPartition(t, p) for t in topics.inputs for p in range(counts[t])])
        wanted = {f"{tp.topic}:{tp.partition}": end for tp, end in ends.items() if end}
        while True:
            applied, outbox = await store.offsets(), await store.outbox()
            behind = {position: end - applied.get(position, 0) for position, end in wanted.items()
                      if applied.get(position, 0) < end}
            if not behind and not outbox:
                return ""
            if time.monotonic() > deadline:
                return f"unapplied per partition {behind}, {len(outbox)} batches unpublished"
            await asyncio.sleep(0.1)
    finally:
        await consumer.stop()
        await client.aclose()


async def _read(broker: str, topic: str) -> list[tuple[float, dict]]:
    """Every message of ``topic`` up to its current end: (when the broker got it, on the
    ``time.monotonic`` clock the faults use; its JSON body)."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    offset = time.time() - time.monotonic()  # record timestamps are epoch milliseconds
    consumer = AIOKafkaConsumer(bootstrap_servers=broker, group_id=None, enable_auto_commit=False, **kafka_security())
    await consumer.start()
    out = []
    try:
        partitions = [TopicPartition(topic, p) for p in range((await ensure_topics(broker, [topic]))[topic])]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        ends = await consumer.end_offsets(partitions)
        while [tp for tp in partitions if await consumer.position(tp) < ends[tp]]:
            for records in (await consumer.getmany(timeout_ms=1000)).values():
                out += [(r.timestamp / 1000 - offset, json.loads(r.value)) for r in records]
    finally:
        await consumer.stop()
    return out


def _replayed(worker: WorkerProcess, scratch: Path) -> dict[str, dict]:
    """The decisions the worker's recorded input gives when replayed by the simulator, by id."""
    log = scratch / "input.jsonl"
    subprocess.run([sys.executable, "-m", "fairstream.cli", "export-log", "--cluster", CLUSTER, "--app-id",
                    worker.app_id, "--redis", worker.redis_url, "--out", str(log)], check=True, capture_output=True)
    out = scratch / "replay"
    subprocess.run([sys.executable, "-m", "fairstream.cli", "simulate", "--events", str(log), "--policy", "drf",
                    "--resources", "cpu,mem", "--cluster", CLUSTER, "--out", str(out), "--no-progress"],
                   check=True, capture_output=True)
    decisions = (json.loads(line) for line in (out / "decisions.jsonl").read_text().splitlines())
    return {d["id"]: d for d in decisions}


def print_table(reports: list[DrillReport]) -> str:
    columns = ("drill", "tasks", "messages", "hostile", "dead_letters", "lost", "placed_twice", "over_committed",
               "replay_equal", "recovery_s", "seconds", "passed")
    rows = [[str(r.to_json()[c]) for c in columns] for r in reports]
    widths = [max(len(c), *(len(row[i]) for row in rows)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths)) for row in rows]
    return "\n".join(lines)
