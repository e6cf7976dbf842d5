"""Wire format of the streaming topics: decoding, validation and encoding.

Input topics carry JSON objects (schemas in ``fairstream/schemas/*.schema.json``, version 1):

- ``tasks.submitted``: ``{"cluster", "task", "job", "tenant", "demand", "time", "constraints"?, "count"?}``
  (with ``count``: a request of that many tasks ``<task>-0`` ... ``<task>-<count - 1>``)
- ``tasks.completed``: ``{"cluster", "task", "time", "status"}``
- ``nodes.heartbeats``: ``{"cluster", "node", "time", "capacity", "labels"?, "weights"?}``, or
  ``{"cluster", "node", "time", "lost": true}``: the node is gone (``NodeLost``)
- ``tenants.config``: ``{"cluster", "time"?, "tenants": [{"id", "parent"?, "weight"?, "min_share"?,
  "max_share"?}]}``: the cluster's whole tenant tree from then on (``TenantsChanged``)

A message may also carry several events of its topic's kind as a JSON array of such objects
(a job's tasks submitted together, a batch of completions from one agent), applied in order as
if sent one by one. The worker's cost is mostly per Kafka message (docs/benchmarks.md), so
agents that produce bursts should send them this way.

``decode_message(kind, raw)`` returns a ``Decoded`` (cluster, event) or a ``BadElement`` per
event of a message, or raises ``BadInput`` with a one-line reason when the message as a whole is
unusable. The worker sends bad input to the dead-letter topic with the original bytes (for a bad
element of an array, that element's JSON). The engine may
still reject a well-formed event (unknown task, duplicate, unknown resource): that reason goes
the same way.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
from dataclasses import dataclass
from functools import cache, lru_cache
from importlib import resources as package_files
from typing import Any, final

import jsonschema
import orjson

from fairstream.core.model import (
    CompletionStatus,
    Decision,
    Event,
    ModelError,
    NodeHeartbeat,
    NodeLost,
    TaskCompleted,
    TaskSubmitted,
    TenantsChanged,
    event_time,
)
from fairstream.core.tenants import spec_to_json, specs_from_json

SUBMITTED, COMPLETED, HEARTBEAT, CONFIG = "submitted", "completed", "heartbeat", "config"
KINDS = (SUBMITTED, COMPLETED, HEARTBEAT, CONFIG)
SCHEMA_FILES = {SUBMITTED: "task-submitted", COMPLETED: "task-completed", HEARTBEAT: "node-heartbeat",
                CONFIG: "tenants-config"}
DEFAULT_MAX_BYTES = 64 * 1024


class BadInput(ModelError):
    """Input that cannot be applied; the message is the dead-letter reason."""


@cache
def _validator(kind: str) -> jsonschema.Draft202012Validator:
    name = f"schemas/{SCHEMA_FILES[kind]}.schema.json"
    schema = json.loads(package_files.files("fairstream").joinpath(name).read_text())
    return jsonschema.Draft202012Validator(schema)


def _where(path) -> str:
    """A field's path for an error line; a key that is not printable (a newline in a tenant's
    name) is quoted with JSON escapes, so the reason stays one line."""
    return ".".join(str(p) if str(p).isprintable() else json.dumps(str(p)) for p in path) or "(message)"


_REQUIRED = {
    SUBMITTED: ("cluster", "task", "tenant", "demand", "time"),
    COMPLETED: ("cluster", "task", "time"),
    HEARTBEAT: ("cluster", "node", "time", "capacity"),
}
_OPTIONAL = {SUBMITTED: {"job", "constraints", "version", "count", "estimate", "gang"}, COMPLETED: {"status", "version"},
             HEARTBEAT: {"labels", "version"}}
_STRINGS = ("cluster", "task", "tenant", "job", "node")


# The largest time, demand or capacity an event may carry (the schemas' "maximum"): far past any
# real one (10^15 s is thirty million years), and sums of such numbers stay finite floats.
MAX_NUMBER = 1e15


def _number(value) -> bool:
    return value.__class__ in (int, float) and 0 <= value <= MAX_NUMBER


def _vector(value) -> bool:
    return value.__class__ is dict and bool(value) and all(_number(v) for v in value.values())


def _looks_valid(kind: str, doc) -> bool:
    """A conservative fast check of the plain shapes (no constraints, no labels, no status):
    True only if the schema would surely accept it. Anything else gets full validation."""
    if doc.__class__ is not dict or kind == CONFIG:  # configurations are rare: always validated whole
        return False
    required = _REQUIRED[kind]
    if not all(k in doc for k in required) or not set(doc) <= set(required) | _OPTIONAL[kind]:
        return False
    if "constraints" in doc or "labels" in doc or "status" in doc or "version" in doc or "count" in doc or "gang" in doc:
        return False
    for key in _STRINGS:
        if key in doc and not (doc[key].__class__ is str and 0 < len(doc[key]) <= 256):
            return False
    if not _number(doc["time"]) or ("estimate" in doc and not _number(doc["estimate"])):
        return False
    return _vector(doc["demand"]) if kind == SUBMITTED else (_vector(doc["capacity"]) if kind == HEARTBEAT else True)


def _parse(raw: bytes, max_bytes: int):
    """The message's JSON. orjson alone decides, and refuses what must not reach the engine or
    be written back: invalid UTF-8, lone surrogate escapes (no encoder could write them to
    Redis or Kafka again), nesting deeper than 1,024, NaN and numbers beyond a double's range.
    (The standard parser, a fallback once, took all of these and then failed later, outside
    the decoder, on every retry of the batch.)"""
    if len(raw) > max_bytes:
        raise BadInput(f"oversize message: {len(raw)} bytes > {max_bytes}")
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadInput(f"malformed JSON: {exc}") from None


@final  # (so ``type(item) is Decoded`` tells a type checker it is not a BadElement)
@dataclass(frozen=True)
class Decoded:
    """One event of a message; ``index`` is its position in a batch (None: a single event)."""

    cluster: str
    event: Event
    index: int | None = None


@final
@dataclass(frozen=True)
class BadElement:
    """One event of a batch message that cannot be applied: the reason and its position."""

    reason: str
    index: int


def decode_message(kind: str, raw: bytes, max_bytes: int = DEFAULT_MAX_BYTES) -> list[Decoded | BadElement]:
    """One message on the ``kind`` topic, a JSON object (one event) or an array of them, to a
    ``Decoded`` or ``BadElement`` per event, in order. Raises ``BadInput`` when the message is
    unusable as a whole (oversize, malformed JSON, an empty array, a bad single event)."""
    doc = _parse(raw, max_bytes)
    if doc.__class__ is not list:
        return [Decoded(*_event(kind, doc))]
    if not doc:
        raise BadInput("empty batch: a JSON array of events needs at least one")
    out: list[Decoded | BadElement] = []
    for index, element in enumerate(doc):
        try:
            out.append(Decoded(*_event(kind, element), index))
        except BadInput as exc:
            out.append(BadElement(str(exc), index))
    return out


def element_bytes(raw: bytes, index: int | None) -> bytes:
    """The original bytes of a message's event: the whole message for a single event, the
    element's own JSON for one in a batch (what its dead letter carries)."""
    if index is None:
        return raw
    start, end = _element_spans(raw)[index]
    return raw[start:end]


