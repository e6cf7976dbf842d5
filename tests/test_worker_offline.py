"""The worker's processing without Kafka or Redis: the processor with the in-memory store, and
the Faust agents through ``test_context``. The same behaviour on real Kafka and Redis is in
``test_worker_live.py``."""

import asyncio
import dataclasses
import json
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest

from fairstream.state.store import MemoryStore
from fairstream.streams.app import WorkerConfig, create_app
from fairstream.streams.processor import Incoming, Processor
from fairstream.wire.topics import Topics

TOPIC = {"submitted": "tasks.submitted", "completed": "tasks.completed", "heartbeat": "nodes.heartbeats"}


class Wire:
    """Builds input messages with increasing offsets and collects what the worker publishes."""

    def __init__(self):
        self.offsets = {}
        self.published = []
        self.journal = []  # what a processor that can read again journals (streams/journal.py)

    def msg(self, kind, body, raw=None, produced=0.0, key=None):
        """The next message of ``kind``'s topic; ``produced``: its record timestamp (s);
        ``key``: its Kafka key (None: sent without one)."""
        offset = self.offsets.get(kind, 0)
        self.offsets[kind] = offset + 1
        data = raw if raw is not None else json.dumps(body).encode()
        return Incoming(kind, data, TOPIC[kind], 0, offset, produced, key)

    async def publish(self, topic, key, message):
        if topic == Topics().journal:  # the broker acknowledges it at once, with its offset
            self.journal.append(message)
            sent = asyncio.get_running_loop().create_future()
            sent.set_result(SimpleNamespace(partition=0, offset=len(self.journal) - 1))
            return sent
        self.published.append((topic, key, message))

    def decisions(self):
        return [m for t, _, m in self.published if t == "allocations.decisions"]

    def dead(self):
        return [m for t, _, m in self.published if t == "events.deadletter"]


def heartbeat(node="n1", time=0, cluster="c1", **capacity):
    return {"cluster": cluster, "node": node, "time": time, "capacity": capacity or {"cpu": 4, "mem": 8}}


def task(name, tenant="A", time=0, cluster="c1", **demand):
    return {"cluster": cluster, "task": name, "job": "j", "tenant": tenant, "time": time, "demand": demand or {"cpu": 1, "mem": 1}}


def done(name, time, cluster="c1"):
    return {"cluster": cluster, "task": name, "time": time, "status": "succeeded"}


def processor(store=None, wire=None, **options):
    config = WorkerConfig(policy="ltrf", params={"resource": "mem"})
    return Processor(store or MemoryStore(), config.make_engine, wire.publish, Topics(), **options)


