"""``fairstream bench engine``: scheduling cost per decision at scale, as one JSON object.

Set-up per policy, each measured in a fresh process (seeded, so every run schedules the same
work):
- ``nodes`` nodes of <16 cpu, 64 GB>, ``tenants`` flat tenants with weights 1-4;
- ``pending`` tasks submitted at t=0 in jobs of 50 identical tasks (one container size per
  job, as MapReduce and Spark ask), job sizes 1-4 cpu and 1-16 GB: about 60 % fit at once,
  the rest stay pending, so every later pass works against a backlog;
- the first pass (empty cluster, all tasks pending) is timed on its own (``initial_pass``);
- then ``steps`` steady-state steps: 1 % of the running tasks finish, as many new tasks
  arrive, and the engine runs one pass. ``p50_us``/``p99_us`` are over those steps of
  (wall time of ``Engine.step``: applying events, snapshot and pass) / (decisions in the step);
  ``decisions_per_s`` is all steady-state decisions over all steady-state step time.

``knob_policies`` (QKnobler and Tetris) are measured the same way at the size of the QKnobler
paper's overhead question: 100 active tenants, 3 resources (cpu, mem, disk), 100 nodes, with
``p50_pass_ms``/``p99_pass_ms`` per scheduling pass (the integer program's solve included) and
the amortised cost per decision. Also times a whole simulation of a SWIM FB-2009 trace
(``trace``), one policy, if it is found.
Wall-clock time is read here, in the benchmark, never in the engine.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import platform
import resource
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np

from fairstream.collector import tuned_gc
from fairstream.core.engine import Engine
from fairstream.core.model import ModelError, NodeHeartbeat, ResourceSpace, TaskCompleted, TaskSubmitted, TenantSpec
from fairstream.core.tenants import TenantTree
from fairstream.policies import get as get_policy
from fairstream.sim.output import DecisionWriter, write_run
from fairstream.sim.scenario import load_scenario
from fairstream.sim.simulator import Simulator
from fairstream.sim.traces.busy import busy_cluster
from fairstream.sim.traces.files import EXCERPTS, WORKSPACE_TRACES
from fairstream.sim.traces.swim import load_swim, swim_day

DEFAULT_TRACE = WORKSPACE_TRACES / "swim" / "FB-2009_samples_24_times_1hr_0.tsv"


def _percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.array(values), q)) if values else math.nan


NODE = {"cpu": 16.0, "mem": 64.0, "disk": 128.0}


def bench_policy(policy: str, tenants: int, nodes: int, pending: int, steps: int = 200, seed: int = 42,
                 resources: tuple[str, ...] = ("cpu", "mem"), params: dict | None = None) -> dict:
    rng = np.random.default_rng(seed)
    space = ResourceSpace(resources)
    tree = TenantTree.from_specs([TenantSpec(f"t{i:04d}", weight=float(rng.integers(1, 5))) for i in range(tenants)])
    engine = Engine(space, tree, get_policy(policy), params or {})
    heartbeats = [NodeHeartbeat(0.0, f"n{i:05d}", {r: NODE[r] for r in resources}) for i in range(nodes)]
    counter = 0

    def new_tasks(count: int, now: float) -> list[TaskSubmitted]:
        nonlocal counter
        out: list[TaskSubmitted] = []
        while len(out) < count:
            owner = int(rng.integers(0, tenants))
            demand = {"cpu": float(rng.integers(1, 5)), "mem": float(rng.integers(1, 17))}
            if "disk" in resources:
                demand["disk"] = float(rng.integers(1, 33))
            for _ in range(min(50, count - len(out))):
                counter += 1
                out.append(TaskSubmitted(now, f"task{counter}", f"job{counter // 50}-{owner}", f"t{owner:04d}", demand))
        return out

    started = time.perf_counter()
    first = engine.step(0.0, [*heartbeats, *new_tasks(pending, 0.0)])
    initial_s = time.perf_counter() - started
    running = [d.task for d in first.decisions]

    per_decision_us, pass_ms, total_decisions, total_s = [], [], 0, 0.0
    for step in range(1, steps + 1):
        now = float(step)
        finish = max(1, len(running) // 100)
        chosen = set(rng.choice(len(running), size=finish, replace=False).tolist())
        done = [running[i] for i in sorted(chosen)]
        running = [t for i, t in enumerate(running) if i not in chosen]
        events = [TaskCompleted(now, t) for t in done] + new_tasks(finish, now)
        started = time.perf_counter()
        result = engine.step(now, events)
        elapsed = time.perf_counter() - started
        pass_ms.append(elapsed * 1e3)
        placed = [d.task for d in result.decisions]
        running.extend(placed)
        if placed:
            per_decision_us.append(elapsed / len(placed) * 1e6)
            total_decisions += len(placed)
            total_s += elapsed
    return {
        "p50_us": round(_percentile(per_decision_us, 50), 2),
        "p99_us": round(_percentile(per_decision_us, 99), 2),
        "decisions_per_s": round(total_decisions / total_s, 1) if total_s else None,
        "p50_pass_ms": round(_percentile(pass_ms, 50), 3),
        "p99_pass_ms": round(_percentile(pass_ms, 99), 3),
        "amortised_ms_per_decision": round(sum(pass_ms) / max(total_decisions, 1), 4),
        "steady_state_steps": len(per_decision_us),
        "steady_state_decisions": total_decisions,
        "pending_after_initial_pass": pending - len(first.decisions),
        "initial_pass": {
            "decisions": len(first.decisions),
            "seconds": round(initial_s, 3),
            "us_per_decision": round(initial_s / max(len(first.decisions), 1) * 1e6, 2),
        },
    }


def _tuned(function, *args, **kwargs):
    """``function(*args, **kwargs)`` in a spawned process, with the collector as the commands
    and the worker set it."""
    with tuned_gc():
        return function(*args, **kwargs)


def _in_own_process(function, *args, **kwargs):
    """``function(*args, **kwargs)`` in a fresh process (``_tuned``), so that what one policy's
    run leaves behind does not weigh on the next one's (in one process, ``bench_policy`` of a
    policy after another ran 10-30 % slower: ``fair`` after ``drf``, p50 36-43 µs against
    32-33 µs alone, on 2026-11-27) and its peak memory is its own."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(_tuned, (function, *args), kwargs)