_WHITESPACE = b" \t\r\n"


@lru_cache(maxsize=16)
def _element_spans(raw: bytes) -> tuple[tuple[int, int], ...]:
    """Where each element of a message that is a JSON array stands in it, found in one pass
    however many of them are dead letters (a bytes object keeps its hash, so the cache does not
    read the message again), without recursion however deep an element nests (orjson's encoder
    stops at 255 levels, the standard one at Python's recursion limit). ``raw`` is JSON that
    parsed: strings are the only place a bracket or comma does not count."""
    spans: list[tuple[int, int]] = []
    depth, start, in_string, escaped = 0, None, False, False
    for i, c in enumerate(raw):
        if in_string:
            if escaped:
                escaped = False
            elif c == 0x5C:  # backslash
                escaped = True
            elif c == 0x22:  # closing quote
                in_string = False
            continue
        if depth == 1 and start is None and c not in _WHITESPACE and c not in b",]":
            start = i
        if c == 0x22:
            in_string = True
        elif c in b"[{":
            depth += 1
        elif c in b"]}":
            depth -= 1
            if depth == 0:  # the array's own closing bracket
                if start is not None:
                    spans.append((start, _trimmed(raw, i)))
                break
        elif c == 0x2C and depth == 1:  # the comma after an element
            assert start is not None  # (JSON that parsed: an element came before the comma)
            spans.append((start, _trimmed(raw, i)))
            start = None
    return tuple(spans)


def _trimmed(raw: bytes, end: int) -> int:
    while raw[end - 1] in _WHITESPACE:
        end -= 1
    return end


def _event(kind: str, doc: Any) -> tuple[str, Event]:
    if not _looks_valid(kind, doc):  # the common case skips the (slow) full validation
        error = jsonschema.exceptions.best_match(_validator(kind).iter_errors(doc))
        if error is not None:
            raise BadInput(f"{_where(error.absolute_path)}: {error.message}")
    if kind == CONFIG:
        at = event_time(float(doc["time"])) if "time" in doc else None
        return doc["cluster"], TenantsChanged(at, tuple(specs_from_json(doc["tenants"])))
    time = float(doc["time"])
    if not math.isfinite(time):
        raise BadInput("time: must be finite")
    time = event_time(time)  # to the microsecond, as the simulator (fairstream.core.model.TIME_DECIMALS)
    cluster = doc["cluster"]
    if kind == SUBMITTED:
        estimate, gang = doc.get("estimate"), doc.get("gang")
        return cluster, TaskSubmitted(time, doc["task"], doc.get("job", doc["task"]), doc["tenant"],
                                      doc["demand"], doc.get("constraints"), doc.get("count"),
                                      None if estimate is None else float(estimate),
                                      None if gang is None else gang["min"])
    if kind == COMPLETED:
        return cluster, TaskCompleted(time, doc["task"], CompletionStatus(doc.get("status", "succeeded")))
    if doc.get("lost") is True:
        return cluster, NodeLost(time, doc["node"])
    return cluster, NodeHeartbeat(time, doc["node"], doc["capacity"], doc.get("labels"), doc.get("weights"))


