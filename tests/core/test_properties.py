"""Invariants on random scenarios (hypothesis): no node is over-committed on any resource,
every placement respects its task's constraints, work-conserving policies leave no pending task
that fits somewhere, and the same input gives the same decisions."""


import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from fairstream.core.engine import Engine
from fairstream.core.model import (
    EPSILON,
    DecisionKind,
    NodeHeartbeat,
    NodeLost,
    TaskCompleted,
    TaskState,
    TaskSubmitted,
)
from fairstream.policies import get as get_policy
from fairstream.sim.scenario import parse_scenario
from fairstream.sim.simulator import Simulator

from builders import compiled_path, worker_config

DATA = Path(__file__).resolve().parents[1] / "data"

pytestmark = pytest.mark.slow  # (long properties: the fast part, `scripts/test.sh --fast`, leaves them out)

WORK_CONSERVING = ["fifo", "fair", "drf", "ltrf", "hltrf", "qknobler", "tetris", "tsf", "pmdrf", "drfh", "cdrf",
                   "perf", "flex"]
ALL = WORK_CONSERVING + ["static"]


@st.composite
def scenarios(draw):
    n_nodes = draw(st.integers(1, 4))
    nodes = [{"id": f"n{i}", "capacity": {"cpu": draw(st.integers(1, 8)), "mem": draw(st.integers(1, 8))},
              "labels": {"zone": draw(st.sampled_from("abc"))}} for i in range(n_nodes)]
    nested = draw(st.booleans())
    leaves = [f"u{i}" for i in range(draw(st.integers(1, 4)))]
    tenants = [{"id": "g0", "weight": draw(st.integers(1, 3))}, {"id": "g1", "weight": draw(st.integers(1, 3))}] if nested else []
    for i, leaf in enumerate(leaves):
        spec = {"id": leaf, "weight": draw(st.integers(1, 3))}
        ordering = draw(st.sampled_from([None, None, "fifo", "fair", "drf", "ltrf"]))  # of the leaf's jobs
        if ordering is not None:
            spec["ordering"] = ordering
        if nested:
            spec["parent"] = f"g{i % 2}"
        tenants.append(spec)
    if nested and len(leaves) == 1:
        tenants = [t for t in tenants if t["id"] != "g1"]
    tasks = []
    for k in range(draw(st.integers(1, 25))):
        demand = {"cpu": draw(st.integers(0, 4)), "mem": draw(st.integers(1, 4))}
        task = {"id": f"t{k}", "job": f"j{k % 3}", "tenant": draw(st.sampled_from(leaves)),
                "submit": draw(st.integers(0, 10)), "duration": draw(st.integers(1, 5)), "demand": demand}
        kind = draw(st.sampled_from(["none", "none", "nodes", "labels"]))
        if kind == "nodes":
            task["constraints"] = {"nodes": draw(st.lists(st.sampled_from([n["id"] for n in nodes]), min_size=1, unique=True))}
        elif kind == "labels":
            # A zone, or any of several (["a", "c"]: a node in zone a or c).
            task["constraints"] = {"labels": {"zone": draw(st.sampled_from(["a", "b", ["a", "c"], ["b", "c"]]))}}
        if draw(st.integers(0, 3)) == 0:  # at most 1 or 2 of its job's tasks on one node (others of the job may have none)
            task["constraints"] = {**task.get("constraints", {}), "max_per_node": draw(st.integers(1, 2))}
        if draw(st.integers(0, 4)) == 0:
            task["count"] = draw(st.integers(2, 5))
            if draw(st.booleans()):  # a gang: at least so many of them start together
                task["gang"] = {"min": draw(st.integers(2, task["count"]))}
        tasks.append(task)
    if draw(st.booleans()):
        # Every task of one of two sizes, half the time: the drawn sizes seldom repeat within a
        # tenant, and a tenant waiting with several tasks of one shape in a pass is where kept
        # cursors, heads and scores go wrong (properties passed with such bugs planted).
        sizes = [{"cpu": 1, "mem": 1}, {"cpu": 2, "mem": 1}]
        tasks = [{**task, "demand": sizes[k % 2]} for k, task in enumerate(tasks)]
    return {"resources": ["cpu", "mem"], "nodes": nodes, "tenants": tenants, "tasks": tasks}


def drive(document, policy, check, params=None, lost_at=None, record=None, configure=None):
    """Simulate the scenario (the simulator's own event loop), calling ``check(engine)`` after
    every step; ``lost_at``: node n0 is lost then; ``record``: a list that gets every decision;
    ``configure(engine)``: called before the run."""
    if lost_at is not None:
        document = {**document, "events": [{"time": lost_at, "type": "node_lost", "node": "n0"}]}

    def watch(engine, result):
        if record is not None:
            record.extend(result.decisions)
        check(engine)

    simulator = Simulator(parse_scenario(document), policy, params or {}, on_step=watch)
    if configure is not None:
        configure(simulator.engine)
    simulator.run()
    return simulator.engine


def allowed(constraints: dict, node) -> bool:
    """The constraints as the scenario wrote them, read plainly (not through ``Constraints``)."""
    if "nodes" in constraints and node.id not in constraints["nodes"]:
        return False
    for key, value in constraints.get("labels", {}).items():
        if node.labels.get(key) not in (value if isinstance(value, list) else [value]):
            return False
    return True


