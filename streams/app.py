"""The Faust app: three thin agents (one per input topic) around one ``Processor``.

Each agent hands its topic's messages to the processor in batches (``GroupCommit``: what
arrived while the previous batch was applied), where they are decoded, applied, scheduled,
committed to the state store and published; Faust is told a message is acknowledged only
after its effects are durable and published. Offsets that Faust
had not committed before a crash are redelivered and skipped by the processor, which keeps its
own offsets in the store, committed with the state they produced.
"""

from __future__ import annotations

import asyncio

import faust
import structlog
from faust.exceptions import ConsumerNotStarted

from fairstream.state.store import StaleLog
from fairstream.streams import unreadable
from fairstream.streams.config import WorkerConfig
from fairstream.streams.incoming import UnreadableBatch
from fairstream.streams.processor import Incoming, Processor
from fairstream.streams.stepping import Applied
from fairstream.streams.transport import kafka_transport
from fairstream.wire.events import MAX_REASON
from fairstream.wire.jsoncodec import dumps, loads
from fairstream.wire.retry import Retry, waiting_for

log = structlog.get_logger("fairstream.worker")


KINDS = (("submitted", "submitted"), ("completed", "completed"), ("heartbeats", "heartbeat"), ("config", "config"))


def create_app(config: WorkerConfig, store, **app_options) -> tuple[faust.App, Processor]:
    app = faust.App(
        config.app_id,
        broker=f"kafka://{config.broker}",
        value_serializer="raw",
        key_serializer="raw",
        web_enabled=False,
        topic_partitions=config.partitions,
        topic_allow_declare=True,
        # Faust's leader election (its "<app-id>-__assignor-__leader" topic) serves timers that
        # run on one worker only; we have none, so the worker's topics are exactly ours.
        topic_disable_leader=True,
        # Faust would wait for every message handed to an agent to be acknowledged before a
        # rebalance or shutdown goes on: with Redis down, for ever (SIGTERM then needed kill -9).
        # Unacknowledged messages are redelivered and skipped by the store's offsets, and a
        # batch's commit is fenced (Processor), so nothing depends on that wait.
        stream_wait_empty=False,
        broker_session_timeout=config.session_timeout,
        broker_heartbeat_interval=min(3.0, config.session_timeout / 3),  # Kafka: below a third of it
        consumer_auto_offset_reset="earliest",
        datadir=config.faust_data_dir(),
        **config.kafka_options,
        **app_options,
    )
    app.transport = kafka_transport(app, config.fetch_max_wait, config.fetch_min_bytes)
    unreadable.install()  # a compressed batch it cannot read is a dead letter, not a crash (streams/unreadable.py)
    out = {
        config.topics.decisions: app.topic(config.topics.decisions, value_serializer="raw", key_serializer="raw"),
        config.topics.deadletter: app.topic(config.topics.deadletter, value_serializer="raw", key_serializer="raw"),
    }

    async def publish(topic: str, key: str, message: dict):
        # Straight to Faust's producer (one aiokafka send), not through ``Topic.send``, whose
        # channel and codec machinery cost more per message than the engine step that made it
        # (docs/benchmarks.md). The returned future resolves when the broker has the message;
        # the processor waits for all of a batch's before it clears them from the outbox.
        return await app.producer.send(topic, key.encode(), dumps(message), None, None, None)

    processor = Processor(store, publish, config, input_log=KafkaInputLog(config))
    app.consumer.on_seek = processor.consuming_from  # type: ignore[attr-defined]  # (our consumer's: streams/transport.py)

    if config.explain_interval != float("inf"):
        @app.timer(interval=max(config.explain_interval, 0.1))
        async def flush_explanations() -> None:
            # A cluster that went quiet within explain_interval of its last write shows its
            # last state too; a store that is down is tried again at the next tick.
            try:
                await processor.flush_explanations()
            except Exception as exc:  # the view waits for the next tick
                log.warning("worker.explain_unwritten", error=str(exc))

    # One feed for the three agents: what one fetch brought of each topic goes as one batch (one
    # pass, one commit, one journal record), not one batch per topic (docs/benchmarks.md).
    batches = GroupCommit(processor, "", config.batch_size, config.batch_window, None,
                          lambda message: _backlog(app, message))
    for attribute, kind in KINDS:
        topic = app.topic(getattr(config.topics, attribute), value_serializer="raw", key_serializer="raw")
        app.agent(topic, name=f"fairstream.{kind}")(_agent(batches, kind))

    @app.on_partitions_revoked.connect  # type: ignore[arg-type]  # (Faust's stub: a handler of *args)
    async def on_revoked(app, revoked, **kwargs) -> None:  # Faust's signal signature
        await processor.forget()

    @app.on_partitions_assigned.connect  # type: ignore[arg-type]
    async def on_assigned(app, assigned, **kwargs) -> None:  # Faust's signal signature
        # What this worker now consumes: the line an operator (or a test) waits for.
        inputs = set(config.topics.inputs)
        log.info("worker.partitions_assigned",
                 partitions=sorted(f"{tp.topic}:{tp.partition}" for tp in assigned if tp.topic in inputs))

    @app.task
    async def recover() -> None:
        processor.metrics.watch_lag(lambda: consumer_lag(app, processor, set(config.topics.inputs)))
        if config.metrics_port:
            try:
                from fairstream.streams.api import serve_http

                await serve_http(processor.metrics.registry, config.redis_url, config.app_id, config.metrics_port,
                           config.metrics_address)
            except OSError as exc:  # e.g. a second worker on the same machine
                structlog.get_logger("fairstream.worker").warning(
                    "worker.metrics_unavailable", port=config.metrics_port, error=str(exc))
        for topic in out.values():  # declare the output topics so consumers can subscribe first
            await topic.maybe_declare()
        # A Redis that is not up yet is waited for, as the broker is (streams/run.py).
        await waiting_for(processor.start, "worker.store_unavailable")

    return app, processor


