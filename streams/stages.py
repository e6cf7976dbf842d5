"""Where a batch's time goes in the worker, per stage (issue 60): the main thread's CPU time
each stage of ``Processor``'s pipeline used, and the wall time it took.

A batch's coroutine runs interleaved with Faust's and aiokafka's tasks on one event loop, so a
stage's CPU time cannot be read as the thread's CPU time between its start and its end: while
the stage awaits Redis or the broker, other tasks run. ``StageMeter.run`` wraps the batch's
coroutine and reads the thread's CPU clock (``time.thread_time_ns``) each time the coroutine
resumes and each time it suspends, so only its own turns count; ``stage(name)`` says which
stage those turns belong to. What the bench reads (``fairstream bench stream``): these per
stage, against the worker's main thread in all (the rest is Faust's delivery of messages,
aiokafka's producer, the event loop and the collector) and its other threads (the consumer's
fetches).

Stages: ``decode`` (JSON and validation), ``step`` (the rules of time, admission and the
engine's passes), ``views`` (operator views), ``explain`` (why tasks wait, every
``--explain-interval``), ``snapshot`` (encoding or forking one), ``persist`` (the Redis
transaction), ``journal`` (its record sent and acknowledged), ``publish`` (decisions handed to
the producer), ``settle`` (the broker's acknowledgements and clearing the outbox, outside the
lock), and ``lock`` (wall time only: waiting for another agent's batch).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Awaitable, Generator
from typing import Any, TypeVar

from prometheus_client.core import CounterMetricFamily

T = TypeVar("T")

STAGES = ("decode", "step", "views", "explain", "snapshot", "persist", "journal", "publish", "settle", "lock")
_UNNAMED = "other"  # a metered coroutine's turns outside any named stage (the pipeline's glue)


class StageMeter:
    """Per stage: main-thread CPU nanoseconds (of metered coroutines' own turns) and wall
    nanoseconds; and the input events and batches applied. Read at a scrape (``collect``)."""

    def __init__(self) -> None:
        self.cpu_ns: dict[str, int] = defaultdict(int)
        self.wall_ns: dict[str, int] = defaultdict(int)
        self.events = 0
        self.batches = 0
        self._running: _Metered | None = None  # the metered coroutine taking its turn now

    async def run(self, coroutine: Awaitable[T]) -> T:
        """Await ``coroutine``, its turns' CPU time counted to the stage each is in."""
        return await _Metered(coroutine, self)

    def stage(self, name: str) -> _Stage:
        """``with meter.stage(name):`` the enclosed code is stage ``name``: its wall time, and the
        CPU time of the metered coroutine's turns within it (outside a metered coroutine, only
        its wall time: its CPU time cannot be told from other tasks' if it awaits)."""
        return _Stage(self, name)

    def count_batch(self, events: int) -> None:
        """A batch of ``events`` input events decoded."""
        self.batches += 1
        self.events += events

    def waited(self, name: str, nanoseconds: int) -> None:
        """Wall time spent in ``name`` without running (waiting for the lock)."""
        self.wall_ns[name] += nanoseconds

    def collect(self):
        """Prometheus families (the registry calls this at each scrape)."""
        cpu = CounterMetricFamily("fairstream_stage_cpu_seconds",
                                  "Worker main-thread CPU time spent in each stage of applying batches "
                                  "(streams/stages.py)", labels=["stage"])
        wall = CounterMetricFamily("fairstream_stage_wall_seconds",
                                   "Wall time batches spent in each stage, waiting included", labels=["stage"])
        for name in sorted(set(self.cpu_ns) | set(self.wall_ns)):
            cpu.add_metric([name], self.cpu_ns.get(name, 0) / 1e9)
            wall.add_metric([name], self.wall_ns.get(name, 0) / 1e9)
        yield cpu
        yield wall
        events = CounterMetricFamily("fairstream_input_events_applied",
                                     "Input events decoded in batches (a message carrying several counts each)")
        events.add_metric([], self.events)
        yield events
        batches = CounterMetricFamily("fairstream_batches_applied", "Batches applied (engine passes and one commit each)")
        batches.add_metric([], self.batches)
        yield batches


class _Stage:
    """``StageMeter.stage``'s context (a class, not a generator: it is entered a dozen times a
    batch)."""

    __slots__ = ("meter", "name", "wall", "running", "outer")

    def __init__(self, meter: StageMeter, name: str) -> None:
        self.meter, self.name = meter, name

    def __enter__(self) -> None:
        self.wall = time.perf_counter_ns()
        self.running = running = self.meter._running
        if running is not None:
            self.outer = running.switch(self.name)

    def __exit__(self, *exc_info: object) -> None:
        # (A with-block does not span two coroutines: the one taking its turn is the one that entered.)
        if self.running is not None:
            self.running.switch(self.outer)
        self.meter.wall_ns[self.name] += time.perf_counter_ns() - self.wall


class _Metered:
    """An awaitable that runs ``coroutine`` and counts the CPU time of each of its turns (from
    a resume to the next suspension) to its current stage."""

    __slots__ = ("coroutine", "meter", "current", "started")

    def __init__(self, coroutine: Awaitable[Any], meter: StageMeter) -> None:
        self.coroutine = coroutine
        self.meter = meter
        self.current = _UNNAMED
        self.started = 0

    def switch(self, name: str) -> str:
        """Count the turn so far to the current stage and go on in ``name``; returns the stage left."""
        now = time.thread_time_ns()
        self.meter.cpu_ns[self.current] += now - self.started
        left, self.current, self.started = self.current, name, now
        return left

    def __await__(self) -> Generator[Any, Any, Any]:
        inner = self.coroutine.__await__()
        meter = self.meter
        sent: Any = None
        thrown: BaseException | None = None
        while True:
            outer, meter._running = meter._running, self
            self.started = time.thread_time_ns()
            try:
                yielded = inner.send(sent) if thrown is None else inner.throw(thrown)
            except StopIteration as done:
                return done.value
            finally:
                meter.cpu_ns[self.current] += time.thread_time_ns() - self.started
                meter._running = outer
            try:
                sent, thrown = (yield yielded), None
            except GeneratorExit:
                inner.close()
                raise
            except BaseException as exc:  # handed to the coroutine, as a Task would
                sent, thrown = None, exc
