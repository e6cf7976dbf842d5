"""Engine snapshots as plain data: a versioned format that cannot run code when read.

The worker keeps an occasional snapshot of each cluster's engine in Redis, and
``export-log --snapshot-out`` writes one to a file for ``simulate --events --snapshot``.
Anyone who can write that Redis or hand over that file chooses the bytes, so reading them
must never do more than build the engine's own kinds of objects (a pickle can call any
function it names; the issue that retired pickles had one run ``id``).

Layout: ``MAGIC``, the format version as two bytes (big-endian), then one MessagePack value:
the engine, encoded as a tree in which scalars (None, bools, ints, floats, strings, bytes)
stand for themselves and everything else is a list whose first element is a tag:

==========  ====================================================================
``REF``     ``[0, n]``: the n-th shared value met so far (lists, dicts, sets, arrays and
            objects are numbered in the order they are first met, so state shared between two
            places, such as a task in the task table and in its tenant's queue, stays shared)
``LIST``    ``[1, item, ...]``;  ``TUPLE`` ``[2, item, ...]``
``DICT``    ``[3, key, value, key, value, ...]``, in insertion order;  ``ORDERED`` the same for
            an ``OrderedDict``
``SET``     ``[4, item, ...]``;  ``FROZENSET`` ``[5, item, ...]``
``OBJECT``  ``[6, class, field, ...]``: one of ``CLASSES`` (its index there), its declared
            fields in declared order. It is built without calling its constructor or any hook
            the data could choose
``ARRAY``   ``[7, dtype, shape, bytes]`` with dtype one of ``DTYPES``, little-endian
``ENUM``    ``[8, enum, value]``, an enum of ``ENUMS``
``POLICY``  ``[10, name]``: the registered policy of that name (``fairstream policies``)
``NUMBER``  ``[11, dtype, bytes]``: a numpy scalar (kept as one, so arithmetic stays the same)
==========  ====================================================================

Every class a snapshot may hold is listed in ``CLASSES`` with its fields. Encoding an object
with a field not declared there is an error, so a change to the engine's state cannot slip
into snapshots unnoticed: declare it here and raise ``VERSION`` (a worker then refuses its
older snapshots with ``SnapshotError`` and rebuilds from the log; see ``Processor.session``).

Decoded values are exactly the encoded ones (floats are IEEE doubles both ways, dicts keep
their order), so an engine read back takes the same decisions as the one written, to the bit.
"""

from __future__ import annotations

import itertools
import math
from collections import OrderedDict
from collections.abc import Callable
from enum import Enum
from typing import Any

import msgpack
import numpy as np

from fairstream.core.accounting import Accounting, AccountingConfig, QuantumTree, RecentTasks, TenantLedger, _Running
from fairstream.core.candidates import Changes
from fairstream.core.engine import Engine
from fairstream.core.flex import FlexModel, Tree
from fairstream.core.jobs import Jobs, JobUsage
from fairstream.core.model import (
    CompletionStatus,
    Constraints,
    DecisionKind,
    ModelError,
    Node,
    ReasonCode,
    ResourceSpace,
    Task,
    TaskState,
    TenantSpec,
)
from fairstream.core.nodes import Nodes
from fairstream.core.preemption import PreemptionRule
from fairstream.core.reservation import Reservations
from fairstream.core.snapshot import PendingQueue, Reservation, TaskList
from fairstream.core.snapshot_builder import SnapshotBuilder
from fairstream.core.starvation import Starvation
from fairstream.core.tenants import TenantTree
from fairstream.core.verdicts import Verdicts
from fairstream.core.workload import Gangs, Workload
from fairstream.policies import REGISTRY
from fairstream.policies.base import PolicySpec

