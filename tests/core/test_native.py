"""The compiled module (``fairstream.core.native``, the Rust crate in ``native/``) against the
Python it stands in for: on any scenario, every decision the same, reasons included, and every
metric the same to the last bit.

The Python is the reference. The compiled pass runs the passes of ``drf``, ``fair`` and
``ltrf`` that use none of what only Python handles (``placement._serve_compiled``) and gives
up on a task with constraints; the compiled scans (the engine's candidate shapes and reserved
node, the accounting's usage integral, the simulator's per-step metrics) run under every policy. The scenarios here are mostly
passes the compiled pass makes, with some of the rest mixed in: constraints, nested tenants,
requests, a lost node, reservations and backfill."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fairstream.core import native
from fairstream.core.fairness import counted_allocation, resource_shares, soft_fairness_degree
from fairstream.policies import get as get_policy
from fairstream.sim.scenario import parse_scenario
from fairstream.sim.simulator import Simulator
from fairstream.state.engine_snapshot import encode_engine

from builders import compiled_path
from test_oracle import in_fractions
from test_properties import ALL, scenarios

COMPILED_POLICIES = ["drf", "fair", "ltrf", "hltrf"]  # (hltrf on a tree of one level: hltrf.walks_one_level)


def test_the_compiled_module_is_built_by_the_install():
    # scripts/bootstrap.sh installs with a Rust toolchain (every machine the README's commands
    # run on has one); an install that silently fell back to Python fails here.
    assert native.module is not None, "fairstream._native is not built: pip install -e . needs cargo"
    assert native.enabled()


class CountingModule:
    """The compiled module with a count of its passes and of those it gave up."""

    def __init__(self, module):
        self.module, self.passes, self.gave_up = module, 0, 0

    def serve_flat(self, *args):
        self.passes += 1
        result = self.module.serve_flat(*args)
        self.gave_up += result is None
        return result

    def __getattr__(self, name):  # the module's other functions, as they are
        return getattr(self.module, name)


@pytest.fixture
def counted(monkeypatch):
    counting = CountingModule(native.module)
    monkeypatch.setattr(native, "module", counting)
    return counting


def test_FAIRSTREAM_NATIVE_PASS_0_makes_every_pass_in_python_and_leaves_the_rest_compiled(counted, monkeypatch):
    # How the compiled pass's gain is measured (docs/benchmarks.md, issue 61): the same
    # decisions, no pass made by the compiled module, its scans still on.
    document = {"resources": ["cpu", "mem"], "nodes": [{"id": "n0", "capacity": {"cpu": 4, "mem": 8}}],
                "tenants": [{"id": "A"}, {"id": "B"}],
                "tasks": [{"id": f"{t}{k}", "tenant": t, "submit": k, "duration": 3, "demand": {"cpu": 1, "mem": 2}}
                          for t in "AB" for k in range(4)]}
    with_pass = decisions_of(document, "drf", {}, compiled=True)
    passes = counted.passes
    monkeypatch.setattr(native, "_pass", False)
    assert decisions_of(document, "drf", {}, compiled=True) == with_pass
    assert passes > 0 and counted.passes == passes and native.enabled()
    code = "from fairstream.core import native; print(native.enabled(), native.pass_enabled())"
    read = subprocess.run([sys.executable, "-c", code], env={**os.environ, "FAIRSTREAM_NATIVE_PASS": "0"},
                          capture_output=True, text=True, check=True)
    assert read.stdout.split() == ["True", "False"]


def run(document: dict, policy: str, params: dict, compiled: bool) -> tuple[list, dict, dict]:
    """The decisions, the summary and the metrics' series of a simulated run."""
    with compiled_path(compiled):
        decisions = []
        result = Simulator(parse_scenario(document), policy, params, on_decision=decisions.append).run()
    metrics = result.metrics
    series = {name: vars(one) for name, one in metrics.series.items()}
    return decisions, result.summary(), {"tenants": series, "cluster": metrics.cluster}


def decisions_of(document: dict, policy: str, params: dict, compiled: bool) -> list:
    return run(document, policy, params, compiled)[0]


