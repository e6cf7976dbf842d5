"""The architecture the folders show holds: who may import whom (docs/architecture.md, "Layout")."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


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


# Who may import whom, for every package (docs/architecture.md, "Layout", says the same and
# why): a package's Python files may import its own modules and those listed here, nothing
# else of fairstream. Imports under ``if TYPE_CHECKING:`` are for annotations and not counted.
MAY_IMPORT = {
    "fairstream/core": ("fairstream._native",),
    "policies": ("fairstream.core",),
    "fairstream/wire": ("fairstream.core.model", "fairstream.core.tenants", "fairstream.schemas"),
    "fairstream/sim": ("fairstream.core", "fairstream.policies", "fairstream.schemas", "fairstream.wire.jsoncodec"),
    "state": ("fairstream.core", "fairstream.policies", "fairstream.wire"),
    "streams": ("fairstream.core", "fairstream.policies", "fairstream.wire", "fairstream.state",
                "fairstream.sim.scenario", "fairstream.collector"),
    "producers": ("fairstream.core.model", "fairstream.wire", "fairstream.sim"),
    "fairstream/lab": ("fairstream.core", "fairstream.policies", "fairstream.sim", "fairstream.wire", "fairstream.state",
                       "fairstream.producers", "fairstream.streams.config", "fairstream.collector",
                       "fairstream.compiled", "fairstream.kube"),
    "fairstream/schemas": (),
    "kube": ("fairstream.wire", "fairstream.producers.client"),
}
PACKAGE_OF_FOLDER = {"fairstream/core": "fairstream.core", "policies": "fairstream.policies",
                     "fairstream/wire": "fairstream.wire", "fairstream/sim": "fairstream.sim", "state": "fairstream.state",
                     "streams": "fairstream.streams", "producers": "fairstream.producers",
                     "fairstream/lab": "fairstream.lab", "fairstream/schemas": "fairstream.schemas",
                     "kube": "fairstream.kube"}


def runtime_imports(path: Path) -> set[str]:
    """What of fairstream ``path`` imports at run time, at any depth of the code: ``import m``
    as ``m``, ``from m import x`` as ``m.x`` (``x`` a module or a name in ``m``)."""
    tree = ast.parse(path.read_text())
    typing_only = {id(sub) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
                   for sub in ast.walk(node)}
    out = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.update(f"{node.module}.{alias.name}" for alias in node.names)  # a module or a name in one
        elif isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
    return {m for m in out if m == "fairstream" or m.startswith("fairstream.")}


def test_every_installed_package_has_a_layer_rule():
    import tomllib

    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    installed, folders = setuptools["packages"], setuptools["package-dir"]
    ruled = PACKAGE_OF_FOLDER.values()

    def folder_of(package: str) -> Path:
        parent = max((p for p in folders if package == p or package.startswith(p + ".")), key=len)
        return ROOT / folders[parent] / package.removeprefix(parent).lstrip(".").replace(".", "/")

    # (``fairstream`` itself, the top: cli and logs, which assemble everything, may import
    # anything; a folder of data alone, no module, imports nothing.)
    assert [p for p in installed if p != "fairstream" and any(folder_of(p).glob("*.py"))
            and not any(p == r or p.startswith(r + ".") for r in ruled)] == []
    assert all(folder_of(p).is_dir() for p in installed)


@pytest.mark.parametrize("folder", sorted(MAY_IMPORT), ids=lambda folder: f"{folder}/ imports only what its layer may")
def test_each_package_imports_only_what_its_layer_may(folder):
    own = PACKAGE_OF_FOLDER[folder]
    allowed = (own,) + MAY_IMPORT[folder]
    broken = sorted(f"{path.relative_to(ROOT)} imports {module}" for path in (ROOT / folder).rglob("*.py")
                    for module in runtime_imports(path)
                    if not any(module == a or module.startswith(a + ".") for a in allowed))
    assert broken == []


def test_the_layer_rule_catches_a_forbidden_import(tmp_path):
    # (The rule above is not vacuous: a file of the wire format importing the engine breaks it.)
    path = tmp_path / "bad.py"
    path.write_text("from fairstream.core.model import Task\nif TYPE_CHECKING:\n    from fairstream.streams import app\n"
                    "def f():\n    from fairstream.core import engine\n")
    assert runtime_imports(path) == {"fairstream.core.model.Task", "fairstream.core.engine"}
    assert not any(module.startswith(allowed + ".") for module in ["fairstream.core.engine"]
                   for allowed in MAY_IMPORT["fairstream/wire"])


#: The most lines a class of the engine or the worker may have (issue 34: a class that does one job
#: fits; one that grows past it is doing several, and its parts want names of their own).
MOST_LINES_PER_CLASS = 300


def classes_over(folder: str, most: int) -> list[str]:
    out = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > most:
                out.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)")
    return out


@pytest.mark.parametrize("folder", ["fairstream/core", "streams"])
def test_no_class_of_the_engine_or_the_worker_is_over_300_lines(folder):
    assert classes_over(folder, MOST_LINES_PER_CLASS) == []


def test_the_class_size_rule_catches_a_large_class():
    assert any(" Engine (" in name for name in classes_over("fairstream/core", 100))  # (over 100, under 300)


def test_the_core_never_imports_the_policies_the_simulator_or_the_worker():
    # One engine, two drivers: the engine is handed a policy (resolved from the registry where
    # it is assembled) and knows no driver. Type-only imports (under TYPE_CHECKING) are allowed.
    outward = {m for m in imported_modules("fairstream/core")
               if m.startswith(("fairstream.policies", "fairstream.sim", "fairstream.lab", "fairstream.streams",
                                "fairstream.state", "fairstream.producers", "fairstream.wire"))}
    assert outward <= {"fairstream.policies.base"}  # PolicySpec, for the engine's signature only
    code = "import sys, fairstream.core.engine; print(sorted(m for m in sys.modules if m.startswith('fairstream.policies')))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "[]"


# A Python that cannot import what ``fairstream[lab]`` adds, as an install without the extra.
WITHOUT_LAB = """
import sys
class WithoutLab:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("matplotlib", "tqdm", "sklearn"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, WithoutLab())
"""


def without_lab(code: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", WITHOUT_LAB + code, *args], capture_output=True, text=True, cwd=ROOT)


def test_the_worker_and_the_producers_run_without_the_lab_extra():
    done = without_lab("import fairstream.streams.app, fairstream.streams.run, fairstream.producers.client, "
                       "fairstream.producers.emulator, fairstream.state.engine_snapshot, fairstream.policies; "
                       "from fairstream.cli import main; sys.exit(main(sys.argv[1:]))", "worker", "--help")
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("extra, code, said", [
    pytest.param(["--no-plots"], 0, "", id="simulate without plots runs without the lab extra"),
    pytest.param([], 2, "fairstream: error: simulate needs matplotlib, which comes with fairstream's lab extra: "
                        "pip install 'fairstream[lab]' (or --no-plots)\n",
                 id="simulate with plots says in one line what to install"),
])
def test_simulate_without_the_lab_extra(tmp_path, extra, code, said):
    done = without_lab("from fairstream.cli import main; sys.exit(main(sys.argv[1:]))", "simulate", "--scenario",
                       "examples/two-tenants.json", "--policy", "drf", "--out", str(tmp_path / "out"), "--progress", *extra)
    assert (done.returncode, done.stderr) == (code, said)


def import_graph(folders: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the modules of the same packages it imports, any import at all: at the top, in
    a function, under ``if TYPE_CHECKING:``. ``folders``: package name -> its folder. ``from p
    import x`` is an import of module ``p.x`` where there is one, else of ``p``."""
    modules = {}
    for package, folder in folders.items():
        for path in sorted(folder.rglob("*.py")):
            parts = [part for part in path.relative_to(folder).with_suffix("").parts if part != "__init__"]
            name = ".".join([package, *parts])
            if not any(name.startswith(other + ".") for other in folders if other != package
                       and other.startswith(package + ".")):  # (a subpackage kept in a folder of its own)
                modules[name] = path
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                targets = [f"{node.module}.{alias.name}" for alias in node.names]
            else:
                continue
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm): each
    is a set of modules that import one another in a circle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for other in sorted(graph[module]):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in on_stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            component = []
            while True:
                other = stack.pop()
                on_stack.discard(other)
                component.append(other)
                if other == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def test_no_module_of_the_package_imports_itself_through_others():
    # Issue 61: the core was one circle of 14 modules (admission, transitions, snapshot and
    # others took the whole engine, typed under TYPE_CHECKING; preemption imported the pass
    # inside a function). Each part now takes the values it reads (a Protocol names them).
    folders = {PACKAGE_OF_FOLDER[folder]: ROOT / folder for folder in PACKAGE_OF_FOLDER}
    folders["fairstream"] = ROOT / "fairstream"
    assert import_cycles(import_graph(folders)) == []


def test_the_cycle_rule_catches_a_circle_through_a_function_or_type_checking(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "a.py").write_text("from pkg.b import B\n")
    (tmp_path / "pkg" / "b.py").write_text("def f():\n    from pkg import c\n")
    (tmp_path / "pkg" / "c.py").write_text("if TYPE_CHECKING:\n    from pkg.a import A\n")
    (tmp_path / "pkg" / "d.py").write_text("import pkg.a\n")
    assert import_cycles(import_graph({"pkg": tmp_path / "pkg"})) == [["pkg.a", "pkg.b", "pkg.c"]]
