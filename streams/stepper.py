"""A cluster's events, in arrival order, to engine steps: the worker's rules for time. Pure and
synchronous (no Kafka, Redis or asyncio), so they are tested as they are.

- Consecutive events within ``step_window`` seconds of event time (0: the same time) form one
  step, taken at the latest of their times: a scheduling cycle. With ``hold_open`` the last
  group is not stepped but handed back (``StepRun.open_items``): the next batch's events may
  still join it (the worker holds it for a bounded wait, ``Processor``), so where Kafka's
  batches happen to end does not split a step.
- An event behind the cluster's clock is applied at the clock. One more than ``max_lateness``
  behind is rejected only if its producer sent it late (``is_late``).
- An event more than ``max_ahead`` seconds ahead of the clock, beyond how far its producer's
  clock moved, is rejected: one bad clock must not move the cluster's time for everyone.
- An event the engine would reject is rejected before its time counts (``Engine.admission``).
- Before each step, nodes silent for more than ``node_timeout`` seconds of event time are
  declared lost (a ``NodeLost`` event, recorded in the log like any other).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Generic, Protocol, TypeVar

from fairstream.core.engine import Engine
from fairstream.core.model import Decision, Event, NodeLost, TaskCompleted, TaskSubmitted, TenantsChanged
from fairstream.wire.log import log_step


class Sent(Protocol):
    """What the rules read of the message an event came in: when its producer sent it (the
    Kafka record's timestamp in seconds; 0 where unknown)."""

    produced: float


M = TypeVar("M", bound=Sent)  # the messages the events came in, handed back as they were given


@dataclass(frozen=True)
class StepRules:
    max_lateness: float = 60.0
    max_ahead: float = 86400.0
    step_window: float = 0.0
    node_timeout: float = math.inf


@dataclass
class StepRun(Generic[M]):
    """What ``run_steps`` did: the log steps it took (``fairstream.wire.log``), their decisions,
    the tenants whose accounting an event or decision changed, the events it rejected as
    ``(message, index, reason)``, the latest ``produced`` of the events applied, and (with
    ``hold_open``) the items of the last group, not stepped, to be given again, first, with the
    next items (``produced`` is then as it was before them, so they are judged again alike)."""

    steps: list[dict] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)
    touched: set[str] = field(default_factory=set)
    rejected: list[tuple[M, int | None, str]] = field(default_factory=list)
    produced: float = 0.0
    open_items: list[tuple[Event, M, int | None]] = field(default_factory=list)


def run_steps(engine: Engine, items: Sequence[tuple[Event, M, int | None]], produced: float,
              rules: StepRules, hold_open: bool = False) -> StepRun[M]:
    """Apply ``items`` (event, the message it came in, its index in that message) to ``engine``
    as steps; ``produced`` is the latest record timestamp the cluster applied before.
    ``hold_open``: the last group is handed back unstepped (``StepRun.open_items``); the
    engine is then left as the steps before it left it."""
    out: StepRun[M] = StepRun()
    group: list[tuple[Event, M, int | None]] = []
    group_time: float | None = None  # the step's time: the latest event time in the group
    group_start: float | None = None
    produced_before_group = produced

    def flush() -> None:
        if not group:
            return
        assert group_time is not None  # (set with the group's first event)
        events = [e for e, _, _ in group]
        step_events = silent_nodes(engine, group_time, rules.node_timeout) + events
        result = engine.step(group_time, step_events)
        out.steps.append(log_step(group_time, step_events))
        out.decisions.extend(result.decisions)
        out.touched.update(d.tenant for d in result.decisions)
        out.touched.update(t.tenant for t in result.finished)
        out.touched.update(e.tenant for e in events if isinstance(e, TaskSubmitted))
        origin = {id(e): (m, index) for e, m, index in group}
        for event, reason in result.rejected:
            if id(event) in origin:
                out.rejected.append((*origin[id(event)], reason))
        group.clear()

    admission = engine.admission()  # what the engine would reject, before it moves the clock
    for event, message, index in items:
        clock = engine.time if group_time is None else group_time
        time = event.time
        if time is None:  # a configuration without a time: at the clock, recorded so
            time = clock if clock is not None else 0.0
            event = replace(event, time=time)
        if clock is not None and time > clock + rules.max_ahead + max(0.0, message.produced - produced):
            out.rejected.append((message, index,
                                 f"time {time} is {time - clock:.3f} s ahead of the cluster clock {clock} "
                                 f"(more than max_ahead {rules.max_ahead} s beyond how far its producer's "
                                 f"clock moved)"))
            continue
        if clock is not None and time < clock:
            if clock - time > rules.max_lateness and is_late(event, message, produced):
                out.rejected.append((message, index,
                                     f"time {time} is {clock - time:.3f} s behind the cluster clock {clock} "
                                     f"(more than max_lateness {rules.max_lateness} s), and it was produced "
                                     f"after the events that moved the clock"))
                continue
            event = replace(event, time=clock)  # late: applied now, recorded as applied
            time = clock
        if group_time is not None and group_start is not None and (time > group_start + rules.step_window
                                       or (rules.step_window == 0 and time != group_time)):
            flush()  # the engine's clock is now the group's time
            group_start = group_time = None
            admission = engine.admission()  # against the state with the group applied
        reason = admission.check(event)
        if reason is not None:  # rejected before its time counts: it moves nothing
            out.rejected.append((message, index, reason))
            continue
        if group_start is None:
            group_start, produced_before_group = time, produced
        produced = max(produced, message.produced)
        group_time = time if group_time is None else max(group_time, time)
        group.append((event, message, index))
    if hold_open and group:
        # (The items as given, not as judged: a late event's time is set at the clock again.)
        out.open_items = [(original, message, index) for original, message, index in _given(items, group)]
        out.produced = produced_before_group
        return out
    flush()
    out.produced = produced
    return out


def _given(items: Sequence[tuple[Event, M, int | None]], group: list[tuple[Event, M, int | None]]):
    """The items of ``group`` as ``items`` gave them (the group holds some with their time set
    at the clock), in order: matched by message and index."""
    wanted = {(id(message), index) for _, message, index in group}
    return [item for item in items if (id(item[1]), item[2]) in wanted]


def is_late(event: Event, message: Sent, produced: float) -> bool:
    """Whether an event more than ``max_lateness`` behind its cluster's clock was sent late by
    its producer, and so is rejected.

    Not a completion: it reports that a known task is done, and dropping it would leave the
    task holding its resources for ever; it is applied at the clock. Nor a new tenant tree: an
    operator's change, applied at the clock whenever it comes. Not an event produced
    before one the cluster already applied (``produced``, the latest record timestamp so far):
    that one is only late because the worker read it late, catching up after an outage or
    reading one topic ahead of another, and is applied at the clock too. The record timestamps
    come from the producers' clocks, so skew between a cluster's producers moves this line by
    as much."""
    return not isinstance(event, (TaskCompleted, TenantsChanged)) and message.produced >= produced


def silent_nodes(engine: Engine, now: float, node_timeout: float) -> list[Event]:
    """A ``NodeLost`` for each live node not heard from for more than ``node_timeout`` seconds."""
    if math.isinf(node_timeout):
        return []
    return [NodeLost(now, n.id) for n in engine.nodes if n.alive and now - n.last_heartbeat > node_timeout]
