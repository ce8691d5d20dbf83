"""Running a `Workflow` inside one run (issue 17 item 1): the machinery behind `settled/runtime/_workflow.py`.

Everything a workflow run records is a ``StepRecorded`` through the run's commit pipeline (the same record, commit
and failpoints as ``ctx.step``), told apart by its name:

* ``step:<name>``: the step's result (its one recorded success);
* ``checkpoint:<name>``: a checkpoint's data (awaited: canonical when ``checkpoint`` returns);
* ``log:<name>``: a log line (buffered: committed with the run's next record).

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
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from datetime import timedelta
from typing import Any

from settled._faults import fault_enabled
from settled.processors import AttemptSupersededError, RunFailedError
from settled.protocol import STEP_LOG_PREFIX, STEP_RESULT_PREFIX, WorkflowInvocation, bounded_text, wait_id_for
from settled.runtime._context import RunContext
from settled.runtime._errors import ReplayDivergenceError, RunSuspended
from settled.runtime._tools import invoke
from settled.runtime._workflow import Step, StepContext, StepTimeoutError, Workflow
from settled.schemas import (
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
        last = -1
        for e in ctx._run.journal:
            ordinal = getattr(e, "ordinal", None)
            if isinstance(ordinal, int):
                last = max(last, ordinal)
            if isinstance(e, StepRetryScheduled):
                self._retries[e.step] = max(self._retries.get(e.step, 0), e.retry)
                self._retry_waits[e.step] = e.wait_id
                continue
            if not isinstance(e, StepRecorded):
                continue
            if e.name.startswith(RESULT_PREFIX):
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
                return await self._ctx.step(RESULT_PREFIX + step.name, self._body, step, ctx)
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
        """Run the steps without a recorded result, in order.

        Returns:
            The step results by name (the run's reply).
        """
        for step in self.workflow.steps:
            if step.name in self._results:
                continue  # recorded: never run again
            self._results[step.name] = await self._run_step(step)
        return dict(self._results)


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
