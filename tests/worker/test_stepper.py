"""The worker's rules for time, applied without Kafka, Redis or asyncio (``streams/stepper.py``):
events in arrival order become engine steps."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairstream.core.model import TaskCompleted
from fairstream.streams.stepper import StepRules, run_steps
from tests.builders import engine, node, submit, tree


@dataclass(frozen=True)
class Sent:
    produced: float = 0.0


def steps_of(rules: StepRules, timeline, produced: float = 0.0, clock: float = 10.0):
    """Run ``timeline`` ((event, produced) pairs) on an engine whose clock is at ``clock``;
    returns ([(step time, [event types and times])], [rejection reasons])."""
    e = engine(tree("A"), "drf")
    e.step(0, [node("n1", mem=8)])
    e.step(clock, [])
    run = run_steps(e, [(event, Sent(sent), k) for k, (event, sent) in enumerate(timeline)], produced, rules)
    shape = [(step["time"], [(ev["type"], ev["time"]) for ev in step["events"]]) for step in run.steps]
    return shape, [reason for _, _, reason in run.rejected], run


@pytest.mark.parametrize("rules, timeline, steps, rejected", [
    pytest.param(StepRules(step_window=0), [(submit("a", "A", 11), 1), (submit("b", "A", 11), 1), (submit("c", "A", 12), 1)],
                 [(11, [("submitted", 11), ("submitted", 11)]), (12, [("submitted", 12)])], [],
                 id="with no window, events of one time are one step and a new time a new one"),
    pytest.param(StepRules(step_window=0.5), [(submit("a", "A", 11), 1), (submit("b", "A", 11.4), 1), (submit("c", "A", 11.6), 1)],
                 [(11.4, [("submitted", 11), ("submitted", 11.4)]), (11.6, [("submitted", 11.6)])], [],
                 id="a window gathers the events within it into one step at the latest of their times"),
    pytest.param(StepRules(max_lateness=60), [(submit("a", "A", 5), 1)], [(10, [("submitted", 10)])], [],
                 id="an event behind the clock is applied, and recorded, at the clock"),
    pytest.param(StepRules(max_lateness=3), [(submit("a", "A", 5), 1)], [],
                 ["time 5 is 5.000 s behind the cluster clock 10.0 (more than max_lateness 3 s)"],
                 id="one more than max_lateness behind, sent after what moved the clock, is rejected"),
    pytest.param(StepRules(max_ahead=100), [(submit("a", "A", 500), 1)], [],
                 ["time 500 is 490.000 s ahead of the cluster clock 10.0 (more than max_ahead 100 s"],
                 id="an event far ahead of the clock is rejected and moves nothing"),
    pytest.param(StepRules(max_ahead=100), [(submit("a", "A", 500), 2000)], [(500, [("submitted", 500)])], [],
                 id="unless its producer's clock moved as far"),
    pytest.param(StepRules(), [(TaskCompleted(11, "ghost"), 1), (submit("a", "A", 11), 1)],
                 [(11, [("submitted", 11)])], ["completion of an unknown task"],
                 id="an event the engine would reject is rejected before its time counts"),
])
def test_events_become_steps_by_the_rules_of_time(rules, timeline, steps, rejected):
    taken, reasons, _ = steps_of(rules, timeline)
    assert taken == steps
    assert len(reasons) == len(rejected) and all(want in got for want, got in zip(rejected, reasons))


def test_a_late_event_produced_before_what_the_cluster_applied_is_applied_at_the_clock():
    # The worker read it late (catching up), its producer did not send it late.
    taken, reasons, run = steps_of(StepRules(max_lateness=3), [(submit("a", "A", 5), 1)], produced=50)
    assert taken == [(10, [("submitted", 10)])] and not reasons and run.produced == 50


def test_a_late_completion_is_always_applied_at_the_clock():
    e = engine(tree("A"), "drf")
    e.step(0, [node("n1", mem=8), submit("a", "A", 0)])
    e.step(100, [])
    run = run_steps(e, [(TaskCompleted(1, "a"), Sent(200), None)], produced=0.0, rules=StepRules(max_lateness=3))
    assert not run.rejected and [s["time"] for s in run.steps] == [100] and "a" not in e.tasks


def test_a_node_silent_for_longer_than_the_timeout_is_declared_lost_before_the_step():
    e = engine(tree("A"), "drf")
    e.step(0, [node("n1", mem=8), node("n2", mem=8)])
    e.step(10, [node("n2", 10, mem=8)])
    # At 20: n1 was last heard from at 0 (20 s > 15), n2 at 10 (10 s).
    run = run_steps(e, [(node("n2", 20, mem=8), Sent(1), None)], 0.0, StepRules(node_timeout=15))
    assert [(ev["type"], ev.get("node")) for ev in run.steps[0]["events"]] == [("lost", "n1"), ("heartbeat", "n2")]


def split_run(rules: StepRules, timeline, cut: int):
    """``timeline`` ((event, produced) pairs) given in two batches, cut before item ``cut``, the
    first batch's last group held open and given again with the second (as the worker does
    when a batch ends, issue 59.7): the steps taken, and the first batch's open items."""
    e = engine(tree("A"), "drf")
    e.step(0, [node("n1", mem=8)])
    e.step(10, [])
    items = [(event, Sent(sent), k) for k, (event, sent) in enumerate(timeline)]
    first = run_steps(e, items[:cut], 0.0, rules, hold_open=True)
    second = run_steps(e, first.open_items + items[cut:], first.produced, rules)
    steps = [(step["time"], [(ev["type"], ev["time"]) for ev in step["events"]]) for step in first.steps + second.steps]
    return steps, first.open_items


# Ten events 3 ms apart (the operator's trial had ten completions so, in three Kafka batches:
# three steps where the simulator took one), then one a second later; a window of 0.1 s.
TEN_EVENTS = [(submit(f"t{k}", "A", 11 + 0.003 * k), 1) for k in range(10)] + [(submit("late", "A", 12), 1)]


@pytest.mark.parametrize("cut", [3, 7, 10], ids=lambda cut: f"a batch ends after event {cut}")
def test_a_batch_that_ends_inside_a_step_window_leaves_the_step_open_for_the_next(cut):
    steps, held = split_run(StepRules(step_window=0.1), TEN_EVENTS, cut)
    whole, _, _ = steps_of(StepRules(step_window=0.1), TEN_EVENTS)
    assert steps == whole == [(11.027, [("submitted", round(11 + 0.003 * k, 3)) for k in range(10)]),
                              (12, [("submitted", 12)])]
    assert [item[2] for item in held] == list(range(cut))  # (all of the first batch: one group)


@settings(max_examples=60, deadline=None)
@given(times=st.lists(st.integers(0, 40), min_size=1, max_size=12), window=st.sampled_from([0, 0.05, 0.1, 0.5]),
       late=st.lists(st.booleans(), min_size=12, max_size=12), data=st.data())
def test_a_step_held_open_across_a_batch_end_decides_as_one_batch_would(times, window, late, data):
    # Events in arrival order at times 10 + t/100 (some sent late: behind the clock), cut
    # anywhere: held open and given again, the steps are those of the whole in one batch.
    timeline = [(submit(f"t{k}", "A", 10 + t / 100 - (5 if late[k] else 0)), 1) for k, t in enumerate(times)]
    cut = data.draw(st.integers(0, len(timeline)))
    rules = StepRules(step_window=window, max_lateness=3)
    whole, whole_rejected, _ = steps_of(rules, timeline)
    steps, _ = split_run(rules, timeline, cut)
    assert steps == whole
