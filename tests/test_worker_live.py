"""The streaming worker on a real Kafka broker and a real Redis server (started by
``scripts/services.sh``, which this module calls; nothing is mocked). Each test uses its own
topic prefix, consumer group and Redis key prefix."""

import asyncio
import json
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from fairstream.producers.client import Publisher, read_topic
from fairstream.streams.processor import Topics

ROOT = Path(__file__).resolve().parents[1]
BROKER = "127.0.0.1:9092"
REDIS = "redis://127.0.0.1:6379/0"

pytestmark = pytest.mark.live


@pytest.fixture(scope="module", autouse=True)
def services():
    subprocess.run(["bash", str(ROOT / "scripts" / "services.sh"), "start"], check=True, capture_output=True)


def free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Worker:
    def __init__(self, app_id, tmp_path, *extra):
        self.app_id, self.tmp_path, self.extra = app_id, tmp_path, extra
        self.metrics_port = free_port()
        self.process = None

    def start(self):
        log = open(self.tmp_path / f"worker-{time.monotonic_ns()}.log", "w")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "fairstream.cli", "worker", "--policy", "drf", "--app-id", self.app_id,
             "--topic-prefix", self.app_id, "--broker", BROKER, "--redis", REDIS,
             "--metrics-port", str(self.metrics_port), *self.extra],
            stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        return self

    def kill9(self):
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self):
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.kill9()


async def collect(topic, want, timeout=90.0, key=lambda m: True):
    """Read ``topic`` from the beginning until ``want(messages)`` or the timeout."""
    deadline = time.monotonic() + timeout
    seen = []
    async for message in read_topic(BROKER, topic, from_beginning=True, idle_timeout=1.0):
        seen.append(message)
        if want(seen):
            return seen
    while time.monotonic() < deadline:
        seen = [m async for m in read_topic(BROKER, topic, from_beginning=True, idle_timeout=1.0)]
        if want(seen):
            return seen
        await asyncio.sleep(0.5)
    return seen


def placed(decisions):
    """Place decisions, counted once per decision id (ids make republishing idempotent)."""
    unique = {d["id"]: d for d in decisions if d.get("kind") == "place"}
    return list(unique.values())


def test_events_from_our_client_and_from_kcat_are_decided_and_bad_input_is_dead_lettered(tmp_path):
    app_id = f"t{uuid.uuid4().hex[:8]}"
    topics = Topics().with_prefix(app_id)
    worker = Worker(app_id, tmp_path).start()
    try:
        async def scenario():
            async with Publisher(BROKER, topics) as pub:
                await pub.heartbeat("c1", "n1", 0, {"cpu": 8, "mem": 16})
                for k in range(3):
                    await pub.submit("c1", f"t{k}", tenant="A" if k % 2 else "B", demand={"cpu": 1, "mem": 2}, time=1)
                await pub.send_raw(topics.submitted, "c1", b'{"cluster": "c1", "task": ')  # malformed JSON
                await pub.complete("c1", "ghost", time=1)  # completion of an unknown task
            # A client we did not write: kcat.
            kcat = json.dumps({"cluster": "c1", "task": "from-kcat", "tenant": "K", "demand": {"cpu": 1, "mem": 1}, "time": 2})
            subprocess.run(["kcat", "-P", "-b", BROKER, "-t", topics.submitted, "-k", "c1"], input=kcat.encode(), check=True)
            decisions = await collect(topics.decisions, lambda ms: len(placed(ms)) >= 4)
            dead = await collect(topics.deadletter, lambda ms: len(ms) >= 2)
            return decisions, dead

        decisions, dead = asyncio.run(scenario())
        import urllib.request

        scraped = urllib.request.urlopen(f"http://127.0.0.1:{worker.metrics_port}/metrics", timeout=5).read().decode()
    finally:
        worker.stop()
    assert 'fairstream_decisions_total{kind="place"} 4.0' in scraped
    assert "fairstream_dead_letters_total" in scraped and "fairstream_consumer_lag" in scraped
    assert sorted(d["task"] for d in placed(decisions)) == ["from-kcat", "t0", "t1", "t2"]
    assert all(d["cluster"] == "c1" and d["node"] == "n1" and d["policy"] == "drf" for d in decisions)
    reasons = sorted(d["reason"] for d in dead)
    assert any("malformed JSON" in r for r in reasons) and any("completion of an unknown task" in r for r in reasons)


