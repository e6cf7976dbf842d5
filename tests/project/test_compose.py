"""docker-compose.yml and the Dockerfile, checked without a Docker engine.

This machine cannot run the compose file (no Docker engine), so what can drift silently is
checked here: every fairstream command in it is one our command line accepts, the files it
names are in the image, the worker reaches the broker and Redis the file starts, and Redis
keeps what it acknowledged (docs/architecture.md, "Redis durability").
"""

from __future__ import annotations

import shlex
import tomllib
from pathlib import Path

import pytest
import yaml

from fairstream.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]
FAIRSTREAM_SERVICES = [name for name, service in SERVICES.items() if service.get("build")]


def dockerfile_copies() -> list[str]:
    """The sources of the Dockerfile's COPY lines (paths relative to the repository)."""
    copies = []
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        words = shlex.split(line, comments=True)
        if words and words[0] == "COPY":
            copies.extend(words[1:-1])
    return copies


def test_the_compose_file_starts_kafka_redis_a_worker_and_the_emulator():
    assert set(SERVICES) == {"kafka", "redis", "worker", "emulator"}
    assert sorted(FAIRSTREAM_SERVICES) == ["emulator", "worker"]


@pytest.mark.parametrize("service", FAIRSTREAM_SERVICES)
def test_each_fairstream_command_in_the_compose_file_is_accepted_by_our_command_line(service):
    build_parser().parse_args(SERVICES[service]["command"])  # exits (fails the test) if not


@pytest.mark.parametrize("service", FAIRSTREAM_SERVICES)
def test_files_a_compose_command_names_exist_and_are_copied_into_the_image(service):
    copied = dockerfile_copies()
    named = [word for word in SERVICES[service]["command"] if "/" in word and not word.startswith("-")]
    for path in named:
        assert (ROOT / path).is_file(), path
        assert any(path == source or path.startswith(source.rstrip("/") + "/") for source in copied), path


def test_the_image_copies_every_source_directory_the_package_installs_from():
    package_dirs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    top_level = {directory.split("/")[0] for directory in package_dirs.values()}
    assert top_level <= set(dockerfile_copies())
    assert {"pyproject.toml", "README.md"} <= set(dockerfile_copies())  # the build reads both


def test_the_worker_and_emulator_reach_the_brokers_advertised_in_network_listener():
    listeners = SERVICES["kafka"]["environment"]["KAFKA_ADVERTISED_LISTENERS"].split(",")
    in_network = next(listener.split("://")[1] for listener in listeners if listener.startswith("PLAINTEXT://"))
    assert SERVICES["worker"]["environment"]["FAIRSTREAM_BROKER"] == in_network
    command = SERVICES["emulator"]["command"]
    assert command[command.index("--broker") + 1] == in_network


def test_the_worker_uses_the_compose_files_redis_and_waits_for_both_services_to_be_healthy():
    assert SERVICES["worker"]["environment"]["FAIRSTREAM_REDIS_URL"].startswith("redis://redis:6379/")
    assert SERVICES["worker"]["depends_on"] == {
        "kafka": {"condition": "service_healthy"}, "redis": {"condition": "service_healthy"}}


def test_redis_fsyncs_every_write_to_an_append_only_file_on_a_named_volume():
    # The worker acknowledges Kafka input once Redis has committed it: a Redis that loses
    # acknowledged writes loses that input (docs/architecture.md).
    command = SERVICES["redis"]["command"]
    assert command[command.index("--appendonly") + 1] == "yes"
    assert command[command.index("--appendfsync") + 1] == "always"
    volume = SERVICES["redis"]["volumes"][0].split(":")
    assert volume[1] == "/data" and volume[0] in COMPOSE["volumes"]


@pytest.mark.parametrize("service", [name for name, service in SERVICES.items() if service.get("ports")])
def test_published_ports_are_reachable_from_this_host_only(service):
    # Kafka and Redis run without authentication here, the metrics page says what the
    # cluster runs: none of them is published on the host's other interfaces.
    for mapping in SERVICES[service]["ports"]:
        assert str(mapping).startswith("127.0.0.1:"), f"{service} publishes {mapping} on every interface"
