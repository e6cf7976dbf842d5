"""The engine's node registry (``fairstream/core/nodes.py``): rows kept for good, arrays that
grow by doubling, heartbeats that say what changed, a lost node marked dead."""

import copy

import numpy as np
import pytest

from fairstream.core.model import Node, NodeLost
from fairstream.core.nodes import Nodes

from builders import engine, node, submit, tree


def joined(*specs) -> Nodes:
    registry = Nodes(2)
    for name, cpu, mem in specs:
        registry.join(Node(name, np.array([cpu, mem], dtype=float), {"zone": "a"}))
    return registry


def test_a_node_keeps_its_row_and_the_arrays_grow_with_spare_rows():
    registry = joined(*((f"n{k}", k, 2 * k) for k in range(17)))  # one past the first 16 spare rows
    assert registry.row["n16"] == 16 and len(registry) == 17
    assert registry.capacity.shape == (17, 2) and registry.storage_capacity.shape == (32, 2)
    assert registry.capacity[16].tolist() == [16.0, 32.0] and registry.alive.all()
    assert registry.view()[0] == tuple(f"n{k}" for k in range(17))


@pytest.mark.parametrize("capacity, labels, alive_before, said", [
    pytest.param([4, 8], None, True, (False, False), id="the same heartbeat again changes nothing"),
    pytest.param([2, 8], None, True, (True, False), id="a new capacity is a change"),
    pytest.param([4, 8], {"zone": "b"}, True, (False, True), id="new labels are a relabelling only"),
    pytest.param([4, 8], {"zone": "a"}, True, (False, False), id="the same labels again are no relabelling"),
    pytest.param([4, 8], None, False, (True, False), id="a heartbeat of a lost node brings it back"),
])
def test_a_heartbeat_says_what_changed(capacity, labels, alive_before, said):
    registry = joined(("n0", 4, 8))
    if not alive_before:
        registry.lose(0)
    registry.view()  # made before the heartbeat: a relabelling must make it again
    assert registry.update(0, np.array(capacity, dtype=float), labels, 5.0) == said
    assert registry.capacity[0].tolist() == capacity and registry.alive[0] and registry.nodes[0].last_heartbeat == 5.0
    assert dict(registry.view()[1][0]) == (labels or {"zone": "a"})


def test_a_lost_node_is_dead_once_and_keeps_its_row():
    registry = joined(("n0", 4, 8), ("n1", 4, 8))
    assert registry.lose(1) and not registry.lose(1)
    assert registry.alive.tolist() == [True, False] and registry.row["n1"] == 1


@pytest.mark.parametrize("steps, lost", [
    pytest.param([], 0, id="no node lost"),
    pytest.param([("lose", 1)], 1, id="a lost node counts once"),
    pytest.param([("lose", 1), ("lose", 1)], 1, id="losing it again changes nothing"),
    pytest.param([("lose", 1), ("beat", 1)], 0, id="its heartbeat brings it back"),
    pytest.param([("lose", 0), ("lose", 2), ("beat", 0), ("beat", 1)], 1, id="a live node's heartbeat brings nothing back"),
])
def test_the_registry_counts_its_lost_nodes(steps, lost):
    # The snapshot marks lost nodes' free room -1 only when there are some (``Nodes.lost``).
    registry = joined(("n0", 4, 8), ("n1", 4, 8), ("n2", 4, 8))
    for what, row in steps:
        registry.lose(row) if what == "lose" else registry.update(row, np.array([4.0, 8.0]), None, 1.0)
    assert registry.lost == lost == int((~registry.alive).sum())


def test_the_view_is_read_only_and_a_copy_makes_its_own():
    registry = joined(("n0", 4, 8))
    labels = registry.view()[1][0]
    with pytest.raises(TypeError):
        labels["zone"] = "b"  # type: ignore[index]
    twin = copy.deepcopy(registry)
    twin.update(0, np.array([4.0, 8.0]), {"zone": "b"}, 1.0)
    assert dict(twin.view()[1][0]) == {"zone": "b"} and dict(registry.view()[1][0]) == {"zone": "a"}


def test_the_engine_frees_a_lost_nodes_room_as_it_requeues_what_ran_there():
    e = engine(tree("A"), "drf")
    e.step(0, [node("n1", mem=4)])
    e.step(1, [submit("t1", "A", 1, mem=3), submit("t2", "A", 1, mem=1)])
    assert e.used[0].sum() == 4.0
    lost = e.step(2, [NodeLost(2, "n1")])
    assert sorted(d.task for d in lost.decisions) == ["t1", "t2"]
    assert e.used[0].tolist() == [0.0] * len(e.resources) and not e.alive[0]
    assert e.tasks["t1"].node is None and e.tasks["t2"].node is None