@st.composite
def mostly_flat_scenarios(draw):
    """``test_properties.scenarios`` with, most of the time, no constraints and no job
    orderings (passes the compiled pass makes), and sometimes a node lost mid-run."""
    document = draw(scenarios())
    if draw(st.integers(0, 3)):
        for task in document["tasks"]:
            task.pop("constraints", None)
        for tenant in document["tenants"]:
            tenant.pop("ordering", None)
    if draw(st.integers(0, 4)) == 0:
        document["events"] = [{"time": draw(st.integers(1, 8)), "type": "node_lost", "node": "n0"}]
    return document


PARAMS = st.sampled_from([{}, {"reservation": "off"}, {"reservation": "backfill"}])


@pytest.mark.slow
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(document=mostly_flat_scenarios(), policy=st.sampled_from(COMPILED_POLICIES), params=PARAMS)
def test_the_compiled_pass_decides_exactly_as_the_python_pass(document, policy, params, counted):
    assert decisions_of(document, policy, params, compiled=True) == decisions_of(document, policy, params, compiled=False)


@st.composite
def requests_on_roomy_nodes(draw):
    """Flat tenants' requests of 2-8 small tasks on nodes that hold several: runs of three and
    more tasks of a request on one node, which the compiled pass gives as one decision."""
    nodes = [{"id": f"n{i}", "capacity": {"cpu": draw(st.integers(4, 16)), "mem": draw(st.integers(4, 16))}}
             for i in range(draw(st.integers(1, 3)))]
    tenants = [{"id": f"u{i}", "weight": draw(st.integers(1, 3))} for i in range(draw(st.integers(1, 3)))]
    tasks = [{"id": f"r{k}", "job": f"j{k % 3}", "tenant": draw(st.sampled_from(tenants))["id"],
              "submit": draw(st.integers(0, 6)), "duration": draw(st.integers(1, 5)), "count": draw(st.integers(2, 8)),
              "demand": {"cpu": draw(st.integers(1, 3)), "mem": draw(st.integers(1, 3))}}
             for k in range(draw(st.integers(1, 12)))]
    return {"resources": ["cpu", "mem"], "nodes": nodes, "tenants": tenants, "tasks": tasks}


@pytest.mark.slow
@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(document=st.one_of(requests_on_roomy_nodes(), mostly_flat_scenarios()), policy=st.sampled_from(COMPILED_POLICIES),
       params=PARAMS)
def test_the_compiled_passs_runs_in_one_decision_leave_the_state_of_the_python_passs_one_at_a_time(document, policy,
                                                                                                   params):
    # The compiled pass gives a request's next tasks on one node as one decision
    # (``Cycle.record_placement`` with a count), which the engine starts whole (``transitions._listed_run``); the
    # Python pass gives one decision per task, which the engine starts as a run too. After
    # every step, the engine's whole state (its snapshot's bytes) is the same, with demands in
    # tenths and node weights, so that a run's sums depend on the order of their additions.
    document = in_fractions(document)

    def steps(compiled: bool) -> list:
        seen = []
        with compiled_path(compiled):
            Simulator(parse_scenario(document), policy, params,
                      on_step=lambda engine, result: seen.append((result.decisions, encode_engine(engine)))).run()
        return seen

    assert steps(True) == steps(False)


@pytest.mark.slow
@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(document=mostly_flat_scenarios(), policy=st.sampled_from(ALL), params=PARAMS)
def test_every_policy_decides_and_measures_exactly_alike_with_the_compiled_scans(document, policy, params):
    # (== on floats: the compiled arithmetic is the same operations in the same order.)
    known = {param.name for param in get_policy(policy).params}
    params = {name: value for name, value in params.items() if name in known}
    assert run(document, policy, params, compiled=True) == run(document, policy, params, compiled=False)


def test_the_compiled_pass_runs_and_decides_as_python_on_a_busy_cluster(counted):
    # 12 tenants, 6 nodes, 300 tasks: many passes over candidate tenants, reservations and
    # requests; the compiled pass makes all of them (nothing has constraints).
    tenants = [{"id": f"t{i}", "weight": 1 + i % 3} for i in range(12)]
    nodes = [{"id": f"n{i}", "capacity": {"cpu": 8, "mem": 16}} for i in range(6)]
    tasks = [{"id": f"k{i}", "job": f"j{i % 40}", "tenant": f"t{i % 12}", "submit": i // 7, "duration": 1 + i % 9,
              "demand": {"cpu": 1 + i % 4, "mem": 1 + (i * 7) % 8}, **({"count": 3} if i % 11 == 0 else {})}
             for i in range(300)]
    document = {"resources": ["cpu", "mem"], "nodes": nodes, "tenants": tenants, "tasks": tasks}
    for policy in COMPILED_POLICIES:
        compiled = run(document, policy, {}, compiled=True)
        assert compiled == run(document, policy, {}, compiled=False), policy
        assert len(compiled[0]) >= 300
    assert counted.passes > 100 and counted.gave_up == 0