def bench_trace(path: Path, policy: str = "ltrf", progress: bool | None = None) -> dict:
    scenario = load_swim(str(path))
    started = time.perf_counter()
    result = Simulator(scenario, policy, {}, progress=progress).run()
    elapsed = time.perf_counter() - started
    summary = result.summary()
    return {
        "trace": path.name,
        "policy": policy,
        "jobs": len({t.job for t in scenario.tasks}),
        "tasks": scenario.task_count,
        "nodes": len(scenario.nodes),
        "wall_s": round(elapsed, 2),
        "tasks_per_s": round(scenario.task_count / elapsed, 1),
        "unfinished_tasks": summary["unfinished_tasks"],
    }


def bench_engine(tenants: int, nodes: int, pending: int, policies: list[str], trace: str | None = None,
                 progress: bool | None = None, knob_policies: Sequence[str] = ("qknobler", "tetris")) -> dict:
    """``fairstream bench engine``; ``trace``: the SWIM trace to time a whole simulation of (the
    FB-2009 sample if None and found; "none": skip it). A trace named but not found is refused
    before anything runs."""
    if trace and trace != "none" and not Path(trace).exists():
        raise ModelError(f"--trace {trace}: not found")
    out: dict[str, Any] = {
        "benchmark": "engine",
        "machine": {**_machine(), "platform": platform.platform()},
        "setup": {"tenants": tenants, "nodes": nodes, "pending": pending, "node_capacity": {"cpu": 16, "mem": 64}},
        "policies": {},
    }
    for policy in policies:
        out["policies"][policy] = _in_own_process(bench_policy, policy, tenants, nodes, pending)
    if knob_policies:
        out["knob_setup"] = {"tenants": 100, "nodes": 100, "pending": 5000, "resources": ["cpu", "mem", "disk"],
                             "node_capacity": NODE}
        out["knob_policies"] = {policy: _in_own_process(bench_policy, policy, 100, 100, 5000, steps=100,
                                                        resources=("cpu", "mem", "disk"))
                                for policy in knob_policies}
    path = Path(trace) if trace else DEFAULT_TRACE
    if trace == "none":
        out["trace_simulation"] = {"skipped": "--trace none"}
    elif path.exists():
        out["trace_simulation"] = bench_trace(path, progress=progress)
    else:
        out["trace_simulation"] = {"skipped": f"{path} not found (pass --trace FILE, or --trace none)"}
    return out


