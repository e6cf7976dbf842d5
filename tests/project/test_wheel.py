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


@pytest.mark.slow
def test_the_wheel_ships_every_data_file_and_the_build_warns_of_none(tmp_path):
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(tmp_path), str(ROOT)],
                           capture_output=True, text=True, timeout=900)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    assert "is absent from the `packages` configuration" not in built.stdout + built.stderr
    [wheel] = tmp_path.glob("fairstream-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for inside, (folder, pattern) in DATA_FOLDERS.items():
        files = sorted(path.name for path in folder.glob(pattern) if path.is_file())
        assert files and all(inside + name in names for name in files), (inside, files)
