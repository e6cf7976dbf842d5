"""When the worker snapshots a cluster's engine, how it bounds the cluster's log, and how a
snapshot is encoded in a forked child so the worker goes on answering meanwhile.

A snapshot is the engine as plain data (``state/engine_snapshot.py``) with the number of log
steps it holds; recovery loads it and replays the log after it (``fairstream.wire.log``). The
functions here work on one ``ClusterSession`` and add what is due to a ``BatchCommit``; the
processor commits it."""

from __future__ import annotations

import asyncio
import math
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cache

import structlog

from fairstream.collector import release_free_memory
from fairstream.core.engine import Engine
from fairstream.state.engine_snapshot import encode_engine
from fairstream.state.store import BatchCommit, Trim

log = structlog.get_logger("fairstream.worker")


@dataclass(frozen=True)
class SnapshotRules:
    """``every``: at least that many log steps between snapshots; ``ratio``: and a log after the
    last one that holds ``ratio`` times as many events as the engine holds state (``due``);
    ``log_retention``: seconds of event time of log kept (``retain``; infinite: all of it)."""

    every: int = 500
    ratio: float = 2.0
    log_retention: float = math.inf


@dataclass
class Snapshotting:
    """A snapshot being encoded in a child process: the engine as of ``steps`` log steps."""

    steps: int
    time: float
    blob: asyncio.Future  # the encoded engine


def due(session, rules: SnapshotRules) -> bool:
    """After a new cluster's first batch; then at least ``every`` steps since the last
    snapshot, and a log after it that holds ``ratio`` times as many events as the engine holds
    tasks and remembered finished ids (or, with a bounded log, a quarter of its retention of
    event time).

    Encoding costs time in proportion to that state (about 1 µs per task or id, during which
    the worker answers nothing unless a child encodes it), replaying the log in proportion to
    its events: so the pause is rare when the state is large, the snapshot's amortised cost per
    event is bounded, and a recovery replays at most about ``ratio`` times the state."""
    engine = session.engine
    if session.steps_at_snapshot == 0 and session.steps_taken > 0:
        # A new cluster's first batch: from then on its state in the store is an engine and the
        # log after it, which a tool can read without the worker's configuration (``fairstream
        # configure`` checks a new tree against it as the worker will).
        return True
    if session.steps_taken - session.steps_at_snapshot < rules.every:
        return False
    if session.events_since_snapshot >= rules.ratio * (len(engine.tasks) + len(engine.finished_ids)):
        return True
    return (engine.time or 0.0) - session.time_at_snapshot >= rules.log_retention / 4


def add_snapshot(cluster: str, session, steps: int, at: float, blob: bytes, commit: BatchCommit,
                 rules: SnapshotRules) -> None:
    """Put the snapshot ``blob`` (the engine as of ``steps`` log steps, event time ``at``) into
    ``commit``, with what bounding the log then asks for."""
    commit.snapshots[cluster] = (blob, steps)
    if math.isfinite(rules.log_retention):
        retain(cluster, session, steps, at, blob, commit, rules.log_retention)


def retain(cluster: str, session, steps: int, now: float, blob: bytes, commit: BatchCommit,
           retention: float) -> None:
    """Bound the input log to about ``retention`` seconds of event time.

    A snapshot becomes a checkpoint when the last one is a quarter of the retention old; the
    log's head is trimmed up to the newest checkpoint at least the retention old, which becomes
    the base the kept log replays from. So between R and 1.25 R of the log is kept
    (R = ``retention``), with at most about five checkpoints in the store."""
    points = session.checkpoints
    if not points or now - points[-1][1] >= retention / 4:
        points.append((steps, now))
        commit.checkpoints[cluster] = (steps, now, blob)
    old_enough = [point for point in points if point[1] <= now - retention]
    if old_enough and old_enough[-1][0] > session.log_base:
        new_base = old_enough[-1][0]
        dropped = [s for s, _ in points if s < new_base]
        commit.trims[cluster] = Trim(session.log_base, new_base, dropped)
        session.log_base = new_base
        session.checkpoints = [point for point in points if point[0] >= new_base]


def land_snapshot(cluster: str, session, commit: BatchCommit, rules: SnapshotRules) -> None:
    """Add a finished background snapshot of the cluster to ``commit``: the engine as of its
    ``steps``, before this batch's steps, which the log after it replays."""
    pending = session.snapshotting
    if pending is None or not pending.blob.done():
        return
    session.snapshotting = None
    if pending.blob.cancelled() or pending.blob.exception() is not None:
        # Nothing lost: the last snapshot and the longer log still recover the engine.
        log.error("worker.snapshot_failed", cluster=cluster, steps=pending.steps,
                  error=str(pending.blob.exception() or "cancelled"))
        return
    blob = pending.blob.result()
    log.info("worker.snapshot_stored", cluster=cluster, steps=pending.steps, bytes=len(blob))
    add_snapshot(cluster, session, pending.steps, pending.time, blob, commit, rules)


def snapshot_in_child(engine: Engine) -> asyncio.Future:
    """Encode ``engine`` in a forked child that writes it to a pipe; the worker's one snapshot
    reading thread reads it (``os.read`` releases the interpreter lock) and reaps the child.

    The child sees the memory as it was at the fork, copy-on-write, whatever the worker does
    meanwhile; it runs only the encoder and leaves with ``os._exit`` (no finalizers, no
    flush of buffers it shares with the parent)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        status = 1
        try:
            os.close(read_end)
            view = memoryview(encoded(engine))
            while view:
                view = view[os.write(write_end, view):]
            status = 0
        finally:
            os._exit(status)
    os.close(write_end)
    future = asyncio.get_running_loop().run_in_executor(_reader(), _collect_snapshot, pid, read_end)
    future.add_done_callback(lambda done: done.cancelled() or done.exception())  # read in land_snapshot
    return future


@cache
def _reader() -> ThreadPoolExecutor:
    """The one thread that reads snapshots. Not the default executor's pool: glibc gives each
    thread that allocates an arena of its own, and each snapshot read by another thread of the
    pool left the worker 5-9 MB larger until all of them had one (issue 60: at 5,000 events/s,
    115 MB at one minute and 142 MB from the sixth, in steps a snapshot apart). Reading on the
    event loop instead grew the main arena without end (172 MB at ten minutes)."""
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="fairstream-snapshot")


def _collect_snapshot(pid: int, read_end: int) -> bytes:
    chunks = []
    try:
        while chunk := os.read(read_end, 1 << 20):
            chunks.append(chunk)
    finally:
        os.close(read_end)
        _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code != 0:  # negative: killed by that signal (the kernel's OOM killer, say)
        raise RuntimeError(f"the snapshot process exited with code {code}")
    blob = b"".join(chunks)
    del chunks
    release_free_memory()
    return blob


def encoded(engine: Engine) -> bytes:
    """The engine as a snapshot (``encode_engine``), the garbage collector paused meanwhile."""
    # The collector would walk the whole heap several times while the encoder allocates its
    # lists; nothing it could free is made here, so it waits until the snapshot is taken.
    import gc

    enabled = gc.isenabled()
    gc.disable()
    try:
        return encode_engine(engine)
    finally:
        if enabled:
            gc.enable()
