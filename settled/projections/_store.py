"""Postgres side of the projection: rows and offsets in one transaction, reads for checks (docs/design.md §6, DUR-015).

`ProjectionWriter` writes a chunk's `RowSet` with batched statements (``executemany`` in pipeline mode for the
upserted tables, ``COPY`` for the append-only ones) and moves the partition's offset row, all inside the caller's
transaction. The offset row is read ``FOR UPDATE`` first: its lock serialises every writer of the partition, and the
caller compares the stored next offset with the one it expects (`OffsetConflictError`), so a second projector on the
same partition rolls back instead of applying anything twice.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from settled._errors import ErrorCategory, SettledError
from settled.projections._rows import RowSet
from settled.projections._schema import PROJECTION_NAME
from settled.projections._tables import QUARANTINE, TABLES, MergeRule, TableMode, TableSpec

__all__ = [
    "OffsetConflictError",
    "ProjectionWriter",
    "QuarantinedRecord",
    "read_offsets",
    "read_quarantine",
    "read_table",
]

Conn = psycopg.Connection[tuple[Any, ...]]

STAGE_MIN_ROWS = 64
"""From this many rows of one table in a chunk, upserts go through a staging table (``COPY``) instead of
``executemany``."""


@dataclass(frozen=True)
class QuarantinedRecord:
    """A log record the projector could not write (``projection_quarantine``; `settled.projections.Projector`).

    Attributes:
        partition: The log partition.
        log_offset: The record's offset.
        event_types: Its batch's event types, in order, duplicates removed, comma-separated.
        refused_groups: The groups of its rows PostgreSQL refused (`settled.projections.row_group` of each
            conversation, or ``partition``); its other rows were written.
        sqlstate: PostgreSQL's SQLSTATE, or None when the driver refused a value before sending it.
        error: The error, bounded (`settled.projections._sqlstate.describe`).
    """

    partition: int
    log_offset: int
    event_types: str
    refused_groups: tuple[str, ...]
    sqlstate: str | None
    error: str


class OffsetConflictError(SettledError):
    """The stored next offset is not the one this writer expected: another writer moved it (DUR-015).

    Attributes:
        partition: The log partition.
        expected: The next offset the writer expected.
        stored: The next offset found under the row lock.
    """

    category = ErrorCategory.CONFLICT

    def __init__(self, partition: int, expected: int, stored: int) -> None:
        super().__init__(
            f"partition {partition}: stored next offset {stored}, expected {expected}: another writer applied "
            "records; rolled back, re-seeking"
        )
        self.partition = partition
        self.expected = expected
        self.stored = stored


def _conflict_clause(spec: TableSpec) -> sql.Composed:
    """``ON CONFLICT (key) DO NOTHING``, or ``DO UPDATE SET`` with one merge rule per column (`TABLES`)."""
    key = sql.SQL(", ").join(sql.Identifier(c) for c in spec.key)
    if spec.mode is TableMode.FIRST:
        return sql.SQL(" ON CONFLICT ({}) DO NOTHING").format(key)
    sets = []
    for column in spec.columns:
        if column in spec.key:
            continue
        ident = sql.Identifier(column)
        rule = spec.rule(column)
        if rule is MergeRule.STICKY:
            sets.append(sql.SQL("{} = COALESCE(t.{}, EXCLUDED.{})").format(ident, ident, ident))
        elif rule is MergeRule.LATEST:
            sets.append(sql.SQL("{} = COALESCE(EXCLUDED.{}, t.{})").format(ident, ident, ident))
        else:
            sets.append(sql.SQL("{} = EXCLUDED.{}").format(ident, ident))
    return sql.SQL(" ON CONFLICT ({}) DO UPDATE SET {}").format(key, sql.SQL(", ").join(sets))


def _upsert_sql(schema: str, spec: TableSpec) -> sql.Composed:
    cols = sql.SQL(", ").join(sql.Identifier(c) for c in spec.columns)
    values = sql.SQL(", ").join(sql.Placeholder() for _ in spec.columns)
    return sql.SQL("INSERT INTO {} AS t ({}) VALUES ({}){}").format(
        sql.Identifier(schema, spec.name), cols, values, _conflict_clause(spec)
    )


def _staged_upsert_sql(schema: str, spec: TableSpec) -> sql.Composed:
    """The upsert of `_upsert_sql`, reading its rows from the table's staging table instead of parameters."""
    cols = sql.SQL(", ").join(sql.Identifier(c) for c in spec.columns)
    return sql.SQL("INSERT INTO {} AS t ({}) SELECT {} FROM {}{}").format(
        sql.Identifier(schema, spec.name), cols, cols, sql.Identifier(_stage_name(spec)), _conflict_clause(spec)
    )


