"""``scripts/services.sh`` uses only the services its own checkout started (issue "The README's
examples as a newcomer meets them"): a port that answers but was started elsewhere is refused
in one line, unless ``FAIRSTREAM_SERVICES_REUSE=1`` says to use it."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "services.sh"


@pytest.fixture
def foreign_port():
    """A port something other than this checkout's services answers on (a plain listener)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        yield listener.getsockname()[1]


def services(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=600,
                          env={**os.environ, **env}, cwd=ROOT)


@pytest.mark.parametrize("service, variable", [
    pytest.param("redis", "FAIRSTREAM_REDIS_PORT", id="a redis this checkout did not start"),
    pytest.param("kafka", "FAIRSTREAM_KAFKA_PORT", id="a kafka this checkout did not start"),
])
def test_a_port_this_checkout_did_not_start_is_refused_in_one_line(foreign_port, service, variable):
    env = {variable: str(foreign_port)}
    if service == "kafka":  # redis first: this checkout's own, on a port of its own
        env["FAIRSTREAM_REDIS_PORT"] = os.environ.get("FAIRSTREAM_REDIS_PORT", "6379")
    done = services("start", **env)
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"services: {service}: 127.0.0.1:{foreign_port} answers but this checkout did not start it")
    assert "FAIRSTREAM_SERVICES_REUSE=1" in last


def test_told_to_it_uses_what_answers(foreign_port):
    done = services("start", FAIRSTREAM_REDIS_PORT=str(foreign_port), FAIRSTREAM_SERVICES_REUSE="1",
                    FAIRSTREAM_KAFKA_PORT=os.environ.get("FAIRSTREAM_KAFKA_PORT", "9092"))
    assert f"redis on 127.0.0.1:{foreign_port} was not started by this checkout; using it" in done.stderr


def test_the_kafka_restart_drill_says_in_one_line_when_services_refuse(monkeypatch):
    # It restarts the broker through scripts/services.sh, which refuses one it did not start:
    # the drill then ends in that one line (fairstream: error: ...), not a traceback.
    import asyncio

    from fairstream.core.model import ModelError
    from fairstream.lab import drill

    async def decided(ctx, count):
        return None

    refusal = subprocess.CompletedProcess([], 1, "", "services: kafka: 127.0.0.1:9092 answers but this checkout "
                                                     "did not start it (another checkout's or program's)\n")
    monkeypatch.setattr(drill, "_after_decisions", decided)
    monkeypatch.setattr(drill.subprocess, "run", lambda *args, **kwargs: refusal)
    with pytest.raises(ModelError, match=r"^kafka-restart: scripts/services.sh restart-kafka failed: services: "
                                         r"kafka: 127.0.0.1:9092 answers but this checkout did not start it"):
        asyncio.run(drill.fault_kafka_restart(object()))
