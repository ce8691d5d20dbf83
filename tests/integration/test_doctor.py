"""``settled doctor`` against real services (issue 21 item 3): it passes on a provisioned namespace of the dev stack,
and fails naming the check with the broker stopped, with a topic missing, and with librdkafka's default
``retry.backoff.ms`` configured. The command runs as a real child process, as an operator runs it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import psycopg
import pytest
from confluent_kafka.admin import AdminClient

from settled._settings import Settings
from settled.producers import admin_config, provision_topics
from settled.projections import default_schema, migrate
from settled.schemas import Codec
from settled.services._devstack import KafkaBroker

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
#: Bound on one doctor run, in seconds: six checks of at most ``--timeout-s`` each, and an interpreter start.
RUN_TIMEOUT_S = 90.0


def _doctor(settings: Settings, *args: str, **env_overrides: str) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SETTLED_")}
    env.update(settings.timeouts_env())
    env.update(
        SETTLED_NAMESPACE=settings.namespace,
        SETTLED_KAFKA_BOOTSTRAP=settings.kafka_bootstrap,
        SETTLED_POSTGRES_DSN=settings.postgres_dsn,
        SETTLED_PARTITIONS=str(settings.partitions),
        **env_overrides,
    )
    proc = subprocess.run(
        [sys.executable, "-m", "settled.services", "doctor", "--timeout-s", "5", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    return proc.returncode, proc.stdout, proc.stderr


def _statuses(stdout: str) -> dict[str, str]:
    """Check name → status, read off the printed table's rows."""
    out: dict[str, str] = {}
    for line in stdout.splitlines():
        cells = [c.strip() for c in line.strip("│┃ ").split("│")]
        if len(cells) >= 2 and cells[1] in ("ok", "failed", "skipped") and cells[0]:
            out[cells[0]] = cells[1]
    return out


@pytest.fixture
def healthy(settings: Settings) -> Iterator[Settings]:
    """The test's namespace with its topics provisioned (2 partitions) and its projection schema migrated."""
    s = settings.model_copy(update={"partitions": 2})
    provision_topics(s, Codec(), datetime.now(UTC))
    schema = default_schema(s.namespace)
    with psycopg.connect(s.postgres_dsn, autocommit=True) as conn:
        migrate(conn, schema)
    yield s
    with psycopg.connect(s.postgres_dsn, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def test_doctor_passes_on_a_healthy_namespace(healthy: Settings) -> None:
    code, out, err = _doctor(healthy)
    assert code == 0, out + err
    assert _statuses(out) == {
        "broker": "ok",
        "topics": "ok",
        "projection-schema": "ok",
        "transactional-settings": "ok",
        "resolver-key": "skipped",
        "clock-skew": "ok",
        "overdue": "ok",
    }, out


def test_doctor_fails_naming_the_topics_check_when_a_topic_is_missing(healthy: Settings) -> None:
    admin = AdminClient(admin_config(healthy))
    receipts = healthy.topic("receipts")
    admin.delete_topics([receipts], operation_timeout=30)[receipts].result()
    code, out, err = _doctor(healthy)
    assert code == 1, out + err
    assert _statuses(out)["topics"] == "failed", out
    assert f"{receipts} is missing" in " ".join(out.split()), out
    assert "failed checks: topics" in err


def test_doctor_flags_librdkafkas_default_retry_backoff(healthy: Settings) -> None:
    code, out, err = _doctor(healthy, SETTLED_RETRY_BACKOFF_MS="100")
    assert code == 1, out + err
    statuses = _statuses(out)
    assert statuses["transactional-settings"] == "failed", out
    assert "retry.backoff.ms=100" in " ".join(out.split()), out
    assert {name for name, status in statuses.items() if status == "failed"} == {"transactional-settings"}, out


def test_doctor_fails_naming_the_broker_check_when_the_broker_is_stopped(
    settings: Settings, private_broker: Callable[..., KafkaBroker]
) -> None:
    broker = private_broker()
    broker.start()
    s = settings.model_copy(update={"kafka_bootstrap": broker.bootstrap, "partitions": 1})
    provision_topics(s, Codec(), datetime.now(UTC))
    code, out, err = _doctor(s, "--no-postgres")
    assert code == 0, out + err  # the same namespace was healthy while the broker ran
    broker.stop()
    code, out, err = _doctor(s, "--no-postgres")
    assert code == 1, out + err
    statuses = _statuses(out)
    assert statuses["broker"] == "failed", out
    assert statuses["topics"] == statuses["clock-skew"] == "skipped", out
    assert "failed checks: broker" in err