def test_the_compiled_pass_gives_up_on_a_task_with_constraints_and_python_decides(counted):
    document = {"resources": ["mem"], "nodes": [{"id": "n0", "capacity": {"mem": 4}, "labels": {"zone": "a"}},
                                                 {"id": "n1", "capacity": {"mem": 4}, "labels": {"zone": "b"}}],
                "tenants": [{"id": "A"}, {"id": "B"}],
                "tasks": [{"id": "a1", "job": "j", "tenant": "A", "submit": 0, "duration": 2, "demand": {"mem": 3},
                           "constraints": {"labels": {"zone": "b"}}},
                          {"id": "b1", "job": "j", "tenant": "B", "submit": 0, "duration": 2, "demand": {"mem": 3}}]}
    compiled = decisions_of(document, "drf", {}, compiled=True)
    assert compiled == decisions_of(document, "drf", {}, compiled=False)
    assert {(d.task, d.node) for d in compiled if d.kind.value == "place"} == {("a1", "n1"), ("b1", "n0")}
    assert counted.gave_up >= 1


finite = st.floats(0.0, 1e6, allow_nan=False, allow_infinity=False)


@st.composite
def usage_arrays(draw):
    """Tenant x resource arrays of what runs, the shares and the two usage integrals so far."""
    rows, resources = draw(st.integers(1, 7)), draw(st.integers(1, 3))
    def matrix():
        return np.array(draw(st.lists(finite, min_size=rows * resources, max_size=rows * resources))).reshape(rows, resources)
    return matrix(), matrix(), matrix(), matrix()


@settings(max_examples=100, deadline=None)
@given(arrays=usage_arrays(), discount=st.floats(0.0, 1.0), elapsed=st.floats(1e-6, 1e5))
def test_the_compiled_usage_integral_adds_what_the_numpy_adds_to_the_last_bit(arrays, discount, elapsed):
    # Accounting.advance without decay: counted += elapsed * counted allocation (formula 7), raw += elapsed * used.
    used, share, counted, raw = arrays
    expected_counted = counted + elapsed * counted_allocation(used, share, discount)
    expected_raw = raw + elapsed * used
    native.module.accumulate_usage(used, share, discount, elapsed, counted, raw)
    assert (counted.tolist(), raw.tolist()) == (expected_counted.tolist(), expected_raw.tolist())


signed = st.floats(-1e6, 1e6, allow_nan=False) | st.sampled_from([0.0, -0.0, math.nan, math.inf, -math.inf])


@settings(max_examples=200, deadline=None)
@given(rows=st.integers(0, 6), resources=st.integers(1, 3), data=st.data(), now=signed)
def test_the_compiled_top_ups_are_numpy_s_to_the_bit(rows, resources, data, now):
    # Accounting.top_ups with nothing discounted: max((Q - now) * demand + weighted, 0), with
    # numpy's maximum (NaN stays, -0.0 becomes 0.0); bits compared, so -0.0 is not 0.0 (but a
    # NaN is any NaN: which operand's sign a NaN takes is the compiler's choice of order).
    def values(count):
        return np.array(data.draw(st.lists(signed, min_size=count, max_size=count)), dtype=float)

    quanta, demand, weighted = values(rows), values(rows * resources).reshape(rows, resources), \
        values(rows * resources).reshape(rows, resources)
    with np.errstate(all="ignore"):
        expected = (quanta - now)[:, None] * demand + weighted
        np.maximum(expected, 0.0, out=expected)
    got = native.module.top_ups(quanta, demand, weighted, now)
    assert got.shape == expected.shape and np.isnan(got).tolist() == np.isnan(expected).tolist()
    assert np.where(np.isnan(got), 0.0, got).tobytes() == np.where(np.isnan(expected), 0.0, expected).tobytes()


@settings(max_examples=200, deadline=None)
@given(due=st.lists(signed, max_size=8), now=signed)
def test_the_compiled_rows_due_are_numpy_s(due, now):
    due = np.array(due, dtype=float)
    assert native.module.rows_due(due, now) == np.flatnonzero(due <= now).tolist()


