"""Trying again: the one retry helper of the worker and the producers.

A service that is down (the broker, Redis) is waited for with backoff, each failure logged with
the wait; what may not be retried (an error that may have written a message) is raised at once.
``Retry`` holds the waits, the log line and the deadline of one action tried again;
``waiting_for`` is the common loop over it (every failure of a kind tried again). A caller
whose failures need telling apart (a batch that fails for its input, not for a service) keeps
its loop and leaves the waiting to ``Retry.after``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import structlog

T = TypeVar("T")

log = structlog.get_logger("fairstream.worker")


def backoff(first: float, longest: float) -> Iterator[float]:
    """Waits before successive retries: ``first``, doubling up to ``longest``."""
    delay = first
    while True:
        yield delay
        delay = min(2 * delay, longest)


class Retry:
    """One action tried again until it succeeds: ``await retry.after(exc)`` after each failure
    logs ``log_event`` (at ``level``, to ``logger`` or the worker's, with ``fields``, the error
    and the wait; None: not logged) and waits ``backoff(*delays)``; past ``give_up_after``
    seconds from when the ``Retry`` was made, before the first try (None: never), it raises the
    failure instead."""

    def __init__(self, log_event: str | None, delays: tuple[float, float] = (0.5, 10.0),
                 give_up_after: float | None = None, level: str = "warning", logger: Any = None, **fields: Any) -> None:
        self.log_event, self.fields = log_event, fields
        self.write = getattr(logger or log, level)
        self.waits = backoff(*delays)
        self.deadline = None if give_up_after is None else asyncio.get_running_loop().time() + give_up_after

    async def after(self, exc: BaseException, **more: Any) -> None:
        """``exc`` failed the action: wait before it is tried again (``more``: fields of this
        failure's log line), or raise ``exc`` if the time to give up has come. Called from the
        ``except`` block that caught ``exc``."""
        if self.deadline is not None and asyncio.get_running_loop().time() > self.deadline:
            raise exc
        delay = next(self.waits)
        if self.log_event is not None:
            self.write(self.log_event, **self.fields, **more, error=f"{type(exc).__name__}: {exc}", retry_in_s=delay)
        await asyncio.sleep(delay)


async def waiting_for(action: Callable[[], Awaitable[T]], log_event: str | None, retry_on: type[BaseException] | tuple[type[BaseException], ...] = Exception,
                      delays: tuple[float, float] = (0.5, 10.0), give_up_after: float | None = None, logger: Any = None,
                      **fields) -> T:
    """``await action()`` until it succeeds: for a service that is not up yet. Each failure of
    ``retry_on`` is logged as ``log_event`` (to ``logger`` or the worker's, with ``fields``, the
    error and the wait; None: not logged) and tried again after ``backoff(*delays)``; after
    ``give_up_after`` seconds (None: never) the failure is raised (``Retry``)."""
    retry = Retry(log_event, delays, give_up_after, logger=logger, **fields)
    while True:
        try:
            return await action()
        except retry_on as exc:
            await retry.after(exc)
