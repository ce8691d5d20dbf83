"""Projection schemas: names, versioned SQL migrations, the layout check (docs/design.md §6; issue 7 items 2-3).

One Postgres schema holds one projection version: its tables, its views and its offset rows. Readers use the stable
name (``<base>``, `ProjectionNames.live`); a rebuild fills ``<base>__next`` and then swaps the two in one
transaction (``ALTER SCHEMA ... RENAME``), keeping the old one as ``<base>__retired``; `settled projections check`
builds a scratch copy in ``<base>__check``.

Migrations are plain SQL files shipped as package data (``settled/projections/sql/NNNN_name.sql``), applied in
order inside one transaction with ``search_path`` set to the target schema, and recorded in its
``schema_migrations`` table.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources

import psycopg
from psycopg import sql

from settled._errors import ErrorCategory, SettledError
from settled.projections._tables import QUARANTINE, TABLES

__all__ = [
    "LAYOUT_VERSION",
    "PROJECTION_NAME",
    "Migration",
    "ProjectionLayoutError",
    "ProjectionNames",
    "check_layout",
    "default_schema",
    "migrate",
    "migrations",
    "read_meta",
    "schema_exists",
]

PROJECTION_NAME = "ledger"
"""The ``projection`` column of the offset rows."""

_MIGRATION_RE = re.compile(r"(?P<version>[0-9]{4})_(?P<name>[a-z0-9_]+)\.sql")
_SCHEMA_RE = re.compile(r"[a-z_][a-z0-9_]{0,47}")


class ProjectionLayoutError(SettledError, RuntimeError):
    """A projection schema's tables do not match the layout this release writes (`settled.projections.TABLES`)."""

    category = ErrorCategory.CONFLICT


@dataclass(frozen=True)
class Migration:
    """One SQL migration file.

    Attributes:
        version: Its number (the file name's ``NNNN``).
        name: The rest of the file name.
        text: The SQL.
    """

    version: int
    name: str
    text: str


def migrations() -> list[Migration]:
    """Return the shipped migrations in version order.

    Returns:
        Every ``settled/projections/sql/NNNN_name.sql``.

    Raises:
        ValueError: A file in the folder is not named ``NNNN_name.sql``, or two share a version.
    """
    found: dict[int, Migration] = {}
    for entry in resources.files("settled.projections").joinpath("sql").iterdir():
        if not entry.name.endswith(".sql"):
            continue
        match = _MIGRATION_RE.fullmatch(entry.name)
        if match is None:
            raise ValueError(f"migration file {entry.name!r} is not named NNNN_name.sql")
        version = int(match["version"])
        if version in found:
            raise ValueError(f"migrations {found[version].name!r} and {entry.name!r} share version {version}")
        found[version] = Migration(version, match["name"], entry.read_text(encoding="utf-8"))
    return [found[v] for v in sorted(found)]


LAYOUT_VERSION = 9
"""The highest migration this release ships; a schema at another layout is refused (`check_layout`)."""


def default_schema(namespace: str) -> str:
    """Return the default projection schema of a namespace (its name with every other character made ``_``).

    Args:
        namespace: The settled namespace.

    Returns:
        A valid lower-case schema name, e.g. ``"settled"``.
    """
    name = re.sub(r"[^a-z0-9_]", "_", namespace.lower())[:40] or "settled"
    return name if not name[0].isdigit() else f"s_{name}"[:40]


@dataclass(frozen=True)
class ProjectionNames:
    """The schema names of one projection.

    Attributes:
        base: The stable name readers use (``live``).
    """

    base: str

    def __post_init__(self) -> None:
        """Check the name.

        Raises:
            ValueError: The base name is not lower-case letters, digits and ``_`` (at most 48, not starting with a
                digit), so that its derived names stay within Postgres's 63-byte identifiers.
        """
        if _SCHEMA_RE.fullmatch(self.base) is None:
            raise ValueError(
                f"projection schema {self.base!r} must be lower-case letters, digits and _ (at most 48, not "
                "starting with a digit)"
            )

    @property
    def live(self) -> str:
        """The live version (the stable name)."""
        return self.base

    @property
    def building(self) -> str:
        """Where a rebuild replays the log."""
        return f"{self.base}__next"

    @property
    def retired(self) -> str:
        """The version a rebuild replaced, kept for inspection."""
        return f"{self.base}__retired"

    @property
    def scratch(self) -> str:
        """Where `settled projections check` rebuilds for comparison."""
        return f"{self.base}__check"

    @property
    def channel(self) -> str:
        """The ``NOTIFY`` channel the live projector signals each commit on (read-your-writes waiters listen)."""
        return f"settled_projection.{self.base}"

    def lock_key(self, schema: str, topic: str) -> str:
        """Return the text hashed into the advisory lock of one writer per (schema, topic, partition).

        Args:
            schema: The schema written.
            topic: The log topic.

        Returns:
            ``settled.projector:<schema>:<topic>``.
        """
        return f"settled.projector:{schema}:{topic}"


