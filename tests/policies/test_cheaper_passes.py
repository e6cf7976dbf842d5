"""Passes that skip work that cannot matter decide as before (issue 64): pmdrf weighs on a node
only the tenants whose next task could fit its room and stops once nothing waits (the plain
reading: every demanding tenant on every node with room); static leaves out the tenants whose
partition takes none of their tasks (the plain reading: each of their shapes tried and refused);
tetris finds the heads within its window in one walk of the queue (the plain reading: each head
ranked by counting what is ahead of it in every shape)."""

import heapq

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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


def decisions(document, policy: str = "pmdrf", replaced: tuple | None = None, params: dict | None = None):
    """The run's decisions under ``policy`` with ``params``, with ``replaced`` (module or
    class, name, stand-in) put in place for the run, if given."""
    made: list = []
    with pytest.MonkeyPatch.context() as patch:
        if replaced is not None:
            patch.setattr(*replaced)
        drive(document, policy, lambda engine: None, params=params, record=made)
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


# ------------------------------------------------------------------ tetris's window

import bisect  # noqa: E402
import dataclasses  # noqa: E402

from fairstream.core.model import TaskState  # noqa: E402
from fairstream.core.placement import Cycle  # noqa: E402
from fairstream.core.queues import QueueWalk  # noqa: E402
from tests import builders  # noqa: E402


def rank_in_queue(walk, tenant, task):
    """How many of the tenant's tasks not yet placed in the pass arrived before ``task``: for
    each of its shapes, the pending tasks from the pass's cursor up to ``task``'s arrival."""
    rank = 0
    for shape, group in walk.snapshot.pending[tenant].groups.items():
        offset, within = walk._cursor.get((tenant, shape), (0, 0))
        start = group.head + offset
        end = bisect.bisect_left(group.tasks, task.seq, lo=start, key=lambda t: t.seq)
        for entry in group.tasks[start:end]:
            if entry.state is TaskState.PENDING:
                rank += entry.count - (within if entry is group.tasks[start] else 0)
    return rank


def heads_ranked_one_by_one(walk, tenant, limit):
    """The window's heads as first written: each head ranked apart."""
    if walk.orders_jobs and (jobs := walk.job_queue(tenant)) is not None:
        return [task for task in walk.shape_heads(tenant) if jobs.rank(task) < limit]
    return [task for task in walk.shape_heads(tenant) if rank_in_queue(walk, tenant, task) < limit]


RANK_EACH_HEAD = (QueueWalk, "heads_within", heads_ranked_one_by_one)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(document=scenarios(), f=st.sampled_from([0.2, 0.5, 0.8]))
def test_tetris_finding_its_window_in_one_walk_decides_as_ranking_each_head(document, f):
    assert (decisions(document, "tetris", params={"f": f})
            == decisions(document, "tetris", replaced=RANK_EACH_HEAD, params={"f": f}))


def a_walk_over(*tasks: tuple):
    """A pass's queue walk over tenant A's pending tasks (id, mem[, count: a request]),
    submitted in that order to a cluster without nodes (so all wait)."""
    engine = builders.engine(builders.tree("A"), "tetris")
    engine.step(0.0, [dataclasses.replace(builders.submit(task, "A", 0.0, mem=mem), count=(more or [None])[0])
                      for task, mem, *more in tasks])
    return Cycle(engine.snapshot(), "tetris").queues


def ids(tasks) -> list[str]:
    return [task.id for task in tasks]


# a, b, b2, c, d arrive in that order; shapes mem 1: a, c; mem 2: b, b2; mem 3: d. Ranks (tasks
# ahead): a 0, b 1, b2 2, c 3, d 4. The heads, each its shape's first: a, b, d.
ARRIVALS = (("a", 1), ("b", 2), ("b2", 2), ("c", 1), ("d", 3))


@pytest.mark.parametrize("limit, expected", [
    (0, []), (1, ["a"]), (2, ["a", "b"]), (4, ["a", "b"]), (5, ["a", "b", "d"]), (99, ["a", "b", "d"]),
], ids=["an empty window has none", "a window of one holds the first", "b is ranked 1",
        "d, ranked 4, is not in a window of 4", "d is in a window of 5", "a wide window holds every head"])
def test_the_heads_within_a_window_are_those_with_fewer_tasks_ahead_than_its_size(limit, expected):
    assert ids(a_walk_over(*ARRIVALS).heads_within("A", limit)) == expected


def test_after_a_placement_the_next_of_its_shape_is_a_head_ranked_by_what_is_left_ahead():
    walk = a_walk_over(*ARRIVALS)
    first = walk.heads_within("A", 1)[0]
    walk.advance("A", first)  # a placed: c heads mem 1 with b and b2 ahead (rank 2), d rank 3
    assert ids(walk.heads_within("A", 3)) == ["b", "c"]
    assert ids(walk.heads_within("A", 4)) == ["b", "c", "d"]


