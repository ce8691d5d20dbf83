"""Tools: declarations, the registry, and how a call reaches the tool (docs/design.md §5; docs/semantics.md §10).

A tool is a function ``fn(args, call)`` — sync or ``async`` — that gets the call's JSON arguments (a dict) and a
`ToolCall` carrying its idempotency key and the owner epoch (a fencing token: docs/design.md §3), and returns a JSON
value. It declares what makes a call in doubt safe to settle (`ToolSpec`): ``idempotent`` (safe to repeat under the
same key), a ``reconcile(key, args)`` that proves "never started", recovers the result, or answers unknown, a custom
``idempotency_key(args)``, ``timeout_s`` and ``parallel_safe``; and whether a person must approve a call before it
runs (``needs_approval``, or an ``approval_policy(args)`` answering an `ApprovalVerdict`: issue 16 item 5).

Errors are classified at the boundary: a tool that *answers* with an error (raises anything else) records an
application error that is replayed; `ToolTransportError`, `ConnectionError` and `TimeoutError` (and ``timeout_s``
expiring) mean no answer: the call is in doubt (docs/design.md §5).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import queue
import threading
from collections.abc import Awaitable, Callable, Iterator, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal, TypeVar, cast

from settled.protocol import ReconcileAnswer, Reconciliation, ToolSafety
from settled.runtime._errors import UnknownToolError
from settled.schemas import ToolCallPrepared, canonical_json, json_digest

__all__ = [
    "ApprovalPolicy",
    "ApprovalVerdict",
    "ToolCall",
    "ToolFunction",
    "ToolRegistry",
    "ToolSpec",
    "call_in_thread",
    "invoke",
    "never_started",
    "recovered",
    "start",
    "still_unknown",
]

T = TypeVar("T")

#: A tool: ``fn(args, call) -> JSON value``, sync or async.
ToolFunction = Callable[[dict[str, Any], "ToolCall"], Any]

#: A reconciler: ``reconcile(idempotency_key, args) -> Reconciliation``, sync or async.
Reconciler = Callable[[str, dict[str, Any]], Any]


class ApprovalVerdict(StrEnum):
    """What a tool's approval policy answers for one call's arguments (issue 16 item 5; docs/glossary.md).

    Attributes:
        ALLOW: The call runs without asking anyone.
        ASK: The run waits for a person's signed decision before the call runs (an approval wait).
        DENY: The call is denied by the policy at once: it never runs and the run never pauses (``by`` is
            ``"policy"``).
    """

    ALLOW = "allow"
    ASK = "ask"
    DENY = "deny"


#: A tool's approval policy: ``approval_policy(args) -> ApprovalVerdict`` (or its value, ``"allow"`` / ``"ask"`` /
#: ``"deny"``). Called with the call's decoded arguments before the call is prepared; it must be a pure function of
#: them (a replay that has not yet recorded the call's outcome asks it again).
ApprovalPolicy = Callable[[dict[str, Any]], "ApprovalVerdict | Literal['allow', 'ask', 'deny']"]

#: Who denied a call that its tool's approval policy denied (``ToolApprovalDeniedError.by``).
POLICY_DENIER = "policy"


@dataclass(frozen=True)
class ToolCall:
    """What a tool gets besides its arguments.

    Attributes:
        tool: The tool's name.
        call_id: The call's id (stable across attempts: ``<run id>#<ordinal>``).
        idempotency_key: Digest of (run id, ordinal, tool, canonical arguments) unless the tool overrides it; the
            same for every execution of this call, so the outside world can dedupe (docs/design.md §5).
        owner_epoch: The partition owner's epoch: an outside system may refuse a call below the highest it has seen
            (a zombie worker's late call; docs/design.md §3).
        submission_id: The submission.
        attempt: The attempt number executing it.
    """

    tool: str
    call_id: str
    idempotency_key: str
    owner_epoch: int
    submission_id: str
    attempt: int


def never_started(reason: str = "") -> Reconciliation:
    """A reconciler's answer: the call provably never started (it is safe to run it).

    Args:
        reason: The evidence, in words.

    Returns:
        The answer.
    """
    return Reconciliation(ReconcileAnswer.NEVER_STARTED, reason=reason)


def recovered(result: Any, reason: str = "") -> Reconciliation:
    """A reconciler's answer: the call completed and this is its result.

    Args:
        result: The recovered result, a JSON value.
        reason: The evidence, in words.

    Returns:
        The answer.

    Raises:
        CanonicalJsonError: ``result`` is not representable as canonical JSON.
    """
    return Reconciliation(ReconcileAnswer.RECOVERED, result_json=canonical_json(result), reason=reason)


def still_unknown(reason: str) -> Reconciliation:
    """A reconciler's answer: it cannot tell whether the call took effect.

    Args:
        reason: Why, in words.

    Returns:
        The answer.
    """
    return Reconciliation(ReconcileAnswer.UNKNOWN, reason=reason)


@dataclass(frozen=True)
class ToolSpec:
    """A registered tool and its declared safety (docs/design.md §5).

    Attributes:
        name: The name agent code and models call it by.
        fn: The tool.
        idempotent: Safe to execute again under the same idempotency key.
        reconcile: ``reconcile(key, args)`` → `Reconciliation` (see `never_started`, `recovered`, `still_unknown`).
        idempotency_key: ``idempotency_key(args)`` → the key, replacing the default digest (e.g. to ignore a nonce).
        timeout_s: How long one execution may take; on expiry the call is in doubt.
        parallel_safe: Calls may overlap others in the same run; otherwise the run executes them one at a time.
        retry_budget_s: How long, per call and attempt, an in-doubt idempotent or reconcilable call is retried
            under its key before the attempt gives up (the next attempt retries again).
        needs_approval: Every call waits for a person's approval before it runs (the policy that always answers
            `ApprovalVerdict.ASK`).
        approval_policy: ``approval_policy(args)`` → `ApprovalVerdict` per call (e.g. ask only above a threshold);
            exclusive with ``needs_approval``.
        description: What the tool does, as a model is told (`ModelAgent`); None: the function's docstring.
        parameters: JSON Schema of its arguments (an ``object`` schema), as a model is told; empty: any object.

    Raises:
        ValueError: ``timeout_s`` or ``retry_budget_s`` is not positive, ``name`` is empty, both
            ``needs_approval`` and ``approval_policy`` are given, or ``parameters`` is not an object schema.
    """

    name: str
    fn: ToolFunction
    idempotent: bool = False
    reconcile: Reconciler | None = None
    idempotency_key: Callable[[dict[str, Any]], str] | None = None
    timeout_s: float = 30.0
    parallel_safe: bool = False
    retry_budget_s: float = 30.0
    needs_approval: bool = False
    approval_policy: ApprovalPolicy | None = None
    description: str | None = None
    parameters: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.name.strip():
            raise ValueError("ToolSpec.name must not be empty")
        if self.parameters and self.parameters.get("type") != "object":
            raise ValueError(
                f"tool {self.name!r}: parameters must be a JSON Schema of type 'object' (a call's arguments are an "
                f"object), got type {self.parameters.get('type')!r}"
            )
        if self.needs_approval and self.approval_policy is not None:
            raise ValueError(
                f"tool {self.name!r}: give needs_approval=True or an approval_policy, not both "
                "(needs_approval is the policy that always asks)"
            )
        if self.timeout_s <= 0:
            raise ValueError(f"ToolSpec.timeout_s must be > 0, got {self.timeout_s} (tool {self.name!r})")
        if self.retry_budget_s <= 0:
            raise ValueError(f"ToolSpec.retry_budget_s must be > 0, got {self.retry_budget_s} (tool {self.name!r})")

    @property
    def model_description(self) -> str:
        """What a model is told the tool does: ``description``, else the function's docstring."""
        return self.description if self.description is not None else (self.fn.__doc__ or "").strip()

    @property
    def gated(self) -> bool:
        """Whether a call of this tool may need an approval (``needs_approval`` or an ``approval_policy``)."""
        return self.needs_approval or self.approval_policy is not None

    def approval_verdict(self, args: dict[str, Any]) -> ApprovalVerdict:
        """Return whether a call with ``args`` runs, waits for a person, or is denied by policy.

        Args:
            args: The call's decoded arguments (a copy is handed to the policy).

        Returns:
            `ApprovalVerdict.ASK` for ``needs_approval``, the policy's answer for an ``approval_policy``, else
            `ApprovalVerdict.ALLOW`.

        Raises:
            ValueError: The policy answered something other than an `ApprovalVerdict` or its value (the message
                names the tool and the value).
        """
        if self.needs_approval:
            return ApprovalVerdict.ASK
        if self.approval_policy is None:
            return ApprovalVerdict.ALLOW
        answer = self.approval_policy(dict(args))
        try:
            return ApprovalVerdict(answer)
        except ValueError:
            raise ValueError(
                f"tool {self.name!r}: approval_policy returned {answer!r}; expected one of "
                f"{[v.value for v in ApprovalVerdict]}"
            ) from None

    @property
    def safety(self) -> ToolSafety:
        """What the recovery classifier reads."""
        return ToolSafety(idempotent=self.idempotent, reconcilable=self.reconcile is not None)

    def key_for(self, run_id: str, ordinal: int, args_json: str, args: dict[str, Any]) -> str:
        """Return the call's idempotency key: the tool's own, or a digest of (run id, ordinal, tool, arguments).

        Args:
            run_id: The logical run id.
            ordinal: The callsite ordinal within the run.
            args_json: The canonical arguments.
            args: The decoded arguments (for a custom key function).

        Returns:
            The key.

        Raises:
            TypeError: A custom key function returned something that is not a non-empty string.
        """
        if self.idempotency_key is not None:
            key = self.idempotency_key(args)
            if not isinstance(key, str) or not key:
                raise TypeError(f"tool {self.name!r}: idempotency_key(args) must return a non-empty str, got {key!r}")
            return key
        return json_digest(canonical_json([run_id, ordinal, self.name, args_json]))


