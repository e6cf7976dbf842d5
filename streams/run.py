"""``fairstream worker``: build the config from options and environment, then run Faust."""

from __future__ import annotations

import logging
import math
import os

import structlog

from fairstream.collector import fix_mmap_threshold, tune_gc
from fairstream.policies.base import parse_param_pairs
from fairstream.sim.scenario import load_tenant_tree
from fairstream.state.store import RedisStore, redis_client
from fairstream.streams.app import WorkerConfig, create_app
from fairstream.wire.topics import Topics


def redact(url: str) -> str:
    """A connection URL with every password replaced by ``***``, for logs: in the user part
    (``redis://user:secret@host``, the secret may hold ``@`` itself: the host follows the last
    one) and in the query (``?password=secret``)."""
    from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        user, _, host = netloc.rpartition("@")
        name, has_password, _ = user.partition(":")
        netloc = f"{name}:***@{host}" if has_password else netloc
    query = urlencode([(k, "***" if k.lower() == "password" else v) for k, v in parse_qsl(parts.query,
                                                                                          keep_blank_values=True)],
                      safe="*/")
    return urlunsplit(parts._replace(netloc=netloc, query=query))


def faust_security() -> dict:
    """Faust broker credentials from the same ``FAIRSTREAM_KAFKA_*`` variables as the clients."""
    import faust

    from fairstream.wire.kafka import kafka_ssl_context

    env = os.environ
    context = kafka_ssl_context()
    if env.get("FAIRSTREAM_KAFKA_SASL_MECHANISM"):
        return {"broker_credentials": faust.SASLCredentials(
            username=env.get("FAIRSTREAM_KAFKA_SASL_USERNAME"), password=env.get("FAIRSTREAM_KAFKA_SASL_PASSWORD"),
            mechanism=env["FAIRSTREAM_KAFKA_SASL_MECHANISM"], ssl_context=context)}
    if context is not None:
        return {"broker_credentials": faust.SSLCredentials(context)}
    return {}


def config_from_args(args) -> WorkerConfig:
    tenants = load_tenant_tree(args.tenants) if args.tenants else None
    return WorkerConfig(
        policy=args.policy,
        params=parse_param_pairs(args.param),
        resources=tuple(r.strip() for r in args.resources.split(",") if r.strip()),
        tenants=tenants,
        auto_tenants=not args.no_auto_tenants,
        broker=args.broker or os.environ.get("FAIRSTREAM_BROKER", WorkerConfig.broker),
        redis_url=args.redis or os.environ.get("FAIRSTREAM_REDIS_URL", WorkerConfig.redis_url),
        app_id=args.app_id,
        node_timeout=math.inf if args.node_timeout is None else args.node_timeout,
        max_lateness=args.max_lateness,
        max_ahead=args.max_ahead,
        topics=Topics().with_prefix(args.topic_prefix),
        partitions=args.partitions,
        metrics_port=args.metrics_port,
        metrics_address=args.metrics_address,
        step_window=args.step_window,
        step_wait=args.step_wait,
        finished_retention=args.finished_retention,
        batch_window=args.batch_window,
        fetch_max_wait=args.fetch_max_wait,
        fetch_min_bytes=args.fetch_min_bytes,
        session_timeout=args.session_timeout,
        data_dir=args.data_dir,
        background_snapshots=not args.snapshot_inline,
        log_retention=math.inf if args.log_retention is None else args.log_retention,
        max_engines=args.max_engines,
        explain_interval=args.explain_interval,
        explain_max_entries=args.explain_max_entries,
        stop_timeout=args.stop_timeout,
    )