MAGIC = b"FSENGINE"
VERSION = 17  # 3: unschedulable verdicts carry a ReasonCode; 4: preemption state; 5: usage half-life;
# 6: nodes' resource weights (LTRF formula 9); 7: queues' max_resources and max_running; 8: queues' ordering;
# 9: whether a starved tenant has victims left (the preemption re-check, ``Engine.wake_at``) and the
# node reservation (``Engine.reservation``); 10: tasks' run-time estimates (``Task.estimate``, backfill);
# 11: constraints' max_per_node (``Constraints.max_per_node``; such a task's shape is its job's);
# 12: the engine's jobs and starvation watch as parts of their own (``Engine.jobs``: ``core.jobs.Jobs``;
# ``Engine.starvation``: ``core.starvation.Starvation``); 13: the node registry as a part of its own
# (``Engine.registry``: ``core.nodes.Nodes``); 14: the engine as a facade over parts: its tasks, requests,
# queues and shapes (``Engine.workload``: ``core.workload.Workload``), unschedulable verdicts
# (``core.verdicts.Verdicts``), a tenant-local pass's changes (``core.candidates.Changes``) and the
# reservation (``core.reservation.Reservations``); 15: gangs (``Task.gang``); 16: a gang's hold of nodes
# (``Reservation.more``, ``until``; ``Reservations.lapsed``); 17: since when a gang holds them (``Reservation.since``)

REF, LIST, TUPLE, DICT, SET, FROZENSET, OBJECT, ARRAY, ENUM, ORDERED, POLICY, NUMBER = range(12)

DTYPES = ("<f8", "<i8", "|b1")


class SnapshotError(ModelError):
    """Bytes that are not an engine snapshot this version of fairstream reads."""


def _rebuild_demand(obj: Task) -> None:
    obj.demand = np.array(obj.demand_values, dtype=float)


def _rebuild_engine(obj: Engine) -> None:
    obj._snapshots = SnapshotBuilder(obj.spec.traits.node_allocation)


def _rebuild_workload(obj: Workload) -> None:
    obj._waiting = obj._holders = obj._running_on = obj._job_rows = obj.last_demand = obj._finish_time = None
    obj.gangs = Gangs()
    obj.gangs.waiting = sum(1 for request in obj.requests.values() if request.gang)


def _rebuild_reservations(obj: Reservations) -> None:
    obj._backfill = None


def _rebuild_nodes(obj: Nodes) -> None:
    obj._view = None
    obj.lost = int(np.count_nonzero(~obj.alive))


def _rebuild_tree(obj: TenantTree) -> None:
    obj.queue_orderings = obj._queue_orderings()


def _rebuild_running(obj: _Running) -> None:
    obj.demand = np.array(obj.values, dtype=float)


class _Class:
    """One class a snapshot may hold: the fields stored (in this order), fields left out
    because they are rebuilt or derived, and the function that rebuilds them on reading."""

    def __init__(self, cls: type, fields: str, derived: str = "", rebuild: Callable | None = None) -> None:
        self.cls = cls
        self.fields = tuple(fields.split())
        self.derived = frozenset(derived.split())
        self.rebuild = rebuild
        # Instances without a __dict__: slotted classes, and classes compiled with mypyc
        # (``fairstream/compiled.py``), whose attributes are fixed by the class.
        self.slots = cls.__dictoffset__ == 0
        self.stored = frozenset(self.fields) | self.derived  # what an instance may have
        compiled = getattr(cls, "__mypyc_attrs__", None)
        if compiled is not None and not frozenset(compiled) <= self.stored:
            undeclared = ", ".join(sorted(frozenset(compiled) - self.stored))
            raise SnapshotError(f"{cls.__qualname__}.{{{undeclared}}}: not declared in CLASSES (declare, raise VERSION)")


