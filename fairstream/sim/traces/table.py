"""Bring your own trace: any CSV/TSV (optionally gzipped) read through a column mapping.

A mapping (JSON or YAML) says which column is what; ``docs/workloads.md`` has the reference and
``fairstream/sim/traces/mappings/`` the ones shipped for the public traces. Two row models:

- one row per task, or per request of ``count`` identical tasks (Alibaba's ``batch_task``):
  ``submit`` and ``duration`` (or ``end``) on the row;
- one row per task *event* (``events``: Google 2011's ``task_events``): a task is ``(job,
  task)``; its first submission gives its submit time, demand and tenant, its run time is from
  its first start to the first end after it. Tasks that never ran or never ended in the file are
  left out.

Rows that cannot be used are counted per reason (``TableWorkload.left_out``) and reported in the
scenario's name, never dropped silently; a mapping that names a column the file does not have
is one ``ModelError`` line naming the mapping field and the column.

Read lazily: a first pass checks every row, counts, and keeps per usable task its line number,
submit time, run time and tenant code (32 bytes); the tasks are built from a second pass as the
simulation reaches them. A file whose tasks are not in submit order is ordered by a sort of
those numbers and read again once per ``WINDOW`` tasks of that order, so memory stays bounded
either way.
"""

from __future__ import annotations

import csv
import gzip
import json
import math
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np

from fairstream.core.model import ModelError, ResourceSpace, TenantSpec
from fairstream.core.tenants import TenantTree
from fairstream.sim.scenario import NodeSpec, Scenario, TaskSpec, uniform_nodes
from fairstream.sim.traces.files import is_gzip, open_text

MAPPINGS = Path(__file__).resolve().parent / "mappings"
#: Tasks of a file not in submit order gathered per pass over it (about 0.5 KB each).
WINDOW = 200_000


def read_mapping(path: str | Path) -> dict:
    """A mapping file (``.json``, or YAML) as a dict; a shipped mapping by its name
    (``alibaba-2017``) when ``path`` is not a file."""
    candidate = Path(path)
    if not candidate.exists():
        for suffix in (".yaml", ".json"):
            shipped = MAPPINGS / f"{path}{suffix}"
            if shipped.exists():
                candidate = shipped
                break
    try:
        text = candidate.read_text()
    except OSError as exc:
        known = ", ".join(sorted(p.stem for p in MAPPINGS.glob("*.yaml")))
        raise ModelError(f"{path}: cannot read the mapping ({exc.strerror}; shipped mappings: {known})") from None
    try:
        if candidate.suffix == ".json":
            document = json.loads(text)
        else:
            import yaml

            document = yaml.safe_load(text)
    except Exception as exc:  # json.JSONDecodeError, yaml.YAMLError: one line either way
        raise ModelError(f"{path}: not a valid mapping file ({str(exc).splitlines()[0]})") from None
    if not isinstance(document, dict):
        raise ModelError(f"{path}: a mapping is an object of fields (job, submit, demand, ...)")
    return document


def _only(spec: dict, allowed: set[str] | frozenset[str], where: str) -> None:
    """Refuse a key ``spec`` does not know (a misspelt ``factr`` would otherwise be ignored and
    its default used without a word)."""
    unknown = sorted(set(spec) - set(allowed))
    if unknown:
        raise ModelError(f"{where}.{unknown[0]}: unknown key (keys: {', '.join(sorted(allowed))})")


# ------------------------------------------------------------------ reading rows


@dataclass(frozen=True)
class FileFormat:
    delimiter: str
    header: bool
    names: tuple[str, ...] | None  # column names for a file without a header


def _file_format(mapping: dict, path: str) -> FileFormat:
    spec = mapping.get("file", {})
    if not isinstance(spec, dict):
        raise ModelError("mapping.file: an object (delimiter, header, columns)")
    _only(spec, {"delimiter", "header", "columns"}, "mapping.file")
    delimiter = spec.get("delimiter", "\t" if path.endswith((".tsv", ".tsv.gz")) else ",")
    if delimiter in ("tab", "\\t"):
        delimiter = "\t"
    if not isinstance(delimiter, str) or len(delimiter) != 1:
        raise ModelError(f"mapping.file.delimiter: one character, got {delimiter!r}")
    names = spec.get("columns")
    if names is not None and not (isinstance(names, list) and all(isinstance(n, str) for n in names)):
        raise ModelError("mapping.file.columns: a list of column names")
    header = spec.get("header", names is None)
    if not isinstance(header, bool):
        raise ModelError("mapping.file.header: true or false")
    return FileFormat(delimiter, header, tuple(names) if names else None)


def _cut_short(line: int) -> str:
    """The reason a gzip cut short is counted under: one, for however many rows it lost."""
    return f"the file ends early (a gzip cut short): nothing after line {line} read"


def _cut_short_error(path: str, line: int, read: str) -> ModelError:
    return ModelError(f"{path}: {_cut_short(line)} ({read} before the cut); --allow-partial runs what was read")


