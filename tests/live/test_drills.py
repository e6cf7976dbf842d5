"""The chaos drills (``fairstream/lab/drill.py``) on the real Kafka and Redis of
``scripts/services.sh``, each small enough for CI: a worker in a process of its own, the emulator
playing a busy cluster, one bad thing meanwhile. Each checks what an operator would: every task
placed once and completed, no node over-committed, every hostile message dead-lettered with its
reason, the recorded input replaying to exactly the published decisions (after a Redis that
lost writes too: rebuilt from Kafka by the journal, docs/architecture.md)."""

import json
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fairstream.cli import DRILLS
from fairstream.lab.drill import CLUSTER, FAULTS, run_drill

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.live


@pytest.fixture(scope="module", autouse=True)
def services():
    subprocess.run(["bash", str(ROOT / "scripts" / "services.sh"), "start"], check=True, capture_output=True)


def passed(report) -> bool:
    print(json.dumps(report.to_json()))  # shown when a drill fails
    return report.passed


@pytest.mark.parametrize("name, hostile", [
    pytest.param("oversize", 3, id="an input whose dead letter escapes to six times its size is dead-lettered whole"),
    pytest.param("far-future", 2, id="events at 10^12 s with --node-timeout move no clock: no node is lost"),
    pytest.param("kill-9", 0, id="kill -9 for longer than the lateness window under load, with the defaults"),
    pytest.param("redis-empty", 0, id="Redis restarted empty under load: rebuilt from Kafka"),
    pytest.param("redis-older", 0, id="Redis restored from an older file under load: rebuilt from Kafka"),
    pytest.param("kill-9-redis-empty", 0,
                 id="kill -9, then Redis restarted empty while the worker is down: the journal read again past "
                    "Kafka's committed offsets"),
    pytest.param("kill-9-redis-older", 0, id="kill -9, then Redis restored from an older file while the worker is down"),
    pytest.param("planted-snapshot", 0, id="a pickle planted as the snapshot runs nothing and is not used"),
    pytest.param("kafka-restart", 0, id="the broker restarted under load"),
])
def test_the_drill_loses_nothing_places_nothing_twice_and_dead_letters_every_hostile_message(name, hostile, tmp_path):
    report = run_drill(name, tasks=80, speed=20, directory=tmp_path)
    assert passed(report)
    assert report.hostile == hostile and report.dead_letters == hostile
    if name != "oversize" and name != "far-future":
        assert report.recovery_s is not None  # decided again after the fault


JSON_VALUES = st.recursive(st.none() | st.booleans() | st.floats(allow_nan=False) | st.integers() | st.text(max_size=20),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                           max_leaves=12)
# An object with the cluster and a field no event has: the key puts it in the valid traffic's
# partition, and it can never be a valid event by chance (events allow no other fields).
HOSTILE_OBJECTS = st.fixed_dictionaries({"cluster": st.just(CLUSTER), "fuzz": JSON_VALUES},
                                        optional={"task": JSON_VALUES, "time": JSON_VALUES, "demand": JSON_VALUES})
HOSTILE = st.tuples(st.sampled_from(["submitted", "completed", "heartbeat"]),
                    st.binary(min_size=1, max_size=64) | JSON_VALUES.map(lambda v: json.dumps(v).encode())
                    | HOSTILE_OBJECTS.map(lambda v: json.dumps(v).encode()))


@settings(max_examples=1, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
@given(fuzz=st.lists(HOSTILE, min_size=150, max_size=150))  # as many as hypothesis builds in one example
def test_poison_and_fuzzed_messages_among_valid_traffic_stall_nothing_and_are_all_dead_lettered(fuzz, tmp_path_factory):
    # The five poison shapes that once stopped a partition for good, 2,000 seeded fuzzed
    # messages (random bytes, submissions with one field broken) and hypothesis's bytes and
    # JSON, published keyed by the cluster into its partitions while the cluster runs.
    report = run_drill("poison", tasks=80, speed=20, directory=tmp_path_factory.mktemp("poison"), fuzz=fuzz)
    assert passed(report)
    assert report.hostile == 6 + 2000 + 150 and report.dead_letters >= report.hostile  # a JSON array: one per element


def test_the_command_line_knows_every_drill():
    assert DRILLS == tuple(FAULTS)
