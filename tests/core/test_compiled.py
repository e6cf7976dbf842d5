"""The engine's modules compiled with mypyc (``fairstream/compiled.py``): served only when built
from the sources as they are, and deciding and measuring exactly as the sources do."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fairstream import compiled
from fairstream.lab.bench import DAY_TRACES
from fairstream.sim.traces.busy import busy_cluster
from fairstream.sim.traces.swim import swim_day

ROOT = Path(__file__).resolve().parents[2]
SWIM = ROOT / "tests" / "data" / "FB-2009_samples_24_times_1hr_1.head60.tsv"


def test_the_engines_modules_run_compiled_after_the_install():
    # scripts/bootstrap.sh compiles them (scripts/compile.py); a build that fell back to the
    # sources, or one an edit left stale, fails here and says what to run.
    assert compiled.active() == tuple(sorted(compiled._module_name(path) for path in compiled.MODULES)), \
        compiled.why_not()


def _manifest(build: Path, stamp: dict) -> None:
    build.mkdir(parents=True, exist_ok=True)
    (build / compiled.MANIFEST).write_text(json.dumps(
        {"stamp": stamp, "files": {}, "library": "none__mypyc", "library_file": "none__mypyc.so"}))


@pytest.mark.parametrize("change, why", [
    pytest.param(lambda stamp: stamp, "", id="a build of these sources, by this interpreter and compiler, is served"),
    pytest.param(lambda stamp: {**stamp, "sources": {**stamp["sources"], compiled.MODULES[0]: "0" * 64}},
                 "built from other sources", id="one source edited since the build: none is served"),
    pytest.param(lambda stamp: {**stamp, "sources": {**stamp["sources"], "fairstream/core/admission.py": "0" * 64}},
                 "built from other sources",
                 id="a module the compiled ones import, itself run from source, edited since the build: none is served"),
    pytest.param(lambda stamp: {**stamp, "python": "cpython-0"}, "built from other sources",
                 id="a build by another interpreter is not served"),
    pytest.param(lambda stamp: {**stamp, "mypy": "0.0"}, "",
                 id="a build of these sources by another mypy is served (and built again by the next install)"),
])
def test_the_compiled_modules_are_served_only_when_built_from_the_sources_as_they_are(
        monkeypatch, tmp_path, change, why):
    monkeypatch.setattr(compiled, "BUILD", tmp_path)
    monkeypatch.setattr(compiled, "_active", ())
    monkeypatch.setattr(compiled, "_why_not", compiled._why_not)
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    before = list(sys.meta_path)
    _manifest(tmp_path, change(compiled._stamp()))
    compiled.install()
    if why:
        assert compiled.active() == () and why in compiled.why_not() and sys.meta_path == before
    else:  # (the manifest lists no module: nothing already imported is shadowed)
        assert sys.meta_path[1:] == before and isinstance(sys.meta_path[0], compiled._Finder)
        assert compiled.why_not() == ""
    assert compiled.build_needed() == (change(compiled._stamp()) != compiled._stamp())


def test_a_builds_stamp_covers_every_module_the_compiled_ones_import_transitively():
    # A type-correct edit of core/admission.py (not compiled) once made compiled workload.py
    # raise TypeError while the guard, which hashed only the compiled sources, still served it.
    import ast

    stamped = set(compiled._sources())
    by_module = {compiled._module_name(path): path for path in stamped}
    for installed, folder in (("fairstream.policies", "policies"), ("fairstream.state", "state"),
                              ("fairstream.streams", "streams"), ("fairstream.producers", "producers"),
                              ("fairstream.kube", "kube")):
        by_module.update({name.replace(folder, installed, 1): path for name, path in by_module.items()
                          if name.startswith(folder + ".") or name == folder})
    seen, todo = set(), [compiled._module_name(path) for path in compiled.MODULES]
    while todo:
        module = todo.pop()
        if module in seen or module == "fairstream._native":  # (Rust: built by the install, not by mypyc)
            continue
        seen.add(module)
        path = by_module.get(module) or by_module.get(module + ".__init__")
        assert path is not None, f"{module} is imported by a compiled module but not in a build's stamp"
        for node in ast.walk(ast.parse((ROOT / path).read_text())):  # (function-local imports too)
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("fairstream"):
                todo += [node.module, *(f"{node.module}.{alias.name}" for alias in node.names
                                        if f"{node.module}.{alias.name}" in by_module)]
            elif isinstance(node, ast.Import):
                todo += [alias.name for alias in node.names if alias.name.startswith("fairstream")]
    assert "fairstream.core.admission" in seen and len(seen) > len(compiled.MODULES)


def test_without_a_build_everything_runs_from_source(monkeypatch, tmp_path):
    monkeypatch.setattr(compiled, "BUILD", tmp_path / "nothing")
    monkeypatch.setattr(compiled, "_active", ())
    monkeypatch.setattr(compiled, "_why_not", compiled._why_not)
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    compiled.install()
    assert compiled.active() == () and "not built" in compiled.why_not()


# A run of each below in a process with the compiled modules and in one without: the bytes of
# decisions.jsonl, metrics.json and the summary the command prints. The busy workload (small) with a node lost and back, under
# the flat policies with reservations, backfill and preemption; a SWIM trace read as the run
# reaches it (map and reduce stages) under hltrf; two hours of the SWIM day under drf.
RUNS = [
    ("busy", "drf", []), ("busy", "fair", ["--param", "reservation=backfill"]), ("busy", "ltrf", []),
    ("busy", "drf", ["--param", "preemption=on", "--param", "preemption_timeout=5"]),
    ("busy", "tetris", []), ("swim", "hltrf", ["--param", "t_wait=10"]),
    ("day", "drf", []),  # (every tenant above its share: a sharing loss of 0, a float)
]

_RUN = """
import contextlib, hashlib, io, sys
from pathlib import Path
from fairstream import compiled
from fairstream.cli import main
out = Path(sys.argv[1])
for k, (source, policy, extra) in enumerate(eval(sys.argv[2])):
    where = {"busy": ["--scenario", sys.argv[3]], "day": ["--scenario", sys.argv[5]],
             "swim": ["--trace", sys.argv[4], "--format", "swim", "--limit", "40"]}[source]
    said = io.StringIO()
    with contextlib.redirect_stdout(said):
        assert main(["simulate", *where, "--policy", policy, *extra, "--no-baseline", "--no-plots", "--out", str(out / str(k))]) == 0
    files = [(out / str(k) / name).read_bytes() for name in ("decisions.jsonl", "metrics.json")]
    print("RUN", policy, *(hashlib.sha256(data).hexdigest() for data in [*files, said.getvalue().encode()]))