def test_kill_9_and_restart_loses_nothing_places_nothing_twice_and_replays_to_the_same_decisions(tmp_path):
    app_id = f"t{uuid.uuid4().hex[:8]}"
    topics = Topics().with_prefix(app_id)
    worker = Worker(app_id, tmp_path).start()

    async def publish_wave(pub, wave, start):
        for k in range(10):
            await pub.submit("c1", f"w{wave}-{k}", tenant=f"u{k % 3}", demand={"cpu": 1, "mem": 1}, time=start)

    try:
        async def first():
            async with Publisher(BROKER, topics) as pub:
                await pub.heartbeat("c1", "n1", 0, {"cpu": 8, "mem": 8})
                await publish_wave(pub, 0, 1)
            return await collect(topics.decisions, lambda ms: len(placed(ms)) >= 8)

        before = asyncio.run(first())
        worker.kill9()

        async def while_down():
            # The cluster goes on: the 8 running tasks finish and more arrive while no worker runs.
            async with Publisher(BROKER, topics) as pub:
                for d in placed(before):
                    await pub.complete("c1", d["task"], time=5)
                await publish_wave(pub, 1, 6)

        asyncio.run(while_down())
        worker = Worker(app_id, tmp_path).start()
        after = asyncio.run(collect(topics.decisions, lambda ms: len(placed(ms)) >= 16))
    finally:
        worker.stop()

    tasks = [d["task"] for d in placed(after)]
    assert len(tasks) == len(set(tasks)) == 16, "every task placed once, whatever was republished"

    # The worker's recorded input, replayed by the simulator, gives exactly its decisions.
    log = tmp_path / "input.jsonl"
    subprocess.run([sys.executable, "-m", "fairstream.cli", "export-log", "--cluster", "c1", "--app-id", app_id,
                    "--redis", REDIS, "--out", str(log)], check=True, cwd=ROOT)
    out = tmp_path / "replay"
    subprocess.run([sys.executable, "-m", "fairstream.cli", "simulate", "--events", str(log), "--policy", "drf",
                    "--cluster", "c1", "--out", str(out)], check=True, cwd=ROOT, capture_output=True)
    replayed = [json.loads(line) for line in (out / "decisions.jsonl").read_text().splitlines()]
    emitted = {}  # first occurrence of each id, in topic order (one cluster: one partition)
    for d in after:
        emitted.setdefault(d["id"], d)
    assert [d["id"] for d in replayed] == list(emitted)
    assert [(d["task"], d["node"], d["kind"]) for d in replayed] == [(d["task"], d["node"], d["kind"]) for d in emitted.values()]


def test_a_fb2009_sample_through_kafka_with_the_emulator_matches_the_simulator(tmp_path):
    from fairstream.producers.emulator import run_emulator
    from fairstream.state.store import RedisStore, redis_client
    from fairstream.traces import load_trace

    app_id = f"t{uuid.uuid4().hex[:8]}"
    topics = Topics().with_prefix(app_id)
    scenario = load_trace(str(ROOT / "tests" / "data" / "FB-2009_samples_24_times_1hr_1.head60.tsv"), "swim",
                          limit=12, nodes=2, tenants=3)
    worker = Worker(app_id, tmp_path, "--max-lateness", "1e9").start()
    try:
        report = asyncio.run(run_emulator(scenario, "fb", BROKER, topics, speed=50, timeout=240))
    finally:
        worker.stop()
    assert report.completed == report.placed == len(scenario.tasks), report.to_json()
    assert report.over_committed == []

    # The worker's accumulated usage in Redis equals the simulator's on the same (recorded) input.
    log = tmp_path / "input.jsonl"
    subprocess.run([sys.executable, "-m", "fairstream.cli", "export-log", "--cluster", "fb", "--app-id", app_id,
                    "--redis", REDIS, "--out", str(log)], check=True, cwd=ROOT)
    out = tmp_path / "replay"
    subprocess.run([sys.executable, "-m", "fairstream.cli", "simulate", "--events", str(log), "--policy", "drf",
                    "--out", str(out)], check=True, cwd=ROOT, capture_output=True)
    simulated = json.loads((out / "usage.json").read_text())

    async def from_redis():
        client = redis_client(REDIS)
        try:
            store = RedisStore(client, prefix=app_id)
            return {name: await store.view("fb", name) for name in simulated}
        finally:
            await client.aclose()

    stored = asyncio.run(from_redis())
    assert set(stored["usage:0"]) == {"q0", "q1", "q2"}
    for tenant, usage in simulated["usage:0"].items():
        assert stored["usage:0"][tenant]["raw"] == pytest.approx(usage["raw"])
        assert stored["usage:0"][tenant]["counted"] == pytest.approx(usage["counted"])