async def until(condition, timeout: float = 5.0) -> None:
    """Wait (on the event loop) until ``condition()`` holds; fail after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        assert loop.time() < deadline, "timed out waiting"
        await asyncio.sleep(0.001)


def run(coroutine):
    return asyncio.run(coroutine)


def test_submissions_on_a_known_node_are_decided_and_published_with_their_cluster():
    wire = Wire()

    async def scenario():
        p = processor(wire=wire)
        await p.handle([wire.msg("heartbeat", heartbeat()), wire.msg("submitted", task("t1")), wire.msg("submitted", task("t2", "B"))])

    run(scenario())
    decisions = wire.decisions()
    assert [(d["cluster"], d["task"], d["node"], d["kind"]) for d in decisions] == [("c1", "t1", "n1", "place"), ("c1", "t2", "n1", "place")]
    assert {"id", "cluster", "task", "job", "tenant", "node", "demand", "time", "policy"} <= set(decisions[0])


BAD_INPUTS = [
    pytest.param("completed", done("ghost", 2), None, "completion of an unknown task", id="completion of an unknown task"),
    pytest.param("submitted", task("t1", time=2), None, "duplicate submission", id="duplicate submission"),
    pytest.param("submitted", task("neg", time=2, mem=-1), None, "demand.mem", id="negative demand"),
    pytest.param("submitted", {k: v for k, v in task("nodemand", time=2).items() if k != "demand"}, None, "'demand' is a required property", id="missing demand"),
    pytest.param("submitted", task("gpu", time=2, gpu=1), None, "demand.gpu: unknown resource", id="unknown resource name"),
    pytest.param("submitted", task("old", time=0), None, "behind the cluster clock", id="an event too far in the past"),
    pytest.param("submitted", None, b'{"cluster": "c1", "task": ', "malformed JSON", id="malformed JSON"),
    pytest.param("submitted", None, b"\xff\xfe\x00", "malformed JSON", id="bytes that are not UTF-8"),
    pytest.param("heartbeat", {"cluster": "c1", "node": 7, "time": 2, "capacity": {"mem": 1}}, None, "node: 7 is not of type 'string'", id="wrong types"),
    pytest.param("submitted", None, b"{" + b" " * 70000 + b"}", "oversize message", id="oversize message"),
    # Poison shapes that once escaped the decoder and stalled the partition (issue: hostile input).
    pytest.param("submitted", None, b'{"cluster":"c1","task":"p","tenant":"A","demand":{"cpu":1},"time":' + b"9" * 400
                 + b"}", "number is infinity", id="a time of 400 digits"),
    pytest.param("submitted", None, b'{"cluster":"c1","task":"p","tenant":"A","demand":{"cpu":1},"time":2,"x":'
                 + b"9" * 5000 + b"}", "number is infinity", id="an integer of 5,000 digits"),
    pytest.param("submitted", None, b"[" * 5000 + b"]" * 5000, "depth limit exceeded", id="JSON nested 5,000 deep"),
    pytest.param("submitted", None, b'{"cluster":"c1","task":"\\ud800","tenant":"A","demand":{"cpu":1},"time":2}',
                 "surrogate", id="a lone surrogate escape in a string"),
    pytest.param("submitted", task("big", time=2, cpu=1e300), None, "demand.cpu: 1e+300 is greater than the maximum",
                 id="a demand beyond the largest number an event may carry"),
    pytest.param("heartbeat", heartbeat("n2", time=2, cpu=1e16, mem=1), None, "capacity.cpu: 1e+16 is greater than the maximum",
                 id="a capacity beyond the largest number an event may carry"),
    pytest.param("submitted", {**task("r", time=2), "count": 0}, None, "count: 0 is less than the minimum of 1",
                 id="a request of no tasks"),
    pytest.param("submitted", {**task("r", time=2), "count": 2.5}, None, "count: 2.5 is not of type 'integer'",
                 id="a request of a fractional count"),
    pytest.param("submitted", {**task("r", time=2), "count": 10**8}, None, "count: 100000000 is greater than the maximum",
                 id="a request beyond the largest count"),
    pytest.param("submitted", {**task("m", time=2), "constraints": {"max_per_node": 0}}, None,
                 "constraints.max_per_node: 0 is less than the minimum of 1", id="a max_per_node of no tasks"),
    pytest.param("submitted", {**task("m", time=2), "constraints": {"max_per_node": "1"}}, None,
                 "constraints.max_per_node: '1' is not of type 'integer'", id="a max_per_node that is not a number"),
]


@pytest.mark.parametrize("kind, body, raw, reason", BAD_INPUTS)
def test_bad_input_goes_to_the_dead_letter_topic_and_the_worker_keeps_going(kind, body, raw, reason):
    wire = Wire()

    async def scenario():
        p = processor(wire=wire, max_lateness=0.5)
        await p.handle([wire.msg("heartbeat", heartbeat()), wire.msg("submitted", task("t1"))])
        await p.handle([wire.msg("heartbeat", heartbeat(time=2)), wire.msg(kind, body, raw), wire.msg("submitted", task("after", time=2))])

    run(scenario())
    dead = wire.dead()
    assert len(dead) == 1 and reason in dead[0]["reason"]
    assert dead[0]["topic"] == TOPIC[kind] and ("original" in dead[0] or "original_base64" in dead[0])
    assert "after" in [d["task"] for d in wire.decisions()]  # still deciding afterwards


LATE_EVENTS = [
    # The cluster: n1 (1 cpu, 1 GB) runs t1 from time 0; at time 100 (produced at 10 s)
    # "waiting" arrives and does not fit. Then an event of time 0, 100 s behind the clock
    # (max_lateness 0.5 s), produced at the time given.
    pytest.param("submitted", task("old", time=0), 30.0, "dead", None,
                 id="a submission its producer sent after the events that moved the clock is a dead letter"),
    pytest.param("submitted", task("old", time=0), 5.0, "applied", None,
                 id="a submission produced before those events, read late (catching up), is applied at the clock"),
    pytest.param("heartbeat", heartbeat("n2", time=0, cpu=1, mem=1), 5.0, "applied", "n2",
                 id="a node's heartbeat produced before those events is applied at the clock and runs what waits"),
    pytest.param("heartbeat", heartbeat("n2", time=0, cpu=1, mem=1), 30.0, "dead", None,
                 id="a heartbeat its producer sent late is a dead letter"),
    pytest.param("completed", done("t1", 0), 30.0, "applied", "n1",
                 id="a completion is applied at the clock however late it was sent: its task's resources come back"),
]


@pytest.mark.parametrize("kind, body, produced, outcome, waiting_on", LATE_EVENTS)
def test_an_event_far_behind_the_clock_is_a_dead_letter_only_when_its_producer_sent_it_late(
        kind, body, produced, outcome, waiting_on):
    wire = Wire()

    async def scenario():
        p = processor(wire=wire, max_lateness=0.5, step_window=0.0)
        await p.handle([wire.msg("heartbeat", heartbeat(cpu=1, mem=1), produced=1.0),
                        wire.msg("submitted", task("t1", cpu=1, mem=1), produced=1.0)])
        await p.handle([wire.msg("heartbeat", heartbeat(time=100, cpu=1, mem=1), produced=10.0),
                        wire.msg("submitted", task("waiting", time=100, cpu=1, mem=1), produced=10.0)])
        await p.handle([wire.msg(kind, body, produced=produced)])
        return p.sessions["c1"].engine

    engine = run(scenario())
    dead = wire.dead()
    if outcome == "dead":
        assert len(dead) == 1 and "produced after the events that moved the clock" in dead[0]["reason"]
    else:
        assert dead == []
    if body.get("task") == "old":
        assert ("old" in engine.tasks) == (outcome == "applied")
    placed = {d["task"]: (d["node"], d["time"]) for d in wire.decisions() if d["kind"] == "place"}
    assert placed.get("waiting") == ((waiting_on, 100.0) if waiting_on else None)


@pytest.mark.parametrize("kind, body, produced, reason", [
    # The issue's drill: a completion of a task nobody submitted, at t = 10^12.
    pytest.param("completed", done("nobody", 1e12), 11.0, "ahead of the cluster clock",
                 id="a completion of an unknown task at 10^12 is a dead letter and moves nothing"),
    # An hour ahead, within max_ahead: only the engine's own check keeps it off the clock.
    pytest.param("completed", done("nobody", 3700), 11.0, "completion of an unknown task",
                 id="an event the engine rejects moves nothing, even within max_ahead"),
    pytest.param("submitted", task("far", time=1e12), 11.0, "ahead of the cluster clock",
                 id="a valid event more than max_ahead ahead of the clock is a dead letter and moves nothing"),
    pytest.param("submitted", task("later", time=100 + 2 * 86400), 10.0 + 2 * 86400, None,
                 id="a jump as long as its producer's clock moved (a quiet cluster resuming) is applied"),
])
def test_an_event_far_ahead_of_the_clock_cannot_move_it(kind, body, produced, reason):
    # A cluster at t = 100 (produced at 10 s) with --node-timeout 60: a clock moved to 10^12
    # would declare every node lost, and every later event would be far behind it.
    wire = Wire()

    async def scenario():
        p = processor(wire=wire, max_lateness=0.5, step_window=0.0, node_timeout=60.0)
        await p.handle([wire.msg("heartbeat", heartbeat(time=100), produced=10.0)])
        await p.handle([wire.msg(kind, body, produced=produced)])
        clock = p.sessions["c1"].engine.time
        await p.handle([wire.msg("heartbeat", heartbeat(time=clock + 1), produced=produced + 1),
                        wire.msg("submitted", task("next", time=clock + 1), produced=produced + 1)])
        return clock

    clock = run(scenario())
    dead = [d["reason"] for d in wire.dead()]
    placed = [d["task"] for d in wire.decisions() if d["kind"] == "place"]
    if reason is None:
        assert dead == [] and clock == body["time"] and placed == ["later", "next"]
    else:
        assert len(dead) == 1 and reason in dead[0] and clock == 100.0
        assert placed == ["next"] and not [d for d in wire.decisions() if d["kind"] == "requeue"]


def test_a_restarted_worker_still_tells_an_event_read_late_from_one_sent_late():
    # The latest record timestamp a cluster applied is kept with its state (the "clock" view):
    # after a restart, an event produced before it is still applied at the clock, not dropped.
    wire, store = Wire(), MemoryStore()

    async def scenario():
        first = processor(store=store, wire=wire, max_lateness=0.5, step_window=0.0)
        await first.handle([wire.msg("heartbeat", heartbeat(cpu=1, mem=1), produced=1.0),
                            wire.msg("submitted", task("t1", cpu=1, mem=1), produced=1.0)])
        await first.handle([wire.msg("submitted", task("waiting", time=100, cpu=1, mem=1), produced=10.0)])
        restarted = processor(store=store, wire=wire, max_lateness=0.5, step_window=0.0)
        await restarted.handle([wire.msg("heartbeat", heartbeat("n2", time=0, cpu=1, mem=1), produced=5.0)])
        return await store.view("c1", "clock")

    clock = run(scenario())
    assert wire.dead() == [] and clock == {"time": 100.0, "produced": 10.0}
    assert [(d["task"], d["node"]) for d in wire.decisions()] == [("t1", "n1"), ("waiting", "n2")]


@pytest.mark.parametrize("raw, truncated", [
    # 200 KB of control characters in a JSON string: six bytes each once escaped, 1.2 MB in all.
    pytest.param(b'{"cluster": "c1", "task": "' + b"\x01" * 200_000 + b'"}', True,
                 id="200 KB of control characters is cut, with its length and hash"),
    pytest.param(b"\xff" * 100_000, True, id="100 KB that is not UTF-8 is cut before base64"),
    pytest.param(b'{"cluster": "c1", "task": ', False, id="a short original is kept whole"),
])
def test_a_dead_letter_is_small_enough_to_publish_whatever_the_input(raw, truncated):
    import hashlib

    import jsonschema

    from fairstream.wire.jsoncodec import dumps

    wire = Wire()
    run(processor(wire=wire, max_bytes=1 << 20).handle([wire.msg("submitted", None, raw=raw)]))
    [dead] = wire.dead()
    schema = json.loads((Path(__file__).parents[1] / "fairstream" / "schemas" / "deadletter.schema.json").read_text())
    jsonschema.validate(dead, schema)
    assert len(dumps(dead)) < 120_000  # under a producer's 1 MB however it escapes
    if truncated:
        assert dead["original_truncated"] is True and dead["original_bytes"] == len(raw)
        assert dead["original_sha256"] == hashlib.sha256(raw).hexdigest()
    else:
        assert dead["original"] == raw.decode() and "original_truncated" not in dead


@pytest.mark.parametrize("key, applied", [
    pytest.param(b"c1", True, id="a message keyed by its cluster is applied"),
    pytest.param(None, True, id="a message sent without a key is applied (one worker reads every partition)"),
    pytest.param(b"c2", False, id="a message keyed by another cluster is a dead letter naming both"),
])
def test_the_message_key_is_checked_against_the_events_cluster(key, applied):
    wire = Wire()
    run(processor(wire=wire).handle([wire.msg("heartbeat", heartbeat()), wire.msg("submitted", task("t1"), key=key)]))
    assert ([d["task"] for d in wire.decisions()] == ["t1"]) == applied
    assert [d["reason"] for d in wire.dead()] == ([] if applied else [
        "message key b'c2' is not the event's cluster 'c1' (key a cluster's events by its id)"])


def test_at_most_max_engines_stay_in_memory_and_an_evicted_cluster_recovers_from_the_store_unchanged():
    # Five clusters, one batch each, then a second round: by then the first ones were evicted
    # (cap 2) and are recovered from the store; the decisions are those of an uncapped worker.
    def batches(wire):
        rounds = []
        for cluster in ("c0", "c1", "c2", "c3", "c4"):
            rounds.append([wire.msg("heartbeat", heartbeat(cluster=cluster, cpu=2, mem=2), key=cluster.encode()),
                           *(wire.msg("submitted", task(f"{cluster}-t{k}", time=1, cluster=cluster), key=cluster.encode())
                             for k in range(3))])
        for cluster in ("c0", "c1", "c2", "c3", "c4"):  # t0 done: t2, waiting, takes its place
            rounds.append([wire.msg("completed", done(f"{cluster}-t0", 5, cluster=cluster), key=cluster.encode())])
        return rounds

    async def scenario(wire, **options):
        p = processor(wire=wire, **options)
        cached = []
        for batch in batches(wire):
            await p.handle(batch)
            cached.append(len(p.sessions))
        return cached

    capped, unbounded = Wire(), Wire()
    cached = run(scenario(capped, max_engines=2))
    run(scenario(unbounded))
    assert max(cached) == 2
    assert capped.decisions() == unbounded.decisions() and capped.dead() == unbounded.dead() == []
    assert sum(d["kind"] == "place" for d in capped.decisions()) == 15  # 2 + the third, per cluster


def test_a_request_with_a_count_is_one_message_and_its_placements_one_decision_per_node():
    wire = Wire()

    store = MemoryStore()

    async def scenario():
        p = processor(store, wire=wire)
        # 100,000 maps in one message; two nodes of 4 GB take 8 of them, 4 to a decision.
        await p.handle([wire.msg("heartbeat", heartbeat("n1", cpu=4, mem=4)), wire.msg("heartbeat", heartbeat("n2", cpu=4, mem=4)),
                        wire.msg("submitted", {**task("j1-m", time=1), "count": 100_000})])
        await p.handle([wire.msg("completed", done("j1-m-0", 2)), wire.msg("completed", done("j1-m-5", 2))])
        # A restarted worker recovers the request from the store's log, where it is one entry.
        restarted = processor(store, wire=wire)
        await restarted.handle([wire.msg("completed", done("j1-m-1", 3))])
        return p

    p = run(scenario())
    assert wire.decisions()[-1]["task"] == "j1-m-10"
    log = run(store.full_log("c1"))
    assert [event.get("count") for step in log.steps for event in step["events"]] == [None, None, 100_000, None, None, None]
    wire.published = wire.published[:-1]
    first, second = wire.decisions()[:2], wire.decisions()[2:]
    assert [(d["node"], d["count"], d["tasks"]) for d in first] == [
        ("n1", 4, [f"j1-m-{k}" for k in range(4)]), ("n2", 4, [f"j1-m-{k}" for k in range(4, 8)])]
    assert first[0]["id"] == "place:j1-m-0*4@1.0>n1"
    # Each task completes by its own id; the freed slots take the request's next two tasks.
    assert [(d["task"], d["node"], d.get("count", 1)) for d in second] == [("j1-m-8", "n1", 1), ("j1-m-9", "n2", 1)]
    engine = p.sessions["c1"].engine
    assert engine.pending["A"].count == 100_000 - 10 and len(engine.tasks) == 8  # pending: one entry
    assert p.metrics.decisions.labels("place")._value.get() == 10  # the metric counts tasks
    assert wire.dead() == []


def test_a_batch_message_is_applied_as_its_events_one_by_one():
    # The same input as single messages and as JSON arrays (a job's tasks, an agent's
    # completions) gives the same decisions, in the same order.
    singles, batched = Wire(), Wire()
    tasks = [task(f"t{k}", "AB"[k % 2], time=1, cpu=1, mem=3) for k in range(5)]
    completions = [done("t0", 2), done("t1", 2)]

    async def scenario():
        one = processor(wire=singles)
        await one.handle([singles.msg("heartbeat", heartbeat())] + [singles.msg("submitted", t) for t in tasks])
        await one.handle([singles.msg("completed", c) for c in completions])
        many = processor(wire=batched)
        await many.handle([batched.msg("heartbeat", [heartbeat()]), batched.msg("submitted", tasks)])
        await many.handle([batched.msg("completed", completions)])

    run(scenario())
    assert batched.decisions() == singles.decisions()
    assert [d["task"] for d in batched.decisions()] == ["t0", "t1", "t2", "t3"]  # n1 holds 8 mem: two wait, then two more start
    assert batched.dead() == singles.dead() == []


BAD_ELEMENTS = [
    pytest.param([task("ok1", time=2), task("neg", time=2, mem=-1), task("ok2", time=2)], 1, "demand.mem", id="an element the schema refuses"),
    pytest.param([task("ok1", time=2), task("t1", time=2), task("ok2", time=2)], 1, "duplicate submission", id="an element the engine refuses"),
    pytest.param([task("ok1", time=2), task("ok2", time=2), task("old", time=0)], 2, "behind the cluster clock", id="an element too far in the past"),
    pytest.param([task("ok1", time=2), 7, task("ok2", time=2)], 1, "is not of type 'object'", id="an element that is not an object"),
]


@pytest.mark.parametrize("elements, index, reason", BAD_ELEMENTS)
def test_a_bad_element_of_a_batch_is_a_dead_letter_of_its_own_and_the_others_are_applied(elements, index, reason):
    wire = Wire()

    async def scenario():
        p = processor(wire=wire, max_lateness=0.5)
        await p.handle([wire.msg("heartbeat", heartbeat()), wire.msg("submitted", task("t1"))])
        await p.handle([wire.msg("heartbeat", heartbeat(time=2)), wire.msg("submitted", elements)])

    run(scenario())
    dead = wire.dead()
    assert len(dead) == 1 and reason in dead[0]["reason"] and dead[0]["reason"].startswith(f"[{index}]")
    assert dead[0]["index"] == index and json.loads(dead[0]["original"]) == elements[index]  # the element, not the batch
    assert {"ok1", "ok2"} <= {d["task"] for d in wire.decisions()}


def test_an_empty_batch_is_a_dead_letter():
    wire = Wire()

    async def scenario():
        await processor(wire=wire).handle([wire.msg("submitted", [])])

    run(scenario())
    assert [(d["reason"], d["original"]) for d in wire.dead()] == [("empty batch: a JSON array of events needs at least one", "[]")]


def test_redelivered_messages_are_skipped_by_offset():
    wire = Wire()

    async def scenario():
        p = processor(wire=wire)
        batch = [wire.msg("heartbeat", heartbeat()), wire.msg("submitted", task("t1"))]
        await p.handle(batch)
        outcome = await p.handle(batch)  # Kafka delivers the same offsets again
        return outcome

    outcome = run(scenario())
    assert outcome.skipped == 2 and [d["task"] for d in wire.decisions()] == ["t1"]


def test_a_restarted_worker_resumes_from_the_store_with_the_same_accumulated_usage():
    store, wire = MemoryStore(), Wire()

    async def first_life():
        p = processor(store, wire, snapshot_every=2)
        await p.handle([wire.msg("heartbeat", heartbeat(cpu=2, mem=2))])
        for t in range(1, 6):
            await p.handle([wire.msg("submitted", task(f"a{t}", "A", t)), wire.msg("submitted", task(f"b{t}", "B", t))])
            await p.handle([wire.msg("completed", done(f"a{t}", t + 0.5)), wire.msg("completed", done(f"b{t}", t + 0.5))])
        return p.sessions["c1"].engine.accounting.usage_key(0, 6.0), await store.view("c1", "usage:0")

    before, view = run(first_life())

    async def second_life():
        p = processor(store, wire, snapshot_every=2)
        await p.start()
        engine = (await p.session("c1")).engine
        return engine.accounting.usage_key(0, 6.0)

    assert run(second_life()) == pytest.approx(before)
    assert view["A"]["raw"]["mem"] > 0
    tasks = [d["task"] for d in wire.decisions()]
    assert len(tasks) == len(set(tasks)) == 10


SNAPSHOT_RULE = [
    # One event per step: a heartbeat, four submissions, four completions. After step k the
    # engine holds tasks + remembered finished ids = 0, 1, 2, 3, 4, 4, 4, 4, 4.
    pytest.param(1, 2.0, 5, 1, id="the empty engine after the heartbeat is snapshotted at once"),
    # From step 2 on the log holds k - 1 events; it first reaches 2 x 4 at step 9.
    pytest.param(1, 2.0, 8, 1, id="a log shorter than twice the state waits"),
    pytest.param(1, 2.0, 9, 9, id="a log of twice the state is snapshotted"),
    pytest.param(1, 0.0, 5, 5, id="ratio 0 snapshots every snapshot_every steps"),
    # A new cluster's first batch is snapshotted whatever the rule (tools read the cluster's
    # state from it); after that, never before snapshot_every steps.
    pytest.param(50, 0.0, 9, 1, id="a new cluster's first batch, then never before snapshot_every steps"),
]


@pytest.mark.parametrize("every, ratio, events, snapshot_step", SNAPSHOT_RULE)
def test_a_snapshot_is_taken_when_the_log_since_the_last_outweighs_the_state(every, ratio, events, snapshot_step):
    store, wire = MemoryStore(), Wire()
    plan = [("heartbeat", heartbeat(cpu=8, mem=8))] + [("submitted", task(f"t{k}", time=1)) for k in range(4)]
    plan += [("completed", done(f"t{k}", 2 + k)) for k in range(4)]

    async def scenario():
        p = processor(store, wire, snapshot_every=every, snapshot_ratio=ratio)
        for kind, body in plan[:events]:
            await p.handle([wire.msg(kind, body)])
        return (await store.load("c1")).snapshot_steps

    assert run(scenario()) == snapshot_step


def test_log_retention_keeps_between_r_and_1_25_r_of_log_and_the_kept_log_replays_from_its_base():
    from fairstream.state.engine_snapshot import decode_engine
    from fairstream.wire.log import replay

    store, wire, retention = MemoryStore(), Wire(), 20.0

    async def first_life():
        p = processor(store, wire, snapshot_every=1, log_retention=retention)
        await p.handle([wire.msg("heartbeat", heartbeat(cpu=2, mem=2))])
        for t in range(1, 100):  # one step per second of event time
            await p.handle([wire.msg("submitted", task(f"a{t}", "A", t)), wire.msg("completed", done(f"a{t - 1}", t))]
                           if t > 1 else [wire.msg("submitted", task("a1", "A", 1))])
        return p.sessions["c1"].engine.accounting.usage_key(0, 99.0)

    usage = run(first_life())
    kept = run(store.full_log("c1"))
    record = run(store.load("c1"))
    first_kept = kept.steps[0]["time"]
    # Checkpoints every R/4 = 5 s; the base is the newest one at least R old: 99 - 20 = 79 -> 75 or later.
    assert 99 - 1.25 * retention - 1 <= first_kept <= 99 - retention + 1
    assert kept.base_steps > 0 and kept.base_snapshot is not None
    assert len(record.checkpoints) <= 6
    # Replaying the kept log from its base gives exactly the decisions the worker took since.
    engine = decode_engine(kept.base_snapshot)
    replayed = [d.to_json() for result in replay(engine, kept.steps) for d in result.decisions]
    emitted = [{k: v for k, v in d.items() if k != "cluster"} for d in wire.decisions() if d["time"] >= first_kept]
    assert replayed == emitted and replayed
    # And a restarted worker resumes from the trimmed store with the same accumulated usage.

    async def second_life():
        p = processor(store, wire, snapshot_every=1, log_retention=retention)
        await p.start()
        return (await p.session("c1")).engine.accounting.usage_key(0, 99.0)

    assert run(second_life()) == pytest.approx(usage)


def test_a_silent_node_is_lost_its_tasks_requeued_and_nothing_placed_there():
    wire = Wire()

    async def scenario():
        p = processor(wire=wire, node_timeout=10)
        await p.handle([wire.msg("heartbeat", heartbeat("n1", 0)), wire.msg("heartbeat", heartbeat("n2", 0, mem=1)),
                        wire.msg("submitted", task("t1", time=0, mem=8))])
        await p.handle([wire.msg("heartbeat", heartbeat("n2", 12, mem=1)), wire.msg("submitted", task("t2", time=12, mem=1))])

    run(scenario())
    kinds = [(d["task"], d["kind"], d["node"]) for d in wire.decisions()]
    assert ("t1", "requeue", "n1") in kinds
    assert ("t2", "place", "n2") in kinds and not any(k == "place" and n == "n1" for t, k, n in kinds[1:])


def test_faust_agents_hand_messages_to_the_processor_via_test_context():
    async def scenario():
        config = WorkerConfig(policy="drf")
        app, proc = create_app(config, MemoryStore())
        wire = Wire()
        proc.outputs.publish = wire.publish
        agents = {a.name.rsplit(".", 1)[-1]: a for a in app.agents.values()}
        async with agents["heartbeat"].test_context() as hb:
            await hb.put(json.dumps(heartbeat()).encode(), key=b"c1")
            await until(lambda: proc.applied)  # put() returns once the agent has the event
        async with agents["submitted"].test_context() as sub:
            await sub.put(json.dumps(task("t1")).encode(), key=b"c1")
            await sub.put(b"not json", key=b"c1")
            await until(lambda: wire.decisions() and wire.dead())
        return wire

    wire = run(scenario())
    assert [d["task"] for d in wire.decisions()] == ["t1"]
    assert [d["reason"][:14] for d in wire.dead()] == ["malformed JSON"]


def test_the_worker_counts_events_decisions_dead_letters_and_latency_for_prometheus():
    wire = Wire()

    async def scenario():
        p = processor(wire=wire)
        await p.handle([wire.msg("heartbeat", heartbeat()), wire.msg("submitted", task("t1")), wire.msg("submitted", None, b"{")])
        return p.metrics

    metrics = run(scenario())
    sample = metrics.registry.get_sample_value
    assert sample("fairstream_events_total", {"topic": "tasks.submitted"}) == 2
    assert sample("fairstream_events_total", {"topic": "nodes.heartbeats"}) == 1
    assert sample("fairstream_decisions_total", {"kind": "place"}) == 1
    assert sample("fairstream_dead_letters_total", {"topic": "tasks.submitted"}) == 1
    assert sample("fairstream_decision_latency_seconds_count") == 1


def test_consumer_lag_is_what_kafka_holds_past_the_store_offsets_when_scraped():
    from fairstream.streams.app import consumer_lag

    class Consumer:  # Faust's consumer as the gauge reads it
        highwaters = {("tasks.submitted", 0): 120, ("tasks.submitted", 1): 40, ("nodes.heartbeats", 0): None,
                      ("allocations.decisions", 0): 99}

        def assignment(self):
            from faust.types import TP

            return {TP(t, n) for t, n in self.highwaters}

        def highwater(self, tp):
            return self.highwaters[(tp.topic, tp.partition)]

    p = processor(wire=Wire())
    p.metrics.watch_lag(lambda: consumer_lag(SimpleNamespace(consumer=Consumer()), p, set(Topics().inputs)))
    sample = p.metrics.registry.get_sample_value
    p.applied = {"tasks.submitted:0": 100, "tasks.submitted:1": 40}
    assert sample("fairstream_consumer_lag", {"topic": "tasks.submitted", "partition": "0"}) == 20
    assert sample("fairstream_consumer_lag", {"topic": "tasks.submitted", "partition": "1"}) == 0
    # Not fetched yet, or not an input: not reported.
    assert sample("fairstream_consumer_lag", {"topic": "nodes.heartbeats", "partition": "0"}) is None
    assert sample("fairstream_consumer_lag", {"topic": "allocations.decisions", "partition": "0"}) is None
    p.applied["tasks.submitted:0"] = 120  # caught up: read at the next scrape, not at the last batch
    assert sample("fairstream_consumer_lag", {"topic": "tasks.submitted", "partition": "0"}) == 0


def test_the_worker_reports_every_garbage_collector_pause_by_generation():
    import gc

    from fairstream.streams.prometheus import WorkerMetrics

    metrics = WorkerMetrics()
    stop = metrics.watch_gc()
    try:
        gc.collect(0)
        gc.collect(2)
    finally:
        stop()
    gc.collect(1)  # no longer observed
    count = lambda generation: metrics.registry.get_sample_value("fairstream_gc_pause_seconds_count", {"generation": generation})
    assert (count("0"), count("1"), count("2")) == (1, 0, 1)
    assert metrics.registry.get_sample_value("fairstream_gc_pause_seconds_sum", {"generation": "2"}) > 0


def test_the_worker_freezes_its_start_up_objects_and_makes_full_collections_rare():
    import gc

    from fairstream.streams.run import FULL_COLLECTION_AFTER, tune_gc

    before = gc.get_threshold()
    try:
        tune_gc()
        assert gc.get_freeze_count() > 10_000  # the modules, classes and functions loaded so far
        assert gc.get_threshold() == (before[0], before[1], FULL_COLLECTION_AFTER)
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


def test_after_a_rebalance_the_worker_reloads_clusters_from_the_store():
    store, wire = MemoryStore(), Wire()

    async def scenario():
        p = processor(store, wire)
        await p.handle([wire.msg("heartbeat", heartbeat()), wire.msg("submitted", task("t1"))])
        other = processor(store, wire)  # another worker got the partition and went on
        await other.handle([wire.msg("submitted", task("t2", time=1))])
        await p.forget()  # partitions revoked from the first worker...
        await p.handle([wire.msg("submitted", task("t3", time=2))])  # ...and assigned back
        return sorted((await p.session("c1")).engine.tasks)

    assert run(scenario()) == ["t1", "t2", "t3"]
    assert [d["task"] for d in wire.decisions()] == ["t1", "t2", "t3"]


@pytest.mark.parametrize("url, shown", [
    pytest.param("redis://:s3cret@cache:6379/0", "redis://:***@cache:6379/0", id="a password alone is masked"),
    pytest.param("rediss://app:s3cret@cache:6380/1", "rediss://app:***@cache:6380/1", id="user and password: the password is masked"),
    pytest.param("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0", id="a URL without credentials is unchanged"),
    pytest.param("redis://cache:6379/0?password=s3cret", "redis://cache:6379/0?password=***",
                 id="a password in the query is masked"),
    pytest.param("rediss://app:s3@cret@cache:6380/0?ssl_ca_certs=/etc/ca.pem&password=s3cret",
                 "rediss://app:***@cache:6380/0?ssl_ca_certs=/etc/ca.pem&password=***",
                 id="a password holding an at sign is masked whole, and so is one in the query"),
    pytest.param("redis://app@cache/0", "redis://app@cache/0", id="a user without a password is unchanged"),
])
def test_redis_urls_are_logged_without_their_password(url, shown):
    from fairstream.streams.run import redact

    assert redact(url) == shown and "s3cret" not in redact(url) and "cret@" not in redact(url)


def test_a_tenants_file_gives_the_worker_its_tree_and_a_bad_one_is_one_line(tmp_path):
    from fairstream.core.model import ModelError
    from fairstream.sim.scenario import load_tenant_tree

    good = tmp_path / "tenants.json"
    good.write_text(json.dumps({"tenants": [{"id": "org"}, {"id": "a", "parent": "org", "weight": 3}, {"id": "b", "parent": "org"}]}))
    tree = load_tenant_tree(str(good))
    assert tree.path("a") == ("org", "a") and tree.effective_share == {"a": 0.75, "b": 0.25}
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"tenants": [{"id": "a", "parent": "nowhere"}]}))
    with pytest.raises(ModelError, match=r"tenants\[a\]\.parent: unknown tenant 'nowhere'"):
        load_tenant_tree(str(bad))


def test_a_failed_commit_leaves_nothing_half_applied_and_the_redelivery_is_applied_once():
    class FlakyStore(MemoryStore):
        fail = True

        async def commit(self, batch):
            if self.fail and batch.steps.get("c1") and len(batch.steps["c1"]) and any(
                    e.get("task") == "t2" for s in batch.steps["c1"] for e in s["events"]):
                self.fail = False
                raise ConnectionError("redis went away")
            await super().commit(batch)

    store, wire = FlakyStore(), Wire()

    async def scenario():
        p = processor(store, wire)
        await p.handle([wire.msg("heartbeat", heartbeat()), wire.msg("submitted", task("t1"))])
        batch = [wire.msg("submitted", task("t2", time=1))]
        with pytest.raises(ConnectionError):
            await p.handle(batch)
        await p.handle(batch)  # Kafka delivers the uncommitted message again
        return sorted((await p.session("c1")).engine.tasks)

    assert run(scenario()) == ["t1", "t2"]
    assert [d["task"] for d in wire.decisions()] == ["t1", "t2"] and wire.dead() == []


def test_clearing_the_outbox_removes_only_the_batches_this_worker_published():
    # Workers of one consumer group share the outbox: one batch is one field, cleared alone.
    async def scenario():
        store = MemoryStore()
        from fairstream.state.store import BatchCommit

        theirs = [("allocations.decisions", {"id": "b", "time": 2.0}), ("allocations.decisions", {"id": "c", "time": 2.0})]
        mine = [("allocations.decisions", {"id": "a", "time": 1.0})]
        await store.commit(BatchCommit(outbox=theirs))
        await store.commit(BatchCommit(outbox=mine))
        await store.clear_outbox([mine])
        return await store.outbox()

    assert run(scenario()) == [[("allocations.decisions", {"id": "b", "time": 2.0}),
                                ("allocations.decisions", {"id": "c", "time": 2.0})]]


def test_a_worker_that_lost_its_cluster_to_another_cannot_append_to_the_log_and_skips_what_the_other_applied():
    # A rebalance moved the partition from worker "old" to worker "new" while "old" was not
    # yet told (a long pause). Both read the same partition; the log must stay one history,
    # every message applied once, every task decided once.
    from fairstream.state.store import StaleLog

    store, old_wire, new_wire = MemoryStore(), Wire(), Wire()
    inputs = [old_wire.msg("heartbeat", heartbeat()), old_wire.msg("submitted", task("t1", time=1)),
              old_wire.msg("submitted", task("t2", time=2)), old_wire.msg("submitted", task("t3", time=3))]
    new_wire.publish = old_wire.publish  # one decisions topic

    async def scenario():
        old, new = processor(store, old_wire), processor(store, new_wire)
        await old.handle(inputs[:1])  # old owns the cluster: the heartbeat is step 1
        await new.handle(inputs[1:3])  # new took over: loads step 1, applies t1 and t2
        with pytest.raises(StaleLog):  # old still thinks the log ends at its step 1
            await old.handle(inputs[1:])
        await old.handle(inputs[1:])  # tried again (GroupCommit does): skips t1, t2; applies t3
        return await store.full_log("c1"), old.sessions["c1"].engine

    log, engine = run(scenario())
    assert [step["time"] for step in log.steps] == [0, 1, 2, 3]  # heartbeat, t1, t2 (new), t3 (old): once each
    assert [d["task"] for d in old_wire.decisions()] == ["t1", "t2", "t3"] and old_wire.dead() == []
    assert sorted(engine.tasks) == ["t1", "t2", "t3"]


class Partitions:
    """Kafka as the processor reads it: one partition per input topic holding the messages in
    order; the agents' read position per partition, and what they fetched but did not yet hand
    over; and Kafka's log read again by range (``InputLog``), two messages at a time."""

    def __init__(self, wire: Wire, plan: list[tuple[str, dict]]):
        self.wire = wire
        self.messages = {}
        for kind, body in plan:
            message = wire.msg(kind, body)
            self.messages.setdefault(message.position, []).append(message)
        self.read = dict.fromkeys(self.messages, 0)
        self.fetched: list = []
        self.begins: dict[str, int] = {}  # where retention left each partition's log
        self.ranges_read: list[dict] = []

    async def read_again(self, ranges):
        self.ranges_read.append(dict(ranges))
        cursors = {p: max(start, self.begins.get(p, 0)) for p, (start, end) in ranges.items()}
        while cursors:
            for position in list(cursors):
                start, end = cursors[position], ranges[position][1]
                chunk = self.messages[position][start:min(start + 2, end)]
                cursors[position] = start + len(chunk)
                done = cursors[position] >= end
                if done:
                    del cursors[position]
                yield position, chunk, done

    async def journal(self, start):
        for record in self.wire.journal[start.get("worker.journal:0", 0):]:
            yield record

    def input_log(self):
        return SimpleNamespace(read=self.read_again, journal=self.journal)

    def poll(self, per_partition: int = 2) -> list:
        """The agents' next batch: what was fetched before, then up to ``per_partition`` more of each."""
        batch, self.fetched = self.fetched, []
        for position, messages in self.messages.items():
            start = self.read[position]
            batch += messages[start:start + per_partition]
            self.read[position] = min(start + per_partition, len(messages))
        return batch

    def prefetch(self) -> None:
        self.fetched = self.poll()


