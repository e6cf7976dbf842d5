"""Live changes to the tenant tree (issue "Queue configuration", point 4): a ``TenantsChanged``
event, on the worker's ``tenants.config`` topic or a scenario's ``tenants`` event, applied at
its point in the event order with accumulated usage kept, recorded in the worker's log so that
``simulate --events`` reproduces the worker's decisions, and rejected whole, with the reason,
when it cannot apply."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import pytest

from fairstream.cli import main
from fairstream.core.model import TenantsChanged, TenantSpec
from fairstream.sim.scenario import parse_scenario
from fairstream.sim.simulator import Simulator
from fairstream.state.store import MemoryStore
from fairstream.streams.processor import Incoming, Processor
from fairstream.wire.topics import Topics

from builders import engine, node, submit, tree, worker_config

TWO_TENANTS = {
    # One node of 100 GB; A and B each keep a backlog of 1 GB tasks of 10 s from t = 0.
    "resources": ["mem"],
    "nodes": [{"id": "n", "capacity": {"mem": 100}}],
    "tenants": [{"id": "A"}, {"id": "B"}],
    "tasks": [{"id": t.lower(), "job": t, "tenant": t, "submit": 0, "duration": 10, "demand": {"mem": 1},
               "count": 2000} for t in "AB"],
}


def held(document: dict, policy: str = "fair") -> tuple[list, Simulator]:
    """Simulate; after every step, what each tenant runs."""
    running = []

    def watch(engine, result):
        counts = Counter(t.tenant for t in engine.tasks.values() if t.state.value == "running")
        running.append((engine.time, dict(counts)))

    simulator = Simulator(parse_scenario(document), policy, {"resource": "mem"}, on_step=watch)
    simulator.run()
    return running, simulator


def at(running, time: float) -> dict:
    return [counts for t, counts in running if t <= time][-1]


def test_a_weight_changed_at_t_100_moves_the_shares_from_then_on_and_keeps_usage():
    # Equal weights: 50 GB each. At t = 100 A's weight becomes 3: A's share is 3/4 = 75 GB.
    # Every task started at t = 90 ends at t = 100, the instant the change applies, so the pass
    # at t = 100 already serves the new shares: 75 to A, 25 to B.
    document = {**TWO_TENANTS, "events": [{"time": 100, "type": "tenants",
                                           "tenants": [{"id": "A", "weight": 3}, {"id": "B"}]}]}
    running, simulator = held(document)
    assert at(running, 99) == {"A": 50, "B": 50} and at(running, 100) == {"A": 75, "B": 25}
    # Usage is kept, not restarted: by t = 100 each had held 50 GB for 100 s.
    usage = simulator.metrics.integral_g
    assert usage["A"] > 100 * 0.5 and usage["B"] > 100 * 0.5


def test_a_queue_added_while_running_gets_its_share():
    # At t = 100 a queue G with leaf C (weight 2 of 4 at the top level) joins; C has no tasks
    # until t = 150, then its backlog takes half of the node as tasks end.
    document = {**TWO_TENANTS,
                "tasks": TWO_TENANTS["tasks"] + [{"id": "c", "job": "C", "tenant": "C", "submit": 150, "duration": 10,
                                                  "demand": {"mem": 1}, "count": 2000}],
                "events": [{"time": 100, "type": "tenants", "tenants": [
                    {"id": "A"}, {"id": "B"}, {"id": "G", "weight": 2}, {"id": "C", "parent": "G"}]}]}
    running, _ = held(document)
    assert at(running, 149) == {"A": 50, "B": 50} and at(running, 170) == {"A": 25, "B": 25, "C": 50}


def busy_engine(auto_tenants: bool = True, **params):
    e = engine(tree(TenantSpec("G"), TenantSpec("A", parent="G"), "B"), "drf", resources=("mem",), **params)
    e.auto_tenants = auto_tenants
    e.step(0.0, [node("n", mem=4), submit("a1", "A", mem=1), submit("b1", "B", mem=1)])
    return e


@pytest.mark.parametrize("tenants, auto, reason", [
    pytest.param([TenantSpec("G"), TenantSpec("A"), TenantSpec("B")], True,
                 "tenants[A].parent: 'root', was 'G': a tenant cannot move to another parent",
                 id="moving a tenant to another parent"),
    pytest.param([TenantSpec("G"), TenantSpec("A", parent="G")], False,
                 "'B' has running or pending tasks and is not in the new tree",
                 id="leaving out a tenant with tasks, without auto tenants"),
    pytest.param([TenantSpec("G"), TenantSpec("A", parent="G"), TenantSpec("B"), TenantSpec("B2", parent="B")], True,
                 "tenants[B]: has running or pending tasks, so it cannot become a queue with children",
                 id="making a tenant with tasks a queue"),
    # Left out, a tenant would stay as one joins: at the root, weight 1, no limits. A's place
    # under G (refused when asked for) and its max_share would go without a word (an operator's
    # c lost its max_share so, and 11 of its tasks were preempted).
    pytest.param([TenantSpec("G"), TenantSpec("B")], True,
                 "tenants: 'A' has running or pending tasks and is not in the new tree: it would become a leaf under "
                 "the root with weight 1 and no limits, losing parent 'G'; list it as it is",
                 id="leaving out a busy tenant the tree placed under a queue, with auto tenants"),
    pytest.param([TenantSpec("A", parent="nowhere")], True, "tenants: tenants[A].parent: unknown tenant 'nowhere'",
                 id="a tree with an unknown parent"),
    pytest.param([TenantSpec("G", weight=0.0), TenantSpec("A", parent="G"), TenantSpec("B")], True,
                 "tenants[G].weight: must be > 0", id="a weight of zero"),
])
def test_a_bad_tree_is_rejected_whole_and_the_old_one_stays(tenants, auto, reason):
    e = busy_engine(auto)
    before = dict(e.tree.effective_share)
    result = e.step(1.0, [TenantsChanged(1.0, tuple(tenants))])
    assert len(result.rejected) == 1 and reason in result.rejected[0][1]
    assert e.tree.effective_share == before


def test_with_auto_tenants_a_busy_tenant_left_out_stays_a_leaf_under_the_root():
    e = busy_engine(True)
    e.step(1.0, [TenantsChanged(1.0, (TenantSpec("G", weight=3), TenantSpec("A", parent="G")))])
    # G weight 3, B (kept, weight 1) at the top level: A 3/4, B 1/4.
    assert e.tree.effective_share == {"A": 0.75, "B": 0.25}


def message(kind: str, offset: int, body: dict) -> Incoming:
    topic = {"heartbeat": Topics.heartbeats, "submitted": Topics.submitted, "completed": Topics.completed,
             "config": Topics.config}[kind]
    return Incoming(kind, json.dumps(body).encode(), topic, 0, offset)


def test_the_worker_applies_a_new_tree_at_its_clock_records_it_and_replays_to_the_same_decisions(tmp_path, capsys):
    published = []

    async def publish(topic, key, body):
        published.append((topic, body))

    store = MemoryStore()
    processor = Processor(store, publish, worker_config("fair", params={"resource": "mem"}))
    first = [message("heartbeat", 0, {"cluster": "c1", "node": "n", "time": 0, "capacity": {"cpu": 8, "mem": 8}})]
    tasks = [(f"A{k}", "A") for k in range(12)] + [(f"B{k}", "B") for k in range(8)]
    first += [message("submitted", k, {"cluster": "c1", "task": task, "tenant": tenant, "time": 0,
                                       "demand": {"cpu": 1, "mem": 1}}) for k, (task, tenant) in enumerate(tasks)]
    # Equal weights at t = 0: A0-A3 and B0-B3 run, 4 GB each. The new tree (A weight 3, sent
    # without a time: applied at the clock, t = 0) makes A's share 6 of the 8 GB. At t = 5 all
    # eight end, and the pass gives A 6 (A4-A9) and B 2 (B4, B5).
    done = [message("completed", k, {"cluster": "c1", "task": task, "time": 5})
            for k, task in enumerate(["A0", "A1", "A2", "A3", "B0", "B1", "B2", "B3"])]
    change = message("config", 0, {"cluster": "c1", "tenants": [{"id": "A", "weight": 3}, {"id": "B"}]})
    bad = message("config", 1, {"cluster": "c1", "tenants": [{"id": "A", "parent": "ghost"}]})

    async def scenario():
        await processor.handle(first)
        await processor.handle([change, bad])
        await processor.handle(done)
        return await store.full_log("c1")

    recorded = asyncio.run(scenario())
    decisions = [body for topic, body in published if topic == Topics.decisions]
    later = Counter(d["tenant"] for d in decisions if d["time"] == 5 and d["kind"] == "place")
    assert later == {"A": 6, "B": 2}
    dead = [body for topic, body in published if topic == Topics.deadletter]
    assert len(dead) == 1 and "unknown tenant 'ghost'" in dead[0]["reason"]
    configs = [event for step in recorded.steps for event in step["events"] if event["type"] == "config"]
    assert configs == [{"type": "config", "time": 0.0, "tenants": [{"id": "A", "weight": 3.0}, {"id": "B"}]}]
    log = tmp_path / "input.jsonl"
    log.write_text("".join(json.dumps(step) + "\n" for step in recorded.steps))
    out = tmp_path / "replay"
    assert main(["simulate", "--events", str(log), "--policy", "fair", "--param", "resource=mem", "--cluster", "c1",
                 "--out", str(out)]) == 0
    assert [json.loads(line) for line in (out / "decisions.jsonl").read_text().splitlines()] == decisions


def test_configure_checks_the_file_before_it_sends_anything(tmp_path, capsys):
    path = tmp_path / "tenants.json"
    path.write_text(json.dumps({"tenants": [{"id": "A", "weight": -1}]}))
    assert main(["configure", "--cluster", "c1", "--tenants", str(path), "--broker", "127.0.0.1:1"]) == 2
    err = capsys.readouterr().err
    assert "tenants.0.weight" in err and err.count("\n") == 1


@pytest.mark.parametrize("tenants, says", [
    pytest.param([{"id": "a", "parent": "b"}, {"id": "b", "parent": "c"}, {"id": "c", "parent": "a"}],
                 "tenants[a].parent: the tree has a cycle a -> b -> c -> a", id="a cycle is named"),
    pytest.param([{"id": "a", "parent": "zz"}], "tenants[a].parent: unknown tenant 'zz'", id="an unknown parent"),
])
def test_configure_refuses_a_tree_that_is_no_tree_before_it_reads_or_sends_anything(tmp_path, capsys, tenants, says):
    path = tmp_path / "tenants.json"
    path.write_text(json.dumps({"tenants": tenants}))
    assert main(["configure", "--cluster", "c1", "--tenants", str(path), "--broker", "127.0.0.1:1",
                 "--redis", "redis://127.0.0.1:1/0"]) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1


def test_min_shares_over_the_cluster_are_warned_in_one_line(tmp_path, capsys):
    # 0.7 + 0.6 = 1.3 of the cluster guaranteed: each is scaled to 1/1.3 of itself.
    scenario = tmp_path / "s.json"
    scenario.write_text(json.dumps({
        "resources": ["cpu"], "nodes": [{"id": "n", "capacity": {"cpu": 4}}],
        "tenants": [{"id": "a", "min_share": 0.7}, {"id": "b", "min_share": 0.6}],
        "tasks": [{"id": "t", "job": "j", "tenant": "a", "submit": 0, "duration": 1, "demand": {"cpu": 1}}]}))
    assert main(["simulate", "--scenario", str(scenario), "--policy", "drf", "--no-baseline", "--no-plots",
                 "--out", str(tmp_path / "out")]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert warnings == ["fairstream: warning: min_share adds up to 1.3 of the cluster: no guarantee can be kept "
                        "whole, each is scaled down in proportion (to 0.769 of it)"]


@pytest.mark.parametrize("preemption, fate", [
    pytest.param("on", "with preemption on they are taken back", id="with preemption on"),
    pytest.param("off", "preemption is off: they run to their end", id="without preemption"),
])
def test_a_dry_run_shows_the_queues_that_change_and_what_new_limits_do_to_running_tasks(preemption, fate):
    # G{A} and B on a node of 4 GB; A runs a1, B runs b1. The new tree weighs G 2 and gives A
    # max_share 0: A's running task is over it. It was accepted without a word, and the dry
    # run listed the leaves only.
    from fairstream.cli import _shares_before_and_after

    e = busy_engine(True, preemption=preemption)
    new = e.admission_tree(TenantsChanged(1.0, (TenantSpec("G", weight=2), TenantSpec("A", parent="G", max_share=0.0),
                                                TenantSpec("B"))))
    shown = _shares_before_and_after(e, new)
    assert shown["queues"] == [{"queue": "G", "before_after": {"weight": [1.0, 2.0]}}]
    [warning] = shown["warnings"]
    assert warning.startswith("A runs 1 task over its new max_share 0 (it holds 0.25): they keep running and none of "
                              "its tasks starts until it is within it; ")
    assert fate in warning
