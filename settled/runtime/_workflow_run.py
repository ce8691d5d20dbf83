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
"""

from __future__ import annotations

import json
from typing import Any

from settled.processors import RunFailedError
from settled.protocol import WorkflowInvocation
from settled.runtime._context import RunContext
from settled.runtime._tools import invoke
from settled.runtime._workflow import Step, StepContext, Workflow
from settled.schemas import StepRecorded, canonical_json, json_digest

__all__ = ["RESULT_PREFIX", "WorkflowRun", "run_workflow"]

#: Record-name prefixes of a workflow run's ``StepRecorded`` records (module docstring).
RESULT_PREFIX = "step:"
CHECKPOINT_PREFIX = "checkpoint:"
LOG_PREFIX = "log:"


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
        last = -1
        for e in ctx._run.journal:
            if not isinstance(e, StepRecorded):
                continue
            last = max(last, e.ordinal)
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
        ctx = StepContext(self, step, self._results, self._checkpoints.get(step.name, (-1, None))[1])
        return await self._ctx.step(RESULT_PREFIX + step.name, self._body, step, ctx)

    @staticmethod
    async def _body(step: Step, ctx: StepContext) -> Any:
        return await invoke(step.fn, ctx)

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