def test_the_tasks_of_a_request_the_pass_took_part_of_are_no_longer_ahead():
    # r: a request of 3 (mem 1), then e (mem 2): e is ranked 3. The pass takes two of r's
    # tasks: r's third heads its shape at rank 0, and e is ranked 1.
    walk = a_walk_over(("r", 1, 3), ("e", 2))
    assert ids(walk.heads_within("A", 3)) == ["r"]
    request = walk.heads_within("A", 1)[0]
    walk.advance("A", request)
    walk.advance("A", request)
    assert ids(walk.heads_within("A", 1)) == ["r"]
    assert ids(walk.heads_within("A", 2)) == ["r", "e"]


def test_a_failed_shape_has_no_head_in_the_window_but_its_tasks_still_count_ahead():
    walk = a_walk_over(*ARRIVALS)
    b = walk.heads_within("A", 2)[1]
    walk.failed_shapes.add(b.shape)  # mem 2 fits no node in this pass
    assert ids(walk.heads_within("A", 4)) == ["a"]  # d is ranked 4 still: b and b2 are ahead of it
    assert ids(walk.heads_within("A", 5)) == ["a", "d"]


# ------------------------------------------------------------------ every shape's head, kept through the pass


def shape_heads_walked_each_time(walk, tenant, every_shape=False):
    """``QueueWalk.shape_heads`` as first written: every shape's cursor read again per call."""
    queue = walk.snapshot.pending.get(tenant)
    if queue is None:
        return []
    failed_here = walk.failed_for.get(tenant, ())
    if walk.orders_jobs and (jobs := walk.job_queue(tenant)) is not None:
        return jobs.shape_heads(() if every_shape else walk.failed_shapes, () if every_shape else failed_here)
    heads = []
    for shape, group in queue.groups.items():
        if not every_shape and (shape in walk.failed_shapes or shape in failed_here):
            continue
        task, _, _ = group.next_from(*walk._cursor.get((tenant, shape), (0, 0)))
        if task is not None:
            heads.append(task)
    return sorted(heads, key=lambda task: task.seq)


WALK_EACH_TIME = (QueueWalk, "shape_heads", shape_heads_walked_each_time)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(document=scenarios(), policy=st.sampled_from(["tetris", "pmdrf", "tsf", "cdrf", "drf"]))
def test_shape_heads_kept_through_the_pass_are_those_of_walking_every_shape_each_time(document, policy):
    # Every read of every pass, whatever the policy placed before it in the pass (drf: its
    # preemption and explanations read the heads too, when the scenario turns them on).
    kept = QueueWalk.shape_heads

    def compared(walk, tenant, every_shape=False):
        heads = kept(walk, tenant, every_shape)
        assert ids(heads) == ids(shape_heads_walked_each_time(walk, tenant, every_shape))
        return heads

    assert decisions(document, policy, replaced=(QueueWalk, "shape_heads", compared)) == decisions(
        document, policy, replaced=WALK_EACH_TIME)


def test_a_placed_entry_gives_its_shape_head_to_the_next_of_its_shape():
    walk = a_walk_over(*ARRIVALS)
    assert ids(walk.shape_heads("A")) == ["a", "b", "d"]
    walk.advance("A", walk.shape_heads("A")[0])  # a placed: c heads mem 1, after b
    assert ids(walk.shape_heads("A")) == ["b", "c", "d"]
    walk.advance("A", walk.shape_heads("A")[2])  # d placed: mem 3 has none left
    assert ids(walk.shape_heads("A")) == ["b", "c"]
    assert ids(walk.shape_heads("A")) == ids(shape_heads_walked_each_time(walk, "A"))


def test_a_candidate_whose_best_node_took_a_placement_is_scored_again_when_it_could_still_win():
    # perf, two nodes of 8 cpu (the cluster 16): a (tenant A, 1 cpu), then a request b of two
    # 2-cpu tasks (B). Scores are (demand / 16) x (idle / 16). First b-0 on n0 (2/16 x 8/16 =
    # 0.0625 beats a's 0.03125); n0 was both shapes' best node. Next A comes first (share 0):
    # a scores 0.03125 on n1; b's old 0.0625 could beat that, so b is scored again: 0.0625 on
    # n1, and b-1 goes there before a. (Taking b's old score for "cannot win" when it is above
    # the best so far would place a first.)
    document = {"resources": ["cpu"], "nodes": [{"id": "n0", "capacity": {"cpu": 8}}, {"id": "n1", "capacity": {"cpu": 8}}],
                "tenants": [{"id": "A"}, {"id": "B"}],
                "tasks": [{"id": "a", "job": "j", "tenant": "A", "submit": 0, "duration": 10, "demand": {"cpu": 1}},
                          {"id": "b", "job": "k", "tenant": "B", "submit": 0, "duration": 10, "demand": {"cpu": 2},
                           "count": 2}]}
    assert [(task, node) for _, _, task, node, _, _ in decisions(document, "perf")] == [
        ("b-0", "n0"), ("b-1", "n1"), ("a", "n0")]
