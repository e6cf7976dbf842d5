"""Engine snapshots (``state/engine_snapshot.py``): plain data, versioned, and read back to an
engine that decides exactly as the one written; nothing in the bytes can make reading them run
code, and anything that is not a snapshot of this version is one clear error."""

import os
import pickle
import subprocess
import sys
from pathlib import Path

import msgpack
import pytest

from fairstream.core.engine import Engine
from fairstream.core.model import DecisionKind, NodeLost, TaskCompleted, TaskSubmitted, TenantSpec
from fairstream.policies import REGISTRY
from fairstream.sim.scenario import load_scenario
from fairstream.sim.simulator import Simulator
from fairstream.state import engine_snapshot
from fairstream.state.engine_snapshot import CLASSES, MAGIC, VERSION, SnapshotError, decode_engine, encode_engine

from builders import engine, node, submit, tree

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = ROOT / "examples" / "two-tenants.json"


def recorded_steps(policy: str) -> list:
    """The ordered engine input of a whole scenario run under ``policy``."""
    return Simulator(load_scenario(SCENARIO), policy, record_events=True).run().events


def fresh(policy: str) -> Engine:
    sc = load_scenario(SCENARIO)
    return Simulator(sc, policy).engine


@pytest.mark.parametrize("policy", sorted(REGISTRY))
def test_an_engine_read_back_mid_run_decides_the_rest_of_the_run_exactly_as_the_one_written(policy):
    steps = recorded_steps(policy)
    original = fresh(policy)
    middle = len(steps) // 2
    for time, events in steps[:middle]:
        original.step(time, events)
    assert original.tasks, "the middle of the run has tasks pending or running"
    blob = encode_engine(original)
    restored = decode_engine(blob)
    assert encode_engine(restored) == blob  # the same state, to the bit
    for time, events in steps[middle:]:
        assert restored.step(time, events).decisions == original.step(time, events).decisions
    assert encode_engine(restored) == encode_engine(original)


def test_an_engine_read_back_keeps_each_jobs_tasks_per_node():
    # max_per_node's index of where each job runs is made again from the tasks on reading:
    # the engine read back keeps web's fourth task off the three nodes that run one each.
    e = engine(tree("A"), "fifo")
    e.step(0.0, [node(f"n{i}", 0.0, mem=8) for i in range(3)]
           + [TaskSubmitted(0.0, "web", "web", "A", {"mem": 1}, {"max_per_node": 1}, 4)])
    restored = decode_engine(encode_engine(e))
    assert restored.tasks["web-0"].constraints.max_per_node == 1 and restored.pending["A"].count == 1
    assert restored.step(1.0, [node("n3", 1.0, mem=8)]).decisions[0].node == "n3"


def test_an_engine_read_back_keeps_a_lost_node_out_of_its_passes():
    # The count of lost nodes is made again from the nodes on reading: the engine read back
    # still shows the lost node's room as none, and places on the live one.
    e = engine(tree("A"), "drf")
    e.step(0.0, [node("n0", 0.0, mem=8), node("n1", 0.0, mem=8), submit("t0", "A", 0.0, mem=1)])
    e.step(1.0, [NodeLost(1.0, "n0")])
    restored = decode_engine(encode_engine(e))
    assert restored.registry.lost == 1
    assert restored.step(2.0, [submit("t1", "A", 2.0, mem=1)]).decisions[0].node == "n1"


READ_BACK_IN_ANOTHER_PROCESS = """
import sys
sys.path[:0] = ["tests", "tests/worker"]
from test_engine_snapshot import fresh, recorded_steps
from fairstream.policies import REGISTRY
from fairstream.state.engine_snapshot import decode_engine, encode_engine
for policy in sorted(REGISTRY):
    engine, steps = fresh(policy), recorded_steps(policy)
    for time, events in steps[: len(steps) // 2]:
        engine.step(time, events)
    blob = encode_engine(engine)
    assert encode_engine(decode_engine(blob)) == blob, policy
"""


@pytest.mark.parametrize("seed", [1, 8])
def test_a_snapshot_read_back_is_the_same_bytes_whatever_the_string_hashes(seed):
    # Sets of tenant names iterate in an order that follows string hashes, which differ from
    # process to process (PYTHONHASHSEED): written in that order, a set read back (built again
    # member by member) could iterate otherwise, and the snapshot of the engine read back was
    # other bytes than the one it was read from (seed 8, for 10 of the 14 policies).
    done = subprocess.run([sys.executable, "-c", READ_BACK_IN_ANOTHER_PROCESS], cwd=ROOT, capture_output=True,
                          text=True, env={**os.environ, "PYTHONHASHSEED": str(seed)})
    assert done.returncode == 0, done.stderr[-2000:]