def _stage_name(spec: TableSpec) -> str:
    return f"settled_stage_{spec.name}"


def _copy_sql(schema: str, spec: TableSpec) -> sql.Composed:
    cols = sql.SQL(", ").join(sql.Identifier(c) for c in spec.columns)
    return sql.SQL("COPY {} ({}) FROM STDIN").format(sql.Identifier(schema, spec.name), cols)


class ProjectionWriter:
    """Writes rows and offset rows of one projection schema (statements built once).

    Attributes:
        schema: The projection schema written.
        topic: The log topic whose offsets are kept.
    """

    def __init__(self, schema: str, topic: str) -> None:
        """Build the statements.

        Args:
            schema: The projection schema written.
            topic: The log topic.
        """
        self.schema = schema
        self.topic = topic
        ident = sql.Identifier(schema, "offsets")
        self._upserts = {name: _upsert_sql(schema, spec) for name, spec in TABLES.items()}
        self._copies = {name: _copy_sql(schema, spec) for name, spec in TABLES.items()}
        self._staged = {name: _staged_upsert_sql(schema, spec) for name, spec in TABLES.items()}
        self._stage_copies = {
            name: sql.SQL("COPY {} ({}) FROM STDIN").format(
                sql.Identifier(_stage_name(spec)), sql.SQL(", ").join(sql.Identifier(c) for c in spec.columns)
            )
            for name, spec in TABLES.items()
        }
        self._stages_ready: set[tuple[int, str]] = set()
        self._ensure = sql.SQL(
            "INSERT INTO {} (projection, topic, partition, next_offset) VALUES (%s, %s, %s, 0) ON CONFLICT DO NOTHING"
        ).format(ident)
        self._lock = sql.SQL(
            "SELECT next_offset FROM {} WHERE projection = %s AND topic = %s AND partition = %s FOR UPDATE"
        ).format(ident)
        self._quarantine = sql.SQL(
            "INSERT INTO {} (partition, log_offset, event_types, refused_groups, sqlstate, error) "
            "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING"
        ).format(sql.Identifier(schema, QUARANTINE.name))
        self._set = sql.SQL(
            "UPDATE {} SET next_offset = %s, updated_at = now() WHERE projection = %s AND topic = %s AND partition = %s"
        ).format(ident)

    def ensure_offsets(self, conn: Conn, partitions: Iterable[int]) -> None:
        """Create the missing offset rows (next offset 0) of some partitions.

        Args:
            conn: An autocommit connection.
            partitions: The log partitions.
        """
        with conn.transaction(), conn.cursor() as cur:
            cur.executemany(self._ensure, [(PROJECTION_NAME, self.topic, p) for p in partitions])

    def lock_offset(self, conn: Conn, partition: int) -> int:
        """Lock a partition's offset row (``FOR UPDATE``) and return its next offset; inside a transaction.

        Args:
            conn: The connection, in a transaction.
            partition: The log partition.

        Returns:
            The stored next offset.

        Raises:
            LookupError: The partition has no offset row (`ensure_offsets` was not called).
        """
        row = conn.execute(self._lock, (PROJECTION_NAME, self.topic, partition)).fetchone()
        if row is None:
            raise LookupError(f"{self.schema}.offsets has no row for {self.topic}[{partition}]")
        return int(row[0])

    def set_offset(self, conn: Conn, partition: int, next_offset: int) -> None:
        """Move a partition's next offset; inside the transaction that holds its lock.

        Args:
            conn: The connection, in a transaction.
            partition: The log partition.
            next_offset: The offset after the last record applied.
        """
        conn.execute(self._set, (next_offset, PROJECTION_NAME, self.topic, partition))

    def quarantine(self, conn: Conn, record: QuarantinedRecord) -> None:
        """Record a log record whose rows were refused; inside the transaction that moves its partition's offset.

        Args:
            conn: The connection, in a transaction.
            record: The record and why.
        """
        conn.execute(
            self._quarantine,
            (
                record.partition,
                record.log_offset,
                record.event_types,
                ",".join(record.refused_groups),
                record.sqlstate,
                record.error,
            ),
        )

    def _stage(self, conn: Conn, spec: TableSpec) -> None:
        """Create the connection's staging table of a table once (temporary, emptied at every commit)."""
        key = (id(conn), spec.name)
        if key in self._stages_ready:
            return
        conn.execute(
            sql.SQL(
                "CREATE TEMPORARY TABLE IF NOT EXISTS {} (LIKE {} INCLUDING DEFAULTS) ON COMMIT DELETE ROWS"
            ).format(sql.Identifier(_stage_name(spec)), sql.Identifier(self.schema, spec.name))
        )
        self._stages_ready.add(key)

    def write_rows(self, conn: Conn, rows: RowSet) -> int:
        """Write a chunk's rows in a few round trips.

        Append-only tables go through ``COPY``; upserts through ``executemany``, or for many rows through ``COPY``
        into a temporary staging table and one ``INSERT ... SELECT ... ON CONFLICT``.

        Args:
            conn: The connection, in a transaction.
            rows: The merged rows of the chunk.

        Returns:
            How many rows were sent.

        Raises:
            psycopg.errors.UniqueViolation: An append-only row already exists: a batch was applied twice.
        """
        sent = 0
        with conn.cursor() as cur:
            for name, spec in TABLES.items():
                table_rows = rows.tables[name]
                if not table_rows:
                    continue
                sent += len(table_rows)
                if spec.mode is TableMode.APPEND:
                    with cur.copy(self._copies[name]) as copy:
                        for row in table_rows.values():
                            copy.write_row(row)
                elif len(table_rows) >= STAGE_MIN_ROWS:
                    self._stage(conn, spec)
                    with cur.copy(self._stage_copies[name]) as copy:
                        for row in table_rows.values():
                            copy.write_row(row)
                    cur.execute(self._staged[name])
                else:
                    cur.executemany(self._upserts[name], list(table_rows.values()))
        return sent

    def notify(self, conn: Conn, channel: str, payload: str) -> None:
        """Queue a ``NOTIFY`` delivered when the transaction commits (read-your-writes waiters listen).

        Args:
            conn: The connection, in a transaction.
            channel: The channel.
            payload: The payload.
        """
        conn.execute("SELECT pg_notify(%s, %s)", (channel, payload))


