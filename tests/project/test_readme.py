"""The README's examples are tests: every command block of its Simulate, Policies, Scenario files,
Benchmarks and Streaming sections runs as written (its two set-up commands run in CI's own script), in a clean copy of the repository (the files git tracks
and the ones it does not ignore: nothing a developer's tree has besides), with the installed
``fairstream`` first on PATH as ``source .venv/bin/activate`` puts it, and nothing beside the
copy (a user's clone has no ``../shared``: the examples read the excerpts in ``tests/data``).
A README change that breaks an example fails here.
The Streaming block runs whole, in the README's order (services, worker, then the producers),
against a Kafka broker and Redis server that ``scripts/services.sh`` of the copy starts on
ports of their own, so that nothing else on the machine shares its topics or keys.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent  # where the installed `fairstream` is
README = (ROOT / "README.md").read_text()


def section(title: str) -> str:
    """The text of the README's ``## title`` section."""
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", README, re.M | re.S)
    assert match, f"README has no section {title!r}"
    return match.group(1)


def blocks(title: str, language: str = "") -> list[str]:
    """The fenced blocks of a section with the given info string ("" for plain ones)."""
    return re.findall(rf"^```{language}\n(.*?)^```", section(title), re.M | re.S)


def commands(block: str) -> list[str]:
    """A block's commands: lines continued with a backslash joined; blank and comment-only lines
    (a comment continued from the line above) dropped."""
    lines = (c.strip() for c in re.sub(r"\\\n\s*", " ", block).splitlines())
    return [c for c in lines if c and not c.startswith("#")]


def bare(command: str) -> str:
    """A command without its trailing comment."""
    return re.sub(r"\s+#.*$", "", command)


@pytest.fixture(scope="module")
def clean_copy(tmp_path_factory) -> Path:
    """The repository as a fresh clone has it, alone in its folder (no ``../shared``)."""
    base = tmp_path_factory.mktemp("clone")
    copy = base / "fairstream"
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():  # a tracked file deleted in the working tree is not there
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, copy / name)
    return copy


def user_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAIRSTREAM_")}
    return {**env, "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}", **extra}


