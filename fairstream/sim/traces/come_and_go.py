"""Two tenants whose demand comes and goes: the LTRF paper's Table 1 at cluster scale.

Table 1 (ICS'14 section 3; TSC Table 1) has 100 resources and two users of equal share: A asks
little at first and B takes what A leaves, then both ask for more than their share. Memoryless
fair sharing lends A's unused share to B and never pays it back (totals 160 and 240 after four
steps); LTRF serves the user with less accumulated usage first and ends with 200 each
(``tests/policies/test_ltrf_table1.py``).

Here the same shape on a cluster: ``nodes`` nodes of 4 GB, memory only (as YARN 2.2 scheduled
it in both LTRF papers), every task 1 GB for ``task_seconds``.

- B from time 0: a job of as many tasks as the cluster holds, every ``task_seconds``, so B
  alone would keep the whole cluster busy;
- A is idle until ``a_arrives``, then submits the same;
- both stop submitting at ``contended_until``: from ``a_arrives`` until then both want the
  whole cluster (the backlog then drains).

Until ``contended_until`` the cluster serves C x ``contended_until`` GB-seconds (C: its
memory). Fair sharing gives B everything before A arrives and half after: A's part of the total
is (contended_until - a_arrives) / (2 contended_until), a third with the defaults. F-LTMM gives
A everything after it arrives until the two totals are equal and half after that: both end with
half, as in Table 1(b).
"""

from __future__ import annotations

from fairstream.core.model import ResourceSpace, TenantSpec
from fairstream.core.tenants import TenantTree
from fairstream.sim.scenario import NodeSpec, Scenario, TaskSpec

NODE_GB = 4.0


def come_and_go(nodes: int = 25, task_seconds: float = 10.0, a_arrives: float = 300.0,
                contended_until: float = 900.0) -> Scenario:
    """The workload above as a scenario (tenants ``A`` and ``B``, weight 1 each)."""
    capacity = int(nodes * NODE_GB)  # tasks the cluster holds at once
    tasks = []
    for tenant, start in (("B", 0.0), ("A", a_arrives)):
        wave, submit = 0, start
        while submit < contended_until:
            job = f"{tenant}-{wave}"
            # One request of the wave's tasks, ids <job>-<k>.
            tasks.append(TaskSpec(job, job, tenant, submit, task_seconds, {"mem": 1.0}, count=capacity))
            wave += 1
            submit = start + wave * task_seconds
    return Scenario(
        resources=ResourceSpace(("mem",)),
        tree=TenantTree.from_specs([TenantSpec("A"), TenantSpec("B")]),
        nodes=[NodeSpec(f"n{i:02d}", {"mem": NODE_GB}) for i in range(nodes)],
        tasks=sorted(tasks, key=lambda t: (t.submit, t.id)),
        name=f"come and go: B alone from 0 s, A and B from {a_arrives:g} s to {contended_until:g} s",
    )


__all__ = ["come_and_go"]