def _rows(path: str, fmt: FileFormat, truncated: Callable[[int], None] | None = None
          ) -> Iterator[tuple[int, list[str]]]:
    """``(line number, cells)`` of the data rows; the header (if any) is skipped. A gzipped
    file that ends before its end marker (a copy cut short) gives the rows before the cut; the
    last of them may be cut too (it is then left out for what it lacks). ``truncated(line)`` is
    told the last line read."""
    number = 0
    with open_text(path, newline="") as handle:
        try:
            reader = csv.reader(handle, delimiter=fmt.delimiter)
            for number, row in enumerate(reader, 1):
                if number == 1 and fmt.header:
                    continue
                if row:
                    yield number, row
        except EOFError as exc:
            if not is_gzip(path) or (number <= 1 and fmt.header):
                raise ModelError(f"{path}: cannot read ({exc})") from None
            if truncated is not None:
                truncated(number)
        except (OSError, gzip.BadGzipFile, UnicodeDecodeError, csv.Error) as exc:
            raise ModelError(f"{path}: cannot read ({exc})") from None


def _columns(path: str, fmt: FileFormat) -> tuple[str, ...] | None:
    """The file's column names: its header, or the mapping's ``file.columns``; None if neither
    (then columns are referred to by number, 0 first)."""
    if fmt.names is not None:
        return fmt.names
    if not fmt.header:
        return None
    with open_text(path, newline="") as handle:
        try:
            first = next(csv.reader(handle, delimiter=fmt.delimiter), None)
        except (OSError, EOFError, gzip.BadGzipFile, UnicodeDecodeError, csv.Error) as exc:
            raise ModelError(f"{path}: cannot read ({exc})") from None
    if not first:
        raise ModelError(f"{path}: empty file (the mapping says it has a header)")
    return tuple(name.strip() for name in first)


class _Columns:
    """Resolves the mapping's column references (a name, or a number when the file has no
    names) to cell positions, with one-line errors naming the mapping field."""

    def __init__(self, names: tuple[str, ...] | None) -> None:
        self.names = names

    def index(self, ref: Any, where: str) -> int:
        if isinstance(ref, bool) or not isinstance(ref, (str, int)):
            raise ModelError(f"mapping.{where}: a column name or number, got {ref!r}")
        if isinstance(ref, int):
            if ref < 0 or (self.names is not None and ref >= len(self.names)):
                raise ModelError(f"mapping.{where}: no column number {ref} in the file")
            return ref
        if self.names is None:
            raise ModelError(f"mapping.{where}: column {ref!r} by name, but the file has no header "
                             "(give file.columns, or refer to columns by number)")
        if ref not in self.names:
            shown = ", ".join(self.names[:20]) + (", ..." if len(self.names) > 20 else "")
            raise ModelError(f"mapping.{where}: no column {ref!r} in the file (columns: {shown})")
        return self.names.index(ref)


class _Skip(Exception):
    """A row that cannot be used, with the reason it is counted under."""


def _number(cells: list[str], index: int, what: str) -> float:
    text = cells[index].strip() if index < len(cells) else ""
    if not text:
        raise _Skip(f"missing {what}")
    try:
        value = float(text)
    except ValueError:
        raise _Skip(f"{what} not a number") from None
    if not math.isfinite(value):
        raise _Skip(f"{what} not a number")
    return value


#: ``if_missing`` on ``submit``: a task without a submit time was submitted before the trace
#: began (it counts from the earliest submission), and on ``end``: one without an end was still
#: running when the trace ended (it runs to the latest time the trace knows). Stand-ins while
#: the first pass reads; ``TableWorkload`` replaces them when it knows those times.
TRACE_START, TRACE_END = -math.inf, math.inf
_IF_MISSING_WORDS = {"trace_start": TRACE_START, "trace_end": TRACE_END}
_QUANTITY_KEYS = frozenset({"column", "columns", "value", "factor", "unit", "divide_by", "if_missing"})


@dataclass(frozen=True)
class _Quantity:
    """A number made from a row: a column (or the product of columns) times ``factor`` and
    divided by ``divide_by``, or a constant ``value``; ``if_missing`` (as used, not scaled)
    when a cell it reads is empty."""

    columns: tuple[int, ...]
    factor: float
    value: float | None
    what: str
    divide_by: float = 1.0
    if_missing: float | None = None

    def of(self, cells: list[str]) -> float:
        if self.value is not None:
            return self.value
        if self.if_missing is not None and any(index >= len(cells) or not cells[index].strip()
                                               for index in self.columns):
            return self.if_missing
        out = self.factor
        for index in self.columns:
            out *= _number(cells, index, self.what)
        # Dividing, not multiplying by the inverse: 5611800000 / 1e6 is 5611.8 exactly as
        # written, where x 1e-6 may be off in the last bit.
        return out / self.divide_by if self.divide_by != 1.0 else out