def prepare_topics(config: WorkerConfig, retry_delays: tuple[float, float] = (0.5, 10.0)) -> dict[str, int]:
    """Create the worker's input and output topics that do not exist (``config.partitions``
    each; existing ones are left as they are) and wait until each has a leader for every
    partition; returns their partition counts. Waits, with a log line, while the broker
    cannot be reached.

    Before Faust's consumer subscribes: a consumer assigned while its topics are missing
    ignores them until its next metadata refresh, five minutes later, and decides nothing
    meanwhile. The input topics must have one partition count (``Topics.inputs``); else
    ``ModelError``."""
    import asyncio

    from aiokafka.errors import KafkaConnectionError

    from fairstream.core.model import ModelError
    from fairstream.wire.kafka import ensure_topics
    from fairstream.wire.retry import waiting_for

    partitions = asyncio.run(waiting_for(lambda: ensure_topics(config.broker, config.topics.names, config.partitions),
                                         "worker.broker_unavailable", KafkaConnectionError, retry_delays,
                                         broker=config.broker))
    inputs = {name: partitions[name] for name in config.topics.inputs}
    if len(set(inputs.values())) > 1:
        counts = ", ".join(f"{name} {count}" for name, count in inputs.items())
        raise ModelError(f"the input topics have different partition counts ({counts}): a cluster's events would "
                         "reach different workers; give them one count")
    return partitions


def run_worker(args) -> int:
    import faust

    config = config_from_args(args)
    config.make_engine()  # validates policy, parameters and tenants before anything connects
    prepare_topics(config)
    store = RedisStore(redis_client(config.redis_url), prefix=args.app_id)
    app, processor = create_app(config, store, **faust_security())
    structlog.get_logger("fairstream.worker").info(
        "worker.start", policy=config.policy, params=config.params, broker=config.broker,
        redis=redact(config.redis_url), app_id=config.app_id)
    # Our structlog lines go to stderr as they are: Faust would otherwise catch stderr and stdout
    # and log each line again as its own, a "[WARNING]" prefix before every info line.
    worker = _worker_class(faust.Worker, config.stop_timeout)(app, loglevel="warning", quiet=True,
                                                             redirect_stdouts=False)
    # Faust's and aiokafka's loggers build debug records per message even when nothing prints
    # them (3.5 % of the worker's time under load); ours are structlog and not affected.
    logging.disable(logging.INFO)
    processor.metrics.watch_gc()
    tune_gc()
    fix_mmap_threshold()  # (the worker's RSS flat over hours: collector.py)
    worker.execute_from_commandline()
    return 0


def _worker_class(base, stop_timeout: float):
    """Faust's ``Worker`` whose stop on SIGTERM or SIGINT ends within ``stop_timeout`` seconds.

    Faust stops its consumer by leaving the group and committing offsets: with the broker down
    or frozen (and Redis down), that waited about a minute, as SIGTERM seemed ignored. Past the
    deadline the process exits at once (0, after a ``worker.stop_forced`` line): like kill -9,
    which loses nothing (docs/streaming.md): every applied batch is committed in Redis with
    its outputs, which a restart publishes; offsets Kafka lacks are read again and skipped."""
    import signal
    import sys
    import threading

    def force_exit(signum: int) -> None:
        structlog.get_logger("fairstream.worker").warning(
            "worker.stop_forced", signal=signal.Signals(signum).name, after_s=stop_timeout,
            why="a service the stop waits for (Kafka, Redis) does not answer")
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(0)

    class Worker(base):
        _stop_deadline: threading.Timer | None = None

        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            # No terminal spinner: our lines are structlog's, and its end wrote the terminal's
            # show-cursor escape (ESC[?25h) into log files.
            self.spinner = None

        def _stop_within_deadline(self, signum: int) -> None:
            if self._stop_deadline is None and math.isfinite(stop_timeout):
                self._stop_deadline = threading.Timer(stop_timeout, force_exit, (signum,))
                self._stop_deadline.daemon = True
                self._stop_deadline.start()

        def _on_sigterm(self) -> None:
            self._stop_within_deadline(signal.SIGTERM)
            super()._on_sigterm()

        def _on_sigint(self) -> None:
            self._stop_within_deadline(signal.SIGINT)
            super()._on_sigint()

    return Worker


__all__ = ["run_worker", "prepare_topics", "redact"]
