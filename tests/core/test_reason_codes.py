"""Every decision says why as a typed code (``ReasonCode``) beside its words: one worked case
per code, and every policy's codes are the ones docs/architecture.md's table gives it."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import jsonschema
import pytest

from fairstream.core.model import NodeLost, ReasonCode, TaskCompleted, TenantSpec
from fairstream.policies import REGISTRY
from fairstream.sim.scenario import load_scenario
from fairstream.sim.simulator import Simulator

from builders import engine, node, submit, tree

ROOT = Path(__file__).resolve().parents[2]


def codes(decisions) -> Counter:
    return Counter((d.tenant, d.code) for d in decisions)


def min_share_first():
    # C is guaranteed half of 8 units: its first 4 tasks are served in the below-min-share
    # class (min_share), the other 4 units go by DRF order (fair_order).
    e = engine(tree(TenantSpec("A"), TenantSpec("C", min_share=0.5)), "drf")
    e.step(0, [node("n1", mem=8)])
    return e.step(1, [submit(f"{u}{i}", u, 1) for u in "AC" for i in range(8)]).decisions


def starved_leaf():
    # H-LTRF's Fig. 2 workload with t_wait = 2: B (in G1, whose usage is high) waits behind
    # C and D; after 2 s of waiting its tasks are served as starved.
    groups = (TenantSpec("G1"), TenantSpec("G2"), TenantSpec("A", "G1"), TenantSpec("B", "G1"),
              TenantSpec("C", "G2"), TenantSpec("D", "G2"))
    e = engine(tree(*groups), "hltrf", t_wait=2, quantum=1, quantum_mode="fixed")
    e.step(0, [node("n", mem=12)])
    running, out, counter = [], [], 0
    for t in range(40):
        demand = {"A": 200, "B": 10, "C": 50, "D": 60} if t == 0 else {"A": 20, "B": 60, "C": 40, "D": 80} if t == 27 else {}
        events = [TaskCompleted(t, task) for task in running]
        for tenant, count in demand.items():
            for _ in range(count):
                counter += 1
                events.append(submit(f"{tenant}{counter}", tenant, t))
        decisions = e.step(t, events).decisions
        running = [d.task for d in decisions]
        out += decisions
    return out


def fifo_order():
    e = engine(tree("A", "B"), "fifo")
    return e.step(0, [node("n1", mem=2), submit("a", "A"), submit("b", "B")]).decisions


def static_partition():
    e = engine(tree("A", "B"), "static")
    return e.step(0, [node("n1", mem=4), submit("a", "A")]).decisions


def tetris_packing():
    e = engine(tree("A", "B"), "tetris", ("cpu", "mem"))
    return e.step(0, [node("n1", cpu=4, mem=4), submit("a", "A", cpu=1, mem=1), submit("b", "B", cpu=2, mem=1)]).decisions


def node_lost():
    e = engine(tree("A"), "drf")
    e.step(0, [node("n1", mem=2), submit("a", "A")])
    return e.step(1, [NodeLost(1, "n1")]).decisions


def unschedulable():
    e = engine(tree("A"), "drf", ("cpu", "mem"))
    return e.step(0, [node("n1", cpu=2, mem=2), submit("big", "A", cpu=4, mem=1),
                      submit("gpu", "A", constraints={"labels": {"gpu": "yes"}}, cpu=1, mem=1)]).decisions


@pytest.mark.parametrize("run, expected", [
    pytest.param(min_share_first, {("C", ReasonCode.MIN_SHARE): 4, ("A", ReasonCode.FAIR_ORDER): 4},
                 id="a tenant below its min share is placed for min_share, then the rest by fair_order"),
    pytest.param(fifo_order, {("A", ReasonCode.ARRIVAL_ORDER): 1, ("B", ReasonCode.ARRIVAL_ORDER): 1},
                 id="fifo places by arrival_order"),
    pytest.param(static_partition, {("A", ReasonCode.PARTITION): 1}, id="static places what fits its partition"),
    pytest.param(tetris_packing, {("A", ReasonCode.PACKING): 1, ("B", ReasonCode.PACKING): 1},
                 id="tetris places by packing"),
    pytest.param(node_lost, {("A", ReasonCode.NODE_LOST): 1}, id="a task on a lost node is requeued for node_lost"),
    pytest.param(unschedulable, {("A", ReasonCode.TOO_LARGE): 1, ("A", ReasonCode.NO_MATCHING_NODE): 1},
                 id="unschedulable says too_large or no_matching_node"),
])
def test_each_decision_carries_the_code_of_the_rule_that_took_it(run, expected):
    assert codes(run()) == Counter(expected)


def test_an_hltrf_leaf_served_after_waiting_t_wait_is_placed_as_starved():
    decisions = starved_leaf()
    starved = {d.tenant for d in decisions if d.code is ReasonCode.STARVED}
    assert starved and all(d.reason.startswith("hltrf: starved leaf waited") for d in decisions if d.code is ReasonCode.STARVED)
    assert {d.code for d in decisions} == {ReasonCode.FAIR_ORDER, ReasonCode.STARVED}


def documented_codes() -> dict[str, set[tuple[str, str]]]:
    """policy -> {(kind, code)} from the table under "Reason codes" in docs/architecture.md."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    table = text.split("### Reason codes", 1)[1]
    out: dict[str, set[tuple[str, str]]] = {}
    for kind, code, who in re.findall(r"^\| (\w+) \| `(\w+)` \| [^|]+ \| ([^|]+) \|$", table, re.M):
        for policy in re.findall(r"[a-z]+", re.sub(r"\([^)]*\)", "", who)):
            out.setdefault(policy, set()).add((kind, code))
    return out


def test_the_documented_table_names_every_code():
    documented = {code for pairs in documented_codes().values() for _, code in pairs}
    assert documented == {code.value for code in ReasonCode}


@pytest.mark.parametrize("policy", sorted(REGISTRY))
def test_every_policy_takes_only_the_codes_the_docs_give_it(policy):
    # The two-tenants example (one resource pool, two tenants, a late arrival).
    scenario = load_scenario(ROOT / "examples" / "two-tenants.json")
    decisions = Simulator(scenario, policy, {}).run().decisions
    table = documented_codes()
    allowed = table.get("engine", set()) | table.get(policy, set())
    if policy == "flex":  # flex keeps the code of the candidate it delegates to
        allowed |= table["fifo"] | table["fair"] | table["drf"] | table["perf"]
    seen = {(d.kind.value, d.code.value) for d in decisions}
    assert seen and seen <= allowed
    schema = json.loads((ROOT / "fairstream" / "schemas" / "decision.schema.json").read_text())
    for d in decisions:  # as the worker publishes them
        jsonschema.validate({**d.to_json(), "cluster": "c1"}, schema)
