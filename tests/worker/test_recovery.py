"""What the worker keeps and how it comes back, without Kafka or Redis (the processor, the
in-memory store): restarts, eviction, snapshots and log retention, fencing of a worker that
lost its cluster, reading again what the store lost, the journal."""

import asyncio
from collections import Counter
from types import SimpleNamespace

import pytest

from fairstream.state.store import MemoryStore
from fairstream.streams.processor import Processor
from fairstream.wire.topics import Topics
from tests.builders import worker_config

from offline import Wire, done, heartbeat, processor, run, task, until


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
        first = start.get("worker.journal:0", 0)
        for offset, record in enumerate(self.wire.journal[first:], first):
            yield "worker.journal:0", offset, record

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


@pytest.mark.parametrize("restore", [
    pytest.param("empty", id="a Redis restarted empty while the worker was down"),
    pytest.param("older", id="a Redis restored from an older file while the worker was down"),
])
@pytest.mark.parametrize("committed", [
    pytest.param(True, id="Kafka's committed offsets behind the journal"),
    pytest.param(False, id="no offset committed in Kafka yet"),
])
def test_a_worker_killed_9_reads_again_every_batch_the_journal_holds_past_kafkas_committed_offsets(restore,
                                                                                                   committed):
    # Found by an operator's trial: kill -9, FLUSHALL, restart: tasks placed twice. Faust
    # commits offsets every few seconds, the journal gets every batch; the rebuild read only up
    # to Kafka's committed offsets and the later input came again as new batches. Applied as it
    # arrived: t1 (time 2) and t2 (5) wait, t0's completion (3) comes last and places t1 at 5.
    # Handed over again as the agents happen to fetch it (t1, the completion, t2), t1 would be
    # placed at 3: a second placement of a task an agent already runs.
    import copy

    store, wire, kafka, (heartbeat_0, t0, t1, t2, t0_done) = late_completion_on_kafka()

    async def scenario():
        p = await node_and_t0_applied(store, wire, kafka, heartbeat_0, t0)
        kafka_offsets = {position: p.applied.get(position, 0) if committed else 0 for position in kafka.messages}
        saved = copy.deepcopy(store) if restore == "older" else MemoryStore()
        await p.handle([t1, t2])
        await p.handle([t0_done])  # then kill -9: Kafka still has the offsets of before
        restarted = processor(saved, wire, input_log=kafka.input_log())
        restarted.consuming_from(kafka_offsets)
        for batch in ([heartbeat_0, t0] if not committed else [], [t1], [t0_done], [t2]):
            if batch:
                await restarted.handle(batch)
        return restarted

    restarted = run(scenario())
    placed = sorted({(d["task"], d["time"]) for d in wire.decisions() if d["kind"] == "place"})
    assert placed == [("t0", 1), ("t1", 5)]
    assert wire.dead() == []
    assert sorted(restarted.sessions["c1"].engine.tasks) == ["t1", "t2"]


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


def late_completion_on_kafka():
    """``late_completion`` as Kafka holds it, an empty store and the wire: ``(store, wire,
    kafka, its messages: heartbeat_0, t0, t1, t2, t0_done)``."""
    store, wire = MemoryStore(), Wire()
    kafka = Partitions(wire, late_completion())
    [heartbeat_0], [t0, t1, t2], [t0_done] = kafka.messages.values()
    return store, wire, kafka, (heartbeat_0, t0, t1, t2, t0_done)


async def node_and_t0_applied(store, wire, kafka, heartbeat_0, t0) -> Processor:
    """A worker on ``store`` that has applied the first batch: the node and t0."""
    p = processor(store, wire, input_log=kafka.input_log())
    await p.handle([heartbeat_0, t0])
    return p


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

    store, wire, kafka, (heartbeat_0, t0, t1, t2, t0_done) = late_completion_on_kafka()

    async def scenario():
        p = await node_and_t0_applied(store, wire, kafka, heartbeat_0, t0)
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


