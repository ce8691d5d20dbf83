"""``settled topics create|describe``: settled's co-partitioned topics and their genesis (docs/design.md §2).

Both read the settings from the environment (``SETTLED_NAMESPACE``, ``SETTLED_KAFKA_BOOTSTRAP``,
``SETTLED_PARTITIONS``, ...) through `settled.services._cli_root.resolve_settings`. Without ``SETTLED_KAFKA_BOOTSTRAP``
they use the local dev stack's broker when it runs (``settled dev up``); they never start one.
"""

from __future__ import annotations

from datetime import UTC, datetime

import typer
from rich.console import Console
from rich.table import Table

from settled._settings import Settings
from settled.producers import TopicInfo, describe_topics, provision_topics, read_genesis
from settled.schemas import Codec
from settled.services._cli_root import command, resolve_settings

__all__ = ["topics_app"]

topics_app = typer.Typer(no_args_is_help=True, help="Create and describe settled's co-partitioned topics.")

_TIMEOUT_OPTION = typer.Option(30.0, "--timeout-s", help="Bound on each Kafka call, in seconds.")


def _table(settings: Settings, infos: list[TopicInfo]) -> Table:
    table = Table(title=f"settled topics (namespace {settings.namespace!r}, bootstrap {settings.kafka_bootstrap})")
    for column in ("topic", "partitions", "retention.ms", "timestamp type", "max.message.bytes"):
        table.add_column(column, justify="right" if column in ("partitions", "max.message.bytes") else "left")
    for info in infos:
        if not info.partitions:
            table.add_row(info.name, "[red]missing[/red]", "", "", "")
            continue
        retention = info.config.get("retention.ms", "?")
        table.add_row(
            info.name,
            str(info.partitions),
            "forever (-1)" if retention == "-1" else retention,
            info.config.get("message.timestamp.type", "?"),
            info.config.get("max.message.bytes", "?"),
        )
    return table


def _genesis_summary(settings: Settings, infos: list[TopicInfo], timeout_s: float) -> str:
    log = next(i for i in infos if i.name == settings.topic("log"))
    if not log.partitions:
        return "genesis: no log topic"
    codec = Codec()
    counts: dict[int, list[int]] = {}
    missing: list[int] = []
    for p in range(log.partitions):
        genesis = read_genesis(settings, codec, p, timeout_s)
        if genesis is None:
            missing.append(p)
        else:
            counts.setdefault(genesis.partition_count, []).append(p)
    parts = [f"{len(ps)} log partitions fix {n} partitions" for n, ps in sorted(counts.items())]
    if missing:
        parts.append(f"no genesis on log partitions {missing}")
    return "genesis: " + "; ".join(parts)


@topics_app.command("create")
@command
def create(timeout_s: float = _TIMEOUT_OPTION) -> None:
    """Create the missing topics and write the genesis record to every empty log partition (idempotent).

    Refuses, exit code 1, when an existing topic's partition count differs from SETTLED_PARTITIONS or from the
    genesis record (adding partitions would move conversations away from their history, docs/design.md §2).
    """
    settings = resolve_settings()
    infos = provision_topics(settings, Codec(), datetime.now(UTC), timeout_s)  # a mismatch is refused: exit 1
    console = Console()
    console.print(_table(settings, infos))
    console.print(_genesis_summary(settings, infos, timeout_s))


@topics_app.command("describe")
@command
def describe(timeout_s: float = _TIMEOUT_OPTION) -> None:
    """Print settled's topics: partitions, retention, timestamp type, max.message.bytes; and their genesis.

    Exit code 1 when a topic is missing.
    """
    settings = resolve_settings()
    infos = describe_topics(settings, timeout_s)
    console = Console()
    console.print(_table(settings, infos))
    console.print(_genesis_summary(settings, infos, timeout_s))
    if any(not i.partitions for i in infos):
        Console(stderr=True).print("[red]topics are missing:[/red] run `settled topics create`")
        raise typer.Exit(1)