def a_day_of_work(tasks: int = 30) -> list[tuple[str, dict]]:
    """A node, then each second a task submitted and the previous one completed."""
    plan = [("heartbeat", heartbeat(cpu=2, mem=4))]
    for k in range(tasks):
        plan.append(("submitted", task(f"t{k}", time=1 + k)))
        if k:
            plan.append(("completed", done(f"t{k - 1}", 1 + k)))
    return plan + [("completed", done(f"t{tasks - 1}", 1 + tasks))]


async def consume(p: Processor, kafka: Partitions, batches: int | None = None) -> None:
    """Hand ``kafka``'s batches to ``p`` as the agents do (a batch the store refused is tried
    again: GroupCommit), until it is read to the end or ``batches`` were handed over."""
    from fairstream.state.store import StaleLog

    while batches is None or batches > 0:
        batch = kafka.poll()
        if not batch:
            return
        while True:
            try:
                await p.handle(batch)
                break
            except StaleLog:
                continue
        batches = None if batches is None else batches - 1


@pytest.mark.parametrize("restore", [
    pytest.param("older", id="a Redis restored from an older file"),
    pytest.param("empty", id="a Redis restarted empty"),
])
@pytest.mark.parametrize("worker", [
    pytest.param("running", id="while the worker runs (its next commit finds the log shorter)"),
    pytest.param("restarted", id="and the worker restarted (Kafka's committed offsets are ahead of the store's)"),
])
def test_what_the_store_lost_is_read_again_from_kafka_and_every_task_is_done_once(restore, worker):
    import copy

    store, wire = MemoryStore(), Wire()
    kafka = Partitions(wire, a_day_of_work())

    async def scenario():
        nonlocal store
        p = processor(store, wire, input_log=kafka.input_log())
        await consume(p, kafka, batches=4)
        saved = copy.deepcopy(store) if restore == "older" else MemoryStore()  # the file Redis is restored from
        await consume(p, kafka, batches=6)
        assert len(wire.decisions()) > 3
        if worker == "running":
            kafka.prefetch()  # fetched before the loss shows; handed over after it
            p.store = store = saved
        else:  # what the worker applied is what Kafka has committed for it at most
            committed = dict(p.applied)
            kafka.read.update(committed)
            p = processor(saved, wire, input_log=kafka.input_log())
            p.consuming_from(committed)  # Faust sought to Kafka's committed offsets
        await consume(p, kafka)
        return p

    p = run(scenario())
    every_task_done_once_by_id(wire)
    # Each partition the store is behind on, from the store's offset to where the worker was:
    # the heartbeats' one message is in the older file.
    [ranges] = kafka.ranges_read
    start = 8 if restore == "older" else 0
    assert ranges == {**({} if restore == "older" else {"nodes.heartbeats:0": (0, 1)}),
                      "tasks.submitted:0": (start, 20), "tasks.completed:0": (start, 20)}
    assert p.metrics.read_again._value.get() == sum(end - start for start, end in ranges.values())
    engine = p.sessions["c1"].engine
    assert engine.tasks == {} and len(engine.finished_ids) == 30 and not engine.used.any()