def no_overcommit_and_constraints_hold(engine):
    used = {n.id: np.zeros(len(engine.resources)) for n in engine.nodes}
    for task in engine.tasks.values():
        if task.state is TaskState.RUNNING:
            node = engine.nodes[engine.node_row[task.node]]
            assert allowed(task.constraints.to_json(), node), f"{task.id} on {node.id} breaks its constraints"
            used[task.node] += task.demand
    for node in engine.nodes:
        assert (used[node.id] <= node.capacity + EPSILON).all(), f"{node.id} over-committed: {used[node.id]} > {node.capacity}"


def running_of_job(engine, tenant: str, job: str, node_id: str) -> int:
    """How many tasks of ``tenant``'s ``job`` run on ``node_id``, counted one by one."""
    return sum(1 for t in engine.tasks.values()
               if t.state is TaskState.RUNNING and (t.tenant, t.job, t.node) == (tenant, job, node_id))


def runs_its_most(engine, task, node_id: str) -> bool:
    """``task``'s max_per_node read plainly: its job already runs that many tasks on ``node_id``."""
    most = task.constraints.to_json().get("max_per_node")
    return most is not None and running_of_job(engine, task.tenant, task.job, node_id) >= most


def placements_keep_max_per_node(engine, decisions) -> None:
    """Taken in the pass's order, no placement of a task with a max_per_node goes to a node where
    its job already runs that many tasks: those running before the pass and those the pass
    placed before it, less those it preempted (``engine``: as the pass found it)."""
    since: dict[tuple, int] = {}  # (tenant, job, node): placed less preempted in this pass
    for decision in decisions:
        key = (decision.tenant, decision.job, decision.node)
        if decision.kind is DecisionKind.PREEMPT:
            since[key] = since.get(key, 0) - 1
        elif decision.kind is DecisionKind.PLACE:
            task = engine.tasks.get(decision.task) or engine.workload.in_request(decision.task)[0]
            most = task.constraints.to_json().get("max_per_node")
            if most is not None:
                on_node = running_of_job(engine, *key) + since.get(key, 0)
                assert on_node < most, (f"{decision.task} placed on {decision.node}, where job {task.job} runs "
                                        f"{on_node} tasks, its max_per_node {most}")
            since[key] = since.get(key, 0) + 1


def gangs_start_whole_and_stop_whole(engine, decisions) -> None:
    """Read plainly from the engine as the pass found it: a pass that places tasks of a gang none
    of which runs places at least its size of them (or all it has left, if fewer), and a pass
    that preempts a task of a running gang preempts every one of them."""
    running: dict[str, int] = {}
    for task in engine.tasks.values():
        if task.state is TaskState.RUNNING and task.gang:
            request = task.id.rsplit("-", 1)[0]
            running[request] = running.get(request, 0) + 1
    placed: dict[str, int] = {}
    preempted: dict[str, int] = {}
    for decision in decisions:
        request = decision.task.rsplit("-", 1)[0]
        if decision.kind is DecisionKind.PLACE and request in engine.workload.requests \
                and engine.workload.requests[request].gang:
            placed[request] = placed.get(request, 0) + len(decision.task_ids)
        elif decision.kind is DecisionKind.PREEMPT and request in running:
            preempted[request] = preempted.get(request, 0) + 1
    for request, count in placed.items():
        entry = engine.workload.requests[request]
        if not running.get(request):
            assert count >= min(entry.gang, entry.count), f"gang {request} started {count} of {entry.gang}"
    for request, count in preempted.items():
        assert count == running[request], f"gang {request}: {count} of its {running[request]} running tasks preempted"


def checking_passes(check):
    """A ``drive`` configure hook: ``check(engine, decisions)`` on every pass's decisions, with
    the engine as the pass found it."""
    import dataclasses

    def configure(engine):
        decide = engine.spec.decide

        def checked(snapshot, params):
            decisions = decide(snapshot, params)
            check(engine, decisions)
            return decisions

        engine.spec = dataclasses.replace(engine.spec, decide=checked)
    return configure


def nothing_pending_fits(engine):
    """No pending task fits a live node's free room, but on a node reserved for another shape,
    or one where its job runs its max_per_node."""
    free = {n.id: n.capacity - engine.used[engine.node_row[n.id]] for n in engine.nodes if n.alive}
    held = engine.reservation
    for task in engine.tasks.values():
        if task.state is TaskState.PENDING:
            for node in engine.nodes:
                if held is not None and engine.node_row[node.id] in (held.node, *held.more) and task.shape != held.shape:
                    continue
                if runs_its_most(engine, task, node.id):
                    continue
                if node.alive and allowed(task.constraints.to_json(), node):
                    assert not (task.demand <= free[node.id] + EPSILON).all(), f"{task.id} fits idle {node.id} but waits"


SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(document=scenarios(), policy=st.sampled_from(ALL))
def test_no_node_is_over_committed_and_every_placement_respects_its_constraints(document, policy):
    # After every step, and pass by pass for max_per_node (it counts what the pass placed before).
    # Gangs start whole (at least their size in one pass) and stop whole, pass by pass too.
    def each_pass(engine, decisions):
        placements_keep_max_per_node(engine, decisions)
        gangs_start_whole_and_stop_whole(engine, decisions)

    drive(document, policy, no_overcommit_and_constraints_hold, configure=checking_passes(each_pass))


@SETTINGS
@given(document=scenarios(), policy=st.sampled_from(WORK_CONSERVING))
def test_work_conserving_policies_leave_no_pending_task_that_fits(document, policy):
    drive(document, policy, nothing_pending_fits)


