"""The engine's jobs (``fairstream/core/jobs.py``): how many tasks of each job run, each job's
accumulated usage in closed form for a leaf that orders its jobs, and when a job is forgotten."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from fairstream.core.jobs import Jobs, orders_jobs
from fairstream.core.model import TenantSpec

from builders import tree


def test_a_jobs_usage_is_its_tasks_demand_times_their_run_times_without_integrating():
    jobs = Jobs(1)
    jobs.started("A", "j1", np.array([2.0]), 0.0, orders_jobs=True)  # rate 2, offset 0
    jobs.started("A", "j1", np.array([1.0]), 4.0, orders_jobs=True)  # rate 3, offset -4
    jobs.stopped("A", "j1", np.array([2.0]), 6.0)  # rate 1, offset -4 + 12 = 8
    # At 10: 2 x 6 (the first task, 0-6) + 1 x 6 (the second, 4-10) = 18 = 1 x 10 + 8.
    assert jobs.usage["A"]["j1"].accumulated(10.0).tolist() == [18.0]
    assert jobs.running == {"A": {"j1": 1}}


def test_a_leaf_that_does_not_order_its_jobs_counts_them_but_keeps_no_usage():
    jobs = Jobs(1)
    jobs.started("A", "j1", np.array([2.0]), 0.0, orders_jobs=False)
    assert jobs.running == {"A": {"j1": 1}} and jobs.usage == {}
    jobs.stopped("A", "j1", np.array([2.0]), 1.0)
    assert jobs.running == {"A": {}} and jobs.maybe_idle == set()


@pytest.mark.parametrize("waiting, kept", [
    pytest.param({}, False, id="nothing of it runs or waits: forgotten at the end of the instant"),
    pytest.param({"A": SimpleNamespace(jobs={"j1": 1})}, True, id="its next tasks wait in the queue: kept"),
])
def test_a_job_whose_last_task_stopped_is_forgotten_only_if_nothing_of_it_waits(waiting, kept):
    jobs = Jobs(1)
    jobs.started("A", "j1", np.array([1.0]), 0.0, orders_jobs=True)
    jobs.stopped("A", "j1", np.array([1.0]), 5.0)
    assert jobs.maybe_idle == {("A", "j1")}
    jobs.forget_idle(waiting)
    assert ("j1" in jobs.usage.get("A", {})) is kept and jobs.maybe_idle == set()


def test_a_leaf_that_starts_ordering_its_jobs_starts_from_its_running_tasks():
    old = tree("A")
    new = tree(TenantSpec("A", ordering="drf"))
    assert not orders_jobs(old, "A") and orders_jobs(new, "A")
    running = [SimpleNamespace(tenant="A", job="j1", demand=np.array([2.0]), start=3.0)]
    jobs = Jobs(1)
    jobs.retrack(new, old, running)
    assert jobs.usage["A"]["j1"].accumulated(5.0).tolist() == [4.0]  # 2 x (5 - 3)
    jobs.retrack(old, new, running)  # and back: forgotten
    assert jobs.usage == {}
