"""Bearer tokens → principal and scopes, stored as SHA-256 hashes in a PostgreSQL table of their own (issue 20 item 2).

The table is **not a projection**: nothing in the log describes it, a rebuild never touches it (it lives in its own
schema, ``<projection base>__tokens`` by default), and it is the one piece of settled state kept only in PostgreSQL
(docs/architecture.md, "The HTTP API"). A token is shown once, at creation: ``stl_<token id>_<secret>``; the table
keeps its id, its SHA-256 digest, the principal, the scopes, and when it was created and revoked.
"""

from __future__ import annotations

import hashlib
import secrets
import threading
import uuid
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool

from settled import protocol
from settled._errors import BadInputError, ErrorCategory, SettledError

__all__ = ["Principal", "Scope", "TokenInfo", "TokenNotFoundError", "TokenStore", "default_tokens_schema"]

_TOKEN_PREFIX = "stl_"


class Scope(StrEnum):
    """What a token may do.

    Attributes:
        SUBMIT: Submit turns and abort submissions.
        READ: Read submissions, settlements, runs, transcripts, approvals and Unknowns.
        APPROVE: Approve and deny approvals, send signals.
        RESOLVE: Resolve Unknown tool calls.
        ADMIN: Everything (``admin``).
    """

    SUBMIT = "submit"
    READ = "read"
    APPROVE = "approve"
    RESOLVE = "resolve"
    ADMIN = "admin"


@dataclass(frozen=True)
class Principal:
    """Who a request comes from: the token's principal and scopes.

    Attributes:
        name: The principal (recorded on everything the API publishes for it).
        scopes: What it may do.
        token_id: The token's id.
    """

    name: str
    scopes: frozenset[Scope]
    token_id: str

    def allows(self, scope: Scope) -> bool:
        """Whether the principal has ``scope`` (``admin`` has every scope).

        Args:
            scope: The scope.

        Returns:
            True when allowed.
        """
        return scope in self.scopes or Scope.ADMIN in self.scopes


@dataclass(frozen=True)
class TokenInfo:
    """A token as ``settled tokens list`` shows it (never its secret nor its hash).

    Attributes:
        token_id: The id.
        principal: The principal.
        scopes: The scopes, sorted.
        created_at: When it was created.
        revoked_at: When it was revoked, or None.
    """

    token_id: str
    principal: str
    scopes: tuple[str, ...]
    created_at: datetime
    revoked_at: datetime | None


class TokenNotFoundError(SettledError):
    """No token has that id."""

    category = ErrorCategory.NOT_FOUND


def default_tokens_schema(projection_base: str) -> str:
    """The tokens table's schema beside a projection.

    Args:
        projection_base: The projection's base schema name (at most 48 characters).

    Returns:
        ``<projection_base>__tokens``.
    """
    return f"{projection_base}__tokens"


def token_digest(token: str) -> str:
    """The SHA-256 hex digest a token is stored under.

    Args:
        token: The bearer token.

    Returns:
        64 lowercase hex digits.
    """
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def parse_scopes(names: list[str] | tuple[str, ...]) -> frozenset[Scope]:
    """Scopes from their names.

    Args:
        names: Scope names.

    Returns:
        The scopes.

    Raises:
        BadInputError: A name is not a scope (named, with the choices), or none is given.
    """
    if not names:
        raise BadInputError(f"scopes must name at least one of {', '.join(s.value for s in Scope)}, got none")
    out: set[Scope] = set()
    for name in names:
        try:
            out.add(Scope(name))
        except ValueError:
            raise BadInputError(f"scope must be one of {', '.join(s.value for s in Scope)}, got {name!r}") from None
    return frozenset(out)


