"""The worker's settings are checked in one place (``WorkerConfig``), the parts take them whole,
and one helper tries a failed action again (``fairstream.wire.retry``)."""

from __future__ import annotations

import asyncio
import math

import pytest
import structlog

from fairstream.cli import main
from fairstream.state.store import MemoryStore
from fairstream.streams.config import ConfigError, WorkerConfig
from fairstream.streams.processor import Processor
from fairstream.wire.retry import Retry, waiting_for
from tests.builders import worker_config

BAD_OPTIONS = [
    pytest.param(["--step-window", "-1"], "--step-window must be at least 0, not -1", id="a negative step window"),
    pytest.param(["--step-wait", "-0.5"], "--step-wait must be at least 0, not -0.5", id="a negative step wait"),
    pytest.param(["--log-retention", "0"], "--log-retention must be above 0, not 0", id="no log kept at all"),
    pytest.param(["--partitions", "0"], "--partitions must be at least 1, not 0", id="topics of no partition"),
    pytest.param(["--session-timeout", "3"], "--session-timeout must be at least 6 and at most 1800, not 3",
                 id="a session shorter than the broker allows"),
    pytest.param(["--metrics-port", "70000"], "--metrics-port must be at least 0 and at most 65535, not 70000",
                 id="a port that does not exist"),
    pytest.param(["--fetch-min-bytes", "-1"], "--fetch-min-bytes must be at least 0, not -1", id="a fetch of fewer than no bytes"),
    pytest.param(["--max-lateness", "nan"], "--max-lateness must be a number, not nan", id="a lateness that is no number"),
    pytest.param(["--resources", ","], "--resources must name one or more distinct resources, not none",
                 id="no resource"),
    pytest.param(["--resources", "cpu,cpu"], "--resources must name one or more distinct resources, not cpu,cpu",
                 id="a resource named twice"),
]


@pytest.mark.parametrize("options, message", BAD_OPTIONS)
def test_a_worker_setting_out_of_its_range_is_one_line_before_anything_connects(monkeypatch, capsys, options, message):
    def connect(*args, **kwargs):
        raise AssertionError("the worker went on to connect")

    monkeypatch.setattr("fairstream.streams.run.prepare_topics", connect)
    assert main(["worker", "--policy", "drf", *options]) == 2
    err = capsys.readouterr().err
    assert err == f"fairstream: error: {message}\n"


@pytest.mark.parametrize("settings, message", [
    pytest.param({"snapshot_every": 0}, "snapshot_every must be at least 1, not 0", id="a setting made in code is named as the field"),
    pytest.param({"max_engines": 2.5}, "--max-engines must be a whole number, not 2.5", id="a count that is not whole"),
    pytest.param({"stop_timeout": -1.0}, "--stop-timeout must be above 0, not -1", id="a stop with no time"),
    pytest.param({"app_id": ""}, "--app-id must not be empty", id="no app id"),
])
def test_a_worker_config_made_in_code_is_checked_too(settings, message):
    with pytest.raises(ConfigError, match=f"^{message}$"):
        WorkerConfig(**settings)


def test_the_defaults_and_infinite_limits_are_in_range():
    WorkerConfig()
    WorkerConfig(node_timeout=math.inf, log_retention=math.inf, explain_interval=math.inf, step_window=0.0)


def test_the_processor_takes_its_settings_from_the_config_whole():
    config = worker_config("drf", max_engines=3, step_window=0.25, snapshot_every=7, max_bytes=4096)
    processor = Processor(MemoryStore(), lambda topic, key, message: None, config)
    assert processor.config is config
    assert processor.sessions_held.max_engines == 3 and processor.max_bytes == 4096
    assert processor.stepping.rules.step_window == 0.25 and processor.stepping.snapshot_rules.every == 7
    assert processor.sessions_held.make_engine().policy == "drf"


def test_a_retry_waits_longer_each_time_up_to_its_longest_and_logs_each_failure():
    slept: list[float] = []

    async def sleep(delay):
        slept.append(delay)

    async def scenario():
        retry = Retry("test.failed", (0.5, 2.0), level="error", messages=3)
        for attempt in range(5):
            try:
                raise ConnectionError(f"down {attempt}")
            except ConnectionError as exc:
                await retry.after(exc, attempt=attempt)

    with structlog.testing.capture_logs() as logs, pytest.MonkeyPatch.context() as patch:
        patch.setattr("fairstream.wire.retry.asyncio.sleep", sleep)
        asyncio.run(scenario())
    assert slept == [0.5, 1.0, 2.0, 2.0, 2.0]
    assert logs[0] == {"event": "test.failed", "log_level": "error", "messages": 3, "attempt": 0,
                       "error": "ConnectionError: down 0", "retry_in_s": 0.5}
    assert [line["attempt"] for line in logs] == [0, 1, 2, 3, 4]


def test_waiting_for_a_service_gives_up_after_its_time_with_the_last_failure():
    attempts = []

    async def never_up():
        attempts.append(1)
        raise ConnectionError(f"still down ({len(attempts)})")

    with pytest.raises(ConnectionError, match="still down"):
        asyncio.run(waiting_for(never_up, None, ConnectionError, (0.001, 0.001), give_up_after=0.02))
    assert len(attempts) >= 2
