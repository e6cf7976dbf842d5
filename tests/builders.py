"""Small builders for engines, nodes, tasks and scenarios, so tests read like the spec."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from fairstream.core import native
from fairstream.core.engine import Engine
from fairstream.core.model import NodeHeartbeat, ResourceSpace, TaskCompleted, TaskSubmitted, TenantSpec
from fairstream.core.tenants import TenantTree
from fairstream.policies import get as get_policy
from fairstream.sim.scenario import parse_scenario
from fairstream.streams.config import WorkerConfig


@contextmanager
def compiled_path(on: bool) -> Iterator[None]:
    """The compiled module on (if built) or off for the block, as it was after
    (``native.set_enabled``)."""
    before = native.set_enabled(on)
    try:
        yield
    finally:
        native.set_enabled(before)


def worker_config(policy: str = "ltrf", **settings) -> WorkerConfig:
    """The worker's settings as a test without Kafka wants them: a batch's steps taken at once
    (no step window, no wait) and snapshots encoded in the process; ``settings`` override."""
    return WorkerConfig(policy=policy, **{"step_window": 0.0, "step_wait": 0.0, "background_snapshots": False, **settings})


def tree(*specs: str | TenantSpec) -> TenantTree:
    """``tree("A", "B")`` or ``tree(TenantSpec("G1"), TenantSpec("A", parent="G1"))``."""
    return TenantTree.from_specs([s if isinstance(s, TenantSpec) else TenantSpec(s) for s in specs])


def engine(tenants: TenantTree, policy: str, resources=("mem",), **params) -> Engine:
    return Engine(ResourceSpace(tuple(resources)), tenants, get_policy(policy), {k: str(v) for k, v in params.items()})


def node(name: str, time: float = 0.0, labels: dict | None = None, **capacity: float) -> NodeHeartbeat:
    return NodeHeartbeat(time, name, capacity, labels)


def submit(task: str, tenant: str, time: float = 0.0, job: str | None = None, constraints=None, **demand) -> TaskSubmitted:
    return TaskSubmitted(time, task, job or f"{tenant}-job", tenant, demand or {"mem": 1}, constraints)


@dataclass
class UnitTaskRun:
    """Drives an engine in unit time steps where every task lasts exactly one step, as in the
    papers' worked examples (each task: one resource unit, one time unit)."""

    engine: Engine
    running: list[str] = field(default_factory=list)
    counter: int = 0

    def step(self, time: float, new_demand: dict[str, int]) -> Counter:
        events = [TaskCompleted(time, task) for task in self.running]
        for tenant, count in new_demand.items():
            for _ in range(count):
                self.counter += 1
                events.append(submit(f"{tenant}{self.counter}", tenant, time, mem=1))
        result = self.engine.step(time, events)
        assert not result.rejected, result.rejected[:3]
        self.running = [d.task for d in result.decisions]
        return Counter(d.tenant for d in result.decisions)


def scenario(**document):
    document.setdefault("resources", ["cpu", "mem"])
    return parse_scenario(document)