# ------------------------------------------------------------------------------ encoding


def event_to_json(event: Event) -> dict[str, Any]:
    """An engine event as a plain object (the recorded input log and ``simulate --events``)."""
    if isinstance(event, TaskSubmitted):
        out = {"type": SUBMITTED, "time": event.time, "task": event.task, "job": event.job,
               "tenant": event.tenant, "demand": dict(event.demand)}
        if event.constraints:
            out["constraints"] = dict(event.constraints)
        if event.count is not None:
            out["count"] = event.count
        if event.estimate is not None:
            out["estimate"] = event.estimate
        if event.gang is not None:
            out["gang"] = {"min": event.gang}
        return out
    if isinstance(event, TaskCompleted):
        return {"type": COMPLETED, "time": event.time, "task": event.task, "status": event.status.value}
    if isinstance(event, NodeHeartbeat):
        out = {"type": HEARTBEAT, "time": event.time, "node": event.node, "capacity": dict(event.capacity)}
        if event.labels is not None:
            out["labels"] = dict(event.labels)
        if event.weights is not None:
            out["weights"] = dict(event.weights)
        return out
    if isinstance(event, NodeLost):
        return {"type": "lost", "time": event.time, "node": event.node}
    if isinstance(event, TenantsChanged):
        return {"type": CONFIG, "time": event.time, "tenants": [spec_to_json(s) for s in event.tenants]}
    raise TypeError(type(event).__name__)


def event_from_json(doc: dict[str, Any]) -> Event:
    kind = doc.get("type")
    if kind == SUBMITTED:
        return TaskSubmitted(doc["time"], doc["task"], doc["job"], doc["tenant"], doc["demand"], doc.get("constraints"),
                             doc.get("count"), doc.get("estimate"), (doc.get("gang") or {}).get("min"))
    if kind == COMPLETED:
        return TaskCompleted(doc["time"], doc["task"], CompletionStatus(doc["status"]))
    if kind == HEARTBEAT:
        return NodeHeartbeat(doc["time"], doc["node"], doc["capacity"], doc.get("labels"), doc.get("weights"))
    if kind == "lost":
        return NodeLost(doc["time"], doc["node"])
    if kind == CONFIG:
        return TenantsChanged(doc["time"], tuple(specs_from_json(doc["tenants"])))
    raise ModelError(f"type: unknown event type {kind!r}")


def decision_message(cluster: str, decision: Decision) -> dict[str, Any]:
    return {"cluster": cluster, **decision.to_json()}


@dataclass(frozen=True)
class DeadLetter:
    """An input that could not be applied: where it came from, why, and its original bytes."""

    topic: str
    partition: int | None
    offset: int | None
    reason: str
    raw: bytes
    index: int | None = None  # position in a batch message; its ``raw`` is then that element's JSON

    def to_json(self) -> dict[str, Any]:
        where = {} if self.index is None else {"index": self.index}
        return {"topic": self.topic, "partition": self.partition, "offset": self.offset, **where,
                "reason": self.reason[:MAX_REASON], **_original(self.raw)}


# A dead letter must always be publishable: the original it carries is cut to this many
# characters (UTF-8) or bytes (base64). Escaped in JSON a control character takes six, so the
# message stays far under a producer's 1 MB limit whatever the input was.
MAX_ORIGINAL = 16 * 1024
MAX_REASON = 1024


def _original(raw: bytes) -> dict[str, Any]:
    """The original bytes as text (UTF-8) or base64; cut to ``MAX_ORIGINAL`` with a marker,
    the full length and its SHA-256 when longer, so the input can still be found in Kafka."""
    try:
        text = raw.decode("utf-8")
        kept: dict[str, Any] = {"original": text[:MAX_ORIGINAL]}
        cut = len(text) > MAX_ORIGINAL
    except UnicodeDecodeError:
        kept = {"original_base64": base64.b64encode(raw[:MAX_ORIGINAL]).decode("ascii")}
        cut = len(raw) > MAX_ORIGINAL
    if cut:
        kept.update(original_truncated=True, original_bytes=len(raw), original_sha256=hashlib.sha256(raw).hexdigest())
    return kept
