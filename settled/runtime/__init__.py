"""settled.runtime: what agent authors use — the app object, RunContext effects and tools (issue 6).

* `App` (``settled worker --app package.module:app``): the agent (``async def agent(ctx) -> reply``), its tools
  (``@app.tool(idempotent=..., reconcile=..., timeout_s=..., parallel_safe=..., needs_approval=...,
  approval_policy=...)``), limits, resolver and approver keys.
* `RunContext`: ``await ctx.tool(name, args)``, ``ctx.now()``, ``ctx.uuid()``, ``await ctx.step(name, fn, ...)``,
  ``await ctx.model(provider, messages)``, ``await ctx.signal(name)``,
  ``await ctx.approve(title, description)`` (an `ApprovalDecision`) — recorded in ``settled.log`` and replayed on
  re-entry (docs/design.md §3, §5; DUR-003, 008-010).
* `Workflow`, `Step`, `StepContext`, `StepState` (``app.workflow(Workflow(name, steps=[Step(name, fn)]))``, started by
  ``Client.run_workflow``): named multi-step runs on durable steps, with ``previous``, ``checkpoint``, ``log`` and
  ``get_state`` (issue 17).
* `Flow` with `collect`, `reply` and `action` nodes, returning `Goto`, `End` or `Handoff` (``app.flow(Flow(...))``; a
  turn names it with ``settled.protocol.flow_input``): guided conversations (issue 18).
* `ModelAgent`: the default, model-driven agent over a `ModelProvider` (`ScriptedProvider` for tests).
* Errors agent code sees: `ToolCallError` (a recorded application error, replayed), `ToolRefusedError`,
  `ToolApprovalDeniedError` (a call of a tool that needs approval was denied; a model gets `denial_result`),
  `ReplayDivergenceError`, `ToolUnavailableError`; tools raise `ToolTransportError` for "no answer".

Execution is at least once: settled records exactly one outcome per accepted submission, it does not execute
external effects exactly once (DUR-003). Idempotency keys and reconcilers are how a tool makes repeats harmless.
"""

from settled.runtime._agent import ModelAgent, denial_result, history_messages
from settled.runtime._app import App, AppLoadError, load_app
from settled.runtime._context import ApprovalDecision, RunContext
from settled.runtime._errors import (
    ReplayDivergenceError,
    RunCancelledError,
    RunSuspended,
    ToolApprovalDeniedError,
    ToolCallError,
    ToolRefusedError,
    ToolTransportError,
    ToolUnavailableError,
    UnknownToolError,
    UnsafeReplayError,
    UnsafeToolsError,
    WaitExpiredError,
)
from settled.runtime._flow import (
    Action,
    ActionFunction,
    Collect,
    End,
    Flow,
    FlowDriftError,
    FlowNode,
    Goto,
    Handoff,
    Reply,
    action,
    collect,
    reply,
)
from settled.runtime._model import (
    Message,
    ModelEvent,
    ModelProvider,
    ModelRequest,
    ModelResponse,
    ProviderError,
    ReasoningDelta,
    ScriptedProvider,
    TextDelta,
    ToolArgumentsDelta,
    ToolDeclaration,
    declared_call,
)
from settled.runtime._openai import OPERATION_ID_HEADER, OpenAIChat, OpenAISettings
from settled.runtime._options import RunOptions
from settled.runtime._runloop import AgentFunction, execute
from settled.runtime._tools import (
    ApprovalPolicy,
    ApprovalVerdict,
    ToolCall,
    ToolFunction,
    ToolRegistry,
    ToolSpec,
    never_started,
    recovered,
    still_unknown,
)
from settled.runtime._workflow import Step, StepContext, StepFunction, StepState, StepTimeoutError, Workflow

__all__ = [
    "OPERATION_ID_HEADER",
    "Action",
    "ActionFunction",
    "AgentFunction",
    "App",
    "AppLoadError",
    "ApprovalDecision",
    "ApprovalPolicy",
    "ApprovalVerdict",
    "Collect",
    "End",
    "Flow",
    "FlowDriftError",
    "FlowNode",
    "Goto",
    "Handoff",
    "Message",
    "ModelAgent",
    "ModelEvent",
    "ModelProvider",
    "ModelRequest",
    "ModelResponse",
    "OpenAIChat",
    "OpenAISettings",
    "ProviderError",
    "ReasoningDelta",
    "ReplayDivergenceError",
    "Reply",
    "RunCancelledError",
    "RunContext",
    "RunOptions",
    "RunSuspended",
    "ScriptedProvider",
    "Step",
    "StepContext",
    "StepFunction",
    "StepState",
    "StepTimeoutError",
    "TextDelta",
    "ToolApprovalDeniedError",
    "ToolArgumentsDelta",
    "ToolCall",
    "ToolCallError",
    "ToolDeclaration",
    "ToolFunction",
    "ToolRefusedError",
    "ToolRegistry",
    "ToolSpec",
    "ToolTransportError",
    "ToolUnavailableError",
    "UnknownToolError",
    "UnsafeReplayError",
    "UnsafeToolsError",
    "WaitExpiredError",
    "Workflow",
    "action",
    "collect",
    "declared_call",
    "denial_result",
    "execute",
    "history_messages",
    "load_app",
    "never_started",
    "recovered",
    "reply",
    "still_unknown",
]
