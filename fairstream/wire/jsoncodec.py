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


def dumps_text(value: Any) -> str:
    return dumps(value).decode()


loads = orjson.loads

__all__ = ["dumps", "dumps_text", "loads"]
