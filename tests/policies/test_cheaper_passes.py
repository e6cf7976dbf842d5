"""Passes that skip work that cannot matter decide as before (issue 64): pmdrf weighs on a node
only the tenants whose next task could fit its room and stops once nothing waits (the plain
reading: every demanding tenant on every node with room); static leaves out the tenants whose
partition takes none of their tasks (the plain reading: each of their shapes tried and refused)."""

import heapq

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import fairstream.policies.pmdrf as pmdrf
from fairstream.core.fairness import dominant_share, fair_key
from fairstream.core.placement import leaf_arrival, order_code
from tests.core.test_properties import drive, scenarios


def every_tenant_on_every_node(cycle, tenants, nodes, again=False):
    """The turns as first written: every demanding tenant weighed on every node given."""
    snapshot = cycle.snapshot
    node_capacity, allocation = snapshot.node_capacity, snapshot.node_allocation
    for node in nodes:
        capacity = node_capacity[node]
        running = allocation.of(node)
        here = {t: running[t].copy() if t in running else np.zeros(len(capacity)) for t in tenants}
        if again:
            for _, placed_tenant, entry, placed_node in cycle.placed:
                if placed_node == node and placed_tenant in here:
                    here[placed_tenant] += entry.demand

        def key(tenant):
            share = dominant_share(here[tenant], capacity) / snapshot.share_fraction[snapshot.rows[tenant]]  # noqa: B023
            return fair_key(share, leaf_arrival(snapshot, tenant), tenant, cycle.below_min_share(tenant))

        heap = [(key(t), t) for t in tenants]
        heapq.heapify(heap)
        while heap:
            tenant_key, tenant = heapq.heappop(heap)
            task = next((t for t in cycle.queues.shape_heads(tenant) if pmdrf.fits(cycle, t, node)), None)
            if task is None:
                continue
            if not cycle.within_caps(tenant, task):
                cycle.skip_for(tenant, task)
            else:
                cycle.commit(tenant, task, node, f"pmdrf: lowest dominant share/weight on {snapshot.node_ids[node]} "
                                                 f"({tenant_key.share:.4g})", order_code(tenant_key))
                here[tenant] += task.demand
            heapq.heappush(heap, (key(tenant), tenant))


def decisions(document, policy: str = "pmdrf", replaced: tuple | None = None):
    """The run's decisions under ``policy``, with ``replaced`` (module, name, stand-in) put in
    place for the run, if given."""
    made: list = []
    with pytest.MonkeyPatch.context() as patch:
        if replaced is not None:
            patch.setattr(*replaced)
        drive(document, policy, lambda engine: None, record=made)
    return [(d.kind, d.time, d.task, d.node, d.count, d.reason) for d in made]


FIRST_READING = (pmdrf, "share_nodes", every_tenant_on_every_node)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(document=scenarios())
def test_weighing_only_the_tenants_that_could_fit_decides_as_weighing_every_tenant(document):
    assert decisions(document) == decisions(document, replaced=FIRST_READING)


def test_the_reference_is_not_the_same_function():
    # (So the property above compares two ways, not one with itself.)
    assert every_tenant_on_every_node is not pmdrf.share_nodes


@pytest.mark.parametrize("seed", [1, 2])
def test_an_idle_cluster_of_many_nodes_visits_one_node_for_one_task(seed):
    # 200 nodes with room; one tenant asks for one task: the pass places it on the first node
    # and stops (it visited every node before: issue 64).
    document = {"resources": ["cpu"], "nodes": [{"id": f"n{k:03d}", "capacity": {"cpu": 4}} for k in range(200)],
                "tenants": [{"id": "A"}, {"id": "B"}],
                "tasks": [{"id": "a", "job": "j", "tenant": "A", "submit": seed, "duration": 5, "demand": {"cpu": 1}}]}
    visited = []
    original = pmdrf.waiting_heads

    def counting(cycle, tenants):
        visited.append(1)
        return original(cycle, tenants)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pmdrf, "waiting_heads", counting)
        made = decisions(document)
    assert [(kind.value, node) for kind, _, _, node, _, _ in made] == [("place", "n000")]
    assert len(visited) == 2  # (what waits, read at the first node and again after its placement: nothing)


# ------------------------------------------------------------------ static (the same kind of change)

import fairstream.policies.static as static  # noqa: E402

SERVE_EVERY_TENANT = (static, "within_partition", lambda snapshot: None)  # (its shapes refused one by one)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(document=scenarios())
def test_static_leaving_out_tenants_whose_partition_takes_none_of_their_tasks_decides_the_same(document):
    assert decisions(document, "static") == decisions(document, "static", replaced=SERVE_EVERY_TENANT)


def test_a_tenant_over_its_partition_is_not_served_at_all():
    # 4 cpu, A and B equal: each partition 2 cpu. A runs 2 and waits with 3 more: none of its
    # tasks (1 cpu) fits what is left of its partition (0), so the pass leaves it out.
    document = {"resources": ["cpu"], "nodes": [{"id": "n1", "capacity": {"cpu": 4}}],
                "tenants": [{"id": "A"}, {"id": "B"}],
                "tasks": [{"id": "a", "job": "j", "tenant": "A", "submit": 0, "duration": 100, "demand": {"cpu": 1},
                           "count": 5},
                          {"id": "b", "job": "k", "tenant": "B", "submit": 1, "duration": 100, "demand": {"cpu": 1}}]}
    served: list = []
    original = static.within_partition

    def watching(snapshot):
        served.append((snapshot.time, original(snapshot)))
        return served[-1][1]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(static, "within_partition", watching)
        drive(document, "static", lambda engine: None)
    assert (1.0, ["B"]) in served
