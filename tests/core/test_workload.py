"""The engine's workload (``fairstream/core/workload.py``): tasks and requests numbered in
arrival order, shapes interned, queues and the indexes over them kept as tasks come and go."""

import numpy as np
import pytest

from fairstream.core.model import NO_CONSTRAINTS, Constraints, TaskState, TaskSubmitted
from fairstream.core.workload import Workload


def submitted(workload: Workload, task: str, tenant: str = "A", count: int | None = None, cpu: float = 1.0,
              job: str = "j", constraints: Constraints = NO_CONSTRAINTS):
    demand = np.array([cpu, 2.0])
    event = TaskSubmitted(0.0, task, job, tenant, {"cpu": cpu, "mem": 2.0}, count=count)
    return workload.submit(event, demand, constraints, {"cpu": cpu, "mem": 2.0})


def test_a_request_takes_one_arrival_number_per_task_so_it_orders_as_its_tasks_would():
    workload = Workload(2, 60.0)
    first = submitted(workload, "t1")
    request = submitted(workload, "r", count=3)
    after = submitted(workload, "t2")
    # t1 is 1; the request's tasks r-0, r-1, r-2 are 2, 3, 4; t2 is 5.
    assert (first.seq, request.seq, after.seq) == (1, 2, 5)
    assert set(workload.tasks) == {"t1", "t2"} and set(workload.requests) == {"r"}
    assert workload.pending["A"].count == 5


@pytest.mark.parametrize("cpu, constraints, job, same", [
    pytest.param(1.0, NO_CONSTRAINTS, "j", True, id="the same demand and constraints are one shape"),
    pytest.param(2.0, NO_CONSTRAINTS, "j", False, id="another demand is another shape"),
    pytest.param(1.0, Constraints(labels=(("gpu", "yes"),)), "j", False, id="other constraints are another shape"),
    pytest.param(1.0, Constraints(max_per_node=1), "k", False,
                 id="with max_per_node the shape is the job's own, as where the job runs decides"),
])
def test_shapes_are_interned_by_demand_and_constraints(cpu, constraints, job, same):
    workload = Workload(2, 60.0)
    first = submitted(workload, "a", constraints=Constraints(max_per_node=1) if job == "k" else NO_CONSTRAINTS)
    second = submitted(workload, "b", cpu=cpu, constraints=constraints, job=job)
    assert (first.shape == second.shape) is same
    assert workload.shape_demands[second.shape].tolist() == [cpu, 2.0]


def test_the_shape_demands_grow_with_spare_rows():
    workload = Workload(2, 60.0)
    for k in range(17):
        submitted(workload, f"t{k}", cpu=float(k + 1))
    assert len(workload.shapes) == 17 and len(workload.shape_demands) == 32
    assert workload.shape_demands[16].tolist() == [17.0, 2.0]


def test_a_cancelled_task_of_a_request_leaves_it_and_the_last_one_retires_it():
    workload = Workload(2, 60.0)
    request = submitted(workload, "r", count=2)
    _, task, retired = workload.cancel_in_request("r-1", 5.0)
    assert (task.id, task.state, retired, request.count) == ("r-1", TaskState.DONE, False, 1)
    assert workload.in_request("r-1") is None and workload.in_request("r-0") == (request, 0)
    _, _, retired = workload.cancel_in_request("r-0", 6.0)
    assert retired and "r" not in workload.requests and not workload.pending["A"].count
    assert list(workload.finished_ids) == ["r-1", "r-0"]


def test_a_placement_takes_the_next_task_of_a_request_and_nothing_else():
    workload = Workload(2, 60.0)
    request = submitted(workload, "r", count=2)
    assert workload.take("r-1") is None, "not the request's next task"
    task, held = workload.take("r-0")
    assert (task.id, held) == ("r-0", request)
    task.state = TaskState.RUNNING
    assert workload.started(task, request) == ([task], False)
    assert workload.tasks["r-0"] is task and request.index == 1 and request.count == 1
    assert workload.take("r-0") is None, "running, not pending"


def test_finished_ids_are_kept_for_the_retention_then_forgotten_in_finish_order():
    workload = Workload(2, 60.0)
    for k, time in enumerate((1.0, 2.0, 3.0)):
        submitted(workload, f"t{k}")
        workload.finish(f"t{k}", time)
    workload.forget_finished(2.5)
    assert list(workload.finished_ids) == ["t2"] and not workload.tasks


def test_the_ids_finished_at_one_instant_share_one_time_object():
    # A day keeps a million finished ids an hour: one float object each was 50-70 MB more at the
    # scale-16 day (compiled, a float is boxed anew each time it is stored). Equal times, made
    # apart, as two completions' events carry them:
    workload = Workload(2, 60.0)
    for k in range(3):
        submitted(workload, f"t{k}")
    for k, time in enumerate((1.5, float("1.5"), 2.0)):
        workload.finish(f"t{k}", time)
    times = list(workload.finished_ids.values())
    assert times == [1.5, 1.5, 2.0] and times[0] is times[1] and times[1] is not times[2]


def test_the_indexes_made_on_first_use_follow_the_tasks_after():
    workload = Workload(2, 60.0)
    a = submitted(workload, "a", tenant="A")
    assert workload.holders() == {a.shape: {"A"}}
    b = submitted(workload, "b", tenant="B")
    assert workload.holders() == {a.shape: {"A", "B"}}, "a tenant that queues the shape joins its holders"
    assert list(workload.waiting()) == ["A", "B"]
    b.state, b.node = TaskState.RUNNING, "n1"
    workload.dequeue(b)
    assert workload.holders() == {a.shape: {"A"}} and list(workload.waiting()) == ["A"]
    assert workload.running_on({"n1": 0}) == {0: {"b": b}} and workload.job_rows({"n1": 0}) == {("B", "j"): {0: 1}}
    workload.running_changed(0, b, started=False)
    assert workload.running_on({"n1": 0}) == {0: {}} and workload.job_rows({"n1": 0}) == {}
