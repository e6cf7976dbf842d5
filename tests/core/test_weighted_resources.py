"""Weighted resources for heterogeneous nodes (LTRF, ICS'14 section 4, formula 9): a task's
accounted usage is its demand x its node's resource weight delta x its time, so a tenant that
runs on faster machines is counted as having used more."""

from __future__ import annotations

import pytest

from fairstream.core.model import ModelError, NodeHeartbeat, TaskCompleted
from fairstream.sim.scenario import parse_scenario

from builders import engine, submit, tree


def alternating_run(fast_weight: float | None, periods: int = 10):
    """Two nodes of 1 cpu, "fast" (cpu weight ``fast_weight``) listed first, then "slow"; A and
    B always have a 1-cpu task of 10 s waiting. Returns the engine and, per period, who ran on
    the fast node."""
    e = engine(tree("A", "B"), "ltrf", resources=("cpu",), resource="cpu", quantum=0, quantum_mode="fixed")
    weights = None if fast_weight is None else {"cpu": fast_weight}
    events = [NodeHeartbeat(0.0, "fast", {"cpu": 1}, None, weights), NodeHeartbeat(0.0, "slow", {"cpu": 1})]
    on_fast, running, k = [], [], 0
    for period in range(periods):
        now = 10.0 * period
        events += [TaskCompleted(now, t) for t in running]
        events += [submit(f"a{k}", "A", now, cpu=1), submit(f"b{k}", "B", now, cpu=1)]
        k += 1
        decisions = e.step(now, events).decisions
        events, running = [], [d.task for d in decisions]
        on_fast += [d.tenant for d in decisions if d.node == "fast"]
    e.step(10.0 * periods, [TaskCompleted(10.0 * periods, t) for t in running])
    return e, on_fast


def test_tenants_take_turns_on_the_fast_node_and_their_weighted_usage_converges():
    # The fast CPU counts double (delta = 2). t = 0: a tie at 0, A (first by name) gets the
    # fast node, B the slow one. t = 10: A has used 2 x 10 = 20, B 1 x 10 = 10: B is served
    # first and gets the fast node. t = 20: both at 30, A first again; and so on: every 20 s
    # each has had 10 s fast and 10 s slow, 30 cpu-seconds of weighted usage.
    e, on_fast = alternating_run(2.0)
    assert on_fast == ["A", "B"] * 5
    usage = e.accounting.accumulated_rows(None, 100.0)[:, 0]
    assert usage.tolist() == pytest.approx([150.0, 150.0])  # 5 x (2 x 10 + 1 x 10) each


def test_without_weights_the_tie_break_gives_the_fast_node_to_the_same_tenant_every_time():
    # Both count 10 per 10 s whichever node they ran on: always a tie, always A first.
    e, on_fast = alternating_run(None)
    assert on_fast == ["A"] * 10
    assert e.accounting.accumulated_rows(None, 100.0)[:, 0].tolist() == pytest.approx([100.0, 100.0])


def test_a_heartbeat_changes_the_weights_it_names_and_keeps_the_others():
    e = engine(tree("A"), "ltrf", resources=("cpu", "mem"))
    e.step(0.0, [NodeHeartbeat(0.0, "n", {"cpu": 1, "mem": 1}, None, {"cpu": 2.0, "mem": 3.0})])
    e.step(1.0, [NodeHeartbeat(1.0, "n", {"cpu": 1, "mem": 1}, None, {"cpu": 1.5})])
    assert e.nodes[0].weights.tolist() == [1.5, 3.0]
    e.step(2.0, [NodeHeartbeat(2.0, "n", {"cpu": 1, "mem": 1})])  # no weights: kept
    assert e.nodes[0].weights.tolist() == [1.5, 3.0]


@pytest.mark.parametrize("weights, message", [
    pytest.param({"cpu": 0}, "weights.cpu: must be above 0", id="a weight of zero"),
    pytest.param({"gpu": 2}, "weights.gpu: unknown resource", id="a weight of a resource the cluster lacks"),
])
def test_a_bad_weight_is_rejected_with_the_reason(weights, message):
    e = engine(tree("A"), "ltrf", resources=("cpu",), resource="cpu")
    result = e.step(0.0, [NodeHeartbeat(0.0, "n", {"cpu": 1}, None, weights)])
    assert result.rejected and message in result.rejected[0][1]


def test_scenario_files_carry_node_weights():
    document = {"resources": ["cpu"], "nodes": [{"id": "fast", "capacity": {"cpu": 1}, "weights": {"cpu": 2}}],
                "tasks": []}
    assert parse_scenario(document).nodes[0].weights == {"cpu": 2.0}
    with pytest.raises(ModelError, match="weights"):
        parse_scenario({**document, "nodes": [{"id": "f", "capacity": {"cpu": 1}, "weights": {"cpu": 0}}]})


def test_heartbeat_weights_come_through_the_wire_and_the_recorded_log():
    import json

    from fairstream.wire.events import HEARTBEAT, BadInput, decode_message, event_from_json, event_to_json

    raw = json.dumps({"cluster": "c", "node": "fast", "time": 1, "capacity": {"cpu": 4},
                      "weights": {"cpu": 1.5}}).encode()
    (item,) = decode_message(HEARTBEAT, raw, 64 * 1024)
    assert item.event.weights == {"cpu": 1.5}
    assert event_from_json(event_to_json(item.event)) == item.event
    bad = json.dumps({"cluster": "c", "node": "n", "time": 1, "capacity": {"cpu": 4}, "weights": {"cpu": 0}}).encode()
    with pytest.raises(BadInput, match="weights.cpu: 0 is less than or equal to the minimum of 0"):
        decode_message(HEARTBEAT, bad, 64 * 1024)