# Version 2 (requests: Task.count, index, cancelled). Changing a list (a field added, removed or renamed) changes the format: raise VERSION.
CLASSES: tuple[_Class, ...] = (
    _Class(Engine, "resources tree spec params auto_tenants accounting preemption starvation time registry workload "
                   "jobs verdicts changes reservations shares_stale",
           derived="_snapshots", rebuild=_rebuild_engine),  # the snapshot builder's tenant view, made again on use
    _Class(Workload, "tasks requests finished_ids finished_retention pending seq shapes shape_demands",
           derived="_waiting _holders _running_on _job_rows gangs last_demand _finish_time",
           rebuild=_rebuild_workload),  # indexes, made again on use; a cache
    _Class(Verdicts, "unschedulable to_check nodes_changed by_shape"),
    _Class(Changes, "grown touched passed fresh"),
    _Class(Reservations, "held lapsed", derived="_backfill", rebuild=_rebuild_reservations),  # the reserved task's start
    _Class(ResourceSpace, "names _position"),
    _Class(TenantTree, "specs children effective_share has_limits orders_jobs _paths", derived="queue_orderings",
           rebuild=_rebuild_tree),  # from the specs
    _Class(TenantSpec, "id parent weight min_share max_share max_resources max_running ordering"),
    _Class(Accounting, "config n_resources ledgers row allocation weighted_allocation pending_demand share "
                       "counted_usage raw_usage capacity fractions clock round_start quanta",
           derived="_index _arrivals _pseudo"),  # the top-up index, rebuilt on first use; a count of first arrivals; PAR by row
    _Class(AccountingConfig, "round_length discount quantum adaptive_quantum resource half_life"),
    _Class(PreemptionRule, "threshold timeout"),
    _Class(Starvation, "rule since victims_exist"),
    _Class(Reservation, "node tenant shape task more until since"),
    _Class(QuantumTree, "initial adaptive quantum _children_sum _children_count _finished version"),
    _Class(TenantLedger, "name pending running first_arrival round_arrival pseudo_accumulated pseudo_at "
                         "waiting_since recent"),
    _Class(RecentTasks, "demand weighted entries boundary done round_start"),
    _Class(_Running, "start done recent values counted_values", derived="demand", rebuild=_rebuild_running),
    _Class(Nodes, "nodes row storage_capacity storage_used storage_alive ids labels", derived="_view lost",
           rebuild=_rebuild_nodes),  # the snapshot's view of the nodes and the count of lost ones, made again
    _Class(Node, "id capacity labels alive last_heartbeat weights"),
    _Class(Task, "id job tenant submit constraints duration estimate seq demand_map state node start running_entry shape "
                 "demand_values count index cancelled gang", derived="demand", rebuild=_rebuild_demand),
    _Class(Constraints, "nodes labels max_per_node"),
    _Class(PendingQueue, "groups count jobs"),
    _Class(JobUsage, "allocation offset"),
    _Class(Jobs, "n_resources running usage maybe_idle"),
    _Class(TaskList, "tasks head count"),
    _Class(FlexModel, "classes trees metadata source"),
    _Class(Tree, "children_left children_right feature threshold leaf_class"),
)
ENUMS: tuple[type[Enum], ...] = (TaskState, CompletionStatus, DecisionKind, ReasonCode)

_CLASS_INDEX = {entry.cls: index for index, entry in enumerate(CLASSES)}
_ENUM_INDEX = {cls: index for index, cls in enumerate(ENUMS)}
_SCALARS = frozenset((type(None), bool, int, float, str, bytes))


def _ordered(members) -> list:
    """A set's members in a fixed order: a set's iteration order follows the string hashes,
    which differ from process to process (PYTHONHASHSEED), so the same state written in order
    of iteration gave different bytes (and a set read back iterated differently)."""
    try:
        return sorted(members)
    except TypeError:  # members of several kinds
        return sorted(members, key=lambda m: (type(m).__name__, repr(m)))


def encode_engine(engine: Engine) -> bytes:
    """The snapshot of ``engine`` (``MAGIC``, version, MessagePack body)."""
    if not isinstance(engine, Engine):
        raise TypeError(f"encode_engine takes an Engine, not {type(engine).__name__}")
    try:
        body = msgpack.packb(_Encoder().value(engine), use_bin_type=True)
    except OverflowError as exc:  # an integer beyond 64 bits
        raise SnapshotError(f"a number too large for a snapshot ({exc})") from None
    return MAGIC + VERSION.to_bytes(2, "big") + body


