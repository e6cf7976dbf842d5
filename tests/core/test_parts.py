"""The engine's smaller parts, each alone: unschedulable verdicts (``core/verdicts.py``), a
tenant-local pass's changes (``core/candidates.py``), the reservation (``core/reservation.py``)
and the alignment score (``core/fit.py``)."""

from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairstream.core.candidates import Changes
from fairstream.core.fit import NodeFit, alignment_factors, alignment_scores, node_alignment
from fairstream.core.model import EPSILON, NO_CONSTRAINTS, Constraints, Node, ReasonCode, ResourceSpace, TaskSubmitted
from fairstream.core.nodes import Nodes
from fairstream.core.reservation import Reservations
from fairstream.core.snapshot import Reservation
from fairstream.core.verdicts import Verdicts
from fairstream.core.workload import Workload

RESOURCES = ResourceSpace(("cpu", "mem"))


def cluster(*capacities, labels=None) -> Nodes:
    registry = Nodes(2)
    for k, (cpu, mem) in enumerate(capacities):
        registry.join(Node(f"n{k}", np.array([cpu, mem], dtype=float), dict(labels or {})))
    return registry


def submitted(workload: Workload, task: str, cpu: float, tenant: str = "A", constraints=NO_CONSTRAINTS):
    event = TaskSubmitted(0.0, task, "j", tenant, {"cpu": cpu, "mem": 1.0})
    return workload.submit(event, np.array([cpu, 1.0]), constraints, {"cpu": cpu, "mem": 1.0})


@pytest.mark.parametrize("cpu, constraints, code", [
    pytest.param(4.0, NO_CONSTRAINTS, None, id="a task some node can hold is not unschedulable"),
    pytest.param(9.0, NO_CONSTRAINTS, ReasonCode.TOO_LARGE, id="a task larger than every node is too large"),
    pytest.param(1.0, Constraints(labels=(("gpu", "yes"),)), ReasonCode.NO_MATCHING_NODE,
                 id="a task whose constraints no node matches has no matching node"),
])
def test_a_new_task_is_judged_once_by_its_shape(cpu, constraints, code):
    workload, registry, verdicts = Workload(2, 60.0), cluster((8, 8)), Verdicts()
    task = submitted(workload, "t", cpu, constraints=constraints)
    verdicts.to_check.append(task)
    decisions = verdicts.report(1.0, workload, registry, RESOURCES, "drf")
    assert [d.code for d in decisions] == ([] if code is None else [code])
    assert (verdicts.verdict(task.shape) or (None,))[0] == code
    assert verdicts.report(2.0, workload, registry, RESOURCES, "drf") == [], "reported once"


def test_a_node_that_joins_lifts_a_verdict_and_the_task_asks_for_a_share_again():
    workload, registry, verdicts = Workload(2, 60.0), cluster((8, 8)), Verdicts()
    task = submitted(workload, "t", 12.0)
    verdicts.to_check.append(task)
    verdicts.report(1.0, workload, registry, RESOURCES, "drf")
    pending = np.array([[12.0, 1.0]])
    assert verdicts.waiting_demand(pending, workload, {"A": 0}).tolist() == [[0.0, 0.0]]
    registry.join(Node("big", np.array([16.0, 16.0]), {}))
    verdicts.nodes_changed = True
    assert verdicts.report(2.0, workload, registry, RESOURCES, "drf") == []
    assert verdicts.verdict(task.shape) is None and not verdicts.unschedulable
    assert verdicts.waiting_demand(pending, workload, {"A": 0}) is pending


