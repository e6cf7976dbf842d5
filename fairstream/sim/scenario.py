"""Scenario files: a cluster, a tenant tree and a workload (``schemas/scenario.schema.json``).

``load_scenario(path)`` validates against the JSON Schema and then the cross-references the
schema cannot express (unknown tenants, duplicate ids, resource names). Every problem is a
``ModelError`` whose message is one line naming the field, e.g.
``tasks[3].demand.gpu: unknown resource (known: cpu, mem)``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import lru_cache
from importlib import resources as package_files
from pathlib import Path
from typing import Any

import jsonschema

from fairstream.core.admission import gang_problem
from fairstream.core.model import (
    DEFAULT_RESOURCES,
    MAX_COUNT,
    ROOT,
    Constraints,
    ModelError,
    ResourceSpace,
    TenantSpec,
    request_task_id,
)
from fairstream.core.tenants import TenantTree, specs_from_json
from fairstream.wire import jsoncodec


@dataclass
class NodeSpec:
    id: str
    capacity: dict[str, float]
    labels: dict[str, str] = field(default_factory=dict)
    weights: dict[str, float] = field(default_factory=dict)  # resource weights (LTRF formula 9)


def uniform_nodes(count: int, capacity: dict[str, float], prefix: str = "n") -> list[NodeSpec]:
    """``count`` nodes of ``capacity`` named ``prefix`` and a number of one width (``n00``-``n11``)."""
    width = len(str(max(count - 1, 0)))
    return [NodeSpec(f"{prefix}{k:0{width}d}", dict(capacity)) for k in range(count)]


@dataclass
class TaskSpec:
    """A task of the workload as the simulator releases it (``duration`` stays with the
    simulator); with ``count``, a request of that many identical tasks ``<id>-0``,
    ``<id>-1``, ... submitted as one event."""

    id: str
    job: str
    tenant: str
    submit: float
    duration: float
    demand: dict[str, float]
    constraints: dict | None = None
    stage: int = 0
    after_job: str | None = None
    delay: float = 0.0
    count: int | None = None
    estimate: float | None = None  # the run time its submitter expects (backfill reads it), not ``duration``
    gang: int | None = None  # at least so many of its ``count`` tasks start together (``"gang": {"min": n}``)

    @property
    def tasks(self) -> int:
        return 1 if self.count is None else self.count

    def task_ids(self) -> list[str]:
        return [self.id] if self.count is None else [request_task_id(self.id, k) for k in range(self.count)]


def spec_of_task(specs: Mapping[str, TaskSpec], task_id: str) -> TaskSpec | None:
    """The spec ``task_id`` belongs to in ``specs`` (by spec id): a single task's own, or the
    request whose task ``<id>-<k>`` it is; None if neither."""
    spec = specs.get(task_id)
    if spec is None:
        spec = specs.get(task_id.rpartition("-")[0])
        spec = spec if spec is not None and spec.count is not None else None
    return spec


@dataclass
class NodeEventSpec:
    """An event during the run: a node's (``node_lost``, ``node_heartbeat``) or a new tenant
    tree (``tenants``: the whole tree from then on, as the worker's ``tenants.config``)."""

    time: float
    type: str
    node: str = ""
    capacity: dict[str, float] | None = None
    labels: dict[str, str] | None = None
    tenants: list[dict] | None = None


@dataclass
class Scenario:
    resources: ResourceSpace
    tree: TenantTree
    nodes: list[NodeSpec]
    tasks: Iterable[TaskSpec]  # a list, or a workload read as a run reaches it (a trace loader's: ``Simulator.run``)
    events: list[NodeEventSpec] = field(default_factory=list)
    name: str = "scenario"

    @property
    def task_count(self) -> int:
        """How many tasks the workload holds (a request counts its tasks)."""
        return sum(spec.tasks for spec in self.tasks)

    def expanded_tasks(self) -> list[TaskSpec]:
        """The workload one task per spec: each request as its tasks, ``<id>-<k>``."""
        out = []
        for spec in self.tasks:
            if spec.count is None:
                out.append(spec)
            else:
                out.extend(replace(spec, id=name, count=None) for name in spec.task_ids())
        return out

    def with_exact_estimates(self) -> Scenario:
        """This scenario with every task that has no ``estimate`` given its true duration as one
        (``--estimates exact``: backfill as it would be with perfect run-time estimates)."""
        def exact(spec: TaskSpec) -> TaskSpec:
            return spec if spec.estimate is not None else replace(spec, estimate=spec.duration)

        tasks = [exact(spec) for spec in self.tasks] if isinstance(self.tasks, list) else map(exact, self.tasks)
        return replace(self, tasks=tasks)

    def one_by_one(self) -> Scenario:
        """This scenario with every request submitted as its tasks one by one."""
        return replace(self, tasks=self.expanded_tasks())

    def to_json(self) -> dict:
        """The scenario as a document that ``load_scenario`` accepts."""
        return {
            "version": 1,
            "name": self.name,
            "resources": list(self.resources.names),
            "nodes": [{"id": n.id, "capacity": n.capacity, **({"labels": n.labels} if n.labels else {}),
                       **({"weights": n.weights} if n.weights else {})} for n in self.nodes],
            "tenants": [
                {"id": s.id, **({"parent": s.parent} if s.parent != ROOT else {}), "weight": s.weight,
                 **({"min_share": s.min_share} if s.min_share else {}),
                 **({"max_share": s.max_share} if s.max_share < 1 else {})}
                for s in self.tree.specs.values()
            ],
            "tasks": [_task_json(t) for t in self.tasks],
            **({"events": [_event_json(e) for e in self.events]} if self.events else {}),
        }


def _task_json(t: TaskSpec) -> dict:
    out: dict[str, Any] = {"id": t.id, "job": t.job, "tenant": t.tenant, "submit": t.submit,
                           "duration": t.duration, "demand": t.demand}
    if t.constraints:
        out["constraints"] = t.constraints
    if t.estimate is not None:
        out["estimate"] = t.estimate
    if t.stage:
        out["stage"] = t.stage
    if t.after_job is not None:
        out["after_job"] = t.after_job
        out["delay"] = t.delay
    if t.count is not None:
        out["count"] = t.count
    if t.gang is not None:
        out["gang"] = {"min": t.gang}
    return out


def _event_json(e: NodeEventSpec) -> dict:
    if e.type == "tenants":
        return {"time": e.time, "type": e.type, "tenants": e.tenants}
    out: dict[str, Any] = {"time": e.time, "type": e.type, "node": e.node}
    if e.capacity is not None:
        out["capacity"] = e.capacity
    if e.labels is not None:
        out["labels"] = e.labels
    return out


@lru_cache(maxsize=1)
def scenario_schema() -> dict:
    text = package_files.files("fairstream").joinpath("schemas/scenario.schema.json").read_text()
    return json.loads(text)


def _where(path) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario file; raises ``ModelError`` with a one-line message."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ModelError(f"{path}: cannot read ({exc.strerror})") from None
    try:
        document = jsoncodec.loads(data)  # (the worker's decoder: a third of the standard library's time)
    except json.JSONDecodeError as exc:  # (its errors are the standard library's, line and column too)
        raise ModelError(f"{path}: not JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    return parse_scenario(document)


def load_tenant_tree(path: str | Path) -> TenantTree:
    """The tenant tree of a tenants file (the worker's, ``configure``'s and ``simulate``'s
    ``--tenants``): a scenario-style ``{"tenants": [...]}``, nodes and tasks optional."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ModelError(f"--tenants {path}: cannot read ({exc})") from None
    if not isinstance(doc, dict):
        raise ModelError(f"--tenants {path}: needs a \"tenants\" list")
    doc.setdefault("nodes", [{"id": "_", "capacity": {"cpu": 1}}])
    doc.setdefault("tasks", [])
    doc.setdefault("resources", ["cpu", "mem"])
    return parse_scenario(doc).tree


_PLAIN_TASK_KEYS = frozenset(("id", "job", "tenant", "submit", "duration", "demand", "count", "stage"))


def _number(value) -> bool:
    return value.__class__ in (int, float) and value >= 0 and value == value  # NaN is not >= 0 anyway


def _plain_task(task) -> bool:
    """A conservative fast check of a task without constraints or chaining: True only if the
    schema surely accepts it. Anything else is validated by the schema, for its message."""
    if task.__class__ is not dict or not task.keys() <= _PLAIN_TASK_KEYS:
        return False
    for key in ("id", "tenant"):
        value = task.get(key)
        if value.__class__ is not str or not value:
            return False
    job = task.get("job", "x")
    if job.__class__ is not str or not job or not _number(task.get("submit")) or not _number(task.get("duration")):
        return False
    demand = task.get("demand")
    if demand.__class__ is not dict or not demand or not all(_number(v) for v in demand.values()):
        return False
    for key, top in (("count", MAX_COUNT), ("stage", math.inf)):
        if key in task and not (task[key].__class__ is int and (key == "stage" or task[key] >= 1) and 0 <= task[key] <= top):
            return False
    return True


def _schema_errors(document: Any) -> frozenset[int] | None:
    """Validate ``document`` against the scenario schema; raise ``ModelError`` for the best
    error. The schema's error search walks the whole document even when it is valid (5.7 s of
    a 50,000-task file), so tasks that pass a conservative fast check are left out of it.
    Returns the indexes of the tasks that did not pass it (None: none did)."""
    if document.__class__ is dict and document.get("tasks").__class__ is list:
        tasks = document["tasks"]
        odd = [i for i, task in enumerate(tasks) if not _plain_task(task)]
        if len(odd) < len(tasks):
            shown = {**document, "tasks": [tasks[i] for i in odd]}
            validator = jsonschema.Draft202012Validator(scenario_schema())
            error = jsonschema.exceptions.best_match(validator.iter_errors(shown))
            if error is not None:
                path = list(error.absolute_path)
                if len(path) > 1 and path[0] == "tasks":
                    path[1] = odd[path[1]]  # the index in the whole document
                raise ModelError(f"{_where(path)}: {error.message}")
            return frozenset(odd)
    validator = jsonschema.Draft202012Validator(scenario_schema())
    error = jsonschema.exceptions.best_match(validator.iter_errors(document))
    if error is not None:
        raise ModelError(f"{_where(error.absolute_path)}: {error.message}")
    return None


def parse_scenario(document: Any) -> Scenario:
    odd = _schema_errors(document)

    resources = ResourceSpace(tuple(document.get("resources", DEFAULT_RESOURCES)))

    def check_vector(vector: dict, where: str) -> dict[str, float]:
        resources.vector(vector, where=where)  # names and values
        return {k: float(v) for k, v in vector.items()}

    nodes: list[NodeSpec] = []
    for i, raw in enumerate(document["nodes"]):
        capacity = check_vector(raw["capacity"], f"nodes[{i}].capacity")
        node_ids = [raw["id"]] if "count" not in raw else [f"{raw['id']}-{k}" for k in range(raw["count"])]
        weights = check_vector(raw["weights"], f"nodes[{i}].weights") if "weights" in raw else {}
        nodes.extend(NodeSpec(node_id, dict(capacity), dict(raw.get("labels", {})), dict(weights)) for node_id in node_ids)
    seen: set[str] = set()
    for node in nodes:
        if node.id in seen:
            raise ModelError(f"nodes: duplicate node id {node.id!r}")
        seen.add(node.id)

    task_tenants = [t["tenant"] for t in document["tasks"]]
    if "tenants" in document:
        specs = specs_from_json(document["tenants"])
    else:
        specs = [TenantSpec(id=name) for name in dict.fromkeys(task_tenants)]
    tree = TenantTree.from_specs(specs)
    for tenant_spec in specs:
        if tenant_spec.max_resources:
            check_vector(tenant_spec.max_resources, f"tenants[{tenant_spec.id}].max_resources")

    # A tenant a later ``tenants`` event adds is a tenant too (its tasks should come after it).
    later_leaves = set()
    for raw in document.get("events", []):
        if raw.get("type") == "tenants" and "tenants" in raw:
            ids_in = {t["id"] for t in raw["tenants"]}
            parents = {t.get("parent") for t in raw["tenants"]}
            later_leaves |= ids_in - parents
    tasks: list[TaskSpec] = []
    ids: set[str] = set()
    # A demand of a task that passed ``_plain_task`` (numbers only, no bools: equal items are
    # equal input) is parsed once per distinct demand; a job's tasks usually share theirs.
    demands: dict[tuple, dict[str, float]] = {}
    for i, raw in enumerate(document["tasks"]):
        if not tree.is_leaf(raw["tenant"]) and raw["tenant"] not in later_leaves:
            what = "is a queue with children" if raw["tenant"] in tree.specs else "unknown tenant"
            raise ModelError(f"tasks[{i}].tenant: {raw['tenant']!r} {what}")
        known = None if odd is None or i in odd else tuple(raw["demand"].items())
        demand = None if known is None else demands.get(known)
        if demand is None:
            demand = check_vector(raw["demand"], f"tasks[{i}].demand")
            if not any(demand.values()):
                raise ModelError(f"tasks[{i}].demand: must ask for some resource (all zero)")
            if known is not None:
                demands[known] = demand
        if raw.get("constraints"):  # (none, or empty: no constraints to check)
            Constraints.from_json(raw["constraints"], where=f"tasks[{i}].constraints")
        spec = TaskSpec(
            id=raw["id"], job=raw.get("job", raw["id"]), tenant=raw["tenant"], submit=float(raw["submit"]),
            duration=float(raw["duration"]), demand=dict(demand), constraints=raw.get("constraints"),
            stage=int(raw.get("stage", 0)), after_job=raw.get("after_job"), delay=float(raw.get("delay", 0.0)),
            count=raw.get("count"), estimate=None if raw.get("estimate") is None else float(raw["estimate"]),
            gang=None if raw.get("gang") is None else raw["gang"]["min"],
        )
        if spec.gang is not None:
            gang_problem(spec.gang, spec.count, where=f"tasks[{i}].gang.min")
        for name in spec.task_ids():
            if name in ids:
                raise ModelError(f"tasks[{i}].id: duplicate task id {name!r}")
            ids.add(name)
        tasks.append(spec)  # a request stays one spec: one submission, one pending entry
    jobs = {t.job for t in tasks}
    for i, t in enumerate(tasks):
        if t.after_job is not None and t.after_job not in jobs:
            raise ModelError(f"tasks[{i}].after_job: unknown job {t.after_job!r}")

    events = []
    for i, raw in enumerate(document.get("events", [])):
        if raw["type"] == "tenants":
            if "tenants" not in raw:
                raise ModelError(f"events[{i}].tenants: required for a tenants event")
            try:
                TenantTree.from_specs(specs_from_json(raw["tenants"]))
            except ModelError as exc:
                raise ModelError(f"events[{i}].{exc}") from None
            events.append(NodeEventSpec(float(raw["time"]), "tenants", tenants=list(raw["tenants"])))
            continue
        if "node" not in raw:
            raise ModelError(f"events[{i}].node: required for {raw['type']}")
        if raw["node"] not in seen:
            raise ModelError(f"events[{i}].node: unknown node {raw['node']!r}")
        given = check_vector(raw["capacity"], f"events[{i}].capacity") if "capacity" in raw else None
        if raw["type"] == "node_heartbeat" and given is None:
            raise ModelError(f"events[{i}].capacity: required for node_heartbeat")
        events.append(NodeEventSpec(float(raw["time"]), raw["type"], raw["node"], given, raw.get("labels")))
    return Scenario(resources, tree, nodes, tasks, events, name=str(document.get("name", "scenario")))
