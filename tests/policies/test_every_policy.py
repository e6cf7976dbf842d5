"""Every registered policy through every entry point a user has: ``simulate`` over a scenario
file and over a trace (the real command line, as typed), the worker's processor, replay of the
worker's recorded input (``simulate --events``), ``sweep`` and ``bench engine``.

Parametrised over ``REGISTRY``, so a new policy is covered without touching this file. A policy
whose parameters need a file (FLEX's model) runs with its shipped default.
"""

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from fairstream.cli import main
from fairstream.policies import REGISTRY
from fairstream.state.store import MemoryStore
from fairstream.streams.processor import Incoming, Processor
from fairstream.wire.topics import Topics
from tests.builders import worker_config

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = ROOT / "examples" / "two-tenants.json"
TRACE = ROOT / "tests" / "data" / "FB-2009_samples_24_times_1hr_1.head60.tsv"
POLICIES = sorted(REGISTRY)
FAIRSTREAM = Path(sys.executable).parent / "fairstream"  # the command the package installs


def printed_json(capsys) -> dict:
    """The one JSON object a command printed on stdout (nothing else may be there)."""
    out = capsys.readouterr().out
    [line] = out.splitlines()
    return json.loads(line)


def written_run(out: Path, policy: str) -> tuple[list[dict], dict]:
    """``decisions.jsonl`` and ``metrics.json`` of a run, parsed, with their basic shape checked."""
    decisions = [json.loads(line) for line in (out / "decisions.jsonl").read_text().splitlines()]
    metrics = json.loads((out / "metrics.json").read_text())
    assert decisions and all({"id", "kind", "task", "node", "tenant"} <= set(d) for d in decisions)
    assert metrics["summary"]["policy"] == policy
    json.dumps(metrics["summary"]["params"])  # every parameter recorded as plain JSON
    return decisions, metrics