def test_the_candidates_are_the_tenants_touched_and_those_whose_shape_fits_a_node_that_gained_room():
    workload, registry, changes = Workload(2, 60.0), cluster((4, 4), (4, 4)), Changes()
    submitted(workload, "small", 2.0, tenant="S")
    submitted(workload, "large", 6.0, tenant="L")
    submitted(workload, "other", 1.0, tenant="T")
    assert changes.pass_fields(workload, registry, None, every_tenant=False) == {}, "the first pass: every tenant"
    registry.storage_used[:2] = 4.0  # both nodes full
    registry.storage_used[1] = [1.0, 1.0]  # node 1 gained room for the small shape, not the large
    changes.grown.add(1)
    changes.touched.add("T")
    fields = changes.pass_fields(workload, registry, None, every_tenant=False)
    assert fields["candidates"] == {"S", "T"}
    assert fields["grown_rows"].tolist() == [1] and fields["grown_demands"].tolist() == [[2.0, 1.0], [1.0, 1.0]]
    assert not (changes.grown or changes.touched or changes.fresh), "a pass starts a new record"
    held = Reservation(0, "L", 1, "large")  # its room may have grown on the reserved node, unseen
    assert changes.pass_fields(workload, registry, held, every_tenant=False)["candidates"] == {"L"}
    changes.forget()
    assert changes.pass_fields(workload, registry, None, every_tenant=False) == {}


def test_a_reservation_goes_to_the_node_that_lacks_least_and_stays_while_it_can_hold_the_task():
    workload, registry, reservations = Workload(2, 60.0), cluster((8, 8), (8, 8)), Reservations()
    registry.storage_used[0] = [7.0, 1.0]  # node 0 lacks 5 cpu for a 6-cpu task, node 1 lacks 2
    registry.storage_used[1] = [4.0, 1.0]
    task = submitted(workload, "big", 6.0)
    total = registry.capacity.sum(axis=0)
    reservations.reserve(("A", task), workload, registry, Verdicts(), total)
    assert reservations.held == Reservation(1, "A", task.shape, "big")
    registry.storage_used[1] = [8.0, 1.0]  # node 1 now lacks more than node 0: the wait keeps its node
    reservations.reserve(("A", task), workload, registry, Verdicts(), total)
    assert reservations.held.node == 1
    reservations.node_lost(1)
    assert reservations.held is None
    reservations.reserve(None, workload, registry, Verdicts(), total)
    assert reservations.held is None


@pytest.mark.parametrize("after, backfill, until_after, moved", [
    pytest.param(None, False, None, True, id="a reservation that ended moved"),
    pytest.param(Reservation(2, "A", 0, "t"), False, None, True, id="one on another node moved"),
    pytest.param(Reservation(1, "A", 0, "t2"), False, None, False, id="the same wait for the next task did not"),
    pytest.param(Reservation(1, "A", 0, "t2"), True, 5.0, True,
                 id="with backfill, a new task waiting changes what may backfill"),
    pytest.param(Reservation(1, "A", 0, "t"), True, 7.0, True, id="with backfill, a new start time does too"),
    pytest.param(Reservation(1, "A", 0, "t"), True, 5.0, False, id="with backfill, the same task and start do not"),
])
def test_a_reservation_moved_when_the_room_it_kept_opened_to_other_shapes(after, backfill, until_after, moved):
    before = Reservation(1, "A", 0, "t")
    assert Reservations.moved(before, after, backfill, 5.0, lambda: until_after) is moved


def test_a_heartbeat_joins_a_new_node_and_merges_resource_weights():
    registry = Nodes(2)
    row, changed, relabelled = registry.heartbeat("n0", np.array([4.0, 8.0]), {"zone": "a"}, {0: 2.0}, 1.0)
    assert (row, changed, relabelled) == (0, True, False)
    assert registry.nodes[0].weights.tolist() == [2.0, 1.0] and registry.labels[0] == {"zone": "a"}
    assert registry.heartbeat("n0", np.array([4.0, 8.0]), None, {1: 3.0}, 2.0) == (0, False, False)
    assert registry.nodes[0].weights.tolist() == [2.0, 3.0], "the weights not named keep theirs"
    registry.heartbeat("n0", np.array([4.0, 8.0]), None, {0: 1.0, 1: 1.0}, 3.0)
    assert registry.nodes[0].weights is None, "all ones: no weights"
    assert registry.room_for_some(0, np.array([[4.0, 8.0]])) and not registry.room_for_some(0, np.array([[5.0, 1.0]]))


def aligned_by_hand(free: list[float], demand: list[float], capacity: list[float]) -> float:
    """One node's alignment score in plain floats, resource by resource in order: IEEE
    arithmetic, so the same bits on every machine."""
    score = None
    for have, want, total in zip(free, demand, capacity):
        scale = total if total > 0 else 1.0
        term = ((have if have > 0 else 0.0) / scale) * (want / scale)
        score = term if score is None else score + term
    return score


