"""Events applied in runs (``transitions.apply_events``) leave the engine as one event at a
time would, to the bit: a job's tasks submitted one after another are stored as they come and
queued and counted once, with their demand parsed once (``admission.parsed_demand``); running
tasks completed one after another on one node, of one tenant, finish together.

The reference applies each event in a call of its own and parses every demand afresh (no kept
parse): the slow, obvious way."""

from unittest import mock

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from fairstream.core import engine as engine_module
from fairstream.core import transitions
from fairstream.core.model import NodeHeartbeat, TaskCompleted, TaskSubmitted
from fairstream.state import engine_snapshot

from builders import engine, tree

# Demands that compare equal but are not the same input: an int for a float (the same
# number), a bool (refused), -0.0 for 0.0 (another shape); and tenths, whose sums show the
# order they were added in.
DEMANDS = [
    {"cpu": 0.1, "mem": 0.2},
    {"cpu": 0.1, "mem": 0.2},
    {"cpu": 1.0, "mem": 0.3},
    {"cpu": 1, "mem": 0.3},
    {"cpu": True, "mem": 0.3},
    {"cpu": 0.1, "mem": 0.0},
    {"cpu": 0.1, "mem": -0.0},
    {"cpu": 0.0, "mem": 0.0},
]


def one_at_a_time_parsed_afresh(engine, events, result):
    for event in events:
        engine.workload.last_demand = None
        transitions.apply_events(engine, [event], result)


def state(engine) -> bytes:
    """The engine's state with nothing shared: runs share a parse between their tasks (one
    demand map), one at a time does not, and the snapshot would write the sharing."""
    with mock.patch.object(engine_snapshot._Encoder, "_first_time", lambda self, value: True):
        return engine_snapshot.encode_engine(engine)


@st.composite
def steps(draw):
    """Steps of submissions in runs (same tenant, job and demand, sometimes with an estimate,
    a constraint or a repeated id between), completions of tasks submitted before, and a
    heartbeat now and then."""
    out, submitted = [], []
    for time in range(draw(st.integers(1, 6))):
        events = []
        for _ in range(draw(st.integers(0, 6))):
            kind = draw(st.sampled_from(["run", "run", "complete", "heartbeat"]))
            if kind == "run":
                tenant, job = draw(st.sampled_from("AB")), draw(st.sampled_from(["j0", "j1"]))
                demand = draw(st.sampled_from(DEMANDS))
                for _ in range(draw(st.integers(1, 5))):
                    task = draw(st.sampled_from([f"t{len(submitted)}", f"t{len(submitted)}", "t0"]))
                    submitted.append(task)
                    constraints = draw(st.sampled_from([None, None, None, {"nodes": ["n0"]}]))
                    estimate = draw(st.sampled_from([None, None, 2.0, 3]))
                    events.append(TaskSubmitted(float(time), task, job, tenant, dict(demand), constraints,
                                                estimate=estimate))
            elif kind == "complete" and submitted:
                for task in draw(st.lists(st.sampled_from(submitted), max_size=4)):
                    events.append(TaskCompleted(float(time), task))
            elif kind == "heartbeat":
                events.append(NodeHeartbeat(float(time), draw(st.sampled_from(["n0", "n1"])),
                                            {"cpu": 1.0, "mem": draw(st.sampled_from([0.5, 1.0]))}))
        out.append((float(time), events))
    return out


@settings(max_examples=300, deadline=None)
@given(steps=steps(), policy=st.sampled_from(["drf", "ltrf", "fifo"]))
@example(steps=[(0.0, [NodeHeartbeat(0.0, "n0", {"cpu": 1.0, "mem": 1.0}),
                       TaskSubmitted(0.0, "t0", "j0", "A", {"cpu": 0.1, "mem": 0.0}),
                       TaskSubmitted(0.0, "t1", "j0", "A", {"cpu": 0.1, "mem": -0.0}),
                       TaskSubmitted(0.0, "t2", "j0", "A", {"cpu": 1.0, "mem": 0.3}),
                       TaskSubmitted(0.0, "t3", "j0", "A", {"cpu": True, "mem": 0.3})])],
         policy="drf")
@pytest.mark.slow
def test_events_applied_in_runs_leave_the_state_one_at_a_time_leaves(steps, policy):
    in_runs = engine(tree("A", "B"), policy, resources=("cpu", "mem"))
    reference = engine(tree("A", "B"), policy, resources=("cpu", "mem"))
    for time, events in steps:
        ran = in_runs.step(time, events)
        with mock.patch.object(engine_module, "apply_events", one_at_a_time_parsed_afresh):
            expected = reference.step(time, events)
        assert ran.rejected == expected.rejected
        assert ran.decisions == expected.decisions
        assert [t.id for t in ran.finished] == [t.id for t in expected.finished]
        assert state(in_runs) == state(reference)


@pytest.mark.parametrize("first, then, refusal", [
    ({"cpu": 1.0}, {"cpu": True}, "demand.cpu: must be a number, got True"),
    ({"cpu": 1.0}, {"cpu": 1.0, "gpu": 1.0}, "demand.gpu: unknown resource"),
    ({"cpu": 1.0}, {"cpu": 0.0}, "demand: must ask for some resource (all zero)"),
], ids=["a bool equal to the kept 1.0 is refused",
        "an unknown resource after a kept demand is refused",
        "an all-zero demand after a kept one is refused"])
def test_a_demand_after_a_kept_parse_is_checked_as_any_other(first, then, refusal):
    e = engine(tree("A"), "drf", resources=("cpu", "mem"))
    result = e.step(0.0, [TaskSubmitted(0.0, "t0", "j", "A", first), TaskSubmitted(0.0, "t1", "j", "A", then)])
    assert len(result.rejected) == 1 and result.rejected[0][1].startswith(refusal)
    assert list(e.tasks) == ["t0"]


def test_negative_zero_after_a_kept_zero_is_another_shape():
    # 0.0 == -0.0, but the shape is the demand's bytes: a parse kept for 0.0 must not pass
    # for -0.0 (only demands of positive floats are kept).
    e = engine(tree("A"), "drf", resources=("cpu", "mem"))
    e.step(0.0, [TaskSubmitted(0.0, "t0", "j", "A", {"cpu": 1.0, "mem": 0.0}),
                 TaskSubmitted(0.0, "t1", "j", "A", {"cpu": 1.0, "mem": -0.0})])
    assert e.tasks["t0"].shape != e.tasks["t1"].shape
    assert str(e.tasks["t1"].demand_values[1]) == "-0.0"
