"""``settled demo``: the main job (issue 8), found in the BFCL example, and the stack's round trip.

* ``settled demo`` / ``settled demo bfcl [ARGS]``: the BFCL main job. Its code is the separate ``settled-bfcl``
  distribution (``examples/bfcl``; ``scripts/dev setup`` installs it), found through the ``settled.demo`` entry-point
  group and given ``ARGS`` (``settled demo bfcl --help`` lists them). Not installed: exit 2, saying how to install it.
* ``settled demo roundtrip``: starts the dev stack when no Kafka/Postgres is configured, commits one transaction to
  a namespaced topic, reads it back with a read_committed consumer, and stores the latency in PostgreSQL.
"""

from __future__ import annotations

import time
import uuid
from importlib.metadata import entry_points

import psycopg
import typer
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
from rich.console import Console

from settled.producers import admin_config, producer_config, reader_config
from settled.services._cli_root import command, resolve_settings

_console = Console()

__all__ = ["DEMO_ENTRY_POINT_GROUP", "bfcl", "demo_app", "roundtrip"]

demo_app = typer.Typer(
    invoke_without_command=True,
    help="The main job: BFCL conversations through the real stack (default: `settled demo bfcl`).",
)


@demo_app.command("roundtrip")
@command
def roundtrip(timeout_s: float = typer.Option(30.0, help="Bound on each Kafka call, in seconds.")) -> None:
    """Start the stack if needed and run one transactional round trip through Kafka into PostgreSQL."""
    settings = resolve_settings(kafka=True, postgres=True, start=True)
    bootstrap, dsn = settings.kafka_bootstrap, settings.postgres_dsn
    _console.print(f"Kafka {bootstrap}, PostgreSQL {dsn}")
    topic = settings.topic("demo")
    admin = AdminClient(admin_config(settings))
    if topic not in admin.list_topics(timeout=timeout_s).topics:
        admin.create_topics([NewTopic(topic, 1, 1)], operation_timeout=timeout_s)[topic].result()
    producer = Producer(producer_config(settings, transactional_id=f"{settings.namespace}.{settings.app_id}.demo"))
    producer.init_transactions(timeout_s)
    marker = uuid.uuid4().hex.encode()
    started = time.monotonic()
    producer.begin_transaction()
    producer.produce(topic, key=b"demo", value=marker)
    producer.commit_transaction(timeout_s)
    consumer = Consumer(reader_config(settings, f"{settings.namespace}.demo-reader"))
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


#: The entry-point group a demo registers in: ``name = "module:function"``, ``function(args: Sequence[str]) -> int``.
DEMO_ENTRY_POINT_GROUP = "settled.demo"

_INSTALL_HINT = (
    "pip install -e examples/bfcl && pip install --no-deps bfcl-eval==2026.3.23 mpmath==1.3.0 "
    "(from a settled checkout; scripts/dev setup does both)"
)


def _run_demo(name: str, args: list[str]) -> None:
    """Run the demo ``name`` registered in the ``settled.demo`` entry-point group with ``args``; exit with its code.

    Args:
        name: The entry point's name (``bfcl``).
        args: Its command-line arguments.

    Raises:
        typer.Exit: Always: the demo's exit code, or 2 when no installed distribution provides ``name``.
    """
    found = entry_points(group=DEMO_ENTRY_POINT_GROUP, name=name)
    if not found:
        _console.print(
            f"[red]settled demo {name}: the example is not installed (no {name!r} entry point in the "
            f"{DEMO_ENTRY_POINT_GROUP!r} group). Install it: {_INSTALL_HINT}[/red]"
        )
        raise typer.Exit(2)
    run = next(iter(found)).load()
    raise typer.Exit(int(run(args)))


@demo_app.command(
    "bfcl", context_settings={"allow_extra_args": True, "ignore_unknown_options": True}, add_help_option=False
)
def bfcl(ctx: typer.Context) -> None:
    """BFCL multi-turn conversations through workers, a projector and the tool server (the settled-bfcl example)."""
    _run_demo("bfcl", list(ctx.args))


@demo_app.callback()
def demo(ctx: typer.Context) -> None:
    """The main job; without a subcommand, ``settled demo bfcl`` on the whole base set."""
    if ctx.invoked_subcommand is None:
        _run_demo("bfcl", [])