def _quantity(spec: Any, cols: _Columns, where: str, factor_key: str = "factor", extra: frozenset[str] = frozenset(),
              words: tuple[str, ...] = ()) -> _Quantity:
    """``words``: the names ``if_missing`` may give here besides a number (``trace_start``,
    ``trace_end``)."""
    if isinstance(spec, (str, int)) and not isinstance(spec, bool):
        spec = {"column": spec}
    if not isinstance(spec, dict):
        raise ModelError(f"mapping.{where}: a column, or an object with column, columns or value")
    _only(spec, _QUANTITY_KEYS | extra, f"mapping.{where}")
    missing = spec.get("if_missing")
    if missing is not None:
        if isinstance(missing, str) and missing in words:
            missing = _IF_MISSING_WORDS[missing]
        elif isinstance(missing, bool) or not isinstance(missing, (int, float)) or not math.isfinite(missing) \
                or missing < 0:
            allowed = " or ".join(["a number >= 0", *words])
            raise ModelError(f"mapping.{where}.if_missing: {allowed}, got {missing!r}")
        missing = float(missing)
    factor = spec.get(factor_key, spec.get("unit", 1.0))
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not math.isfinite(factor):
        raise ModelError(f"mapping.{where}.{factor_key}: a number, got {factor!r}")
    divide_by = spec.get("divide_by", 1.0)
    if isinstance(divide_by, bool) or not isinstance(divide_by, (int, float)) or not divide_by > 0 \
            or not math.isfinite(divide_by):
        raise ModelError(f"mapping.{where}.divide_by: a number > 0, got {divide_by!r}")
    if "value" in spec:
        value = spec["value"]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise ModelError(f"mapping.{where}.value: a number >= 0, got {value!r}")
        return _Quantity((), 1.0, float(value), where)  # no cell to miss
    if "columns" in spec:
        refs = spec["columns"]
        if not isinstance(refs, list) or not refs:
            raise ModelError(f"mapping.{where}.columns: a list of columns (their product is used)")
        indices = tuple(cols.index(ref, f"{where}.columns") for ref in refs)
    elif "column" in spec:
        indices = (cols.index(spec["column"], f"{where}.column"),)
    else:
        raise ModelError(f"mapping.{where}: give column, columns or value")
    return _Quantity(indices, float(factor), None, where, float(divide_by), missing)


def _keep_rule(spec: Any, cols: _Columns) -> tuple[int, frozenset[str]] | None:
    """``keep: {column, in}`` as (cell position, values of rows to use), or None."""
    if spec is None:
        return None
    if not isinstance(spec, dict) or "column" not in spec or not isinstance(spec.get("in"), list):
        raise ModelError("mapping.keep: an object with column and in (the values of rows to use)")
    _only(spec, {"column", "in"}, "mapping.keep")
    return cols.index(spec["column"], "keep.column"), frozenset(str(v) for v in spec["in"])


def _kept(rule: tuple[int, frozenset[str]] | None, cells: list[str]) -> bool:
    return rule is None or (rule[0] < len(cells) and cells[rule[0]].strip() in rule[1])


# ------------------------------------------------------------------ the mapping