def test_state_shared_between_two_places_stays_shared():
    # A pending task sits in the task table and in its tenant's queue: placing it through one
    # must show in the other, as in the engine that was written.
    e = engine(tree("A"), "drf")
    e.step(0.0, [submit("t1", "A", mem=1)])
    restored = decode_engine(encode_engine(e))
    [queued] = list(restored.pending["A"])
    assert queued is restored.tasks["t1"]
    restored.step(1.0, [node("n1", 1.0, mem=4)])
    assert restored.tasks["t1"].node == "n1" and restored.pending["A"].count == 0


@pytest.mark.parametrize("blob, message", [
    pytest.param(pickle.dumps({"a": 1}), "a pickle", id="a pickle, as snapshots were before version 1"),
    pytest.param(b"", "no fairstream engine header", id="nothing"),
    pytest.param(b"{\"engine\": 1}", "no fairstream engine header", id="JSON"),
    pytest.param(MAGIC + (VERSION + 1).to_bytes(2, "big") + b"\x90", f"version {VERSION + 1}; this fairstream reads "
                 f"version {VERSION}", id="a later version"),
    pytest.param(MAGIC + VERSION.to_bytes(2, "big") + b"\xc1", "damaged", id="a body that is not MessagePack"),
    pytest.param(MAGIC + VERSION.to_bytes(2, "big") + msgpack.packb([1, 2, 3]), "not an engine",
                 id="a list where the engine belongs"),
    pytest.param(MAGIC + VERSION.to_bytes(2, "big") + msgpack.packb([6, 99]), "no class number 99",
                 id="a class the format does not have"),
    pytest.param(MAGIC + VERSION.to_bytes(2, "big") + msgpack.packb([0, 0]), "reference 0 to nothing",
                 id="a reference to nothing"),
    pytest.param(MAGIC + VERSION.to_bytes(2, "big") + msgpack.packb([7, "|O", [1], b"x"]), "dtype '|O'",
                 id="an array of Python objects"),
    pytest.param(MAGIC + VERSION.to_bytes(2, "big") + msgpack.packb([10, "os.system"]), "policy 'os.system'",
                 id="a policy that is not registered"),
    pytest.param(MAGIC + VERSION.to_bytes(2, "big") + msgpack.packb({"__class__": "os.system"}), "damaged",
                 id="a map"),
    pytest.param(MAGIC + VERSION.to_bytes(2, "big") + msgpack.packb(msgpack.ExtType(1, b"x")), "damaged",
                 id="a MessagePack extension"),
])
def test_bytes_that_are_not_a_snapshot_of_this_version_are_one_clear_error(blob, message):
    with pytest.raises(SnapshotError, match=message) as raised:
        decode_engine(blob)
    assert "\n" not in str(raised.value)


def test_a_field_cut_from_a_snapshot_is_refused_not_half_read():
    e = engine(tree("A"), "drf")
    e.step(0.0, [node("n1", mem=4), submit("t1", "A", mem=1)])
    body = msgpack.unpackb(encode_engine(e)[len(MAGIC) + 2:])
    body.pop()  # the engine's last field
    fields = len(next(c for c in CLASSES if c.cls is Engine).fields)
    with pytest.raises(SnapshotError, match=f"Engine with {fields - 1} fields, not {fields}"):
        decode_engine(MAGIC + VERSION.to_bytes(2, "big") + msgpack.packb(body))


def test_a_planted_pickle_runs_nothing_when_read(tmp_path):
    # The attack the issue reproduced: a pickle whose loading runs a command. Read in a child
    # process, so that if it did run, it could only leave a file behind.
    marker = tmp_path / "ran"

    class Planted:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    blob = tmp_path / "planted"
    blob.write_bytes(pickle.dumps(Planted()))
    code = ("import sys; from fairstream.state.engine_snapshot import decode_engine, SnapshotError\n"
            "try:\n    decode_engine(open(sys.argv[1], 'rb').read())\n"
            "except SnapshotError as exc:\n    print(exc)\n")
    done = subprocess.run([sys.executable, "-c", code, str(blob)], capture_output=True, text=True, timeout=60)
    assert "a pickle" in done.stdout and done.returncode == 0, done.stderr
    assert not marker.exists()


def test_an_engine_field_the_format_does_not_declare_is_refused_when_writing():
    # A developer who adds state to the engine must add it to the format and raise VERSION,
    # not have snapshots silently lose it.
    e = engine(tree("A"), "drf")
    e.new_state = 1
    with pytest.raises(SnapshotError, match=r"Engine.\{new_state\}: not declared"):
        encode_engine(e)


