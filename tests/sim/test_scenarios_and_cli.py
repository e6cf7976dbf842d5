"""Scenario files, traces and the command line: what users type and what they get back."""

import gzip
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairstream.cli import main
from fairstream.core.model import ModelError
from fairstream.sim.output import metrics_document, write_run
from fairstream.sim.scenario import load_scenario, parse_scenario
from fairstream.sim.simulator import Simulator
from fairstream.sim.traces import load_trace
from fairstream.sim.traces.macro import macro_benchmark

DATA = Path(__file__).parents[1] / "data"
ISSUE_EXAMPLE = {
    "resources": ["cpu", "mem"],
    "nodes": [{"id": "n1", "capacity": {"cpu": 9, "mem": 12}, "labels": {"gpu": "no"}}],
    "tenants": [{"id": "G1", "weight": 1}, {"id": "A", "parent": "G1", "weight": 1}],
    "tasks": [{"id": "t1", "job": "j1", "tenant": "A", "submit": 0, "duration": 1,
               "demand": {"cpu": 1, "mem": 2}, "constraints": {"nodes": ["n1"]}}],
}


def with_changes(**changes):
    document = json.loads(json.dumps(ISSUE_EXAMPLE))
    for path, value in changes.items():
        target = document
        keys = path.split("__")
        for key in keys[:-1]:
            target = target[int(key)] if key.isdigit() else target[key]
        target[int(keys[-1]) if keys[-1].isdigit() else keys[-1]] = value
    return document


def test_the_issues_example_scenario_loads():
    sc = parse_scenario(ISSUE_EXAMPLE)
    assert [n.id for n in sc.nodes] == ["n1"] and sc.tree.path("A") == ("G1", "A")


def test_a_task_with_a_count_is_one_request_of_numbered_tasks():
    doc = with_changes(tasks__0__count=3)
    scenario = parse_scenario(doc)
    [request] = scenario.tasks
    assert request.count == 3 and request.task_ids() == ["t1-0", "t1-1", "t1-2"] and scenario.task_count == 3
    assert [t.id for t in scenario.expanded_tasks()] == ["t1-0", "t1-1", "t1-2"]


@pytest.mark.parametrize(
    "changes, message",
    [
        pytest.param({"tasks__0__demand": {"gpu": 1}}, "tasks[0].demand.gpu: unknown resource", id="an unknown resource name is named with its task"),
        pytest.param({"tasks__0__demand": {"cpu": -1}}, "tasks[0].demand.cpu", id="a negative demand is rejected"),
        pytest.param({"tasks__0__tenant": "Z"}, "tasks[0].tenant: 'Z' unknown tenant", id="an unknown tenant is rejected"),
        pytest.param({"tasks__0__tenant": "G1"}, "tasks[0].tenant: 'G1' is a queue with children", id="tasks go to leaves, not queues"),
        pytest.param({"tenants__1__parent": "nope"}, "tenants[A].parent: unknown tenant 'nope'", id="a dangling parent is rejected"),
        pytest.param({"nodes__0__capacity": "lots"}, "nodes[0].capacity: 'lots' is not of type 'object'", id="wrong types name the field"),
        pytest.param({"tasks__0__duration": None}, "tasks[0].duration", id="a missing duration is named"),
        pytest.param({"tasks__0__demand": {"cpu": 0, "mem": 0}}, "tasks[0].demand: must ask for some resource", id="an all-zero demand is rejected"),
    ],
)
def test_invalid_scenarios_give_one_line_naming_the_field(changes, message):
    with pytest.raises(ModelError) as err:
        parse_scenario(with_changes(**changes))
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def _tasks_document(demands: list[dict]) -> dict:
    return {"resources": ["cpu", "mem"], "nodes": [{"id": "n0", "capacity": {"cpu": 4, "mem": 4}}],
            "tasks": [{"id": f"t{i}", "tenant": "A", "submit": 0, "duration": 1, "demand": demand}
                      for i, demand in enumerate(demands)]}


def _parsed_demands(document: dict) -> list[dict] | str:
    """Each task's parsed demand with its values' types, or the error's message."""
    try:
        return [[(k, v, type(v)) for k, v in spec.demand.items()] for spec in parse_scenario(document).tasks]
    except ModelError as exc:
        return str(exc)


@settings(max_examples=200, deadline=None)
@given(demands=st.lists(st.dictionaries(st.sampled_from(["cpu", "mem"]), st.sampled_from([0, 1, 1.0, 2.5]), min_size=1),
                        min_size=1, max_size=6))
def test_a_demand_parsed_once_for_tasks_alike_gives_what_each_task_parsed_alone_gives(demands):
    # Tasks alike (1 and 1.0, keys in either order, all zero) parse to what each gives alone:
    # float values, or the first failing task's error, at its own index.
    document = _tasks_document(demands)
    alone = [_parsed_demands({**document, "tasks": [task]}) for task in document["tasks"]]
    failing = [k for k, outcome in enumerate(alone) if isinstance(outcome, str)]
    if not failing:
        assert _parsed_demands(document) == [outcome[0] for outcome in alone]
    else:
        assert _parsed_demands(document) == alone[failing[0]].replace("tasks[0]", f"tasks[{failing[0]}]")


@pytest.mark.parametrize("later, message", [
    pytest.param({"cpu": True, "mem": 1}, "tasks[1].demand.cpu", id="a bool where an earlier task had 1"),
    pytest.param({"cpu": 1, "mem": 1, "gpu": 1}, "tasks[1].demand.gpu: unknown resource",
                 id="an unknown resource beside an earlier task's demand"),
    pytest.param({"cpu": math.inf, "mem": 1}, "tasks[1].demand.cpu: must be a finite number",
                 id="an infinite amount where an earlier task had 1"),
])
def test_a_later_task_s_bad_demand_is_named_though_an_earlier_one_was_alike(later, message):
    with pytest.raises(ModelError, match=re.escape(message)):
        parse_scenario(_tasks_document([{"cpu": 1, "mem": 1}, later]))


