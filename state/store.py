"""The worker's durable state, behind one small interface with two implementations.

Design (see docs/architecture.md, "State"): the engine is deterministic, so a cluster's state is
fully determined by the ordered input it applied. We store

- the **input log**: every step the engine took, ``{"time", "events"}``, in order;
- an occasional **snapshot** of the engine (plain data that cannot run code when read:
  ``engine_snapshot.py``) with the number of log steps it includes, so recovery replays only
  the log's tail;
- with a log retention (``fairstream worker --log-retention``), a few **checkpoints** (engine
  snapshots kept with their step number and event time): the log's head is trimmed up to the
  newest checkpoint older than the retention, which becomes the **base** the retained log
  replays from (``export-log --snapshot-out``);
- the **offsets** of the input messages already applied (per topic and partition), so
  messages that Kafka delivers again after a crash are skipped;
- the **outbox**: decisions and dead letters written before they are published, so a crash
  between the commit and the publish republishes them (decision ids make that idempotent);
- readable **views** for operators and tests: accumulated usage per tenant per round, quanta,
  task and node registries, tenant configuration.

One ``commit`` writes all of a batch's changes for every cluster in it atomically (one Redis
script call): either the batch's events, offsets and outputs are all durable, or none; and none
when a cluster's log is not as long as the committing worker expects (``StaleLog``: fencing).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Protocol

from redis.exceptions import ResponseError

from fairstream.wire.jsoncodec import dumps, loads

OutboxEntry = tuple[str, dict]  # (topic, message)


def outbox_key(topic: str, message: dict) -> str:
    """An outbox entry's identity: decisions by cluster and id (their idempotency key), dead
    letters by the input position they came from."""
    if "id" in message:
        return f"{topic}|{message.get('cluster', '')}|{message['id']}"
    return f"{topic}|{message.get('topic')}|{message.get('partition')}|{message.get('offset')}"


def outbox_field(batch: list[OutboxEntry]) -> str:
    """Where a batch's outbox is stored: its first entry's identity, which no other batch of
    any worker shares (a batch committed again after a failure overwrites its own)."""
    return outbox_key(*batch[0])


def republishing_order(batches: list[list[OutboxEntry]]) -> list[OutboxEntry]:
    """The entries of pending batches, in event-time order (ties by identity)."""
    entries = [entry for batch in batches for entry in batch]
    return sorted(entries, key=lambda e: (e[1].get("time", 0.0), outbox_key(*e)))


@dataclass
class ClusterRecord:
    """What ``load`` returns for one cluster."""

    snapshot: bytes | None = None
    snapshot_steps: int = 0  # how many log steps the snapshot already includes
    log: list[dict] = field(default_factory=list)  # steps after the snapshot
    log_base: int = 0  # steps trimmed from the log's head (the first kept step's number)
    checkpoints: list[tuple[int, float]] = field(default_factory=list)  # (steps, event time), oldest first
    # The step held open after the log's last one (``BatchCommit.open_steps``), or None.
    open_step: list[dict] | None = None


@dataclass
class Trim:
    """Drop the log's steps before ``new_base`` (the step number of a kept checkpoint) and the
    checkpoints before it."""

    old_base: int
    new_base: int
    dropped_checkpoints: list[int]


@dataclass
class RetainedLog:
    """What ``full_log`` returns: the retained steps and, when the head was trimmed, the engine
    snapshot they start from (None: they start from a fresh engine)."""

    steps: list[dict]
    base_steps: int = 0
    base_snapshot: bytes | None = None


class StaleLog(Exception):
    """A cluster's log in the store is not where the committing worker left it: another worker
    appended to it (this one lost the cluster's partition and does not know yet), or the store
    lost acknowledged writes. Nothing of the batch was written."""

    def __init__(self, cluster: str, expected: int, found: int) -> None:
        super().__init__(f"the log of cluster {cluster} has {found} steps, the worker expected {expected}")
        self.cluster, self.expected, self.found = cluster, expected, found


@dataclass
class BatchCommit:
    """Everything one processed batch changes.

    ``expected_steps``: per cluster, how many steps its log must hold (trimmed ones included)
    before this batch's, or the commit writes nothing and raises ``StaleLog`` (fencing: a
    worker that lost a cluster cannot append to its log, whoever took it over)."""

    steps: dict[str, list[dict]] = field(default_factory=dict)  # cluster -> new log steps
    snapshots: dict[str, tuple[bytes, int]] = field(default_factory=dict)  # cluster -> (engine, steps in it)
    offsets: dict[str, int] = field(default_factory=dict)  # "topic:partition" -> next offset to apply
    outbox: list[OutboxEntry] = field(default_factory=list)  # (topic, message), stored as one field
    views: dict[str, dict[str, dict[str, str]]] = field(default_factory=dict)  # cluster -> view -> field -> json
    checkpoints: dict[str, tuple[int, float, bytes]] = field(default_factory=dict)  # cluster -> (steps, time, engine)
    trims: dict[str, Trim] = field(default_factory=dict)  # cluster -> log head to drop
    expected_steps: dict[str, int] = field(default_factory=dict)  # cluster -> steps before this batch's
    # Views written whole: the old hash goes, this one stands (a tenant that left is not kept).
    replaced_views: dict[str, dict[str, dict[str, str]]] = field(default_factory=dict)  # cluster -> view -> fields
    history: dict[str, str] = field(default_factory=dict)  # cluster -> one sample appended to its history
    # cluster -> what an operator wants to see happened (preemptions, configuration changes
    # accepted or rejected), appended to its recent events, oldest first
    recent: dict[str, list[str]] = field(default_factory=dict)
    # cluster -> tenant -> (tasks preempted, work lost in task-seconds) in this batch, added to the
    # cluster's totals (what the page shows per tenant: ``preempted``)
    preempted: dict[str, dict[str, tuple[int, float]]] = field(default_factory=dict)
    # cluster -> the input of the step it holds open (its events' messages, ``streams.stepping``:
    # a batch ended inside a step window), replacing the last; None: none is open any more
    open_steps: dict[str, list[dict] | None] = field(default_factory=dict)


HISTORY_SAMPLES = 720  # a cluster's history keeps its last so many samples (an hour at 5 s)
RECENT_EVENTS = 200  # a cluster's recent events keep the last so many


class StateStore(Protocol):
    async def clusters(self) -> list[str]: ...
    async def load(self, cluster: str) -> ClusterRecord: ...
    async def offsets(self) -> dict[str, int]: ...
    async def commit(self, batch: BatchCommit) -> None: ...
    async def outbox(self) -> list[list[OutboxEntry]]: ...  # the batches committed, not yet published
    async def clear_outbox(self, published: list[list[OutboxEntry]]) -> None: ...
    async def view(self, cluster: str, name: str) -> dict[str, Any]: ...
    async def history(self, cluster: str) -> list[Any]: ...
    async def full_log(self, cluster: str) -> RetainedLog: ...
    async def open_steps(self) -> dict[str, Any]: ...  # cluster -> the input of the step it holds open


class MemoryStore:
    """In-process state: for the Faust ``test_context`` tests and single-process runs."""

    def __init__(self) -> None:
        self._log: dict[str, list[dict]] = {}
        self._snapshots: dict[str, tuple[bytes, int]] = {}
        self._offsets: dict[str, int] = {}
        self._outbox: dict[str, list[OutboxEntry]] = {}
        self._views: dict[str, dict[str, dict[str, str]]] = {}
        self._log_base: dict[str, int] = {}
        self._checkpoints: dict[str, dict[int, tuple[float, bytes]]] = {}
        self._history: dict[str, list[str]] = {}
        self._recent: dict[str, list[str]] = {}
        self._preempted: dict[str, dict[str, tuple[int, float]]] = {}
        self._open: dict[str, bytes] = {}

    async def clusters(self) -> list[str]:
        return sorted(self._log)

    async def load(self, cluster: str) -> ClusterRecord:
        snapshot, steps = self._snapshots.get(cluster, (None, 0))
        base = self._log_base.get(cluster, 0)
        points = sorted((s, t) for s, (t, _) in self._checkpoints.get(cluster, {}).items())
        held = self._open.get(cluster)
        return ClusterRecord(snapshot, steps, list(self._log.get(cluster, [])[steps - base:]), base, points,
                             None if held is None else loads(held))

    async def offsets(self) -> dict[str, int]:
        return dict(self._offsets)

    async def commit(self, batch: BatchCommit) -> None:
        for cluster, expected in batch.expected_steps.items():
            found = self._log_base.get(cluster, 0) + len(self._log.get(cluster, []))
            if found != expected:
                raise StaleLog(cluster, expected, found)
        for cluster, steps in batch.steps.items():
            self._log.setdefault(cluster, []).extend(steps)
        self._snapshots.update(batch.snapshots)
        self._offsets.update(batch.offsets)
        if batch.outbox:
            self._outbox[outbox_field(batch.outbox)] = list(batch.outbox)
        for cluster, views in batch.views.items():
            for name, fields in views.items():
                self._views.setdefault(cluster, {}).setdefault(name, {}).update(fields)
        for cluster, views in batch.replaced_views.items():
            for name, fields in views.items():
                self._views.setdefault(cluster, {})[name] = dict(fields)
        for cluster, sample in batch.history.items():
            self._history.setdefault(cluster, []).append(sample)
            del self._history[cluster][:-HISTORY_SAMPLES]
        for cluster, events in batch.recent.items():
            self._recent.setdefault(cluster, []).extend(events)
            del self._recent[cluster][:-RECENT_EVENTS]
        for cluster, totals in batch.preempted.items():
            kept = self._preempted.setdefault(cluster, {})
            for tenant, (tasks, lost) in totals.items():
                before = kept.get(tenant, (0, 0.0))
                kept[tenant] = (before[0] + tasks, before[1] + lost)
        for cluster, (at_step, time, blob) in batch.checkpoints.items():
            self._checkpoints.setdefault(cluster, {})[at_step] = (time, blob)
        for cluster, held in batch.open_steps.items():
            if held is None:
                self._open.pop(cluster, None)
            else:
                self._open[cluster] = dumps(held)  # (as Redis keeps it: JSON, nothing that runs)
        for cluster, trim in batch.trims.items():
            del self._log[cluster][: trim.new_base - trim.old_base]
            self._log_base[cluster] = trim.new_base
            for at_step in trim.dropped_checkpoints:
                self._checkpoints[cluster].pop(at_step, None)

    async def open_steps(self) -> dict[str, Any]:
        return {cluster: loads(held) for cluster, held in self._open.items()}

    async def outbox(self) -> list[list[OutboxEntry]]:
        return [list(batch) for batch in self._outbox.values()]

    async def clear_outbox(self, published: list[list[OutboxEntry]]) -> None:
        for batch in published:
            if batch:
                self._outbox.pop(outbox_field(batch), None)

    async def view(self, cluster: str, name: str) -> dict[str, Any]:
        return {k: loads(v) for k, v in self._views.get(cluster, {}).get(name, {}).items()}

    async def history(self, cluster: str) -> list[Any]:
        return [loads(v) for v in self._history.get(cluster, [])]

    def view_reader(self) -> MemoryViewReader:
        return MemoryViewReader(self)

    async def full_log(self, cluster: str) -> RetainedLog:
        base = self._log_base.get(cluster, 0)
        blob = self._checkpoints.get(cluster, {}).get(base, (0.0, None))[1] if base else None
        return RetainedLog(list(self._log.get(cluster, [])), base, blob)


class MemoryViewReader:
    """``ViewReader`` over a ``MemoryStore`` (single-process runs and their tests)."""

    def __init__(self, store: MemoryStore) -> None:
        self.store = store

    def clusters(self) -> list[str]:
        return sorted(self.store._log)

    def field(self, cluster: str, view: str, name: str) -> Any:
        raw = self.store._views.get(cluster, {}).get(view, {}).get(name)
        return None if raw is None else loads(raw)

    def fields(self, cluster: str, view: str) -> list[str]:
        return sorted(self.store._views.get(cluster, {}).get(view, {}))

    def history(self, cluster: str) -> list[Any]:
        return [loads(v) for v in self.store._history.get(cluster, [])]

    def recent(self, cluster: str) -> list[Any]:
        return [loads(v) for v in self.store._recent.get(cluster, [])]

    def preempted(self, cluster: str) -> dict[str, tuple[int, float]]:
        return dict(self.store._preempted.get(cluster, {}))


# One batch's commit, atomically: first the fencing checks (ARGV[1] of them, each a log key, its
# log_base key, the expected step count and the cluster's name), then the commands (each its
# argument count and arguments). A script runs as a whole with nothing else in between, and
# it returns before writing anything when a check fails (MULTI/EXEC cannot: a failed command
# inside it does not stop the others).
_CHECKED_COMMIT = """
local i = 2
for _ = 1, tonumber(ARGV[1]) do
  local found = redis.call('LLEN', ARGV[i]) + tonumber(redis.call('GET', ARGV[i + 1]) or '0')
  if found ~= tonumber(ARGV[i + 2]) then
    return redis.error_reply('STALE cluster=' .. ARGV[i + 3] .. ' expected=' .. ARGV[i + 2] .. ' found=' .. found)
  end
  i = i + 4
