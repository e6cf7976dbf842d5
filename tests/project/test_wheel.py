"""The wheel users install: it ships the package's folders of data (the FLEX model, the trace
mappings, the worker's web page), declared as packages so that setuptools keeps shipping them
(it warned that it would stop)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

DATA_FOLDERS = {
    "fairstream/models/": (ROOT / "fairstream" / "models", "*.json"),
    "fairstream/sim/traces/mappings/": (ROOT / "fairstream" / "sim" / "traces" / "mappings", "*.yaml"),
    "fairstream/streams/web/": (ROOT / "streams" / "web", "*"),
}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> tuple[Path, str]:
    """The wheel ``pip wheel`` builds of the checkout, and what the build printed."""
    out = tmp_path_factory.mktemp("wheel")
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(out), str(ROOT)],
                           capture_output=True, text=True, timeout=900)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    [found] = out.glob("fairstream-*.whl")
    return found, built.stdout + built.stderr


@pytest.mark.slow
def test_the_wheel_ships_every_data_file_and_the_build_warns_of_none(wheel):
    wheel_path, printed = wheel
    assert "is absent from the `packages` configuration" not in printed
    names = set(zipfile.ZipFile(wheel_path).namelist())
    for inside, (folder, pattern) in DATA_FOLDERS.items():
        files = sorted(path.name for path in folder.glob(pattern) if path.is_file())
        assert files and all(inside + name in names for name in files), (inside, files)


@pytest.mark.slow
@pytest.mark.live
def test_the_wheel_installed_in_a_fresh_venv_simulates_and_serves_the_workers_page(wheel, tmp_path):
    # A user's install: the wheel and its dependencies in a venv of their own, run from a folder
    # that is not the checkout (nothing of it on the path). The compiled modules are not in the
    # wheel: mypyc builds them for one interpreter and CPU after an install (scripts/compile.py),
    # and without them everything runs from source (README, "Two commands"; compiled.why_not).
    import json
    import shutil
    import socket
    import time
    import urllib.request

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    installed = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel[0])],
                               capture_output=True, text=True, timeout=1200)
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
    here = tmp_path / "elsewhere"
    here.mkdir()
    shutil.copy(ROOT / "examples" / "two-tenants.json", here / "two-tenants.json")
    fairstream = str(venv / "bin" / "fairstream")
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith(("FAIRSTREAM_", "PYTHON"))}
    simulated = subprocess.run([fairstream, "simulate", "--scenario", "two-tenants.json", "--policy", "drf",
                                "--out", "out", "--no-plots"], cwd=here, env=env, capture_output=True, text=True,
                               timeout=600)
    assert simulated.returncode == 0, simulated.stderr[-3000:]
    assert json.loads(simulated.stdout.splitlines()[-1])["unfinished_tasks"] == 0
    assert (here / "out" / "decisions.jsonl").stat().st_size > 0
    why = subprocess.run([str(venv / "bin" / "python"), "-c", "from fairstream import compiled; print(compiled.why_not())"],
                         cwd=here, env=env, capture_output=True, text=True, timeout=120)
    assert why.returncode == 0 and why.stdout.strip(), why.stderr  # (says why they run from source)

    subprocess.run(["bash", str(ROOT / "scripts" / "services.sh"), "start"], check=True, capture_output=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    app = f"wheel-{time.monotonic_ns()}"
    log = open(tmp_path / "worker.log", "w")
    worker = subprocess.Popen([fairstream, "worker", "--policy", "drf", "--app-id", app, "--topic-prefix", app,
                               "--broker", "127.0.0.1:9092", "--redis", "redis://127.0.0.1:6379/0",
                               "--metrics-port", str(port)], cwd=here, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline, page = time.monotonic() + 120, None
        while page is None and time.monotonic() < deadline:
            assert worker.poll() is None, (tmp_path / "worker.log").read_text()[-3000:]
            try:
                page = urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5).read().decode()
            except OSError:
                time.sleep(0.5)
        assert page is not None and "<html" in page.lower(), (tmp_path / "worker.log").read_text()[-3000:]
        lines = urllib.request.urlopen(f"http://127.0.0.1:{port}/lines.js", timeout=5).read()
        assert lines  # (the page's script, shipped as package data)
    finally:
        worker.terminate()
        worker.wait(60)