class TaskMapping:
    """A tasks mapping checked against a file's columns; ``task(cells, row)`` reads one row."""

    def __init__(self, mapping: dict, names: tuple[str, ...] | None) -> None:
        cols = _Columns(names)
        known = {"file", "job", "task", "tenant", "submit", "duration", "end", "demand", "count", "gang", "constraints",
                 "max_per_node", "keep", "events", "cluster", "name"}
        unknown = sorted(set(mapping) - known)
        if unknown:
            raise ModelError(f"mapping.{unknown[0]}: unknown field (fields: {', '.join(sorted(known))})")
        # Without a job column every row is a job of its own, named by its line number.
        self.job = cols.index(mapping["job"], "job") if "job" in mapping else None
        self.task = cols.index(mapping["task"], "task") if "task" in mapping else None
        self.submit: _Quantity | None = None  # (None: rows ``interval`` seconds apart)
        self.interval: float | None = None
        self.origin: float | str = "min"
        self._tenant(mapping.get("tenant"), cols)
        self._submit(mapping.get("submit"), cols)
        self.events = self._events(mapping.get("events"), cols)
        if self.events is not None and self.job is None:
            raise ModelError("mapping.job: required with events (a task is its job and task columns)")
        if self.events is None:
            if ("duration" in mapping) == ("end" in mapping):
                raise ModelError("mapping.duration: give duration or end (one of them), or events")
            field = "duration" if "duration" in mapping else "end"
            self.end_is_time = field == "end"
            self.duration = _quantity(mapping[field], cols, field, "unit",
                                      words=("trace_end",) if self.end_is_time else ())
        elif self.submit is not None and self.submit.if_missing == TRACE_START:
            raise ModelError("mapping.submit.if_missing: trace_start is for one row per task, not events "
                             "(a task's events give its times)")
        demand = mapping.get("demand")
        if not isinstance(demand, dict) or not demand:
            raise ModelError("mapping.demand: an object of resource -> column (at least one)")
        self.resources = tuple(str(name) for name in demand)
        self.demand = [_quantity(spec, cols, f"demand.{name}") for name, spec in demand.items()]
        self.count = _quantity(mapping["count"], cols, "count") if "count" in mapping else None
        # A request of ``count`` tasks as a gang (docs/workloads.md, "Gangs"): {whole: true} all of
        # them start together, or a column (or {value: N}) gives how many must.
        gang = mapping.get("gang")
        self.gang_whole = isinstance(gang, dict) and gang.get("whole") is True and len(gang) == 1
        self.gang = None if gang is None or self.gang_whole else _quantity(gang, cols, "gang")
        if gang is not None and self.count is None:
            raise ModelError("mapping.gang: needs count (a gang is a request of count tasks)")
        cluster = mapping.get("cluster")
        if isinstance(cluster, dict):
            _only(cluster, {"nodes", "capacity"}, "mapping.cluster")
        self.constraints = self._constraints(mapping.get("constraints"), cols)
        # At most so many of a job's tasks on one node: a column (0 or, with if_missing, an empty
        # cell: no limit; Google's different-machine flag is 1 or 0) or {value: N} for every task.
        self.max_per_node = _quantity(mapping["max_per_node"], cols, "max_per_node") if "max_per_node" in mapping \
            else None
        self.keep = _keep_rule(mapping.get("keep"), cols)

    def _tenant(self, spec: Any, cols: _Columns) -> None:
        self.tenant_fixed, self.tenant_column, self.round_robin, self.tenant_chars = None, None, None, None
        if spec is None:
            raise ModelError("mapping.tenant: required (a column, {fixed: NAME} or {round_robin: N})")
        if isinstance(spec, (str, int)) and not isinstance(spec, bool):
            spec = {"column": spec}
        if not isinstance(spec, dict):
            raise ModelError("mapping.tenant: a column, {fixed: NAME} or {round_robin: N}")
        _only(spec, {"column", "fixed", "round_robin", "max_length"}, "mapping.tenant")
        if "fixed" in spec:
            self.tenant_fixed = str(spec["fixed"])
        elif "round_robin" in spec:
            n = spec["round_robin"]
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ModelError(f"mapping.tenant.round_robin: a whole number >= 1, got {n!r}")
            self.round_robin = n  # jobs in order of first appearance, q0, q1, ...
        elif "column" in spec:
            self.tenant_column = cols.index(spec["column"], "tenant.column")
            chars = spec.get("max_length")
            if chars is not None and (isinstance(chars, bool) or not isinstance(chars, int) or chars < 1):
                raise ModelError(f"mapping.tenant.max_length: a whole number >= 1, got {chars!r}")
            self.tenant_chars = chars
        else:
            raise ModelError("mapping.tenant: give column, fixed or round_robin")

    def _submit(self, spec: Any, cols: _Columns) -> None:
        if spec is None:
            raise ModelError("mapping.submit: required (a column, or {interval: SECONDS} between rows)")
        if isinstance(spec, dict) and "interval" in spec:
            _only(spec, {"interval"}, "mapping.submit")
            every = spec["interval"]
            if isinstance(every, bool) or not isinstance(every, (int, float)) or not every >= 0:
                raise ModelError(f"mapping.submit.interval: seconds >= 0, got {every!r}")
            self.submit, self.interval, self.origin = None, float(every), 0.0
            return
        self.interval = None
        self.submit = _quantity(spec, cols, "submit", "unit", extra=frozenset({"origin"}), words=("trace_start",))
        origin = spec.get("origin", "min") if isinstance(spec, dict) else "min"
        if origin != "min" and (isinstance(origin, bool) or not isinstance(origin, (int, float))):
            raise ModelError(f"mapping.submit.origin: 'min' (the earliest submission is time 0) or seconds, "
                             f"got {origin!r}")
        self.origin = origin

    def _events(self, spec: Any, cols: _Columns) -> dict | None:
        if spec is None:
            return None
        if not isinstance(spec, dict) or "column" not in spec:
            raise ModelError("mapping.events: an object with column, submit, start and end (lists of codes)")
        _only(spec, {"column", "submit", "start", "end"}, "mapping.events")
        out: dict[str, Any] = {"column": cols.index(spec["column"], "events.column")}
        for kind in ("submit", "start", "end"):
            codes = spec.get(kind)
            if not isinstance(codes, list) or not codes:
                raise ModelError(f"mapping.events.{kind}: a list of the event column's codes")
            out[kind] = frozenset(str(code) for code in codes)
        return out

    def _constraints(self, spec: Any, cols: _Columns) -> tuple[int, str, str, str] | None:
        if spec is None:
            return None
        if not isinstance(spec, dict) or "column" not in spec:
            raise ModelError("mapping.constraints: an object with column, kind (nodes or labels) and separator")
        _only(spec, {"column", "kind", "separator", "any_of"}, "mapping.constraints")
        separator = spec.get("separator", ";")
        if not isinstance(separator, str) or not separator:
            raise ModelError("mapping.constraints.separator: a non-empty string")
        any_of = spec.get("any_of", "|")
        if not isinstance(any_of, str) or not any_of or any_of == separator:
            raise ModelError("mapping.constraints.any_of: a non-empty string other than the separator")
        kind = spec.get("kind")
        if kind not in ("nodes", "labels"):
            raise ModelError(f"mapping.constraints.kind: nodes (the cell lists the node ids a task may use) or "
                             f"labels (the cell lists key=value node labels it needs), got {kind!r}")
        return cols.index(spec["column"], "constraints.column"), separator, kind, any_of

    # ---------------------------------------------------------------- per row

    def cell(self, cells: list[str], index: int, what: str) -> str:
        text = cells[index].strip() if index < len(cells) else ""
        if not text:
            raise _Skip(f"missing {what}")
        return text

    def kept(self, cells: list[str]) -> bool:
        return _kept(self.keep, cells)

    def tenant_of(self, cells: list[str]) -> str | None:
        """The tenant named on the row (None: fixed or round robin, decided by the loader)."""
        if self.tenant_column is None:
            return None
        name = self.cell(cells, self.tenant_column, "tenant")
        return name[: self.tenant_chars] if self.tenant_chars else name

    def demand_of(self, cells: list[str]) -> dict[str, float]:
        demand = {}
        for name, quantity in zip(self.resources, self.demand):
            value = quantity.of(cells)
            if value < 0:
                raise _Skip(f"demand.{name} negative")
            demand[name] = value
        return demand

    def count_of(self, cells: list[str]) -> int | None:
        if self.count is None:
            return None
        value = self.count.of(cells)
        if value < 1 or value != int(value):
            raise _Skip("count not a whole number >= 1")
        return int(value) if value > 1 else None  # one task: a task, not a request of one

    def gang_of(self, cells: list[str], count: int | None) -> int | None:
        """How many of the row's ``count`` tasks must start together (None: not a gang)."""
        if count is None or (self.gang is None and not self.gang_whole):
            return None
        if self.gang_whole:
            return count
        value = cast(_Quantity, self.gang).of(cells)
        if value != int(value) or value > count:
            raise _Skip("gang not a whole number up to count")
        return int(value) if value > 1 else None

    def constraints_of(self, cells: list[str]) -> dict | None:
        """The row's constraints (``Constraints.from_json``'s form), or None."""
        out = self._placement_of(cells)
        if self.max_per_node is not None:
            value = self.max_per_node.of(cells)
            if value != int(value):
                raise _Skip("max_per_node not a whole number")
            if value >= 1:
                out = {**(out or {}), "max_per_node": int(value)}
        return out

    def _placement_of(self, cells: list[str]) -> dict | None:
        """The nodes or labels the row's constraints column allows, or None."""
        if self.constraints is None:
            return None
        index, separator, kind, any_of = self.constraints
        text = cells[index].strip() if index < len(cells) else ""
        values = sorted({v.strip() for v in text.split(separator) if v.strip()})
        if not values:
            return None  # an empty cell: no constraint
        if kind == "nodes":  # a list of nodes is already "any of them"
            return {"nodes": sorted({n.strip() for v in values for n in v.split(any_of) if n.strip()})}
        labels: dict[str, str | list[str]] = {}
        for item in values:  # key=value, or key=A|B: any of those values
            key, equals, value = item.partition("=")
            key = key.strip()
            allowed = sorted({v.strip() for v in value.split(any_of) if v.strip()})
            if not equals or not key or not allowed or key in labels:
                raise _Skip("constraints not key=value labels")
            labels[key] = allowed[0] if len(allowed) == 1 else allowed
        return {"labels": labels}

    def job_of(self, cells: list[str], number: int) -> str:
        return self.cell(cells, self.job, "job") if self.job is not None else str(number)

    def task_id(self, cells: list[str], number: int, job: str) -> str:
        """``<job>-<task>``; ``<job>-<line>`` without a task column; the line alone without a job."""
        if self.task is not None:
            return f"{job}-{self.cell(cells, self.task, 'task')}"
        return f"{job}-{number}" if self.job is not None else job


