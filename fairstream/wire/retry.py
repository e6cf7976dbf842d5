"""Trying again: the one retry helper of the worker and the producers.

A service that is down (the broker, Redis) is waited for with backoff, each failure logged with
the wait; what may not be retried (an error that may have written a message) is raised at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar

import structlog

T = TypeVar("T")

log = structlog.get_logger("fairstream.worker")


def backoff(first: float, longest: float) -> Iterator[float]:
    """Waits before successive retries: ``first``, doubling up to ``longest``."""
    delay = first
    while True:
        yield delay
        delay = min(2 * delay, longest)


async def waiting_for(action: Callable[[], Awaitable[T]], log_event: str | None, retry_on: type[BaseException] | tuple[type[BaseException], ...] = Exception,
                      delays: tuple[float, float] = (0.5, 10.0), give_up_after: float | None = None, **fields) -> T:
    """``await action()`` until it succeeds: for a service that is not up yet. Each failure of
    ``retry_on`` is logged as ``log_event`` (with ``fields``, the error and the wait; None: not
    logged) and tried again after ``backoff(*delays)``; after ``give_up_after`` seconds (None:
    never) the failure is raised."""
    waits = backoff(*delays)
    loop = asyncio.get_running_loop()
    deadline = None if give_up_after is None else loop.time() + give_up_after
    while True:
        try:
            return await action()
        except retry_on as exc:
            if deadline is not None and loop.time() > deadline:
                raise
            delay = next(waits)
            if log_event is not None:
                log.warning(log_event, **fields, error=f"{type(exc).__name__}: {exc}", retry_in_s=delay)
            await asyncio.sleep(delay)
