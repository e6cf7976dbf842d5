"""Google cluster-usage trace 2011 (clusterdata-2011-2) ``task_events`` parts as tasks.

Columns (no header): timestamp (us), missing info, job id, task index, machine id, event type
(0 SUBMIT, 1 SCHEDULE, 2 EVICT, 3 FAIL, 4 FINISH, 5 KILL, 6 LOST, 7-8 UPDATE), user,
scheduling class, priority, CPU request, memory request, disk request, different-machine flag.

A task is (job id, task index). Its first SUBMIT gives the submit time and requests; its run
time is from its first SCHEDULE to the first EVICT/FAIL/FINISH/KILL/LOST after it. Tasks that
never ran, never ended inside the part, or lack requests are left out (and counted in the
scenario name). Times become seconds from the earliest submission; the "before the trace"
snapshot rows (time 0) submit at 0. Requests are normalised by the largest machine, so nodes
are in the same units.

The sample has no ``machine_events``: the cluster is ``nodes`` machines of
<``node_cpu`` = 0.5, ``node_mem`` = 0.5>, the most common machine type of that cell, unless a
scenario file supplies one. Tenants are users (the first 10 characters of the hashed name),
flat, weight 1; ``users`` keeps the first N users by first submission (QKnobler's setup
takes 100). ``disk`` adds the disk request as a third resource (QKnobler's simulation uses CPU,
memory and disk; nodes then get ``node_disk``).
"""

from __future__ import annotations

import csv
import gzip
from pathlib import Path

from fairstream.model import ModelError, ResourceSpace, TenantSpec
from fairstream.scenario import Scenario, TaskSpec
from fairstream.tenants import TenantTree
from fairstream.traces import uniform_nodes

SUBMIT, SCHEDULE = 0, 1
TERMINAL = {2, 3, 4, 5, 6}


def load_google(
    path: str,
    limit: int | None = None,
    users: int | None = None,
    nodes: int = 1000,
    node_cpu: float = 0.5,
    node_mem: float = 0.5,
    disk: bool = False,
    node_disk: float = 0.5,
) -> Scenario:
    opener = gzip.open if str(path).endswith(".gz") else open
    submitted: dict[tuple[str, str], dict] = {}
    order: list[tuple[str, str]] = []
    try:
        handle = opener(path, "rt", newline="")
    except OSError as exc:
        raise ModelError(f"{path}: cannot read ({exc.strerror})") from None
    with handle:
        try:
            for number, row in enumerate(csv.reader(handle), 1):
                if len(row) != 13:
                    raise ModelError(f"{path}:{number}: expected 13 columns of task_events, got {len(row)}")
                try:
                    time_s, event = int(row[0]) / 1e6, int(row[5])
                except ValueError:
                    raise ModelError(f"{path}:{number}: timestamp and event type must be integers") from None
                key = (row[2], row[3])
                if event == SUBMIT and key not in submitted:
                    if not row[9] or not row[10]:
                        continue  # missing requests (missing-info 2 rows)
                    submitted[key] = {"submit": time_s, "user": row[6][:10], "cpu": float(row[9]), "mem": float(row[10]),
                                      "disk": float(row[11] or 0.0)}
                    order.append(key)
                elif event == SCHEDULE and key in submitted and "start" not in submitted[key]:
                    submitted[key]["start"] = time_s
                elif event in TERMINAL and key in submitted and "start" in submitted[key] and "end" not in submitted[key]:
                    submitted[key]["end"] = time_s
        except (OSError, EOFError, gzip.BadGzipFile) as exc:
            raise ModelError(f"{path}: cannot read ({exc})") from None
    kept_users: dict[str, None] = {}
    tasks: list[TaskSpec] = []
    dropped = 0
    origin = min((submitted[k]["submit"] for k in order), default=0.0)
    for key in order:
        rec = submitted[key]
        if "end" not in rec or rec["cpu"] + rec["mem"] <= 0:
            dropped += 1
            continue
        if rec["user"] not in kept_users:
            if users is not None and len(kept_users) >= users:
                continue
            kept_users[rec["user"]] = None
        tasks.append(TaskSpec(
            id=f"{key[0]}-{key[1]}", job=key[0], tenant=rec["user"], submit=round(rec["submit"] - origin, 6),
            duration=max(rec["end"] - rec["start"], 0.0),
            demand={"cpu": rec["cpu"], "mem": rec["mem"], **({"disk": rec["disk"]} if disk else {})},
        ))
        if limit is not None and len(tasks) >= limit:
            break
    tree = TenantTree.from_specs([TenantSpec(u) for u in kept_users])
    capacity = {"cpu": node_cpu, "mem": node_mem, **({"disk": node_disk} if disk else {})}
    return Scenario(
        ResourceSpace(tuple(capacity)), tree, uniform_nodes(nodes, capacity), tasks,
        name=f"google:{Path(path).name} ({len(tasks)} tasks, {dropped} left out)",
    )