def test_a_batch_that_waited_for_the_lock_while_the_store_lost_writes_is_applied_after_reading_again():
    # The submissions' batch is the first to commit after Redis lost everything: it fails
    # (the log is shorter than the worker's). The completions' batch, already waiting for the
    # lock, must not be applied to an engine rebuilt from the empty store: its tasks would be
    # unknown there, and the completions dead-lettered and their offsets committed (lost).
    from fairstream.state.store import StaleLog

    class HeldStore(MemoryStore):
        """Its first commit waits until ``release`` is set."""

        def __init__(self):
            super().__init__()
            self.release, self.held = asyncio.Event(), asyncio.Event()

        async def commit(self, batch):
            if not self.held.is_set():
                self.held.set()
                await self.release.wait()
            await super().commit(batch)

    wire = Wire()
    plan = [("heartbeat", heartbeat(cpu=8, mem=8)), *[("submitted", task(f"t{k}", time=1)) for k in range(4)],
            ("completed", done("t0", 2))]
    kafka = Partitions(wire, plan)
    heartbeats, submitted, completed = (kafka.messages[p] for p in
                                        ("nodes.heartbeats:0", "tasks.submitted:0", "tasks.completed:0"))

    async def scenario():
        p = processor(MemoryStore(), wire, input_log=kafka.input_log())
        await p.handle(heartbeats + submitted[:3])
        p.store = store = HeldStore()  # Redis restarted empty
        first = asyncio.create_task(p.handle(submitted[3:]))
        await until(store.held.is_set)
        second = asyncio.create_task(p.handle(completed))
        await until(lambda: len(p._lock._waiters or ()) > 0)
        store.release.set()
        with pytest.raises(StaleLog):
            await first
        await second
        await p.handle(submitted[3:])  # the agent tries the failed batch again
        return p

    p = run(scenario())
    assert wire.dead() == []
    engine = p.sessions["c1"].engine
    assert sorted(engine.tasks) == ["t1", "t2", "t3"] and list(engine.finished_ids) == ["t0"]
    assert kafka.ranges_read == [{"nodes.heartbeats:0": (0, 1), "tasks.submitted:0": (0, 3)}]