@pytest.mark.parametrize("policy", POLICIES)
def test_simulate_runs_a_scenario_file_to_the_end_with_every_policy(policy, tmp_path):
    # The installed command in a process of its own, as a user types it: its standard output
    # is the one JSON line (a solver library writing there from C would break it).
    out = tmp_path / "run"
    done = subprocess.run([str(FAIRSTREAM), "simulate", "--scenario", str(SCENARIO), "--policy", policy,
                           "--out", str(out)], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    [line] = done.stdout.splitlines()
    printed = json.loads(line)
    assert printed["policy"] == policy and printed["unfinished_tasks"] == 0
    decisions, metrics = written_run(out, policy)
    # The scenario's requests are placed several tasks to a decision: each task once in all.
    placed = [task for d in decisions if d["kind"] == "place" for task in d.get("tasks", [d["task"]])]
    assert len(placed) == len(set(placed)) == metrics["summary"]["tasks"]
    assert all(d.get("count", 1) == len(d.get("tasks", [d["task"]])) for d in decisions if d["kind"] == "place")
    assert ("speedup_vs_static" in metrics) == (policy != "static")  # static is the baseline itself
    assert (out / "accumulated.png").stat().st_size > 0


@pytest.mark.parametrize("policy", POLICIES)
def test_simulate_runs_a_swim_trace_with_every_policy(policy, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["simulate", "--trace", str(TRACE), "--format", "swim", "--limit", "15", "--policy", policy,
                 "--out", str(out), "--no-baseline", "--no-plots", "--no-progress"]) == 0
    assert printed_json(capsys)["unfinished_tasks"] == 0
    written_run(out, policy)


def message(kind: str, offset: int, body: dict) -> Incoming:
    topic = {"heartbeat": Topics.heartbeats, "submitted": Topics.submitted, "completed": Topics.completed}[kind]
    return Incoming(kind, json.dumps(body).encode(), topic, 0, offset)


@pytest.mark.parametrize("policy", POLICIES)
def test_the_worker_decides_with_every_policy_and_its_log_replays_to_the_same_decisions(policy, tmp_path, capsys):
    published = []

    async def publish(topic, key, body):
        published.append((topic, body))

    store = MemoryStore()
    processor = Processor(store, publish, worker_config(policy))
    nodes = [message("heartbeat", k, {"cluster": "c1", "node": f"n{k}", "time": 0, "capacity": {"cpu": 4, "mem": 8}})
             for k in range(2)]
    tasks = [message("submitted", k, {"cluster": "c1", "task": f"t{k}", "tenant": "AB"[k % 2], "time": 1 + k // 4,
                                      "demand": {"cpu": 1, "mem": 2}}) for k in range(12)]
    finished = [message("completed", k, {"cluster": "c1", "task": f"t{k}", "time": 5}) for k in range(8)]

    async def scenario():
        await processor.handle(nodes + tasks[:8])
        await processor.handle(tasks[8:])
        await processor.handle(finished)
        return await store.full_log("c1")

    recorded = asyncio.run(scenario())
    decisions = [body for topic, body in published if topic == Topics.decisions]
    assert not [body for topic, body in published if topic == Topics.deadletter]
    # 8 fit at once (2 nodes of 4 cpu); the other 4 once 8 have finished.
    assert sorted(d["task"] for d in decisions if d["kind"] == "place") == sorted(f"t{k}" for k in range(12))

    log = tmp_path / "input.jsonl"
    log.write_text("".join(json.dumps(step) + "\n" for step in recorded.steps))
    out = tmp_path / "replay"
    assert main(["simulate", "--events", str(log), "--policy", policy, "--cluster", "c1", "--out", str(out)]) == 0
    replayed = [json.loads(line) for line in (out / "decisions.jsonl").read_text().splitlines()]
    assert replayed == decisions


@pytest.mark.parametrize("policy", POLICIES)
def test_sweep_compares_every_policy_with_static_partitioning(policy, tmp_path, capsys):
    assert main(["sweep", "macro", "--scale", "0.02", "--knobs", "1", "--workers", "1", "--policies", policy,
                 "--out", str(tmp_path), "--no-progress"]) == 0
    printed = printed_json(capsys)
    rows = json.loads((tmp_path / "sweep.json").read_text())["rows"]
    ours = [r for r in rows if r["figure"] == "fig7" and r["policy"] == policy]
    assert ours and all(r["makespan"] and r["speedup"] for r in ours)
    assert str(tmp_path / "fig7-policies.png") in printed["figures"]


@pytest.mark.parametrize("policy", POLICIES)
def test_bench_engine_measures_every_policy_and_prints_only_json(policy, capsys):
    assert main(["bench", "engine", "--policies", policy, "--tenant-count", "5", "--nodes", "5", "--pending", "50",
                 "--knob-policies", "", "--trace", "none", "--no-progress"]) == 0
    measured = printed_json(capsys)["policies"][policy]
    assert measured["steady_state_decisions"] > 0 and measured["p50_us"] > 0


def test_the_registry_is_what_fairstream_policies_lists(capsys):
    assert main(["policies"]) == 0
    listed = [line.split(":")[0] for line in capsys.readouterr().out.splitlines() if not line.startswith(" ")]
    assert listed == list(REGISTRY)


@pytest.mark.slow
def test_bench_day_plays_the_swim_samples_as_one_day_and_reports_time_and_peak_memory(capsys):
    from fairstream.lab.bench import DAY_TRACES

    if not all(path.exists() for path in DAY_TRACES):
        pytest.skip("the SWIM FB-2009 samples are in ../shared/traces/swim/")
    # Both samples, bytes times 0.02: every job of the day, a few tasks each.
    assert main(["bench", "day", "--policies", "drf", "--scale", "0.02", "--day-nodes", "4", "--no-progress"]) == 0
    run = printed_json(capsys)["policies"]["drf"]
    assert run["jobs"] == 12532 and run["unfinished_tasks"] == 0 and run["tasks"] >= run["requests"]
    assert run["simulated_s"] > 86_400 * 0.9 and run["peak_rss_mb"] > 0 and run["tasks_per_s"] > 0
    # Its input: a submission per request, a completion per task, a heartbeat per node.
    assert run["events"] == run["requests"] + run["tasks"] + 4 and run["events_per_s"] > 0