def decode_engine(blob: bytes) -> Engine:
    """The engine a snapshot holds. Raises ``SnapshotError`` (one line) for anything else:
    another format (an old pickle included), another version, or a damaged or forged body."""
    if not blob.startswith(MAGIC):
        if blob[:1] == b"\x80":
            raise SnapshotError("not an engine snapshot of this format: a pickle (written by a fairstream "
                                "before snapshot version 1); it is not read, as reading a pickle can run code")
        raise SnapshotError("not an engine snapshot (no fairstream engine header)")
    version = int.from_bytes(blob[len(MAGIC): len(MAGIC) + 2], "big")
    if version != VERSION:
        raise SnapshotError(f"engine snapshot version {version}; this fairstream reads version {VERSION} only")
    try:
        tree = msgpack.unpackb(blob[len(MAGIC) + 2:], raw=False, use_list=True, strict_map_key=True)
        engine = _Decoder().value(tree)
    except SnapshotError:
        raise
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, RecursionError, OverflowError,
            msgpack.UnpackException) as exc:
        raise SnapshotError(f"damaged engine snapshot ({type(exc).__name__}: {exc})") from None
    if not isinstance(engine, Engine):
        raise SnapshotError(f"damaged engine snapshot (it holds a {type(engine).__name__}, not an engine)")
    return engine


class _Encoder:
    """Scalars are written as they are (inlined in the loops below: most values are scalars,
    and a call per value would double the time); ``value`` handles the rest."""

    def __init__(self) -> None:
        self.shared: dict[int, int] = {}  # id(value) -> its number (see REF)

    def _first_time(self, value: Any) -> bool:
        key = id(value)
        if key in self.shared:
            return False
        self.shared[key] = len(self.shared)
        return True

    def items(self, values) -> list:
        value, scalars = self.value, _SCALARS
        return [v if type(v) in scalars else value(v) for v in values]

    def value(self, value: Any) -> Any:
        kind = type(value)
        if kind in _SCALARS:
            return value
        if kind is tuple:
            return [TUPLE, *self.items(value)]
        if kind is frozenset:
            return [FROZENSET, *self.items(_ordered(value))]
        if kind in _ENUM_INDEX:
            return [ENUM, _ENUM_INDEX[kind], value._value_]
        if kind is PolicySpec:
            if REGISTRY.get(value.name) is not value:
                raise SnapshotError(f"policy {value.name!r} is not the registered one")
            return [POLICY, value.name]
        if isinstance(value, np.generic):
            return [NUMBER, _dtype(value.dtype), value.astype(value.dtype.newbyteorder("<")).tobytes()]
        if not self._first_time(value):
            return [REF, self.shared[id(value)]]
        if kind is list:
            return [LIST, *self.items(value)]
        if kind is dict or kind is OrderedDict:
            return [DICT if kind is dict else ORDERED, *self.items(itertools.chain.from_iterable(value.items()))]
        if kind is set:
            return [SET, *self.items(_ordered(value))]
        if kind is np.ndarray:
            little = np.ascontiguousarray(value, dtype=value.dtype.newbyteorder("<"))
            return [ARRAY, _dtype(value.dtype), list(value.shape), little.tobytes()]
        index = _CLASS_INDEX.get(kind)
        if index is None:
            raise SnapshotError(f"a {kind.__module__}.{kind.__qualname__} in the engine: not a class engine "
                                "snapshots hold (add it to CLASSES and raise VERSION)")
        entry = CLASSES[index]
        state = {name: getattr(value, name) for name in entry.fields} if entry.slots else value.__dict__
        if not state.keys() <= entry.stored:
            undeclared = ", ".join(sorted(state.keys() - entry.stored))
            raise SnapshotError(f"{kind.__qualname__}.{{{undeclared}}}: not declared in CLASSES (declare, raise VERSION)")
        try:
            values = [state[name] for name in entry.fields]
        except KeyError as exc:
            raise SnapshotError(f"{kind.__qualname__} has no field {exc} that CLASSES declares") from None
        out = [OBJECT, index]
        out += self.items(values)
        return out


def _dtype(dtype: np.dtype) -> str:
    name = dtype.newbyteorder("<").str if dtype.byteorder != "|" else dtype.str
    if name not in DTYPES:
        raise SnapshotError(f"an array of {dtype}: not a dtype engine snapshots hold")
    return name