def test_a_rebuild_cut_short_by_the_store_goes_on_from_the_journal_record_it_had_reached():
    # Found by the redis-older drill in CI: the running worker rebuilt from an older Redis, and
    # the store failed after the first batch it applied again. That commit had recorded the
    # journal as read up to the worker's latest record (all of it), so the second rebuild read
    # no record and merged the rest by event time: t0's completion (3) before t2 (5), t1 placed
    # at 3 where the journal's order placed it at 5 (published). A batch applied again from the
    # journal records the journal as read just past its own record.
    import copy

    class FlakyStore(MemoryStore):
        """Once armed, its commit of t2's batch fails once (Redis went away again)."""

        armed = False

        async def commit(self, batch):
            if self.armed and batch.offsets.get("tasks.submitted:0") == 3:
                self.armed = False
                raise ConnectionError("Connection closed by server.")
            await super().commit(batch)

    store, wire = FlakyStore(), Wire()
    kafka = Partitions(wire, late_completion() + [("completed", done("t1", 6))])
    [heartbeat_0], [t0, t1, t2], [t0_done, t1_done] = kafka.messages.values()

    async def scenario():
        p = processor(store, wire, input_log=kafka.input_log())
        await p.handle([heartbeat_0, t0])
        older = copy.deepcopy(store)  # the file Redis is restored from
        for batch in ([t1], [t2], [t0_done]):
            await p.handle(batch)
        p.store, older.armed = older, True
        for _attempt in range(4):  # the agent tries its batch again after each failure
            try:
                await p.handle([t1_done])
                break
            except Exception:  # the log found shorter, then the store gone once
                continue
        return p

    p = run(scenario())
    by_id = {d["id"]: d for d in wire.decisions()}
    assert sorted((d["task"], d["time"]) for d in by_id.values() if d["kind"] == "place") == [
        ("t0", 1), ("t1", 5), ("t2", 6)]
    assert sorted(p.sessions["c1"].engine.finished_ids) == ["t0", "t1"]


def test_a_message_rejected_unapplied_is_rejected_again_when_the_store_is_rebuilt():
    # Applying it kept failing, so it was dead-lettered without being applied (Processor.reject);
    # the rebuild must not apply it now (t1 would be placed, a decision never taken before).
    import copy

    store, wire, kafka, (heartbeat_0, t0, t1, t2, _) = late_completion_on_kafka()

    async def scenario():
        p = await node_and_t0_applied(store, wire, kafka, heartbeat_0, t0)
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

    journaling = []

    async def publish(topic, key, message):
        if topic == Topics().journal:
            journaling.append(message)
            await acknowledge.wait()
        elif not acknowledge.is_set():
            published_before_ack.append(message)
        return await Wire.publish(wire, topic, key, message)

    async def scenario():
        p = Processor(MemoryStore(), publish, worker_config("drf"), input_log=kafka.input_log())
        handled = asyncio.create_task(p.handle([*kafka.messages["nodes.heartbeats:0"], *kafka.messages["tasks.submitted:0"]]))
        await until(lambda: journaling and not handled.done())
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
    config = worker_config(policy, params=params, snapshot_every=1)

    async def life():
        p = Processor(store, wire.publish, config)
        batch = [wire.msg("heartbeat", heartbeat(cpu=20, mem=100))]
        batch += [wire.msg("submitted", task(f"{t}{i}", t, 0, cpu=1, mem=m)) for t, m in (("A", 6), ("B", 2)) for i in range(30)]
        await p.handle(batch)
        return p

    run(life())
    placed = [d["tenant"] for d in wire.decisions()]
    used = (sum(6 if t == "A" else 2 for t in placed), len(placed))
    assert used[0] <= 100 and used[1] <= 20 and len(placed) >= 18

    async def restarted():
        p = Processor(store, wire.publish, config)
        await p.start()
        return (await p.session("c1")).engine

    engine = run(restarted())  # from the snapshot: the policy is found again by name
    assert engine.policy == policy


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