class KafkaInputLog:
    """The processor's ``InputLog``: ranges of the input topics read with a consumer of its
    own (no group, nothing committed), besides Faust's."""

    def __init__(self, config: WorkerConfig) -> None:
        self.config = config
        self.kinds = {getattr(config.topics, attribute): kind for attribute, kind in KINDS}

    async def read(self, ranges: dict[str, tuple[int, int]]):
        from aiokafka import AIOKafkaConsumer, TopicPartition

        from fairstream.wire.kafka import kafka_security

        wanted = {}
        for position, (start, end) in ranges.items():
            topic, _, partition = position.rpartition(":")
            wanted[TopicPartition(topic, int(partition))] = (position, start, end)
        consumer = AIOKafkaConsumer(bootstrap_servers=self.config.broker, group_id=None, enable_auto_commit=False,
                                    auto_offset_reset="earliest", **kafka_security())
        await consumer.start()
        try:
            consumer.assign(list(wanted))
            begins = await consumer.beginning_offsets(list(wanted))
            ends = await consumer.end_offsets(list(wanted))
            left = {}
            for tp, (position, start, end) in wanted.items():
                if begins[tp] > start:
                    log.error("worker.input_expired", position=position, store_offset=start, kafka_starts_at=begins[tp],
                              messages=begins[tp] - start)
                start, end = max(start, begins[tp]), min(end, ends[tp])
                if start >= end:
                    yield position, [], True
                    continue
                consumer.seek(tp, start)
                left[tp] = end
            while left:
                fetched = await consumer.getmany(*left, timeout_ms=1000)
                for tp, records in fetched.items():
                    position, end = wanted[tp][0], left[tp]
                    messages = [Incoming(self.kinds[tp.topic], _raw(r.value), tp.topic,
                                         tp.partition, r.offset, (r.timestamp or 0) / 1000.0, _key(r.key))
                                for r in records if r.offset < end]
                    done = await consumer.position(tp) >= end
                    if done:
                        del left[tp]
                    yield position, messages, done
        finally:
            await consumer.stop()

    async def journal(self, start: dict[str, int]):
        from aiokafka import AIOKafkaConsumer, TopicPartition

        from fairstream.wire.kafka import ensure_topics, kafka_security

        topic = self.config.topics.journal
        consumer = AIOKafkaConsumer(bootstrap_servers=self.config.broker, group_id=None, enable_auto_commit=False,
                                    auto_offset_reset="earliest", **kafka_security())
        await consumer.start()
        try:
            count = await ensure_topics(self.config.broker, [topic], self.config.partitions)
            partitions = [TopicPartition(topic, p) for p in range(count[topic])]
            consumer.assign(partitions)
            begins = await consumer.beginning_offsets(partitions)
            ends = await consumer.end_offsets(partitions)
            left = {}
            for tp in partitions:
                begin = max(start.get(f"{topic}:{tp.partition}", 0), begins[tp])
                if begin < ends[tp]:
                    consumer.seek(tp, begin)
                    left[tp] = ends[tp]
            while left:
                fetched = await consumer.getmany(*left, timeout_ms=1000)
                for tp, records in fetched.items():
                    for r in records:
                        if r.offset < left[tp]:
                            try:
                                record = loads(r.value) if r.value is not None else None
                            except ValueError:
                                record = None
                            yield f"{topic}:{tp.partition}", r.offset, record
                    if await consumer.position(tp) >= left[tp]:
                        del left[tp]
        finally:
            await consumer.stop()


