"""What operators run and read of the worker, without Kafka or Redis: the Faust agents through
``test_context``, the metrics, logs, the command line and the views written per batch."""

import dataclasses
import json
from types import SimpleNamespace

import pytest

from fairstream.state.store import MemoryStore
from fairstream.streams.app import WorkerConfig, create_app
from fairstream.streams.processor import Incoming, Processor
from fairstream.wire.topics import Topics
from tests.builders import worker_config

from offline import Wire, heartbeat, processor, run, task, until


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

    from fairstream.collector import FULL_COLLECTION_AFTER, tune_gc

    before = gc.get_threshold()
    try:
        tune_gc()
        assert gc.get_freeze_count() > 10_000  # the modules, classes and functions loaded so far
        assert gc.get_threshold() == (before[0], before[1], FULL_COLLECTION_AFTER)
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


_LARGE_BLOCK_AFTER_A_LARGER_ONE_FREED = r"""
import ctypes, sys
from fairstream.collector import fix_mmap_threshold
class Info(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]
libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = Info
if sys.argv[1] == "held":
    assert fix_mmap_threshold()
freed = bytearray(8 << 20)
del freed
kept = bytearray(6 << 20)
print("own pages" if libc.mallinfo2().hblkhd >= 6 << 20 else "heap")
"""


@pytest.mark.parametrize("threshold, where", [
    pytest.param("held", "own pages", id="with the worker's threshold a large block always gets pages of its own"),
    pytest.param("default", "heap",
                 id="with glibc's default a large block after a larger one freed comes from the heap"),
])
def test_the_worker_keeps_large_blocks_out_of_its_heap(threshold, where):
    # Issue 60: the worker's large blocks (a snapshot read and sent to Redis) left holes in the
    # heap once glibc raised its mmap threshold; RSS rose 14 % over ten minutes, 9 % held.
    import ctypes
    import subprocess
    import sys

    try:
        _ = ctypes.CDLL("libc.so.6").mallinfo2
    except (OSError, AttributeError):
        pytest.skip("not glibc 2.33 or later")
    out = subprocess.run([sys.executable, "-c", _LARGE_BLOCK_AFTER_A_LARGER_ONE_FREED, threshold],
                         capture_output=True, text=True, check=True).stdout.strip()
    assert out == where


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
    p = Processor(MemoryStore(), wire.publish, worker_config("drf", params={"preemption": "on", "preemption_timeout": "1"}))
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


def test_the_worker_shows_starved_tenants_and_how_long_each_has_been_starved():
    # One node of 4 cpu under drf with preemption after 100 s: A fills it at t = 0; B asks for
    # 4 at t = 2 (fair share 2, holds 0): starved from 2. At t = 7 one tenant is starved, for
    # 7 - 2 = 5 s; A is not (0).
    wire = Wire()
    p = Processor(MemoryStore(), wire.publish, worker_config("drf", params={"preemption": "on", "preemption_timeout": "100"},
                                                              explain_interval=0.0))

    async def scenario():
        await p.handle([wire.msg("heartbeat", heartbeat())] + [wire.msg("submitted", task(f"a{k}", "A", 0))
                                                               for k in range(4)])
        await p.handle([wire.msg("submitted", task(f"b{k}", "B", 2)) for k in range(4)])
        await p.handle([wire.msg("heartbeat", heartbeat(time=7))])

    run(scenario())
    assert metric(p, "fairstream_starved_tenants", cluster="c1") == 1
    assert metric(p, "fairstream_tenant_starved_seconds", cluster="c1", tenant="B") == 5.0
    assert metric(p, "fairstream_tenant_starved_seconds", cluster="c1", tenant="A") == 0.0


def test_the_metrics_page_describes_the_fair_share_it_shows():
    # It once described the old flat definition ("its weight over the tenants with work").
    from prometheus_client import generate_latest

    from fairstream.streams.prometheus import WorkerMetrics

    page = generate_latest(WorkerMetrics().registry).decode()
    [help_line] = [line for line in page.splitlines() if line.startswith("# HELP fairstream_tenant_fair_share ")]
    assert "fairness.fair_shares: hierarchical, demand-capped by max_share and max_resources" in help_line
    assert "its weight over the tenants with work" not in help_line
