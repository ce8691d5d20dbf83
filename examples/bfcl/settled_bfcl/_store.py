"""The tool server's durable store: worlds, owner epochs and the execution ledger in one SQLite file.

Every call that runs a backend method is one SQLite transaction (``BEGIN IMMEDIATE`` … ``COMMIT``) that writes the
conversation's new world (pickled), its highest owner epoch, the ledger row of the idempotency key and an
append-only execution row holding the world as it was after that call. The server answers only after the commit,
so a tool server killed with SIGKILL and restarted has exactly the worlds and ledger its clients were told about
(the research doc's crash point 9). The journal is WAL with ``synchronous=FULL``.

Other processes (the verdict, the operator resolving Unknowns) may open the same file read-only while the server
runs: :meth:`ToolServerStore.open_readonly`.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from settled_bfcl._backends import World
from settled_bfcl._errors import BfclError
from settled_bfcl._wire import ExecutionRecord, LedgerRecord

__all__ = ["ConversationRow", "StoreError", "ToolServerStore"]

_SCHEMA_VERSION = "1"
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS conversations (
    conversation_id TEXT PRIMARY KEY,
    entry_id TEXT NOT NULL,
    spec_json TEXT NOT NULL,
    world BLOB NOT NULL,
    max_epoch INTEGER NOT NULL DEFAULT -1,
    executions INTEGER NOT NULL DEFAULT 0,
    created_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS ledger (
    conversation_id TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    call_id TEXT,
    method TEXT NOT NULL,
    class_name TEXT NOT NULL,
    arguments_json TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    output TEXT NOT NULL,
    owner_epoch INTEGER NOT NULL,
    executed_at TEXT NOT NULL,
    execution_count INTEGER NOT NULL,
    replay_count INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (conversation_id, idempotency_key)
);
CREATE TABLE IF NOT EXISTS executions (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    conversation_id TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    call_id TEXT,
    method TEXT NOT NULL,
    arguments_json TEXT NOT NULL,
    output TEXT NOT NULL,
    owner_epoch INTEGER NOT NULL,
    executed_at TEXT NOT NULL,
    world_after BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS executions_by_key ON executions (conversation_id, idempotency_key, seq);
"""
_BY_FIRST_EXECUTION = (
    " ORDER BY (SELECT MIN(e.seq) FROM executions e "
    "WHERE e.conversation_id = ledger.conversation_id AND e.idempotency_key = ledger.idempotency_key)"
)


class StoreError(BfclError):
    """The store file is unusable (wrong schema version, or a read-only store asked to write)."""


@dataclass(frozen=True, slots=True)
class ConversationRow:
    """A conversation as stored (without its world).

    Attributes:
        conversation_id: The conversation.
        entry_id: The BFCL entry its world was built from.
        spec: The creation request as JSON (entry id, classes, initial config, long-context flag).
        max_epoch: The highest owner epoch seen on a call; -1 before any.
        executions: Backend executions so far.
    """

    conversation_id: str
    entry_id: str
    spec: dict[str, Any]
    max_epoch: int
    executions: int


@dataclass(frozen=True, slots=True)
class _LedgerRow:
    call_id: str | None
    method: str
    class_name: str
    arguments_json: str
    fingerprint: str
    output: str
    owner_epoch: int
    executed_at: str
    execution_count: int
    replay_count: int


