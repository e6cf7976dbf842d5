"""The garbage collector's settings for a long run of the engine, the same in both drivers:
the worker (``streams/run.py``) and the commands that simulate or bench (``cli.main``); and
the C allocator's, for the worker's memory to stay flat (``fix_mmap_threshold``,
``release_free_memory``).

A full collection walks every long-lived object: the engine's tasks, their running entries
and the remembered finished ids (20-60 ms at 5,000 tasks, far more with a backlog of 100,000).
CPython starts one after every 10 collections of generation 1 once a quarter of the
long-lived objects are new, so a run that queues and starts tasks quickly paid one every few
seconds: a quarter of ``bench engine``'s time. After 1,000 it is every ten minutes or more;
cyclic garbage that outlives two young collections waits that long (the engine's own objects
form no cycles: reference counting frees a task as soon as it is forgotten)."""

from __future__ import annotations

import ctypes
import gc
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from typing import Any

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


#: Blocks of at least this many bytes get pages of their own from the system, given back when
#: freed: glibc's default (128 KiB), held there (``fix_mmap_threshold``).
MMAP_THRESHOLD = 128 * 1024
_M_MMAP_THRESHOLD = -3  # mallopt's parameter number (glibc's malloc.h)


@cache
def _libc() -> Any:
    """glibc's functions, or None where the C library is not glibc."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        _ = libc.mallopt, libc.malloc_trim  # (both, or neither is used)
        return libc
    except (OSError, AttributeError):
        return None


def fix_mmap_threshold() -> bool:
    """Keep glibc's mmap threshold at ``MMAP_THRESHOLD`` for good; False where there is no glibc.

    By default glibc raises the threshold to the size of each large block freed (up to 32 MiB),
    so that later blocks that large come from the heap instead; the worker's large blocks (a
    snapshot of several MB as it is read and sent to Redis, Kafka's fetch buffers) then leave
    holes in the heap that its small objects pin. Issue 60, at 5,000 events/s for ten minutes:
    the worker's RSS rose 14 % from its first minute (116.8 -> 133.2 MB) with the default,
    8.7-9.1 % in three runs (115-116 -> 126-127 MB, flat from minute 6) with the threshold held."""
    libc = _libc()
    return bool(libc is not None and libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))


def release_free_memory() -> None:
    """Give the allocator's free pages back to the system (glibc's ``malloc_trim``; nothing
    where there is none): what a large piece of work freed would otherwise stay in the RSS."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


__all__ = ["FULL_COLLECTION_AFTER", "MMAP_THRESHOLD", "fix_mmap_threshold", "release_free_memory", "tune_gc",
           "tuned_gc"]