def consumer_lag(app: faust.App, processor: Processor, inputs: set[str]) -> dict[tuple[str, int], int]:
    """Per input partition assigned to this worker: the records Kafka holds (as of the
    consumer's last fetch) from the next offset the store says is to be applied. Called from
    the metrics server's thread: it only reads (a dict copy is one step under the GIL)."""
    try:
        assigned = app.consumer.assignment()
    except ConsumerNotStarted:
        return {}
    applied = dict(processor.applied)
    lag = {}
    for tp in assigned:
        highwater = app.consumer.highwater(tp) if tp.topic in inputs else None
        if highwater is not None:
            lag[(tp.topic, tp.partition)] = max(0, highwater - applied.get(f"{tp.topic}:{tp.partition}", 0))
    return lag


def _backlog(app: faust.App, message) -> int:
    """Records in Kafka after ``message`` on its partition, as of the consumer's last fetch."""
    try:
        highwater = app.consumer.highwater(message.tp)
    except ConsumerNotStarted:  # unit tests drive agents without a consumer
        return 0
    return 0 if highwater is None else highwater - message.offset - 1


def _agent(batches: GroupCommit, kind: str):
    async def agent(stream):
        # Acks are ours: an event is acknowledged to Faust (its offset may be committed) only
        # once its batch is durable and its outputs published.
        stream.enable_acks = False
        try:
            async for event in stream.events():
                await batches.add(event, kind, stream.ack)
        finally:
            await batches.close()

    agent.__name__ = f"schedule_{kind}"
    return agent