# ------------------------------------------------------------------ the workload


class TableWorkload:
    """The usable tasks of a table, in submit order, built as they are iterated (iterable
    again: each pass reads the file again). ``tenants`` in order of first task; ``len()`` the
    tasks (requests count once); ``left_out`` rows (or event-mode tasks) per reason."""

    def __init__(self, path: str, mapping: dict, limit: int | None = None) -> None:
        self.path = str(path)
        self.format = _file_format(mapping, self.path)
        self.map = TaskMapping(mapping, _columns(self.path, self.format))
        self.limit = limit
        self.left_out: dict[str, int] = {}
        self.cut_short_at: int | None = None  # the last line read of a gzip cut short
        self.round_robin: dict[str, str] = {}
        self._names: dict[str | None, int] = {}  # tenants named on rows, coded per row
        self._tenant_codes = array("l")
        if self.map.events is None:
            self._scan_rows()
        else:
            self._scan_events()

    def _skip(self, reason: str, count: int = 1) -> None:
        self.left_out[reason] = self.left_out.get(reason, 0) + count

    def _truncated(self, line: int) -> None:
        self.cut_short_at = line
        self._skip(_cut_short(line))

    # One row per task (or request).
    def _scan_rows(self) -> None:
        m = self.map
        # ``durations`` holds end times while reading when the mapping gives ends: a row may
        # stand in for the trace's start or end (``if_missing``), known only at the end.
        lines, submits, durations, counts = array("q"), array("d"), array("d"), array("q")
        for number, cells in _rows(self.path, self.format, self._truncated):
            if not m.kept(cells):
                self._skip("not kept (keep)")
                continue
            try:
                m.job_of(cells, number)
                if m.task is not None:
                    m.cell(cells, m.task, "task")
                tenant = m.tenant_of(cells)
                submit = m.submit.of(cells) if m.submit is not None else len(lines) * cast(float, m.interval)
                value = m.duration.of(cells)
                if value < submit if m.end_is_time else value < 0:
                    raise _Skip("ends before it is submitted" if m.end_is_time else "negative duration")
                demand = m.demand_of(cells)
                if not any(demand.values()):
                    raise _Skip("asks for nothing")
                count = m.count_of(cells) or 1
                m.gang_of(cells, count)
                m.constraints_of(cells)
            except _Skip as skip:
                self._skip(str(skip))
                continue
            lines.append(number)
            counts.append(count)
            submits.append(submit)
            durations.append(value)
            self._tenant_codes.append(self._names.setdefault(tenant, len(self._names)))
        lines_a = np.frombuffer(lines, np.int64) if lines else np.zeros(0, np.int64)
        submits_a = np.frombuffer(submits).copy() if submits else np.zeros(0)
        values = np.frombuffer(durations).copy() if durations else np.zeros(0)
        codes = self._codes()
        counts_a = np.frombuffer(counts, np.int64) if counts else np.zeros(0, np.int64)
        # if_missing: trace_start is the earliest submit time read, trace_end the latest time
        # read (an end, or a submit plus its run time, or a submit).
        known_submits = submits_a[np.isfinite(submits_a)]
        start = float(known_submits.min()) if len(known_submits) else 0.0
        submits_a[submits_a == TRACE_START] = start
        if m.end_is_time:
            known = values[np.isfinite(values)]
            end = max(float(known.max()) if len(known) else start, float(submits_a.max()) if len(submits_a) else start)
            values[values == TRACE_END] = end
            durations_a = values - submits_a
            late = durations_a < 0  # ended before the trace's start it was given
            if late.any():
                self._skip("ends before it is submitted", int(late.sum()))
                keep = ~late
                lines_a, submits_a, durations_a, codes = lines_a[keep], submits_a[keep], durations_a[keep], codes[keep]
                counts_a = counts_a[keep]
        else:
            durations_a = values
        self._finish(lines_a, submits_a, durations_a, counts_a, codes)

    # One row per task event (Google's task_events).
    def _scan_events(self) -> None:
        m, ev = self.map, self.map.events
        assert ev is not None and m.submit is not None  # (a mapping with events: checked with a submit column)
        lines, submits, durations, counts = array("q"), array("d"), array("d"), array("q")
        seen: set[tuple[str, str]] = set()
        running: dict[tuple[str, str], tuple[int, float | None]] = {}  # not ended: (ordinal, start)
        origin = math.inf
        for number, cells in _rows(self.path, self.format, self._truncated):
            code = cells[ev["column"]].strip() if ev["column"] < len(cells) else ""
            try:
                key = (m.job_of(cells, number), m.cell(cells, m.task, "task") if m.task is not None else "")
                time = m.submit.of(cells)
            except _Skip as skip:
                self._skip(str(skip))
                continue
            if code in ev["submit"]:
                if key in seen:
                    continue  # a resubmission: the task's first submission counts
                if not m.kept(cells):
                    self._skip("not kept (keep)")
                    continue
                try:
                    tenant = m.tenant_of(cells)
                    demand = m.demand_of(cells)
                    count = m.count_of(cells) or 1
                    m.gang_of(cells, count)
                    m.constraints_of(cells)
                except _Skip as skip:
                    self._skip(str(skip))  # not seen: a later submission with what is missing may count
                    continue
                seen.add(key)
                origin = min(origin, time)
                asked = any(demand.values())
                running[key] = (len(lines) if asked else -1, None)
                if asked:
                    lines.append(number)
                    counts.append(count)
                    submits.append(time)
                    durations.append(math.nan)
                    self._tenant_codes.append(self._names.setdefault(tenant, len(self._names)))
                else:
                    self._skip("asks for nothing")
            elif code in ev["start"] and key in running and running[key][1] is None:
                running[key] = (running[key][0], time)
            elif code in ev["end"] and key in running and running[key][1] is not None:
                ordinal, start = running.pop(key)
                if ordinal >= 0 and start is not None:  # (checked above)
                    durations[ordinal] = max(time - start, 0.0)
        for ordinal, start in running.values():
            if ordinal >= 0:
                self._skip("never ran in the file" if start is None else "never ended in the file")
        lines_a = np.frombuffer(lines, np.int64) if lines else np.zeros(0, np.int64)
        submits_a = np.frombuffer(submits) if submits else np.zeros(0)
        durations_a = np.frombuffer(durations) if durations else np.zeros(0)
        ended = ~np.isnan(durations_a)
        self._origin = origin if math.isfinite(origin) else 0.0
        counts_a = np.frombuffer(counts, np.int64) if counts else np.zeros(0, np.int64)
        self._finish(lines_a[ended], submits_a[ended], durations_a[ended], counts_a[ended], self._codes()[ended],
                     origin_known=True)

    def _codes(self) -> np.ndarray:
        return np.frombuffer(self._tenant_codes, dtype=np.int_) if self._tenant_codes else np.zeros(0, np.int_)

    def _finish(self, lines: np.ndarray, submits: np.ndarray, durations: np.ndarray, counts: np.ndarray,
                codes: np.ndarray | None = None, origin_known: bool = False) -> None:
        m = self.map
        if not origin_known:
            self._origin = (float(submits.min()) if len(submits) else 0.0) if m.origin == "min" else float(m.origin)
        order = np.argsort(submits, kind="stable")
        self.sorted = bool((order == np.arange(len(order))).all())
        if self.limit is not None:
            order = order[: self.limit]
        self._lines, self._submits, self._durations = lines[order], submits[order], durations[order]
        self.task_count = int(counts[order].sum())  # (a request of n counts n; its row once in ``len``)
        if m.tenant_fixed is not None:
            self.tenants = [m.tenant_fixed] if len(order) else []
        elif m.round_robin is not None:
            self.tenants = [f"q{k}" for k in range(m.round_robin)]
        else:  # in order of first task
            names = list(self._names)
            first: dict[int, None] = dict.fromkeys(int(c) for c in cast(np.ndarray, codes)[order])  # (given with tenant names)
            self.tenants = [cast(str, names[c]) for c in first]
        del self._tenant_codes, self._names

    def __len__(self) -> int:
        return len(self._lines)

    def __iter__(self) -> Iterator[TaskSpec]:
        return self._specs()

    def _specs(self) -> Iterator[TaskSpec]:
        """The kept rows as tasks, in submit order: one more pass over the file (in file order
        if that is submit order, else the kept rows are read first and given in order)."""
        lines = self._lines
        if not len(lines):
            return
        if self.sorted:
            k = 0
            for number, cells in _rows(self.path, self.format):
                if k < len(lines) and number == lines[k]:
                    yield self._spec(cells, number, k)
                    k += 1
                    if k == len(lines):
                        return
            return
        # Not in submit order: the next WINDOW tasks of the order are gathered in one pass
        # over the file, then given in order; memory stays bounded, at one pass per window.
        for start in range(0, len(lines), WINDOW):
            wanted = {int(line): k for k, line in enumerate(lines[start:start + WINDOW], start)}
            found: dict[int, TaskSpec] = {}
            for number, cells in _rows(self.path, self.format):
                at = wanted.get(number)
                if at is not None:
                    found[at] = self._spec(cells, number, at)
                    if len(found) == len(wanted):
                        break
            for k in range(start, start + len(wanted)):
                yield found.pop(k)

    def _spec(self, cells: list[str], number: int, k: int) -> TaskSpec:
        m = self.map
        job = m.job_of(cells, number)
        tenant = m.tenant_of(cells)
        if tenant is None:
            if m.tenant_fixed is not None:
                tenant = m.tenant_fixed
            else:
                tenant = self.round_robin.setdefault(job, f"q{len(self.round_robin) % cast(int, m.round_robin)}")
        return TaskSpec(id=m.task_id(cells, number, job), job=job, tenant=tenant,
                        submit=round(float(self._submits[k]) - self._origin, 6), duration=float(self._durations[k]),
                        demand=m.demand_of(cells), constraints=m.constraints_of(cells), count=(count := m.count_of(cells)),
                        gang=m.gang_of(cells, count))

    def report(self) -> str:
        """The rows left out, per reason, most first: ``9017 missing demand.cpu, 12 ...``."""
        if not self.left_out:
            return "none left out"
        parts = sorted(self.left_out.items(), key=lambda item: (-item[1], item[0]))
        return "left out: " + ", ".join(f"{n} {reason}" for reason, n in parts)


