"""docker-compose.yml parses and agrees with the package's defaults (issue 3). It is not run here: no Docker engine."""

from __future__ import annotations

import shlex
from pathlib import Path

import typer.main
import yaml

from settled._settings import Settings
from settled.services._devstack import KafkaBroker
from settled.services.cli import app

_COMPOSE = Path(__file__).resolve().parents[3] / "docker-compose.yml"


def _compose() -> dict:
    return yaml.safe_load(_COMPOSE.read_text())


def test_ports_agree_with_settings() -> None:
    services = _compose()["services"]
    # The package's defaults, whatever this process's environment overrides.
    s = Settings.model_construct(
        **{name: f.get_default(call_default_factory=True) for name, f in Settings.model_fields.items()}
    )
    assert f"{s.kafka_port}:{s.kafka_port}" in services["kafka"]["ports"]
    assert f"{s.postgres_port}:5432" in services["postgres"]["ports"]
    env = services["kafka"]["environment"]
    assert env["KAFKA_LISTENERS"].startswith(f"PLAINTEXT://0.0.0.0:{s.kafka_port},")
    assert env["KAFKA_ADVERTISED_LISTENERS"] == f"PLAINTEXT://localhost:{s.kafka_port}"
    assert services["kafka"]["image"] == f"apache/kafka:{s.kafka_version}"


def test_broker_overrides_agree_with_the_dev_stack() -> None:
    env = _compose()["services"]["kafka"]["environment"]
    props = KafkaBroker(Path("/x"), Path("/x"), 1, 2).properties()
    for key in [
        "offsets.topic.replication.factor",
        "transaction.state.log.replication.factor",
        "transaction.state.log.min.isr",
        "group.initial.rebalance.delay.ms",
        "group.min.session.timeout.ms",
        "transaction.abort.timed.out.transaction.cleanup.interval.ms",
        "auto.create.topics.enable",
    ]:
        compose_key = "KAFKA_" + key.upper().replace(".", "_")
        assert env[compose_key] == props[key], key


def _unknown_subcommands(services: dict) -> list[str]:
    root = typer.main.get_command(app)
    bad: list[str] = []
    for name, svc in services.items():
        command = svc.get("command")
        if not str(svc.get("image", "")).startswith("settled") and "build" not in svc:
            continue
        argv = shlex.split(command) if isinstance(command, str) else list(command or [])
        if not argv or argv[0] != "settled":
            bad.append(f"{name}: command {argv!r} does not run settled")
            continue
        ctx = typer.Context(root)
        group = root
        for word in argv[1:]:
            get_command = getattr(group, "get_command", None)  # only command groups have subcommands
            if word.startswith("-") or get_command is None:
                break
            sub = get_command(ctx, word)
            if sub is None:
                bad.append(f"{name}: 'settled {word}' is not a subcommand")
                break
            group = sub
    return bad


def test_every_settled_service_runs_an_existing_subcommand() -> None:
    assert _unknown_subcommands(_compose()["services"]) == []


def test_the_subcommand_check_catches_a_wrong_command() -> None:
    services = {
        "ok": {"build": ".", "command": "settled dev status"},
        "typo": {"build": ".", "command": "settled dev upp"},
        "other": {"image": "settled:latest", "command": ["python", "x.py"]},
    }
    assert _unknown_subcommands(services) == [
        "typo: 'settled upp' is not a subcommand",
        "other: command ['python', 'x.py'] does not run settled",
    ]