DAY_TRACES = [DEFAULT_TRACE, DEFAULT_TRACE.with_name("FB-2009_samples_24_times_1hr_1.tsv")]
# Where the workspace's whole samples are not beside the checkout (a user's clone): the excerpt
# every clone has, so that the day runs there too (``setup.traces`` names what was played).
DAY_EXCERPT = [EXCERPTS / "FB-2009_samples_24_times_1hr_1.head60.tsv"]


def _day_run(paths: list[Path], scale: float, nodes: int, policy: str, progress: bool | None,
             hours: float | None) -> dict:
    """One policy over the SWIM day (``bench_day`` runs it in a process of its own)."""
    started = time.perf_counter()
    scenario = swim_day([str(p) for p in paths], scale=scale, nodes=nodes, hours=hours)
    decisions = 0

    def count(decision) -> None:  # decisions are counted, not kept: memory grows with what runs
        nonlocal decisions
        decisions += 1

    steps = 0

    def step(engine, result) -> None:  # an engine step: one event instant and its pass
        nonlocal steps
        steps += 1

    result = Simulator(scenario, policy, {}, progress=progress, on_decision=count, on_step=step).run()
    elapsed = time.perf_counter() - started
    summary = result.summary()
    requests = sum(1 for _ in scenario.tasks)
    # The engine's input: a submission per request, a completion per task, a heartbeat per node.
    events = requests + scenario.task_count - summary["unfinished_tasks"] + nodes
    return {
        "policy": policy,
        "jobs": cast(Any, scenario.tasks).jobs,  # (a trace read lazily: TableWorkload)
        "requests": requests,
        "tasks": scenario.task_count,
        "decisions": decisions,
        "unfinished_tasks": summary["unfinished_tasks"],
        "simulated_s": round(result.end_time, 1),
        "wall_s": round(elapsed, 1),
        "tasks_per_s": round(scenario.task_count / elapsed, 1),
        "engine_steps": steps,
        "steps_per_s": round(steps / elapsed, 1),
        "events": events,
        "events_per_s": round(events / elapsed, 1),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def bench_day(policies: list[str], scale: float = 1.0, nodes: int = 50, paths: list[Path] | None = None,
              progress: bool | None = None, hours: float | None = None) -> dict:
    """``fairstream bench day``: the SWIM FB-2009 samples played as one 24-hour day
    (``traces.swim.swim_day``; the excerpt in tests/data where the workspace's samples are not
    beside the checkout), byte counts times ``scale``, on ``nodes`` nodes of <12 cpu,
    24 GB>, each policy simulated whole in a fresh process: wall time, tasks per second and
    peak memory (``ru_maxrss``, the trace loaded included)."""
    paths = paths or (DAY_TRACES if all(Path(p).exists() for p in DAY_TRACES) else DAY_EXCERPT)
    missing = [str(p) for p in paths if not Path(p).exists()]
    if missing:
        return {"benchmark": "day", "skipped": f"{', '.join(missing)} not found"}
    runs = {policy: _in_own_process(_day_run, paths, scale, nodes, policy, progress, hours) for policy in policies}
    return {"benchmark": "day", "machine": _machine(),
            "setup": {"traces": [Path(p).name for p in paths], "scale": scale, "nodes": nodes, "hours": hours,
                      "node_capacity": {"cpu": 12, "mem": 24}},
            "policies": runs}


def _machine() -> dict:
    """What a figure was measured on: Python, whether its interpreter calls into a shared
    ``libpython`` (a build with ``--enable-shared``, pyenv's default, ran the busy workload about
    10 % slower than Debian's static one: docs/benchmarks.md, Round 12; None where it cannot be
    told), cores, whether passes used the compiled path (``fairstream.core.native``;
    ``FAIRSTREAM_NATIVE=0`` measures the Python) and how many of the step's modules ran
    compiled with mypyc (``fairstream.compiled``; ``FAIRSTREAM_COMPILED=0``: none)."""
    from fairstream import compiled
    from fairstream.core import native

    return {"python": platform.python_version(), "python_shared_library": _shared_libpython(),
            "cpus": os.cpu_count(), "compiled_path": native.enabled(), "compiled_pass": native.pass_enabled(), "compiled_modules": len(compiled.active())}


def _shared_libpython(maps: Path = Path("/proc/self/maps")) -> bool | None:
    """Whether this process maps a ``libpython`` shared library (its memory ``maps``, Linux's
    ``/proc/self/maps``; None where there are none)."""
    try:
        mapped = maps.read_text()
    except OSError:
        return None
    return "/libpython3" in mapped


def _e2e_run(policy: str, divide: float, durations: str) -> dict:
    """One policy over the busy workload as ``simulate --no-baseline --no-plots`` runs it:
    the scenario file read and validated, the run, its files written (``bench_e2e`` runs it in
    a spawned process, through ``_tuned``)."""
    scenario = busy_cluster(durations=durations)
    params = {}
    if divide != 1:
        for spec in scenario.tasks:
            spec.submit, spec.duration = spec.submit / divide, spec.duration / divide
        # A policy's own times scale too: LTRF's initial quantum Q0 is 60 s of event time.
        known = {param.name: param.default for param in get_policy(policy).params}
        params = {name: str(known[name] / divide) for name in ("quantum",) if name in known}
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "scenario.json"
        path.write_text(json.dumps(scenario.to_json()))
        started = time.perf_counter()
        loaded = load_scenario(path)
        parsed = time.perf_counter()
        writer = DecisionWriter(Path(folder) / "run")
        result = Simulator(loaded, policy, params, on_decision=writer).run()
        writer.close()
        simulated = time.perf_counter()
        write_run(result, Path(folder) / "run", None, plots=False, decisions_written=True)
        done = time.perf_counter()
        placed = [(d["task"], d["node"]) for line in (Path(folder) / "run" / "decisions.jsonl").read_text().splitlines()
                  for d in [json.loads(line)] if d["kind"] == "place"]
    summary = result.summary()
    return {"parse_s": round(parsed - started, 2), "simulate_s": round(simulated - parsed, 2),
            "write_s": round(done - simulated, 2), "wall_s": round(done - started, 2),
            "placed_tasks": summary["placed_tasks"], "decisions": summary["decisions"],
            "placed_tasks_per_s": round(summary["placed_tasks"] / (done - started), 1),
            "unfinished_tasks": summary["unfinished_tasks"],
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "placements": placed}


def bench_e2e(policies: list[str], durations: str = "per-task", time_check: bool = True) -> dict:
    """``fairstream bench e2e``: the busy workload (``traces.busy``: 100 queues, 1,000 nodes
    of <16 cpu, 64 GB>, 50,000 tasks in 1,000 jobs) end to end as ``simulate --no-baseline
    --no-plots``, each policy in a fresh process: placed tasks per second of wall time, and
    (``time_check``) whether the run with every time divided by 10 (a policy's time
    parameters too: LTRF's quantum) places the same tasks on the same nodes."""
    context = multiprocessing.get_context("spawn")
    runs = {}
    for policy in policies:
        with context.Pool(1) as pool:
            run = pool.apply(_tuned, (_e2e_run, policy, 1, durations))
            if time_check:
                divided = pool.apply(_tuned, (_e2e_run, policy, 10, durations))
                run["same_placements_with_times_divided_by_10"] = divided["placements"] == run["placements"]
        run.pop("placements")
        runs[policy] = run
    return {"benchmark": "e2e", "machine": _machine(),
            "setup": {"tenants": 100, "nodes": 1000, "jobs": 1000, "tasks": 50000, "durations": durations},
            "policies": runs}


SPREAD_WORKLOADS = ("philly", "gpu")
BASELINES = ("fair", "drf", "ltrf")


def spread_scenario(workload: str):
    """A workload of ``bench spread``: ``philly``, the Philly run times of ``simulate --trace
    philly_runtime.csv --format philly --limit 1000`` (its excerpt in a clone without
    ``../shared``); ``gpu``, ``traces.gpu_cluster`` (1,523 nodes, 8,152 pods)."""
    if workload == "philly":
        from fairstream.sim.traces import load_trace
        from fairstream.sim.traces.late_tenants import DEFAULT_PHILLY

        return load_trace(str(DEFAULT_PHILLY), "philly", limit=1000)
    if workload == "gpu":
        from fairstream.sim.traces.gpu_cluster import gpu_cluster

        return gpu_cluster()
    raise ValueError(f"workload {workload!r}: one of {', '.join(SPREAD_WORKLOADS)}")


def _spread_run(workload: str, policy: str) -> dict:
    """One policy over one workload, as ``simulate --no-baseline --no-plots`` runs it minus the
    files: wall seconds of the run, and a hash of its decisions (kind, time, task, node, count,
    in order) to show a change left them alone."""
    import hashlib

    scenario = spread_scenario(workload)
    digest = hashlib.sha256()
    count = [0]

    def seen(decision) -> None:
        count[0] += 1
        digest.update(f"{decision.kind.value} {decision.time!r} {decision.task} {decision.node} {decision.count}\n"
                      .encode())

    started = time.perf_counter()
    result = Simulator(scenario, policy, {}, on_decision=seen).run()
    wall = time.perf_counter() - started
    summary = result.summary()
    return {"wall_s": round(wall, 2), "decisions": count[0], "placed_tasks": summary["placed_tasks"],
            "unfinished_tasks": summary["unfinished_tasks"], "decisions_sha256": digest.hexdigest()[:16],
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}


def bench_spread(policies: list[str], workloads: list[str] | None = None, repeat: int = 1) -> dict:
    """``fairstream bench spread``: every policy over each workload (``SPREAD_WORKLOADS``), each
    run in a fresh process, ``repeat`` times in turn (policy after policy, then again): the wall
    seconds of each run and, per policy, its slowest run over the slowest of ``fair``, ``drf``
    and ``ltrf`` in the same round (``ratio``; the goal: at most 3), with its decisions' hash."""
    out: dict[str, Any] = {"benchmark": "spread", "machine": _machine(), "workloads": {}}
    for workload in workloads or list(SPREAD_WORKLOADS):
        rounds = []
        for _ in range(repeat):
            rounds.append({policy: _in_own_process(_spread_run, workload, policy) for policy in policies})
        table: dict[str, Any] = {}
        for policy in policies:
            runs = [r[policy] for r in rounds]
            ratios = []
            for r in rounds:
                base = max((r[b]["wall_s"] for b in BASELINES if b in r), default=None)
                if base:
                    ratios.append(round(r[policy]["wall_s"] / base, 2))
            table[policy] = {"wall_s": [run["wall_s"] for run in runs], "ratio": ratios,
                             "decisions": runs[0]["decisions"], "decisions_sha256": runs[0]["decisions_sha256"],
                             "same_decisions_each_run": len({run["decisions_sha256"] for run in runs}) == 1,
                             "unfinished_tasks": runs[0]["unfinished_tasks"],
                             "peak_rss_mb": max(run["peak_rss_mb"] for run in runs)}
        out["workloads"][workload] = table
    return out