class TokenStore:
    """The tokens table (thread-safe; `authenticate` uses a small connection pool, the rest one connection per call).

    Attributes:
        dsn: The PostgreSQL connection string.
        schema: The schema holding the ``tokens`` table.
    """

    def __init__(self, dsn: str, schema: str) -> None:
        """Name the table; nothing connects until the first call.

        Args:
            dsn: The PostgreSQL connection string.
            schema: The schema holding the ``tokens`` table (created by `ensure`).
        """
        self.dsn = dsn
        self.schema = schema
        self._pool: ConnectionPool[psycopg.Connection[dict[str, Any]]] | None = None
        self._pool_lock = threading.Lock()

    def close(self) -> None:
        """Close the pool `authenticate` opened, if any."""
        with self._pool_lock:
            if self._pool is not None:
                self._pool.close()
                self._pool = None

    def _pooled(self) -> ConnectionPool[psycopg.Connection[dict[str, Any]]]:
        with self._pool_lock:
            if self._pool is None:
                self._pool = ConnectionPool(
                    self.dsn,
                    min_size=1,
                    max_size=8,
                    timeout=10.0,
                    kwargs={"autocommit": True, "row_factory": dict_row, "connect_timeout": 5},
                    connection_class=psycopg.Connection[dict[str, Any]],
                    open=True,
                )
            return self._pool

    def _connect(self) -> psycopg.Connection[dict[str, Any]]:
        return psycopg.connect(self.dsn, autocommit=True, row_factory=dict_row, connect_timeout=5)

    def _table(self) -> sql.Identifier:
        return sql.Identifier(self.schema, "tokens")

    def ensure(self) -> None:
        """Create the schema and the table when missing."""
        with self._connect() as conn:
            conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(self.schema)))
            conn.execute(
                sql.SQL(
                    "CREATE TABLE IF NOT EXISTS {} ("
                    " token_id text PRIMARY KEY,"
                    " token_sha256 text NOT NULL UNIQUE,"
                    " principal text NOT NULL,"
                    " scopes text[] NOT NULL,"
                    " created_at timestamptz NOT NULL DEFAULT now(),"
                    " revoked_at timestamptz)"
                ).format(self._table())
            )

    def create(self, principal: str, scopes: frozenset[Scope]) -> tuple[str, str]:
        """Create a token.

        Args:
            principal: Its principal (an id of settled's input contract).
            scopes: Its scopes.

        Returns:
            ``(token_id, token)``: the token is shown only here; the table keeps its SHA-256 digest.

        Raises:
            BadInputError: The principal breaks the input contract, or no scope is given.
        """
        violation = protocol.check_id("principal", principal)
        if violation is not None:
            raise BadInputError(violation.detail)
        if not scopes:
            raise BadInputError("scopes must name at least one scope, got none")
        self.ensure()
        token_id = uuid.uuid4().hex[:16]
        token = f"{_TOKEN_PREFIX}{token_id}_{secrets.token_urlsafe(32)}"
        with self._connect() as conn:
            conn.execute(
                sql.SQL("INSERT INTO {} (token_id, token_sha256, principal, scopes) VALUES (%s, %s, %s, %s)").format(
                    self._table()
                ),
                (token_id, token_digest(token), principal, sorted(s.value for s in scopes)),
            )
        return token_id, token

    def list(self) -> list[TokenInfo]:
        """Every token, oldest first (revoked ones included).

        Returns:
            The tokens, without secrets or digests.
        """
        self.ensure()
        with self._connect() as conn:
            rows = conn.execute(
                sql.SQL(
                    "SELECT token_id, principal, scopes, created_at, revoked_at FROM {} ORDER BY created_at, token_id"
                ).format(self._table())
            ).fetchall()
        return [
            TokenInfo(r["token_id"], r["principal"], tuple(r["scopes"]), r["created_at"], r["revoked_at"]) for r in rows
        ]

    def revoke(self, token_id: str) -> None:
        """Revoke a token (idempotent: revoking a revoked token keeps its first revocation time).

        Args:
            token_id: The token's id.

        Raises:
            TokenNotFoundError: No token has that id.
        """
        self.ensure()
        with self._connect() as conn:
            found = conn.execute(
                sql.SQL("UPDATE {} SET revoked_at = coalesce(revoked_at, now()) WHERE token_id = %s").format(
                    self._table()
                ),
                (token_id,),
            ).rowcount
        if not found:
            raise TokenNotFoundError(f"token_id {token_id!r}: no such token")

    def authenticate(self, token: str) -> Principal | None:
        """The principal of a live (not revoked) token.

        Args:
            token: The bearer token as sent.

        Returns:
            Its principal, or None when no live token has that digest.
        """
        return self.authenticate_digest(token_digest(token))

    def authenticate_digest(self, token_sha256: str) -> Principal | None:
        """The principal of a live (not revoked) token, by its digest (the operator page's sessions keep only that).

        Args:
            token_sha256: The token's `token_digest`.

        Returns:
            Its principal, or None when no live token has that digest.
        """
        with self._pooled().connection() as conn:
            row = conn.execute(
                sql.SQL(
                    "SELECT token_id, principal, scopes FROM {} WHERE token_sha256 = %s AND revoked_at IS NULL"
                ).format(self._table()),
                (token_sha256,),
            ).fetchone()
        if row is None:
            return None
        return Principal(row["principal"], frozenset(Scope(s) for s in row["scopes"]), row["token_id"])
