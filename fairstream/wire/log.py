"""The worker's input log: one entry per engine step, ``{"time": t, "events": [...]}``, the
events in ``event_to_json``'s form (the topics' fields plus ``type``; ``lost`` for a node the
worker declared lost). The worker's Redis log, ``fairstream export-log`` files and
``simulate --events`` hold it.

``replay`` is the one way an engine is driven through a log: worker recovery, the command
line and the tests all use it, so a replay takes exactly the decisions the worker took
(decisions are a function of the ordered input alone)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, Protocol

from fairstream.core.model import Event, ModelError
from fairstream.wire.events import event_from_json, event_to_json


class Steps(Protocol):
    """What ``replay`` drives: ``Engine.step`` (a protocol, so the wire format loads no engine)."""

    def step(self, time: float, events: list[Event]) -> Any: ...


def log_step(time: float, events: Iterable[Event]) -> dict[str, Any]:
    """One log entry: the step's time and its events, as the worker records it."""
    return {"time": time, "events": [event_to_json(event) for event in events]}


def parse_log_step(doc: Any) -> tuple[float, list[Event]]:
    """A log entry's time and events; raises ``ModelError`` for anything else."""
    try:
        return float(doc["time"]), [event_from_json(event) for event in doc["events"]]
    except ModelError:
        raise
    except (ValueError, KeyError, TypeError) as exc:
        raise ModelError(f"not a recorded step ({type(exc).__name__}: {exc})") from None


def replay(engine: Steps, steps: Iterable[Any]) -> Iterator[Any]:
    """Apply ``steps`` (log entries, in order) to ``engine``; yields each step's result
    (``StepResult``: decisions, rejections, finished tasks) as it is taken."""
    for doc in steps:
        time, events = parse_log_step(doc)
        yield engine.step(time, events)


def events_in(steps: Iterable[dict[str, Any]]) -> int:
    """How many events log entries hold (what replaying them costs)."""
    return sum(len(step["events"]) for step in steps)
