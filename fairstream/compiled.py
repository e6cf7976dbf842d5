"""The engine's Python modules compiled to C with mypyc, used in place of their sources only
when built from exactly those sources.

The modules listed in ``MODULES`` are plain, type-annotated Python; mypyc compiles them to one
C extension (``scripts/compile.py``, which ``scripts/bootstrap.sh`` runs after each install: a
second run with the same sources does nothing). The build goes to ``build/compiled/`` beside
the package, never next to the sources, with a manifest of the SHA-256 of every source of the package (the compiled modules are
compiled against the types of what they import, so those count too). At ``import fairstream``,
``install`` puts a finder first on ``sys.meta_path`` that serves the compiled modules, but only
if every source is the one they were compiled with: one edited source turns all of them off
(compiled modules call each other directly, so one stale module could not be left out alone),
and the sources run as written. Without a C compiler or mypy, nothing is built and everything runs from source.

The sources stay the reference: ``tests/core/test_compiled.py`` runs seven workloads in a
process with the compiled modules and in one without, and requires the same decisions, metrics
and summary, byte for byte. ``FAIRSTREAM_COMPILED=0`` in the environment turns them off (as
``FAIRSTREAM_NATIVE=0`` turns off the Rust pass, ``core/native.py``). docs/architecture.md,
"The compiled modules".
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import os
import sys
from pathlib import Path

#: The modules compiled, by file under the repository's root (the hot path of a step: the
#: simulator's loop, the events' and decisions' transitions and the engine parts they touch).
MODULES = (
    "fairstream/sim/simulator.py",
    "fairstream/core/transitions.py",
    "fairstream/core/workload.py",
    "fairstream/core/candidates.py",
    "fairstream/core/jobs.py",
    "fairstream/core/nodes.py",
    "fairstream/core/verdicts.py",
    "fairstream/core/reservation.py",
    "fairstream/core/accounting.py",
    "fairstream/core/placement.py",
    "fairstream/core/fit.py",
    "fairstream/core/queues.py",
)

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build" / "compiled"
MANIFEST = "manifest.json"

UP_TO_DATE = "compiled modules up to date"

_active: tuple[str, ...] = ()  # the module names served compiled in this process
_why_not = "not looked for yet"


def _module_name(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".")


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


#: Where the package's sources are (pyproject.toml's package-dir): every one is in a build's stamp.
SOURCE_DIRS = ("fairstream", "policies", "state", "streams", "producers", "kube")


def _sources() -> dict[str, str]:
    """The SHA-256 of every Python source of the package, by path: the compiled modules', and
    those of every module they import. mypyc compiles a call to an imported function with the
    types that function had then: a type-correct edit of a module left as source (a helper of
    ``core/admission.py`` returning a list instead of a tuple) made compiled ``workload.py``
    raise ``TypeError`` while a stamp of the compiled sources alone still served it. (About
    6 ms of every start, for 115 files.)"""
    return {str(path.relative_to(ROOT)): _digest(path)
            for folder in SOURCE_DIRS for path in sorted((ROOT / folder).rglob("*.py"))}


def _mypy_version() -> str | None:
    """The installed compiler's version (``pyproject.toml``'s extra ``compile`` pins it)."""
    from importlib import metadata

    try:
        return metadata.version("mypy")
    except metadata.PackageNotFoundError:
        return None


def _stamp(compiler: bool = True) -> dict:
    """What a build is made from: the sources, the interpreter and (``compiler``) mypy's
    version. ``install`` leaves the compiler out: a build of the same sources by another mypy
    still runs them (and ``importlib.metadata`` is 20 ms of every start); ``build``
    builds them again."""
    stamp = {"sources": _sources(), "python": sys.implementation.cache_tag}
    return {**stamp, "mypy": _mypy_version()} if compiler else stamp


def build_needed() -> bool:
    """Whether ``build`` would compile: no build, or one of other sources, interpreter or mypy."""
    try:
        return json.loads((BUILD / MANIFEST).read_text())["stamp"] != _stamp()
    except (OSError, ValueError, KeyError, TypeError):
        return True


class _Finder:
    """Serves the compiled modules (and the library they share) by name, from ``BUILD``."""

    def __init__(self, files: dict[str, Path]) -> None:
        self.files = files

    def find_spec(self, name: str, path=None, target=None):
        file = self.files.get(name)
        if file is None:
            return None
        loader = importlib.machinery.ExtensionFileLoader(name, str(file))
        return importlib.util.spec_from_file_location(name, file, loader=loader)


def install() -> None:
    """Serve the compiled modules in this process if they are built from the sources as they
    are (and not turned off); otherwise leave imports alone. Called by ``import fairstream``,
    before any listed module is imported."""
    global _active, _why_not
    if _active:
        return
    if os.environ.get("FAIRSTREAM_COMPILED", "1") == "0":
        _why_not = "turned off (FAIRSTREAM_COMPILED=0)"
        return
    try:
        manifest = json.loads((BUILD / MANIFEST).read_text())
        fresh = {key: manifest["stamp"][key] for key in ("sources", "python")} == _stamp(compiler=False)
        names = {_module_name(path): BUILD / file for path, file in manifest["files"].items()}
        names[manifest["library"]] = BUILD / manifest["library_file"]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        _why_not = "not built (scripts/compile.py)"
        return
    if not fresh:
        _why_not = "built from other sources: run scripts/compile.py again"
        return
    if any(name in sys.modules for name in names):
        _why_not = "a compiled module was imported from source first"
        return
    sys.meta_path.insert(0, _Finder(names))
    _active = tuple(sorted(_module_name(path) for path in manifest["files"]))
    _why_not = ""


def active() -> tuple[str, ...]:
    """The modules this process runs compiled (empty: all from source)."""
    return _active


def why_not() -> str:
    """Why no module runs compiled ('' when they do)."""
    return _why_not


def build() -> str:
    """Compile ``MODULES`` into ``BUILD`` unless the build there is of the same sources,
    interpreter and compiler. Returns what it did, in one line; raises ``RuntimeError`` with
    the compiler's last lines if it failed (the sources then run as they are)."""
    import shutil
    import subprocess
    import tempfile

    if not build_needed():
        return UP_TO_DATE
    stamp = _stamp()
    if importlib.util.find_spec("mypyc") is None:
        raise RuntimeError("mypyc is not installed (pip install -e '.[compile]')")
    # Made aside and put in place at the end: a process starting meanwhile finds the old build
    # whole (stale, so not served) or the new one whole, never half of one.
    staging, old = BUILD.with_name(BUILD.name + ".new"), BUILD.with_name(BUILD.name + ".old")
    shutil.rmtree(staging, ignore_errors=True)
    with tempfile.TemporaryDirectory(prefix="fairstream-mypyc-") as work:
        # mypyc builds in and below the directory it runs in (its setup.py, the C sources,
        # the extensions at their modules' paths): a scratch one, not the repository, whose
        # pyproject.toml setuptools would read.
        # (Imported modules are read for their types, their own errors not reported: only the
        # compiled ones must type-check.)
        for path in MODULES:  # (where build_ext --inplace puts each extension)
            (Path(work) / path).parent.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "mypyc", "--ignore-missing-imports", "--follow-imports=silent",
                   "--cache-dir", str(Path(work) / "cache"), *(str(ROOT / path) for path in MODULES)]
        done = subprocess.run(command, cwd=work, capture_output=True, text=True)
        if done.returncode != 0:
            tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
            raise RuntimeError(f"mypyc failed:\n{tail}")
        suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
        libraries = [p for p in Path(work).glob(f"*__mypyc{suffix}")]
        if len(libraries) != 1:
            raise RuntimeError(f"mypyc built {len(libraries)} shared libraries, not one")
        files = {}
        for path in MODULES:
            built = Path(work) / (path.removesuffix(".py") + suffix)
            target = Path(path).parent / built.name
            (staging / target).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(built, staging / target)
            files[path] = str(target)
        shutil.copy2(libraries[0], staging / libraries[0].name)
    library = libraries[0].name.removesuffix(suffix)
    manifest = {"stamp": stamp, "files": files, "library": library, "library_file": libraries[0].name}
    (staging / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    shutil.rmtree(old, ignore_errors=True)
    if BUILD.exists():
        BUILD.rename(old)
    staging.rename(BUILD)
    shutil.rmtree(old, ignore_errors=True)
    return f"compiled {len(MODULES)} modules into {BUILD}"
