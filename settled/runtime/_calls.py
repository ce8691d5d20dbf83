"""Tool-call execution (issue 6; docs/design.md §5, docs/semantics.md §10): timeouts, retries, reconcile, Unknown.

`ToolCalls.call` commits a call's ``ToolCallPrepared`` (awaited, through the `CommitPipeline`), runs the tool with
its idempotency key and the owner epoch — a sync tool starts in the conductor's thread as the prepared record commits
(`_Launch`) — and posts its ``ToolCallSettled``. A call in doubt (transport error, timeout) is retried under the same
key when the tool is idempotent or its reconciler answers ``never_started``, settled with the reconciler's
``recovered`` result, and otherwise marked ``ToolCallUnknown``: the run stops (DUR-009). Replay and the decision
whether a call runs at all belong to the façade (`settled.runtime.RunContext.tool`).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import threading
import time
from collections.abc import Awaitable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, NoReturn

from settled._failpoints import FailpointError, failpoint
from settled._faults import fault_enabled
from settled.protocol import ReconcileAnswer, Reconciliation
from settled.runtime._errors import (
    RunSuspended,
    ToolCallError,
    ToolTransportError,
    ToolUnavailableError,
)
from settled.runtime._options import RunOptions
from settled.runtime._pipeline import CommitPipeline
from settled.runtime._tools import ToolCall, ToolRegistry, ToolSpec, call_in_thread, invoke, start, still_unknown
from settled.schemas import (
    RESULT_TOO_LARGE,
    CanonicalJsonError,
    ToolCallPrepared,
    ToolCallSettled,
    ToolCallUnknown,
    ToolError,
    canonical_json,
    json_digest,
)

__all__ = ["IN_DOUBT_ERRORS", "ToolCalls", "replay_settled"]

_log = logging.getLogger(__name__)

#: Errors that mean "no answer": the call's outcome is in doubt (docs/design.md §5).
IN_DOUBT_ERRORS: tuple[type[BaseException], ...] = (ToolTransportError, ConnectionError, TimeoutError)


@dataclass(frozen=True)
class _Answer:
    """A tool's answer, ready to record: a canonical result or a typed application error."""

    result_json: str | None = None
    result_digest: str | None = None
    error: ToolError | None = None


class _Launch:
    """A sync tool started from the conductor's thread as its prepared record commits (docs/design.md §3).

    The run's loop would otherwise learn of the commit (one wake-up of the loop), then start the tool (one wake-up
    of a tool thread): the tool starts one thread hop earlier, and its result still reaches the run through the
    loop. `fire` runs right after the commit and before the run's loop is woken, so the crash-matrix failpoints
    between the commit and the tool (``engine.after_response_commit`` when the response rode along, then
    ``engine.after_prepared_commit``) are hit here, in the same order and before the tool starts
    (docs/semantics.md §15). An error (a ``raise`` failpoint, a thread that could not start) is kept and raised on the
    run's loop where the failpoint would have been hit; the tool is then not started.
    """

    def __init__(self, spec: ToolSpec, args: dict[str, Any], call: ToolCall) -> None:
        self.spec = spec
        self.args = args
        self.call = call
        self.with_response = False  # set when the record is handed over: the response rides with this prepared
        self.future: Future[Any] | None = None
        self.started_s = 0.0  # time.monotonic() when the tool started
        self.error: BaseException | None = None
        self._lock = threading.Lock()
        self._abandoned = False

    def fire(self) -> None:
        """Hit the boundary failpoints, then start the tool on a daemon thread (in the conductor's thread).

        Runs before the run's loop is told of the commit (`RunContext._hand_off` runs the commit hooks, then wakes
        the loop), so the loop reads ``future`` and ``error`` after they are set. A run that stopped waiting
        meanwhile (`abandon`) gets no tool started, as before the launch moved here.
        """
        try:
            if self.with_response:
                failpoint("engine.after_response_commit")
            failpoint("engine.after_prepared_commit")
            with self._lock:
                if self._abandoned:
                    return
                self.started_s = time.monotonic()
                self.future = call_in_thread(self.spec.fn, dict(self.args), self.call)
        except Exception as exc:  # noqa: BLE001 - raised on the run's loop (`RunContext._execute`), never lost
            self.error = exc

    def abandon(self) -> bool:
        """The run stopped waiting for the commit (cancelled): start nothing from now on.

        Returns:
            Whether the tool had already started (it then runs on, as a tool in flight does when its run is
            cancelled past the abort grace; the call stays prepared for recovery).
        """
        with self._lock:
            self._abandoned = True
            return self.future is not None


