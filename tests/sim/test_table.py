"""Bring your own trace (issue "tabular loader"): ``--format table`` reads any CSV/TSV through a
column mapping; the shipped mappings read the public traces; rows that cannot be used are
counted per reason, and a mapping error is one line naming the field and the column."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from fairstream.cli import main
from fairstream.core.model import ModelError
from fairstream.sim.traces.google import load_google
from fairstream.sim.traces.table import TableWorkload, load_table, read_mapping, read_node_table

DATA = Path(__file__).resolve().parents[1] / "data"
GOOGLE = DATA / "google-task_events-part-00001.head3000.csv.gz"
ALIBABA = DATA / "alibaba-2017-batch_task.head300.csv"
MACHINES = DATA / "alibaba-2018-machine_meta.head60.csv"
PHILLY = DATA / "philly_runtime.head100.csv"


def test_the_google_mapping_gives_the_same_tasks_as_format_google():
    ours, theirs = load_table(str(GOOGLE), "google-2011"), load_google(str(GOOGLE))
    assert list(ours.tasks) == list(theirs.tasks) and len(list(ours.tasks)) == 64
    assert ours.tree.leaves == theirs.tree.leaves
    assert [(n.id, n.capacity) for n in ours.nodes] == [(n.id, n.capacity) for n in theirs.nodes]
    assert ours.tasks.sorted  # the part is in time order: the second pass streams it


def test_the_alibaba_2017_mapping_reads_batch_task_with_the_2018_machines_as_nodes():
    scenario = load_table(str(ALIBABA), "alibaba-2017", nodes_table=str(MACHINES), nodes_mapping="alibaba-2018-nodes")
    tasks = list(scenario.tasks)
    # 300 rows: 265 Terminated (kept), 35 Failed, Running or Waiting (left out by keep).
    assert len(tasks) == 265 and scenario.tasks.left_out == {"not kept (keep)": 35}
    # (A row is a request: its instance_num tasks, 118,699 in all, not 265.)
    assert "265 requests of 118699 tasks; left out: 35 not kept (keep)" in scenario.name
    first = tasks[0]
    # Row "6457,6533,3,5,1,Terminated,50,0.004395206": the earliest creation in the excerpt, so
    # submit 0; runs 6533 - 6457 = 76 s; 50 hundredths of a core = 0.5; memory 0.0043952 of a
    # machine x 100 (2018's 0-100 scale) = 0.43952; one instance: a single task "3-5".
    assert (first.id, first.job, first.submit, first.duration, first.count) == ("3-5", "3", 0.0, 76.0, None)
    assert first.demand == pytest.approx({"cpu": 0.5, "mem": 0.4395206})
    assert [t.submit for t in tasks] == sorted(t.submit for t in tasks)  # the file is not in order: sorted
    assert not scenario.tasks.sorted
    # Requests: a row of number_of_instances N > 1 is one request of N tasks.
    assert sum(t.tasks for t in tasks) > len(tasks)
    # 60 machine rows: 15 machines (each repeats per state change), 96 cores, 100 memory units.
    assert len(scenario.nodes) == 15 and "nodes left out: 45 a node seen before" in scenario.name
    assert scenario.nodes[0].capacity == {"cpu": 96.0, "mem": 100.0}
    assert scenario.nodes[0].labels == {"failure_domain_1": "219", "failure_domain_2": "17"}
    assert scenario.tree.leaves == ["q0", "q1", "q2", "q3"]


def test_the_philly_mapping_makes_one_gpu_job_a_minute_from_the_run_times():
    scenario = load_table(str(PHILLY), "philly")
    tasks = list(scenario.tasks)
    runtimes = [float(line) for line in PHILLY.read_text().splitlines()[1:]]
    assert [t.duration for t in tasks] == runtimes
    assert [t.submit for t in tasks[:3]] == [0.0, 60.0, 120.0]
    assert [t.tenant for t in tasks[:5]] == ["q0", "q1", "q2", "q3", "q0"]
    assert tasks[0].demand == {"gpu": 1.0, "mem": 8.0} and len(scenario.nodes) == 32


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


MAPPING = {"job": "job", "task": "task", "tenant": "user", "submit": {"column": "t", "unit": 0.001},
           "duration": "d", "demand": {"cpu": {"column": "mcpu", "factor": 0.001}, "gpu": {"columns": ["g", "share"]}},
           "cluster": {"nodes": 2, "capacity": {"cpu": 4, "gpu": 2}}}


def test_rows_that_cannot_be_used_are_counted_per_reason(tmp_path):
    table = write(tmp_path / "t.csv", "job,task,user,t,d,mcpu,g,share\n"
                  "j1,0,alice,1000,5,500,1,0.5\n"      # kept: submit 1 s, cpu 0.5, gpu 1 x 0.5
                  "j1,1,alice,2000,5,,1,0.5\n"         # missing demand.cpu
                  "j2,0,bob,x,5,500,0,0\n"             # submit not a number
                  "j2,1,bob,3000,-1,500,0,0\n"         # negative duration
                  "j3,0,carol,4000,5,0,0,0\n"          # asks for nothing
                  "j3,1,,5000,5,100,0,0\n"             # missing tenant
                  "j4,0,dave,6000,7,250,2,0.25\n")     # kept
    scenario = load_table(table, MAPPING)
    tasks = list(scenario.tasks)
    assert [(t.id, t.tenant, t.submit, t.duration) for t in tasks] == [("j1-0", "alice", 0.0, 5.0),
                                                                       ("j4-0", "dave", 5.0, 7.0)]
    assert tasks[0].demand == {"cpu": 0.5, "gpu": 0.5} and tasks[1].demand == {"cpu": 0.25, "gpu": 0.5}
    assert scenario.tasks.left_out == {"missing demand.cpu": 1, "submit not a number": 1, "negative duration": 1,
                                       "asks for nothing": 1, "missing tenant": 1}


@pytest.mark.parametrize("change, message", [
    pytest.param({"demand": {"cpu": "cpus"}}, "mapping.demand.cpu.column: no column 'cpus' in the file (columns: job, "
                 "task, user", id="a column the file does not have"),
    pytest.param({"tenant": {"round_robin": 0}}, "mapping.tenant.round_robin: a whole number >= 1",
                 id="a bad round robin"),
    pytest.param({"duration": None}, "mapping.duration: give duration or end", id="neither duration nor end"),
    pytest.param({"speed": 1}, "mapping.speed: unknown field", id="an unknown field"),
    pytest.param({"submit": {"column": "t", "divide_by": 0}}, "mapping.submit.divide_by: a number > 0",
                 id="dividing by zero"),
    pytest.param({"constraints": {"column": "user"}}, "mapping.constraints.kind: nodes", id="constraints without kind"),
    pytest.param({"job": None, "events": {"column": "t", "submit": [0], "start": [1], "end": [2]}},
                 "mapping.job: required with events", id="events without a job column"),
])
def test_a_bad_mapping_is_one_line_naming_the_field(tmp_path, change, message):
    table = write(tmp_path / "t.csv", "job,task,user,t,d,mcpu,g,share\nj1,0,a,1,5,500,1,1\n")
    mapping = {k: v for k, v in {**MAPPING, **change}.items() if v is not None}
    with pytest.raises(ModelError) as error:
        load_table(table, mapping)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_the_command_line_says_a_mapping_error_in_one_line_and_runs_a_good_one(tmp_path, capsys):
    table = write(tmp_path / "t.tsv", "job\ttask\tuser\tt\td\tmcpu\tg\tshare\nj1\t0\ta\t0\t5\t500\t1\t1\n")
    bad = write(tmp_path / "bad.yaml", "job: jobid\n")
    assert main(["simulate", "--trace", table, "--format", "table", "--mapping", bad, "--policy", "drf",
                 "--no-baseline", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fairstream: error: mapping.jobid") or "mapping.job: no column 'jobid'" in err
    assert err.count("\n") == 1
    assert main(["simulate", "--trace", table, "--format", "table", "--policy", "drf", "--no-baseline",
                 "--out", str(tmp_path / "o")]) == 2
    assert "--format table needs --mapping" in capsys.readouterr().err
    good = write(tmp_path / "good.json", json.dumps(MAPPING))
    assert main(["simulate", "--trace", table, "--format", "table", "--mapping", good, "--policy", "drf",
                 "--no-baseline", "--no-progress", "--out", str(tmp_path / "o")]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["placed_tasks"] == 1 and "none left out" in summary["scenario"]


def test_constraints_counts_gzip_and_a_file_without_a_header(tmp_path):
    path = tmp_path / "t.csv.gz"
    with gzip.open(path, "wt") as handle:
        handle.write("j1,0,a,0,5,1000,n1;n2,3\nj2,0,b,1,5,1000,zone=a;gpu=yes,1\nj3,0,c,2,5,1000,zone,1\n")
    mapping = {"file": {"header": False}, "job": 0, "task": 1, "tenant": 2, "submit": 3, "duration": 4,
               "demand": {"cpu": {"column": 5, "factor": 0.001}}, "count": 7,
               "constraints": {"column": 6, "kind": "nodes"}, "cluster": {"nodes": 2, "capacity": {"cpu": 4}}}
    tasks = list(load_table(str(path), mapping).tasks)
    assert tasks[0].constraints == {"nodes": ["n1", "n2"]} and tasks[0].count == 3
    labels = {**mapping, "constraints": {"column": 6, "kind": "labels"}}
    workload = load_table(str(path), labels).tasks
    assert [t.constraints for t in workload] == [{"labels": {"gpu": "yes", "zone": "a"}}]
    assert workload.left_out == {"constraints not key=value labels": 2}


def test_a_node_table_counts_rows_it_cannot_use(tmp_path):
    nodes = write(tmp_path / "n.csv", "id,cores,gb,rack\nm1,8,32,r1\nm1,8,32,r1\nm2,,32,r2\nm3,4,16,\n")
    specs, left = read_node_table(nodes, {"id": "id", "capacity": {"cpu": "cores", "mem": "gb"}, "labels": {"rack": "rack"}})
    assert [(s.id, s.capacity, s.labels) for s in specs] == [("m1", {"cpu": 8.0, "mem": 32.0}, {"rack": "r1"}),
                                                             ("m3", {"cpu": 4.0, "mem": 16.0}, {})]
    assert left == {"a node seen before": 1, "missing capacity.cpu": 1}


def test_a_table_is_read_as_the_simulation_reaches_it():
    # The workload is not a list of tasks: each pass reads the file (a file in submit order
    # streams; TableWorkload keeps per task a line number, a submit time and a run time).
    workload = load_table(str(PHILLY), "philly").tasks
    assert isinstance(workload, TableWorkload) and not isinstance(workload, list)
    first = next(iter(workload))
    assert first.id == "2" and len(workload) == 100


def test_a_file_not_in_submit_order_is_given_in_order_window_by_window(monkeypatch):
    # Windows of 7 tasks: the Alibaba excerpt's 265 tasks take 38 passes, in the same order.
    from fairstream.sim.traces import table

    whole = [t.id for t in load_table(str(ALIBABA), "alibaba-2017").tasks]
    monkeypatch.setattr(table, "WINDOW", 7)
    assert [t.id for t in load_table(str(ALIBABA), "alibaba-2017").tasks] == whole


# ------------------------------------------------------------------ what an operator's trace has
# (issue 33: cells left empty, misspelt keys, a copy cut short, constraints "any of")


GPU_TRACE = ("job,user,start,end,gpus\n"
             "a,u1,100,160,1\n"       # both times: submit 100 s, runs 60 s
             "b,u1,,130,2\n"          # no start: submitted before the trace began
             "c,u2,120,,1\n"          # no end: still running when the trace ended
             "d,u2,140,150,\n")       # no GPU count


@pytest.mark.parametrize("fields, expected, left_out", [
    pytest.param({}, [("a", 0.0, 60.0)], {"missing submit": 1, "missing end": 1, "missing demand.gpu": 1},
                 id="without if_missing a row with an empty cell is left out, per reason"),
    pytest.param({"submit": {"column": "start", "if_missing": "trace_start"}},
                 # b starts at the earliest submit read (100): origin 0, runs 130 - 100 = 30 s.
                 [("a", 0.0, 60.0), ("b", 0.0, 30.0)], {"missing end": 1, "missing demand.gpu": 1},
                 id="a missing start is the trace's start"),
    pytest.param({"end": {"column": "end", "if_missing": "trace_end"}},
                 # c runs to the latest time read (160, a's end): 160 - 120 = 40 s.
                 [("a", 0.0, 60.0), ("c", 20.0, 40.0)], {"missing submit": 1, "missing demand.gpu": 1},
                 id="a missing end is the trace's end"),
    pytest.param({"demand": {"gpu": {"column": "gpus", "if_missing": 1}}},
                 [("a", 0.0, 60.0), ("d", 40.0, 10.0)], {"missing submit": 1, "missing end": 1},
                 id="a missing demand takes the value given"),
    pytest.param({"submit": {"column": "start", "if_missing": "trace_start"},
                  "end": {"column": "end", "if_missing": "trace_end"}, "demand": {"gpu": {"column": "gpus", "if_missing": 1}}},
                 [("a", 0.0, 60.0), ("b", 0.0, 30.0), ("c", 20.0, 40.0), ("d", 40.0, 10.0)], {},
                 id="all three: every row kept"),
])
def test_empty_cells_take_what_if_missing_says(tmp_path, fields, expected, left_out):
    table = write(tmp_path / "gpu.csv", GPU_TRACE)
    mapping = {"job": "job", "tenant": "user", "submit": "start", "end": "end", "demand": {"gpu": "gpus"},
               "cluster": {"nodes": 1, "capacity": {"gpu": 8}}, **fields}
    workload = load_table(table, mapping).tasks
    assert [(t.job, t.submit, t.duration) for t in workload] == expected
    assert workload.left_out == left_out


@pytest.mark.parametrize("change, message", [
    pytest.param({"demand": {"gpu": {"column": "gpus", "factr": 2}}},
                 "mapping.demand.gpu.factr: unknown key (keys: column, columns, divide_by, factor, if_missing, unit, value)",
                 id="a misspelt factor"),
    pytest.param({"submit": {"column": "start", "orign": 0}}, "mapping.submit.orign: unknown key",
                 id="a misspelt origin"),
    pytest.param({"file": {"delimter": ";"}}, "mapping.file.delimter: unknown key (keys: columns, delimiter, header)",
                 id="a misspelt delimiter"),
    pytest.param({"tenant": {"colum": "user"}}, "mapping.tenant.colum: unknown key", id="a misspelt tenant column"),
    pytest.param({"keep": {"column": "user", "in": ["u1"], "out": ["u2"]}}, "mapping.keep.out: unknown key",
                 id="a key keep does not have"),
    pytest.param({"cluster": {"node": 2, "capacity": {"gpu": 8}}}, "mapping.cluster.node: unknown key",
                 id="a misspelt cluster size"),
    pytest.param({"end": {"column": "end", "if_missing": "trace_start"}},
                 "mapping.end.if_missing: a number >= 0 or trace_end, got 'trace_start'", id="the trace's start as an end"),
    pytest.param({"demand": {"gpu": {"column": "gpus", "if_missing": "trace_end"}}},
                 "mapping.demand.gpu.if_missing: a number >= 0, got 'trace_end'", id="a time as a demand"),
])
def test_a_key_the_mapping_does_not_know_is_refused_at_every_level(tmp_path, change, message):
    table = write(tmp_path / "gpu.csv", GPU_TRACE)
    mapping = {"job": "job", "tenant": "user", "submit": "start", "end": "end", "demand": {"gpu": "gpus"},
               "cluster": {"nodes": 1, "capacity": {"gpu": 8}}, **change}
    with pytest.raises(ModelError) as error:
        load_table(table, mapping)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_a_gzip_cut_short_is_refused_and_with_allow_partial_gives_its_good_rows_and_counts_the_rest(tmp_path):
    rows = "".join(f"j{k},u{k % 3},{k},{k + 5},1\n" for k in range(20_000))
    whole = gzip.compress(("job,user,start,end,gpus\n" + rows).encode())
    path = tmp_path / "cut.csv.gz"
    path.write_bytes(whole[: len(whole) * 2 // 3])
    mapping = {"job": "job", "tenant": "user", "submit": "start", "end": "end", "demand": {"gpu": "gpus"},
               "cluster": {"nodes": 1, "capacity": {"gpu": 8}}}
    # A script running the command must notice (it once ran what it read and exited 0).
    with pytest.raises(ModelError, match=r"cut\.csv\.gz: the file ends early \(a gzip cut short\): nothing after "
                                         r"line \d+ read \(\d+ tasks before the cut\); --allow-partial runs what was read$"):
        load_table(str(path), mapping)
    scenario = load_table(str(path), mapping, allow_partial=True)
    tasks = list(scenario.tasks)
    (reason, count), = scenario.tasks.left_out.items()
    assert reason.startswith("the file ends early (a gzip cut short): nothing after line ") and count == 1
    last_line = int(reason.rsplit(" ", 2)[-2])
    assert 1_000 < len(tasks) < 20_000 and len(tasks) in (last_line - 1, last_line - 2)  # the last row may be cut too
    assert [t.job for t in tasks] == [f"j{k}" for k in range(len(tasks))]
    assert "ends early" in scenario.name and scenario.name.endswith(" on 1 nodes")


def test_the_scenario_line_says_how_many_nodes_were_loaded(tmp_path):
    table = write(tmp_path / "gpu.csv", GPU_TRACE)
    mapping = {"job": "job", "tenant": "user", "submit": "start", "end": "end", "demand": {"gpu": "gpus"},
               "cluster": {"nodes": 3, "capacity": {"gpu": 8}}}
    assert load_table(table, mapping).name.endswith(" on 3 nodes")
    assert load_table(str(ALIBABA), "alibaba-2017", nodes_table=str(MACHINES),
                      nodes_mapping="alibaba-2018-nodes").name.endswith(" on 15 nodes; nodes left out: 45 a node seen before")


def test_label_constraints_may_allow_any_of_several_values(tmp_path):
    table = write(tmp_path / "c.csv", "job,user,start,end,gpus,needs\n"
                  "a,u1,0,10,1,gpu=V100|P100;zone=a\n"
                  "b,u1,0,10,1,gpu=K80\n"
                  "c,u1,0,10,1,gpu=|\n")            # no value: left out
    mapping = {"job": "job", "tenant": "user", "submit": "start", "end": "end", "demand": {"gpu": "gpus"},
               "constraints": {"column": "needs", "kind": "labels"}, "cluster": {"nodes": 1, "capacity": {"gpu": 8}}}
    workload = load_table(table, mapping).tasks
    assert [t.constraints for t in workload] == [{"labels": {"gpu": ["P100", "V100"], "zone": "a"}},
                                                 {"labels": {"gpu": "K80"}}]
    assert workload.left_out == {"constraints not key=value labels": 1}


def test_the_google_different_machine_flag_becomes_max_per_node_1(tmp_path):
    # Column 13 of task_events: "if true, the task must run on a different machine than any other
    # currently running task in the job". The shipped mapping leaves it out (as --format google
    # and QKnobler's simulation do); one line adds it. 0: no limit. (In the excerpt in tests/data
    # every flagged task never ran, so two tasks of one job in the trace's own columns here:
    # time, missing, job, task, machine, event, user, class, priority, cpu, mem, disk, flag.)
    part = write(tmp_path / "task_events.csv", "0,,7,0,,0,userA,0,0,0.1,0.1,0,1\n"
                                                "0,,7,1,,0,userA,0,0,0.1,0.1,0,0\n"
                                                "1000000,,7,0,m1,1,userA,0,0,0.1,0.1,0,1\n"
                                                "1000000,,7,1,m1,1,userA,0,0,0.1,0.1,0,0\n"
                                                "5000000,,7,0,m1,4,userA,0,0,0.1,0.1,0,1\n"
                                                "5000000,,7,1,m1,4,userA,0,0,0.1,0.1,0,0\n")
    mapping = {**read_mapping("google-2011"), "max_per_node": "different_machine"}
    assert [(t.id, t.constraints) for t in load_table(part, mapping).tasks] == [("7-0", {"max_per_node": 1}),
                                                                               ("7-1", None)]
    assert [t.constraints for t in load_table(part, "google-2011").tasks] == [None, None]


def test_max_per_node_from_a_column_or_one_value_for_every_task(tmp_path):
    table = write(tmp_path / "m.csv", "job,user,start,end,gpus,spread,needs\n"
                  "a,u1,0,10,1,2,zone=a\n"
                  "b,u1,0,10,1,0,\n"       # 0: no limit
                  "c,u1,0,10,1,1.5,\n")    # not whole: left out
    mapping = {"job": "job", "tenant": "user", "submit": "start", "end": "end", "demand": {"gpu": "gpus"},
               "constraints": {"column": "needs", "kind": "labels"}, "max_per_node": "spread",
               "cluster": {"nodes": 1, "capacity": {"gpu": 8}}}
    workload = load_table(table, mapping).tasks
    assert [t.constraints for t in workload] == [{"labels": {"zone": "a"}, "max_per_node": 2}, None]
    assert workload.left_out == {"max_per_node not a whole number": 1}
    every = load_table(table, {**mapping, "max_per_node": {"value": 1}}).tasks
    assert [t.constraints for t in every] == [{"labels": {"zone": "a"}, "max_per_node": 1}, {"max_per_node": 1},
                                              {"max_per_node": 1}]


SWIM = DATA / "FB-2009_samples_24_times_1hr_1.head60.tsv"


@pytest.mark.parametrize("fmt, source, options", [
    pytest.param("swim", SWIM, {}, id="a SWIM trace"),
    pytest.param("google", GOOGLE, {}, id="a Google task_events part (shipped gzip-compressed)"),
    pytest.param("philly", PHILLY, {"limit": 3}, id="the Philly run times"),
    pytest.param("table", ALIBABA, {"mapping": "alibaba-2017"}, id="a table through a mapping"),
])
def test_a_gzip_compressed_trace_is_read_as_such_whatever_its_name(tmp_path, fmt, source, options):
    # A gzip copy saved without ".gz" once failed with "'utf-8' codec can't decode byte 0x8b":
    # the loaders open a trace by its first bytes (fairstream/sim/traces/files.py), not its name.
    from fairstream.sim.traces import load_trace

    text = gzip.decompress(source.read_bytes()) if source.suffix == ".gz" else source.read_bytes()
    plain, packed = tmp_path / "plain.trace", tmp_path / "packed.trace"
    plain.write_bytes(text)
    packed.write_bytes(gzip.compress(text))

    def tasks(path):
        return [(t.id, t.tenant, t.submit, t.duration, t.demand) for t in load_trace(str(path), fmt, **options).tasks]

    assert tasks(packed) == tasks(plain) and tasks(plain)


def test_a_request_is_a_gang_of_all_its_tasks_or_of_what_a_column_says(tmp_path):
    table = write(tmp_path / "g.csv", "job,user,start,end,gpus,workers,least\n"
                  "a,u1,0,10,1,8,4\n"
                  "b,u1,0,10,1,1,1\n"     # one task: no gang
                  "c,u1,0,10,1,2,3\n")    # more than its count: left out
    mapping = {"job": "job", "tenant": "user", "submit": "start", "end": "end", "demand": {"gpu": "gpus"},
               "count": "workers", "gang": "least", "cluster": {"nodes": 1, "capacity": {"gpu": 8}}}
    workload = load_table(table, mapping).tasks
    assert [(t.count, t.gang) for t in workload] == [(8, 4), (None, None)]
    assert workload.left_out == {"gang not a whole number up to count": 1}
    whole = load_table(table, {**mapping, "gang": {"whole": True}}).tasks
    assert [(t.count, t.gang) for t in whole] == [(8, 8), (None, None), (2, 2)]
    with pytest.raises(ModelError, match="mapping.gang: needs count"):
        load_table(table, {k: v for k, v in mapping.items() if k != "count"})
