"""settled.runtime: what agent authors use — the app object, RunContext effects and tools (issue 6).

* `App` (``settled worker --app package.module:app``): the agent (``async def agent(ctx) -> reply``), its tools
  (``@app.tool(idempotent=..., reconcile=..., timeout_s=..., parallel_safe=...)``), limits and resolver keys.
* `RunContext`: ``await ctx.tool(name, args)``, ``ctx.now()``, ``ctx.uuid()``, ``await ctx.step(name, fn, ...)`` —
  recorded in ``settled.log`` and replayed on re-entry (DESIGN.md §3, §5; DUR-003, 008-010).
* Errors agent code sees: `ToolCallError` (a recorded application error, replayed), `ToolRefused`,
  `ReplayDivergence`, `ToolUnavailable`; tools raise `ToolTransportError` for "no answer".

Execution is at least once: settled records exactly one outcome per accepted submission, it does not execute
external effects exactly once (DUR-003). Idempotency keys and reconcilers are how a tool makes repeats harmless.
"""

from settled.runtime._app import App, AppLoadError, load_app
from settled.runtime._context import AgentFunction, RunContext, RunOptions, execute
from settled.runtime._errors import (
    ReplayDivergence,
    RunCancelled,
    RunSuspended,
    ToolCallError,
    ToolRefused,
    ToolTransportError,
    ToolUnavailable,
    UnknownToolError,
    UnsafeReplay,
    UnsafeToolsError,
)
from settled.runtime._tools import (
    ToolCall,
    ToolFunction,
    ToolRegistry,
    ToolSpec,
    never_started,
    recovered,
    still_unknown,
)

__all__ = [
    "AgentFunction",
    "App",
    "AppLoadError",
    "ReplayDivergence",
    "RunCancelled",
    "RunContext",
    "RunOptions",
    "RunSuspended",
    "ToolCall",
    "ToolCallError",
    "ToolFunction",
    "ToolRefused",
    "ToolRegistry",
    "ToolSpec",
    "ToolTransportError",
    "ToolUnavailable",
    "UnknownToolError",
    "UnsafeReplay",
    "UnsafeToolsError",
    "execute",
    "load_app",
    "never_started",
    "recovered",
    "still_unknown",
]
