"""``settled quarantine list``: what was set aside on ``settled.quarantine`` and why (docs/design.md §11).

Reads the quarantine topic ``read_committed`` (a quarantine record is visible only once the transaction that moved
the inbox offset past its input committed) and prints, per record: source topic, partition, offset, reason,
detail and the value's size.
"""

from __future__ import annotations

import typer
from confluent_kafka.admin import AdminClient
from rich.console import Console
from rich.table import Table

from settled._settings import Settings
from settled.producers import admin_config, read_partition
from settled.schemas import Codec, QuarantineRecord
from settled.services._cli_root import command, resolve_settings

__all__ = ["quarantine_app", "read_quarantine"]

quarantine_app = typer.Typer(no_args_is_help=True, help="Inspect the inbox records settled set aside.")


def read_quarantine(settings: Settings, timeout_s: float) -> list[QuarantineRecord]:
    """Read every committed quarantine record, ordered by quarantine time (then source partition and offset).

    Args:
        settings: Namespace and bootstrap servers.
        timeout_s: Bound on each Kafka call, in seconds.

    Returns:
        The records.

    Raises:
        LookupError: The quarantine topic does not exist.
        DecodeError: A record on the quarantine topic is not a `QuarantineRecord` (naming its offset).
    """
    topic = settings.topic("quarantine")
    metadata = AdminClient(admin_config(settings)).list_topics(topic, timeout=timeout_s)
    meta = metadata.topics.get(topic)
    if meta is None or meta.error is not None:
        raise LookupError(f"topic {topic} does not exist: run `settled topics create`")
    codec = Codec()
    out: list[QuarantineRecord] = []
    for p in sorted(meta.partitions):
        for msg in read_partition(settings, topic, p, 0, timeout_s):
            value, offset = msg.value(), msg.offset()
            if value is None or offset is None:
                continue
            record = codec.decode(value, topic=topic, partition=p, offset=offset, expected=(QuarantineRecord,))
            if not isinstance(record, QuarantineRecord):  # expected= already refuses any other type
                raise TypeError(f"{topic}[{p}]@{offset} holds a {type(record).__name__}, not a QuarantineRecord")
            out.append(record)
    out.sort(key=lambda r: (r.quarantined_at, r.topic, r.partition, r.offset))
    return out


@quarantine_app.command("list")
@command
def list_quarantined(
    limit: int = typer.Option(50, "--limit", min=1, help="Show the N most recent records."),
    timeout_s: float = typer.Option(30.0, "--timeout-s", help="Bound on each Kafka call, in seconds."),
) -> None:
    """List the quarantined inbox records: topic, partition, offset, reason, detail, size."""
    settings = resolve_settings()
    try:
        records = read_quarantine(settings, timeout_s)
    except LookupError as exc:
        Console(stderr=True).print(f"[red]{exc}[/red]")
        raise typer.Exit(1) from exc
    shown = records[-limit:]
    table = Table(title=f"{settings.topic('quarantine')}: {len(shown)} of {len(records)} records")
    for column in ("topic", "partition", "offset", "reason", "detail", "size"):
        table.add_column(column, justify="right" if column in ("partition", "offset", "size") else "left")
    for r in shown:
        table.add_row(r.topic, str(r.partition), str(r.offset), r.reason.value, r.detail, str(r.raw_size_bytes))
    Console().print(table)
