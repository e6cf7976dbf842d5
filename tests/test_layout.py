"""The architecture the folders show holds: who may import whom (docs/architecture.md, "Layout")."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def imported_modules(folder: str) -> set[str]:
    """Every module the Python files of ``folder`` import, at any depth of the code."""
    out = set()
    for path in (ROOT / folder).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                out.add(node.module)
            elif isinstance(node, ast.Import):
                out.update(alias.name for alias in node.names)
    return out


@pytest.mark.parametrize("module, heavy", [
    pytest.param("fairstream.producers.client", ("fairstream.core.engine", "fairstream.policies", "fairstream.streams",
                                                 "redis", "faust"),
                 id="the public Publisher loads neither the engine, the policies, the worker, Redis nor Faust"),
    pytest.param("fairstream.wire.events", ("fairstream.core.engine", "fairstream.policies", "fairstream.streams", "redis",
                                            "faust", "aiokafka"),
                 id="the wire format loads nothing of the worker and no Kafka client"),
])
def test_a_module_loads_only_what_it_needs(module, heavy):
    code = f"import sys, {module}; print(sorted(m for m in sys.modules if m.startswith({heavy!r})))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == "[]"


def test_the_producers_never_import_the_worker():
    assert not {m for m in imported_modules("producers") if m.startswith("fairstream.streams")}


def test_the_core_never_imports_the_policies_the_simulator_or_the_worker():
    # One engine, two drivers: the engine is handed a policy (resolved from the registry where
    # it is assembled) and knows no driver. Type-only imports (under TYPE_CHECKING) are allowed.
    outward = {m for m in imported_modules("fairstream/core")
               if m.startswith(("fairstream.policies", "fairstream.sim", "fairstream.lab", "fairstream.streams",
                                "fairstream.state", "fairstream.producers", "fairstream.wire"))}
    assert outward <= {"fairstream.policies.base"}  # PolicySpec, for the engine's signature only
    code = "import sys, fairstream.core.engine; print(sorted(m for m in sys.modules if m.startswith('fairstream.policies')))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "[]"
