"""The publishing client (``producers/client.py``: emulate, replay, ``fairstream publish`` and
users' code) on the real broker of ``scripts/services.sh`` while the broker is frozen
(SIGSTOP: a long GC pause, a host that froze): it rides out the outage within its delivery
timeout and sends nothing twice, or gives up with one line saying what it could not send."""

import asyncio
import contextlib
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from fairstream.producers.client import Publisher, Undelivered, read_topic
from fairstream.wire.kafka import ensure_topics

ROOT = Path(__file__).resolve().parents[2]
BROKER = "127.0.0.1:9092"
SERVICES = ["bash", str(ROOT / "scripts" / "services.sh")]

pytestmark = pytest.mark.live


@pytest.fixture(scope="module", autouse=True)
def services():
    subprocess.run([*SERVICES, "start"], check=True, capture_output=True)


@pytest.fixture
def frozen_broker():
    """Freezes the broker when called; it is thawed at the latest when the test ends."""
    def freeze():
        subprocess.run([*SERVICES, "freeze-kafka"], check=True, capture_output=True)

    yield freeze
    thaw()


def thaw():
    subprocess.run([*SERVICES, "thaw-kafka"], check=True, capture_output=True)


async def messages_in(topic: str) -> list[dict]:
    return [m async for m in read_topic(BROKER, topic, from_beginning=True, idle_timeout=2.0)]


@contextlib.asynccontextmanager
async def publisher_then_frozen(freeze, **options):
    """A fresh topic of one partition and a ``Publisher`` (``options``) that has sent it
    ``{"n": 0}``, handed over once the broker is frozen (``freeze``): ``(topic, publisher)``."""
    topic = f"outage-{uuid.uuid4().hex[:8]}"
    await ensure_topics(BROKER, [topic], 1)
    async with Publisher(BROKER, **options) as pub:
        await pub.send_raw(topic, "c1", b'{"n": 0}')
        freeze()
        yield topic, pub


def test_a_send_rides_out_a_frozen_broker_and_the_message_arrives_once(frozen_broker):
    # The broker is frozen longer than a produce request may take (3 s here, 40 s by default):
    # the request times out and is sent again, with its sequence number, once the broker is back.

    async def scenario():
        async with publisher_then_frozen(frozen_broker, delivery_timeout_s=120, request_timeout_ms=3000) as (topic, pub):
            sending = asyncio.create_task(pub.send_raw(topic, "c1", b'{"n": 1}'))
            await asyncio.sleep(0)
            frozen_at = time.monotonic()
            # Thawed after more than two request timeouts, with the send still waiting.
            while time.monotonic() - frozen_at < 8:
                assert not sending.done(), sending.exception() if sending.done() else None
                await asyncio.sleep(0.2)
            await asyncio.to_thread(thaw)
            await sending
            await pub.send_raw(topic, "c1", b'{"n": 2}')
        return await messages_in(topic)

    assert asyncio.run(scenario()) == [{"n": 0}, {"n": 1}, {"n": 2}]


def test_a_send_that_outlasts_its_delivery_timeout_says_in_one_line_what_it_could_not_send(frozen_broker):

    async def scenario():
        async with publisher_then_frozen(frozen_broker, delivery_timeout_s=4, request_timeout_ms=2000) as (topic, pub):
            started = time.monotonic()
            with pytest.raises(Undelivered) as raised:
                await pub.send_raw(topic, "c1", b'{"n": 1}')
            gave_up_after = time.monotonic() - started
        closed_after = time.monotonic() - started  # closing does not wait for the frozen broker
        return topic, raised.value, gave_up_after, closed_after

    topic, error, gave_up_after, closed_after = asyncio.run(scenario())
    thaw()
    message = str(error)
    assert "\n" not in message
    assert message.startswith("gave up after the delivery timeout of 4 s (no acknowledgement from the broker): "
                              f"1 message(s) not acknowledged, the last to {topic} keyed 'c1'"), message
    assert 4 <= gave_up_after < 8 and closed_after < 15


def test_the_emulate_command_gives_up_in_one_line_with_exit_2_not_a_traceback(frozen_broker, tmp_path):
    # Once it is publishing (its first submissions are in the topic), the broker freezes.
    import json

    prefix = f"x{uuid.uuid4().hex[:6]}"
    scenario = tmp_path / "s.json"
    scenario.write_text(json.dumps({
        "version": 1, "resources": ["cpu"], "nodes": [{"id": "n1", "capacity": {"cpu": 1}}],
        "tasks": [{"id": f"t{k}", "tenant": "A", "submit": k, "duration": 1, "demand": {"cpu": 1}} for k in range(600)]}))
    emulate = subprocess.Popen([sys.executable, "-m", "fairstream.cli", "emulate", str(scenario), "--format", "scenario", "--topic-prefix", prefix,
                                "--speed", "20", "--delivery-timeout", "3"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        while len(asyncio.run(messages_in(f"{prefix}.tasks.submitted"))) < 3:
            assert emulate.poll() is None, emulate.communicate()
        frozen_broker()
        frozen_at = time.monotonic()
        _, stderr = emulate.communicate(timeout=120)
        took = time.monotonic() - frozen_at
    finally:
        if emulate.poll() is None:
            emulate.kill()
    assert emulate.returncode == 2, stderr
    # (Besides its progress lines, logged every 10 s.)
    said = [line for line in stderr.strip().splitlines() if '"event": "emulator.progress"' not in line]
    assert "Traceback" not in stderr and len(said) == 1, stderr
    assert "gave up after the delivery timeout of 3 s" in stderr, stderr
    assert took < 30  # not the 80 s of two request timeouts that closing once waited for