@settings(max_examples=200, deadline=None)
@given(nodes=st.integers(0, 6), resources=st.integers(1, 3), data=st.data())
def test_the_compiled_reserved_node_is_the_one_numpy_chooses(nodes, resources, data):
    # Reservations.reserve: among usable nodes whose capacity holds the demand, the one that
    # lacks least, summed over resources as shares of the total; a total not above 0 (or NaN)
    # counts as 1 (the numpy's np.where, done on the compiled side too); the lowest row on ties.
    room = st.sampled_from([0.0, 1.0, 2.0, 4.0, 8.0])
    def matrix(values):
        return np.array(data.draw(st.lists(values, min_size=nodes * resources, max_size=nodes * resources)),
                        dtype=float).reshape(nodes, resources)
    capacity, used = matrix(room), matrix(room)
    demand = np.array(data.draw(st.lists(room, min_size=resources, max_size=resources)))
    total = np.array(data.draw(st.lists(st.sampled_from([0.0, -1.0, math.nan, 1.0, 16.0]), min_size=resources,
                                        max_size=resources)))
    usable = np.array(data.draw(st.lists(st.booleans(), min_size=nodes, max_size=nodes)), dtype=bool)
    rows = np.flatnonzero(usable & (capacity >= demand - 1e-9).all(axis=1))
    lacking = (np.maximum(demand - (capacity[rows] - used[rows]), 0.0) / np.where(total > 0, total, 1.0)).sum(axis=1)
    expected = int(rows[int(np.argmin(lacking))]) if len(rows) else None
    assert native.module.least_lacking_node(usable, capacity, used, demand, total, 1e-9) == expected


@settings(max_examples=200, deadline=None)
@given(shapes=st.integers(0, 5), resources=st.integers(1, 3), data=st.data())
def test_the_compiled_room_for_some_shape_is_numpy_s(shapes, resources, data):
    # Nodes.room_for_some on a live node: some demand row <= capacity - used + EPSILON, every resource.
    room = st.sampled_from([0.0, 0.5, 1.0, 2.0, 4.0, math.inf, math.nan])
    demands = np.array(data.draw(st.lists(room, min_size=shapes * resources, max_size=shapes * resources)),
                       dtype=float).reshape(shapes, resources)
    capacity, used = (np.array(data.draw(st.lists(room, min_size=resources, max_size=resources))) for _ in range(2))
    with np.errstate(all="ignore"):
        expected = bool((demands <= capacity - used + 1e-9).all(axis=1).any())
    assert native.module.room_for_some(demands, capacity, used, 1e-9) is expected


def _laid_out(array: np.ndarray, layout: str) -> np.ndarray:
    """``array``'s values, row-major (``C``) or column-major (``F``: not contiguous by rows,
    so the compiled side reads it element by element)."""
    return np.ascontiguousarray(array) if layout == "C" else np.asfortranarray(array)


@settings(max_examples=100, deadline=None)
@given(arrays=usage_arrays(), discount=st.floats(0.0, 1.0), elapsed=st.floats(1e-6, 1e5), layout=st.sampled_from("CF"))
def test_the_compiled_usage_integral_adds_the_same_whatever_the_arrays_layout(arrays, discount, elapsed, layout):
    used, share, counted, raw = (_laid_out(a, layout) for a in arrays)
    expected_counted = counted + elapsed * counted_allocation(used, share, discount)
    expected_raw = raw + elapsed * used
    native.module.accumulate_usage(used, share, discount, elapsed, counted, raw)
    assert (counted.tolist(), raw.tolist()) == (expected_counted.tolist(), expected_raw.tolist())


@settings(max_examples=100, deadline=None)
@given(arrays=usage_arrays(), discount=st.floats(0.0, 1.0), resource=st.sampled_from([None, 0]),
       layout=st.sampled_from("CF"))
