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

Read lazily (``GoogleWorkload``): a task's run time comes from events later in the file, so a
first pass joins them keeping only the tasks that have not ended yet as objects, and per task
of the part three numbers (its SUBMIT line, run time, user); tasks are built from a second
pass as the simulation reaches them.
"""

from __future__ import annotations

import csv
import gzip
from array import array
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from fairstream.core.model import ModelError, ResourceSpace, TenantSpec
from fairstream.core.tenants import TenantTree
from fairstream.sim.scenario import Scenario, TaskSpec, uniform_nodes
from fairstream.sim.traces.files import open_text

SUBMIT, SCHEDULE = 0, 1
TERMINAL = {2, 3, 4, 5, 6}
USER_CHARS = 10


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
    """The part as a scenario whose tasks are read as the simulation reaches them; a bad line is
    one ``ModelError`` naming it, at once."""
    workload = GoogleWorkload(str(path), limit=limit, users=users, disk=disk)
    tree = TenantTree.from_specs([TenantSpec(u) for u in workload.users])
    capacity = {"cpu": node_cpu, "mem": node_mem, **({"disk": node_disk} if disk else {})}
    return Scenario(
        ResourceSpace(tuple(capacity)), tree, uniform_nodes(nodes, capacity), workload,
        name=f"google:{Path(path).name} ({len(workload)} tasks, {workload.left_out} left out)",
    )


def _rows(path: str) -> Iterator[tuple[int, list[str]]]:
    """``(line number, columns)`` of a task_events part, checked as read."""
    with open_text(path, newline="") as handle:
        try:
            for number, row in enumerate(csv.reader(handle), 1):
                if len(row) != 13:
                    raise ModelError(f"{path}:{number}: expected 13 columns of task_events, got {len(row)}")
                yield number, row
        except (OSError, EOFError, gzip.BadGzipFile, UnicodeDecodeError) as exc:
            raise ModelError(f"{path}: cannot read ({exc})") from None


def _time_and_event(path: str, number: int, row: list[str]) -> tuple[float, int]:
    try:
        return int(row[0]) / 1e6, int(row[5])
    except ValueError:
        raise ModelError(f"{path}:{number}: timestamp and event type must be integers") from None


def _task_key(path: str, number: int, row: list[str]) -> int:
    """(job id, task index) as one integer: a set of them costs a few dozen bytes a task."""
    try:
        job, index = int(row[2]), int(row[3])
    except ValueError:
        raise ModelError(f"{path}:{number}: job id and task index must be integers") from None
    if not (0 <= job < 1 << 40 and 0 <= index < 1 << 23):
        raise ModelError(f"{path}:{number}: job id or task index out of range")
    return job << 23 | index


class GoogleWorkload:
    """The kept tasks of a task_events part, in submit order, built as they are iterated
    (iterable again: each pass reads the file again). ``users`` are the kept users in order of
    first submission; ``len()`` is the number of kept tasks, ``left_out`` the submitted tasks
    that never ran, never ended inside the part, or asked for nothing."""

    def __init__(self, path: str, limit: int | None = None, users: int | None = None, disk: bool = False) -> None:
        self.path, self.disk = path, disk
        lines, durations, user_codes = array("q"), array("d"), array("l")
        user_names: dict[str, int] = {}
        seen: set[int] = set()  # tasks submitted so far (a later SUBMIT is a resubmission)
        running: dict[int, tuple[int, float | None]] = {}  # not ended: (ordinal, start)
        origin = None
        for number, row in _rows(path):
            time_s, event = _time_and_event(path, number, row)
            key = _task_key(path, number, row)
            if event == SUBMIT and key not in seen:
                if not row[9] or not row[10]:
                    continue  # missing requests (missing-info 2 rows)
                seen.add(key)
                origin = time_s if origin is None else min(origin, time_s)
                asked = float(row[9]) + float(row[10]) > 0
                running[key] = (len(lines) if asked else -1, None)
                if asked:
                    lines.append(number)
                    durations.append(np.nan)
                    user_codes.append(user_names.setdefault(row[6][:USER_CHARS], len(user_names)))
            elif event == SCHEDULE and key in running and running[key][1] is None:
                running[key] = (running[key][0], time_s)
            elif event in TERMINAL and key in running and running[key][1] is not None:
                ordinal, start = running.pop(key)
                if ordinal >= 0 and start is not None:  # (checked above)
                    durations[ordinal] = max(time_s - start, 0.0)
        self.origin = origin or 0.0
        ended = ~np.isnan(np.frombuffer(durations, dtype=np.float64)) if durations else np.zeros(0, bool)
        codes = np.frombuffer(user_codes, dtype=np.int_) if user_codes else np.zeros(0, np.int_)
        kept = np.flatnonzero(ended)
        names = list(user_names)
        kept_users: dict[int, None] = {}
        if users is not None:
            for code in codes[kept]:  # first N users by first kept task
                if len(kept_users) >= users:
                    break
                kept_users.setdefault(int(code), None)
            kept = kept[np.isin(codes[kept], list(kept_users))]
        if limit is not None:
            kept = kept[:limit]
        first: dict[int, None] = {}
        for code in codes[kept]:
            first.setdefault(int(code), None)
        self.users = [names[code] for code in first]
        self.left_out = len(seen) - int(ended.sum())
        self._lines = np.frombuffer(lines, dtype=np.int64)[kept].copy() if lines else np.zeros(0, np.int64)
        self._durations = np.frombuffer(durations, dtype=np.float64)[kept].copy() if durations else np.zeros(0)

    def __len__(self) -> int:
        return len(self._lines)

    def __iter__(self) -> Iterator[TaskSpec]:
        lines, durations, k = self._lines, self._durations, 0
        if not len(lines):
            return
        for number, row in _rows(self.path):
            if number != lines[k]:
                continue
            time_s = int(row[0]) / 1e6
            demand = {"cpu": float(row[9]), "mem": float(row[10])}
            if self.disk:
                demand["disk"] = float(row[11] or 0.0)
            yield TaskSpec(id=f"{row[2]}-{row[3]}", job=row[2], tenant=row[6][:USER_CHARS],
                           submit=round(time_s - self.origin, 6), duration=float(durations[k]), demand=demand)
            k += 1
            if k == len(lines):
                return
