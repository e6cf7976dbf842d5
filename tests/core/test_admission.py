"""Admission (``fairstream/core/admission.py``): whether an event can be applied to an engine's
state, checked without changing it, each event as if those passed before it were applied."""

from __future__ import annotations

import pytest

from fairstream.core.admission import Admission
from fairstream.core.model import NodeHeartbeat, NodeLost, TaskCompleted, TenantsChanged, TenantSpec, split_task_id
from fairstream.state.engine_snapshot import encode_engine

from builders import engine, node, submit, tree


def running_cluster():
    """Tenant A with t1 running on n1 (mem 4), t2 finished; B a leaf with nothing."""
    e = engine(tree("A", "B"), "drf", resources=("mem",))
    e.step(0.0, [node("n1", mem=4), submit("t1", "A"), submit("t2", "A")])
    e.step(1.0, [TaskCompleted(1.0, "t2")])
    return e


@pytest.mark.parametrize("events, verdicts", [
    pytest.param([submit("t1", "A")], ["task 't1': duplicate submission"], id="a task already running is a duplicate"),
    pytest.param([submit("t2", "A")], ["task 't2': duplicate submission"], id="a task finished recently is a duplicate"),
    pytest.param([submit("t3", "A"), submit("t3", "B")], [None, "task 't3': duplicate submission"],
                 id="a task submitted earlier in the batch is a duplicate"),
    pytest.param([submit("t3", "A", mem=0)], ["demand: must ask for some resource (all zero)"], id="a demand of nothing"),
    pytest.param([TaskCompleted(2.0, "t9")], ["task 't9': completion of an unknown task"], id="a completion of an unknown task"),
    pytest.param([TaskCompleted(2.0, "t2")], ["task 't2': already completed"], id="a task completed twice"),
    pytest.param([submit("t3", "A"), TaskCompleted(2.0, "t3")], [None, None],
                 id="a completion of a task submitted earlier in the batch"),
    pytest.param([NodeLost(2.0, "n9")], ["node 'n9': unknown node"], id="an unknown node lost"),
    pytest.param([NodeHeartbeat(2.0, "n9", {"mem": 4}), NodeLost(2.0, "n9")], [None, None],
                 id="a node lost after its first heartbeat in the batch"),
    pytest.param([NodeHeartbeat(2.0, "n1", {"mem": 4}, weights={"mem": 0})], ["weights.mem: must be above 0"],
                 id="a resource weight of zero"),
    pytest.param([TenantsChanged(2.0, (TenantSpec("B"),))], ["tenants: 'A' has running or pending tasks and is not in the new tree"],
                 id="without auto tenants a tree that leaves out a tenant with running tasks"),
])
def test_each_event_is_checked_as_if_those_passed_before_it_were_applied(events, verdicts):
    e = running_cluster()
    e.auto_tenants = False
    before = encode_engine(e)
    admission = Admission(e)
    assert [admission.check(event) for event in events] == verdicts
    assert encode_engine(e) == before  # "what if" without mutation


def test_the_step_applies_what_admission_passed_and_rejects_what_it_did_not():
    events = [submit("t3", "A"), submit("t1", "A"), TaskCompleted(2.0, "t9"), TaskCompleted(2.0, "t3")]
    e = running_cluster()
    said = e.admissible(events)
    result = e.step(2.0, events)
    assert [why for why in said if why is not None] == [why for _, why in result.rejected]
    assert "t3" not in e.tasks and "t3" in e.finished_ids


@pytest.mark.parametrize("task, parsed", [
    pytest.param("j1-m-3", ("j1-m", 3), id="the request and index a task id has"),
    pytest.param("j1-m-03", None, id="an index written with a leading zero is another id"),
    pytest.param("j1", None, id="no dash: no request"),
    pytest.param("j1-٣", None, id="a digit that is not ASCII is not an index"),
])
def test_a_task_id_is_split_into_its_request_and_index_as_request_task_id_writes_it(task, parsed):
    assert split_task_id(task) == parsed
