"""Queue limits as operators write them (issue "Queue configuration", point 1): absolute
``max_resources`` per queue (YARN's ``maxResources``) and ``max_running`` jobs per queue (YARN's
``maxRunningApps``: the tasks of other jobs wait), under every policy, with the reason a waiting
task is given."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from fairstream.core.explain import WaitReason
from fairstream.core.model import ModelError
from fairstream.sim.scenario import parse_scenario
from fairstream.sim.simulator import Simulator

POLICIES = ["fair", "drf", "ltrf", "fifo", "tsf", "hltrf", "tetris", "perf", "qknobler", "cdrf", "pmdrf", "drfh", "static"]


def cluster(tenants: list[dict], tasks: list[dict]) -> dict:
    """One node of 16 cpu, 64 GB."""
    return {"resources": ["cpu", "mem"], "nodes": [{"id": "n", "capacity": {"cpu": 16, "mem": 64}}],
            "tenants": tenants, "tasks": tasks}


def job(name: str, tenant: str, count: int, cpu: float = 1, submit: float = 0) -> dict:
    return {"id": name, "job": name, "tenant": tenant, "submit": submit, "duration": 100,
            "demand": {"cpu": cpu, "mem": 1}, "count": count}


def at_start(document: dict, policy: str):
    """What each tenant and job holds after the first pass, and the explanation then."""
    params = {"resource": "cpu"} if policy in ("fair", "ltrf", "hltrf") else {}
    simulator = Simulator(parse_scenario(document), policy, params, explain_at=0)
    held = {}

    def watch(engine, result):
        if not held:
            held["tenants"] = Counter(t.tenant for t in engine.tasks.values() if t.state.value == "running")
            held["jobs"] = Counter(t.job for t in engine.tasks.values() if t.state.value == "running")

    simulator.on_step = watch
    simulator.run()
    return held, simulator.explanation


@pytest.mark.parametrize("policy", POLICIES)
def test_a_queue_with_max_resources_holds_no_more_than_its_cap_while_the_node_has_room(policy):
    # Queue G may hold at most 4 cpu; its leaf A asks for 12 tasks of 1 cpu, B for 4: A gets 4
    # (not the 12 of 16 it would otherwise get), B its 4, and 8 cpu stay idle.
    document = cluster([{"id": "G", "max_resources": {"cpu": 4}}, {"id": "A", "parent": "G"}, {"id": "B"}],
                       [job("a", "A", 12), job("b", "B", 4)])
    held, explanation = at_start(document, policy)
    assert held["tenants"] == {"A": 4, "B": 4}
    (entry,) = explanation.pending["A"]
    assert entry.reason is WaitReason.MAX_RESOURCES
    assert "G uses {'cpu': 4.0} and this task would take it to {'cpu': 5.0}, over its max_resources {'cpu': 4.0}" \
        == entry.message


@pytest.mark.parametrize("policy", POLICIES)
def test_a_queue_with_max_running_runs_that_many_jobs_and_the_others_wait(policy):
    # Queue G runs at most 2 jobs at once. A's three jobs of 3 tasks: the first two run whole
    # (6 cpu), the third waits though 10 cpu are idle.
    document = cluster([{"id": "G", "max_running": 2}, {"id": "A", "parent": "G"}],
                       [job("j1", "A", 3), job("j2", "A", 3, submit=0), job("j3", "A", 3, submit=0)])
    held, explanation = at_start(document, policy)
    assert held["jobs"] == {"j1": 3, "j2": 3}
    (entry,) = explanation.pending["A"]
    assert entry.id == "j3" and entry.reason is WaitReason.MAX_RUNNING
    assert "G runs 2 jobs, its max_running: job j3 waits" in entry.message


def test_a_queue_running_its_one_job_says_so_in_the_singular():
    # Queue G runs at most 1 job: A's j1 runs, j2 waits for it.
    document = cluster([{"id": "G", "max_running": 1}, {"id": "A", "parent": "G"}],
                       [job("j1", "A", 3), job("j2", "A", 3, submit=0)])
    _, explanation = at_start(document, "drf")
    (entry,) = explanation.pending["A"]
    assert entry.reason is WaitReason.MAX_RUNNING
    assert "G runs 1 job, its max_running: job j2 waits for it to end" in entry.message


def test_a_waiting_job_starts_when_a_running_one_ends():
    document = cluster([{"id": "A", "max_running": 1}],
                       [job("j1", "A", 2), {**job("j2", "A", 2), "duration": 50}])
    document["tasks"][0]["duration"] = 30
    result = Simulator(parse_scenario(document), "drf", {}).run()
    starts = {d.job: d.time for d in result.decisions if d.kind.value == "place"}
    assert starts == {"j1": 0.0, "j2": 30.0}  # j2 only once j1's tasks ended at t = 30


@pytest.mark.parametrize("tenants, message", [
    pytest.param([{"id": "A", "max_resources": {"gpu": 1}}], "tenants[A].max_resources.gpu: unknown resource",
                 id="a cap on a resource the cluster lacks"),
    pytest.param([{"id": "A", "max_running": 0}], "max_running: 0 is less than the minimum of 1", id="no jobs at all"),
])
def test_a_bad_limit_is_one_line_naming_it(tenants, message):
    with pytest.raises(ModelError, match=re.escape(message)):
        parse_scenario(cluster(tenants, [job("a", "A", 1)]))
