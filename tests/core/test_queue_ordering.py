"""Ordering inside a queue (issue "Queue configuration", point 1): a leaf orders its own jobs
(``fifo``, ``fair``, ``drf``, ``ltrf``) while the cluster's policy shares between tenants as
before; under ``hltrf`` a queue orders its children the same way (YARN's per-queue
``schedulingPolicy``). A flat policy refuses a queue's ordering of children, with the reason."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from fairstream.core.model import ModelError, TaskCompleted, TaskSubmitted, TenantsChanged, TenantSpec
from fairstream.sim.scenario import parse_scenario
from fairstream.sim.simulator import Simulator
from fairstream.state.engine_snapshot import decode_engine, encode_engine

from builders import engine, node, submit, tree

# Every policy that serves a tenant's tasks in the order the tenant gives them.
POLICIES = ["fair", "drf", "ltrf", "fifo", "tsf", "hltrf", "tetris", "perf", "qknobler", "cdrf", "pmdrf", "drfh", "static"]


def placed_jobs(result) -> Counter:
    return Counter(d.job for d in result.decisions for _ in range(d.count or 1))


def history_then_two_jobs(ordering: str | None, policy: str = "drf"):
    """One tenant A, one node of 2 GB, tasks of 1 GB. Job j1 runs two tasks from 0 to 10; at 10
    they end, j1 queues four more and then j2 four: who gets the 2 GB now?"""
    e = engine(tree(TenantSpec("A", ordering=ordering)), policy, quantum=1, quantum_mode="fixed") if policy in (
        "ltrf", "hltrf") else engine(tree(TenantSpec("A", ordering=ordering)), policy)
    first = e.step(0, [node("n", mem=2), submit("a1", "A", job="j1"), submit("a2", "A", job="j1")])
    assert placed_jobs(first) == {"j1": 2}
    later = [TaskCompleted(10, "a1"), TaskCompleted(10, "a2")]
    later += [submit(f"a{k}", "A", 10, job="j1") for k in range(3, 7)]
    later += [submit(f"b{k}", "A", 10, job="j2") for k in range(1, 5)]
    return e, e.step(10, later)


@pytest.mark.parametrize("ordering, expected", [
    # fifo (and no ordering): j1's tasks came first.
    pytest.param(None, {"j1": 2}, id="without an ordering the earliest tasks go first"),
    pytest.param("fifo", {"j1": 2}, id="fifo serves the earliest waiting task first"),
    # fair, drf: both jobs run nothing now (0 GB each): j1 (earliest waiting) gets one, then
    # j2 is lower (0 < 1 GB) and gets the other.
    pytest.param("fair", {"j1": 1, "j2": 1}, id="fair gives the job with the least memory running the next task"),
    pytest.param("drf", {"j1": 1, "j2": 1}, id="drf gives the job with the lowest dominant share the next task"),
    # ltrf: j1 used 2 GB x 10 s = 20 GB.s (10 s of the 2 GB cluster), j2 nothing. Each task the
    # pass gives j2 counts one quantum x 1 GB; A's quantum adapted to its tasks' mean run time,
    # 10 s: 10 GB.s = 5 s of the cluster after the first, still below j1's 10: j2 gets both.
    pytest.param("ltrf", {"j2": 2}, id="ltrf gives the job with the lowest accumulated usage the next task"),
])
def test_a_leaf_orders_its_own_jobs(ordering, expected):
    _, result = history_then_two_jobs(ordering)
    assert placed_jobs(result) == expected


def test_ltrf_among_jobs_pays_back_a_job_that_ran_less():
    # As above, but the quantum is 1 s (fixed): j2's first task counts 1 GB x 1 s = 0.5 s of the
    # cluster, its second 1 s, both below j1's 10 s: j2 gets both; fair would split them.
    e = engine(tree(TenantSpec("A", ordering="ltrf")), "ltrf", quantum=1, quantum_mode="fixed")
    e.step(0, [node("n", mem=2), submit("a1", "A", job="j1"), submit("a2", "A", job="j1")])
    later = [TaskCompleted(10, "a1"), TaskCompleted(10, "a2")]
    later += [submit(f"a{k}", "A", 10, job="j1") for k in range(3, 7)]
    later += [submit(f"b{k}", "A", 10, job="j2") for k in range(1, 5)]
    assert placed_jobs(e.step(10, later)) == {"j2": 2}
    # j2 runs both to 30: it used 2 GB x 20 s = 40 GB.s (20 s), j1 20 GB.s (10 s): j1's turn.
    again = e.step(30, [TaskCompleted(30, "b1"), TaskCompleted(30, "b2")])
    assert placed_jobs(again) == {"j1": 2}


def test_a_jobs_usage_is_kept_while_it_waits_and_forgotten_when_nothing_of_it_runs_or_waits():
    e, _ = history_then_two_jobs("ltrf")
    usage = e.jobs.usage["A"]
    assert set(usage) == {"j1", "j2"}  # both have tasks waiting
    # j1 at 10: nothing running, 2 tasks x 1 GB x 10 s used (closed form: allocation 0, offset 20).
    assert usage["j1"].accumulated(10.0).tolist() == [20.0] and usage["j1"].allocation.tolist() == [0.0]
    assert usage["j2"].allocation.tolist() == [2.0]
    done = [TaskCompleted(20, t.id) for t in list(e.tasks.values()) if t.job == "j2"]
    done += [TaskCompleted(20, f"b{k}") for k in (3, 4)]
    e.step(20, done)  # j2's two running tasks end, its two waiting ones are cancelled
    assert "j2" not in e.jobs.usage["A"] and "j1" in e.jobs.usage["A"]
    assert "j2" not in e.jobs.usage["A"]


def test_a_request_with_a_count_is_taken_task_by_task_in_the_jobs_order():
    # Two jobs of one tenant ask for 4 tasks each as requests; drf inside the leaf alternates,
    # and the task ids are each request's next ones (the engine accepts them in that order).
    e = engine(tree(TenantSpec("A", ordering="drf")), "fair")
    result = e.step(0, [node("n", mem=4),
                        TaskSubmitted(0, "r1", "j1", "A", {"mem": 1}, None, 4),
                        TaskSubmitted(0, "r2", "j2", "A", {"mem": 1}, None, 4)])
    assert placed_jobs(result) == {"j1": 2, "j2": 2}
    assert sorted(t for d in result.decisions for t in (d.tasks or (d.task,))) == ["r1-0", "r1-1", "r2-0", "r2-1"]


def two_jobs_of_one_tenant_and_another_tenant(ordering: str | None) -> dict:
    """16 cpu; tenant A has jobs a1 (12 tasks) and a2 (12 tasks, after a1), tenant B 12 tasks."""
    tasks = [{"id": name, "job": name, "tenant": tenant, "submit": 0, "duration": 100,
              "demand": {"cpu": 1, "mem": 1}, "count": 12} for name, tenant in (("a1", "A"), ("a2", "A"), ("b", "B"))]
    a = {"id": "A"} if ordering is None else {"id": "A", "ordering": ordering}
    return {"resources": ["cpu", "mem"], "nodes": [{"id": "n", "capacity": {"cpu": 16, "mem": 64}}],
            "tenants": [a, {"id": "B"}], "tasks": tasks}


def first_pass(document: dict, policy: str) -> Counter:
    params = {"resource": "cpu"} if policy in ("fair", "ltrf", "hltrf") else {}
    simulator = Simulator(parse_scenario(document), policy, params)
    held: Counter = Counter()

    def watch(engine, result):
        if not held:
            held.update(t.job for t in engine.tasks.values() if t.state.value == "running")

    simulator.on_step = watch
    simulator.run()
    return held


@pytest.mark.parametrize("policy", POLICIES)
def test_under_every_policy_a_leafs_ordering_divides_its_own_share_and_only_that(policy):
    # Whatever A gets from the policy, fair inside A splits it between a1 and a2 (each within
    # one task of the other) where fifo gives it all to a1; B gets the same either way.
    fifo = first_pass(two_jobs_of_one_tenant_and_another_tenant(None), policy)
    fair = first_pass(two_jobs_of_one_tenant_and_another_tenant("fair"), policy)
    assert fifo["b"] == fair["b"]
    assert fifo["a1"] + fifo["a2"] == fair["a1"] + fair["a2"]
    if fifo["a1"] + fifo["a2"] >= 2:
        assert fifo["a2"] == 0 or fifo["a1"] == 12
        assert abs(fair["a1"] - fair["a2"]) <= 1


def hierarchy(ordering: str | None):
    """Queue G (with the given ordering of its children) holds leaves a and b; 3 GB; hltrf with
    a fixed quantum of 1 s. From 0 to 10 a runs two tasks and b one; at 10 they end and a, then
    b, queue three tasks each: who gets the 3 GB?"""
    g = TenantSpec("G", ordering=ordering)
    e = engine(tree(g, TenantSpec("a", parent="G"), TenantSpec("b", parent="G")), "hltrf",
               quantum=1, quantum_mode="fixed")
    e.step(0, [node("n", mem=3), submit("a1", "a"), submit("a2", "a"), submit("b0", "b")])
    later = [TaskCompleted(10, t) for t in ("a1", "a2", "b0")]
    later += [submit(f"a{k}", "a", 10) for k in (3, 4, 5)] + [submit(f"b{k}", "b", 10) for k in (1, 2, 3)]
    result = e.step(10, later)
    return Counter(d.tenant for d in result.decisions), result


@pytest.mark.parametrize("ordering, expected", [
    # hltrf's own order (ltrf): a used 2 GB x 10 s = 20 GB.s, 6.67 s of the 3 GB cluster, per
    # weight 0.5: 13.3; b used 10 GB.s: 6.67. Each task b gets counts 1 GB x 1 s: +0.67 per
    # weight; after three b is at 8.67, still below a: b gets all three.
    pytest.param(None, {"b": 3}, id="without an ordering the queue's children go by usage per weight"),
    pytest.param("ltrf", {"b": 3}, id="ltrf is hltrf's own order"),
    # fifo: a's tasks were queued first.
    pytest.param("fifo", {"a": 3}, id="fifo gives the child with the earliest waiting task"),
    # fair, drf: nothing runs at 10: a (tie at 0 GB; a before b), then b (0 < 1 GB), then a
    # (tie at 1 GB).
    pytest.param("fair", {"a": 2, "b": 1}, id="fair gives the child with the least running"),
    pytest.param("drf", {"a": 2, "b": 1}, id="drf gives the child with the lowest dominant share"),
])
def test_under_hltrf_a_queue_orders_its_children(ordering, expected):
    held, result = hierarchy(ordering)
    assert held == expected
    if ordering in ("fifo", "fair", "drf"):
        assert f"[{ordering} in G]" in result.decisions[0].reason


def test_a_flat_policy_refuses_a_queue_that_orders_its_children():
    specs = (TenantSpec("G", ordering="fifo"), TenantSpec("a", parent="G"))
    with pytest.raises(ModelError, match=r"tenants\[G\]\.ordering: orders a queue's children, which only a "
                                         r"hierarchical policy \(hltrf\) does; ltrf shares"):
        engine(tree(*specs), "ltrf")
    running = engine(tree("b"), "drf")
    running.step(0, [node("n", mem=1)])
    result = running.step(1, [TenantsChanged(1, specs + (TenantSpec("b"),))])
    assert "tenants[G].ordering" in result.rejected[0][1] and running.tree.specs.keys() == {"b"}


@pytest.mark.parametrize("document, message", [
    pytest.param({"tenants": [{"id": "A", "ordering": "lifo"}]}, "tenants[0].ordering", id="an unknown ordering"),
])
def test_a_bad_ordering_in_a_scenario_is_one_line_naming_the_field(document, message):
    document = {"resources": ["mem"], "nodes": [{"id": "n", "capacity": {"mem": 1}}], "tasks": [], **document}
    with pytest.raises(ModelError) as error:
        parse_scenario(document)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_an_ordering_set_while_jobs_run_starts_from_what_they_run_now():
    # A runs j1's two tasks from 0 (no ordering); at 10 a tenants.config gives A ltrf, and j1
    # queues more tasks, then j2: j1's running tasks count from their start (2 GB x 10 s), so j2
    # goes first for the GB that frees at 10.
    e = engine(tree("A"), "drf")
    e.step(0, [node("n", mem=3), submit("a1", "A", job="j1"), submit("a2", "A", job="j1")])
    result = e.step(10, [TenantsChanged(10, (TenantSpec("A", ordering="ltrf"),)),
                         submit("a3", "A", 10, job="j1"), submit("b1", "A", 10, job="j2")])
    assert not result.rejected
    assert placed_jobs(result) == {"j2": 1}
    assert e.jobs.usage["A"]["j1"].accumulated(10.0).tolist() == [20.0]


def test_an_engine_read_back_orders_jobs_as_the_one_written():
    written, _ = history_then_two_jobs("ltrf")
    read = decode_engine(encode_engine(written))
    events = [TaskCompleted(40, d) for d in ("a3", "b1")] + [submit("c1", "A", 40, job="j3")]
    assert read.step(40, events).decisions == written.step(40, events).decisions


@pytest.mark.parametrize("body, outcome", [
    pytest.param({"cluster": "c1", "tenants": [{"id": "A", "ordering": "ltrf"}]}, "ltrf",
                 id="a tenants.config message carries a leaf's ordering"),
    pytest.param({"cluster": "c1", "tenants": [{"id": "A", "ordering": "lifo"}]}, "tenants.0.ordering",
                 id="an unknown ordering on tenants.config is refused naming the field"),
])
def test_tenants_config_carries_the_ordering_and_its_log_entry_too(body, outcome):
    from fairstream.wire.events import CONFIG, BadInput, decode_message, event_from_json, event_to_json

    raw = json.dumps(body).encode()
    if outcome != "ltrf":
        with pytest.raises(BadInput, match=outcome.replace(".", r"\.")):
            decode_message(CONFIG, raw)
        return
    (decoded,) = decode_message(CONFIG, raw)
    assert decoded.event.tenants[0].ordering == "ltrf"
    logged = event_to_json(TenantsChanged(1.0, decoded.event.tenants))  # as the worker's log records it
    assert logged["tenants"] == [{"id": "A", "ordering": "ltrf"}]
    assert event_from_json(logged).tenants[0].ordering == "ltrf"


def test_why_is_my_task_pending_lists_a_leafs_entries_in_its_jobs_order():
    # A runs four tasks of j1 on its 4 GB; j2 queued later waits with nothing running, so under
    # fair it is A's next job: listed first, position 0; j1's waiting tasks after its 3.
    from fairstream.core.explain import explain

    e = engine(tree(TenantSpec("A", ordering="fair")), "drf")
    e.step(0, [node("n", mem=4)] + [submit(f"a{k}", "A", job="j1") for k in range(6)])
    e.step(1, [submit(f"b{k}", "A", 1, job="j2") for k in range(3)])
    listed = [(entry.job, entry.position) for entry in explain(e, [], None).pending["A"]]
    assert listed == [("j2", 0), ("j2", 1), ("j2", 2), ("j1", 3), ("j1", 4)]


def test_an_engine_read_back_orders_a_queues_children_as_the_one_written():
    # The tree's queue orderings are derived from its specs, made again on reading.
    g = TenantSpec("G", ordering="fair")
    written = engine(tree(g, TenantSpec("a", parent="G"), TenantSpec("b", parent="G")), "hltrf")
    written.step(0, [node("n", mem=3), submit("a1", "a"), submit("a2", "a"), submit("b0", "b"), submit("b1", "b")])
    read = decode_engine(encode_engine(written))
    assert read.tree.queue_orderings == {"G": "fair"}
    events = [TaskCompleted(10, "a1"), submit("a3", "a", 10), submit("b2", "b", 10)]
    assert read.step(10, events).decisions == written.step(10, events).decisions
