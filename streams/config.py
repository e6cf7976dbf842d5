"""The worker's settings, ``WorkerConfig``: the one place their defaults are written (the
command line reads them from here; this module imports nothing heavy, so building the command
line's parser does not import Faust or the engine). Topic names are part of the wire format
(``fairstream.wire.topics``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fairstream.wire.topics import Topics
from fairstream.wire.visibility import DEFAULT_MAX_ENTRIES

if TYPE_CHECKING:
    from fairstream.core.engine import Engine
    from fairstream.core.tenants import TenantTree


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
    partitions: int = 4  # of each topic the worker creates (existing topics are left as they are)
    batch_size: int = 500
    batch_window: float = 0.01  # longest a batch waits for input Kafka already holds (GroupCommit)
    fetch_max_wait: float = 0.01  # longest the broker may hold a fetch (streams/transport.py)
    fetch_min_bytes: int = 8192  # records the broker gathers for a fetch within that wait
    # Seconds without the worker's heartbeats before Kafka gives its partitions to the group's
    # other workers (Kafka's session.timeout.ms, Faust's broker_session_timeout): how long a
    # worker killed without leaving the group holds its partitions.
    session_timeout: float = 60.0
    max_lateness: float = 60.0
    max_ahead: float = 86400.0  # seconds an event may be ahead of its cluster's clock (plus its producer's progress)
    node_timeout: float = math.inf
    snapshot_every: int = 500
    snapshot_ratio: float = 2.0  # see fairstream.streams.snapshots.due
    background_snapshots: bool = True  # encoded in a forked child (Processor)
    max_bytes: int = 64 * 1024
    # Seconds of event time gathered into one scheduling step. A step is taken once an event
    # past its window comes, so where event time keeps pace with the clock its first events
    # wait about this long: the latency it costs (docs/benchmarks.md, issue 60).
    step_window: float = 0.005
    # seconds a step whose window a batch's end cut stays open for the next batch's events
    # (after the last came; at most step_window + step_wait after the first): 0, none. About
    # the consumer's fetch cadence (fetch_max_wait), so the next fetch usually closes it.
    step_wait: float = 0.01
    finished_retention: float = 3600.0  # seconds of event time finished task ids are remembered
    log_retention: float = math.inf  # seconds of event time of input log kept in the store
    max_engines: int = 1000  # cluster engines kept in memory; the least recently used go first
    metrics_port: int = 9464  # 0: no HTTP endpoint (metrics, the /v1 API, the web page)
    metrics_address: str = "127.0.0.1"
    explain_interval: float = 5.0  # seconds between writes of a cluster's explanation (inf: never)
    explain_max_entries: int = DEFAULT_MAX_ENTRIES  # pending entries listed per tenant (a request counts once)
    kafka_options: dict = field(default_factory=dict)  # security settings passed to Faust
    stop_timeout: float = 10.0  # seconds a stop (SIGTERM, SIGINT) may take before the process exits at once
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
        from fairstream.core.engine import Engine
        from fairstream.core.model import ResourceSpace
        from fairstream.core.tenants import TenantTree
        from fairstream.policies import get as get_policy

        tree = TenantTree.from_specs(list(self.tenants.specs.values())) if self.tenants else TenantTree.from_specs([])
        return Engine(ResourceSpace(tuple(self.resources)), tree, get_policy(self.policy), self.params,
                      auto_tenants=self.auto_tenants, finished_retention=self.finished_retention)