class _DaemonThreads:
    """Daemon threads for blocking calls: an idle one is reused, else a new one starts; idle ones end after a while.

    Not a bounded executor: a hung tool holds only its own thread, never a slot another call waits for, and daemon
    threads never keep the worker process from exiting. Reusing an idle thread saves starting one per call (~0.1 ms
    here, on every tool call's critical path; ``bench/engine.py``).
    """

    def __init__(self, idle_s: float = 60.0) -> None:
        self._idle_s = idle_s
        self._lock = threading.Lock()
        self._idle: list[queue.SimpleQueue[Callable[[], None]]] = []

    def submit(self, job: Callable[[], None]) -> None:
        with self._lock:
            inbox = self._idle.pop() if self._idle else None
        if inbox is None:
            inbox = queue.SimpleQueue()
            threading.Thread(target=self._serve, args=(inbox,), name="settled-tool", daemon=True).start()
        inbox.put(job)

    def _serve(self, inbox: queue.SimpleQueue[Callable[[], None]]) -> None:
        while True:
            try:
                job = inbox.get(timeout=self._idle_s)
            except queue.Empty:
                with self._lock:
                    if inbox in self._idle:
                        self._idle.remove(inbox)
                        return
                job = inbox.get()  # handed a job just as the wait ended
            job()
            with self._lock:
                self._idle.append(inbox)