class GroupCommit:
    """The agents' events to the processor in batches, group-commit style.

    A batch goes as soon as the previous one has been applied (committed; its publishing goes
    on meanwhile), with what arrived in the meantime, up to ``max_size``
    messages: when input is sparse a message is applied on arrival, under load batches grow
    and their fixed cost (one engine pass, one Redis transaction) is shared. While Kafka holds
    more input for the agent (``backlog``), the batch waits up to ``window`` seconds for it
    (``_gather``). Faust's ``take_events`` instead waits its whole window on every cycle,
    which the decision latency then always pays (docs/benchmarks.md). One feed serves every
    agent (``add`` takes the event's kind and its stream's ``ack``): a fetch that brought
    submissions and completions makes one batch, whose fixed cost they share.

    Events are acknowledged to Faust in arrival order once their batch is published. A batch
    whose application fails (the store is down) is tried again with backoff, and input is
    held back meanwhile (``add`` waits while the buffer is full).
    """

    def __init__(self, processor: Processor, kind: str, max_size: int, window: float, ack,
                 backlog=lambda message: 0, retry_delays: tuple[float, float] = (0.1, 5.0)) -> None:
        self.processor = processor
        self.kind = kind
        self.max_size = max_size
        self.window = window
        self.backlog = backlog  # records in Kafka after a message of this agent's
        self.ack = ack
        self.retry_delays = retry_delays  # first and longest wait before a failed batch is tried again
        self.buffer: list = []
        self.room = asyncio.Event()  # set while the buffer has room
        self.room.set()
        self.runner: asyncio.Task | None = None
        self.last_ack: asyncio.Task | None = None
        self.arrival: asyncio.Future | None = None  # what _gather waits on

    async def add(self, event, kind: str | None = None, ack=None) -> None:
        """Buffer ``event`` (of input ``kind``, acknowledged to Faust with ``ack`` once its batch
        is published; by default the feed's own)."""
        self.buffer.append((event, kind or self.kind, ack or self.ack))
        _resolve(self.arrival)
        if self.runner is None:
            self.runner = asyncio.get_running_loop().create_task(self._run())
        if len(self.buffer) >= self.max_size:
            self.room.clear()
            await self.room.wait()

    async def close(self) -> None:
        """Apply what is buffered and wait until all of it is published."""
        if self.runner is not None:
            await self.runner
        if self.last_ack is not None:
            await self.last_ack

    async def _run(self) -> None:
        try:
            while self.buffer:
                await self._gather()
                events, self.buffer = self.buffer[:self.max_size], self.buffer[self.max_size:]
                self.room.set()
                batch = [Incoming(kind, _raw(e.value), e.message.topic, e.message.partition, e.message.offset,
                                  e.message.timestamp or 0.0, _key(e.message.key)) for e, kind, _ in events]
                applied = await self._apply(batch)
                self.last_ack = asyncio.get_running_loop().create_task(
                    self._acknowledge(events, applied.published, self.last_ack))
        finally:
            self.runner = None

    async def _gather(self) -> None:
        """Wait for more events while Kafka holds more for this agent (the backlog after the
        last buffered message, as of the consumer's last fetch), for at most ``window`` seconds.

        Faust hands an agent one message per few turns of the event loop, and a pass holds
        the loop for its synchronous part: taking only what is buffered would make batches of
        one or two messages under load, and their fixed cost would then use up the worker.
        The wait is on ``add`` (not a busy loop, which would also hold the interpreter lock
        that Faust's consumer thread needs to fetch)."""
        if not self.window:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.window
        while len(self.buffer) < self.max_size and self.backlog(self.buffer[-1][0].message) > 0:
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            self.arrival = loop.create_future()
            timer = loop.call_later(remaining, _resolve, self.arrival)
            await self.arrival
            timer.cancel()
        self.arrival = None

    async def _apply(self, batch: list[Incoming], alone: bool = False):
        """Apply ``batch``, trying again while it fails (nothing of a failed attempt is kept:
        the processor rebuilds the clusters from the store); meanwhile input is held back:
        ``add`` waits once the buffer is full.

        A store or broker that cannot be reached is waited for however long. Any other error is
        a fault some input triggers: after ``MAX_FAULTS`` of them the batch's messages are
        applied one by one, and one that still fails ``MAX_FAULTS`` times on its own (``alone``)
        is dead-lettered as ``internal error: ...`` (``Processor.reject``), so one message
        cannot stall its partition and the others go on."""
        retry: Retry | None = None  # (made at the first failure: most batches have none)
        faults = 0
        while True:
            try:
                return await self.processor.apply(batch)
            except Exception as exc:
                if not _unavailable(exc):
                    faults += 1
                    error = f"{type(exc).__name__}: {exc}"
                    if faults >= MAX_FAULTS and alone:
                        return await self.processor.reject(batch[0], f"internal error: {error}"[:MAX_REASON])
                    if faults >= MAX_FAULTS and len(batch) > 1:
                        return await self._apply_one_by_one(batch)
                retry = retry or Retry("worker.batch_failed", self.retry_delays, level="error",
                                       topic=batch[0].topic, messages=len(batch))
                await retry.after(exc, faults=faults)

    async def _apply_one_by_one(self, batch: list[Incoming]):
        """``batch`` as batches of one message, in order (to find the one a fault comes from);
        an ``Applied`` whose ``published`` resolves once all of them are published."""
        applied = [await self._apply([message], alone=True) for message in batch]
        published = asyncio.ensure_future(asyncio.gather(*(a.published for a in applied)))
        return Applied(applied[-1].outcome, published)

    async def _acknowledge(self, events: list, published: asyncio.Future, previous: asyncio.Task | None) -> None:
        if previous is not None:  # in arrival order
            await previous
        await asyncio.shield(published)
        for event, _, ack in events:
            await ack(event)


MAX_FAULTS = 3  # unexpected failures of a batch, then of one of its messages alone (GroupCommit._apply)


def _unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` says a service cannot be reached or moved on (retried for as long as it
    takes) rather than that applying the input failed."""
    from aiokafka.errors import KafkaError
    from redis.exceptions import RedisError

    return isinstance(exc, (OSError, asyncio.TimeoutError, RedisError, KafkaError, StaleLog))


def _raw(value) -> bytes:
    """A message's value as bytes; an ``UnreadableBatch`` as it is (its reason goes with it)."""
    if value is None:
        return b""
    return value if value.__class__ is UnreadableBatch else bytes(value)


def _key(key) -> bytes | None:
    return None if key is None else bytes(key)


def _resolve(future: asyncio.Future | None) -> None:
    if future is not None and not future.done():
        future.set_result(None)
