"""When waiting tasks are expected to start (Slurm's ``squeue --start``): the engine itself run
forward on a copy, with every task ending at its run-time estimate and nothing new arriving.

Inputs: the engine (left unchanged) and the ids of the tasks whose start is wanted. Output:
for each of those the event time the copy first placed it, or nothing if it did not start
within the forecast: a running task without an estimate never ends in it (its room stays
taken), and the forecast stops after ``MAX_STEPS`` steps. The copy decides with the policy's
own pass, so its reservations, backfill, limits and preemptions are those the engine would
take; the forecast is wrong exactly where its two assumptions are (tasks end at their
estimates; no new work, node or configuration arrives).
"""

from __future__ import annotations

import copy
import heapq
from collections.abc import Iterable
from typing import TYPE_CHECKING, cast

from fairstream.core.model import DecisionKind, TaskCompleted, TaskState, event_time

if TYPE_CHECKING:
    from fairstream.core.engine import Engine

#: Steps of the copy (each an instant when tasks end) before the forecast gives up, and engines
#: holding more tasks than ``MAX_TASKS`` are not copied (the copy costs their size): for a run's
#: explanation, taken once. The worker explains every few seconds while it decides, so it looks
#: less far (``WORKER_STEPS``, ``WORKER_TASKS``: docs/visibility.md has the cost).
MAX_STEPS, MAX_TASKS = 2_000, 20_000
WORKER_STEPS, WORKER_TASKS = 100, 2_000


def has_estimates(engine: Engine) -> bool:
    """Whether any running or pending task has a run-time estimate (else every start is unknown)."""
    return any(task.estimate is not None for task in engine.tasks.values()) or any(
        request.estimate is not None for request in engine.requests.values())


def expected_starts(engine: Engine, wanted: Iterable[str], max_steps: int = MAX_STEPS,
                    max_tasks: int = MAX_TASKS) -> dict[str, float]:
    """For each task id of ``wanted`` (pending now) that starts within ``max_steps`` steps of
    the forecast, the event time it starts (module docstring). Empty if the engine holds more
    than ``max_tasks`` tasks or no task has an estimate."""
    wanted = set(wanted)
    if not wanted or engine.time is None or len(engine.tasks) > max_tasks or not has_estimates(engine):
        return {}
    future = copy.deepcopy(engine)
    now = cast(float, future.time)  # (the engine's: checked set above)
    ends: list[tuple[float, int, str, float]] = []  # (end, seq, task, its start): stale if it started again

    def expect_end(task) -> None:
        if task.estimate is not None:  # a task past its estimate ends now at the earliest
            heapq.heappush(ends, (max(event_time(task.start + task.estimate), now), task.seq, task.id, task.start))

    for task in future.tasks.values():
        if task.state is TaskState.RUNNING:
            expect_end(task)
    found: dict[str, float] = {}
    for _ in range(max_steps):
        due = [t for t in (ends[0][0] if ends else None, future.wake_at()) if t is not None]  # next end, next wake
        if not due or len(found) == len(wanted):
            break
        at = min(due)
        done = []
        while ends and ends[0][0] == at:
            _, _, task_id, start = heapq.heappop(ends)
            task = future.tasks.get(task_id)
            if task is not None and task.state is TaskState.RUNNING and task.start == start:  # not preempted since
                done.append(TaskCompleted(at, task_id))
        now = at
        result = future.step(at, done)
        for decision in result.decisions:
            if decision.kind is not DecisionKind.PLACE:
                continue
            for task_id in decision.task_ids:
                if task_id in wanted and task_id not in found:
                    found[task_id] = at
                expect_end(future.tasks[task_id])
    return found


__all__ = ["expected_starts", "has_estimates", "MAX_STEPS", "MAX_TASKS", "WORKER_STEPS", "WORKER_TASKS"]
