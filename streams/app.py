"""The Faust app: three thin agents (one per input topic) around one ``Processor``.

Each agent reads its topic in small batches (``take_events``), hands them to the processor
(decode, apply, run the engine, commit to the state store, publish) and only then asks for the
next batch, so Faust acknowledges a message after its effects are durable. Offsets that Faust
had not committed before a crash are redelivered and skipped by the processor, which keeps its
own offsets in the store, committed with the state they produced.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import faust
import structlog
from faust.exceptions import ConsumerNotStarted

from fairstream.engine import Engine
from fairstream.jsoncodec import dumps
from fairstream.model import ResourceSpace
from fairstream.tenants import TenantTree
from fairstream.streams.processor import Incoming, Processor, Topics
from fairstream.streams.transport import kafka_transport


@dataclass
class WorkerConfig:
    policy: str = "ltrf"
    params: dict[str, str] = field(default_factory=dict)
    resources: tuple[str, ...] = ("cpu", "mem")
    tenants: TenantTree | None = None
    auto_tenants: bool = True
    broker: str = "127.0.0.1:9092"
    redis_url: str = "redis://127.0.0.1:6379/0"
    app_id: str = "fairstream"
    topics: Topics = field(default_factory=Topics)
    partitions: int = 4
    batch_size: int = 500
    batch_window: float = 0.02
    fetch_max_wait: float = 0.01  # longest the broker may hold a fetch (streams/transport.py)
    max_lateness: float = 60.0
    node_timeout: float = math.inf
    snapshot_every: int = 500
    snapshot_ratio: float = 2.0  # see Processor._snapshot_due
    max_bytes: int = 64 * 1024
    step_window: float = 0.1  # seconds of event time gathered into one scheduling step
    finished_retention: float = 3600.0  # seconds of event time finished task ids are remembered
    log_retention: float = math.inf  # seconds of event time of input log kept in the store
    metrics_port: int = 9464  # 0: no metrics endpoint
    metrics_address: str = "127.0.0.1"
    kafka_options: dict = field(default_factory=dict)  # security settings passed to Faust
    # Faust's local directory; it holds nothing of ours (state is in Redis), so by default it
    # goes to the temporary directory rather than "<app-id>-data" in the working directory.
    data_dir: str | None = None

    def faust_data_dir(self) -> str:
        import tempfile
        from pathlib import Path

        path = Path(self.data_dir) if self.data_dir else Path(tempfile.gettempdir()) / "fairstream-faust" / self.app_id
        path.parent.mkdir(parents=True, exist_ok=True)  # Faust creates only the last level
        return str(path)

    def make_engine(self) -> Engine:
        tree = TenantTree.from_specs(list(self.tenants.specs.values())) if self.tenants else TenantTree.from_specs([])
        return Engine(ResourceSpace(tuple(self.resources)), tree, self.policy, self.params,
                      auto_tenants=self.auto_tenants, finished_retention=self.finished_retention)


KINDS = (("submitted", "submitted"), ("completed", "completed"), ("heartbeats", "heartbeat"))


def create_app(config: WorkerConfig, store, **app_options) -> tuple[faust.App, Processor]:
    app = faust.App(
        config.app_id,
        broker=f"kafka://{config.broker}",
        value_serializer="raw",
        key_serializer="raw",
        web_enabled=False,
        topic_partitions=config.partitions,
        topic_allow_declare=True,
        consumer_auto_offset_reset="earliest",
        datadir=config.faust_data_dir(),
        **config.kafka_options,
        **app_options,
    )
    app.transport = kafka_transport(app, config.fetch_max_wait)
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

    processor = Processor(
        store, config.make_engine, publish, config.topics, max_lateness=config.max_lateness,
        node_timeout=config.node_timeout, snapshot_every=config.snapshot_every, snapshot_ratio=config.snapshot_ratio,
        max_bytes=config.max_bytes,
        log_retention=config.log_retention,
        step_window=config.step_window,
    )

    for attribute, kind in KINDS:
        topic = app.topic(getattr(config.topics, attribute), value_serializer="raw", key_serializer="raw")
        app.agent(topic, name=f"fairstream.{kind}")(_agent(processor, kind, config))

    @app.on_partitions_revoked.connect
    async def on_revoked(app, revoked, **kwargs) -> None:  # noqa: ARG001 - Faust's signal signature
        await processor.forget()

    @app.task
    async def recover() -> None:
        if config.metrics_port:
            try:
                processor.metrics.serve(config.metrics_port, config.metrics_address)
            except OSError as exc:  # e.g. a second worker on the same machine
                structlog.get_logger("fairstream.worker").warning(
                    "worker.metrics_unavailable", port=config.metrics_port, error=str(exc))
        for topic in out.values():  # declare the output topics so consumers can subscribe first
            await topic.maybe_declare()
        await processor.start()

    return app, processor


def _record_lag(app: faust.App, processor: Processor, message) -> None:
    try:
        highwater = app.consumer.highwater(message.tp)
    except ConsumerNotStarted:  # unit tests drive agents without a consumer
        return
    if highwater is not None:
        processor.metrics.lag.labels(message.topic, str(message.partition)).set(max(highwater - message.offset - 1, 0))


def _agent(processor: Processor, kind: str, config: WorkerConfig):
    async def agent(stream):
        async for events in stream.take_events(config.batch_size, within=config.batch_window):
            batch = [
                Incoming(kind, bytes(e.value) if e.value is not None else b"", e.message.topic,
                         e.message.partition, e.message.offset)
                for e in events
            ]
            await processor.handle(batch)
            for e in events[-1:]:  # consumer lag of this partition after the batch
                _record_lag(stream.app, processor, e.message)
            yield len(batch)

    agent.__name__ = f"schedule_{kind}"
    return agent