def every_task_done_once_by_id(wire: Wire) -> None:
    """Each task placed once: a decision published again for input read again has the id it
    had (the same input in the same order decides the same), so a consumer sees it once."""
    by_id = {d["id"]: d for d in wire.decisions()}
    placed = Counter(d["task"] for d in by_id.values() if d["kind"] == "place")
    assert placed == Counter({f"t{k}": 1 for k in range(30)}), placed
    assert wire.dead() == []


def late_completion() -> list[tuple[str, dict]]:
    """One node with room for one task; t0 runs; t1 (time 2) and t2 (time 5) wait; t0's
    completion (time 3) comes last, late."""
    return [("heartbeat", heartbeat(cpu=1, mem=1)), ("submitted", task("t0", time=1)),
            ("submitted", task("t1", time=2)), ("submitted", task("t2", time=5)), ("completed", done("t0", 3))]


@pytest.mark.parametrize("journal", [
    pytest.param(True, id="with the journal: the batches as they were applied, the same decisions"),
    pytest.param(False, id="(without it, read merged by event time, t1 is placed at 3, not 5: a second placement)"),
])
def test_a_redis_restored_from_an_older_file_is_rebuilt_to_exactly_the_decisions_published(journal):
    # Applied as it arrived: t1 and t2 wait; t0's completion, at clock 5, places t1 at 5.
    # Read again in event-time order, the completion (3) comes before t2 (5) and t1 is placed
    # at 3: another decision for a task an agent already runs. The journal holds the batches.
    import copy

    from fairstream.core.model import TaskCompleted

    store, wire = MemoryStore(), Wire()
    kafka = Partitions(wire, late_completion())
    [heartbeat_0], [t0, t1, t2], [t0_done] = kafka.messages.values()

    async def scenario():
        p = processor(store, wire, input_log=kafka.input_log())
        await p.handle([heartbeat_0, t0])
        older = copy.deepcopy(store)  # the file Redis is restored from
        await p.handle([t1, t2])
        await p.handle([t0_done])
        if not journal:
            wire.journal.clear()
        rebuilt = processor(older, wire, input_log=kafka.input_log())
        rebuilt.consuming_from(dict(p.applied))  # Kafka's committed offsets: where the worker was
        await rebuilt.start()
        await rebuilt.session("c1")
        return p, rebuilt

    p, rebuilt = run(scenario())
    by_id = {d["id"]: d for d in wire.decisions()}
    placed = sorted((d["task"], d["time"]) for d in by_id.values() if d["kind"] == "place")
    if journal:
        assert placed == [("t0", 1), ("t1", 5)]
        # And the engine is where it was: the next event decides the same in both.
        first, again = p.sessions["c1"].engine, rebuilt.sessions["c1"].engine
        assert (again.time, sorted(again.tasks)) == (first.time, sorted(first.tasks)) == (5, ["t1", "t2"])
        t1_done = TaskCompleted(task="t1", time=6)
        decided = first.step(6, [t1_done]).decisions
        assert [d.task for d in decided] == ["t2"] and again.step(6, [t1_done]).decisions == decided
    else:
        assert placed == [("t0", 1), ("t1", 3), ("t1", 5)]