def test_the_worker_runs_with_kafka_sasl_and_redis_auth_over_tls_and_logs_no_secret(tmp_path, monkeypatch):
    # Kafka: the SASL/PLAIN listener of scripts/services.sh. Redis: a second real server with
    # TLS (a self-signed certificate made here) and a password, on a free port, for this test.
    redis_port = free_port()
    redis_secret, kafka_secret = "redis-test-secret", "fairstream-test-secret"
    redis_dir = tmp_path / "redis"
    redis_dir.mkdir()
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    redis = subprocess.Popen(["redis-server", "--port", "0", "--tls-port", str(redis_port), "--tls-cert-file", str(cert),
                              "--tls-key-file", str(key), "--tls-ca-cert-file", str(cert), "--tls-auth-clients", "no",
                              "--bind", "127.0.0.1", "--requirepass", redis_secret, "--save", "", "--dir", str(redis_dir)],
                             stdout=subprocess.DEVNULL)
    redis_url = f"rediss://:{redis_secret}@127.0.0.1:{redis_port}/0?ssl_ca_certs={cert}"
    env = {"FAIRSTREAM_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT", "FAIRSTREAM_KAFKA_SASL_MECHANISM": "PLAIN",
           "FAIRSTREAM_KAFKA_SASL_USERNAME": "fairstream", "FAIRSTREAM_KAFKA_SASL_PASSWORD": kafka_secret}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    sasl_broker = "127.0.0.1:9094"
    app_id = f"t{uuid.uuid4().hex[:8]}"
    topics = Topics().with_prefix(app_id)
    log_path = tmp_path / "secure-worker.log"
    with open(log_path, "w") as log:
        worker = subprocess.Popen(
            [sys.executable, "-m", "fairstream.cli", "worker", "--policy", "drf", "--app-id", app_id, "--topic-prefix", app_id,
             "--broker", sasl_broker, "--redis", redis_url, "--metrics-port", "0"],
            stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        async def scenario():
            async with Publisher(sasl_broker, topics) as pub:  # reads the same FAIRSTREAM_KAFKA_* variables
                await pub.heartbeat("secure", "n1", 0, {"cpu": 2, "mem": 2})
                await pub.submit("secure", "s1", "A", {"cpu": 1, "mem": 1}, 1)
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline:
                seen = [m async for m in read_topic(sasl_broker, topics.decisions, idle_timeout=1.0)]
                if seen:
                    return seen
            return []

        decisions = asyncio.run(scenario())
    finally:
        worker.terminate()
        worker.wait(20)
        redis.terminate()
        redis.wait(10)
    # A decision is published only after its batch was committed to Redis: it crossed both.
    assert [d["task"] for d in decisions] == ["s1"]
    text = log_path.read_text()
    assert "worker.start" in text and "***" in text, text[-2000:]
    assert redis_secret not in text and kafka_secret not in text


def test_the_redis_store_commits_atomically_and_removes_exactly_the_published_outbox_entries():
    from fairstream.state.store import BatchCommit, RedisStore, redis_client

    async def scenario():
        client = redis_client(REDIS)
        store = RedisStore(client, prefix=f"t{uuid.uuid4().hex[:8]}")
        try:
            mine = ("allocations.decisions", {"id": "place:a@1.0", "cluster": "c", "time": 1.5})
            theirs = ("events.deadletter", {"topic": "tasks.submitted", "reason": "malformed JSON: x"})
            await store.commit(BatchCommit(steps={"c": [{"time": 1.0, "events": []}]}, offsets={"s:0": 7},
                                           outbox=[theirs, mine], views={"c": {"quanta": {"A": "11.0"}}}))
            await store.clear_outbox([mine])
            return (await store.outbox(), await store.offsets(), await store.full_log("c"),
                    await store.view("c", "quanta"), await store.clusters())
        finally:
            await client.aclose()

    outbox, offsets, log, quanta, clusters = asyncio.run(scenario())
    assert outbox == [("events.deadletter", {"topic": "tasks.submitted", "reason": "malformed JSON: x"})]
    assert offsets == {"s:0": 7} and log == [{"time": 1.0, "events": []}]
    assert quanta == {"A": 11.0} and clusters == ["c"]