@SETTINGS
@given(document=scenarios(), policy=st.sampled_from(ALL))
def test_identical_input_gives_identical_decisions(document, policy):
    first = Simulator(parse_scenario(document), policy, {}).run()
    second = Simulator(parse_scenario(document), policy, {}).run()
    assert [d.to_json() for d in first.decisions] == [d.to_json() for d in second.decisions]


@SETTINGS
@given(document=scenarios(), policy=st.sampled_from(["fair", "drf", "ltrf", "hltrf"]),
       hold=st.sampled_from(["0", "3", "300"]))
def test_nothing_waits_for_good_gangs_holding_nodes_included(document, policy, hold):
    # Gangs first in line hold nodes for gang_hold seconds, then let them go for as long: no two
    # holds keep each other waiting, and at the end every task has run but those no live node
    # (or set of them, for a gang) could ever hold.
    engine = drive(document, policy, lambda engine: None, {"reservation": "on", "gang_hold": hold})
    waiting = [entry.id for queue in engine.pending.values() for entry in queue]
    assert all(engine.verdicts.verdict(engine.tasks.get(w, engine.workload.requests.get(w)).shape) is not None
               for w in waiting), f"left waiting: {waiting}"


def every_pending_task_has_one_reason_and_none_fits_now(engine):
    """``explain`` accounts for every pending task exactly once, and after a pass none of them
    waits while a node has room for it (``next_pass``): the pass placed whatever fitted."""
    from fairstream.core.explain import WaitReason, explain

    explanation = explain(engine)
    listed = {entry.id: entry.tasks for entries in explanation.pending.values() for entry in entries}
    assert sum(listed.values()) == sum(queue.count for queue in engine.pending.values())
    assert {e.reason for entries in explanation.pending.values() for e in entries}.isdisjoint({WaitReason.NEXT_PASS})
    assert {t.tenant: t.pending for t in explanation.tenants if t.pending} == {
        tenant: queue.count for tenant, queue in engine.pending.items() if queue.count}