def test_every_class_the_format_declares_names_exactly_its_fields():
    # The declared fields are the ones a live object of the class has (derived ones aside):
    # so a rename in the code shows here, not as a failed snapshot in production.
    steps = recorded_steps("flex")  # FLEX: its model's classes are in the engine too
    e = fresh("flex")
    seen: set[type] = set()

    def walk(value, depth=0):
        if depth > 8:
            return
        entry = next((c for c in engine_snapshot.CLASSES if type(value) is c.cls), None)
        if entry is not None:
            seen.add(type(value))
            fields = set(entry.fields) if entry.slots else set(vars(value))
            assert fields - entry.derived == set(entry.fields), entry.cls.__qualname__
            for name in entry.fields:
                walk(getattr(value, name), depth + 1)
        elif isinstance(value, dict):
            for key, item in list(value.items())[:3]:
                walk(key, depth + 1)
                walk(item, depth + 1)
        elif isinstance(value, (list, tuple, set, frozenset)):
            for item in list(value)[:3]:
                walk(item, depth + 1)

    for time, events in steps:  # every class appears at some step (a queue only while tasks wait)
        e.step(time, events)
        walk(e)
    walk(engine(tree("A"), "drf", preemption="on"))  # the preemption rule
    ordered = engine(tree(TenantSpec("A", ordering="ltrf")), "drf")  # a leaf's jobs' usage
    ordered.step(0, [node("n", mem=1), submit("a1", "A", job="j1"), submit("a2", "A", job="j1")])
    walk(ordered)
    assert seen == {c.cls for c in engine_snapshot.CLASSES}


def test_an_engine_read_back_while_a_tenant_is_starved_preempts_as_the_one_written():
    from fairstream.core.model import TaskSubmitted

    written = engine(tree("A", "B"), "drf", resources=("cpu",), preemption="on", preemption_timeout=30)
    written.step(0, [node("n", cpu=10), TaskSubmitted(0, "a", "ja", "A", {"cpu": 1}, None, 10)])
    written.step(100, [TaskSubmitted(100, "b", "jb", "B", {"cpu": 1}, None, 10)])
    read = decode_engine(encode_engine(written))
    assert read.starvation.since == written.starvation.since == {"B": 100}
    assert read.step(130, []).decisions == written.step(130, []).decisions


def test_a_task_with_any_of_several_label_values_is_read_back_allowing_the_same_nodes():
    # A label constraint's list of values is a tuple inside a tuple: read back it must still be
    # one (a list would allow no node and make the shape unhashable).
    e = engine(tree("A"), "drf")
    e.step(0, [node("p100", mem=1, labels={"gpu": "P100"}), node("k80", mem=1, labels={"gpu": "K80"})])
    e.step(1, [submit("busy", "A", 1, constraints={"labels": {"gpu": ["P100", "V100"]}}),
               submit("waits", "A", 1, constraints={"labels": {"gpu": ["P100", "V100"]}})])
    restored = decode_engine(encode_engine(e))
    assert restored.tasks["waits"].constraints == e.tasks["waits"].constraints
    result = restored.step(2, [TaskCompleted(2, "busy")])
    assert [(d.task, d.node) for d in result.decisions if d.kind is DecisionKind.PLACE] == [("waits", "p100")]


def test_every_snapshot_encoded_in_a_child_is_read_by_one_and_the_same_thread():
    # Read by whichever thread of the default executor was free, each snapshot left the worker
    # 5-9 MB larger (a glibc arena per thread that allocated) until every thread of the pool had
    # one (issue 60).
    import asyncio
    import threading

    from fairstream.streams import snapshots

    e = engine(tree("A"), "drf")
    e.step(0.0, [node("n1", 0.0, mem=4)] + [submit(f"t{k}", "A", 0.0) for k in range(3)])
    readers = []
    collect = snapshots._collect_snapshot

    def recorded(pid, read_end):
        readers.append(threading.get_ident())
        return collect(pid, read_end)

    async def scenario():
        snapshots._collect_snapshot = recorded
        try:
            blobs = []
            for _ in range(4):  # one after another, as the worker takes them
                blobs.append(await snapshots.snapshot_in_child(e))
            blobs += await asyncio.gather(*(snapshots.snapshot_in_child(e) for _ in range(3)))
            return blobs
        finally:
            snapshots._collect_snapshot = collect

    blobs = asyncio.run(scenario())
    assert len(readers) == 7 and len(set(readers)) == 1
    assert all(encode_engine(decode_engine(blob)) == encode_engine(e) for blob in blobs)
