"""``fairstream kubernetes``'s mistakes are one line and exit code 2, never a traceback."""

import subprocess
import sys

import pytest


@pytest.mark.parametrize("args, env, error", [
    (["--kubeconfig", "/nonexistent"], {}, "--kubeconfig /nonexistent: no such file"),
    (["--kubeconfig", "{garbage}"], {}, "not a usable kubeconfig (ParserError"),
    ([], {"KUBECONFIG": "/nonexistent", "HOME": "/nonexistent"}, "not a usable kubeconfig (ConfigError"),
    (["--node-selector", "pool"], {}, "--node-selector pool: give key=value pairs"),
    (["--resources", ","], {}, "--resources: give at least one resource"),
], ids=["a kubeconfig that is not there", "one that is not YAML", "none anywhere", "a selector without =",
        "no resources"])
def test_a_connector_mistake_is_one_line(args, env, error, tmp_path):
    import os

    if "{garbage}" in args:
        bad = tmp_path / "bad.kubeconfig"
        bad.write_text("garbage: [\n")
        args = [str(bad) if a == "{garbage}" else a for a in args]
    done = subprocess.run([sys.executable, "-m", "fairstream.cli", "kubernetes", *args], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("fairstream: error: ") and error in line, line
