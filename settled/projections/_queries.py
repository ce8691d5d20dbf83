"""Reading the projection, with read-your-writes (DESIGN.md §4, §6; issue 7 items 4-5).

Every query takes ``after=<receipt>`` (a `settled.schemas.Receipt`, as ``Client.submit`` returns it) and first waits,
up to ``timeout_s``, until the projection holds that receipt's request: the ``receipts`` row of its request id, which
the projector writes in the same transaction as the submission's row (for an admitted or duplicate submission) —
so a client reads its own write.

Waiting is cheap for many threads: one listener connection per reader listens (``LISTEN``) on the projection's channel
(the live projector sends ``NOTIFY`` with every commit) and, on each notification (and at least every
``recheck_s``), asks once for all the request ids being waited on; each waiter wakes when its id is there.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Iterable
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool

from settled._errors import ErrorCategory, SettledError
from settled.projections._schema import ProjectionNames
from settled.schemas import Receipt

__all__ = ["ProjectionReader", "ReadYourWritesTimeout"]

_log = logging.getLogger("settled.projections")

Row = dict[str, Any]


class ReadYourWritesTimeout(SettledError, TimeoutError):
    """The projection did not hold a receipt's request within the timeout.

    Attributes:
        request_id: The receipt's request (submission or command) id.
        conversation_id: Its conversation.
        timeout_s: How long was waited, in seconds.
    """

    category = ErrorCategory.PENDING

    def __init__(self, request_id: str, conversation_id: str, timeout_s: float) -> None:
        super().__init__(
            f"the projection does not hold request {request_id!r} of conversation {conversation_id!r} after "
            f"{timeout_s} s: is `settled projections run` running and caught up?"
        )
        self.request_id = request_id
        self.conversation_id = conversation_id
        self.timeout_s = timeout_s


class _Waiters:
    """Request ids being waited on, checked in one query per notification."""

    def __init__(self, reader: ProjectionReader) -> None:
        self.reader = reader
        self.lock = threading.Lock()
        self.pending: dict[str, list[threading.Event]] = {}
        self.thread: threading.Thread | None = None
        self.stop = threading.Event()

    def wait(self, request_id: str, timeout_s: float) -> bool:
        event = threading.Event()
        with self.lock:
            self.pending.setdefault(request_id, []).append(event)
            if self.thread is None:
                self.thread = threading.Thread(target=self._listen, name="settled-projection-listener", daemon=True)
                self.thread.start()
        try:
            if request_id in self.reader.present([request_id]):  # committed between the caller's check and now
                return True
            return event.wait(timeout_s)
        finally:
            with self.lock:
                events = self.pending.get(request_id, [])
                if event in events:
                    events.remove(event)
                if not events:
                    self.pending.pop(request_id, None)

    def _listen(self) -> None:
        while not self.stop.is_set():
            try:
                with psycopg.connect(self.reader.dsn, autocommit=True) as conn:
                    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.reader.names.channel)))
                    while not self.stop.is_set():
                        self._check()
                        for _ in conn.notifies(timeout=self.reader.recheck_s, stop_after=1):
                            pass
            except psycopg.OperationalError as exc:
                # Postgres restarted or went away: waiters keep waiting (each has its own timeout); reconnect.
                _log.warning("projection listener reconnecting", extra={"error": str(exc)})
                time.sleep(0.2)

    def _check(self) -> None:
        with self.lock:
            ids = list(self.pending)
        if not ids:
            return
        present = self.reader.present(ids)
        with self.lock:
            for request_id in present:
                for event in self.pending.get(request_id, []):
                    event.set()


class ProjectionReader:
    """Queries over the live projection (a pooled, thread-safe reader).

    Attributes:
        dsn: The Postgres connection string.
        names: The projection's schema names (queries use the stable one).
        recheck_s: Longest interval between two checks of the waited-on requests, in seconds.
    """

    def __init__(
        self,
        dsn: str,
        names: ProjectionNames,
        *,
        pool_size: int = 4,
        recheck_s: float = 0.5,
        connect_timeout_s: float = 30.0,
    ) -> None:
        """Create the reader; connections open lazily.

        Args:
            dsn: The Postgres connection string.
            names: The projection's schema names.
            pool_size: Most pooled query connections.
            recheck_s: Longest interval between two checks of the waited-on requests, in seconds.
            connect_timeout_s: Longest wait for a connection, in seconds: a query that cannot get one in time (the
                server is down or unreachable) raises ``psycopg_pool.PoolTimeout``.

        Raises:
            ValueError: ``pool_size``, ``recheck_s`` or ``connect_timeout_s`` is not positive.
        """
        if pool_size < 1:
            raise ValueError(f"pool_size must be at least 1, got {pool_size}")
        if recheck_s <= 0:
            raise ValueError(f"recheck_s must be positive, got {recheck_s}")
        if connect_timeout_s <= 0:
            raise ValueError(f"connect_timeout_s must be positive, got {connect_timeout_s}")
        self.dsn = dsn
        self.names = names
        self.recheck_s = recheck_s
        self._pool = ConnectionPool(
            dsn,
            min_size=1,
            max_size=pool_size,
            open=False,
            timeout=connect_timeout_s,
            # libpq's connect_timeout is whole seconds, at least 2 (a smaller value is raised to 2).
            kwargs={
                "autocommit": True,
                "row_factory": dict_row,
                "connect_timeout": max(2, math.ceil(connect_timeout_s)),
            },
        )
        self._opened = False
        self._open_lock = threading.Lock()
        self._waiters = _Waiters(self)

    def close(self) -> None:
        """Close the pool and stop the listener."""
        self._waiters.stop.set()
        if self._opened:
            self._pool.close()

    def __enter__(self) -> ProjectionReader:
        """Return the reader (closed on exit)."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Close the reader."""
        self.close()

    def _query(self, query: sql.Composed, params: tuple[Any, ...] = ()) -> list[Row]:
        with self._open_lock:
            if not self._opened:
                self._pool.open()
                self._opened = True
        with self._pool.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            return list(cur.execute(query, params).fetchall())

    def _t(self, table: str) -> sql.Identifier:
        return sql.Identifier(self.names.live, table)

    # -- read-your-writes --------------------------------------------------------------------------------------------

    def present(self, request_ids: Iterable[str]) -> set[str]:
        """Return which request ids the projection holds (their receipts are projected).

        Args:
            request_ids: Submission or command ids.

        Returns:
            The ones present.
        """
        ids = list(request_ids)
        rows = self._query(
            sql.SQL("SELECT request_id FROM {} WHERE request_id = ANY(%s)").format(self._t("receipts")), (ids,)
        )
        return {str(r["request_id"]) for r in rows}

    def wait_for(self, receipt: Receipt, timeout_s: float = 10.0) -> None:
        """Wait until the projection holds a receipt's request (read-your-writes, DESIGN.md §4).

        Args:
            receipt: The receipt (``request_id`` and ``conversation_id`` are used).
            timeout_s: Longest wait, in seconds.

        Raises:
            ReadYourWritesTimeout: It did not within ``timeout_s``.
            ValueError: ``timeout_s`` is negative.
        """
        if timeout_s < 0:
            raise ValueError(f"timeout_s must not be negative, got {timeout_s}")
        if not self._waiters.wait(receipt.request_id, timeout_s):
            raise ReadYourWritesTimeout(receipt.request_id, receipt.conversation_id, timeout_s)

    def _after(self, after: Receipt | None, timeout_s: float) -> None:
        if after is not None:
            self.wait_for(after, timeout_s)

    # -- queries -----------------------------------------------------------------------------------------------------

    def submission(self, submission_id: str, *, after: Receipt | None = None, timeout_s: float = 10.0) -> Row | None:
        """Return a submission's ledger row.

        Args:
            submission_id: The submission.
            after: Wait first until the projection holds this receipt's request.
            timeout_s: Bound on that wait, in seconds.

        Returns:
            The ``submissions`` row, or None when not projected.

        Raises:
            ReadYourWritesTimeout: ``after`` was not projected in time.
        """
        self._after(after, timeout_s)
        rows = self._query(
            sql.SQL("SELECT * FROM {} WHERE submission_id = %s").format(self._t("submissions")), (submission_id,)
        )
        return rows[0] if rows else None

    def receipt(self, request_id: str, *, after: Receipt | None = None, timeout_s: float = 10.0) -> Row | None:
        """Return a request's projected receipt (admitted, duplicate, rejected or applied).

        Args:
            request_id: The submission or command id.
            after: Wait first until the projection holds this receipt's request.
            timeout_s: Bound on that wait, in seconds.

        Returns:
            The ``receipts`` row, or None.

        Raises:
            ReadYourWritesTimeout: ``after`` was not projected in time.
        """
        self._after(after, timeout_s)
        rows = self._query(sql.SQL("SELECT * FROM {} WHERE request_id = %s").format(self._t("receipts")), (request_id,))
        return rows[0] if rows else None

    def runs(
        self,
        *,
        incomplete: bool = False,
        conversation_id: str | None = None,
        limit: int = 100,
        after: Receipt | None = None,
        timeout_s: float = 10.0,
    ) -> list[Row]:
        """List runs (one per submission), newest admissions first.

        Args:
            incomplete: Only runs not settled yet (queued, running, waiting, recovery, terminalizing, unknown).
            conversation_id: Only this conversation's.
            limit: Most rows returned.
            after: Wait first until the projection holds this receipt's request.
            timeout_s: Bound on that wait, in seconds.

        Returns:
            ``runs`` view rows.

        Raises:
            ReadYourWritesTimeout: ``after`` was not projected in time.
            ValueError: ``limit`` is not positive.
        """
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        self._after(after, timeout_s)
        where = [sql.SQL("TRUE")]
        params: list[Any] = []
        if incomplete:
            where.append(sql.SQL("state NOT IN ('completed', 'failed', 'aborted')"))
        if conversation_id is not None:
            where.append(sql.SQL("conversation_id = %s"))
            params.append(conversation_id)
        params.append(limit)
        query = sql.SQL("SELECT * FROM {} WHERE {} ORDER BY admitted_at DESC, submission_id LIMIT %s").format(
            self._t("runs"), sql.SQL(" AND ").join(where)
        )
        return self._query(query, tuple(params))

    def run(self, submission_id: str, *, after: Receipt | None = None, timeout_s: float = 10.0) -> Row | None:
        """Return one run with its attempts and tool calls.

        Args:
            submission_id: The submission.
            after: Wait first until the projection holds this receipt's request.
            timeout_s: Bound on that wait, in seconds.

        Returns:
            The ``runs`` row plus ``attempts`` and ``tool_calls`` lists, or None.

        Raises:
            ReadYourWritesTimeout: ``after`` was not projected in time.
        """
        self._after(after, timeout_s)
        rows = self._query(
            sql.SQL("SELECT * FROM {} WHERE submission_id = %s").format(self._t("runs")), (submission_id,)
        )
        if not rows:
            return None
        run = rows[0]
        run["attempts"] = self._query(
            sql.SQL("SELECT * FROM {} WHERE submission_id = %s ORDER BY attempt").format(self._t("attempts")),
            (submission_id,),
        )
        run["tool_calls"] = self._query(
            sql.SQL("SELECT * FROM {} WHERE submission_id = %s ORDER BY prepared_at NULLS LAST, call_id").format(
                self._t("tool_calls")
            ),
            (submission_id,),
        )
        return run

    def unknown_obligations(self, *, after: Receipt | None = None, timeout_s: float = 10.0) -> list[Row]:
        """List the calls in doubt an operator must resolve, oldest first (DUR-009).

        Args:
            after: Wait first until the projection holds this receipt's request.
            timeout_s: Bound on that wait, in seconds.

        Returns:
            ``unknown_obligations`` view rows (with ``age``).

        Raises:
            ReadYourWritesTimeout: ``after`` was not projected in time.
        """
        self._after(after, timeout_s)
        return self._query(
            sql.SQL("SELECT * FROM {} ORDER BY unknown_since, call_id").format(self._t("unknown_obligations"))
        )

    def conversation(
        self, conversation_id: str, *, after: Receipt | None = None, timeout_s: float = 10.0
    ) -> Row | None:
        """Return a conversation's run state and its transcript in event order.

        Args:
            conversation_id: The conversation.
            after: Wait first until the projection holds this receipt's request.
            timeout_s: Bound on that wait, in seconds.

        Returns:
            The ``conversations`` row plus a ``transcript`` list, or None when not projected.

        Raises:
            ReadYourWritesTimeout: ``after`` was not projected in time.
        """
        self._after(after, timeout_s)
        rows = self._query(
            sql.SQL("SELECT * FROM {} WHERE conversation_id = %s").format(self._t("conversations")), (conversation_id,)
        )
        if not rows:
            return None
        conv = rows[0]
        conv["transcript"] = self._query(
            sql.SQL("SELECT * FROM {} WHERE conversation_id = %s ORDER BY event_seq").format(self._t("transcript")),
            (conversation_id,),
        )
        return conv
