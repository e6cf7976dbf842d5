"""JSON on the worker's hot path (input log, outbox, decisions, views): orjson, about five to ten
times faster than the standard library's encoder, which was the largest single cost of the
worker's own code under load (docs/benchmarks.md). Output is compact JSON that ``json.loads``
reads back to the same values."""

from __future__ import annotations

from typing import Any

import orjson


def dumps(value: Any) -> bytes:
    """Compact JSON bytes; numpy numbers and arrays are accepted too."""
    return orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY)


def dumps_line(value: Any) -> bytes:
    """``dumps(value)`` and a newline, made by orjson: a line of a JSON-lines file."""
    return orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_APPEND_NEWLINE)


def dumps_text(value: Any) -> str:
    return dumps(value).decode()


def dumps_document(value: Any) -> bytes:
    """A document people may open (``metrics.json``): indented by two spaces, keys that are
    not strings written as ``json.dumps`` writes them, and inf and NaN, which JSON lacks, as
    null. About 20 times faster than ``json.dumps(indent=...)``, which runs the standard
    library's encoder in Python, not in C."""
    return orjson.dumps(value, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS)


loads = orjson.loads

__all__ = ["dumps", "dumps_document", "dumps_line", "dumps_text", "loads"]