def test_a_message_rejected_unapplied_is_rejected_again_when_the_store_is_rebuilt():
    # Applying it kept failing, so it was dead-lettered without being applied (Processor.reject);
    # the rebuild must not apply it now (t1 would be placed, a decision never taken before).
    import copy

    store, wire = MemoryStore(), Wire()
    kafka = Partitions(wire, late_completion())
    [heartbeat_0], [t0, t1, t2], _ = kafka.messages.values()

    async def scenario():
        p = processor(store, wire, input_log=kafka.input_log())
        await p.handle([heartbeat_0, t0])
        older = copy.deepcopy(store)
        await (await p.reject(t1, "applying it failed: boom")).published
        await p.handle([t2])
        rebuilt = processor(older, wire, input_log=kafka.input_log())
        rebuilt.consuming_from(dict(p.applied))
        await rebuilt.start()

    run(scenario())
    assert [d["task"] for d in wire.decisions() if d["kind"] == "place"] == ["t0"]
    assert [(d["offset"], d["reason"]) for d in wire.dead()] == [(1, "applying it failed: boom")] * 2


def test_a_batch_is_in_the_journal_before_any_of_its_decisions_is_published():
    # A decision published whose batch the journal lacks could not be rebuilt after Redis lost
    # writes: the record's acknowledgement is waited for first.
    wire = Wire()
    kafka = Partitions(wire, late_completion())
    acknowledge = asyncio.Event()
    published_before_ack = []

    async def publish(topic, key, message):
        if topic == Topics().journal:
            await acknowledge.wait()
        elif not acknowledge.is_set():
            published_before_ack.append(message)
        return await Wire.publish(wire, topic, key, message)

    async def scenario():
        p = Processor(MemoryStore(), WorkerConfig(policy="drf").make_engine, publish, Topics(),
                      input_log=kafka.input_log())
        handled = asyncio.create_task(p.handle([*kafka.messages["nodes.heartbeats:0"], *kafka.messages["tasks.submitted:0"]]))
        await until(lambda: p._lock.locked() and not handled.done())
        for _ in range(20):  # event-loop turns: the batch is committed and waits for the record
            await asyncio.sleep(0)
        acknowledge.set()
        await handled

    run(scenario())
    assert published_before_ack == []
    assert [d["task"] for d in wire.decisions() if d["kind"] == "place"] == ["t0"]
    assert [record["read"] for record in wire.journal] == [[["nodes.heartbeats:0", 0, 0], ["tasks.submitted:0", 0, 2]]]


def test_a_restarted_worker_whose_store_kept_everything_reads_nothing_again():
    store, wire = MemoryStore(), Wire()
    kafka = Partitions(wire, a_day_of_work())

    async def scenario():
        await consume(processor(store, wire, input_log=kafka.input_log()), kafka, batches=5)
        committed = dict(kafka.read)
        p = processor(store, wire, input_log=kafka.input_log())
        p.consuming_from(committed)
        await consume(p, kafka)
        return p

    p = run(scenario())
    assert kafka.ranges_read == [] and p.metrics.read_again._value.get() == 0
    every_task_done_once_by_id(wire)
    assert len(wire.decisions()) == len({d["id"] for d in wire.decisions()})  # nothing published twice


def test_pending_batches_are_republished_in_event_time_order():
    from fairstream.state.store import republishing_order

    later = [("allocations.decisions", {"id": "x", "time": 5.0}), ("events.deadletter", {"topic": "s", "offset": 9})]
    earlier = [("allocations.decisions", {"id": "y", "time": 3.0}), ("allocations.decisions", {"id": "w", "time": 3.0})]
    # A dead letter has no time: it goes first (time 0); equal times go by identity.
    assert [m.get("id", "dead") for _, m in republishing_order([later, earlier])] == ["dead", "w", "y", "x"]


@pytest.mark.parametrize("policy, params", [
    pytest.param("qknobler", {"rho": "0"}, id="qknobler decides in the worker, integer program and all"),
    pytest.param("tetris", {"f": "0"}, id="tetris decides in the worker"),
])
def test_the_multi_resource_policies_run_in_the_worker_and_survive_a_restart(policy, params):
    # Example 1 in small: <20 cpu, 100 GB>, A <1, 6>, B <1, 2>, 30 tasks each.
    store, wire = MemoryStore(), Wire()
    config = WorkerConfig(policy=policy, params=params)

    async def life():
        p = Processor(store, config.make_engine, wire.publish, Topics(), snapshot_every=1)
        batch = [wire.msg("heartbeat", heartbeat(cpu=20, mem=100))]
        batch += [wire.msg("submitted", task(f"{t}{i}", t, 0, cpu=1, mem=m)) for t, m in (("A", 6), ("B", 2)) for i in range(30)]
        await p.handle(batch)
        return p

    run(life())
    placed = [d["tenant"] for d in wire.decisions()]
    used = (sum(6 if t == "A" else 2 for t in placed), len(placed))
    assert used[0] <= 100 and used[1] <= 20 and len(placed) >= 18

    async def restarted():
        p = Processor(store, config.make_engine, wire.publish, Topics(), snapshot_every=1)
        await p.start()
        return (await p.session("c1")).engine

    engine = run(restarted())  # from the snapshot: the policy is found again by name
    assert engine.policy == policy


def test_a_burst_for_several_clusters_is_refused_before_anything_is_sent():
    from fairstream.producers.client import burst_key

    assert burst_key([task("a", cluster="c1"), task("b", cluster="c1")]) == "c1"
    with pytest.raises(ValueError, match="one cluster's events"):
        burst_key([task("a", cluster="c1"), task("b", cluster="c2")])


def test_batches_that_wait_for_the_lock_together_are_applied_in_one_pass_and_one_commit():
    # The first batch is held inside its commit; the two that arrive meanwhile (the other
    # agents') are applied together: three batches, two commits, every decision once.
    class SlowStore(MemoryStore):
        def __init__(self):
            super().__init__()
            self.commits, self.release = [], asyncio.Event()

        async def commit(self, batch):
            self.commits.append(sum(len(s) for s in batch.steps.values()))
            if len(self.commits) == 1:
                await self.release.wait()
            await super().commit(batch)

    store, wire = SlowStore(), Wire()

    async def scenario():
        p = processor(store, wire)
        first = asyncio.create_task(p.handle([wire.msg("heartbeat", heartbeat(cpu=8, mem=8))]))
        await until(lambda: store.commits)  # the first batch is held inside its commit
        others = [asyncio.create_task(p.handle([wire.msg("submitted", task(f"t{k}", time=1))])) for k in range(2)]
        await until(lambda: len(p._waiting) == 2)  # both wait for the lock
        store.release.set()
        return await asyncio.gather(first, *others)

    outcomes = run(scenario())
    assert len(store.commits) == 2
    assert outcomes[1] is outcomes[2] and outcomes[1].decisions == 2  # one outcome for the pair
    assert [d["task"] for d in wire.decisions()] == ["t0", "t1"]


@pytest.mark.parametrize("config, expected_wait_ms, expected_min_bytes", [
    pytest.param(WorkerConfig(), 10, 8192,
                 id="by default the broker holds a fetch 10 ms, not Faust's 1.5 s, gathering 8 KiB, not 1 byte"),
    pytest.param(WorkerConfig(fetch_max_wait=0.0), 1, 8192, id="a zero wait is raised to aiokafka's smallest, 1 ms"),
    pytest.param(WorkerConfig(fetch_min_bytes=1), 10, 1, id="fetch_min_bytes 1 answers at the first record"),
    pytest.param(WorkerConfig(fetch_min_bytes=0), 10, 1, id="a zero fetch_min_bytes is raised to 1"),
])
def test_the_worker_consumer_fetches_with_the_configured_wait_and_minimum(config, expected_wait_ms, expected_min_bytes):
    async def scenario():
        app, _ = create_app(config, MemoryStore())
        consumer = app.consumer._new_consumer_thread()._create_worker_consumer(app.transport)
        try:
            # what aiokafka builds its fetcher with at start
            return consumer._fetch_max_wait_ms, consumer._fetch_min_bytes
        finally:
            await consumer.stop()  # never started: only releases the client

    assert run(scenario()) == (expected_wait_ms, expected_min_bytes)


class Delivered:
    """What a Faust agent's stream hands over: the value and the message it came in (with its
    topic, partition, offset and record timestamp)."""

    def __init__(self, incoming: Incoming):
        self.value = incoming.raw
        self.message = SimpleNamespace(topic=incoming.topic, partition=incoming.partition, offset=incoming.offset,
                                       timestamp=incoming.produced, key=incoming.key)


class GatedStore(MemoryStore):
    """Records each commit's size in steps; the first commit waits until ``release`` is set,
    and the commits listed in ``fail`` (by number) raise once."""

    def __init__(self, fail=()):
        super().__init__()
        self.commits, self.release, self.fail = [], asyncio.Event(), set(fail)

    async def commit(self, batch):
        number = len(self.commits)
        self.commits.append(sum(len(s) for s in batch.steps.values()))
        if number == 0:
            await self.release.wait()
        if number in self.fail:
            raise ConnectionError("redis went away")
        await super().commit(batch)


def group_commit(store, wire, acked, max_size=500, window=0.0, backlog=lambda message: 0):
    from fairstream.streams.app import GroupCommit

    async def ack(event):
        acked.append(event.message.offset)

    return GroupCommit(processor(store, wire, step_window=0.0), "submitted", max_size, window, ack,
                       backlog, retry_delays=(0.001, 0.001))


def test_a_batch_goes_at_once_and_what_arrives_while_it_is_applied_goes_together_next():
    # Group commit: the first message is applied alone, without waiting for a window; the three
    # that arrive during its commit are the next batch (one pass, one commit: three steps, as
    # each is at its own event time); all four are acknowledged in arrival order.
    store, wire, acked = GatedStore(), Wire(), []

    async def scenario():
        feed = group_commit(store, wire, acked)
        await feed.add(Delivered(wire.msg("submitted", task("t0", time=0))))
        await until(lambda: store.commits)
        for k in range(1, 4):
            await feed.add(Delivered(wire.msg("submitted", task(f"t{k}", time=k))))
        store.release.set()
        await feed.close()

    run(scenario())
    assert store.commits == [1, 3]
    assert acked == [0, 1, 2, 3]