class _Decoder:
    def __init__(self) -> None:
        self.shared: list[Any] = []

    def items(self, raw: list, start: int) -> list:
        value, scalars = self.value, _SCALARS
        return [v if type(v) in scalars else value(v) for v in itertools.islice(raw, start, None)]

    def value(self, item: Any) -> Any:
        if type(item) is not list:
            if type(item) not in _SCALARS:
                raise SnapshotError(f"damaged engine snapshot (a {type(item).__name__} where a value belongs)")
            return item
        tag = item[0] if item else None
        if tag == REF and len(item) == 2:
            number = item[1]
            if type(number) is not int or not 0 <= number < len(self.shared):
                raise SnapshotError(f"damaged engine snapshot (reference {number!r} to nothing read yet)")
            return self.shared[number]
        if tag == OBJECT and len(item) >= 2:
            entry = CLASSES[_index(item[1], len(CLASSES), "class")]
            if len(item) - 2 != len(entry.fields):
                raise SnapshotError(f"damaged engine snapshot ({entry.cls.__qualname__} with {len(item) - 2} "
                                    f"fields, not {len(entry.fields)})")
            # No constructor, no hook: the fields are set as read. (A compiled class's ``__new__``
            # runs its ``__init__``, whose arguments all have defaults: an empty part, then filled.)
            obj = entry.cls.__new__(entry.cls)  # type: ignore[call-overload]  # (any of CLASSES)
            self.shared.append(obj)
            values = self.items(item, 2)
            if entry.slots:
                for name, field_value in zip(entry.fields, values):
                    object.__setattr__(obj, name, field_value)
            else:
                obj.__dict__.update(zip(entry.fields, values))
            if entry.rebuild is not None:
                entry.rebuild(obj)
            return obj
        if tag == TUPLE:
            return tuple(self.items(item, 1))
        if tag == FROZENSET:
            return frozenset(self.items(item, 1))
        if tag == LIST:
            out: list = []
            self.shared.append(out)
            out.extend(self.items(item, 1))
            return out
        if tag == DICT or tag == ORDERED:
            mapping: dict = {} if tag == DICT else OrderedDict()
            self.shared.append(mapping)
            if len(item) % 2 == 0:
                raise SnapshotError("damaged engine snapshot (a dict with a key and no value)")
            flat = self.items(item, 1)
            for k in range(0, len(flat), 2):
                mapping[flat[k]] = flat[k + 1]
            return mapping
        if tag == SET:
            members: set = set()
            self.shared.append(members)
            members.update(self.items(item, 1))
            return members
        if tag == ENUM and len(item) == 3:
            return ENUMS[_index(item[1], len(ENUMS), "enum")](item[2])
        if tag == POLICY and len(item) == 2:
            name = item[1]
            spec = REGISTRY.get(name) if isinstance(name, str) else None
            if spec is None:
                raise SnapshotError(f"the snapshot's policy {name!r} is not one this fairstream has")
            return spec
        if tag == NUMBER and len(item) == 3:
            dtype, raw = item[1:]
            return np.frombuffer(raw, dtype=_known_dtype(dtype), count=1)[0]
        if tag == ARRAY and len(item) == 4:
            dtype, shape, raw = item[1:]
            if type(shape) is not list or not all(type(n) is int and n >= 0 for n in shape):
                raise SnapshotError("damaged engine snapshot (an array shape that is not a list of sizes)")
            dtype = np.dtype(_known_dtype(dtype))
            if type(raw) is not bytes or len(raw) != math.prod(shape) * dtype.itemsize:
                raise SnapshotError("damaged engine snapshot (an array whose bytes do not fit its shape)")
            array = np.frombuffer(raw, dtype=dtype).reshape(shape).astype(dtype.newbyteorder("="))  # a writable copy
            self.shared.append(array)
            return array
        raise SnapshotError(f"damaged engine snapshot (unknown tag {tag!r} or a wrong length)")


def _index(value: Any, size: int, what: str) -> int:
    if type(value) is not int or not 0 <= value < size:
        raise SnapshotError(f"damaged engine snapshot (no {what} number {value!r})")
    return value


def _known_dtype(name: Any) -> str:
    if name not in DTYPES:
        raise SnapshotError(f"damaged engine snapshot (dtype {name!r} is not one snapshots hold)")
    return name
