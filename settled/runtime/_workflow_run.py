"""Running a `Workflow` inside one run (issue 17 item 1): the machinery behind `settled/runtime/_workflow.py`.

Everything a workflow run records is a ``StepRecorded`` through the run's commit pipeline (the same record, commit
and failpoints as ``ctx.step``), told apart by its name:

* ``step:<name>``: the step's result (its one recorded success);
* ``checkpoint:<name>``: a checkpoint's data (awaited: canonical when ``checkpoint`` returns);
* ``log:<name>``: a log line (buffered: committed with the run's next record);
* ``workflow``: the run's plan, ``{"steps": [<step names in order>], "workflow": <name>}``, buffered by the first
  attempt (committed with its first record): the projection reads the run's total steps from it (issue 17 item 4).

A workflow run has no agent code, so its records are found by name, not by callsite ordinal: a new attempt reads
the recorded results (``previous``) and each step's last checkpoint (the highest ordinal) from the journal, skips
every step with a result, and records what it does next at ordinals after every recorded one (a body that resumes
from its checkpoint may checkpoint fewer times than the attempt before it).

Retries (issue 17 item 3; the one retry layer of a workflow step): a failed execution (an exception, or
`StepTimeoutError` past ``step_timeout``) appends ``StepRetryScheduled`` and, in the same batch, a timed wait: a
``WaitRequested`` of kind signal named ``retry:<step>#<n>`` whose deadline is the wake-up (the generic wait of
`settled/protocol/_waits.py`; the conductor's sweeper expires it at the deadline), then the attempt ends like any
wait's (`RunContext._suspend`). The next attempt counts the step's ``StepRetryScheduled`` records and runs it again;
replay never re-raises a recorded error. The failure after ``max_retries`` retries settles the run failed
(`RunFailedError`, the last error's type, not retried).

Approvals (issue 17 item 2): before the body of a step with ``requires_approval`` the run asks, ask number ``k``
(1, then one more after each denial that paused the run and its resume), under `settled.protocol.step_approval_id`:

* ``approval-request:<step>#<k>`` (a ``StepRecorded``, awaited): the request is canonical (failpoint
  ``workflow.after_approval_request_commit``); ``durable.approval_needed`` derives from it;
* with ``on_approval_needed``: its answer through ``ctx.step`` as ``approval:<step>#<k>`` (``{"approved": true |
  false | null}``), so the callback runs at least once and its answer is recorded once; null leaves it to a person;
* a person: a ``WaitRequested`` of kind approval with that id (`settled.protocol.approval_details` of the step, the
  ask, the workflow and the task), decided by a signed ``DecideApproval`` (``settled approve|deny``).

Pauses: a paused run waits on a ``WaitRequested`` of kind signal named ``settled.resume`` whose id is
`settled.protocol.pause_wait_id` and whose ``details_json`` says why: ``{"approval_id", "reason", "source",
"step"}`` (``source``: the ``settled.pause`` signal it honours, or null for a denial; ``approval_id``: the denied
ask, or null). ``durable.paused`` derives from it. A ``settled.pause`` signal is honoured at the next step boundary
(before a step's approval and body), read from the committed journal as it grows (``AgentRun.committed``); once a
pause wait names it as its ``source`` it is consumed. ``settled.resume`` delivers the pause wait through the
owner's signal deliveries; the next attempt goes on from that step boundary (or asks again after a denial).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from datetime import timedelta
from typing import Any, NoReturn

from settled._failpoints import failpoint
from settled._faults import fault_enabled
from settled.processors import AttemptSupersededError, RunFailedError
from settled.protocol import (
    APPROVAL_ANSWER_PREFIX,
    APPROVAL_REQUEST_PREFIX,
    PAUSE_SIGNAL,
    RESUME_SIGNAL,
    STEP_LOG_PREFIX,
    STEP_RESULT_PREFIX,
    WorkflowInvocation,
    approval_details,
    bounded_text,
    pause_wait_id,
    step_approval_id,
    wait_id_for,
)
from settled.runtime._context import ApprovalDecision, RunContext
from settled.runtime._errors import ReplayDivergenceError, RunSuspended
from settled.runtime._tools import invoke
from settled.runtime._workflow import Step, StepContext, StepTimeoutError, Workflow
from settled.schemas import (
    SignalReceived,
    StepRecorded,
    StepRetryScheduled,
    WaitKind,
    WaitRequested,
    canonical_json,
    json_digest,
)

_log = logging.getLogger(__name__)

__all__ = ["RESULT_PREFIX", "WorkflowRun", "run_workflow"]

#: Record-name prefixes of a workflow run's ``StepRecorded`` records (module docstring).
RESULT_PREFIX = STEP_RESULT_PREFIX  # settled/protocol/_lifecycle.py reads them too
CHECKPOINT_PREFIX = "checkpoint:"
LOG_PREFIX = STEP_LOG_PREFIX
PLAN_NAME = "workflow"
#: Who decided an approval that ``on_approval_needed`` answered (`ApprovalDecision.by`).
CALLBACK_APPROVER = "on_approval_needed"


class WorkflowRun:
    """One attempt of a workflow run: the journal read back, the steps run, the records made.

    Args:
        ctx: The run's context (its pipeline and ordinals).
        workflow: The workflow.
        invocation: What the submission asked for.

    Attributes:
        workflow: The workflow.
        task_id: The run's task id.
        input: The run's input.
        run_id: The run's id.
        attempt: The attempt number.
    """

    def __init__(self, ctx: RunContext, workflow: Workflow, invocation: WorkflowInvocation) -> None:
        self._ctx = ctx
        self.workflow = workflow
        self.task_id = invocation.task_id
        self.input = invocation.input
        self.run_id = ctx.run_id
        self.attempt = ctx.attempt
        self._results: dict[str, Any] = {}
        self._checkpoints: dict[str, tuple[int, Any]] = {}  # step -> (ordinal, data) of its last checkpoint
        self._retries: dict[str, int] = {}  # step -> retries scheduled (its StepRetryScheduled records)
        self._retry_waits: dict[str, str] = {}  # step -> the wait id of its last scheduled retry
        self._approvals: dict[str, Any] = {}  # approval-request:/approval: record name -> its value
        self._requested: set[str] = set()  # ids of the waits the run requested
        self._pause_of: dict[str, str] = {}  # denied approval id -> the pause wait it caused
        self._pause_sources: set[str] = set()  # pause signals honoured (a pause wait names each as its source)
        self._planned = False  # the plan record is in the journal
        last = -1
        for e in ctx._run.journal:
            ordinal = getattr(e, "ordinal", None)
            if isinstance(ordinal, int):
                last = max(last, ordinal)
            if isinstance(e, WaitRequested):
                self._requested.add(e.wait_id)
                if e.name == RESUME_SIGNAL and e.kind is WaitKind.SIGNAL and e.details_json is not None:
                    details = json.loads(e.details_json)
                    if isinstance(details, dict):
                        if isinstance(details.get("approval_id"), str):
                            self._pause_of.setdefault(details["approval_id"], e.wait_id)
                        if isinstance(details.get("source"), str):
                            self._pause_sources.add(details["source"])
                continue
            if isinstance(e, StepRetryScheduled):
                self._retries[e.step] = max(self._retries.get(e.step, 0), e.retry)
                self._retry_waits[e.step] = e.wait_id
                continue
            if not isinstance(e, StepRecorded):
                continue
            if e.name == PLAN_NAME:
                self._planned = True
            elif e.name.startswith((APPROVAL_REQUEST_PREFIX, APPROVAL_ANSWER_PREFIX)):
                self._approvals.setdefault(e.name, json.loads(e.result_json))
            elif e.name.startswith(RESULT_PREFIX):
                self._results.setdefault(e.name.removeprefix(RESULT_PREFIX), json.loads(e.result_json))
            elif e.name.startswith(CHECKPOINT_PREFIX):
                step = e.name.removeprefix(CHECKPOINT_PREFIX)
                if e.ordinal > self._checkpoints.get(step, (-1, None))[0]:
                    self._checkpoints[step] = (e.ordinal, json.loads(e.result_json))
        ctx._ordinal = max(ctx._ordinal, last + 1)  # new records go after every recorded one

    def _record(self, name: str, value: Any) -> StepRecorded:
        ctx = self._ctx
        result_json = canonical_json(value)
        size = len(result_json.encode())
        limit = ctx._options.max_result_bytes
        if size > limit:
            raise ValueError(f"workflow {self.workflow.name!r}: {name} is {size} bytes, over max_result_bytes {limit}")
        ordinal = ctx._next_ordinal()
        return StepRecorded(
            submission_id=ctx.submission_id,
            attempt_id=ctx.attempt_id,
            name=name,
            version=1,
            step_id=json_digest(canonical_json([self.run_id, ordinal, "step", name])),
            ordinal=ordinal,
            result_json=result_json,
            result_digest=json_digest(result_json),
        )

    async def checkpoint(self, step: str, data: Any) -> None:
        """Commit a checkpoint of ``step`` (with the log lines before it).

        Args:
            step: The step's name.
            data: A JSON value.
        """
        await self._ctx._pipeline.record([self._record(CHECKPOINT_PREFIX + step, data)])

    def log(self, step: str, message: str) -> None:
        """Buffer a log line of ``step``: it commits with the run's next record.

        Args:
            step: The step's name.
            message: The line.
        """
        self._ctx._pipeline.buffer.append(self._record(LOG_PREFIX + step, message))

    async def _run_step(self, step: Step) -> Any:
        retry = self._retries.get(step.name, 0)
        wait_id = self._retry_waits.get(step.name)
        if wait_id is not None and wait_id not in self._ctx._journal.waits:
            raise RunSuspended(f"the retry wait {wait_id} of step {step.name!r} is still open")
        while True:
            ctx = StepContext(self, step, self._results, self._checkpoints.get(step.name, (-1, None))[1], retry)
            try:
                return await self._ctx.step(RESULT_PREFIX + step.name, self._body, step, ctx, pure=step.pure)
            except (RunSuspended, AttemptSupersededError, ReplayDivergenceError):
                raise  # not the step's failure: the attempt's
            except Exception as exc:  # noqa: BLE001 - a step body's failure: recorded as a retry, or it settles the run
                failure = exc
            finally:
                ctx.end()
            retry += 1
            if retry > self.workflow.max_retries:
                raise RunFailedError(
                    type(failure).__name__,
                    bounded_text(f"step {step.name!r} failed in each of its {retry} executions; the last: {failure}"),
                ) from failure
            backoff_s = self._backoff_s(retry)
            _log.info(
                "workflow step failed; retry scheduled",
                extra={"submission_id": self._ctx.submission_id, "step": step.name, "retry": retry},
            )
            if fault_enabled("workflow_retry_unrecorded"):
                # Fault switch (issue 17 item 3; tests/fault_switches.toml): the step runs again in this attempt
                # after its backoff, with no canonical StepRetryScheduled and no timed wait.
                await asyncio.sleep(backoff_s)
                continue
            await self._schedule_retry(step, retry, failure, backoff_s)

    def _backoff_s(self, retry: int) -> float:
        """The wait before retry ``retry`` (1-based): doubling from ``retry_backoff``, capped, plus up to 20%."""
        base_s = self.workflow.retry_backoff.total_seconds() * 2.0 ** (retry - 1)
        capped_s = min(base_s, self.workflow.max_retry_backoff.total_seconds())
        return capped_s * (1 + 0.2 * random.random())

    async def _schedule_retry(self, step: Step, retry: int, failure: Exception, backoff_s: float) -> None:
        """Append ``StepRetryScheduled`` and its timed wait in one batch; end the attempt (raises RunSuspended)."""
        ctx = self._ctx
        wake_at = ctx._options.clock() + timedelta(seconds=backoff_s)
        ordinal = ctx._next_ordinal()
        wait_id = wait_id_for(self.run_id, ordinal)
        ctx._pipeline.buffer.append(
            StepRetryScheduled(
                submission_id=ctx.submission_id,
                attempt_id=ctx.attempt_id,
                step=step.name,
                retry=retry,
                ordinal=ordinal,
                error_type=type(failure).__name__,
                error_message=bounded_text(str(failure)),
                wake_at=wake_at,
                wait_id=wait_id,
            )
        )
        await ctx._suspend(
            WaitRequested(
                submission_id=ctx.submission_id,
                attempt_id=ctx.attempt_id,
                wait_id=wait_id,
                kind=WaitKind.SIGNAL,
                name=f"retry:{step.name}#{retry}",
                ordinal=ordinal,
                deadline=wake_at,
            )
        )

    async def _body(self, step: Step, ctx: StepContext) -> Any:
        timeout_s = self.workflow.step_timeout.total_seconds()
        try:
            return await asyncio.wait_for(invoke(step.fn, ctx), timeout_s)
        except TimeoutError:
            ctx.end()  # a late checkpoint or log of the body is refused; its late return is dropped
            raise StepTimeoutError(step.name, timeout_s) from None

    async def run(self) -> dict[str, Any]:
        """Run the steps without a recorded result, in order: at each step boundary a pause, then the approval.

        Returns:
            The step results by name (the run's reply).

        Raises:
            RunSuspended: The run paused, or waits for a person's approval (the attempt ends).
            RunFailedError: A step failed past its retries, or its approval was denied under ``on_denial="fail"``.
        """
        if not self._planned:
            plan = {"steps": [step.name for step in self.workflow.steps], "workflow": self.workflow.name}
            self._ctx._pipeline.buffer.append(self._record(PLAN_NAME, plan))  # rides with the first record
            self._planned = True
        for step in self.workflow.steps:
            if step.name in self._results:
                continue  # recorded: never run again
            await self._boundary(step)
            if step.requires_approval:
                await self._gate(step)
            self._results[step.name] = await self._run_step(step)
        return dict(self._results)

    # -- pauses and approvals (issue 17 item 2) -------------------------------------------------------------------

    async def _boundary(self, step: Step) -> None:
        """Honour a ``settled.pause`` signal not honoured yet: pause before ``step`` (module docstring)."""
        run = self._ctx._run
        for e in run.committed() or run.journal:
            if (
                isinstance(e, SignalReceived)
                and e.name == PAUSE_SIGNAL
                and e.submission_id == self._ctx.submission_id
                and e.command_id not in self._pause_sources
            ):
                payload = json.loads(e.payload_json)
                reason = payload.get("reason") if isinstance(payload, dict) else None
                why = reason if isinstance(reason, str) and reason else f"paused by {e.principal}"
                await self._pause(step, why, source=e.command_id)

    async def _pause(
        self, step: Step, reason: str, *, source: str | None = None, approval_id: str | None = None
    ) -> NoReturn:
        """Request the run's pause wait (resumed by ``settled.resume``) and end the attempt."""
        ctx = self._ctx
        ordinal = ctx._next_ordinal()
        details = {"approval_id": approval_id, "reason": bounded_text(reason), "source": source, "step": step.name}
        _log.info("workflow run paused", extra={"submission_id": ctx.submission_id, "step": step.name})
        await ctx._suspend(
            WaitRequested(
                submission_id=ctx.submission_id,
                attempt_id=ctx.attempt_id,
                wait_id=pause_wait_id(self.run_id, ordinal),
                kind=WaitKind.SIGNAL,
                name=RESUME_SIGNAL,
                ordinal=ordinal,
                details_json=canonical_json(details),
            )
        )

    async def _gate(self, step: Step) -> None:
        """Return once ``step`` is approved; pause or fail on a denial (``on_denial``)."""
        ask = 1
        while True:
            approval_id = step_approval_id(self.run_id, step.name, ask)
            decision = await self._ask(step, ask, approval_id)
            if decision.approved:
                return
            why = f"approval {approval_id} of step {step.name!r} denied by {decision.by}" + (
                f": {decision.reason}" if decision.reason else ""
            )
            if self.workflow.on_denial == "fail":
                raise RunFailedError("approval_denied", bounded_text(why))
            pause = self._pause_of.get(approval_id)
            if pause is None:
                await self._pause(step, why, approval_id=approval_id)
            if pause not in self._ctx._journal.waits:  # never so: a run is Ready only once every wait is decided
                raise RunSuspended(f"the pause {pause} of step {step.name!r} is still open")
            if fault_enabled("workflow_denial_replayed"):
                # Fault switch (issue 17 item 2; tests/fault_switches.toml): the resumed run reads the earlier
                # denial as its answer again and pauses again, never asking under the next approval id.
                await self._pause(step, why)
            ask += 1  # resumed: ask again, under a new id

    async def _ask(self, step: Step, ask: int, approval_id: str) -> ApprovalDecision:
        """Ask for ``step``'s approval (ask ``ask``): the canonical request, then the callback's or a person's."""
        key = f"{step.name}#{ask}"
        request = APPROVAL_REQUEST_PREFIX + key
        if request not in self._approvals:
            value = {"approval_id": approval_id, "ask": ask, "description": step.description, "step": step.name}
            await self._ctx._pipeline.record([self._record(request, value)])
            self._approvals[request] = value
            failpoint("workflow.after_approval_request_commit")
        if self.workflow.on_approval_needed is not None:
            name = APPROVAL_ANSWER_PREFIX + key
            if name in self._approvals:
                answer = self._approvals[name]
            else:
                answer = await self._ctx.step(name, self._callback, step)
                self._approvals[name] = answer
            approved = answer.get("approved") if isinstance(answer, dict) else None
            if isinstance(approved, bool):
                return ApprovalDecision(approved=approved, by=CALLBACK_APPROVER, reason=None)
        if approval_id in self._requested:
            decided = self._ctx._journal.waits.get(approval_id)
            if decided is None:  # never so: a run is Ready only once every wait is decided
                raise RunSuspended(f"approval {approval_id} is still open")
            return ApprovalDecision.of(decided)
        args_json = canonical_json(
            {
                "ask": ask,
                "description": step.description,
                "step": step.name,
                "task_id": self.task_id,
                "workflow": self.workflow.name,
            }
        )
        ctx = self._ctx
        await ctx._suspend(
            WaitRequested(
                submission_id=ctx.submission_id,
                attempt_id=ctx.attempt_id,
                wait_id=approval_id,
                kind=WaitKind.APPROVAL,
                name=step.name,
                ordinal=ctx._next_ordinal(),
                details_json=approval_details(step.name, step.description, args_json),
            )
        )

    async def _callback(self, step: Step) -> dict[str, Any]:
        """Call ``on_approval_needed(step)``; its answer as the recorded ``{"approved": ...}``."""
        callback = self.workflow.on_approval_needed
        assert callback is not None  # only called when set
        answer = await invoke(callback, step)
        if answer is not None and not isinstance(answer, bool):
            raise TypeError(
                f"workflow {self.workflow.name!r}: on_approval_needed must return True, False or None, got {answer!r}"
            )
        return {"approved": answer}


async def run_workflow(ctx: RunContext, workflow: Workflow | None, invocation: WorkflowInvocation) -> dict[str, Any]:
    """Run (or resume) the workflow a submission names.

    Args:
        ctx: The run's context.
        workflow: The registered workflow of that name, or None.
        invocation: The submission's request.

    Returns:
        The step results by name.

    Raises:
        RunFailedError: No workflow of that name is registered (``unknown_workflow``; not retried).
    """
    if workflow is None:
        raise RunFailedError("unknown_workflow", f"no workflow named {invocation.name!r} is registered on the app")
    return await WorkflowRun(ctx, workflow, invocation).run()
