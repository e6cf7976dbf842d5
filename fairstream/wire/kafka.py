"""Connecting to Kafka: security settings from ``FAIRSTREAM_KAFKA_*`` environment variables
(README, "Kafka security") and creating the worker's topics. Shared by the worker, the
producers and the tools; aiokafka is imported only when a topic is created."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from fairstream.core.model import ModelError


def kafka_ssl_context():
    """The TLS context for Kafka from ``FAIRSTREAM_KAFKA_*`` variables, or None when TLS is off.

    TLS is on when the security protocol ends in ``SSL`` or a CA file is given. The broker's
    certificate is verified against ``SSL_CAFILE`` (the system's CAs without it); for mutual TLS
    ``SSL_CERTFILE`` and ``SSL_KEYFILE`` (optionally ``SSL_KEY_PASSWORD``) give the client's own.
    """
    import os
    import ssl

    env = os.environ
    if not (env.get("FAIRSTREAM_KAFKA_SSL_CAFILE") or env.get("FAIRSTREAM_KAFKA_SECURITY_PROTOCOL", "").endswith("SSL")):
        return None
    context = ssl.create_default_context(cafile=env.get("FAIRSTREAM_KAFKA_SSL_CAFILE"))
    if env.get("FAIRSTREAM_KAFKA_SSL_CERTFILE"):
        context.load_cert_chain(env["FAIRSTREAM_KAFKA_SSL_CERTFILE"], env.get("FAIRSTREAM_KAFKA_SSL_KEYFILE"),
                                env.get("FAIRSTREAM_KAFKA_SSL_KEY_PASSWORD"))
    return context


def kafka_security(options: dict[str, Any] | None = None) -> dict[str, Any]:
    """aiokafka security settings from ``FAIRSTREAM_KAFKA_*`` environment variables (see README)."""
    import os

    env = os.environ
    out: dict[str, Any] = dict(options or {})
    protocol = env.get("FAIRSTREAM_KAFKA_SECURITY_PROTOCOL")
    if protocol:
        out["security_protocol"] = protocol
    if env.get("FAIRSTREAM_KAFKA_SASL_MECHANISM"):
        out["sasl_mechanism"] = env["FAIRSTREAM_KAFKA_SASL_MECHANISM"]
        out["sasl_plain_username"] = env.get("FAIRSTREAM_KAFKA_SASL_USERNAME")
        out["sasl_plain_password"] = env.get("FAIRSTREAM_KAFKA_SASL_PASSWORD")
    context = kafka_ssl_context()
    if context is not None:
        out["ssl_context"] = context
    return out


class TopicsUnavailable(ModelError):
    """The topics a command needs do not exist and cannot be created (one line for the user)."""


async def ensure_topics(broker: str, names: Iterable[str], partitions: int = 4, config: dict[str, str] | None = None,
                        timeout: float = 60.0, **kafka_options: Any) -> dict[str, int]:
    """Create those of ``names`` that do not exist yet, with ``partitions`` partitions and the
    topic ``config`` given (e.g. ``{"message.timestamp.type": "LogAppendTime"}``); an existing
    topic is left as it is. Then wait until the broker's metadata shows every one with a leader
    for each partition, so that a consumer that subscribes next is assigned them. Returns each
    topic's partition count.

    Replication factor 1 suits the single broker of scripts/services.sh; production clusters
    create the topics beforehand (README, "Topics on a managed broker"). A topic that is missing
    and may not be created, or does not appear within ``timeout`` seconds, raises
    ``TopicsUnavailable``; a broker that cannot be reached raises aiokafka's
    ``KafkaConnectionError``."""
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic
    from aiokafka.errors import TopicAlreadyExistsError, for_code

    wanted = list(dict.fromkeys(names))
    admin = AIOKafkaAdminClient(bootstrap_servers=broker, **kafka_security(kafka_options))
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        missing = [NewTopic(n, num_partitions=partitions, replication_factor=1, topic_configs=dict(config or {}))
                   for n in wanted if n not in existing]
        if missing:
            # The response carries an error code per topic; aiokafka raises none of them.
            for topic, code, *message in (await admin.create_topics(missing)).topic_errors:
                if code and code != TopicAlreadyExistsError.errno:  # another client created it first: fine
                    detail = f": {message[0]}" if message and message[0] else ""
                    raise TopicsUnavailable(
                        f"topic {topic} does not exist and could not be created ({for_code(code).__name__}{detail}); "
                        "create the topics beforehand (README: Topics on a managed broker)")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            ready = {t["topic"]: len(t["partitions"]) for t in await admin.describe_topics(wanted)
                     if t["error_code"] == 0 and t["partitions"] and all(p["leader"] >= 0 for p in t["partitions"])}
            if len(ready) == len(wanted):
                return ready
            if loop.time() > deadline:
                late = ", ".join(n for n in wanted if n not in ready)
                raise TopicsUnavailable(f"topics {late} have no leader for every partition after {timeout:g} s")
            await asyncio.sleep(0.1)
    finally:
        await admin.close()