@pytest.mark.parametrize("window, commits", [
    pytest.param(0.5, [3], id="with a window a batch waits for the messages Kafka is known to hold"),
    pytest.param(0.0, [1, 1, 1], id="without one each message goes as it arrives"),
])
def test_a_batch_waits_up_to_the_window_for_input_already_in_kafka(window, commits):
    store, wire, acked = GatedStore(), Wire(), []
    store.release.set()
    messages = [wire.msg("submitted", task(f"t{k}", time=k)) for k in range(3)]

    async def scenario():
        # Like Faust, hand the agent one message per turn of the event loop; the partition's
        # high watermark is known from the start (all three are in Kafka).
        feed = group_commit(store, wire, acked, window=window,
                            backlog=lambda message: len(messages) - message.offset - 1)
        for message in messages:
            await feed.add(Delivered(message))
            await asyncio.sleep(0)
        await feed.close()

    run(scenario())
    assert store.commits == commits
    assert acked == [0, 1, 2]


def test_a_full_buffer_holds_input_back_until_a_batch_is_taken():
    store, wire, acked = GatedStore(), Wire(), []

    async def scenario():
        feed = group_commit(store, wire, acked, max_size=2)
        await feed.add(Delivered(wire.msg("submitted", task("t0"))))
        await until(lambda: store.commits)  # t0 is being committed, the buffer is empty
        await feed.add(Delivered(wire.msg("submitted", task("t1"))))
        blocked = asyncio.create_task(feed.add(Delivered(wire.msg("submitted", task("t2")))))
        for _ in range(20):  # turns of the event loop, not time: nothing else can release it
            await asyncio.sleep(0)
        held_back = not blocked.done()
        store.release.set()
        await blocked
        await feed.close()
        return held_back

    assert run(scenario()) is True
    assert acked == [0, 1, 2]


def test_a_batch_whose_commit_fails_is_tried_again_and_applied_once():
    store, wire, acked = GatedStore(fail={1}), Wire(), []

    async def scenario():
        feed = group_commit(store, wire, acked)
        store.release.set()
        await feed.processor.handle([wire.msg("heartbeat", heartbeat())])  # the heartbeats agent's
        await feed.add(Delivered(wire.msg("submitted", task("t1"))))
        await feed.add(Delivered(wire.msg("submitted", task("t2"))))
        await feed.close()

    run(scenario())
    assert len(store.commits) == 3  # the heartbeat; t1 and t2 failed; t1 and t2 again
    assert [d["task"] for d in wire.decisions()] == ["t1", "t2"]
    assert acked == [0, 1]


def test_outputs_whose_publishing_fails_are_sent_again_before_their_input_is_acknowledged():
    store = MemoryStore()

    class FlakyWire(Wire):
        failed = False

        async def publish(self, topic, key, message):
            await super().publish(topic, key, message)
            future = asyncio.get_running_loop().create_future()
            if not self.failed and topic == "allocations.decisions":
                self.failed = True
                future.set_exception(ConnectionError("broker went away"))
            else:
                future.set_result(None)
            return future

    wire = FlakyWire()

    async def scenario():
        p = processor(store, wire)
        p.outputs.retry_delays = (0.001, 0.001)  # retry at once rather than after 0.1 s
        await p.handle([wire.msg("heartbeat", heartbeat()), wire.msg("submitted", task("t1"))])
        return await store.outbox()

    assert run(scenario()) == []  # published, then cleared
    assert [d["task"] for d in wire.decisions()] == ["t1", "t1"]  # the same id twice: idempotent
    assert len({d["id"] for d in wire.decisions()}) == 1


@pytest.mark.parametrize("log_retention", [
    pytest.param(float("inf"), id="the whole log kept"),
    pytest.param(3.0, id="a bounded log: the landed snapshot is also its checkpoint"),
])
def test_a_snapshot_encoded_in_a_child_lands_in_a_later_commit_and_recovers_the_same_engine(log_retention):
    store, wire = MemoryStore(), Wire()
    plan = [("heartbeat", heartbeat(cpu=8, mem=8))] + [("submitted", task(f"t{k}", time=1 + k)) for k in range(4)]
    plan += [("completed", done(f"t{k}", 6 + k)) for k in range(4)]

    async def first_life():
        # The first batch's snapshot is written with it (step 1). Then ratio 0, every 3: due
        # after step 4; the child encodes the engine as of step 4 while steps 5 and 6 are
        # applied; it lands with the first commit after it finished.
        p = processor(store, wire, snapshot_every=3, snapshot_ratio=0.0, background_snapshots=True,
                      log_retention=log_retention)
        for kind, body in plan[:4]:
            await p.handle([wire.msg(kind, body)])
        assert (await store.load("c1")).snapshot_steps == 1 and p.sessions["c1"].snapshotting is not None
        await p.sessions["c1"].snapshotting.blob  # the child is done
        for kind, body in plan[4:6]:
            await p.handle([wire.msg(kind, body)])
        landed = await store.load("c1")
        for kind, body in plan[6:]:
            await p.handle([wire.msg(kind, body)])
        return landed, fingerprint(p.sessions["c1"].engine)

    landed, engine_before = run(first_life())
    assert landed.snapshot_steps == 4 and len(landed.log) == 2  # steps 5 and 6 replay after it
    # Bounded: step 1 (the heartbeat at 0.0) and step 4 (t2 at 3.0) are checkpoints.
    assert landed.checkpoints == ([] if log_retention == float("inf") else [(1, 0.0), (4, 3.0)])

    async def second_life():
        p = processor(store, wire)
        await p.start()
        return fingerprint((await p.session("c1")).engine)

    assert run(second_life()) == engine_before


PLANTED = b"\x80\x05planted"  # the first bytes of a pickle: never read (test_engine_snapshot.py)


@pytest.mark.parametrize("retention, plant, recovered", [
    pytest.param(float("inf"), ("snapshot",), True, id="whole log kept: a planted snapshot is replaced by the log"),
    pytest.param(4.0, ("snapshot",), True,
                 id="a bounded log: a planted last snapshot is replaced by the checkpoint the log starts from"),
    pytest.param(4.0, ("snapshot", "checkpoints"), False,
                 id="a bounded log whose checkpoints are planted too: the cluster's events are dead-lettered"),
])
def test_a_snapshot_that_cannot_be_read_is_not_trusted_and_the_engine_is_rebuilt_from_what_can(retention, plant, recovered):
    store, wire = MemoryStore(), Wire()
    plan = [("heartbeat", heartbeat(cpu=8, mem=8))]
    plan += [kind_body for k in range(12) for kind_body in (("submitted", task(f"t{k}", time=1 + k)),
                                                           ("completed", done(f"t{k}", 1.5 + k)))]

    async def first_life():
        p = processor(store, wire, snapshot_every=2, snapshot_ratio=0.0, log_retention=retention)
        for kind, body in plan:
            await p.handle([wire.msg(kind, body)])
        return fingerprint(p.sessions["c1"].engine)

    before = run(first_life())
    assert store._snapshots["c1"][1] > 0 and (retention == float("inf")) == (store._log_base.get("c1", 0) == 0)
    if "snapshot" in plant:
        store._snapshots["c1"] = (PLANTED, store._snapshots["c1"][1])
    if "checkpoints" in plant:
        store._checkpoints["c1"] = {steps: (at, PLANTED) for steps, (at, _) in store._checkpoints["c1"].items()}

    async def second_life():
        p = processor(store, wire, log_retention=retention)
        await p.handle([wire.msg("submitted", task("late", time=20)), wire.msg("heartbeat", heartbeat(cluster="c2"))])
        engine = p.sessions["c1"].engine if "c1" in p.sessions else None
        return p, (fingerprint(engine) if engine else None)

    p, after = run(second_life())
    assert p.metrics.snapshots_unreadable._value.get() == (1 if recovered else 2)
    assert "c2" in p.sessions  # other clusters go on
    if recovered:
        assert after[1][-1] == ("late", "RUNNING", "n1") and after[2] == before[2]  # the finished ids as before
        assert [d["task"] for d in wire.decisions()][-1] == "late"
    else:
        assert after is None
        [letter] = wire.dead()
        assert "cluster c1: its state in the store cannot be read" in letter["reason"] and "a pickle" in letter["reason"]


def fingerprint(engine):
    """What an engine decides from: clock, tasks, remembered finished ids, accounting."""
    acc = engine.accounting
    return (engine.time, sorted((t.id, t.state.name, t.node) for t in engine.tasks.values()),
            list(engine.finished_ids), acc.raw_usage.tolist(), acc.counted_usage.tolist(),
            acc.allocation.tolist(), [ledger.pseudo_accumulated for ledger in acc.ledgers])


def worker_config_from_command_line(*flags: str) -> WorkerConfig:
    """The worker's configuration from ``fairstream worker --policy drf FLAGS``."""
    from fairstream.cli import build_parser
    from fairstream.streams.run import config_from_args

    return config_from_args(build_parser().parse_args(["worker", "--policy", "drf", *flags]))


@pytest.mark.parametrize("flags, background", [
    pytest.param([], True, id="by default snapshots are encoded in a forked child"),
    pytest.param(["--snapshot-inline"], False, id="--snapshot-inline encodes them in the worker"),
])
def test_the_worker_command_line_chooses_where_snapshots_are_encoded(flags, background):
    config = worker_config_from_command_line(*flags)
    assert config.background_snapshots is background
    processor = create_app(config, MemoryStore())[1]
    assert processor.stepping.background_snapshots is background


@pytest.mark.parametrize("flags, wait_s, min_bytes", [
    pytest.param([], 0.01, 8192, id="by default a fetch waits at most 10 ms for 8 KiB of records"),
    pytest.param(["--fetch-max-wait", "0.05", "--fetch-min-bytes", "1"], 0.05, 1,
                 id="both are taken from the command line"),
])
def test_the_worker_command_line_sets_how_the_consumer_fetches(flags, wait_s, min_bytes):
    config = worker_config_from_command_line(*flags)
    assert (config.fetch_max_wait, config.fetch_min_bytes) == (wait_s, min_bytes)