# ------------------------------------------------------------------ nodes


def read_node_table(path: str, mapping: dict, allow_partial: bool = True) -> tuple[list[NodeSpec], dict[str, int]]:
    """Nodes from a table: ``id``, ``capacity`` (resource -> column or value, as a demand) and
    ``labels`` (label -> column). A node's first row counts (Alibaba's machine_meta repeats a
    machine per state change); rows that cannot be used are counted per reason. A gzipped file
    cut short is refused unless ``allow_partial`` (``load_table``)."""
    fmt = _file_format(mapping, str(path))
    cols = _Columns(_columns(str(path), fmt))
    known = {"file", "id", "capacity", "labels", "keep", "name"}
    unknown = sorted(set(mapping) - known)
    if unknown:
        raise ModelError(f"nodes mapping.{unknown[0]}: unknown field (fields: {', '.join(sorted(known))})")
    if "id" not in mapping:
        raise ModelError("nodes mapping.id: required (the column of the node id)")
    id_index = cols.index(mapping["id"], "id")
    capacity = mapping.get("capacity")
    if not isinstance(capacity, dict) or not capacity:
        raise ModelError("nodes mapping.capacity: an object of resource -> column (at least one)")
    quantities = {str(name): _quantity(spec, cols, f"capacity.{name}") for name, spec in capacity.items()}
    labels = mapping.get("labels", {})
    if not isinstance(labels, dict):
        raise ModelError("nodes mapping.labels: an object of label -> column")
    label_index = {str(name): cols.index(ref, f"labels.{name}") for name, ref in labels.items()}
    keep = _keep_rule(mapping.get("keep"), cols)
    nodes: dict[str, NodeSpec] = {}
    left_out: dict[str, int] = {}
    cut_at: list[int] = []

    def truncated(line: int) -> None:
        cut_at.append(line)
        left_out[_cut_short(line)] = 1

    for _number, cells in _rows(str(path), fmt, truncated):
        try:
            if not _kept(keep, cells):
                raise _Skip("not kept (keep)")
            node = cells[id_index].strip() if id_index < len(cells) else ""
            if not node:
                raise _Skip("missing id")
            if node in nodes:
                raise _Skip("a node seen before")
            values = {name: q.of(cells) for name, q in quantities.items()}
            if any(v < 0 for v in values.values()):
                raise _Skip("negative capacity")
            nodes[node] = NodeSpec(node, values, {name: cells[i].strip() for name, i in label_index.items()
                                                  if i < len(cells) and cells[i].strip()})
        except _Skip as skip:
            left_out[str(skip)] = left_out.get(str(skip), 0) + 1
    if cut_at and not allow_partial:
        raise _cut_short_error(path, cut_at[0], f"{len(nodes)} nodes")
    if not nodes:
        raise ModelError(f"{path}: no usable node rows ({left_out or 'the file is empty'})")
    return list(nodes.values()), left_out


