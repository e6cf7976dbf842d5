"""The worker's input without Kafka or Redis (the processor, the in-memory store): messages
decoded and validated, bad ones dead-lettered with their reason, the rules of time, batch
messages and requests, redelivery. The same on real Kafka and Redis: ``tests/live/``."""

import json
from pathlib import Path

import pytest

from fairstream.state.store import MemoryStore

from offline import TOPIC, Wire, done, heartbeat, processor, run, task


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
    pytest.param("submitted", {**task("g", time=2), "count": 4, "gang": {"min": 8}}, None,
                 "gang.min: 8 must start together, but the submission has 4 tasks", id="a gang larger than its request"),
    pytest.param("submitted", {**task("g", time=2), "gang": {"min": 2}}, None,
                 "gang.min: 2 must start together, but the submission has 1 task (a gang is a request: give count)",
                 id="a gang of a single task"),
    pytest.param("submitted", {**task("g", time=2), "count": 4, "gang": {"min": 0}}, None,
                 "gang.min: 0 is less than the minimum of 1", id="a gang of no tasks"),
    pytest.param("submitted", {**task("g", time=2), "count": 4, "gang": 4}, None,
                 "gang: 4 is not of type 'object'", id="a gang that is not an object"),
    pytest.param("submitted", {**task("m", time=2), "constraints": {"max_per_node": 0}}, None,
                 "constraints.max_per_node: 0 is less than the minimum of 1", id="a max_per_node of no tasks"),
    pytest.param("submitted", {**task("m", time=2), "constraints": {"max_per_node": "1"}}, None,
                 "constraints.max_per_node: '1' is not of type 'integer'", id="a max_per_node that is not a number"),
    pytest.param("heartbeat", {"cluster": "c1", "node": "ghost", "time": 2, "lost": True}, None, "node 'ghost': unknown node",
                 id="a node lost that was never heard of"),
    pytest.param("heartbeat", {"cluster": "c1", "node": "n1", "time": 2, "lost": True, "capacity": {"mem": 1}}, None,
                 "False schema does not allow", id="a node lost that also brings a capacity"),
    pytest.param("heartbeat", {"cluster": "c1", "node": "n1", "time": 2, "lost": False, "capacity": {"mem": 1}}, None,
                 "lost: True was expected", id="lost other than true"),
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
    # The drill: a completion of a task nobody submitted, at t = 10^12.
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
    schema = json.loads((Path(__file__).parents[2] / "fairstream" / "schemas" / "deadletter.schema.json").read_text())
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


def test_a_node_said_lost_has_its_tasks_requeued_at_once_and_a_heartbeat_brings_it_back():
    # The heartbeat topic's {"lost": true} (an agent that knows a node is gone: the Kubernetes
    # connector, for a deleted node) does at once what --node-timeout does to a silent node.
    wire = Wire()

    async def scenario():
        p = processor(wire=wire)
        await p.handle([wire.msg("heartbeat", heartbeat("n1", 0)), wire.msg("submitted", task("t1", time=0, mem=4))])
        await p.handle([wire.msg("heartbeat", {"cluster": "c1", "node": "n1", "time": 1, "lost": True})])
        await p.handle([wire.msg("submitted", task("t2", time=2, mem=1))])
        await p.handle([wire.msg("heartbeat", heartbeat("n1", 3))])

    run(scenario())
    assert [(d["task"], d["kind"], d["node"], d["time"]) for d in wire.decisions()] == [
        ("t1", "place", "n1", 0), ("t1", "requeue", "n1", 1), ("t1", "place", "n1", 3), ("t2", "place", "n1", 3)]
