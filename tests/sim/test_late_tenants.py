"""Tenants arriving to a busy cluster (fairstream.sim.traces.late_tenants) and the preemption
study that runs on it (fairstream compare-preemption): what the workload is, and what a user
gets back."""

from __future__ import annotations

import json

import pytest

from fairstream.cli import main
from fairstream.core.model import ModelError
from fairstream.sim.traces import load_trace
from fairstream.sim.traces.late_tenants import late_tenants, read_runtimes


def runtimes_file(tmp_path, lines: list[str]):
    path = tmp_path / "runtime.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_the_first_tenant_fills_the_cluster_at_zero_and_the_others_arrive_stagger_apart_with_a_burst():
    scenario = late_tenants(None, seed=4, backlog_jobs=50, jobs_per_tenant=10, stagger_s=3600)
    by_tenant: dict[str, list] = {}
    for spec in scenario.tasks:
        by_tenant.setdefault(spec.tenant, []).append(spec)
    assert sorted(by_tenant) == ["vc0", "vc1", "vc2", "vc3"]
    assert len(by_tenant["vc0"]) == 50 and {s.submit for s in by_tenant["vc0"]} == {0.0}
    # vc<k> arrives at k x 3,600 s with its 10 jobs at once.
    for k in (1, 2, 3):
        assert len(by_tenant[f"vc{k}"]) == 10 and {s.submit for s in by_tenant[f"vc{k}"]} == {k * 3600.0}
    # Long tasks: 1 to 8 hours; a job of g GPUs is one request of g tasks of <1 gpu, 8 GB>.
    assert all(3600 <= s.duration <= 8 * 3600 for s in scenario.tasks)
    assert {s.tasks for s in scenario.tasks} <= {1, 2, 4, 8}
    assert all(s.demand == {"gpu": 1.0, "mem": 8.0} for s in scenario.tasks)
    assert [s.submit for s in scenario.tasks] == sorted(s.submit for s in scenario.tasks)
    # 32 nodes of 8 GPUs: 50 backlog jobs ask for more (at least 50 GPUs, 2.2 a job on average).
    assert len(scenario.nodes) == 32 and scenario.nodes[0].capacity == {"gpu": 8.0, "mem": 64.0}


def test_the_workload_is_seeded():
    assert late_tenants(None, seed=2).to_json() == late_tenants(None, seed=2).to_json()
    assert late_tenants(None, seed=2).to_json() != late_tenants(None, seed=3).to_json()


def test_philly_run_times_are_drawn_from_the_file(tmp_path):
    path = runtimes_file(tmp_path, ["runtime", "0.0", "120.0", "86400.0"])
    scenario = load_trace(str(path), "philly", limit=5, tenants=2, nodes=4)
    # A run time of 0 s counts as 1 s; every other comes from the file.
    assert {s.duration for s in scenario.tasks} <= {1.0, 120.0, 86400.0}
    assert len(scenario.tasks) == 10 * 5 + 5 and len(scenario.nodes) == 4  # backlog: ten times a late tenant's


@pytest.mark.parametrize("lines, message", [
    pytest.param(["seconds", "1"], "runtime.csv:1: expected the header 'runtime'", id="a file without the header"),
    pytest.param(["runtime", "1", "soon"], "runtime.csv:3: a run time must be a number", id="a word among numbers"),
    pytest.param(["runtime", "-5"], "runtime.csv:2: a run time must be finite and >= 0", id="a negative run time"),
    pytest.param(["runtime", "nan"], "runtime.csv:2: a run time must be finite and >= 0", id="not a number"),
    pytest.param(["runtime"], "runtime.csv: no run times", id="a header alone"),
])
def test_a_bad_run_time_file_is_one_error_naming_the_line(tmp_path, lines, message):
    with pytest.raises(ModelError, match=message):
        read_runtimes(runtimes_file(tmp_path, lines))


