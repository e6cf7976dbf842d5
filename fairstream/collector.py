"""The garbage collector's settings for a long run of the engine, the same in both drivers:
the worker (``streams/run.py``) and the commands that simulate or bench (``cli.main``).

A full collection walks every long-lived object: the engine's tasks, their running entries
and the remembered finished ids (20-60 ms at 5,000 tasks, far more with a backlog of 100,000).
CPython starts one after every 10 collections of generation 1 once a quarter of the
long-lived objects are new, so a run that queues and starts tasks quickly paid one every few
seconds: a quarter of ``bench engine``'s time. After 1,000 it is every ten minutes or more;
cyclic garbage that outlives two young collections waits that long (the engine's own objects
form no cycles: reference counting frees a task as soon as it is forgotten)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

FULL_COLLECTION_AFTER = 1000  # generation-1 collections


def tune_gc() -> None:
    """Freeze what exists now (the modules loaded, and in the worker Faust, aiokafka and the
    schemas: objects that live as long as the process) so no pass walks it again, and make
    full passes rare."""
    gc.collect()
    gc.freeze()
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, FULL_COLLECTION_AFTER)


@contextmanager
def tuned_gc() -> Iterator[None]:
    """``tune_gc`` for the length of a ``with`` block, then the thresholds as they were and the
    frozen objects back in the collector's care (a command run inside a longer process, as the
    tests run them)."""
    before = gc.get_threshold()
    tune_gc()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


__all__ = ["FULL_COLLECTION_AFTER", "tune_gc", "tuned_gc"]