def gang_explanations_are_true(engine):
    """A gang told "k fit now (...), it needs room for n - k more at once" has, read plainly,
    room for exactly k of its tasks (up to its size) on the live nodes its constraints allow,
    within its job's max_per_node there and off nodes kept for another shape; told nodes are
    held for it "since S ... until U", S <= now < U."""
    import re

    from fairstream.core.explain import WaitReason, explain

    held = engine.reservation
    kept = set() if held is None else {held.node, *held.more}
    for entries in explain(engine).pending.values():
        for entry in entries:
            if entry.reason is not WaitReason.GANG:
                continue
            head = engine.workload.requests[entry.id]
            size = min(head.gang, head.count)
            fit = 0
            for node in engine.nodes:
                row = engine.node_row[node.id]
                if (not node.alive or not allowed(head.constraints.to_json(), node)
                        or (row in kept and held.shape != head.shape)):
                    continue
                free = (node.capacity - engine.used[row]).tolist()
                n = min((int((f + 1e-9) // d) for f, d in zip(free, head.demand_values) if d > 0), default=size)
                most = head.constraints.to_json().get("max_per_node")
                if most is not None:
                    n = min(n, most - running_of_job(engine, head.tenant, head.job, node.id))
                fit += max(n, 0)
            fit = min(fit, size)
            said = re.search(r"all: (\d+) fits? now.*it needs room for (\d+) more at once", entry.message)
            assert said is not None and (int(said[1]), int(said[2])) == (fit, size - fit), (entry.message, fit, size)
            # Nodes it is told are held for it since S until U: held now, from no later than now.
            hold = re.search(r"reserved for it since ([\d.e+-]+): .* until ([\d.e+-]+)$", entry.message)
            if hold is not None:
                assert held is not None and float(hold[1]) <= engine.time < float(hold[2]), (entry.message, engine.time)


@SETTINGS
@given(document=scenarios(), policy=st.sampled_from(ALL))
def test_every_pending_task_has_exactly_one_wait_reason_after_every_pass(document, policy):
    # And what a waiting gang is told of its room is true (gang_explanations_are_true).
    def check(engine):
        every_pending_task_has_one_reason_and_none_fits_now(engine)
        gang_explanations_are_true(engine)

    drive(document, policy, check)


def test_the_checks_themselves_catch_an_over_committed_node():
    # A test that cannot fail is a bug: corrupt an engine's state and the check must notice.
    document = {"resources": ["cpu", "mem"], "nodes": [{"id": "n0", "capacity": {"cpu": 1, "mem": 1}}],
                "tasks": [{"id": "t", "tenant": "u", "submit": 0, "duration": 1, "demand": {"mem": 1}}]}

    def corrupt(engine):
        engine.nodes[0].capacity = np.zeros(2)
        no_overcommit_and_constraints_hold(engine)

    try:
        drive(document, "fifo", corrupt)
    except AssertionError as exc:
        assert "over-committed" in str(exc)
    else:
        raise AssertionError("the over-commit check did not fire")


def top_ups_from_scratch(engine, now):
    """Formula 15 summed task by task: ``demand * max(0, Q - (now - max(t_s, start)))`` over
    the running tasks, one row per tenant (no discount)."""
    acc = engine.accounting
    expected = np.zeros((len(acc.ledgers), len(engine.resources)))
    for task in engine.tasks.values():
        if task.state is TaskState.RUNNING:
            row = acc.row[task.tenant]
            elapsed = now - max(acc.round_start, task.running_entry.start)
            expected[row] += task.demand * max(0.0, acc.quantum(row) - elapsed)
    return expected


@SETTINGS
@given(document=scenarios(), quantum=st.sampled_from(["1", "2.5", "60"]), mode=st.sampled_from(["adaptive", "fixed"]),
       round_length=st.sampled_from(["inf", "4"]), lost_at=st.one_of(st.none(), st.integers(1, 12)))
def test_quantum_top_ups_kept_per_changed_tenant_equal_formula_15_summed_task_by_task(
        document, quantum, mode, round_length, lost_at):
    from fairstream.state.engine_snapshot import decode_engine, encode_engine

    def check(engine):
        acc, now = engine.accounting, engine.time
        expected = top_ups_from_scratch(engine, now)
        assert np.allclose(acc.top_ups(None, now), expected, atol=1e-9)
        # Every row's PAR, kept between reads (``Accounting.pseudo_rows``), is the ledgers' now.
        assert acc.pseudo_rows(None, now).tolist() == [ledger.pseudo_accumulated for ledger in acc.ledgers]
        last = [len(acc.ledgers) - 1]
        assert np.allclose(acc.top_ups(last, now), expected[last], atol=1e-9)
        # Read later (a metrics sample between events), then at the engine's time again.
        assert np.allclose(acc.top_ups(None, now + 0.75), top_ups_from_scratch(engine, now + 0.75), atol=1e-9)
        assert np.allclose(acc.top_ups(None, now), expected, atol=1e-9)
        # What is kept per tenant is derived: an engine restored from a snapshot has the same.
        restored = decode_engine(encode_engine(engine)).accounting
        assert np.allclose(restored.top_ups(None, now), expected, atol=1e-9)

    drive(document, "ltrf", check, {"quantum": quantum, "quantum_mode": mode, "round": round_length}, lost_at)


# ------------------------------------------------------------ the decoder: nothing escapes it

# Text with lone surrogates too (hypothesis leaves them out unless asked): JSON can escape them.
strings = st.text(max_size=20) | st.text(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), min_size=1, max_size=2)
json_values = st.recursive(
    st.none() | st.booleans() | st.floats() | st.integers(-(10 ** 500), 10 ** 500) | strings,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20)
VALID = {"submitted": {"cluster": "c1", "task": "t", "tenant": "A", "demand": {"cpu": 1, "mem": 1}, "time": 1},
         "completed": {"cluster": "c1", "task": "t", "time": 2},
         "heartbeat": {"cluster": "c1", "node": "n1", "time": 0, "capacity": {"cpu": 4, "mem": 4}}}


@st.composite
def messages(draw):
    """(kind, bytes): random bytes, random JSON, or a valid event (or an array of them) with
    one field, or one resource amount, replaced by any JSON value (lone surrogates, numbers of
    hundreds of digits, NaN and nesting included)."""
    import json

    kind = draw(st.sampled_from(sorted(VALID)))
    shape = draw(st.sampled_from(["bytes", "json", "deep", "field", "amount", "array"]))
    if shape == "bytes":
        return kind, draw(st.binary(max_size=200))
    if shape == "deep":  # past Python's recursion limit, around orjson's depth limit of 1,024
        depth = draw(st.integers(900, 3000))
        return kind, b"[" * depth + b"]" * depth
    if shape == "json":
        return kind, json.dumps(draw(json_values)).encode()
    event = json.loads(json.dumps(VALID[kind]))
    if shape == "amount" and kind != "completed":
        vector = event["demand" if kind == "submitted" else "capacity"]
        vector[draw(st.sampled_from(["cpu", "mem", "gpu"]))] = draw(json_values)
    else:
        event[draw(st.sampled_from(sorted(event) + ["extra"]))] = draw(json_values)
    body = [VALID[kind], event] if shape == "array" else event
    return kind, json.dumps(body).encode()


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(message=messages())
# Found by this test: a key with a newline made the reason two lines ("capacity.\n: None is ...").
@example(message=("heartbeat", b'{"cluster": "c1", "node": "n1", "time": 0, "capacity": {"\\n": null}}'))
def test_no_input_escapes_the_decoder_and_what_it_accepts_can_be_written_back(message):
    import math

    import orjson

    from fairstream.wire.events import MAX_NUMBER, BadElement, BadInput, decode_message, event_to_json

    kind, raw = message
    try:
        decoded = decode_message(kind, raw)
    except BadInput as exc:
        assert "\n" not in str(exc)
        return
    for item in decoded:
        if isinstance(item, BadElement):
            continue
        written = event_to_json(item.event)
        orjson.dumps(written)  # the log, the outbox and the decisions encode what the engine got
        numbers = [written["time"], *written.get("demand", {}).values(), *written.get("capacity", {}).values()]
        assert all(math.isfinite(x) and 0 <= x <= MAX_NUMBER for x in numbers)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(message=messages())
# Found by this test: an event the engine rejects right after a step left the next group
# without its start (a TypeError on every retry).
@example(message=("completed", b'[{"cluster": "c1", "task": "t", "time": 2}, {"cluster": null, "task": "t", "time": 2}]'))
def test_any_message_among_valid_traffic_leaves_the_worker_deciding(message):
    import asyncio
    import json

    from fairstream.state.store import MemoryStore
    from fairstream.streams.processor import Incoming, Processor
    from fairstream.wire.topics import Topics

    kind, raw = message
    published = []

    async def publish(topic, key, body):
        published.append((topic, json.loads(json.dumps(body))))

    topics = Topics()
    topic_of = {"submitted": topics.submitted, "completed": topics.completed, "heartbeat": topics.heartbeats}
    valid = [("heartbeat", {"cluster": "c1", "node": "n0", "time": 0, "capacity": {"cpu": 8, "mem": 8}}),
             ("submitted", {"cluster": "c1", "task": "before", "tenant": "A", "demand": {"cpu": 1, "mem": 1}, "time": 1})]
    after = ("submitted", {"cluster": "c1", "task": "after", "tenant": "B", "demand": {"cpu": 1, "mem": 1}, "time": 3})
    batch = [Incoming(k, json.dumps(b).encode(), topic_of[k], 0, offset) for offset, (k, b) in enumerate(valid)]
    batch.append(Incoming(kind, raw, topic_of[kind], 1, 0))
    batch.append(Incoming(after[0], json.dumps(after[1]).encode(), topic_of[after[0]], 0, len(valid)))

    async def run():
        processor = Processor(MemoryStore(), publish, worker_config("drf", topics=topics))
        await processor.handle(batch)

    asyncio.run(run())
    placed = {body["task"] for topic, body in published if topic == topics.decisions and body["kind"] == "place"}
    assert {"before", "after"} <= placed


@settings(max_examples=300, deadline=None)
@given(elements=st.lists(json_values, min_size=1, max_size=6), spaces=st.sampled_from(["", " ", "\n\t "]))
def test_a_dead_letter_carries_exactly_its_elements_own_json(elements, spaces):
    import json

    from fairstream.wire.events import element_bytes

    raw = (spaces + "[" + spaces + ("," + spaces).join(json.dumps(e) + spaces for e in elements) + "]" + spaces).encode()
    for index, element in enumerate(elements):
        own = element_bytes(raw, index)
        assert own == json.dumps(element).encode()  # the bytes as sent, spaces around it trimmed


@st.composite
def event_sequences(draw):
    """Events naming a few tasks and nodes, so that duplicates, completions of unknown or
    finished tasks, unknown nodes and unknown resources all occur."""
    tasks, nodes = ["a", "b", "c"], ["n1", "n2"]
    events = []
    for _ in range(draw(st.integers(1, 12))):
        kind = draw(st.sampled_from(["submit", "complete", "heartbeat", "lost"]))
        if kind == "submit":
            demand = draw(st.sampled_from([{"cpu": 1}, {"cpu": 0}, {"gpu": 1}, {"cpu": 1, "mem": 2}]))
            events.append(TaskSubmitted(0.0, draw(st.sampled_from(tasks)), "j", draw(st.sampled_from(["u", "v"])), demand))
        elif kind == "complete":
            events.append(TaskCompleted(0.0, draw(st.sampled_from(tasks))))
        elif kind == "heartbeat":
            events.append(NodeHeartbeat(0.0, draw(st.sampled_from(nodes)), {"cpu": 4, "mem": 4}))
        else:
            events.append(NodeLost(0.0, draw(st.sampled_from(nodes))))
    return events


@settings(max_examples=300, deadline=None)
@given(before=event_sequences(), events=event_sequences(), policy=st.sampled_from(["drf", "ltrf", "fifo"]))
def test_admissible_says_exactly_which_events_a_step_would_reject_and_why(before, events, policy):
    from dataclasses import replace

    from fairstream.core.model import ResourceSpace
    from fairstream.core.tenants import TenantTree

    engine = Engine(ResourceSpace(("cpu", "mem")), TenantTree.from_specs([]), get_policy(policy), {})
    engine.step(0.0, before)
    events = [replace(e, time=1.0) for e in events]
    predicted = engine.admissible(events)
    rejected = {id(event): reason for event, reason in engine.step(1.0, events).rejected}
    assert predicted == [rejected.get(id(event)) for event in events]


# ------------------------------------------- passes that cost what changed decide as full ones

TENANT_LOCAL = ["drf", "fair", "ltrf", "fifo"]


def decisions_of(document, policy, full_passes: bool, lost_at=None, params=None):
    """Every decision of a run; ``full_passes``: every pass considers every waiting tenant
    (the engine's candidate tenants and grown nodes switched off)."""
    import dataclasses

    log = []

    def full(engine):
        engine.spec = dataclasses.replace(engine.spec, traits=dataclasses.replace(engine.spec.traits, tenant_local=False))

    drive(document, policy, lambda engine: None, params=params, lost_at=lost_at, record=log,
          configure=full if full_passes else None)
    return log


# Found by the test below: at t=1 u1's new task (1 cpu, 2 GB) fits nowhere and is first in
# DRF's order, but u1 was left out of the second pass (nothing of it fits), and u0's task of the
# same shape failed in that pass first: the reservation went to u0's task instead of u1's.
LEFT_OUT_TENANT_FIRST_IN_LINE = {
    "resources": ["cpu", "mem"],
    "nodes": [{"id": "n0", "capacity": {"cpu": 1, "mem": 7}}, {"id": "n1", "capacity": {"cpu": 1, "mem": 1}},
              {"id": "n2", "capacity": {"cpu": 1, "mem": 1}}],
    "tenants": [{"id": "g0"}, {"id": "g1"}, {"id": "u0", "parent": "g0"}, {"id": "u1", "parent": "g1"},
                {"id": "u2", "parent": "g0"}],
    "tasks": [{"id": f"t{k}", "job": f"j{k % 3}", "tenant": "u0", "submit": 0, "duration": 2 if k == 0 else 1,
               "demand": {"cpu": 1 if k == 19 else 0, "mem": {0: 3, 4: 3, 19: 2}.get(k, 1)}} for k in range(23)]
    + [{"id": "t23", "job": "j2", "tenant": "u1", "submit": 1, "duration": 1, "demand": {"cpu": 1, "mem": 2}}],
}


# Found by the test below (shrunk by hand): at t=7 u0's task of 4 cpu fits nowhere, and u2's
# head (t12) has that shape, so it is passed over untried; a pass over all tenants served u2 on
# its head's arrival and placed its t14 before u3's earlier t11-2 (FIFO's order); a pass over
# candidate tenants, without u0, tried t12 itself and re-keyed u2.
FIFO_HEAD_PASSED_OVER = {
    "resources": ["cpu", "mem"],
    "nodes": [{"id": "n0", "capacity": {"cpu": 3, "mem": 2}}, {"id": "n1", "capacity": {"cpu": 4, "mem": 8}},
              {"id": "n2", "capacity": {"cpu": 1, "mem": 8}}],
    "tenants": [{"id": "u0"}, {"id": "u1"}, {"id": "u2", "ordering": "ltrf"}, {"id": "u3"}],
    "tasks": [{"id": "t4", "job": "j1", "tenant": "u2", "submit": 5, "duration": 2, "demand": {"cpu": 0, "mem": 3}},
              {"id": "t6", "job": "j0", "tenant": "u0", "submit": 2, "duration": 1, "demand": {"cpu": 4, "mem": 1}},
              {"id": "t11", "job": "j2", "tenant": "u3", "submit": 5, "duration": 5, "demand": {"cpu": 0, "mem": 3},
               "count": 5},
              {"id": "t12", "job": "j0", "tenant": "u2", "submit": 2, "duration": 4, "demand": {"cpu": 4, "mem": 1}},
              {"id": "t14", "job": "j2", "tenant": "u2", "submit": 5, "duration": 4, "demand": {"cpu": 0, "mem": 4}},
              {"id": "t20", "job": "j2", "tenant": "u0", "submit": 0, "duration": 5, "demand": {"cpu": 2, "mem": 3}},
              {"id": "t22", "job": "j1", "tenant": "u0", "submit": 0, "duration": 3, "demand": {"cpu": 3, "mem": 3}}],
}


# Found by the test below (CI's random run; shrunk): at t=2 u0's t6 arrives, and n0 is reserved
# for u0's t2-1 (3 GB; n0 has 1 GB free). u1 (share 2/6 < u0's 3/6) is left out: its t9-1 may
# go on no node, its job j0 runs its max_per_node (1) on both. A pass over all tries t9-1
# first: held by max_per_node, it is not first in line, and t2-1 keeps n0. The pass over the
# candidates {u0} took u1's head as first in line: the reservation went to t9-1, which no node
# may hold, so it ended, and a second pass gave n0's room to t6 a second before t2-1's.
LEFT_OUT_HEAD_HELD_BY_MAX_PER_NODE = {
    "resources": ["cpu", "mem"],
    "nodes": [{"id": "n0", "capacity": {"cpu": 1, "mem": 5}}, {"id": "n1", "capacity": {"cpu": 1, "mem": 1}}],
    "tenants": [{"id": "u0"}, {"id": "u1"}],
    "tasks": [{"id": "t0", "job": "j0", "tenant": "u0", "submit": 0, "duration": 1, "demand": {"cpu": 0, "mem": 1},
               "constraints": {"nodes": ["n1"]}},
              {"id": "t2", "job": "j2", "tenant": "u0", "submit": 0, "duration": 3, "demand": {"cpu": 0, "mem": 3},
               "count": 2},
              {"id": "t3", "job": "j0", "tenant": "u1", "submit": 0, "duration": 3, "demand": {"cpu": 0, "mem": 1}},
              {"id": "t6", "job": "j0", "tenant": "u0", "submit": 2, "duration": 1, "demand": {"cpu": 0, "mem": 1}},
              {"id": "t9", "job": "j0", "tenant": "u1", "submit": 0, "duration": 2, "demand": {"cpu": 0, "mem": 1},
               "constraints": {"max_per_node": 1}, "count": 2}],
}


# Found by the test below (shrunk): at t=3 u0's t1 arrives. n0 (3 GB) runs t0-0 (2 GB) and is
# reserved for u0's t0-1 (2 GB). u2 (share 0, below u0's 2/3) is left out: its head t6 (1 GB)
# fits only n0's room, kept off it by the reservation, and its next task t4 (3 GB) fits no
# node. A pass over all tries t6 (kept off), then t4: first in line, it takes the reservation.
# The pass over the candidates {u0} looked at u2's head alone, found it kept off and left the
# reservation with t0-1, which then started before t4.
LEFT_OUT_HEAD_KEPT_OFF_NEXT_FIRST_IN_LINE = {
    "resources": ["cpu", "mem"],
    "nodes": [{"id": "n0", "capacity": {"cpu": 4, "mem": 3}}],
    "tenants": [{"id": "u0"}, {"id": "u1"}, {"id": "u2"}],
    "tasks": [{"id": "t0", "job": "j0", "tenant": "u0", "submit": 1, "duration": 2, "demand": {"cpu": 0, "mem": 2},
               "count": 2},
              {"id": "t1", "job": "j1", "tenant": "u0", "submit": 3, "duration": 1, "demand": {"cpu": 0, "mem": 1}},
              {"id": "t4", "job": "j0", "tenant": "u2", "submit": 1, "duration": 1, "demand": {"cpu": 0, "mem": 3}},
              {"id": "t5", "job": "j1", "tenant": "u2", "submit": 0, "duration": 2, "demand": {"cpu": 0, "mem": 3}},
              {"id": "t6", "job": "j0", "tenant": "u2", "submit": 0, "duration": 1, "demand": {"cpu": 0, "mem": 1}}],
}


def decide_alike_with_passes_over_candidates_and_over_all(document, policy, lost_at, compiled, params=None):
    with compiled_path(compiled):
        assert (decisions_of(document, policy, False, lost_at, params)
                == decisions_of(document, policy, True, lost_at, params))


# What a pass over candidate tenants must keep equal with every feature a pass reads on
# (``fifo`` has none of these parameters): backfill by estimates, none or some exact, and
# preemption past a timeout beside the reservation.
PASS_FEATURES = st.sampled_from([{}, {"reservation": "off"}, {"reservation": "backfill"},
                                 {"preemption": "on", "preemption_timeout": "1"},
                                 {"reservation": "backfill", "preemption": "on", "preemption_timeout": "0"}])


@st.composite
def with_estimates(draw, document):
    """``document`` with some of its tasks given an estimate (their duration, or a guess)."""
    tasks = [{**task, "estimate": draw(st.sampled_from([task["duration"], 1, 3]))} if draw(st.booleans()) else task
             for task in document["tasks"]]
    return {**document, "tasks": tasks}


# Found by the test below (shrunk): n1 (6 cpu, 4 mem) is reserved for u1's 4-cpu t4 at 5, its
# 3 cpu and 1 mem kept from u0, behind u1 then; u0's 1-mem tasks of jobs j0 and j2 run their
# max_per_node on n0. At 6 u0's tasks end: holding nothing, u0 is ahead of u1 and the pass serves
# it with the reservation open. A pass over all placed t17-1 on n1; one over candidate tenants
# looked only at the nodes that gained room (n0), as if n1's had not fitted it when the last
# pass ended: it had, kept by the reservation.
def _reserved_room_open_to_a_tenant_now_ahead() -> dict:
    def tasks(tenant, submit, duration, cpu, mem, *ids, count=None, most=None, job=None):
        return [{"id": i, "job": job or f"j{int(i[1:]) % 3}", "tenant": tenant, "submit": submit,
                 "duration": duration, "demand": {"cpu": cpu, "mem": mem},
                 **({"count": count} if count else {}), **({"constraints": {"max_per_node": most}} if most else {})}
                for i in ids]

    return {"resources": ["cpu", "mem"],
            "nodes": [{"id": "n0", "capacity": {"cpu": 1, "mem": 5}}, {"id": "n1", "capacity": {"cpu": 6, "mem": 4}}],
            "tenants": [{"id": "u0"}, {"id": "u1"}],
            "tasks": [*tasks("u0", 0, 1, 1, 1, "t1", count=2), *tasks("u0", 0, 1, 0, 1, "t3"),
                      *tasks("u1", 5, 1, 4, 1, "t4", job="j1"), *tasks("u0", 0, 1, 0, 1, "t5", count=2),
                      *tasks("u0", 0, 1, 0, 1, "t6", count=2, most=1), *tasks("u0", 0, 1, 0, 1, "t7", "t8"),
                      *tasks("u0", 0, 1, 0, 1, "t9", "t11", "t12", count=2, most=1),
                      *tasks("u1", 0, 4, 3, 3, "t13", count=2, job="j1"),
                      *tasks("u0", 0, 1, 0, 3, "t14", count=2, most=1),
                      *tasks("u0", 0, 1, 0, 1, "t15", "t17", count=2, most=1)]}


RESERVED_ROOM_OPEN_TO_A_TENANT_NOW_AHEAD = _reserved_room_open_to_a_tenant_now_ahead()


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled pass", "python pass"])
@pytest.mark.parametrize("document, policy, lost_at", [
    (RESERVED_ROOM_OPEN_TO_A_TENANT_NOW_AHEAD, "drf", None),
    (LEFT_OUT_TENANT_FIRST_IN_LINE, "drf", None),
    (FIFO_HEAD_PASSED_OVER, "fifo", 3),
    (LEFT_OUT_HEAD_HELD_BY_MAX_PER_NODE, "drf", None),
    (LEFT_OUT_HEAD_KEPT_OFF_NEXT_FIRST_IN_LINE, "drf", None),
    # Found by the test below (2026-12-08): at t=15 u1's gang t20 starts whole on n2, which
    # gained room; its third task then fits n3, which did not. The pass stopped at the next
    # failure, no grown node having room left (a shape queued before the pass fits only nodes
    # that grew; the rest of a gang started in the pass was held by its gang, not by room), and
    # t20-2 waited until 18.
    (json.loads((DATA / "gang-rest-fits-a-node-that-did-not-grow.json").read_text()), "ltrf", 1),
], ids=["a tenant that fell ahead of the reservation's holder may take the reserved room, which did not grow",
        "a left-out tenant first in line takes the reservation from a candidate's task of its shape",
        "a FIFO head passed over untried is served on its arrival as a pass over all serves it",
        "a left-out head held by its job's max_per_node is not first in line",
        "a left-out head kept off the reserved room passes first in line to its next task",
        "the rest of a gang the pass started is tried though no node that gained room has any left"])
def test_passes_over_the_tenants_that_may_place_decide_as_passes_over_all_where_they_once_did_not(
        document, policy, lost_at, compiled):
    decide_alike_with_passes_over_candidates_and_over_all(document, policy, lost_at, compiled)


@SETTINGS
@given(document=scenarios().flatmap(with_estimates), policy=st.sampled_from(TENANT_LOCAL),
       lost_at=st.none() | st.integers(1, 8), compiled=st.booleans(), params=PASS_FEATURES)
def test_passes_over_the_tenants_that_may_place_decide_exactly_as_passes_over_all(document, policy, lost_at, compiled,
                                                                                  params):
    decide_alike_with_passes_over_candidates_and_over_all(document, policy, lost_at, compiled,
                                                          {} if policy == "fifo" else params)


# ------------------------------------------------- the scenario's fast check never lets more in

@SETTINGS
@given(document=scenarios(), lost_at=st.none() | st.integers(1, 8))
def test_per_machine_drf_visiting_the_nodes_with_room_decides_as_visiting_every_node(document, lost_at):
    """``pmdrf`` shares each node on its own in node order; a pass visits only the live nodes
    whose free room fits some waiting demand (``nodes_with_room``). The reference visits
    every live node: the decisions are the same."""
    from unittest import mock

    from fairstream.policies import pmdrf

    def every_live_node(snapshot):
        return [row for row in range(len(snapshot.node_ids)) if snapshot.free[row, 0] >= 0]

    fast, slow = [], []
    drive(document, "pmdrf", lambda engine: None, lost_at=lost_at, record=fast)
    with mock.patch.object(pmdrf, "nodes_with_room", every_live_node):
        drive(document, "pmdrf", lambda engine: None, lost_at=lost_at, record=slow)
    assert fast == slow


@SETTINGS
@given(document=scenarios(), policy=st.sampled_from(["tetris", "perf"]), f=st.sampled_from(["0", "0.2", "0.5", "1"]),
       lost_at=st.none() | st.integers(1, 8))
def test_tetris_keeping_scores_and_order_for_the_pass_decides_as_scanning_every_node_and_sorting_each_time(
        document, policy, f, lost_at):
    """``tetris.best_pair`` keeps, per task shape without constraints, the best node and score
    it found in a pass until that node takes a placement, and every node's score
    (``NodeFit.aligned_scores``) until that node's room changes; ``DrfOrder`` moves only the
    tenant placed. The reference scans every node for every candidate and sorts every tenant
    after every placement: the decisions are the same, ties included (small whole demands on
    small nodes make many)."""
    from unittest import mock

    from fairstream.policies import tetris

    scan_every_time = tetris.best_pair

    def without_kept_nodes(cycle, candidates, best_nodes=None):
        return scan_every_time(cycle, candidates)

    def sorted_again(order, tenant):
        order.sort_all()

    params = {"f": f} if policy == "tetris" else {}
    kept, scanned = [], []
    drive(document, policy, lambda engine: None, params=params, lost_at=lost_at, record=kept)
    with mock.patch.object(tetris, "best_pair", without_kept_nodes), \
            mock.patch.object(tetris.DrfOrder, "placed", sorted_again):
        drive(document, policy, lambda engine: None, params=params, lost_at=lost_at, record=scanned)
    assert kept == scanned


PLAIN_TASK = {"id": "t", "job": "j", "tenant": "A", "submit": 1, "duration": 2, "demand": {"cpu": 1}, "count": 3, "stage": 1}


@settings(max_examples=400, deadline=None)
@given(key=st.sampled_from([*PLAIN_TASK, "constraints", "other"]), value=json_values)
def test_a_task_the_fast_check_accepts_is_one_the_schema_accepts(key, value):
    import jsonschema

    from fairstream.sim.scenario import _plain_task, scenario_schema

    task = {**PLAIN_TASK, key: value}
    if _plain_task(task):
        document = {"nodes": [{"id": "n", "capacity": {"cpu": 1}}], "tasks": [task]}
        assert jsonschema.Draft202012Validator(scenario_schema()).is_valid(document), task


# ------------------------------------------------------------------- preemption toward fair share

@SETTINGS
@given(document=scenarios(), policy=st.sampled_from(["drf", "fair", "ltrf", "hltrf"]),
       timeout=st.sampled_from([0, 1, 3]), threshold=st.sampled_from([0.5, 1.0]))
def test_preemption_never_takes_a_tenant_below_its_share_nor_acts_without_a_starved_tenant(document, policy, timeout,
                                                                                          threshold):
    from fairstream.core.model import DecisionKind
    from fairstream.core.preemption import share_ratios

    params = {"preemption": "on", "preemption_timeout": str(timeout), "preemption_threshold": str(threshold)}
    starved_before: dict[str, float] = {}

    def check(engine, result):
        no_overcommit_and_constraints_hold(engine)
        preempts = [d for d in result.decisions if d.kind is DecisionKind.PREEMPT]
        if preempts:
            now = engine.time
            # Someone was starved past the timeout before the pass, and each preemption names one.
            due = {t for t, since in starved_before.items() if now - since >= timeout - EPSILON}
            assert due, f"preempted at t={now} with no tenant starved past the timeout"
            assert all(any(f"frees room for {t}," in d.reason for t in due) for d in preempts)
            acc = engine.accounting
            ratios = share_ratios(acc.allocation, acc.capacity, engine.fair_shares(), acc.config.resource)
            for victim in {d.tenant for d in preempts}:
                assert ratios[acc.row[victim]] >= 1 - 1e-6, f"{victim} taken below its fair share at t={now}"
        starved_before.clear()
        starved_before.update(engine.starvation.since)

    simulator = Simulator(parse_scenario(document), policy, params, on_step=check)
    simulator.run()
