"""The worker's settings, ``WorkerConfig``: the one place their defaults are written and their
ranges checked (the command line reads the defaults from here and reports a setting out of its
range in the words ``WorkerConfig`` raises; this module imports nothing heavy, so building the
command line's parser does not import Faust or the engine). The worker's parts take the
configuration whole. Topic names are part of the wire format (``fairstream.wire.topics``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fairstream.wire.topics import Topics
from fairstream.wire.visibility import DEFAULT_MAX_ENTRIES

if TYPE_CHECKING:
    from fairstream.core.engine import Engine
    from fairstream.core.tenants import TenantTree


class ConfigError(ValueError):
    """A worker setting out of its range; the message names the setting as the command line does."""


# The command line's name of a setting, where it is not the field's with dashes; None: a setting
# made in code alone (named as the field).
_OPTION: dict[str, str | None] = {"redis_url": "--redis", "background_snapshots": "--snapshot-inline",
                                  "batch_size": None, "snapshot_every": None, "snapshot_ratio": None, "max_bytes": None}

# Per numeric setting: (lowest, highest, whether the lowest is allowed itself). Checked on every
# WorkerConfig made, from the command line or in code.
_RANGES: dict[str, tuple[float, float, bool]] = {
    "partitions": (1, math.inf, True),
    "batch_size": (1, math.inf, True),
    "batch_window": (0, math.inf, True),
    "fetch_max_wait": (0, math.inf, True),
    "fetch_min_bytes": (0, math.inf, True),  # (0 is taken as 1: transport.kafka_transport)
    # Within the broker's default bounds (group.min/max.session.timeout.ms: 6 s, 30 min).
    "session_timeout": (6, 1800, True),
    "max_lateness": (0, math.inf, True),
    "max_ahead": (0, math.inf, False),
    "node_timeout": (0, math.inf, False),
    "snapshot_every": (1, math.inf, True),
    "snapshot_ratio": (0, math.inf, True),
    "max_bytes": (1024, math.inf, True),  # (a message smaller than a heartbeat's JSON is no limit)
    "step_window": (0, math.inf, True),
    "step_wait": (0, math.inf, True),
    "finished_retention": (0, math.inf, True),
    "log_retention": (0, math.inf, False),
    "max_engines": (1, math.inf, True),
    "metrics_port": (0, 65535, True),
    "explain_interval": (0, math.inf, True),
    "explain_max_entries": (1, math.inf, True),
    "stop_timeout": (0, math.inf, False),
}
_WHOLE = {"partitions", "batch_size", "fetch_min_bytes", "snapshot_every", "max_bytes", "max_engines", "metrics_port",
          "explain_max_entries"}


def option_name(setting: str) -> str:
    """The command line's option for a ``WorkerConfig`` field (``step_window``: ``--step-window``),
    or the field's name if the command line has none."""
    option = _OPTION.get(setting, "--" + setting.replace("_", "-"))
    return setting if option is None else option


@dataclass
class WorkerConfig:
    """Every setting of the worker, checked when made (``ConfigError`` names the first out of
    its range). ``Processor``, the Faust app and the worker's process read it whole."""

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

    def __post_init__(self) -> None:
        for name, (lowest, highest, lowest_allowed) in _RANGES.items():
            value = getattr(self, name)
            whole = name in _WHOLE
            if isinstance(value, bool) or not isinstance(value, int if whole else (int, float)) or math.isnan(value):
                raise ConfigError(f"{option_name(name)} must be {'a whole number' if whole else 'a number'}, not {value!r}")
            if not (lowest <= value if lowest_allowed else lowest < value) or value > highest:
                above = f"at least {lowest:g}" if lowest_allowed else f"above {lowest:g}"
                within = f" and at most {highest:g}" if highest != math.inf else ""
                raise ConfigError(f"{option_name(name)} must be {above}{within}, not {value:g}")
        names = [r for r in self.resources]
        if not names or any(not isinstance(r, str) or not r for r in names) or len(set(names)) != len(names):
            raise ConfigError(f"--resources must name one or more distinct resources, not {','.join(map(str, names)) or 'none'}")
        if not self.policy:
            raise ConfigError("--policy must name a policy")
        if not self.app_id:
            raise ConfigError("--app-id must not be empty")

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
