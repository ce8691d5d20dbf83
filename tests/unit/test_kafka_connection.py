"""One Kafka connection configures every client (issue 14 item 3).

The SASL/TLS settings come from the environment like every other setting, reach every configuration the worker (and
the rest of settled) builds — group consumer, transactional producer, idempotent inbox producer, assign-only readers,
the batch probe, admin — and are accepted by librdkafka itself. A static check keeps it that way: no module of the
package but `settled._connection` writes ``bootstrap.servers``.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient
from pydantic import SecretStr, ValidationError

from settled import Settings
from settled.processors._batch_probe import probe_consumer_config
from settled.producers import admin_config, consumer_config, producer_config, reader_config, transactional_id
from settled.runtime import load_app
from settled.services._cli_root import resolve_settings
from settled.services._worker_service import build_worker

PACKAGE = Path(__file__).resolve().parents[2] / "settled"

SASL_ENV = {
    "SETTLED_KAFKA_BOOTSTRAP": "127.0.0.1:1",
    "SETTLED_KAFKA_SECURITY_PROTOCOL": "sasl_ssl",
    "SETTLED_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
    "SETTLED_KAFKA_SASL_USERNAME": "svc-settled",
    "SETTLED_KAFKA_SASL_PASSWORD": "s3cret-pw",
    "SETTLED_KAFKA_SSL_CA_LOCATION": "/etc/ssl/certs/kafka-ca.pem",
    "SETTLED_KAFKA_SSL_ENDPOINT_IDENTIFICATION_ALGORITHM": "https",
}
EXPECTED = {
    "bootstrap.servers": "127.0.0.1:1",
    "security.protocol": "sasl_ssl",
    "sasl.mechanism": "SCRAM-SHA-512",
    "sasl.username": "svc-settled",
    "sasl.password": "s3cret-pw",
    "ssl.ca.location": "/etc/ssl/certs/kafka-ca.pem",
    "ssl.endpoint.identification.algorithm": "https",
}


@pytest.fixture
def sasl_settings(monkeypatch: pytest.MonkeyPatch) -> Settings:
    for name, value in SASL_ENV.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("SETTLED_NAMESPACE", "ns")
    return resolve_settings()  # what `settled worker` runs with


def _worker_configs(s: Settings) -> dict[str, dict[str, Any]]:
    """Every Kafka client configuration a `settled worker` process builds, from the worker `settled worker` builds.

    `worker_command` builds its worker as ``build_worker(resolve_settings(), load_app(...))``; the worker's clients
    take their configuration from its ``settings`` and ``config`` through these builders (`Worker._run`, the
    appender, `end_offsets`/`read_partition` of a claim, the batch probe, `describe_topics`).
    """
    worker = build_worker(s, load_app("settled.testing.echo:app"), worker_id="w-sasl")
    s, limits = worker.settings, worker.config.consumer_limits
    return {
        "group consumer": consumer_config(s, worker.group_id, **limits, **dict(worker.config.consumer_overrides)),
        "transactional producer (appender)": producer_config(s, transactional_id=transactional_id(s, 0)),
        "reader (claim's end offsets, replay)": reader_config(s, f"{s.namespace}.settled-reader"),
        "read_uncommitted reader (high watermark)": reader_config(
            s, "settled-offsets-query", isolation_level="read_uncommitted"
        ),
        "batch probe": probe_consumer_config(s, limits),
        "admin (topic check)": admin_config(s),
        "idempotent producer (client inbox)": producer_config(s, **{"message.timeout.ms": 30_000}),
        "idempotent producer (provisional stream)": producer_config(s, **{"linger.ms": 5}),
    }


def test_sasl_settings_reach_every_client_the_worker_builds(sasl_settings: Settings) -> None:
    configs = _worker_configs(sasl_settings)
    for role, conf in configs.items():
        missing = {k: v for k, v in EXPECTED.items() if conf.get(k) != v}
        assert missing == {}, f"{role}: {missing} not passed on (got {conf})"


def test_librdkafka_accepts_the_connection_properties(sasl_settings: Settings) -> None:
    plain = sasl_settings.model_copy(
        update={"kafka_security_protocol": "sasl_plaintext", "kafka_ssl_ca_location": None}
    )  # no CA file on this machine: TLS is checked by name above, SASL here by librdkafka
    configs = _worker_configs(plain)
    built: list[Any] = [
        Consumer(configs["group consumer"]),
        Consumer(configs["reader (claim's end offsets, replay)"]),
        Producer(configs["transactional producer (appender)"]),
        AdminClient(configs["admin (topic check)"]),
    ]
    for client in built:
        if isinstance(client, Consumer):
            client.close()


def test_secrets_are_hidden_outside_the_librdkafka_dict(sasl_settings: Settings) -> None:
    assert isinstance(sasl_settings.kafka_sasl_password, SecretStr)
    assert "s3cret-pw" not in repr(sasl_settings)
    assert "s3cret-pw" not in repr(sasl_settings.kafka)
    assert sasl_settings.kafka.client_config()["sasl.password"] == "s3cret-pw"


def test_no_security_settings_means_librdkafka_defaults() -> None:
    conf = Settings(kafka_bootstrap="b:9092").kafka.client_config()
    assert conf == {"bootstrap.servers": "b:9092"}


def test_a_username_without_password_is_refused_naming_both(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SETTLED_KAFKA_SASL_USERNAME", "svc")
    with pytest.raises(ValidationError, match="sasl_username is set but sasl_password is not"):
        _ = Settings().kafka


def test_a_bad_security_protocol_is_refused_naming_the_field(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SETTLED_KAFKA_SECURITY_PROTOCOL", "tls")
    with pytest.raises(ValidationError, match="kafka_security_protocol"):
        Settings()


def _bootstrap_literals(root: Path) -> dict[str, list[int]]:
    sites: dict[str, list[int]] = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Constant) and node.value == "bootstrap.servers":
                sites.setdefault(str(path.relative_to(root)), []).append(node.lineno)
    return sites


def test_only_the_connection_writes_bootstrap_servers() -> None:
    outside = {f: lines for f, lines in _bootstrap_literals(PACKAGE).items() if f != "_connection.py"}
    assert outside == {}, f"Kafka client configurations built by hand (use settled.producers' builders): {outside}"


def test_the_static_check_finds_a_hand_built_configuration(tmp_path: Path) -> None:
    (tmp_path / "rogue.py").write_text(
        'from confluent_kafka import Consumer\nc = Consumer({"bootstrap.servers": "x"})\n'
    )
    assert _bootstrap_literals(tmp_path) == {"rogue.py": [2]}


def test_every_producer_connects_to_every_broker(sasl_settings: Settings) -> None:
    """A producer id request must not wait on librdkafka's 500 ms timer (docs/architecture.md "Restart in place").

    With sparse connections a new producer drops its bootstrap connection before it has one to a learned broker, and
    about half the producers of a restarted worker then waited 500 ms in ``init_transactions`` (bench/restart.py).
    """
    producers = {role: conf for role, conf in _worker_configs(sasl_settings).items() if "producer" in role}
    assert len(producers) == 3
    for role, conf in producers.items():
        assert conf.get("enable.sparse.connections") is False, role