@pytest.mark.parametrize("content", [
    pytest.param(b'{"nodes": [}', id="a file that is not JSON"),
    pytest.param(b'{"nodes": "\xff"}', id="a file that is not UTF-8"),
    pytest.param(b'{"nodes": NaN}', id="a file with a NaN, which JSON lacks"),
])
def test_cli_reports_a_bad_file_in_one_line_and_exit_code_2(tmp_path, content):
    bad = tmp_path / "bad.json"
    bad.write_bytes(content)
    proc = subprocess.run([sys.executable, "-m", "fairstream.cli", "simulate", "--scenario", str(bad), "--policy", "ltrf",
                           "--out", str(tmp_path / "out")], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "not JSON" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("argv, message", [
    pytest.param(["--policy", "nope"], "unknown policy", id="an unknown policy is named"),
    pytest.param(["--policy", "ltrf", "--param", "quantom=5"], "unknown parameter", id="a misspelt parameter is named"),
    pytest.param(["--policy", "ltrf", "--param", "discount=2"], "discount=2: must be in [0, 1]", id="an out-of-range parameter is named"),
    pytest.param(["--policy", "fair", "--param", "resource=gpu"], "resource=gpu: not a resource", id="an unknown resource parameter is named"),
])
def test_cli_parameter_errors_are_one_line(tmp_path, capsys, argv, message):
    path = tmp_path / "s.json"
    path.write_text(json.dumps(ISSUE_EXAMPLE))
    assert main(["simulate", "--scenario", str(path), "--out", str(tmp_path / "o"), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_a_replay_from_a_file_that_is_not_an_engine_snapshot_is_one_line(tmp_path, capsys):
    (tmp_path / "steps.jsonl").write_text("")
    (tmp_path / "snap").write_bytes(b"not a snapshot")
    assert main(["simulate", "--events", str(tmp_path / "steps.jsonl"), "--snapshot", str(tmp_path / "snap"),
                 "--policy", "drf", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "not an engine snapshot" in err and err.count("\n") == 1


@pytest.mark.parametrize("line, message", [
    pytest.param("not json", "not a recorded step", id="a line that is not JSON"),
    pytest.param('{"time": 1}', "not a recorded step (KeyError", id="a step without events"),
    pytest.param('{"time": 1, "events": [{"type": "teleport"}]}', "unknown event type", id="an unknown event type"),
])
def test_a_bad_line_of_a_recorded_log_is_one_line_that_names_it(tmp_path, capsys, line, message):
    steps = tmp_path / "steps.jsonl"
    steps.write_text('{"time": 0, "events": []}\n\n' + line + "\n")
    assert main(["simulate", "--events", str(steps), "--policy", "drf", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "steps.jsonl:3: " in err and message in err and err.count("\n") == 1


def test_an_unwritable_output_directory_is_one_line(tmp_path, capsys):
    path = tmp_path / "s.json"
    path.write_text(json.dumps(ISSUE_EXAMPLE))
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["simulate", "--scenario", str(path), "--policy", "drf", "--out", str(blocker / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fairstream: error:") and err.count("\n") == 1


def _closed_port() -> int:
    import socket

    with socket.socket() as s:  # bound and closed again: nothing listens there
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


TRACE = str(Path(__file__).parents[1] / "data" / "FB-2009_samples_24_times_1hr_1.head60.tsv")


@pytest.mark.parametrize("argv, service", [
    pytest.param(["tail", "--idle-timeout", "1", "--broker", "127.0.0.1:{port}"], "Kafka",
                 id="tail from a broker that is not there"),
    pytest.param(["publish", "--topic", "t", "--broker", "127.0.0.1:{port}"], "Kafka",
                 id="publish to a broker that is not there"),
    pytest.param(["replay", TRACE, "--format", "swim", "--limit", "2", "--broker", "127.0.0.1:{port}"], "Kafka",
                 id="replay to a broker that is not there"),
    pytest.param(["emulate", TRACE, "--format", "swim", "--limit", "2", "--broker", "127.0.0.1:{port}"], "Kafka",
                 id="emulate on a broker that is not there"),
    pytest.param(["export-log", "--cluster", "c", "--redis", "redis://127.0.0.1:{port}/0"], "Redis",
                 id="export-log from a Redis that is not there"),
])
def test_a_service_that_cannot_be_reached_is_one_line_naming_it_and_exit_2(argv, service, capsys, monkeypatch):
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO('{"cluster": "c"}\n'))
    port = _closed_port()
    assert main([a.format(port=port) for a in argv]) == 2
    captured = capsys.readouterr()
    [line] = captured.err.splitlines()
    assert line.startswith(f"fairstream: error: {service}: ") and str(port) in line


def test_the_installed_command_says_an_unreachable_broker_in_one_line_of_its_own():
    # In a process of its own, where nothing captures aiokafka's log: it would add a line.
    port = _closed_port()
    done = subprocess.run([str(Path(sys.executable).parent / "fairstream"), "tail", "--idle-timeout", "1", "--broker",
                           f"127.0.0.1:{port}"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    [line] = done.stderr.splitlines()
    assert line.startswith("fairstream: error: Kafka: KafkaConnectionError: Unable to bootstrap")


def test_simulate_writes_decisions_metrics_and_plots(tmp_path, capsys):
    path = tmp_path / "macro.json"
    path.write_text(json.dumps(macro_benchmark(seed=3, scale=0.05).to_json()))
    out = tmp_path / "run"
    assert main(["simulate", "--scenario", str(path), "--policy", "ltrf", "--param", "round=600", "--out", str(out)]) == 0
    lines = (out / "decisions.jsonl").read_text().splitlines()
    first = json.loads(lines[0])
    assert {"time", "task", "job", "tenant", "node", "demand", "policy"} <= set(first)
    assert first["policy"] == "ltrf" and set(first["demand"]) == {"cpu", "mem"}
    metrics = json.loads((out / "metrics.json").read_text())
    assert set(metrics["tenants"]) == {"Facebook", "Purdue", "Spark", "TPC-H"}
    assert {"g", "d", "S", "f_raw", "f_counted", "rho"} <= set(metrics["tenants"]["Spark"])
    assert {"psi", "omega", "util_cpu", "util_mem"} <= set(metrics["cluster"])
    assert metrics["summary"]["unfinished_tasks"] == 0
    job = metrics["jobs"]["purdue-wordcount"]
    assert job["tenant"] == "Purdue" and job["completion_time"] == pytest.approx(job["finish"] - job["submit"])
    speedup = metrics["speedup_vs_static"]["tenants"]
    assert set(speedup) == set(metrics["tenants"])
    # Sharing lets some queue's jobs finish sooner than in its static partition.
    assert max(v["mean_jct"] for v in speedup.values()) > 1
    assert len(lines) == metrics["summary"]["tasks"]
    for png in ("accumulated.png", "allocation.png", "fairness.png", "cluster.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_tenant_that_joins_mid_run_is_sampled_from_its_first_sample_on():
    from fairstream.sim.simulator import Simulator

    # One node of 2 cpu, samples every 2.5 s. A runs 1 cpu from 0 to 10; B joins the tree at
    # t = 4 and runs 1 cpu from 5 to 15. g is the share held: 1/2 each while running; f_raw
    # its integral (A: 2.5 s x 0.5 = 1.25 per sample); S the entitlement, A's whole until B joins.
    document = {"resources": ["cpu"], "nodes": [{"id": "n", "capacity": {"cpu": 2}}], "tenants": [{"id": "A"}],
                "tasks": [{"id": "a", "job": "ja", "tenant": "A", "submit": 0, "duration": 10, "demand": {"cpu": 1}},
                          {"id": "b", "job": "jb", "tenant": "B", "submit": 5, "duration": 10, "demand": {"cpu": 1}}],
                "events": [{"time": 4, "type": "tenants", "tenants": [{"id": "A"}, {"id": "B"}]}]}
    series = Simulator(parse_scenario(document), "drf", {}, sample_interval=2.5).run().metrics.series
    a, b = series["A"], series["B"]
    assert list(series) == ["A", "B"]
    assert a.time == [0.0, 2.5, 5.0, 7.5, 10.0, 12.5, 15.0] and b.time == [5.0, 7.5, 10.0, 12.5, 15.0]
    assert a.g == [0.5, 0.5, 0.5, 0.5, 0.0, 0.0, 0.0] and b.g == [0.5, 0.5, 0.5, 0.5, 0.0]
    assert a.S == [1.0, 1.0, 0.5, 0.5, 0.5, 0.5, 0.5] and b.S == [0.5] * 5
    assert a.f_raw == [0.0, 1.25, 2.5, 3.75, 5.0, 5.0, 5.0] and b.f_raw == [0.0, 1.25, 2.5, 3.75, 5.0]
    assert a.rho == [1.0] * 7 and b.rho == [1.0] * 5
    assert all(type(x) is float for s in (a, b) for column in (s.time, *s.columns) for x in column)


def test_swim_jobs_become_one_map_per_64mb_block_and_reduces_after_maps():
    sc = load_trace(str(DATA / "FB-2009_samples_24_times_1hr_1.head60.tsv"), "swim", limit=3)
    # job2 reads 1,048,668,636 bytes: ceil(1048668636 / 64 MiB) = 16 maps; shuffle 0: map only.
    # The 15 that read a full block are one request, job2-m-0 .. job2-m-14; the last, which
    # reads the rest, is job2-m-15.
    job2 = [t for t in sc.tasks if t.job == "job2"]
    assert [(t.id, t.count) for t in job2] == [("job2-m", 15), ("job2-m-15", None)]
    assert all(t.stage == 0 for t in job2)
    # A map-only job's maps also write its output (149,442,587 bytes / 16 maps): a full block
    # takes 3 s + (64 MiB + 9,340,162 B) / 8 MiB/s = 3 + 8 + 1.113 = 12.113 s.
    assert job2[0].duration == 12.113
    assert {t.tenant for t in sc.tasks} == {"q0", "q1", "q2"}


@pytest.mark.parametrize("cap, job2_tasks", [
    pytest.param(None, 16, id="no cap: job2's 16 maps"),
    pytest.param(5, 5, id="--max-tasks-per-job 5: at most 5 maps and 5 reduces per job"),
])
def test_the_command_line_caps_the_tasks_of_a_swim_job_as_the_papers_replays_did(cap, job2_tasks, tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["simulate", "--trace", str(DATA / "FB-2009_samples_24_times_1hr_1.head60.tsv"), "--format", "swim",
            "--limit", "3", "--policy", "drf", "--out", str(out), "--no-baseline", "--no-plots", "--no-progress"]
    assert main(argv + (["--max-tasks-per-job", str(cap)] if cap else [])) == 0
    decisions = [json.loads(line) for line in (out / "decisions.jsonl").read_text().splitlines()]
    assert sum(d.get("count", 1) for d in decisions if d["job"] == "job2") == job2_tasks
    capsys.readouterr()
    assert main(argv + ["--max-tasks-per-job", "0"]) == 2
    assert capsys.readouterr().err.strip() == "fairstream: error: max_tasks_per_job: must be >= 1 (got 0)"


def test_tenant_count_spreads_swim_jobs_over_that_many_queues(tmp_path):
    out = tmp_path / "run"
    assert main(["simulate", "--trace", str(DATA / "FB-2009_samples_24_times_1hr_1.head60.tsv"), "--format", "swim",
                 "--limit", "8", "--tenant-count", "2", "--policy", "drf", "--out", str(out), "--no-baseline",
                 "--no-plots", "--no-progress"]) == 0
    decisions = [json.loads(line) for line in (out / "decisions.jsonl").read_text().splitlines()]
    assert {d["tenant"] for d in decisions} == {"q0", "q1"}


def test_tenants_file_gives_a_simulated_workload_the_workers_tree(tmp_path):
    from fairstream.cli import _scenario_from_args, build_parser

    tenants = tmp_path / "tenants.json"
    tenants.write_text(json.dumps({"tenants": [{"id": "prod"}, {"id": "q0", "parent": "prod", "weight": 3},
                                               {"id": "q1", "parent": "prod"}]}))
    args = build_parser().parse_args(["simulate", "--trace", str(DATA / "FB-2009_samples_24_times_1hr_1.head60.tsv"),
                                      "--format", "swim", "--tenant-count", "2", "--tenants", str(tenants),
                                      "--policy", "drf", "--out", str(tmp_path / "o")])
    tree = _scenario_from_args(args).tree
    assert tree.leaves == ["q0", "q1"] and tree.specs["q0"].weight == 3 and tree.specs["q0"].parent == "prod"


@pytest.mark.parametrize("command", [["simulate", "--scenario", "x.json", "--policy", "drf", "--out", "o"],
                                     ["worker", "--policy", "drf"], ["configure", "--cluster", "c"]])
def test_a_number_given_to_tenants_says_it_is_tenant_count_now(command, capsys):
    # --tenants was a count in simulate and emulate and a file in worker and configure.
    with pytest.raises(SystemExit) as exit_:
        main(command + ["--tenants", "4"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.endswith("takes a tenants file (as the worker's); a number of tenants is --tenant-count 4")


def test_swim_trace_simulates_to_completion(tmp_path):
    sc = load_trace(str(DATA / "FB-2009_samples_24_times_1hr_1.head60.tsv"), "swim", limit=40, nodes=5)
    from fairstream.sim.simulator import Simulator

    assert Simulator(sc, "ltrf", {}).run().summary()["unfinished_tasks"] == 0


def test_google_task_events_become_tasks_per_user():
    sc = load_trace(str(DATA / "google-task_events-part-00001.head3000.csv.gz"), "google", nodes=50)
    assert sc.tasks and all(t.duration >= 0 for t in sc.tasks)
    assert all(0 < t.demand["cpu"] + t.demand["mem"] <= 2 for t in sc.tasks)
    assert len(sc.tree.leaves) == len({t.tenant for t in sc.tasks})


def google_row(time_us: int, job: int, index: int, event: int, user: str = "alice", cpu: str = "0.1",
               mem: str = "0.1") -> str:
    return f"{time_us},,{job},{index},,{event},{user},0,0,{cpu},{mem},0,0"


def test_google_tasks_run_from_their_first_schedule_to_their_first_end_and_the_rest_are_left_out(tmp_path):
    part = tmp_path / "part.csv"
    part.write_text("\n".join([
        google_row(5_000_000, 1, 0, 0),            # job 1 task 0 submitted at 5 s: the origin
        google_row(6_000_000, 1, 1, 0, user="bob"),  # submitted, scheduled, never ends: left out
        google_row(7_000_000, 1, 0, 1),            # scheduled at 7 s
        google_row(8_000_000, 1, 1, 1, user="bob"),
        google_row(9_000_000, 1, 0, 2),            # evicted at 9 s: ran 2 s
        google_row(9_500_000, 1, 0, 0),            # resubmitted: still the first submission's task
        google_row(10_000_000, 2, 0, 0, cpu="", mem=""),  # no requests: not a task
        google_row(11_000_000, 2, 0, 0, user="carol"),
        google_row(12_000_000, 2, 0, 1, user="carol"),
        google_row(12_000_000, 2, 0, 4, user="carol"),  # finished at once: ran 0 s
        google_row(13_000_000, 1, 0, 4),           # a later end does not count
    ]) + "\n")
    sc = load_trace(str(part), "google", nodes=2)
    assert [(t.id, t.tenant, t.submit, t.duration) for t in sc.tasks] == [("1-0", "alice", 0.0, 2.0),
                                                                          ("2-0", "carol", 6.0, 0.0)]
    assert list(sc.tree.leaves) == ["alice", "carol"]
    assert sc.name.endswith("(2 tasks, 1 left out)")
    assert [t.id for t in load_trace(str(part), "google", nodes=2, users=1).tasks] == ["1-0"]
    assert [t.id for t in sc.tasks] == ["1-0", "2-0"]  # read again from the file


def test_a_broken_trace_line_is_named(tmp_path):
    bad = tmp_path / "bad.tsv"
    bad.write_text("job0\t1\t1\t10\t0\n")
    with pytest.raises(ModelError, match=r"bad.tsv:1: expected 6 tab-separated columns"):
        load_trace(str(bad), "swim")
    gz = tmp_path / "bad.csv.gz"
    with gzip.open(gz, "wt") as f:
        f.write("1,2,3\n")
    with pytest.raises(ModelError, match="expected 13 columns"):
        load_trace(str(gz), "google")


def test_generated_macro_benchmark_is_seeded_and_round_trips(tmp_path):
    a, b = macro_benchmark(seed=5, scale=0.1), macro_benchmark(seed=5, scale=0.1)
    assert a.to_json() == b.to_json() != macro_benchmark(seed=6, scale=0.1).to_json()
    path = tmp_path / "m.json"
    path.write_text(json.dumps(a.to_json()))
    assert load_scenario(path).to_json() == a.to_json()


@pytest.mark.slow
def test_demo_prints_the_per_queue_table_and_writes_figures(tmp_path, capsys):
    assert main(["demo", "--out", str(tmp_path), "--scale", "0.05", "--no-progress"]) == 0
    out = capsys.readouterr().out
    for queue in ("Facebook", "Purdue", "Spark", "TPC-H"):
        assert queue in out
    assert "sharing loss" in out and "speedup" in out
    # static's loss (-0.001 here) is said why: whole tasks seldom fill a queue's quota exactly.
    assert "(static's loss below 0: a queue's quota is its share of the pooled memory" in out
    assert (tmp_path / "figure5_fairness.png").exists() and (tmp_path / "figure6_speedup.png").exists()
    # Part 2, what long-term fairness buys: Table 1 at cluster scale, stated in one line.
    assert "of the memory used until 900 s, A got 33% under fair and 50% under ltrf (B: 67% and 50%)" in out
    assert (tmp_path / "come_and_go.png").stat().st_size > 0
    parts = json.loads((tmp_path / "summary.json").read_text())["come_and_go"]["share_of_use_until_then"]
    assert parts["fair"]["A"] == pytest.approx(1 / 3, abs=0.005) and parts["ltrf"]["A"] == pytest.approx(0.5, abs=0.005)


def test_metrics_json_reads_back_as_the_metrics_document_with_inf_and_nan_as_null(tmp_path):
    example = Path(__file__).parents[2] / "examples" / "two-tenants.json"
    result = Simulator(load_scenario(example), "drf", {}).run()
    # (a theory's entries are written as given: an unbounded one is inf, an undefined one NaN)
    theory = {"bound": math.inf, "per_knob": {0.5: [math.nan, 1.5, -math.inf]}}
    write_run(result, tmp_path, plots=False, theory=theory)
    written = json.loads((tmp_path / "metrics.json").read_text())
    assert written["knob_theory"] == {"bound": None, "per_knob": {"0.5": [None, 1.5, None]}}
    assert written == json.loads(json.dumps(metrics_document(result, theory=theory)))


def test_explain_prints_qknobler_theory_and_simulate_records_it_with_the_measured_soft_fairness(tmp_path, capsys):
    example = Path(__file__).parents[2] / "examples" / "qknobler-example1.json"
    assert main(["explain", "--scenario", str(example), "--rho", "0", "--rho", "0.5"]) == 0
    theory = json.loads(capsys.readouterr().out)
    # Example 1: phi = 11/12, which is also Theorem 2's sharing-incentive knob (weights sum to 1).
    assert theory["phi"] == pytest.approx(11 / 12) and theory["sharing_incentive_rho"] == pytest.approx(11 / 12)
    assert theory["theta"] == {"0": pytest.approx(2.0), "0.5": pytest.approx(1.2)}
    assert main(["simulate", "--scenario", str(example), "--policy", "qknobler", "--param", "rho=0.5",
                 "--out", str(tmp_path), "--no-plots", "--no-baseline"]) == 0
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["knob_theory"]["theta"] == {"0.5": pytest.approx(1.2)}
    measured = metrics["summary"]["soft_fairness"]
    assert 0 < measured["max"] <= 1.2 and measured == metrics["knob_theory"]["measured_soft_fairness"]


@pytest.mark.parametrize("before, after, steal", [
    # user nice system idle iowait irq softirq steal: 100 of 400 ticks in between were stolen
    pytest.param([0] * 8, [200, 0, 50, 50, 0, 0, 0, 100], 25.0, id="steal is its share of all CPU time in between"),
    pytest.param([0] * 8, [0] * 8, None, id="no time in between: no figure"),
    pytest.param(None, [1] * 8, None, id="no counters (not Linux): no figure"),
])
def test_the_stream_bench_reports_the_cpu_time_the_hypervisor_took(before, after, steal):
    from fairstream.lab.bench_stream import _share_pct

    assert _share_pct(before, after) == steal


def test_the_stream_bench_reports_how_idle_the_machine_was():
    from fairstream.lab.bench_stream import _IDLE, _share_pct

    # user nice system idle iowait irq softirq steal: 60 idle + 20 iowait of 400 ticks
    assert _share_pct([0] * 8, [200, 0, 100, 60, 20, 0, 0, 20], _IDLE) == 20.0


@pytest.mark.parametrize("mapped, shared", [
    pytest.param("7f19-7f1a r-xp 00000000 08:01 42 /root/.pyenv/versions/3.11.7/lib/libpython3.11.so.1.0\n", True,
                 id="an interpreter built with --enable-shared maps libpython"),
    pytest.param("5581-5582 r-xp 00000000 08:01 7 /usr/bin/python3.11\n", False,
                 id="a static interpreter maps none"),
    pytest.param(None, None, id="no maps (not Linux): no figure"),
])
def test_a_benchs_machine_says_whether_its_python_calls_into_a_shared_libpython(tmp_path, mapped, shared):
    from fairstream.lab.bench import _machine, _shared_libpython

    maps = tmp_path / "maps"
    if mapped is not None:
        maps.write_text(mapped)
    assert _shared_libpython(maps) is shared
    assert _machine()["python_shared_library"] in (True, False, None)


def test_the_stream_bench_reads_a_process_cpu_time():
    import os
    import time

    from fairstream.lab.bench_stream import _process_cpu_s

    before = _process_cpu_s(os.getpid())
    deadline = time.process_time() + 0.05
    while time.process_time() < deadline:  # burn 50 ms of CPU
        pass
    assert before is not None and _process_cpu_s(os.getpid()) >= before + 0.03
    assert _process_cpu_s(2 ** 22 + 1) is None  # beyond pid_max: no such process


def test_the_stream_bench_places_the_workers_snapshots_on_its_seconds(tmp_path):
    from fairstream.lab.bench_stream import _logged_at

    log = tmp_path / "worker.log"
    log.write_text(
        '{"event": "worker.start", "timestamp": "2026-11-23T07:54:47.000000Z"}\n'
        # Faust's logger prefixes our JSON with its own; the seconds come from our timestamp
        '[2026-11-23 07:55:51,906] [20119] [WARNING] {"steps": 10331, "event": "worker.snapshot_stored", '
        '"timestamp": "2026-11-23T07:55:52.250000Z"}\n'
        'a line that is not JSON but names "worker.snapshot_stored"\n'
        '{"event": "worker.dead_letter", "reason": "worker.snapshot_stored", "timestamp": "2026-11-23T07:56:00Z"}\n')
    first_submission = 1795420490.0  # 2026-11-23T07:54:50Z
    assert _logged_at(log, "worker.snapshot_stored", first_submission) == [62.2]


def macro_with_times(factor: float):
    """The macro-benchmark (a third of it) with times to the hundredth of a second, all times
    (submissions, durations, delays) multiplied by ``factor``."""
    from fairstream.sim.scenario import parse_scenario
    from fairstream.sim.traces.macro import macro_benchmark

    doc = macro_benchmark(seed=1, scale=0.3).to_json()
    tasks = []
    for task in doc["tasks"]:
        scaled = {key: round(task[key], 2) * factor for key in ("submit", "duration", "delay") if key in task}
        tasks.append({**task, **scaled})
    return parse_scenario({**doc, "tasks": tasks})


@pytest.mark.parametrize("policy, params, params_tenth", [
    pytest.param("drf", {}, {}, id="drf"),
    pytest.param("fair", {}, {}, id="fair"),
    pytest.param("ltrf", {}, {"quantum": "6"}, id="ltrf, its quantum divided by 10 too"),
])
def test_every_time_divided_by_ten_gives_the_same_decisions(policy, params, params_tenth):
    # Times are kept to the microsecond (fairstream.core.model.event_time): without it 0.7 + 0.3 and
    # 1.0 are two instants, two passes with other groupings of events, and other decisions.
    from fairstream.sim.simulator import Simulator

    whole = Simulator(macro_with_times(1.0), policy, params).run().decisions
    tenth = Simulator(macro_with_times(0.1), policy, params_tenth).run().decisions
    assert [(d.task, d.node, d.kind) for d in tenth] == [(d.task, d.node, d.kind) for d in whole]
    assert [d.time for d in tenth] == pytest.approx([d.time / 10 for d in whole], abs=1e-6)


def test_python_dash_m_fairstream_is_the_command_line():
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "fairstream", "policies"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("fifo:")


def test_the_worker_keeps_event_times_to_the_microsecond_as_the_simulator_does():
    from fairstream.wire.events import decode_message

    [decoded] = decode_message("completed", b'{"cluster": "c", "task": "t", "time": 1.1400000000000001}', 65536)
    assert decoded.event.time == 1.14


def test_a_bad_task_among_plain_ones_is_named_by_its_index_in_the_whole_file():
    # Plain tasks skip the schema's (slow) walk; the odd one is still found and named as written.
    doc = with_changes()
    good = doc["tasks"][0]
    doc["tasks"] = [dict(good, id=f"t{k}") for k in range(5)] + [dict(good, id="bad", duration=-1)]
    with pytest.raises(ModelError, match=r"^tasks\[5\]\.duration: -1 is less than the minimum of 0"):
        parse_scenario(doc)


def test_python_m_fairstream_outside_its_environment_says_what_to_run_in_one_line(tmp_path):
    import subprocess
    import sys

    base = getattr(sys, "_base_executable", sys.executable)
    if subprocess.run([base, "-c", "import numpy"], capture_output=True).returncode == 0:
        pytest.skip(f"{base} has numpy: no interpreter without the dependencies to try")
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([base, "-m", "fairstream", "policies"], capture_output=True, text=True, cwd=tmp_path,
                          env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"}, timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr and done.stderr.count("\n") == 1
    assert done.stderr.startswith("fairstream: error: numpy is not installed for ") and "./scripts/demo.sh" in done.stderr


def test_bench_help_says_what_each_of_its_benches_measures(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    text = capsys.readouterr().out
    for bench, says in [("engine", "microseconds per decision"), ("e2e", "placed tasks per second"),
                        ("day", "peak memory"), ("stream", "decision latency"), ("spread", "every policy")]:
        assert any(line.startswith(f"  {bench} ") and says in line + text for line in text.splitlines()), bench


@pytest.mark.parametrize("trace, expected", [
    pytest.param("none", {"skipped": "--trace none"}, id="--trace none skips the trace's simulation"),
    pytest.param("missing.tsv", "fairstream: error: --trace missing.tsv: not found\n",
                 id="a trace named but not found is one line, before anything runs"),
])
def test_bench_engine_trace_is_a_file_or_none(capsys, trace, expected):
    code = main(["bench", "engine", "--tenant-count", "2", "--nodes", "2", "--pending", "4", "--policies", "drf",
                 "--knob-policies", "", "--trace", trace])
    out, err = capsys.readouterr()
    if isinstance(expected, dict):
        assert code == 0 and json.loads(out)["trace_simulation"] == expected
    else:
        assert code == 2 and err == expected and not out


def test_a_reader_that_went_away_ends_the_command_quietly():
    # `fairstream policies | head -1`: the reader has what it wanted; no error line, exit 0.
    import os
    import subprocess
    import sys

    read, write = os.pipe()
    os.close(read)  # gone before the first line is written: every write fails
    try:
        done = subprocess.run([sys.executable, "-m", "fairstream", "policies"], stdout=write, stderr=subprocess.PIPE,
                              text=True, timeout=60)
    finally:
        os.close(write)
    assert (done.returncode, done.stderr) == (0, "")


@pytest.mark.slow
def test_a_command_runs_with_the_workers_collector_settings_and_leaves_them_as_they_were(monkeypatch, tmp_path):
    # The engine runs alike in both drivers: a command that simulates freezes what is loaded
    # and makes full collections rare, as the worker does (fairstream/collector.py), and the
    # process it ran in (here, the tests') gets its own settings back.
    import gc

    from fairstream.collector import FULL_COLLECTION_AFTER
    from fairstream.core.engine import Engine

    seen = []
    step = Engine.step  # (the engine's step, not the simulator's run: the simulator may be compiled)

    def watched(self, time, events):
        seen.append((gc.get_threshold()[2], gc.get_freeze_count() > 10_000))
        return step(self, time, events)

    monkeypatch.setattr(Engine, "step", watched)
    before = gc.get_threshold()
    scenario = tmp_path / "s.json"
    scenario.write_text(json.dumps(macro_benchmark(scale=0.02).to_json()))
    assert main(["simulate", "--scenario", str(scenario), "--policy", "drf", "--no-baseline", "--no-plots",
                 "--out", str(tmp_path / "run")]) == 0
    assert seen and all(entry == (FULL_COLLECTION_AFTER, True) for entry in seen)
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0


@settings(max_examples=300, deadline=None)
@given(steps=st.lists(st.one_of(
    st.tuples(st.just("add"), st.sampled_from([0.0, 1.0, 1.5, 2.0, 7.25]), st.integers(0, 3), st.integers(0, 1)),
    st.just(("pop",))), max_size=60))
def test_the_agenda_gives_each_instants_events_in_the_order_of_one_heap_of_time_kind_and_order(steps):
    # The simulator keeps its events by instant (Agenda); one heap of (time, kind, order) entries,
    # popped while its head has the earliest time, is the order it must give.
    import heapq

    from fairstream.sim.simulator import Agenda

    agenda, heap, counter = Agenda(), [], 0
    for step in steps:
        if step[0] == "add":
            _, time, kind, first = step
            counter += 1
            agenda.add(time, kind, (first, counter), counter)
            heapq.heappush(heap, (time, kind, (first, counter), counter))
            continue
        assert agenda.next_time() == (heap[0][0] if heap else math.inf)
        if not heap:
            continue
        now, events = agenda.pop()
        expected = []
        while heap and heap[0][0] == now:
            expected.append(heapq.heappop(heap)[1:])
        assert events == expected


def folder_bytes(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("failing", [
    pytest.param(["--policy", "no-such-policy"], id="an unknown policy"),
    pytest.param(["--policy", "ltrf", "--param", "round=soon"], id="a bad --param"),
    pytest.param(["--policy", "drf", "interrupted"], id="a run interrupted (Ctrl-C) halfway"),
])
def test_a_failed_or_interrupted_run_leaves_the_previous_output_whole(failing, tmp_path, capsys, monkeypatch):
    # Found by an operator: an unknown policy with an existing --out cut a good
    # decisions.jsonl to 0 bytes and left the old metrics.json and plots beside it.
    path = tmp_path / "s.json"
    path.write_text(json.dumps(ISSUE_EXAMPLE))
    out = tmp_path / "run"
    (out / "notes").mkdir(parents=True)
    (out / "notes" / "mine.txt").write_text("the user's own file")
    assert main(["simulate", "--scenario", str(path), "--policy", "drf", "--out", str(out)]) == 0
    before = folder_bytes(out)
    assert before["decisions.jsonl"] and "metrics.json" in before and "notes/mine.txt" in before
    if failing[-1] == "interrupted":
        failing = failing[:-1]

        def interrupted(self, *args, **kwargs):
            raise KeyboardInterrupt

        monkeypatch.setattr(Simulator, "run", interrupted)
    assert main(["simulate", "--scenario", str(path), "--out", str(out), *failing]) in (2, 130)
    monkeypatch.undo()
    assert folder_bytes(out) == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # nothing half-written is left
    # And a run that succeeds replaces the outputs it writes, beside the user's own files.
    assert main(["simulate", "--scenario", str(path), "--policy", "fifo", "--out", str(out), "--no-plots"]) == 0
    after = folder_bytes(out)
    assert json.loads(after["decisions.jsonl"].splitlines()[0])["policy"] == "fifo"
    assert after["notes/mine.txt"] == b"the user's own file"


def test_a_trace_cut_short_exits_2_in_one_line_unless_partial_input_is_allowed(tmp_path, capsys):
    rows = "".join(f"j{k},u{k % 3},{k},{k + 5},1\n" for k in range(20_000))
    whole = gzip.compress(("job,user,start,end,gpus\n" + rows).encode())
    trace = tmp_path / "cut.csv.gz"
    trace.write_bytes(whole[: len(whole) // 2])
    mapping = tmp_path / "m.json"
    mapping.write_text(json.dumps({"job": "job", "tenant": "user", "submit": "start", "end": "end",
                                   "demand": {"gpu": "gpus"}, "cluster": {"nodes": 4, "capacity": {"gpu": 8}}}))
    argv = ["simulate", "--trace", str(trace), "--format", "table", "--mapping", str(mapping), "--policy", "drf",
            "--no-plots", "--no-baseline", "--limit", "50", "--out", str(tmp_path / "o")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the file ends early (a gzip cut short)" in err and "--allow-partial" in err
    assert not (tmp_path / "o").exists()
    assert main([*argv, "--allow-partial"]) == 0
    assert json.loads(capsys.readouterr().out)["tasks"] == 50


def test_a_replayed_log_explains_itself_at_the_time_asked(tmp_path, capsys):
    # It once wrote no explain/ and exited 0. One node of 1 cpu: t0 runs from 1, t1 waits
    # until t0 ends at 5; at 3, t1 is the one pending task, and after 5 nothing waits.
    from fairstream.core.model import NodeHeartbeat, TaskCompleted, TaskSubmitted
    from fairstream.wire.log import log_step

    steps = [log_step(0, [NodeHeartbeat(node="n1", time=0, capacity={"cpu": 1})]),
             log_step(1, [TaskSubmitted(task=f"t{k}", job=f"t{k}", tenant="A", demand={"cpu": 1}, time=1)
                          for k in range(2)]),
             log_step(5, [TaskCompleted(task="t0", time=5)])]
    log = tmp_path / "steps.jsonl"
    log.write_text("".join(json.dumps(step) + "\n" for step in steps))
    for at, waiting in ((3, ["t1"]), (9, [])):
        out = tmp_path / f"at-{at}"
        assert main(["simulate", "--events", str(log), "--policy", "drf", "--resources", "cpu", "--out", str(out),
                     "--explain-at", str(at)]) == 0
        pending = json.loads((out / "explain" / "pending.json").read_text())
        assert json.loads((out / "explain" / "tenants.json").read_text())
        listed = [entry["id"] for entry in pending["entries"]]
        assert listed == waiting, pending


def test_the_stream_bench_reads_where_the_workers_time_goes_from_its_metrics():
    # What the worker serves at /metrics (streams/stages.py), read back per stage as the bench does.
    import asyncio

    from prometheus_client import generate_latest

    from fairstream.lab.bench_stream import _scrape
    from fairstream.streams.prometheus import WorkerMetrics

    metrics = WorkerMetrics()
    metrics.stages.cpu_ns["step"] = 2_500_000_000
    metrics.stages.wall_ns["persist"] = 1_000_000_000
    metrics.stages.count_batch(40)

    async def scenario():
        async def serve(reader, writer):
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.0 200 OK\r\n\r\n" + generate_latest(metrics.registry))
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        async with server:
            return await _scrape(server.sockets[0].getsockname()[1])

    read = asyncio.run(scenario())
    assert read["cpu:step"] == 2.5 and read["wall:persist"] == 1.0
    assert read["events"] == 40 and read["batches"] == 1


def test_the_stream_bench_curve_puts_each_rates_kept_events_and_latency_side_by_side():
    from fairstream.lab.bench_stream import saturation_curve

    def run(rate, kept, p99):
        return {"setup": {"rate_target": rate}, "offered_events_per_s": rate * 0.97, "events_per_s": kept,
                "undecided": 0, "p50_ms": 20.0, "p99_ms": p99, "cpu_steal_pct": 0.0, "python_loop_ms": 50.0,
                "where_time_goes": {"worker_cpu_pct": rate / 100, "worker_us_per_event": 160.0}}

    curve = saturation_curve([run(1000, 966, 33.0), run(10000, 9629, 171.0)])
    assert [(c["rate_target"], c["events_per_s"], c["p99_ms"], c["worker_cpu_pct"]) for c in curve["curve"]] == [
        (1000, 966, 33.0, 10.0), (10000, 9629, 171.0, 100.0)]
    assert curve["python_loop_ms"] == [50.0, 50.0] and len(curve["runs"]) == 2


def test_the_gpu_cluster_workload_is_seeded_and_has_the_shape_of_the_public_gpu_trace():
    # 1,523 nodes, most of 8 GPUs, some without; 8,152 pods, some asking for a fraction of a GPU,
    # some for none, a few for 8; 40 % at the start, the rest over the day (issue 64).
    from collections import Counter

    from fairstream.sim.traces.gpu_cluster import gpu_cluster

    made = gpu_cluster()
    assert made.to_json() == gpu_cluster().to_json() and made.to_json() != gpu_cluster(seed=2).to_json()
    gpus = Counter(node.capacity["gpu"] for node in made.nodes)
    # floor(share x 1,523) of each type (152, 91, 60, 152), the rest 8-GPU nodes.
    assert gpus == {8.0: 1068, 4.0: 152, 2.0: 91, 1.0: 60, 0.0: 152}
    pods = list(made.tasks)
    asked = Counter("none" if p.demand["gpu"] == 0 else "fraction" if p.demand["gpu"] < 1 else p.demand["gpu"]
                    for p in pods)
    assert len(pods) == 8152 and set(asked) == {"none", "fraction", 1.0, 2.0, 4.0, 8.0}
    assert asked[1.0] > asked["fraction"] > asked["none"] > asked[2.0] > asked[4.0] > asked[8.0]
    assert 0.35 < sum(p.submit == 0 for p in pods) / len(pods) < 0.45 and max(p.submit for p in pods) < 86_400


@pytest.mark.slow
def test_bench_spread_runs_every_policy_on_a_workload_and_hashes_its_decisions(capsys):
    assert main(["bench", "spread", "--policies", "drf,pmdrf", "--workloads", "gpu", "--repeat", "2"]) == 0
    table = json.loads(capsys.readouterr().out)["workloads"]["gpu"]
    assert set(table) == {"drf", "pmdrf"} and table["drf"]["ratio"] == [1.0, 1.0]
    for run in table.values():
        assert run["decisions"] == 8152 and run["unfinished_tasks"] == 0 and run["same_decisions_each_run"]
        assert len(run["wall_s"]) == 2 and len(run["decisions_sha256"]) == 16
