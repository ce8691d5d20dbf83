"""``settled demo``: the main job's entry point.

Until the BFCL workload lands (issue 8), the demo proves the stack end to end: it starts the dev stack when no
Kafka/Postgres is configured, creates a namespaced topic, commits one transaction and reads it back with a
read_committed consumer, and stores the round trip's latency in PostgreSQL.
"""

from __future__ import annotations

import time
import uuid

import psycopg
import typer
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
from rich.console import Console

from settled._settings import Settings
from settled.services._cli_dev import stack_from_settings

_console = Console()


def _services(settings: Settings) -> tuple[str, str]:
    if settings.kafka_bootstrap and settings.postgres_dsn:
        return settings.kafka_bootstrap, settings.postgres_dsn
    bootstrap, dsn = stack_from_settings(settings).up()
    return settings.kafka_bootstrap or bootstrap, settings.postgres_dsn or dsn


def demo(timeout_s: float = typer.Option(30.0, help="Bound on each Kafka call, in seconds.")) -> None:
    """Start the stack if needed and run one transactional round trip through Kafka into PostgreSQL."""
    settings = Settings()
    bootstrap, dsn = _services(settings)
    _console.print(f"Kafka {bootstrap}, PostgreSQL {dsn}")
    topic = settings.topic("demo")
    admin = AdminClient({"bootstrap.servers": bootstrap})
    if topic not in admin.list_topics(timeout=timeout_s).topics:
        admin.create_topics([NewTopic(topic, 1, 1)], operation_timeout=timeout_s)[topic].result()
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": f"{settings.namespace}.{settings.app_id}.demo",
            "linger.ms": settings.linger_ms,
            "retry.backoff.ms": settings.retry_backoff_ms,
        }
    )
    producer.init_transactions(timeout_s)
    marker = uuid.uuid4().hex.encode()
    started = time.monotonic()
    producer.begin_transaction()
    producer.produce(topic, key=b"demo", value=marker)
    producer.commit_transaction(timeout_s)
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"{settings.namespace}.demo-reader",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    end = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=timeout_s)[1]
    consumer.assign([TopicPartition(topic, 0, max(end - 2, 0))])
    found = False
    deadline = time.monotonic() + timeout_s
    while not found and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is None:
            continue
        if msg.error():
            raise KafkaException(msg.error())
        found = msg.value() == marker
    consumer.close()
    if not found:
        _console.print(f"[red]the committed record was not read back within {timeout_s} s[/red]")
        raise typer.Exit(1)
    took_ms = (time.monotonic() - started) * 1000
    with psycopg.connect(dsn) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS settled_demo (at timestamptz DEFAULT now(), round_trip_ms float8)")
        conn.execute("INSERT INTO settled_demo (round_trip_ms) VALUES (%s)", (took_ms,))
        runs = conn.execute("SELECT count(*) FROM settled_demo").fetchone()
    stored = runs[0] if runs else 0
    _console.print(f"[green]OK[/green]: transactional round trip in {took_ms:.1f} ms; {stored} runs stored")