def read_offsets(conn: Conn, schema: str, topic: str) -> dict[int, int]:
    """Return the stored next offset per partition of a projection schema.

    Args:
        conn: A connection.
        schema: The projection schema.
        topic: The log topic.

    Returns:
        Partition → next offset (partitions without a row are absent).
    """
    rows = conn.execute(
        sql.SQL("SELECT partition, next_offset FROM {} WHERE projection = %s AND topic = %s").format(
            sql.Identifier(schema, "offsets")
        ),
        (PROJECTION_NAME, topic),
    ).fetchall()
    return {int(p): int(o) for p, o in rows}


def read_quarantine(conn: Conn, schema: str) -> list[QuarantinedRecord]:
    """Return a projection schema's quarantined records, by partition and offset.

    Args:
        conn: A connection.
        schema: The projection schema.

    Returns:
        The records.
    """
    rows = conn.execute(
        sql.SQL(
            "SELECT partition, log_offset, event_types, refused_groups, sqlstate, error FROM {} "
            "ORDER BY partition, log_offset"
        ).format(sql.Identifier(schema, QUARANTINE.name))
    ).fetchall()
    return [
        QuarantinedRecord(int(p), int(o), str(t), tuple(str(g).split(",")), None if st is None else str(st), str(e))
        for p, o, t, g, st, e in rows
    ]


def read_table(conn: Conn, schema: str, spec: TableSpec) -> Mapping[tuple[Any, ...], tuple[Any, ...]]:
    """Read a whole projection table, keyed like a `RowSet`.

    Args:
        conn: A connection.
        schema: The projection schema.
        spec: The table.

    Returns:
        Primary key → row (columns in `TableSpec.columns` order).
    """
    cols = sql.SQL(", ").join(sql.Identifier(c) for c in spec.columns)
    rows = conn.execute(sql.SQL("SELECT {} FROM {}").format(cols, sql.Identifier(schema, spec.name))).fetchall()
    return {spec.key_of(row): tuple(row) for row in rows}