def test_the_compiled_metric_state_is_the_numpy_state_to_the_last_bit(arrays, discount, resource, layout):
    # MetricsRecorder._state's numpy twin: per tenant g, d and counted g' as shares of the
    # metric resource (or dominant shares), and formula 12's degree over those with something
    # pending (soft_fairness); capacities of 0 included (such a resource counts as no share).
    allocation, share, pending, sums = (_laid_out(a, layout) for a in arrays)
    rows = len(allocation)
    capacity = np.where(sums[0] > 5e5, 0.0, sums[0] + 1.0)
    fractions = np.round(sums[:, -1] / 1e6, 3)  # (some may be 0: weightless tenants count as active only)
    g, d, counted, degree, running = native.module.metric_state(rows, allocation, share, pending, capacity, fractions,
                                                                discount, resource)
    assert g.tolist() == resource_shares(allocation, capacity, resource).tolist()
    assert d.tolist() == resource_shares(allocation + pending, capacity, resource).tolist()
    assert counted.tolist() == resource_shares(counted_allocation(allocation, share, discount), capacity,
                                               resource).tolist()
    active = pending.sum(axis=1) > 0
    expected = 0.0
    if rows >= 2 and active.sum() >= 2:
        expected = soft_fairness_degree(resource_shares(allocation[active], capacity, None), fractions[active])
    assert degree == expected
    assert running.tolist() == allocation.sum(axis=0).tolist()


@settings(max_examples=100, deadline=None)
@given(arrays=usage_arrays())
def test_the_compiled_metric_state_sums_what_runs_as_numpy_does(arrays):
    # The busy-time integral's running total: allocation.sum(axis=0), rows added in order.
    allocation, share, pending, _ = arrays
    capacity = np.full(allocation.shape[1], 1e7)
    fractions = np.full(allocation.shape[0], 1.0 / allocation.shape[0])
    *_, running = native.module.metric_state(len(allocation), allocation, share, pending, capacity, fractions, 1.0, None)
    assert running.tolist() == allocation.sum(axis=0).tolist()


@settings(max_examples=100, deadline=None)
@given(arrays=usage_arrays(), dt=st.floats(1e-6, 1e5))
def test_the_compiled_metric_integrals_add_what_the_numpy_adds_to_the_last_bit(arrays, dt):
    # MetricsRecorder.advance over an interval of constant state: per tenant g, min(d, S) and
    # counted g'; per resource what runs and the capacity.
    state, sums, caps, _ = arrays
    g, d, entitled = state[:, 0], sums[:, 0], caps[:, 0]
    counted = state[:, -1]
    integrals, busy, capacity_integral = np.stack([d, g, entitled]), sums[0].copy(), caps[0].copy()
    running, capacity = state[0].copy(), sums[-1].copy()
    expected = (integrals + dt * np.stack([g, np.minimum(d, entitled), counted]), busy + dt * running,
                capacity_integral + dt * capacity)
    native.module.integrate_metrics(integrals, g.copy(), d.copy(), entitled.copy(), counted.copy(), dt, busy, running,
                                    capacity_integral, capacity)
    assert [a.tolist() for a in (integrals, busy, capacity_integral)] == [a.tolist() for a in expected]


@settings(max_examples=100, deadline=None)
@given(arrays=usage_arrays(), dt=st.floats(1e-6, 1e5), discount=st.floats(0.0, 1.0),
       resource=st.sampled_from([None, 0]))
def test_a_step_that_only_integrates_adds_what_the_state_and_its_integrals_add_to_the_last_bit(arrays, dt, discount,
                                                                                                resource):
    # MetricsRecorder.advance on a step with no sample due and no tenant left to watch:
    # advance_metrics in one call, against metric_state then integrate_metrics.
    allocation, share, pending, sums = arrays
    rows, resources = allocation.shape
    allocation, pending = np.abs(allocation), np.abs(pending)
    capacity = np.abs(sums[0]) + 1.0
    fractions, entitled = np.full(rows, 1.0 / rows), np.abs(sums[:, 0])
    totals = (np.stack([sums[:, 0], allocation[:, 0], pending[:, -1]]), sums[0].copy(), sums[-1].copy())
    g, d, counted, degree, running = native.module.metric_state(rows, allocation, share, pending, capacity, fractions,
                                                                discount, resource)
    expected = [a.copy() for a in totals]
    native.module.integrate_metrics(expected[0], g, d, entitled, counted, dt, expected[1], running, expected[2], capacity)
    fused = native.module.advance_metrics(rows, allocation, share, pending, capacity, fractions, discount, resource,
                                          entitled, dt, *totals)
    assert fused == degree
    assert [a.tolist() for a in totals] == [a.tolist() for a in expected]