def bits(value: float) -> bytes:
    return np.float64(value).tobytes()  # (-0.0 and 0.0 compare equal, but print apart in a reason)


amounts = st.floats(min_value=-4.0, max_value=64.0, allow_nan=False).map(lambda x: round(x, 3)) | st.just(-0.0)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 4).flatmap(lambda r: st.tuples(
    st.lists(st.lists(amounts, min_size=r, max_size=r), min_size=1, max_size=40),
    st.lists(amounts.map(abs), min_size=r, max_size=r),
    st.lists(st.sampled_from([0.0, 1.0, 96.0, 1000.0, 4096.5]), min_size=r, max_size=r))))
def test_a_nodes_alignment_score_is_the_same_bits_alone_among_many_one_by_one_and_by_hand(case):
    # Tetris's score compares nodes by float: summed in an order of BLAS's own it differed, on
    # one machine, between a node scored alone and the same node among many (and so between
    # machines). Resource by resource in order it is what IEEE arithmetic gives anywhere.
    free, demand, capacity = case
    scores = alignment_scores(np.array(free), np.array(demand), np.array(capacity))
    scale, weights = alignment_factors(np.array(demand), np.array(capacity))
    for row, expected in zip(free, scores.tolist()):
        assert bits(alignment_scores(np.array(row), np.array(demand), np.array(capacity)).item()) == bits(expected)
        assert bits(node_alignment(row, scale.tolist(), weights)) == bits(expected)
        assert bits(aligned_by_hand(row, demand, capacity)) == bits(expected)


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_a_shapes_alignment_scores_kept_for_the_pass_are_a_fresh_scans_after_any_placements(data):
    # ``NodeFit.aligned_scores`` scans every node once per shape, then scores again only the
    # nodes whose room the pass changed (placed on, or given back): the same bits as a scan.
    n = data.draw(st.integers(8, 40), label="nodes")
    capacity = np.array([[data.draw(st.integers(1, 16)), data.draw(st.integers(1, 64))] for _ in range(n)], dtype=float)
    free = capacity.copy()
    workload = Workload(2, 60.0)
    shapes = [workload.submit(TaskSubmitted(0.0, f"t{k}", "j", "A", {"cpu": cpu, "mem": mem}), np.array([cpu, mem]),
                              NO_CONSTRAINTS, {"cpu": cpu, "mem": mem})
              for k, (cpu, mem) in enumerate([(1.0, 4.0), (3.0, 2.0), (0.5, 16.0)])]
    reserved = data.draw(st.none() | st.tuples(st.integers(0, n - 1), st.sampled_from(shapes)), label="reservation")
    reservation = None if reserved is None else Reservation(reserved[0], "A", reserved[1].shape, reserved[1].id)
    snapshot = SimpleNamespace(capacity=capacity.sum(axis=0), reservation=reservation)
    fit = NodeFit(snapshot, free, [], True)

    def scanned(task):
        fits = (free >= task.demand - EPSILON).all(axis=1) & fit.usable(task)
        scores = alignment_scores(free, task.demand, snapshot.capacity)
        scores[~fits] = -np.inf
        return scores

    for _ in range(data.draw(st.integers(1, 12), label="steps")):
        for _ in range(data.draw(st.integers(0, 3), label="changes")):
            node, task = data.draw(st.integers(0, n - 1)), data.draw(st.sampled_from(shapes))
            if data.draw(st.booleans(), label="give back") and (free[node] + task.demand <= capacity[node]).all():
                free[node] += task.demand
                fit.gave_back(node, "A", "j")
            elif (free[node] >= task.demand - EPSILON).all():
                free[node] -= task.demand
                fit.took(node, "A", "j")
        task = data.draw(st.sampled_from(shapes))
        assert fit.aligned_scores(task).tobytes() == scanned(task).tobytes()
        fresh = scanned(task)
        assert fit.best_aligned_node(task) == (None if (fresh == -np.inf).all() else int(np.argmax(fresh)))
