"""Step workflows: named multi-step runs on settled's durable steps (issue 17 item 1).

::

    invoice = Workflow(
        "process-invoice",
        steps=[
            Step("extract", extract, description="Read the invoice"),
            Step("validate", lambda ctx: {"valid": bool(ctx.previous["extract"]["total"])}),
            Step("save", save),
        ],
    )
    app = App(agent=None)
    app.workflow(invoice)

    async def extract(ctx: StepContext) -> dict:
        ctx.log("extracting")
        page = (ctx.last_checkpoint or {}).get("page", 0)  # resumes after the last canonical checkpoint
        ...
        await ctx.checkpoint({"page": page})
        return {"total": 120}

Started with ``Client.run_workflow("process-invoice", input, task_id="inv-42")``: one submission in conversation
``wf:<name>:<task_id>`` whose idempotency key is the task id (`settled.protocol.workflow_input`). The worker runs the
steps in order; each step's success is recorded once (a ``StepRecorded`` named ``step:<name>``), so a run interrupted
anywhere resumes by itself at its first step without a recorded result, with ``previous`` rebuilt from the record and
``last_checkpoint`` the step's last canonical checkpoint. The run's reply is the dict of step results by name. A
step body runs at least once per recorded success (an interrupted body runs again), like ``ctx.step`` (DUR-010).

A step that raises, or runs past ``step_timeout`` (its late return is dropped), does not end the attempt: the run
appends a canonical ``StepRetryScheduled`` (retry number, error type, absolute wake-up with backoff and jitter) and a
timed wait until that wake-up, and the attempt ends holding no worker slot; once the wait expires the next attempt
runs the step again. ``max_retries=3`` is at most 4 executions of a step; the failure after the last settles the
run failed with that error (not retried). Only deaths count toward ``App.max_attempts``.

A step with ``requires_approval`` asks before its body runs (issue 17 item 2): its request is canonical first, then
``on_approval_needed(step)`` answers (recorded once) or, without an answer, the run waits for a person's signed
``settled approve|deny`` holding no worker slot. A denial pauses the run (``on_denial="pause"``) until
``Client.resume_run``, which asks again under a new approval id, or settles it failed (``on_denial="fail"``).
``Client.pause_run`` pauses a run at its next step boundary; a paused run is a waiting run (it holds its
conversation's lane, no worker slot) until ``Client.resume_run``.

This module is the author-facing API; the machinery that runs a workflow inside a run is
`settled/runtime/_workflow_run.py`.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal

from settled._errors import ErrorCategory, SettledError

if TYPE_CHECKING:
    from settled.runtime._workflow_run import WorkflowRun

__all__ = ["Step", "StepContext", "StepFunction", "StepState", "StepTimeoutError", "Workflow"]

#: A step body: ``fn(ctx: StepContext) -> JSON value``, sync (run on a thread) or async (on the run loop).
StepFunction = Callable[["StepContext"], Any]

#: Names: what the record's ``step:<name>`` keys and the result dict's keys are made of.
_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,128}$")


class StepTimeoutError(SettledError, TimeoutError):
    """A workflow step's execution ran past its workflow's ``step_timeout`` (a failure: retried, its return dropped).

    Attributes:
        step: The step's name.
        timeout_s: The timeout, in seconds.
    """

    category = ErrorCategory.UNAVAILABLE

    def __init__(self, step: str, timeout_s: float) -> None:
        """Build the error.

        Args:
            step: The step's name.
            timeout_s: The timeout, in seconds.
        """
        super().__init__(f"step {step!r} did not return within its step_timeout of {timeout_s} s")
        self.step = step
        self.timeout_s = timeout_s


@dataclass(frozen=True)
class Step:
    """One step of a `Workflow`.

    Attributes:
        name: Unique within its workflow; the key of its result in ``previous`` and in the run's result (letters,
            digits, ``_``, ``.``, ``-``; at most 128 characters).
        fn: The body, ``fn(ctx: StepContext)`` returning a JSON value; sync bodies run on a thread, async ones on the
            run loop (only an async body can ``await ctx.checkpoint``).
        description: What the step does, in a few words.
        requires_approval: The step's body runs only once approved (issue 17 item 2): the workflow's
            ``on_approval_needed`` answers, or a person with ``settled approve|deny``.
        pure: The body has no outside effect: its result is posted, not awaited (``ctx.step(..., pure=True)``,
            issue 24 item 2), and commits with the run's next awaited record; a crash before that commit runs the
            body again.

    Raises:
        ValueError: ``name`` is empty or has other characters.
    """

    name: str
    fn: StepFunction
    description: str = ""
    requires_approval: bool = False
    pure: bool = False

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ValueError(f"Step.name {self.name!r} must be 1-128 letters, digits, '_', '.' or '-'")


@dataclass(frozen=True)
class StepState:
    """Where a workflow run is, as `StepContext.get_state` reports it.

    Attributes:
        step: The current step's name.
        current_step: The current step's position, 1-based.
        total_steps: The workflow's number of steps.
        attempt: The run's attempt number (1, 2, ...; a resume after a crash or a retry's wake-up is a new attempt).
        retry: The retries of this step scheduled before this execution (0 for its first; at most ``max_retries``).
    """

    step: str
    current_step: int
    total_steps: int
    attempt: int
    retry: int = 0


@dataclass(frozen=True)
class Workflow:
    """A named sequence of steps, registered on the app (``App.workflow``) and run by ``Client.run_workflow``.

    Attributes:
        name: The workflow's name (``Client.run_workflow(name, ...)``; same characters as a step name).
        steps: The steps, run in order; at least one, names unique.
        max_retries: Re-executions of a failed step: at most ``max_retries + 1`` executions (module docstring).
        step_timeout: How long one execution of a step may take; past it, the execution failed and its late return
            is dropped.
        retry_backoff: The wait before the first retry; doubled per retry up to ``max_retry_backoff``, plus up to
            20% jitter.
        max_retry_backoff: The longest wait before a retry (jitter aside).
        on_approval_needed: ``fn(step) -> True | False | None`` (sync, or async): called once a step's approval
            request is canonical (at least once: again after a crash before its answer is recorded); its answer is
            recorded once and decides; None leaves the decision to a person (``settled approve|deny``). Without
            it a person always decides.
        on_denial: What a denied approval does: ``"pause"`` (the run waits for ``resume``, which asks again under
            a new approval id) or ``"fail"`` (the run settles failed, ``approval_denied``).

    Raises:
        ValueError: A value is invalid (the message names the field and value).
    """

    name: str
    steps: Sequence[Step]
    max_retries: int = 3
    step_timeout: timedelta = timedelta(seconds=60)
    retry_backoff: timedelta = timedelta(seconds=1)
    max_retry_backoff: timedelta = timedelta(seconds=60)
    on_approval_needed: Callable[[Step], Awaitable[bool | None] | bool | None] | None = None
    on_denial: Literal["pause", "fail"] = "pause"
    _index: Mapping[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ValueError(f"Workflow.name {self.name!r} must be 1-128 letters, digits, '_', '.' or '-'")
        steps = tuple(self.steps)
        if not steps:
            raise ValueError(f"Workflow {self.name!r}: steps must not be empty")
        names = [s.name for s in steps]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"Workflow {self.name!r}: step names {repeated} repeat")
        if self.max_retries < 0:
            raise ValueError(f"Workflow {self.name!r}: max_retries must be >= 0, got {self.max_retries}")
        if self.step_timeout <= timedelta(0):
            raise ValueError(f"Workflow {self.name!r}: step_timeout must be positive, got {self.step_timeout}")
        if self.retry_backoff < timedelta(0) or self.max_retry_backoff < self.retry_backoff:
            raise ValueError(
                f"Workflow {self.name!r}: need 0 <= retry_backoff <= max_retry_backoff, got {self.retry_backoff} and "
                f"{self.max_retry_backoff}"
            )
        if self.on_denial not in ("pause", "fail"):
            raise ValueError(f"Workflow {self.name!r}: on_denial must be 'pause' or 'fail', got {self.on_denial!r}")
        if self.on_approval_needed is not None and not callable(self.on_approval_needed):
            raise ValueError(
                f"Workflow {self.name!r}: on_approval_needed must be callable or None, got {self.on_approval_needed!r}"
            )
        object.__setattr__(self, "steps", steps)
        object.__setattr__(self, "_index", {n: i for i, n in enumerate(names)})

    def position(self, step: str) -> int:
        """Return the 1-based position of step ``step``.

        Args:
            step: A step name.

        Returns:
            Its position.

        Raises:
            KeyError: No step has that name.
        """
        return self._index[step] + 1


class StepContext:
    """What a step body gets: the run's input, the results before it, its checkpoint, a log and its state.

    Attributes:
        workflow: The workflow's name.
        task_id: The run's task id.
        step: The step's name.
        input: The run's input (decoded JSON).
        previous: The results of the steps before this one, by step name (rebuilt from the record on a resume).
        last_checkpoint: The data of this step's last canonical checkpoint, or None (a body resumed after a crash
            reads where it got to).
        run_id: The run's id (stable across attempts).
    """

    def __init__(
        self, run: WorkflowRun, step: Step, previous: Mapping[str, Any], last_checkpoint: Any, retry: int
    ) -> None:
        self._run = run
        self._retry = retry
        self._over = False  # set when the execution ended (returned, failed or timed out): late calls are refused
        self.workflow = run.workflow.name
        self.task_id = run.task_id
        self.step = step.name
        self.input = run.input
        self.previous: dict[str, Any] = dict(previous)
        self.last_checkpoint = last_checkpoint
        self.run_id = run.run_id

    async def checkpoint(self, data: Any) -> None:
        """Record ``data`` as this step's checkpoint; return once it is canonical (committed to the log).

        After a crash the step's body runs again with ``last_checkpoint`` = the last checkpoint that committed.

        Args:
            data: A JSON value.

        Raises:
            CanonicalJsonError: ``data`` is not representable as canonical JSON.
            ValueError: ``data`` is larger than `RunOptions.max_result_bytes`.
            RuntimeError: The step's execution is over (a body that ran past ``step_timeout``).
        """
        self._check_live("checkpoint")
        await self._run.checkpoint(self.step, data)
        self.last_checkpoint = data

    def log(self, message: str) -> None:
        """Record a log line of this step, committed with the run's next record.

        The next record is a checkpoint, the step's result or the reply; the line is lost if the attempt dies first.

        Args:
            message: The line.

        Raises:
            TypeError: ``message`` is not a string.
            RuntimeError: The step's execution is over (a body that ran past ``step_timeout``).
        """
        self._check_live("log")
        if not isinstance(message, str):
            raise TypeError(f"StepContext.log: message must be a str, got {type(message).__name__}")
        self._run.log(self.step, message)

    def get_state(self) -> StepState:
        """Return where the run is: this step, its position, the number of steps, the attempt.

        Returns:
            The state.
        """
        return StepState(
            step=self.step,
            current_step=self._run.workflow.position(self.step),
            total_steps=len(self._run.workflow.steps),
            attempt=self._run.attempt,
            retry=self._retry,
        )

    def _check_live(self, what: str) -> None:
        if self._over:
            raise RuntimeError(f"step {self.step!r}: {what} after its execution ended (timed out); nothing recorded")

    def end(self) -> None:
        """Mark the execution over: a late ``checkpoint`` or ``log`` (a timed-out body still running) is refused."""
        self._over = True
