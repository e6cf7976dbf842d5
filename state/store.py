"""The worker's durable state, behind one small interface with two implementations.

Design (see docs/architecture.md, "State"): the engine is deterministic, so a cluster's state is
fully determined by the ordered input it applied. We store

- the **input log**: every step the engine took, ``{"time", "events"}``, in order;
- an occasional **snapshot** of the engine (pickled) with the number of log steps it includes,
  so recovery replays only the log's tail;
- the **offsets** of the input messages already applied (per topic and partition), so
  messages that Kafka delivers again after a crash are skipped;
- the **outbox**: decisions and dead letters written before they are published, so a crash
  between the commit and the publish republishes them (decision ids make that idempotent);
- readable **views** for operators and tests: accumulated usage per tenant per round, quanta,
  task and node registries, tenant configuration.

One ``commit`` writes all of a batch's changes for every cluster in it atomically (a Redis
MULTI/EXEC pipeline): either the batch's events, offsets and outputs are all durable, or none.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass
class ClusterRecord:
    """What ``load`` returns for one cluster."""

    snapshot: bytes | None = None
    snapshot_steps: int = 0  # how many log steps the snapshot already includes
    log: list[dict] = field(default_factory=list)  # steps after the snapshot


@dataclass
class BatchCommit:
    """Everything one processed batch changes."""

    steps: dict[str, list[dict]] = field(default_factory=dict)  # cluster -> new log steps
    snapshots: dict[str, tuple[bytes, int]] = field(default_factory=dict)  # cluster -> (engine, steps in it)
    offsets: dict[str, int] = field(default_factory=dict)  # "topic:partition" -> next offset to apply
    outbox: list[tuple[str, dict]] = field(default_factory=list)  # (topic, message)
    views: dict[str, dict[str, dict[str, str]]] = field(default_factory=dict)  # cluster -> view -> field -> json


class StateStore(Protocol):
    async def clusters(self) -> list[str]: ...
    async def load(self, cluster: str) -> ClusterRecord: ...
    async def offsets(self) -> dict[str, int]: ...
    async def commit(self, batch: BatchCommit) -> None: ...
    async def outbox(self) -> list[tuple[str, dict]]: ...
    async def clear_outbox(self, published: list[tuple[str, dict]]) -> None: ...
    async def view(self, cluster: str, name: str) -> dict[str, Any]: ...
    async def full_log(self, cluster: str) -> list[dict]: ...


class MemoryStore:
    """In-process state: for the Faust ``test_context`` tests and single-process runs."""

    def __init__(self) -> None:
        self._log: dict[str, list[dict]] = {}
        self._snapshots: dict[str, tuple[bytes, int]] = {}
        self._offsets: dict[str, int] = {}
        self._outbox: list[tuple[str, dict]] = []
        self._views: dict[str, dict[str, dict[str, str]]] = {}

    async def clusters(self) -> list[str]:
        return sorted(self._log)

    async def load(self, cluster: str) -> ClusterRecord:
        snapshot, steps = self._snapshots.get(cluster, (None, 0))
        return ClusterRecord(snapshot, steps, list(self._log.get(cluster, [])[steps:]))

    async def offsets(self) -> dict[str, int]:
        return dict(self._offsets)

    async def commit(self, batch: BatchCommit) -> None:
        for cluster, steps in batch.steps.items():
            self._log.setdefault(cluster, []).extend(steps)
        self._snapshots.update(batch.snapshots)
        self._offsets.update(batch.offsets)
        self._outbox.extend(batch.outbox)
        for cluster, views in batch.views.items():
            for name, fields in views.items():
                self._views.setdefault(cluster, {}).setdefault(name, {}).update(fields)

    async def outbox(self) -> list[tuple[str, dict]]:
        return list(self._outbox)

    async def clear_outbox(self, published: list[tuple[str, dict]]) -> None:
        for item in published:
            if item in self._outbox:
                self._outbox.remove(item)

    async def view(self, cluster: str, name: str) -> dict[str, Any]:
        return {k: json.loads(v) for k, v in self._views.get(cluster, {}).get(name, {}).items()}

    async def full_log(self, cluster: str) -> list[dict]:
        return list(self._log.get(cluster, []))


class RedisStore:
    """The same state in Redis (``redis.asyncio``); keys under ``{prefix}:``.

    ``{p}:clusters`` set; per cluster ``{p}:c:{cluster}:log`` list of JSON steps,
    ``:snapshot`` bytes, ``:snapshot_steps`` int, ``:view:{name}`` hashes;
    ``{p}:offsets`` hash; ``{p}:outbox`` list of JSON ``[topic, message]``.
    """

    def __init__(self, client, prefix: str = "fairstream") -> None:
        self.redis = client
        self.prefix = prefix

    def _key(self, *parts: str) -> str:
        return ":".join((self.prefix,) + parts)

    async def clusters(self) -> list[str]:
        return sorted(m.decode() for m in await self.redis.smembers(self._key("clusters")))

    async def load(self, cluster: str) -> ClusterRecord:
        pipe = self.redis.pipeline(transaction=True)
        pipe.get(self._key("c", cluster, "snapshot"))
        pipe.get(self._key("c", cluster, "snapshot_steps"))
        snapshot, steps = await pipe.execute()
        steps = int(steps or 0)
        log = await self.redis.lrange(self._key("c", cluster, "log"), steps, -1)
        return ClusterRecord(snapshot, steps, [json.loads(s) for s in log])

    async def offsets(self) -> dict[str, int]:
        raw = await self.redis.hgetall(self._key("offsets"))
        return {k.decode(): int(v) for k, v in raw.items()}

    async def commit(self, batch: BatchCommit) -> None:
        pipe = self.redis.pipeline(transaction=True)
        for cluster, steps in batch.steps.items():
            pipe.sadd(self._key("clusters"), cluster)
            if steps:
                pipe.rpush(self._key("c", cluster, "log"), *[json.dumps(s, separators=(",", ":")) for s in steps])
        for cluster, (blob, steps) in batch.snapshots.items():
            pipe.set(self._key("c", cluster, "snapshot"), blob)
            pipe.set(self._key("c", cluster, "snapshot_steps"), steps)
        if batch.offsets:
            pipe.hset(self._key("offsets"), mapping=batch.offsets)
        if batch.outbox:
            pipe.rpush(self._key("outbox"), *[json.dumps(list(item), separators=(",", ":")) for item in batch.outbox])
        for cluster, views in batch.views.items():
            for name, fields in views.items():
                if fields:
                    pipe.hset(self._key("c", cluster, "view", name), mapping=fields)
        await pipe.execute()

    async def outbox(self) -> list[tuple[str, dict]]:
        return [tuple(json.loads(item)) for item in await self.redis.lrange(self._key("outbox"), 0, -1)]

    async def clear_outbox(self, published: list[tuple[str, dict]]) -> None:
        """Remove exactly these entries (several workers of one group share the outbox list,
        so trimming by count could drop another worker's unpublished entries)."""
        if not published:
            return
        pipe = self.redis.pipeline(transaction=False)
        for item in published:
            pipe.lrem(self._key("outbox"), 1, json.dumps(list(item), separators=(",", ":")))
        await pipe.execute()

    async def view(self, cluster: str, name: str) -> dict[str, Any]:
        raw = await self.redis.hgetall(self._key("c", cluster, "view", name))
        return {k.decode(): json.loads(v) for k, v in raw.items()}

    async def full_log(self, cluster: str) -> list[dict]:
        return [json.loads(s) for s in await self.redis.lrange(self._key("c", cluster, "log"), 0, -1)]


def redis_client(url: str, **options):
    """A ``redis.asyncio`` client; TLS with a ``rediss://`` URL, AUTH from the URL or options."""
    import redis.asyncio as aioredis

    return aioredis.from_url(url, **options)