_THREADS = _DaemonThreads()


def call_in_thread(fn: Callable[..., T], *args: Any) -> Future[T]:
    """Run a blocking function on a daemon thread (an idle one reused, else a new one); return its future.

    Daemon threads, not a bounded executor: a hung tool must not keep the worker process from exiting, nor hold a
    pool slot after its run gave up on it.

    Args:
        fn: The function.
        *args: Its arguments.

    Returns:
        A future with its result or exception.
    """
    fut: Future[T] = Future()

    def target() -> None:
        if not fut.set_running_or_notify_cancel():
            return
        try:
            fut.set_result(fn(*args))
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting side, which re-raises it
            fut.set_exception(exc)

    _THREADS.submit(target)
    return fut


def start(fn: Callable[..., Any], *args: Any) -> Awaitable[Any]:
    """Start a call without a task of its own (one event-loop step less per tool call than awaiting `invoke`).

    A sync function runs on a daemon thread (`call_in_thread`); an async one is called. The caller awaits the result
    and, when a sync function returned an awaitable (e.g. a lambda returning a coroutine), awaits that too.

    Args:
        fn: The function (sync or async).
        *args: Its arguments.

    Returns:
        An awaitable of its result.
    """
    if inspect.iscoroutinefunction(fn):
        return cast(Awaitable[Any], fn(*args))
    return asyncio.wrap_future(call_in_thread(fn, *args))