end
while i <= #ARGV do
  local count = tonumber(ARGV[i])
  redis.call(unpack(ARGV, i + 1, i + count))
  i = i + count + 1
end
return 0
"""
_STALE = re.compile(r"STALE cluster=(?P<cluster>.*) expected=(?P<expected>\d+) found=(?P<found>\d+)")
_CHUNK = 1000  # values per command: Lua's unpack has a stack limit of a few thousand


def _chunked(add, command: str, key: str, values: list, per_value: int = 1) -> None:
    """``command key values...`` as commands of at most ``_CHUNK`` values (``per_value``
    arguments each: 2 for a hash's field and value)."""
    step = _CHUNK * per_value
    for start in range(0, len(values), step):
        add((command, key, *values[start:start + step]))


class RedisStore:
    """The same state in Redis (``redis.asyncio``); keys under ``{prefix}:``.

    ``{p}:clusters`` set; per cluster ``{p}:c:{cluster}:log`` list of JSON steps,
    ``:log_base`` int (steps trimmed from its head), ``:snapshot`` bytes, ``:snapshot_steps`` int,
    ``:checkpoints`` hash steps -> event time, ``:checkpoint:{steps}`` bytes, ``:view:{name}`` hashes,
    ``:history`` and ``:recent`` lists (the last ``HISTORY_SAMPLES`` and ``RECENT_EVENTS``, JSON),
    ``:preempted_tasks`` and ``:preempted_lost`` hashes (per tenant, since the cluster's start),
    ``:open`` the JSON input of the step held open, if one is (``{p}:open`` the set of such clusters);
    ``{p}:offsets`` hash; ``{p}:outbox`` hash, one field per batch (``outbox_field``) holding the
    JSON list of its ``[topic, message]`` entries (one HDEL clears what a batch published,
    whoever else shares the hash).
    """

    def __init__(self, client, prefix: str = "fairstream") -> None:
        self.redis = client
        self.prefix = prefix
        self._checked_commit = client.register_script(_CHECKED_COMMIT)  # no I/O: loaded on first call

    def _key(self, *parts: str) -> str:
        return ":".join((self.prefix,) + parts)

    async def clusters(self) -> list[str]:
        return sorted(m.decode() for m in await self.redis.smembers(self._key("clusters")))

    async def load(self, cluster: str) -> ClusterRecord:
        pipe = self.redis.pipeline(transaction=True)
        pipe.get(self._key("c", cluster, "snapshot"))
        pipe.get(self._key("c", cluster, "snapshot_steps"))
        pipe.get(self._key("c", cluster, "log_base"))
        pipe.hgetall(self._key("c", cluster, "checkpoints"))
        pipe.get(self._key("c", cluster, "open"))
        snapshot, steps, base, points, held = await pipe.execute()
        steps, base = int(steps or 0), int(base or 0)
        log = await self.redis.lrange(self._key("c", cluster, "log"), steps - base, -1)
        checkpoints = sorted((int(s), float(t)) for s, t in points.items())
        return ClusterRecord(snapshot, steps, [loads(s) for s in log], base, checkpoints,
                             None if held is None else loads(held))

    async def offsets(self) -> dict[str, int]:
        raw = await self.redis.hgetall(self._key("offsets"))
        return {k.decode(): int(v) for k, v in raw.items()}

    async def commit(self, batch: BatchCommit) -> None:
        """Write ``batch`` atomically: one script call checks every cluster's log length and
        then runs the batch's commands, or writes nothing (``StaleLog``)."""
        commands: list[tuple] = []
        add = commands.append
        for cluster, steps in batch.steps.items():
            add(("SADD", self._key("clusters"), cluster))
            if steps:
                _chunked(add, "RPUSH", self._key("c", cluster, "log"), [dumps(s) for s in steps])
        for cluster, (blob, at_step) in batch.snapshots.items():
            add(("SET", self._key("c", cluster, "snapshot"), blob))
            add(("SET", self._key("c", cluster, "snapshot_steps"), at_step))
        if batch.offsets:
            _chunked(add, "HSET", self._key("offsets"), [x for pair in batch.offsets.items() for x in pair], 2)
        if batch.outbox:
            # One field per batch, not per entry: a batch is published and cleared as a whole.
            add(("HSET", self._key("outbox"), outbox_field(batch.outbox), dumps(batch.outbox)))
        for cluster, views in batch.views.items():
            for name, fields in views.items():
                if fields:
                    _chunked(add, "HSET", self._key("c", cluster, "view", name),
                             [x for pair in fields.items() for x in pair], 2)
        for cluster, views in batch.replaced_views.items():
            for name, fields in views.items():
                add(("DEL", self._key("c", cluster, "view", name)))
                if fields:
                    _chunked(add, "HSET", self._key("c", cluster, "view", name),
                             [x for pair in fields.items() for x in pair], 2)
        for cluster, sample in batch.history.items():
            add(("RPUSH", self._key("c", cluster, "history"), sample))
            add(("LTRIM", self._key("c", cluster, "history"), -HISTORY_SAMPLES, -1))
        for cluster, events in batch.recent.items():
            if events:
                _chunked(add, "RPUSH", self._key("c", cluster, "recent"), events[-RECENT_EVENTS:], 1)
                add(("LTRIM", self._key("c", cluster, "recent"), -RECENT_EVENTS, -1))
        for cluster, totals in batch.preempted.items():
            for tenant, (tasks, lost) in totals.items():
                add(("HINCRBY", self._key("c", cluster, "preempted_tasks"), tenant, tasks))
                add(("HINCRBYFLOAT", self._key("c", cluster, "preempted_lost"), tenant, repr(float(lost))))
        for cluster, (at_step, time, blob) in batch.checkpoints.items():
            add(("SET", self._key("c", cluster, "checkpoint", str(at_step)), blob))
            add(("HSET", self._key("c", cluster, "checkpoints"), str(at_step), repr(time)))
        for cluster, held in batch.open_steps.items():
            if held is None:
                add(("DEL", self._key("c", cluster, "open")))
                add(("SREM", self._key("open"), cluster))
            else:
                add(("SET", self._key("c", cluster, "open"), dumps(held)))
                add(("SADD", self._key("open"), cluster))
        for cluster, trim in batch.trims.items():
            # After this batch's RPUSH, in the same script: the head goes, the tail stays.
            add(("LTRIM", self._key("c", cluster, "log"), trim.new_base - trim.old_base, -1))
            add(("SET", self._key("c", cluster, "log_base"), trim.new_base))
            for at_step in trim.dropped_checkpoints:
                add(("DEL", self._key("c", cluster, "checkpoint", str(at_step))))
                add(("HDEL", self._key("c", cluster, "checkpoints"), str(at_step)))
        args: list = [len(batch.expected_steps)]
        for cluster, expected in batch.expected_steps.items():
            args += [self._key("c", cluster, "log"), self._key("c", cluster, "log_base"), expected, cluster]
        for command in commands:
            args.append(len(command))
            args.extend(command)
        try:
            await self._checked_commit(args=args)
        except ResponseError as exc:
            stale = _STALE.search(str(exc))
            if stale is None:
                raise
            raise StaleLog(stale["cluster"], int(stale["expected"]), int(stale["found"])) from None

    async def open_steps(self) -> dict[str, Any]:
        """Per cluster holding a step open, its input (``BatchCommit.open_steps``)."""
        clusters = sorted(m.decode() for m in await self.redis.smembers(self._key("open")))
        if not clusters:
            return {}
        held = await self.redis.mget([self._key("c", cluster, "open") for cluster in clusters])
        return {cluster: loads(doc) for cluster, doc in zip(clusters, held) if doc is not None}

    async def outbox(self) -> list[list[OutboxEntry]]:
        """The batches committed but not yet published."""
        return [[(topic, message) for topic, message in loads(batch)]
                for batch in (await self.redis.hgetall(self._key("outbox"))).values()]

    async def clear_outbox(self, published: list[list[OutboxEntry]]) -> None:
        """Remove exactly these batches (several workers of one group share the outbox, so
        clearing it whole could drop another worker's unpublished ones)."""
        fields = {outbox_field(batch) for batch in published if batch}
        if fields:
            await self.redis.hdel(self._key("outbox"), *fields)

    async def view(self, cluster: str, name: str) -> dict[str, Any]:
        raw = await self.redis.hgetall(self._key("c", cluster, "view", name))
        return {k.decode(): loads(v) for k, v in raw.items()}

    async def history(self, cluster: str) -> list[Any]:
        return [loads(v) for v in await self.redis.lrange(self._key("c", cluster, "history"), 0, -1)]

    async def full_log(self, cluster: str) -> RetainedLog:
        while True:
            pipe = self.redis.pipeline(transaction=True)
            pipe.get(self._key("c", cluster, "log_base"))
            pipe.lrange(self._key("c", cluster, "log"), 0, -1)
            base, steps = await pipe.execute()
            base = int(base or 0)
            if not base:
                return RetainedLog([loads(s) for s in steps])
            pipe = self.redis.pipeline(transaction=True)
            pipe.get(self._key("c", cluster, "log_base"))
            pipe.get(self._key("c", cluster, "checkpoint", str(base)))
            base_now, blob = await pipe.execute()
            if int(base_now or 0) == base:  # else a worker trimmed in between: read again
                return RetainedLog([loads(s) for s in steps], base, blob)  # blob None: its checkpoint is gone


class ViewReader:
    """What the worker wrote for operators, read synchronously (``fairstream status``,
    ``pending``, the HTTP API's threads): the same keys as ``RedisStore``."""

    def __init__(self, client, prefix: str = "fairstream") -> None:
        self.redis = client
        self.prefix = prefix

    def _key(self, *parts: str) -> str:
        return ":".join((self.prefix,) + parts)

    def clusters(self) -> list[str]:
        return sorted(m.decode() for m in self.redis.smembers(self._key("clusters")))

    def field(self, cluster: str, view: str, name: str) -> Any:
        """One field of a view, decoded, or None."""
        raw = self.redis.hget(self._key("c", cluster, "view", view), name)
        return None if raw is None else loads(raw)

    def fields(self, cluster: str, view: str) -> list[str]:
        return sorted(k.decode() for k in self.redis.hkeys(self._key("c", cluster, "view", view)))

    def history(self, cluster: str) -> list[Any]:
        return [loads(v) for v in self.redis.lrange(self._key("c", cluster, "history"), 0, -1)]

    def recent(self, cluster: str) -> list[Any]:
        return [loads(v) for v in self.redis.lrange(self._key("c", cluster, "recent"), 0, -1)]

    def preempted(self, cluster: str) -> dict[str, tuple[int, float]]:
        """Per tenant: its tasks preempted and their work lost (task-seconds), since the cluster's start."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.hgetall(self._key("c", cluster, "preempted_tasks"))
        pipe.hgetall(self._key("c", cluster, "preempted_lost"))
        tasks, lost = pipe.execute()
        return {tenant.decode(): (int(count), float(lost.get(tenant, 0.0))) for tenant, count in tasks.items()}


def redis_client(url: str, sync: bool = False, **options):
    """A ``redis.asyncio`` client (``sync``: a plain ``redis`` one); TLS with a ``rediss://``
    URL. The password: the URL's, else the file ``FAIRSTREAM_REDIS_PASSWORD_FILE`` names (a
    mounted secret; its last newline dropped), else ``FAIRSTREAM_REDIS_PASSWORD``: so it need
    not be on a command line, where every user of the machine can read it."""
    import os

    import redis
    import redis.asyncio as aioredis

    env = os.environ
    if "password" not in options:
        if env.get("FAIRSTREAM_REDIS_PASSWORD_FILE"):
            from pathlib import Path

            options["password"] = Path(env["FAIRSTREAM_REDIS_PASSWORD_FILE"]).read_text().removesuffix("\n")
        elif env.get("FAIRSTREAM_REDIS_PASSWORD"):
            options["password"] = env["FAIRSTREAM_REDIS_PASSWORD"]
    return (redis if sync else aioredis).from_url(url, **options)  # a password in the URL overrides these