def load_table(path: str, mapping: str | dict, limit: int | None = None, nodes: int | None = None,
               nodes_table: str | None = None, nodes_mapping: str | dict | None = None,
               allow_partial: bool = False) -> Scenario:
    """The table as a scenario read as the simulation reaches it. Nodes: from ``nodes_table``
    through ``nodes_mapping``, else the mapping's ``cluster`` (``nodes`` x ``capacity``; ``nodes``
    overrides the count). Tenants: a flat tree, weight 1, in order of first task.

    A gzipped file cut short (a copy that stopped early) is refused (``ModelError``), so that a
    script running the command notices; with ``allow_partial`` its rows before the cut are used
    and the cut is counted among the rows left out."""
    document = read_mapping(mapping) if not isinstance(mapping, dict) else mapping
    workload = TableWorkload(str(path), document, limit=limit)
    kept = (f"{len(workload)} tasks" if workload.task_count == len(workload)
            else f"{len(workload)} requests of {workload.task_count} tasks")
    if workload.cut_short_at is not None and not allow_partial:
        raise _cut_short_error(path, workload.cut_short_at, kept)
    resources = ResourceSpace(workload.map.resources)
    name = f"table:{Path(path).name} ({kept}; {workload.report()})"
    if nodes_table is not None:
        if nodes_mapping is None:
            raise ModelError("--nodes-table needs --nodes-mapping")
        node_doc = read_mapping(nodes_mapping) if not isinstance(nodes_mapping, dict) else nodes_mapping
        node_specs, node_left = read_node_table(nodes_table, node_doc, allow_partial)
        if nodes is not None:
            node_specs = node_specs[:nodes]
        for spec in node_specs:
            missing = [r for r in resources.names if r not in spec.capacity]
            if missing:
                raise ModelError(f"nodes mapping.capacity: no {missing[0]} (the tasks ask for {', '.join(resources.names)})")
            spec.capacity = {r: spec.capacity[r] for r in resources.names}
        name += f" on {len(node_specs)} nodes"
        if node_left:
            name += "; nodes left out: " + ", ".join(f"{n} {r}" for r, n in sorted(node_left.items()))
    else:
        cluster = document.get("cluster")
        if not isinstance(cluster, dict) or not isinstance(cluster.get("capacity"), dict):
            raise ModelError("mapping.cluster: give the cluster ({nodes: N, capacity: {resource: amount}}) or "
                             "--nodes-table with --nodes-mapping")
        capacity = {r: float(cluster["capacity"].get(r, 0.0)) for r in resources.names}
        count = nodes if nodes is not None else int(cluster.get("nodes", 100))
        node_specs = uniform_nodes(count, capacity)
        name += f" on {count} nodes"
    tree = TenantTree.from_specs([TenantSpec(t) for t in workload.tenants])
    return Scenario(resources, tree, node_specs, workload, name=name)


__all__ = ["TableWorkload", "load_table", "read_mapping", "read_node_table", "MAPPINGS"]