def test_simulate_runs_the_philly_workload_and_plots_preemptions(tmp_path, capsys):
    path = runtimes_file(tmp_path, ["runtime", *[str(3600 * k) for k in range(1, 9)]])
    out = tmp_path / "run"
    assert main(["simulate", "--trace", str(path), "--format", "philly", "--limit", "10", "--nodes", "4",
                 "--policy", "drf", "--param", "preemption=on", "--no-baseline", "--out", str(out)]) == 0
    summary = json.loads((out / "metrics.json").read_text())["summary"]
    assert summary["unfinished_tasks"] == 0 and summary["preemptions"] > 0
    # A preempted task is placed again: every task placed once, and a placement more per preemption.
    printed = json.loads(capsys.readouterr().out)
    assert printed["placed_tasks"] == summary["placed_tasks"] == summary["tasks"]
    assert printed["task_placements"] == summary["task_placements"] == summary["tasks"] + summary["preemptions"]
    assert (out / "preemption.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_compare_preemption_writes_the_table_the_runs_and_a_figure_per_workload(tmp_path, capsys):
    out = tmp_path / "study"
    assert main(["compare-preemption", "--workloads", "long-tasks", "--policies", "drf", "--timeouts", "60",
                 "--seeds", "1", "--workers", "1", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    study = json.loads((out / "study.json").read_text())
    off, on = study["rows"]
    assert (off["label"], on["label"]) == ("drf, off", "drf, on 60 s") and on["seeds"] == 1
    assert [run["seed"] for run in study["runs"]] == [1, 1] and on["seed_list"] == [1]
    # Long tasks hold the cluster for hours: without preemption the late tenants wait far longer
    # than the timeout; with it, each is starved (below half its share) from its arrival, so it
    # holds its share 60 s after it arrives, at the price of work lost.
    assert off["late_ttfs_mean"] > 3600 and on["late_ttfs_mean"] == 60.0
    assert off["work_lost"] == 0 and on["work_lost"] > 0 and on["preemptions"] > 0
    table = (out / "table.md").read_text()
    assert "| long-tasks | drf, on 60 s | 60 |" in table
    # The table is printed, not only pointed to, and the last line says where the rest is.
    assert printed.startswith(table) and printed.rstrip().splitlines()[-1].startswith("2 settings, 2 runs; in ")
    assert (out / "preemption-long-tasks.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_settings_row_is_the_mean_over_its_seeds_with_their_range():
    # (The command above runs one seed: a long-tasks run takes half a minute.)
    from fairstream.lab.preemption_study import MEASURED, aggregate

    def run(seed, late_ttfs_mean, vc1_ttfs):
        return {"workload": "long-tasks", "policy": "drf", "label": "drf, on 60 s", "preemption": "on", "timeout": 60.0,
                "threshold": 0.5, "seed": seed, **dict.fromkeys(MEASURED, 1.0), "late_ttfs_mean": late_ttfs_mean,
                "makespan": 1000.0, "tenants": {"vc1": {"time_to_fair_share": vc1_ttfs}}, "allocation": {"seed": seed}}

    [row] = aggregate([run(1, 60.0, 60.0), run(2, 90.0, None), run(3, None, 120.0)])
    assert (row["seeds"], row["seed_list"]) == (3, [1, 2, 3])
    # A seed with no figure is left out of its mean; a tenant that never reached its share counts as the run.
    assert (row["late_ttfs_mean"], row["late_ttfs_mean_range"]) == (75.0, (60.0, 90.0))
    assert row["tenants"]["vc1"]["time_to_fair_share"] == (60.0 + 1000.0 + 120.0) / 3
    assert row["allocation"] == {"seed": 1}  # the first seed's series


@pytest.mark.parametrize("argv, message", [
    pytest.param(["--policies", "fifo"], "--policies fifo: not a policy with preemption", id="a policy without preemption"),
    pytest.param(["--workloads", "swim"], "--workloads swim: unknown workload", id="an unknown workload"),
    pytest.param(["--timeouts", "-1"], "--timeouts: seconds must be >= 0", id="a negative timeout"),
    pytest.param(["--trace", "/nonexistent/philly.csv"], "cannot read", id="a missing run-time file"),
])
def test_compare_preemption_input_errors_are_one_line(tmp_path, capsys, argv, message):
    assert main(["compare-preemption", "--out", str(tmp_path / "o"), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


@pytest.mark.parametrize("workload", ["long-tasks", "philly"])
def test_generate_writes_the_workload_as_a_scenario_file_that_loads_back(workload, tmp_path, capsys):
    from fairstream.sim.scenario import load_scenario
    from fairstream.sim.traces.late_tenants import DEFAULT_PHILLY

    path = tmp_path / "w.json"
    argv = ["generate", workload, "--seed", "3", "--out", str(path)]
    if workload == "philly":
        runtimes = runtimes_file(tmp_path, ["runtime", "60", "7200"])
        argv += ["--trace", str(runtimes)]
        expected = late_tenants(read_runtimes(runtimes), name="philly", seed=3)
    else:
        expected = late_tenants(None, seed=3)
    # The default is the workspace's whole file where it is beside the checkout, else the
    # excerpt every clone has: it exists either way (a user's clone once had none).
    assert DEFAULT_PHILLY.name in ("philly_runtime.csv", "philly_runtime.head100.csv") and DEFAULT_PHILLY.exists()
    assert main(argv) == 0
    assert load_scenario(path).to_json() == expected.to_json()


def test_with_gangs_a_job_of_several_gpus_is_a_gang_of_all_of_them():
    plain = late_tenants(None, seed=4, backlog_jobs=50, jobs_per_tenant=10)
    gangs = late_tenants(None, seed=4, backlog_jobs=50, jobs_per_tenant=10, gangs=True)
    assert all(s.gang is None for s in plain.tasks)
    assert [(s.id, s.count) for s in gangs.tasks] == [(s.id, s.count) for s in plain.tasks]  # the same jobs
    assert all(s.gang == s.count if s.count else s.gang is None for s in gangs.tasks)
    assert any(s.gang for s in gangs.tasks)


@pytest.mark.parametrize("preemption", [[], ["--timeout", "60"]], ids=["preemption off", "preemption on"])
def test_compare_gangs_writes_a_row_per_policy_and_gangs_off_and_on(tmp_path, capsys, preemption):
    path = runtimes_file(tmp_path, ["runtime", "600", "3600", "7200"])
    assert main(["compare-gangs", "--policies", "drf", "--seeds", "1", "--limit", "5", "--trace", str(path),
                 "--workers", "1", "--out", str(tmp_path / "o"), "--no-progress", *preemption]) == 0
    rows = json.loads((tmp_path / "o" / "study.json").read_text())["rows"]
    assert [(r["policy"], r["gangs"]) for r in rows] == [("drf", "off"), ("drf", "on")]
    if preemption:  # (a task may start several times: not measured)
        assert rows[1]["partial_idle_gpu_hours"] is None and rows[1]["gpu_utilisation"] is None
    else:
        assert rows[1]["partial_idle_gpu_hours"] == 0  # a gang's tasks start at one instant
    assert "| drf | on |" in capsys.readouterr().out
