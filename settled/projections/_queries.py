"""Reading the projection, with read-your-writes (docs/design.md §4, §6; issue 7 items 4-5).

Every query takes ``after=<receipt>`` (a `settled.schemas.Receipt`, as ``Client.submit`` returns it) and first waits,
up to ``timeout_s``, until the projection holds that receipt's request: the ``receipts`` row of its conversation and
request id, which the projector writes in the same transaction as the submission's row (for an admitted or duplicate
submission) — so a client reads its own write.

Waiting is cheap for many threads: one listener connection per reader listens (``LISTEN``) on the projection's channel
(the live projector sends ``NOTIFY`` with every commit) and, on each notification (and at least every
``recheck_s``), asks once for all the request ids being waited on; each waiter wakes when its id is there.

Submission (and request) ids are unique within a conversation, not across the namespace (a partition's owner cannot
see the other partitions' ids): a query by submission id alone returns the rows of every conversation using it, and
takes ``conversation_id`` to select one.
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
from settled.protocol import FlowRunView, TranscriptEntry, flow_run_view
from settled.schemas import Receipt

__all__ = ["ProjectionReader", "ReadYourWritesTimeoutError"]

_log = logging.getLogger("settled.projections")

Row = dict[str, Any]


class ReadYourWritesTimeoutError(SettledError, TimeoutError):
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


Request = tuple[str, str]
"""A request within its conversation: (conversation id, request id)."""


class _Waiters:
    """Requests being waited on, checked in one query per notification."""

    def __init__(self, reader: ProjectionReader) -> None:
        self.reader = reader
        self.lock = threading.Lock()
        self.pending: dict[Request, list[threading.Event]] = {}
        self.thread: threading.Thread | None = None
        self.stop = threading.Event()

    def wait(self, request: Request, timeout_s: float) -> bool:
        event = threading.Event()
        with self.lock:
            self.pending.setdefault(request, []).append(event)
            if self.thread is None:
                self.thread = threading.Thread(target=self._listen, name="settled-projection-listener", daemon=True)
                self.thread.start()
        try:
            if request in self.reader.present([request]):  # committed between the caller's check and now
                return True
            return event.wait(timeout_s)
        finally:
            with self.lock:
                events = self.pending.get(request, [])
                if event in events:
                    events.remove(event)
                if not events:
                    self.pending.pop(request, None)

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

    def present(self, requests: Iterable[Request]) -> set[Request]:
        """Return which requests the projection holds (their receipts are projected).

        Args:
            requests: (conversation id, submission or command id) pairs.

        Returns:
            The ones present.
        """
        pairs = list(requests)
        rows = self._query(
            sql.SQL(
                "SELECT conversation_id, request_id FROM {} WHERE (conversation_id, request_id) IN "
                "(SELECT * FROM unnest(%s::text[], %s::text[]))"
            ).format(self._t("receipts")),
            ([c for c, _ in pairs], [r for _, r in pairs]),
        )
        return {(str(r["conversation_id"]), str(r["request_id"])) for r in rows}

    def wait_for(self, receipt: Receipt, timeout_s: float = 10.0) -> None:
        """Wait until the projection holds a receipt's request (read-your-writes, docs/design.md §4).

        Args:
            receipt: The receipt (``request_id`` and ``conversation_id`` are used).
            timeout_s: Longest wait, in seconds.

        Raises:
            ReadYourWritesTimeoutError: It did not within ``timeout_s``.
            ValueError: ``timeout_s`` is negative.
        """
        if timeout_s < 0:
            raise ValueError(f"timeout_s must not be negative, got {timeout_s}")
        if not self._waiters.wait((receipt.conversation_id, receipt.request_id), timeout_s):
            raise ReadYourWritesTimeoutError(receipt.request_id, receipt.conversation_id, timeout_s)

    def _after(self, after: Receipt | None, timeout_s: float) -> None:
        if after is not None:
            self.wait_for(after, timeout_s)

    # -- queries -----------------------------------------------------------------------------------------------------

    def _by_id(self, table: str, column: str, value: str, conversation_id: str | None) -> list[Row]:
        """Rows of a table or view with ``column = value``, of one conversation or of all, by conversation id."""
        where = sql.SQL("{} = %s").format(sql.Identifier(column))
        params: tuple[Any, ...] = (value,)
        if conversation_id is not None:
            where = sql.SQL("{} AND conversation_id = %s").format(where)
            params = (value, conversation_id)
        return self._query(
            sql.SQL("SELECT * FROM {} WHERE {} ORDER BY conversation_id").format(self._t(table), where), params
        )

    def submissions(
        self,
        submission_id: str,
        *,
        conversation_id: str | None = None,
        after: Receipt | None = None,
        timeout_s: float = 10.0,
    ) -> list[Row]:
        """Return the ledger rows of a submission id: one per conversation using it (module doc).

        Args:
            submission_id: The submission.
            conversation_id: Only this conversation's.
            after: Wait first until the projection holds this receipt's request.
            timeout_s: Bound on that wait, in seconds.

        Returns:
            The ``submissions`` rows, by conversation id (empty when not projected).

        Raises:
            ReadYourWritesTimeoutError: ``after`` was not projected in time.
        """
        self._after(after, timeout_s)
        return self._by_id("submissions", "submission_id", submission_id, conversation_id)

    def submission(
        self,
        submission_id: str,
        *,
        conversation_id: str | None = None,
        after: Receipt | None = None,
        timeout_s: float = 10.0,
    ) -> Row | None:
        """Return a submission's ledger row (the first by conversation id when several conversations use the id).

        Args:
            submission_id: The submission.
            conversation_id: Its conversation (None: any; see `submissions` for all of them).
            after: Wait first until the projection holds this receipt's request.
            timeout_s: Bound on that wait, in seconds.

        Returns:
            The ``submissions`` row, or None when not projected.

        Raises:
            ReadYourWritesTimeoutError: ``after`` was not projected in time.
        """
        rows = self.submissions(submission_id, conversation_id=conversation_id, after=after, timeout_s=timeout_s)
        return rows[0] if rows else None

    def receipts(
        self,
        request_id: str,
        *,
        conversation_id: str | None = None,
        after: Receipt | None = None,
        timeout_s: float = 10.0,
    ) -> list[Row]:
        """Return a request id's projected receipts (admitted, duplicate, rejected or applied), one per conversation.

        Args:
            request_id: The submission or command id.
            conversation_id: Only this conversation's.
            after: Wait first until the projection holds this receipt's request.
            timeout_s: Bound on that wait, in seconds.

        Returns:
            The ``receipts`` rows, by conversation id.

        Raises:
            ReadYourWritesTimeoutError: ``after`` was not projected in time.
        """
        self._after(after, timeout_s)
        return self._by_id("receipts", "request_id", request_id, conversation_id)

    def receipt(
        self,
        request_id: str,
        *,
        conversation_id: str | None = None,
        after: Receipt | None = None,
        timeout_s: float = 10.0,
    ) -> Row | None:
        """Return a request's projected receipt (the first by conversation id when several conversations use the id).

        Args:
            request_id: The submission or command id.
            conversation_id: Its conversation (None: any; see `receipts` for all of them).
            after: Wait first until the projection holds this receipt's request.
            timeout_s: Bound on that wait, in seconds.

        Returns:
            The ``receipts`` row, or None.

        Raises:
            ReadYourWritesTimeoutError: ``after`` was not projected in time.
        """
        rows = self.receipts(request_id, conversation_id=conversation_id, after=after, timeout_s=timeout_s)
        return rows[0] if rows else None

    def settlement(self, submission_id: str, *, conversation_id: str) -> Row | None:
        """Return a submission's projected settlement (its terminal outcome, reply and error), if settled.

        Args:
            submission_id: The submission.
            conversation_id: Its conversation.

        Returns:
            The ``settlements`` row, or None when not settled (or not projected yet).
        """
        rows = self._by_id("settlements", "submission_id", submission_id, conversation_id)
        return rows[0] if rows else None

    def access(self, conversation_id: str, principal: str) -> str | None:
        """Return what a principal may do with a conversation, from the ``conversation_access`` view (issue 20).

        Args:
            conversation_id: The conversation.
            principal: The principal.

        Returns:
            ``opener``, ``act`` or ``read``; ``open`` when nobody opened the conversation yet (no admitted submission
            projected: the first to submit opens it); None when another principal opened it and this one holds no
            access (never granted, or ``revoked``).
        """
        rows = self._query(
            sql.SQL(
                "SELECT principal, access FROM {} WHERE conversation_id = %s AND (principal = %s OR access = 'opener')"
            ).format(self._t("conversation_access")),
            (conversation_id, principal),
        )
        if not rows:
            return "open"
        mine = next((str(r["access"]) for r in rows if r["principal"] == principal), None)
        return None if mine is None or mine == "revoked" else mine

    def access_list(self, conversation_id: str) -> list[Row]:
        """Return who may see a conversation: its opener and every principal granted access (issue 20).

        Args:
            conversation_id: The conversation.

        Returns:
            ``conversation_access`` rows (``principal``, ``access``: opener, read or act; ``granted_by``,
            ``command_id``, ``since``), the opener first, then by principal; revoked grants left out.
        """
        return self._query(
            sql.SQL(
                "SELECT conversation_id, principal, access, granted_by, command_id, since FROM {} "
                "WHERE conversation_id = %s AND access <> 'revoked' ORDER BY access <> 'opener', principal"
            ).format(self._t("conversation_access")),
            (conversation_id,),
        )

    def runs(
        self,
        *,
        incomplete: bool = False,
        conversation_id: str | None = None,
        limit: int = 100,
        after: Receipt | None = None,
        timeout_s: float = 10.0,
        workflows: bool = False,
    ) -> list[Row]:
        """List runs (one per submission), newest admissions first.

        Args:
            incomplete: Only runs not settled yet (queued, running, waiting, recovery, terminalizing, unknown).
            conversation_id: Only this conversation's.
            limit: Most rows returned.
            workflows: Add the ``workflow_runs`` columns (issue 17 item 4): ``workflow``, ``task_id``,
                ``step_number``, ``total_steps``, ``step_name`` and ``waits_for`` (None for a run that is not a
                workflow run).
            after: Wait first until the projection holds this receipt's request.
            timeout_s: Bound on that wait, in seconds.

        Returns:
            ``runs`` view rows.

        Raises:
            ReadYourWritesTimeoutError: ``after`` was not projected in time.
            ValueError: ``limit`` is not positive.
        """
        query, params = self._run_listing(
            "runs", "admitted_at DESC, submission_id", incomplete, ("conversation_id", conversation_id), limit
        )
        self._after(after, timeout_s)
        if workflows:
            query = sql.SQL(
                "SELECT r.*, w.workflow, w.task_id, w.step_number, w.total_steps, w.step_name, w.waits_for "
                "FROM ({}) r LEFT JOIN {} w ON w.conversation_id = r.conversation_id "
                "AND w.submission_id = r.submission_id ORDER BY r.admitted_at DESC, r.submission_id"
            ).format(query, self._t("workflow_runs"))
        return self._query(query, params)

    def runs_of(
        self,
        submission_id: str,
        *,
        conversation_id: str | None = None,
        after: Receipt | None = None,
        timeout_s: float = 10.0,
    ) -> list[Row]:
        """Return the runs of a submission id with their attempts and tool calls: one per conversation using it.

        Args:
            submission_id: The submission.
            conversation_id: Only this conversation's.
            after: Wait first until the projection holds this receipt's request.
            timeout_s: Bound on that wait, in seconds.

        Returns:
            ``runs`` rows, each plus ``attempts`` and ``tool_calls`` lists, by conversation id.

        Raises:
            ReadYourWritesTimeoutError: ``after`` was not projected in time.
        """
        self._after(after, timeout_s)
        runs = self._by_id("runs", "submission_id", submission_id, conversation_id)
        for run in runs:
            key = (submission_id, run["conversation_id"])
            run["attempts"] = self._query(
                sql.SQL("SELECT * FROM {} WHERE submission_id = %s AND conversation_id = %s ORDER BY attempt").format(
                    self._t("attempts")
                ),
                key,
            )
            run["tool_calls"] = self._query(
                sql.SQL(
                    "SELECT * FROM {} WHERE submission_id = %s AND conversation_id = %s "
                    "ORDER BY prepared_at NULLS LAST, call_id"
                ).format(self._t("tool_calls")),
                key,
            )
        return runs

    def run(
        self,
        submission_id: str,
        *,
        conversation_id: str | None = None,
        after: Receipt | None = None,
        timeout_s: float = 10.0,
    ) -> Row | None:
        """Return one run with its attempts and tool calls (the first by conversation id when several use the id).

        Args:
            submission_id: The submission.
            conversation_id: Its conversation (None: any; see `runs_of` for all of them).
            after: Wait first until the projection holds this receipt's request.
            timeout_s: Bound on that wait, in seconds.

        Returns:
            The ``runs`` row plus ``attempts`` and ``tool_calls`` lists, or None.

        Raises:
            ReadYourWritesTimeoutError: ``after`` was not projected in time.
        """
        runs = self.runs_of(submission_id, conversation_id=conversation_id, after=after, timeout_s=timeout_s)
        return runs[0] if runs else None

    def unknown_obligations(self, *, after: Receipt | None = None, timeout_s: float = 10.0) -> list[Row]:
        """List the calls in doubt an operator must resolve, oldest first (DUR-009).

        Args:
            after: Wait first until the projection holds this receipt's request.
            timeout_s: Bound on that wait, in seconds.

        Returns:
            ``unknown_obligations`` view rows (with ``age``).

        Raises:
            ReadYourWritesTimeoutError: ``after`` was not projected in time.
        """
        self._after(after, timeout_s)
        return self._query(
            sql.SQL("SELECT * FROM {} ORDER BY unknown_since, call_id").format(self._t("unknown_obligations"))
        )

    def workflow_runs(
        self,
        *,
        incomplete: bool = True,
        workflow: str | None = None,
        limit: int = 100,
        after: Receipt | None = None,
        timeout_s: float = 10.0,
    ) -> list[Row]:
        """List workflow runs (issue 17 item 4), oldest admission first.

        Each row has ``workflow``, ``task_id``, ``step_number`` of ``total_steps`` and ``step_name`` (the step it is
        at), ``steps_done``, ``waits_for`` (``pause``, ``approval``, ``retry``, ``signal``, ``unknown``,
        ``next_attempt`` or None) with ``waiting_name``, ``waiting_since`` and ``waiting_deadline``, and the run's
        ``status``, ``state`` and ``outcome`` (layout 8, ``settled/projections/sql/0008_workflow_runs.sql``).

        Args:
            incomplete: Only runs not settled yet.
            workflow: Only this workflow's.
            limit: Most rows returned.
            after: Wait first until the projection holds this receipt's request (read-your-writes).
            timeout_s: Bound on that wait, in seconds.

        Returns:
            ``workflow_runs`` view rows.

        Raises:
            ReadYourWritesTimeoutError: ``after`` was not projected in time.
            ValueError: ``limit`` is not positive.
        """
        query, params = self._run_listing(
            "workflow_runs", "admitted_at, submission_id", incomplete, ("workflow", workflow), limit
        )
        self._after(after, timeout_s)
        return self._query(query, params)

    def _run_listing(
        self, view: str, order: str, incomplete: bool, equal: tuple[str, str | None], limit: int
    ) -> tuple[sql.Composed, tuple[Any, ...]]:
        """The query listing a runs view (`runs`, `workflow_runs`) and its parameters.

        Args:
            view: The view.
            order: Its ORDER BY columns (a constant of this module, never input).
            incomplete: Only runs not settled yet.
            equal: A column and the value it must equal (None: no such filter).
            limit: Most rows returned.

        Returns:
            The query and its parameters.

        Raises:
            ValueError: ``limit`` is not positive.
        """
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        where: list[sql.Composable] = [sql.SQL("TRUE")]
        params: list[Any] = []
        if incomplete:
            where.append(sql.SQL("state NOT IN ('completed', 'failed', 'aborted')"))
        column, value = equal
        if value is not None:
            where.append(sql.SQL("{} = %s").format(sql.Identifier(column)))
            params.append(value)
        params.append(limit)
        query = sql.SQL("SELECT * FROM {} WHERE {} ORDER BY {} LIMIT %s").format(
            self._t(view), sql.SQL(" AND ").join(where), sql.SQL(order)
        )
        return query, tuple(params)

    def obligations(self, *, after: Receipt | None = None, timeout_s: float = 10.0) -> list[Row]:
        """List what someone owes a run, oldest first (issue 22 item 5).

        Open Unknowns, pending approvals and unsettled submissions, each with ``kind``, ``item_id``, ``name``,
        ``since`` and ``age``.

        Args:
            after: Wait first until the projection holds this receipt's request.
            timeout_s: Bound on that wait, in seconds.

        Returns:
            ``obligations`` view rows (the ``overdue`` view holds those past the default thresholds).

        Raises:
            ReadYourWritesTimeoutError: ``after`` was not projected in time.
        """
        self._after(after, timeout_s)
        return self._query(sql.SQL("SELECT * FROM {} ORDER BY since, kind, item_id").format(self._t("obligations")))

    def flow_run(
        self, run_id: str, *, conversation_id: str, after: Receipt | None = None, timeout_s: float = 10.0
    ) -> FlowRunView | None:
        """Return where a flow run is: status, flow, node, what it waits for (issue 18; the seed's ``getRun``).

        Read from the conversation's transcript (`settled.protocol.flow_run_view`): the run's turns, the node records
        its turns made, its open waits and its last turn's reply.

        Args:
            run_id: The run (a receipt's ``run_id``).
            conversation_id: Its conversation (a run id names a run of one conversation).
            after: Wait first until the projection holds this receipt's request.
            timeout_s: Bound on that wait, in seconds.

        Returns:
            The view, or None when the conversation holds no such run (or is not projected).

        Raises:
            ReadYourWritesTimeoutError: ``after`` was not projected in time.
        """
        self._after(after, timeout_s)
        rows = self._query(
            sql.SQL(
                "SELECT submission_id, kind, name, call_id, content FROM {} WHERE conversation_id = %s "
                "ORDER BY event_seq"
            ).format(self._t("transcript")),
            (conversation_id,),
        )
        entries = [TranscriptEntry(r["submission_id"], r["kind"], r["name"], r["call_id"], r["content"]) for r in rows]
        return flow_run_view(conversation_id, run_id, entries)

    def approvals(
        self,
        *,
        pending: bool = True,
        conversation_id: str | None = None,
        submission_id: str | None = None,
        limit: int = 100,
        after: Receipt | None = None,
        timeout_s: float = 10.0,
    ) -> list[Row]:
        """List approvals runs asked for (issue 16 item 7), oldest request first.

        Args:
            pending: Only those still waiting for a decision (else every status: approved, denied, expired,
                cancelled).
            conversation_id: Only this conversation's.
            submission_id: Only this run's (the submission id).
            limit: Most rows returned.
            after: Wait first until the projection holds this receipt's request (e.g. a decision's receipt: the
                approval it decided is then no longer pending).
            timeout_s: Bound on that wait, in seconds.

        Returns:
            ``approvals`` rows: the run, the approval id and the argument digest a decision must name, the tool call
            and its arguments (``tool``, ``call_id`` and ``args_json``; no tool for ``ctx.approve``), title,
            description, ``requested_at``, ``deadline``, and once decided who, how and why.

        Raises:
            ReadYourWritesTimeoutError: ``after`` was not projected in time.
            ValueError: ``limit`` is not positive.
        """
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        self._after(after, timeout_s)
        where = [sql.SQL("TRUE")]
        params: list[Any] = []
        if pending:
            where.append(sql.SQL("status = 'pending'"))
        if conversation_id is not None:
            where.append(sql.SQL("conversation_id = %s"))
            params.append(conversation_id)
        if submission_id is not None:
            where.append(sql.SQL("submission_id = %s"))
            params.append(submission_id)
        params.append(limit)
        query = sql.SQL(
            "SELECT * FROM {} WHERE {} ORDER BY requested_at, conversation_id, approval_id LIMIT %s"
        ).format(self._t("approvals"), sql.SQL(" AND ").join(where))
        return self._query(query, tuple(params))

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
            ReadYourWritesTimeoutError: ``after`` was not projected in time.
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
