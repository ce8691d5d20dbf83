"""The app object agent authors hand to ``settled worker --app package.module:app`` (docs/design.md §11; issue 6).

::

    app = App(agent=my_agent, resolver_keys={"ops-1": "<base64 Ed25519 public key>"})

    @app.tool(idempotent=True, timeout_s=10)
    def charge(args: dict, call: ToolCall) -> dict:
        return payments.charge(args["amount"], idempotency_key=call.idempotency_key, fence=call.owner_epoch)

    @app.tool(idempotent=True, approval_policy=lambda args: "ask" if args["amount"] > 100 else "allow")
    def refund(args: dict, call: ToolCall) -> dict:  # above 100, a person approves first (`Client.approve`)
        return payments.refund(args["amount"], idempotency_key=call.idempotency_key)

    async def my_agent(ctx: RunContext) -> dict:
        receipt = await ctx.tool("charge", {"amount": 5})
        return {"receipt": receipt, "at": ctx.now().isoformat()}

    app.workflow(Workflow("process-invoice", steps=[Step("extract", extract), Step("save", save)]))

A submission started by ``Client.run_workflow`` names its workflow (`settled.protocol.workflow_input`); the worker
runs that workflow (`settled/runtime/_workflow_run.py`) instead of the agent (issue 17). A submission whose input is
`settled.protocol.flow_input` runs a turn of that flow (``app.flow(Flow(...))``, `settled/runtime/_flow_run.py`;
issue 18).
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar, overload

from settled._errors import ErrorCategory, SettledError
from settled.processors import RunFailedError
from settled.protocol import DEFAULT_LANE, LanePolicy, flow_invocation, workflow_invocation
from settled.runtime._context import RunContext
from settled.runtime._errors import UnsafeToolsError
from settled.runtime._flow import Flow
from settled.runtime._flow_run import run_flow
from settled.runtime._options import RunOptions
from settled.runtime._runloop import AgentFunction, RunLoopLauncher, RunPermits
from settled.runtime._tools import ApprovalPolicy, Reconciler, ToolFunction, ToolRegistry, ToolSpec
from settled.runtime._workflow import Workflow
from settled.runtime._workflow_run import run_workflow

__all__ = ["App", "AppLoadError", "load_app"]

F = TypeVar("F", bound=ToolFunction)


class AppLoadError(SettledError, ValueError):
    """``--app`` does not name an `App` (the message names the reference and what was found)."""

    category = ErrorCategory.BAD_INPUT


@dataclass(frozen=True)
class App:
    """What a worker runs.

    Attributes:
        agent: ``async def agent(ctx: RunContext) -> reply``: the reply is any JSON value; an uncaught error ends
            the attempt (``max_attempts`` bounds the retries). None: the app runs workflows only (a submission
            that names none fails with ``no_agent``).
        max_attempts: Attempts per submission before it settles failed (docs/design.md §5): a death or an uncaught
            retryable error is charged; the submission then settles failed with error type
            ``retry_budget_exhausted`` (a dead letter, issue 22 item 4).
        attempt_backoff_base_ms: The backoff before a submission's first retry, in milliseconds, doubled for each
            later retry, plus up to 20% jitter (a timed wait holding no worker slot; issue 22 item 4).
        attempt_backoff_max_ms: The longest backoff between two attempts of a submission, in milliseconds.
        resolver_keys: Ed25519 public keys (base64 of the raw 32 bytes) allowed to sign ``ResolveUnknown``, by key id.
        approver_keys: Ed25519 public keys (base64 of the raw 32 bytes) allowed to sign ``DecideApproval`` (approve
            or deny), by key id; the key id is who decided ("by").
        api_keys: Ed25519 public keys (base64 of the raw 32 bytes) of HTTP APIs (``settled api --signing-key``), by
            key id: records they sign carry their caller's principal and are access-checked (issue 20).
        concurrency: Runs at once in one worker process (its concurrency permits).
        tools: The registered tools (`tool` adds to it).
        options: How runs execute effects (clock, abort grace, result size limit, model retries).
        keep_history: Hand runs the conversation's earlier settled submissions (`RunContext.history`); on by
            default for an agent with ``needs_history`` (the model-driven `ModelAgent`).
        workflows: The registered workflows by name (`workflow` adds to it; issue 17).
        flows: The registered flows by name (`flow` adds to it; issue 18).
        lane: The lane policy of a conversation whose opening submission names none (issue 22 item 1; a string
            such as ``"reject"`` is accepted): recorded on that admission, so changing it later changes only
            conversations opened later.

    Raises:
        ValueError: ``max_attempts`` or ``concurrency`` is below 1, the attempt backoffs are negative or the
            maximum is below the base, or ``lane`` is not a lane policy.
    """

    agent: AgentFunction | None
    max_attempts: int = 3
    attempt_backoff_base_ms: int = 100
    attempt_backoff_max_ms: int = 60_000
    resolver_keys: Mapping[str, str] = field(default_factory=dict)
    approver_keys: Mapping[str, str] = field(default_factory=dict)
    api_keys: Mapping[str, str] = field(default_factory=dict)
    concurrency: int = 16
    tools: ToolRegistry = field(default_factory=ToolRegistry)
    options: RunOptions = field(default_factory=RunOptions)
    keep_history: bool | None = None
    workflows: dict[str, Workflow] = field(default_factory=dict)
    flows: dict[str, Flow] = field(default_factory=dict)
    lane: LanePolicy = DEFAULT_LANE

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "lane", LanePolicy(self.lane))
        except ValueError as exc:
            choices = ", ".join(p.value for p in LanePolicy)
            raise ValueError(f"App.lane must be one of {choices}, got {self.lane!r}") from exc
        if self.max_attempts < 1:
            raise ValueError(f"App.max_attempts must be >= 1, got {self.max_attempts}")
        if self.concurrency < 1:
            raise ValueError(f"App.concurrency must be >= 1, got {self.concurrency}")
        if not 0 <= self.attempt_backoff_base_ms <= self.attempt_backoff_max_ms:
            raise ValueError(
                "App.attempt_backoff_base_ms must be >= 0 and <= attempt_backoff_max_ms, got "
                f"attempt_backoff_base_ms={self.attempt_backoff_base_ms}, "
                f"attempt_backoff_max_ms={self.attempt_backoff_max_ms}"
            )

    @overload
    def tool(self, fn: F, /) -> F: ...

    @overload
    def tool(
        self,
        fn: None = None,
        /,
        *,
        name: str | None = None,
        idempotent: bool = False,
        reconcile: Reconciler | None = None,
        idempotency_key: Callable[[dict[str, Any]], str] | None = None,
        timeout_s: float = 30.0,
        parallel_safe: bool = False,
        retry_budget_s: float = 30.0,
        needs_approval: bool = False,
        approval_policy: ApprovalPolicy | None = None,
        description: str | None = None,
        parameters: Mapping[str, Any] | None = None,
    ) -> Callable[[F], F]: ...

    @overload
    def tool(
        self,
        fn: F,
        /,
        *,
        name: str | None = None,
        idempotent: bool = False,
        reconcile: Reconciler | None = None,
        idempotency_key: Callable[[dict[str, Any]], str] | None = None,
        timeout_s: float = 30.0,
        parallel_safe: bool = False,
        retry_budget_s: float = 30.0,
        needs_approval: bool = False,
        approval_policy: ApprovalPolicy | None = None,
        description: str | None = None,
        parameters: Mapping[str, Any] | None = None,
    ) -> F: ...

    def tool(
        self,
        fn: F | None = None,
        /,
        *,
        name: str | None = None,
        idempotent: bool = False,
        reconcile: Reconciler | None = None,
        idempotency_key: Callable[[dict[str, Any]], str] | None = None,
        timeout_s: float = 30.0,
        parallel_safe: bool = False,
        retry_budget_s: float = 30.0,
        needs_approval: bool = False,
        approval_policy: ApprovalPolicy | None = None,
        description: str | None = None,
        parameters: Mapping[str, Any] | None = None,
    ) -> F | Callable[[F], F]:
        """Register a tool; use as ``@app.tool`` or ``@app.tool(idempotent=True, timeout_s=5)`` (see `ToolSpec`).

        Args:
            fn: The tool (when used without arguments).
            name: Its name (default: the function's name).
            idempotent: Safe to execute again under the same idempotency key.
            reconcile: ``reconcile(key, args)`` → a `settled.protocol.Reconciliation`.
            idempotency_key: ``idempotency_key(args)`` → the key, replacing the default digest.
            timeout_s: How long one execution may take.
            parallel_safe: Calls may overlap.
            retry_budget_s: How long an in-doubt safe call is retried within one attempt.
            needs_approval: Every call waits for a person's signed approval before it runs (issue 16 item 5).
            approval_policy: ``approval_policy(args)`` → ``"allow"`` / ``"ask"`` / ``"deny"`` (an
                `settled.runtime.ApprovalVerdict`) per call; exclusive with ``needs_approval``.
            description: What the tool does, as a model is told (default: the function's docstring).
            parameters: JSON Schema (``type: object``) of its arguments, as a model is told (default: any object).

        Returns:
            The function unchanged (or a decorator that registers and returns it).

        Raises:
            ValueError: A tool of that name is already registered, or a value is invalid.
        """

        def register(f: F) -> F:
            self.tools.register(
                ToolSpec(
                    name=name or f.__name__,
                    fn=f,
                    idempotent=idempotent,
                    reconcile=reconcile,
                    idempotency_key=idempotency_key,
                    timeout_s=timeout_s,
                    parallel_safe=parallel_safe,
                    retry_budget_s=retry_budget_s,
                    needs_approval=needs_approval,
                    approval_policy=approval_policy,
                    description=description,
                    parameters=dict(parameters or {}),
                )
            )
            return f

        return register if fn is None else register(fn)

    def workflow(self, workflow: Workflow) -> Workflow:
        """Register a workflow: ``Client.run_workflow(workflow.name, ...)`` runs it (issue 17).

        Args:
            workflow: The workflow.

        Returns:
            The workflow unchanged.

        Raises:
            ValueError: A workflow of that name is already registered.
        """
        if workflow.name in self.workflows:
            raise ValueError(f"a workflow named {workflow.name!r} is already registered")
        self.workflows[workflow.name] = workflow
        return workflow

    def flow(self, flow: Flow) -> Flow:
        """Register a flow: a submission whose input is ``flow_input(flow.name, ...)`` runs a turn of it (issue 18).

        Args:
            flow: The flow.

        Returns:
            The flow unchanged.

        Raises:
            ValueError: A flow of that name is already registered.
        """
        if flow.name in self.flows:
            raise ValueError(f"a flow named {flow.name!r} is already registered")
        self.flows[flow.name] = flow
        return flow

    async def _dispatch(self, ctx: RunContext) -> Any:
        """The run body: the workflow or flow the submission names, else the agent."""
        try:
            invocation = workflow_invocation(ctx.input_json)
        except ValueError as exc:
            raise RunFailedError("bad_workflow_input", str(exc)) from exc
        if invocation is not None:
            return await run_workflow(ctx, self.workflows.get(invocation.name), invocation)
        try:
            flow_turn = flow_invocation(ctx.input_json)
        except ValueError as exc:
            raise RunFailedError("bad_flow_input", str(exc)) from exc
        if flow_turn is not None:
            return await run_flow(ctx, self.flows, flow_turn)
        if self.agent is None:
            raise RunFailedError("no_agent", "the app has no agent: it runs workflows and flows only")
        return await self.agent(ctx)

    def check(self) -> None:
        """Refuse a configuration that could leave a run Unknown with nobody able to resolve it (DUR-017).

        Raises:
            UnsafeToolsError: A registered tool is neither idempotent nor reconcilable and no resolver key is
                configured (the message names the tools).
        """
        unsafe = sorted(t.name for t in self.tools if not t.idempotent and t.reconcile is None)
        if unsafe and not self.resolver_keys:
            raise UnsafeToolsError(
                f"tools {unsafe} are neither idempotent nor reconcilable, and no resolver key is configured: a call "
                "of theirs in doubt would stay Unknown with nobody authorized to resolve it (DUR-017). Declare them "
                "idempotent=True or give them a reconcile=..., or configure App.resolver_keys."
            )

    @property
    def history_enabled(self) -> bool:
        """Whether the worker keeps conversation history for this app's runs."""
        if self.keep_history is not None:
            return self.keep_history
        # A flow run's later turn replays its earlier turns from the history (issue 18).
        return bool(self.flows) or bool(getattr(self.agent, "needs_history", False))

    @functools.cached_property
    def _permits(self) -> RunPermits:
        """This app's concurrency permits, shared by every conductor of the worker built with it."""
        return RunPermits(self.concurrency)

    def runner(self) -> RunLoopLauncher:
        """The run body the conductor launches on the worker's run loop, under the app's `concurrency` permits.

        Returns:
            The launcher; called, it runs one attempt and waits for it.
        """
        return RunLoopLauncher(self._dispatch, self.tools, self.options, self._permits)


def load_app(reference: str) -> App:
    """Import ``package.module:attribute`` and return the `App` it names.

    Args:
        reference: ``"package.module:app"``.

    Returns:
        The app.

    Raises:
        AppLoadError: The reference is malformed, the module or attribute is missing, or it is not an `App`.
    """
    module_name, sep, attribute = reference.partition(":")
    if not sep or not module_name or not attribute:
        raise AppLoadError(f"--app {reference!r}: expected 'package.module:attribute'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise AppLoadError(f"--app {reference!r}: cannot import {module_name!r}: {exc}") from exc
    app = getattr(module, attribute, None)
    if not isinstance(app, App):
        raise AppLoadError(f"--app {reference!r}: {attribute!r} is {type(app).__name__}, not a settled App")
    return app