print("compiled:", len(compiled.active()))
"""


def _run_all(tmp_path: Path, name: str, runs: list, scenario: Path, day: Path, compiled_modules: bool) -> list[str]:
    env = {**os.environ, "FAIRSTREAM_COMPILED": "1" if compiled_modules else "0"}
    done = subprocess.run([sys.executable, "-c", _RUN, str(tmp_path / name), repr(runs), str(scenario), str(SWIM), str(day)],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return [line for line in done.stdout.splitlines() if line.startswith(("RUN ", "compiled:"))]


@pytest.mark.slow
def test_a_run_with_the_compiled_modules_decides_and_measures_to_the_bit_as_the_sources(tmp_path):
    document = busy_cluster(tenants=8, nodes=30, jobs=40, tasks_per_job=12, arrival_s=200.0).to_json()
    document["events"] = [{"time": 60.0, "type": "node_lost", "node": "n03"},
                          {"time": 90.0, "type": "node_heartbeat", "node": "n03", "capacity": {"cpu": 16.0, "mem": 64.0}}]
    scenario, day = tmp_path / "busy.json", tmp_path / "day.json"
    scenario.write_text(json.dumps(document))
    runs = RUNS
    if all(path.exists() for path in DAY_TRACES):
        day.write_text(json.dumps(swim_day([str(path) for path in DAY_TRACES], nodes=60, hours=2).to_json()))
    else:  # (the SWIM samples are in ../shared/traces/swim/)
        runs = [run for run in RUNS if run[0] != "day"]
    # (into the same folder, one after the other: the summary names it)
    with_compiled = _run_all(tmp_path, "runs", runs, scenario, day, True)
    from_source = _run_all(tmp_path, "runs", runs, scenario, day, False)
    assert with_compiled[-1] == f"compiled: {len(compiled.MODULES)}" and from_source[-1] == "compiled: 0"
    assert len(with_compiled) == len(runs) + 1 and with_compiled[:-1] == from_source[:-1]