@pytest.mark.parametrize("flags, session_s, heartbeat_s", [
    pytest.param([], 60.0, 3.0, id="by default Kafka waits 60 s for a silent worker, heartbeats every 3 s"),
    pytest.param(["--session-timeout", "6"], 6.0, 2.0, id="a shorter session heartbeats within a third of it"),
])
def test_the_worker_command_line_sets_how_long_kafka_waits_for_a_silent_worker(flags, session_s, heartbeat_s):
    app = create_app(worker_config_from_command_line(*flags), MemoryStore())[0]
    assert (app.conf.broker_session_timeout, app.conf.broker_heartbeat_interval) == (session_s, heartbeat_s)


def test_the_worker_command_line_has_no_defaults_of_its_own(monkeypatch):
    # Every default is WorkerConfig's (streams/config.py): a value changed there is the
    # command line's too, rather than a second copy drifting apart from the first.
    monkeypatch.delenv("FAIRSTREAM_BROKER", raising=False)
    monkeypatch.delenv("FAIRSTREAM_REDIS_URL", raising=False)
    from_flags = worker_config_from_command_line()
    assert dataclasses.asdict(from_flags) == dataclasses.asdict(WorkerConfig(policy="drf"))


def test_views_are_written_for_what_a_batch_changed_only():
    # A placement changes no node's registry entry, and a tenant's quantum is written when
    # first seen or moved, not on every pass that touches the tenant.
    class Recording(MemoryStore):
        def __init__(self):
            super().__init__()
            self.views = []

        async def commit(self, batch):
            self.views.append(batch.views.get("c1", {}))
            await super().commit(batch)

    store, wire = Recording(), Wire()

    async def scenario():
        p = processor(store, wire)
        await p.handle([wire.msg("heartbeat", heartbeat(cpu=8, mem=8))])
        await p.handle([wire.msg("submitted", task("t1", "A", time=1))])
        await p.handle([wire.msg("submitted", task("t2", "A", time=2))])

    run(scenario())
    first, second, third = store.views
    assert set(first["nodes"]) == {"n1"} and first["quanta"] == {}
    assert second["nodes"] == {} and set(second["quanta"]) == {"A"}  # t1 placed on n1
    assert third["nodes"] == {} and third["quanta"] == {}  # A's quantum has not moved
    assert set(second["usage:0"]) == set(third["usage:0"]) == {"A"}
    assert [d["task"] for d in wire.decisions()] == ["t1", "t2"]


def test_a_snapshot_child_that_fails_loses_nothing_and_the_next_snapshot_is_taken(monkeypatch):
    import fairstream.streams.snapshots as snapshots_module

    store, wire = MemoryStore(), Wire()
    real_encoder = snapshots_module.encoded

    def fail(engine):  # runs in the child: it exits with code 1
        raise MemoryError("the child ran out of memory")

    async def scenario():
        p = processor(store, wire, snapshot_every=2, snapshot_ratio=0.0, background_snapshots=True)
        await p.handle([wire.msg("heartbeat", heartbeat(cpu=8, mem=8))])  # the first batch's snapshot
        monkeypatch.setattr(snapshots_module, "encoded", fail)
        await p.handle([wire.msg("submitted", task("s0", time=0.5))])
        await p.handle([wire.msg("submitted", task("t0", time=1))])  # due: forked, fails
        with pytest.raises(RuntimeError, match="exited with code 1"):
            await p.sessions["c1"].snapshotting.blob
        monkeypatch.setattr(snapshots_module, "encoded", real_encoder)
        for k in range(1, 4):
            await p.handle([wire.msg("submitted", task(f"t{k}", time=1 + k))])
            if p.sessions["c1"].snapshotting is not None:
                await p.sessions["c1"].snapshotting.blob
        await p.handle([wire.msg("submitted", task("t4", time=5))])
        return await store.load("c1")

    record = run(scenario())
    assert record.snapshot is not None and record.snapshot_steps == 5  # the retry, two steps later
    assert len(record.log) == 2


def test_a_message_whose_application_keeps_failing_is_dead_lettered_as_an_internal_error_and_the_rest_go_on(monkeypatch):
    # A fault the decoder lets through (simulated: the engine half-applies a step holding task
    # "boom", then raises). Three failed attempts of the batch, then one message at a time:
    # "boom" fails three times alone and is dead-lettered; the others are applied once.
    from fairstream.core.engine import Engine

    step = Engine.step

    def faulty_step(self, time, events):
        events = list(events)
        if any(getattr(e, "task", None) == "boom" for e in events):
            step(self, time, [e for e in events if getattr(e, "task", None) != "boom"])  # half-applied...
            raise OverflowError("int too large to convert to float")  # ...then the fault
        return step(self, time, events)

    monkeypatch.setattr(Engine, "step", faulty_step)
    store, wire, acked = MemoryStore(), Wire(), []

    async def scenario():
        feed = group_commit(store, wire, acked)
        await feed.processor.handle([wire.msg("heartbeat", heartbeat())])
        for name in ("t1", "boom", "t2"):
            await feed.add(Delivered(wire.msg("submitted", task(name, time=1))))
        await feed.close()
        return feed.processor

    p = run(scenario())
    assert [d["task"] for d in wire.decisions()] == ["t1", "t2"]  # each once: the half-applied steps were forgotten
    [dead] = wire.dead()
    assert dead["reason"] == "internal error: OverflowError: int too large to convert to float"
    assert json.loads(dead["original"])["task"] == "boom" and acked == [0, 1, 2]
    assert p.metrics.internal_errors.labels("tasks.submitted")._value.get() == 1
    assert sorted(run(p.session("c1")).engine.tasks) == ["t1", "t2"]


def test_waiting_for_a_service_retries_what_it_is_told_to_and_nothing_else():
    from fairstream.wire.retry import waiting_for

    attempts = []

    async def flaky():
        attempts.append(1)
        if len(attempts) < 3:
            raise ConnectionError("not up yet")
        return "up"

    async def broken():
        raise ValueError("a bug, not an outage")

    assert run(waiting_for(flaky, "test.unavailable", ConnectionError, (0.001, 0.001))) == "up"
    assert len(attempts) == 3
    with pytest.raises(ValueError):
        run(waiting_for(broken, "test.unavailable", ConnectionError, (0.001, 0.001)))


def test_a_send_the_broker_had_no_leader_for_is_sent_again_and_other_errors_are_raised():
    from aiokafka.errors import LeaderNotAvailableError, RequestTimedOutError

    from fairstream.producers.client import Publisher

    class Producer:
        def __init__(self, failures):
            self.failures, self.sent = list(failures), []

        async def send_and_wait(self, topic, value, key):
            if self.failures:
                raise self.failures.pop(0)
            self.sent.append((topic, key, value))

    async def send(failures, outage_s=60.0):
        publisher = Publisher(outage_s=outage_s)
        publisher.producer = Producer(failures)
        await publisher.send_raw("t", "c1", b"{}")
        return publisher.producer.sent

    # A broker restarting: no leader twice, then the send goes through, once.
    assert run(send([LeaderNotAvailableError(), LeaderNotAvailableError()])) == [("t", b"c1", b"{}")]
    # A timeout may have written it: not sent again (it would be a duplicate submission).
    with pytest.raises(RequestTimedOutError):
        run(send([RequestTimedOutError()]))
    # The outage lasts longer than outage_s: the error is raised.
    with pytest.raises(LeaderNotAvailableError):
        run(send([LeaderNotAvailableError()] * 5, outage_s=0.0))


def metric(processor, name: str, **labels) -> float:
    value = processor.metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def test_the_worker_counts_preemptions_work_lost_and_config_changes_for_its_metrics():
    # One node of 4 cpu under drf with preemption (timeout 1 s, threshold 0.5). A starts two
    # unit tasks at t = 0 and two at t = 1, filling it; B asks for 4 at t = 2: its fair share
    # is 2 and it holds 0, starved from 2. A heartbeat at t = 5, past the timeout, brings a
    # pass that takes 2 tasks back from A, the youngest first (started at 1): 2 x (5 - 1) = 8
    # task-seconds lost.
    wire = Wire()
    config = WorkerConfig(policy="drf", params={"preemption": "on", "preemption_timeout": "1"})
    p = Processor(MemoryStore(), config.make_engine, wire.publish, Topics())
    config_topic = Topics().config

    def config_message(offset, body):
        return Incoming("config", json.dumps(body).encode(), config_topic, 0, offset, 0.0, None)

    async def scenario():
        await p.handle([wire.msg("heartbeat", heartbeat())] + [wire.msg("submitted", task(f"a{k}", "A", k // 2))
                                                               for k in range(4)])
        await p.handle([wire.msg("submitted", task(f"b{k}", "B", 2)) for k in range(4)])
        await p.handle([wire.msg("heartbeat", heartbeat(time=5))])
        # Then one configuration the worker applies and one it refuses (an ordering it lacks).
        await p.handle([config_message(0, {"cluster": "c1", "time": 6, "tenants": [{"id": "A"}, {"id": "B"}]}),
                        config_message(1, {"cluster": "c1", "tenants": [{"id": "A", "ordering": "lifo"}]})])
        await until(lambda: metric(p, "fairstream_config_changes_total", outcome="rejected") == 1)

    run(scenario())
    preempted = [d for d in wire.decisions() if d["kind"] == "preempt"]
    assert sorted((d["task"], d["started"]) for d in preempted) == [("a2", 1), ("a3", 1)]
    assert metric(p, "fairstream_preemptions_total", cluster="c1", tenant="A") == 2
    assert metric(p, "fairstream_work_lost_task_seconds_total", cluster="c1", tenant="A") == 8.0
    assert metric(p, "fairstream_preemptions_total", cluster="c1", tenant="B") == 0
    assert metric(p, "fairstream_config_changes_total", outcome="accepted") == 1