def replay_settled(name: str, settled: ToolCallSettled) -> Any:
    """Return a settled call's result, or raise its recorded error (live and on replay alike).

    Args:
        name: The tool's name.
        settled: The call's settlement.

    Returns:
        The result, decoded from canonical JSON.

    Raises:
        ToolCallError: The settlement holds the tool's application error.
    """
    if settled.error is not None:
        err = settled.error
        raise ToolCallError(name, settled.call_id, err.type, err.message, non_retryable=err.non_retryable)
    return None if settled.result_json is None else json.loads(settled.result_json)


class ToolCalls:
    """One attempt's tool-call execution; records go through its `CommitPipeline`."""

    def __init__(
        self,
        pipeline: CommitPipeline,
        tools: ToolRegistry,
        options: RunOptions,
        *,
        submission_id: str,
        attempt_id: str,
        attempt: int,
    ) -> None:
        self._pipeline = pipeline
        self._tools = tools
        self._options = options
        self.submission_id = submission_id
        self.attempt_id = attempt_id
        self.attempt = attempt
        self._serial = asyncio.Lock()  # calls of tools that are not parallel_safe run one at a time

    async def call(self, spec: ToolSpec, prepared: ToolCallPrepared, args: dict[str, Any]) -> Any:
        """Execute a call whose prepared record is built: commit it, run the tool, post its settlement.

        An abort or revoke while the call is in flight gives it `RunOptions.abort_grace_s` to return and settle
        (docs/design.md §5); past that it stays prepared and recovery classifies it.

        Args:
            spec: The tool.
            prepared: The call's prepared record (not yet committed).
            args: Its arguments.

        Returns:
            The tool's result (decoded canonical JSON).

        Raises:
            ToolCallError: The tool answered with an error.
            RunSuspended: The call became Unknown (the run stops).
            ToolUnavailableError: An idempotent call stayed in doubt past its retry budget.
        """
        call_id = prepared.call_id
        work = asyncio.ensure_future(self._execute(spec, prepared, args))
        try:
            return await asyncio.shield(work)
        except asyncio.CancelledError:
            if not work.done():
                # Abort or revoke while the call is in flight: a bounded grace to return and settle (docs/design.md §5).
                await asyncio.wait({work}, timeout=self._options.abort_grace_s)
                if not work.done():
                    work.cancel()  # still in flight: the call stays prepared; recovery classifies it
                elif not work.cancelled() and work.exception() is not None:
                    # The call ended within the grace, but its settlement could not be recorded (e.g. the attempt
                    # was superseded): the call stays prepared for recovery. Reported here, as the run is cancelled.
                    _log.warning(
                        "a tool call of a cancelled run ended without a recorded settlement",
                        extra={"call_id": call_id, "error": repr(work.exception())},
                    )
            raise

    async def _execute(self, spec: ToolSpec, prepared: ToolCallPrepared, args: dict[str, Any]) -> Any:
        call = ToolCall(
            tool=spec.name,
            call_id=prepared.call_id,
            idempotency_key=prepared.idempotency_key,
            owner_epoch=prepared.owner_epoch,
            submission_id=self.submission_id,
            attempt=self.attempt,
        )
        async with contextlib.AsyncExitStack() as stack:
            if not spec.parallel_safe:
                await stack.enter_async_context(self._serial)
            if fault_enabled("tool_before_prepared_commit"):
                # Fault switch (DUR-009; tests/fault_switches.toml): the tool runs before its Prepared record
                # commits, so a crash in between leaves an invocation with no durable trace.
                answer = await self._answer(spec, prepared, call, args)
                await self._pipeline.record([prepared])
                failpoint("engine.after_prepared_commit")
            else:
                # A sync tool starts as its prepared record commits, one thread hop sooner (`_Launch`).
                launch = None if inspect.iscoroutinefunction(spec.fn) else _Launch(spec, args, call)
                try:
                    launched = await self._pipeline.record([prepared], launch)
                except asyncio.CancelledError:
                    if launch is not None and launch.abandon():
                        _log.warning(
                            "a cancelled run's tool started as its prepared record committed; it runs on unwatched",
                            extra={"call_id": prepared.call_id},
                        )
                    raise
                if not launched:
                    launch = None
                    failpoint("engine.after_prepared_commit")
                elif launch is not None and launch.error is not None:
                    raise launch.error
                answer = await self._answer(spec, prepared, call, args, launch)
            failpoint("engine.tool_returned")
            settled = ToolCallSettled(
                submission_id=self.submission_id,
                attempt_id=self.attempt_id,
                call_id=prepared.call_id,
                result_json=answer.result_json,
                result_digest=answer.result_digest,
                error=answer.error,
            )
            # Not awaited (docs/design.md §3): the run goes on (the next model call) while it commits; whatever the run
            # records next is ordered after it in the conversation's chain.
            self._pipeline.post([settled], on_commit=_after_settled_commit)
        return replay_settled(spec.name, settled)

    async def _answer(
        self,
        spec: ToolSpec,
        prepared: ToolCallPrepared,
        call: ToolCall,
        args: dict[str, Any],
        launch: _Launch | None = None,
    ) -> _Answer:
        """Execute until the tool answers (a result or an application error); retry in-doubt calls when safe.

        The first try awaits the tool ``launch`` started as its prepared record committed, when there is one.
        """
        deadline = time.monotonic() + spec.retry_budget_s
        delay_s = self._options.retry_backoff_s
        first = launch  # the first try only: a retry starts the tool again
        running: Awaitable[Any]
        while True:
            try:
                if first is not None and first.future is not None:
                    started, running = first.started_s, asyncio.wrap_future(first.future)
                else:
                    started, running = time.monotonic(), start(spec.fn, dict(args), call)
                first = None
                value = await asyncio.wait_for(running, max(spec.timeout_s - (time.monotonic() - started), 0.0))
                if inspect.isawaitable(value):  # a sync tool returned an awaitable: within the same timeout
                    value = await asyncio.wait_for(value, max(spec.timeout_s - (time.monotonic() - started), 0.0))
            except FailpointError:
                raise
            except IN_DOUBT_ERRORS as exc:
                why = f"no answer from tool {spec.name!r}: {type(exc).__name__}: {exc}".rstrip(": ")
                if isinstance(exc, TimeoutError):
                    why = f"tool {spec.name!r} gave no answer within timeout_s={spec.timeout_s:g}"
                if spec.reconcile is not None:
                    rec = await self._reconcile(spec, prepared)
                    if rec.answer is ReconcileAnswer.RECOVERED and rec.result_json is not None:
                        return _Answer(rec.result_json, json_digest(rec.result_json))
                    if rec.answer is ReconcileAnswer.UNKNOWN and not spec.idempotent:
                        await self._mark_unknown(
                            prepared.call_id, f"{why}; the reconciler answered unknown: {rec.reason}"
                        )
                elif not spec.idempotent:
                    await self._mark_unknown(
                        prepared.call_id, f"{why}; the tool is neither idempotent nor reconcilable"
                    )
                if time.monotonic() + delay_s > deadline:
                    raise ToolUnavailableError(
                        f"call {prepared.call_id} of tool {spec.name!r} stayed in doubt for retry_budget_s="
                        f"{spec.retry_budget_s:g}: {why}"
                    ) from exc
                _log.info("retrying an in-doubt call under its key", extra={"call_id": prepared.call_id, "why": why})
                await asyncio.sleep(delay_s)
                delay_s = min(delay_s * 2, 2.0)
                continue
            except Exception as exc:  # noqa: BLE001 - the tool answered with an error: recorded, replayed
                message = str(exc)
                non_retryable = bool(getattr(exc, "non_retryable", False))
                return _Answer(error=ToolError(type=type(exc).__name__, message=message, non_retryable=non_retryable))
            return self._result(spec, value)

    def _result(self, spec: ToolSpec, value: Any) -> _Answer:
        try:
            result_json = canonical_json(value)
        except CanonicalJsonError as exc:
            return _Answer(error=ToolError(type="invalid_output", message=str(exc), non_retryable=True))
        digest = json_digest(result_json)
        size = len(result_json.encode())
        if size > self._options.max_result_bytes:
            message = f"result of {size} bytes is over max_result_bytes {self._options.max_result_bytes}"
            return _Answer(
                result_digest=digest, error=ToolError(type=RESULT_TOO_LARGE, message=message, non_retryable=True)
            )
        return _Answer(result_json, digest)

    async def _reconcile(self, spec: ToolSpec, prepared: ToolCallPrepared) -> Reconciliation:
        try:
            answer: Reconciliation = await invoke(self._tools.reconcile, prepared)
        except FailpointError:
            raise
        except Exception as exc:  # noqa: BLE001 - recorded: the call is in doubt with this reason
            return still_unknown(f"the reconciler of {spec.name!r} raised {type(exc).__name__}: {exc}")
        return answer

    async def _mark_unknown(self, call_id: str, reason: str) -> NoReturn:
        await self._pipeline.record([ToolCallUnknown(submission_id=self.submission_id, call_id=call_id, reason=reason)])
        raise RunSuspended(f"call {call_id} is Unknown: {reason}")


def _after_settled_commit() -> None:
    """Runs in the conductor's thread right after a settlement commits (crash point "after tool result commit")."""
    failpoint("engine.after_settled_commit")