class ToolServerStore:
    """The SQLite file behind one tool server. Not thread-safe: the caller serialises access."""

    def __init__(self, connection: sqlite3.Connection, *, readonly: bool) -> None:
        """Wrap an open connection; use :meth:`open` or :meth:`open_readonly`.

        Args:
            connection: An autocommit (``isolation_level=None``) connection.
            readonly: Whether writes are refused.
        """
        self._db = connection
        self._readonly = readonly

    @classmethod
    def open(cls, path: Path) -> ToolServerStore:
        """Open (creating if needed) the store for writing.

        Args:
            path: The SQLite file.

        Returns:
            The store.

        Raises:
            StoreError: The file holds another schema version.
        """
        path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        db.execute("PRAGMA busy_timeout=10000")
        db.executescript(_SCHEMA)
        db.execute("INSERT OR IGNORE INTO meta (key, value) VALUES ('schema_version', ?)", (_SCHEMA_VERSION,))
        store = cls(db, readonly=False)
        store._check_version(path)
        return store

    @classmethod
    def open_readonly(cls, path: Path) -> ToolServerStore:
        """Open an existing store read-only (safe while the server runs).

        Args:
            path: The SQLite file.

        Returns:
            The store.

        Raises:
            StoreError: The file does not exist or holds another schema version.
        """
        if not path.exists():
            raise StoreError(f"tool-server store {path} does not exist")
        db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, isolation_level=None)
        db.execute("PRAGMA busy_timeout=10000")
        store = cls(db, readonly=True)
        store._check_version(path)
        return store

    def _check_version(self, path: Path) -> None:
        row = self._db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        if row is None or row[0] != _SCHEMA_VERSION:
            raise StoreError(f"{path}: schema version {row[0] if row else None!r}, expected {_SCHEMA_VERSION!r}")

    def close(self) -> None:
        """Close the connection."""
        self._db.close()

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        if self._readonly:
            raise StoreError("this store was opened read-only")
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    # --- conversations -------------------------------------------------------------------------------------------

    def conversation(self, conversation_id: str) -> ConversationRow | None:
        """Return a conversation's row, or None.

        Args:
            conversation_id: The conversation.

        Returns:
            The row, or None when unknown.
        """
        row = self._db.execute(
            "SELECT entry_id, spec_json, max_epoch, executions FROM conversations WHERE conversation_id = ?",
            (conversation_id,),
        ).fetchone()
        if row is None:
            return None
        return ConversationRow(conversation_id, row[0], json.loads(row[1]), row[2], row[3])

    def conversation_ids(self) -> list[str]:
        """Return every conversation id, sorted.

        Returns:
            The ids.
        """
        return [r[0] for r in self._db.execute("SELECT conversation_id FROM conversations ORDER BY conversation_id")]

    def insert_conversation(
        self, conversation_id: str, entry_id: str, spec: dict[str, Any], world: World, created_at: str
    ) -> None:
        """Store a new conversation with its initial world (committed on return).

        Args:
            conversation_id: The conversation.
            entry_id: The BFCL entry.
            spec: The creation request as JSON.
            world: The freshly built world.
            created_at: ISO-8601 UTC time.
        """
        with self._write() as db:
            db.execute(
                "INSERT INTO conversations (conversation_id, entry_id, spec_json, world, created_at) "
                "VALUES (?, ?, ?, ?, ?)",
                (conversation_id, entry_id, json.dumps(spec, sort_keys=True), world.dumps(), created_at),
            )

    def load_world(self, conversation_id: str) -> World:
        """Load a conversation's current world.

        Args:
            conversation_id: The conversation.

        Returns:
            The world as of the last committed call.

        Raises:
            KeyError: The conversation is unknown.
        """
        row = self._db.execute(
            "SELECT world FROM conversations WHERE conversation_id = ?", (conversation_id,)
        ).fetchone()
        if row is None:
            raise KeyError(f"tool-server store has no conversation {conversation_id!r}")
        return World.loads(row[0])

    def world_after(self, seq: int) -> World:
        """Load the world as it was right after one execution.

        Args:
            seq: The execution's sequence number (:attr:`ExecutionRecord.seq`).

        Returns:
            The world.

        Raises:
            KeyError: No such execution.
        """
        row = self._db.execute("SELECT world_after FROM executions WHERE seq = ?", (seq,)).fetchone()
        if row is None:
            raise KeyError(f"tool-server store has no execution {seq}")
        return World.loads(row[0])

    # --- ledger ------------------------------------------------------------------------------------------------

    def _ledger_row(self, conversation_id: str, key: str) -> _LedgerRow | None:
        row = self._db.execute(
            "SELECT call_id, method, class_name, arguments_json, fingerprint, output, owner_epoch, executed_at, "
            "execution_count, replay_count FROM ledger WHERE conversation_id = ? AND idempotency_key = ?",
            (conversation_id, key),
        ).fetchone()
        return None if row is None else _LedgerRow(*row)

    def fingerprint_and_result(self, conversation_id: str, key: str) -> tuple[str, str, str, int] | None:
        """Return what the ledger holds for a key: fingerprint, stored output, its time and the execution count.

        Args:
            conversation_id: The conversation.
            key: The idempotency key.

        Returns:
            ``(fingerprint, output, executed_at, execution_count)``, or None when the key was never executed.
        """
        row = self._ledger_row(conversation_id, key)
        if row is None:
            return None
        return row.fingerprint, row.output, row.executed_at, row.execution_count

    def record_execution(
        self,
        *,
        conversation_id: str,
        key: str,
        call_id: str | None,
        method: str,
        class_name: str,
        arguments_json: str,
        fingerprint: str,
        output: str,
        owner_epoch: int,
        executed_at: str,
        world: World,
    ) -> int:
        """Commit one execution: the new world, the epoch, the ledger row and the execution row, atomically.

        Args:
            conversation_id: The conversation.
            key: The idempotency key.
            call_id: The runtime's call id.
            method: The method that ran.
            class_name: Its backend class.
            arguments_json: The arguments as JSON.
            fingerprint: The request fingerprint (method + arguments).
            output: The output.
            owner_epoch: The caller's epoch.
            executed_at: ISO-8601 UTC time.
            world: The world after the call.

        Returns:
            The key's execution count after this one.
        """
        blob = world.dumps()
        with self._write() as db:
            db.execute(
                "UPDATE conversations SET world = ?, max_epoch = MAX(max_epoch, ?), executions = executions + 1 "
                "WHERE conversation_id = ?",
                (blob, owner_epoch, conversation_id),
            )
            db.execute(
                "INSERT INTO ledger (conversation_id, idempotency_key, call_id, method, class_name, arguments_json, "
                "fingerprint, output, owner_epoch, executed_at, execution_count) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 1) "
                "ON CONFLICT (conversation_id, idempotency_key) DO UPDATE SET execution_count = execution_count + 1",
                (
                    conversation_id,
                    key,
                    call_id,
                    method,
                    class_name,
                    arguments_json,
                    fingerprint,
                    output,
                    owner_epoch,
                    executed_at,
                ),
            )
            db.execute(
                "INSERT INTO executions (conversation_id, idempotency_key, call_id, method, arguments_json, output, "
                "owner_epoch, executed_at, world_after) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (conversation_id, key, call_id, method, arguments_json, output, owner_epoch, executed_at, blob),
            )
            count = db.execute(
                "SELECT execution_count FROM ledger WHERE conversation_id = ? AND idempotency_key = ?",
                (conversation_id, key),
            ).fetchone()[0]
        return int(count)

    def record_replay(self, conversation_id: str, key: str, owner_epoch: int) -> None:
        """Commit that a call got the stored result without running (and the epoch it carried).

        Args:
            conversation_id: The conversation.
            key: The idempotency key.
            owner_epoch: The caller's epoch.
        """
        with self._write() as db:
            db.execute(
                "UPDATE conversations SET max_epoch = MAX(max_epoch, ?) WHERE conversation_id = ?",
                (owner_epoch, conversation_id),
            )
            db.execute(
                "UPDATE ledger SET replay_count = replay_count + 1 WHERE conversation_id = ? AND idempotency_key = ?",
                (conversation_id, key),
            )

    def ledger(self, conversation_id: str, key: str | None = None) -> list[LedgerRecord]:
        """Return the ledger of a conversation, or of one key in it.

        Args:
            conversation_id: The conversation.
            key: One idempotency key, or None for all of them.

        Returns:
            The records, in order of first execution; empty when the key was never executed.
        """
        sql = (
            "SELECT idempotency_key, call_id, method, class_name, arguments_json, output, owner_epoch, executed_at, "
            "execution_count, replay_count FROM ledger WHERE conversation_id = ?"
        )
        params: tuple[str, ...] = (conversation_id,)
        if key is not None:
            sql += " AND idempotency_key = ?"
            params += (key,)
        records: list[LedgerRecord] = []
        for row in self._db.execute(sql + _BY_FIRST_EXECUTION, params).fetchall():
            executions = [
                ExecutionRecord(
                    seq=e[0],
                    call_id=e[1],
                    method=e[2],
                    arguments=json.loads(e[3]),
                    output=e[4],
                    owner_epoch=e[5],
                    executed_at=e[6],
                )
                for e in self._db.execute(
                    "SELECT seq, call_id, method, arguments_json, output, owner_epoch, executed_at FROM executions "
                    "WHERE conversation_id = ? AND idempotency_key = ? ORDER BY seq",
                    (conversation_id, row[0]),
                )
            ]
            records.append(
                LedgerRecord(
                    conversation_id=conversation_id,
                    idempotency_key=row[0],
                    call_id=row[1],
                    method=row[2],
                    class_name=row[3],
                    arguments=json.loads(row[4]),
                    output=row[5],
                    owner_epoch=row[6],
                    executed_at=row[7],
                    execution_count=row[8],
                    replay_count=row[9],
                    executions=executions,
                )
            )
        return records