async def invoke(fn: Callable[..., Any], *args: Any) -> Any:
    """Call a sync function on a daemon thread, or await an async one, from a run's event loop.

    Args:
        fn: The function (sync or async).
        *args: Its arguments.

    Returns:
        Its result.
    """
    if inspect.iscoroutinefunction(fn):
        return await fn(*args)
    result = await asyncio.wrap_future(call_in_thread(fn, *args))
    if inspect.isawaitable(result):
        return await result
    return result


@dataclass
class ToolRegistry:
    """The app's tools by name; also what the conductor asks about safety and reconciliation (`ToolPolicy`)."""

    _tools: dict[str, ToolSpec] = field(default_factory=dict)

    def register(self, spec: ToolSpec) -> ToolSpec:
        """Add a tool.

        Args:
            spec: The declaration.

        Returns:
            ``spec``.

        Raises:
            ValueError: A tool of that name is already registered.
        """
        if spec.name in self._tools:
            raise ValueError(f"tool {spec.name!r} is already registered")
        self._tools[spec.name] = spec
        return spec

    def get(self, name: str) -> ToolSpec:
        """Return a tool by name.

        Raises:
            UnknownToolError: No tool has that name (the message lists the registered ones).
        """
        found = self._tools.get(name)
        if found is None:
            raise UnknownToolError(f"no tool named {name!r} is registered; registered: {sorted(self._tools)}")
        return found

    def __iter__(self) -> Iterator[ToolSpec]:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    def safety(self, tool: str) -> ToolSafety | None:
        """Return a tool's declared safety, or None when it is not registered (recovery then treats it as unsafe)."""
        found = self._tools.get(tool)
        return None if found is None else found.safety

    def reconcile(self, prepared: ToolCallPrepared) -> Reconciliation:
        """Ask a prepared call's tool reconciler, bounded by the tool's ``timeout_s`` (runs on the caller's thread).

        Args:
            prepared: The call's ``ToolCallPrepared`` record.

        Returns:
            The reconciler's answer.

        Raises:
            UnknownToolError: The tool is not registered.
            ValueError: The tool has no reconciler.
            TimeoutError: The reconciler did not answer within ``timeout_s``.
            TypeError: The reconciler returned something other than a `Reconciliation`.
        """
        spec = self.get(prepared.tool)
        if spec.reconcile is None:
            raise ValueError(f"tool {spec.name!r} has no reconciler")
        args = json.loads(prepared.args_json)
        answer = asyncio.run(asyncio.wait_for(invoke(spec.reconcile, prepared.idempotency_key, args), spec.timeout_s))
        if not isinstance(answer, Reconciliation):
            raise TypeError(f"tool {spec.name!r}: reconcile() must return a Reconciliation, got {answer!r}")
        return answer