def run_as_written(command: str, cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess:
    done = subprocess.run(["bash", "-c", command], cwd=cwd, env=user_env(), capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, f"{command}\nexit {done.returncode}\n{done.stderr[-3000:]}"
    assert "Traceback" not in done.stderr
    return done


def _ids(items: list[str]) -> list[str]:
    return [f"{k + 1}: {c[:90]}" for k, c in enumerate(items)]


SIMULATE = [c for b in blocks("Simulate") for c in commands(b)] + commands(blocks("Seeing why")[0])
POLICIES = [c for b in blocks("Policies") for c in commands(b)]
BENCHMARKS = [c for b in blocks("Benchmarks") for c in commands(b)]


STREAMING = commands(blocks("Streaming")[0])
KUBERNETES = commands(blocks("Kubernetes")[0])
QUERIES = commands(blocks("Seeing why")[1])  # run after the Streaming block, with it
#: The README's two commands: CI's own script runs them as written (checked below), so the
#: suite does not run them again (one is the suite).
RUN_BY_CI = {"./scripts/demo.sh", "./scripts/test.sh"}


def quoted_commands() -> list[str]:
    """Every command of the README's plain code blocks (the diagram of Architecture aside),
    without trailing comments."""
    titles = re.findall(r"^## (.+)$", README, re.M)
    return [bare(c) for title in titles if title != "Architecture" for b in blocks(title) for c in commands(b)]


def test_every_command_the_readme_quotes_runs_as_written_in_a_test_or_in_ci():
    run_here = {bare(c) for c in SIMULATE + POLICIES + BENCHMARKS + STREAMING + QUERIES + KUBERNETES}
    quoted = quoted_commands()
    unaccounted = [c for c in quoted if c not in run_here and c not in RUN_BY_CI]
    assert not unaccounted, f"README commands no test runs as written: {unaccounted}"
    assert RUN_BY_CI <= set(quoted), "the README's two commands are not quoted as RUN_BY_CI has them"


def test_no_command_the_readme_quotes_reads_what_a_users_clone_lacks():
    # ``../shared`` is this project's workspace, not part of the repository: a user's clone has
    # none, and the examples failed there (the excerpts in tests/data work from any clone).
    assert [c for c in quoted_commands() if "../shared" in c] == []


def test_ci_runs_the_readmes_two_commands_as_written():
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    for command in sorted(RUN_BY_CI):
        assert any(line == command or line.startswith(command + " ") for line in ci), f".ci/run does not run {command}"


def test_every_fairstream_command_the_readme_quotes_is_one_the_command_line_accepts():
    # A quoted command that cannot run as written (a missing --policy or --out, an option that
    # does not exist) fails here, whether or not a test runs it.
    import shlex

    from fairstream.cli import build_parser

    parser = build_parser()
    # (And the full-size bench commands docs/benchmarks.md quotes.)
    benchmarks = (ROOT / "docs" / "benchmarks.md").read_text()
    documented = [c for b in re.findall(r"^```\n(.*?)^```", benchmarks, re.M | re.S) for c in commands(b)]
    assert any(c.startswith("fairstream bench e2e") for c in documented)
    for command in quoted_commands() + [bare(c) for c in documented]:
        for part in re.split(r"&&|\|", command):
            words = shlex.split(part.strip().rstrip("&").strip())
            if words and words[0] == "fairstream":
                try:
                    parser.parse_args(words[1:])
                except SystemExit:
                    raise AssertionError(f"the command line refuses: {part.strip()}") from None


def test_the_readme_has_the_blocks_these_tests_run():
    # So that a reshuffled README cannot make the tests below run nothing.
    assert len(SIMULATE) >= 3 and len(POLICIES) >= 4 and len(BENCHMARKS) >= 2
    assert blocks("Scenario files", "json") and len(blocks("Streaming")) == 1
    assert len(blocks("Kubernetes")) == 1 and len(KUBERNETES) >= 8


@pytest.mark.slow
@pytest.mark.parametrize("command", SIMULATE, ids=_ids(SIMULATE))
def test_each_simulate_example_runs_as_written(command, clean_copy):
    done = run_as_written(command, clean_copy)
    out = clean_copy / re.search(r"--out (\S+)", command).group(1)
    printed = json.loads(done.stdout.splitlines()[-1])
    assert printed["unfinished_tasks"] == 0 and printed["decisions"] > 0
    assert (out / "decisions.jsonl").stat().st_size > 0 and json.loads((out / "metrics.json").read_text())["summary"]


@pytest.mark.slow
@pytest.mark.parametrize("command", POLICIES, ids=_ids(POLICIES))
def test_each_policies_example_runs_as_written(command, clean_copy):
    done = run_as_written(command, clean_copy)
    if command.startswith("fairstream compare-preemption"):  # its table, then where the files are
        assert done.stdout.startswith("| workload | policy, preemption |") and " runs; in " in done.stdout.splitlines()[-1]
        return
    if command.startswith("fairstream compare-gangs"):
        assert done.stdout.startswith("| policy | gangs |") and "24 runs; in " in done.stdout.splitlines()[-1]
        return
    printed = json.loads(done.stdout if command.startswith("fairstream explain") else done.stdout.splitlines()[-1])
    assert printed


@pytest.mark.slow
@pytest.mark.parametrize("command", BENCHMARKS, ids=_ids(BENCHMARKS))
def test_each_benchmark_example_runs_as_written_and_prints_json(command, clean_copy):
    done = run_as_written(command, clean_copy)
    printed = json.loads(done.stdout)
    assert printed["benchmark"] == command.split()[2] and printed["policies"]


def test_the_scenario_file_example_is_a_valid_scenario_that_simulates(clean_copy):
    [document] = blocks("Scenario files", "json")
    path = clean_copy / "readme-scenario.json"
    path.write_text(document)
    for policy in ("drf", "tsf"):
        done = run_as_written(f"fairstream simulate --scenario {path.name} --policy {policy} --out out/readme-{policy}",
                              clean_copy)
        assert json.loads(done.stdout)["tasks"] == 11  # t1 and r-0 ... r-9


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


@pytest.mark.live
@pytest.mark.slow
def test_the_streaming_example_runs_as_written_in_the_readmes_order(clean_copy):
    [block] = blocks("Streaming")
    queries = QUERIES
    with socket.socket() as probe:  # the page's port: taken by another worker here, curl would ask that one
        if probe.connect_ex(("127.0.0.1", 9464)) == 0:
            queries = [q for q in queries if not q.startswith("curl")]
    # Then Seeing why's queries, as a user runs them once the emulator has played (all done by then).
    script = "\n".join(commands(block) + queries)
    kafka, controller, sasl, ssl, sasl_ssl, redis = free_ports(6)
    services = {"FAIRSTREAM_KAFKA_PORT": str(kafka), "FAIRSTREAM_KAFKA_CONTROLLER_PORT": str(controller),
                "FAIRSTREAM_KAFKA_SASL_PORT": str(sasl), "FAIRSTREAM_KAFKA_SSL_PORT": str(ssl),
                "FAIRSTREAM_KAFKA_SASL_SSL_PORT": str(sasl_ssl), "FAIRSTREAM_REDIS_PORT": str(redis),
                "TMPDIR": str(clean_copy)}  # services.sh notes its TLS folder there, not for the suite's broker
    env = user_env(**services, FAIRSTREAM_BROKER=f"127.0.0.1:{kafka}", FAIRSTREAM_REDIS_URL=f"redis://127.0.0.1:{redis}/0")
    # The worker's default metrics port may be taken by another worker on this machine: it
    # then goes on without the endpoint (README), which is not what this test is about.
    # Output to files: the worker the block leaves in the background keeps them open, so a
    # pipe would never reach its end.
    out, err = clean_copy / "streaming.out", clean_copy / "streaming.err"
    with open(out, "w") as stdout_file, open(err, "w") as stderr_file:
        process = subprocess.Popen(["bash", "-e", "-c", script], cwd=clean_copy, env=env, stdout=stdout_file,
                                   stderr=stderr_file, start_new_session=True)
    try:
        process.wait(timeout=600)
    finally:
        os.killpg(process.pid, signal.SIGTERM)  # the worker the block left in the background
        subprocess.run(["bash", "scripts/services.sh", "stop"], cwd=clean_copy, env=env, capture_output=True)
    stdout, stderr = out.read_text(), err.read_text()
    assert process.returncode == 0, stderr[-3000:]
    assert "Traceback" not in stderr
    # The background worker shares the terminal: Faust writes cursor hide/show sequences to it.
    lines = []
    for line in stdout.splitlines():
        if "{" in line:
            try:  # (curl ends without a newline: Faust's cursor sequence may follow on its line)
                lines.append(json.loads(line[line.index("{"):line.rindex("}") + 1]))
            except ValueError:
                pass  # a text line with a brace in it (a demand in `pending`'s table)
    report = next(line for line in lines if "completed" in line)  # the emulator's
    assert report["completed"] == report["tasks"] > 0 and not report["over_committed"]
    assert stdout.count("cluster prod at event time") >= 3  # what `fairstream status` (twice) and `pending` printed
    if any(q.startswith("curl") for q in queries):
        assert any(line.get("cluster") == "prod" and "tenants" in line for line in lines)  # the curl's document
    decided = [line for line in lines if line.get("kind") == "place"]  # what `fairstream tail` printed
    # SWIM jobs are requests: a decision may place several of a job's tasks, listed in tasks.
    assert len({task for d in decided for task in d.get("tasks", [d["task"]])}) == report["tasks"]
    assert {d["tenant"] for d in decided} <= {"q0", "q1", "q2", "q3"}  # examples/tenants.json's leaves


@pytest.mark.live
@pytest.mark.slow
def test_the_kubernetes_example_runs_as_written_in_the_readmes_order(clean_copy):
    # The README's Kubernetes block as a user runs it, in a clean copy, on a control plane that
    # the copy's scripts/kube.sh starts (binaries from the cache the suite's run built) and
    # Kafka and Redis of its own, all on ports of their own.
    with socket.socket() as probe:
        if probe.connect_ex(("127.0.0.1", 9464)) == 0:  # the worker's default port: the connector reads it
            pytest.fail("127.0.0.1:9464 is taken: the README's worker and connector need it")
    [block] = blocks("Kubernetes")
    kafka, controller, sasl, ssl, sasl_ssl, redis, apiserver, etcd = free_ports(8)
    services = {"FAIRSTREAM_KAFKA_PORT": str(kafka), "FAIRSTREAM_KAFKA_CONTROLLER_PORT": str(controller),
                "FAIRSTREAM_KAFKA_SASL_PORT": str(sasl), "FAIRSTREAM_KAFKA_SSL_PORT": str(ssl),
                "FAIRSTREAM_KAFKA_SASL_SSL_PORT": str(sasl_ssl), "FAIRSTREAM_REDIS_PORT": str(redis),
                "FAIRSTREAM_APISERVER_PORT": str(apiserver), "FAIRSTREAM_ETCD_PORT": str(etcd),
                "TMPDIR": str(clean_copy)}
    env = user_env(**services, FAIRSTREAM_BROKER=f"127.0.0.1:{kafka}", FAIRSTREAM_REDIS_URL=f"redis://127.0.0.1:{redis}/0")
    out, err = clean_copy / "kubernetes.out", clean_copy / "kubernetes.err"
    with open(out, "w") as stdout_file, open(err, "w") as stderr_file:
        process = subprocess.Popen(["bash", "-e", "-c", "\n".join(commands(block))], cwd=clean_copy, env=env,
                                   stdout=stdout_file, stderr=stderr_file, start_new_session=True)
    try:
        process.wait(timeout=900)
    finally:
        os.killpg(process.pid, signal.SIGTERM)  # the worker and the connector the block left running
        for script in ("kube.sh", "services.sh"):
            subprocess.run(["bash", f"scripts/{script}", "stop"], cwd=clean_copy, env=env, capture_output=True)
    stdout, stderr = out.read_text(), err.read_text()
    assert process.returncode == 0, stderr[-3000:]
    assert "Traceback" not in stderr
    # kubectl describe: the condition, and the worker's reason as an Event from fairstream.
    assert re.search(r"PodScheduled\s+False", stdout), stdout[-3000:]
    assert re.search(r"Waiting\s+.*fairstream\s+fairstream: ", stdout), stdout[-3000:]
    assert stdout.count("condition met") == 1 + 12 + 1 + 3  # team-b-5's reason, every pod's end; train-1's reason, the gang's ends
    # Two pods of the gang alone wait for the third, and say so.
    assert "fairstream: waits for the pods of its PodGroup train: 2 of the 3 that must start together exist" in stdout