def schema_exists(conn: psycopg.Connection[tuple[object, ...]], schema: str) -> bool:
    """Tell whether a schema exists.

    Args:
        conn: A connection.
        schema: The schema name.

    Returns:
        True when it exists.
    """
    row = conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone()
    return row is not None


def migrate(conn: psycopg.Connection[tuple[object, ...]], schema: str, *, generation: int | None = None) -> list[int]:
    """Create the schema if needed and apply the migrations it lacks, in one transaction.

    Concurrent callers serialise on a transaction-level advisory lock, so two projectors starting at once apply each
    migration once.

    Args:
        conn: An autocommit connection (the transaction is opened here).
        schema: The projection schema.
        generation: The ``generation`` meta value to record when the schema has none (default 1).

    Returns:
        The versions applied now (empty when the schema was up to date).
    """
    ident = sql.Identifier(schema)
    applied_now: list[int] = []
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"settled.projections.migrate:{schema}",))
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(ident))
        conn.execute(
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {}.schema_migrations (version integer PRIMARY KEY, name text NOT NULL, "
                "applied_at timestamptz NOT NULL DEFAULT now())"
            ).format(ident)
        )
        done = {
            int(str(row[0]))
            for row in conn.execute(sql.SQL("SELECT version FROM {}.schema_migrations").format(ident)).fetchall()
        }
        for migration in migrations():
            if migration.version in done:
                continue
            conn.execute(sql.SQL("SET LOCAL search_path TO {}").format(ident))
            conn.execute(migration.text.encode())
            conn.execute(
                sql.SQL("INSERT INTO {}.schema_migrations (version, name) VALUES (%s, %s)").format(ident),
                (migration.version, migration.name),
            )
            applied_now.append(migration.version)
        conn.execute("RESET search_path")
        now = datetime.now(UTC).isoformat()
        for key, value in (
            ("layout", str(max([m.version for m in migrations()], default=0))),
            ("projection", PROJECTION_NAME),
            ("generation", str(generation if generation is not None else 1)),
            ("created_at", now),
        ):
            conn.execute(
                sql.SQL(
                    "INSERT INTO {}.meta (key, value) VALUES (%s, %s) ON CONFLICT (key) DO "
                    + ("UPDATE SET value = EXCLUDED.value" if key == "layout" else "NOTHING")
                ).format(ident),
                (key, value),
            )
    return applied_now


def read_meta(conn: psycopg.Connection[tuple[object, ...]], schema: str) -> dict[str, str]:
    """Return a projection schema's ``meta`` table.

    Args:
        conn: A connection.
        schema: The projection schema.

    Returns:
        Key → value (``layout``, ``projection``, ``generation``, ``created_at``).
    """
    rows = conn.execute(sql.SQL("SELECT key, value FROM {}.meta").format(sql.Identifier(schema))).fetchall()
    return {str(k): str(v) for k, v in rows}


def check_layout(conn: psycopg.Connection[tuple[object, ...]], schema: str) -> None:
    """Check that a projection schema has this release's layout and exactly the columns it writes.

    Args:
        conn: A connection.
        schema: The projection schema.

    Raises:
        ProjectionLayoutError: The schema is at another layout version, or a table's columns differ (named).
    """
    if not schema_exists(conn, schema):
        raise ProjectionLayoutError(f"projection schema {schema!r} does not exist")
    meta = read_meta(conn, schema)
    if meta.get("layout") != str(LAYOUT_VERSION):
        raise ProjectionLayoutError(
            f"projection schema {schema!r} is at layout {meta.get('layout')!r}; this release writes layout "
            f"{LAYOUT_VERSION}: rebuild it (`settled projections rebuild`) or run the matching release"
        )
    rows = conn.execute(
        "SELECT table_name, column_name FROM information_schema.columns WHERE table_schema = %s", (schema,)
    ).fetchall()
    columns: dict[str, set[str]] = {}
    for table, column in rows:
        columns.setdefault(str(table), set()).add(str(column))
    for spec in (*TABLES.values(), QUARANTINE):
        have = columns.get(spec.name, set())
        if have != set(spec.columns):
            raise ProjectionLayoutError(
                f"table {schema}.{spec.name}: columns {sorted(have)} differ from the layout's {sorted(spec.columns)}"
                f" (missing {sorted(set(spec.columns) - have)}, extra {sorted(have - set(spec.columns))})"
            )
