"""The BFCL app: BFCL's backend methods as settled tools behind the tool server, the replay model as the provider.

Issue 8, Build item 4; docs/design.md §9. Workers load it with ``settled worker --app settled_bfcl._app:app``.

* **Submissions.** Each user turn is one submission whose input is ``{"entry_id", "turn", "text"}`` (see
  `turn_input`) and whose ``tools_offered`` are the turn's tools (a miss_func turn lacks its held-out function).
* **The agent** is settled's `ModelAgent` with `ReplayProvider`: the provider turns the runtime's prompt (the turn's
  user message, the assistant's declared calls and the tool results so far) into the replay model's history and
  answers with its next calls (call ids ``<entry>/t<k>/c<j>``) or the final text. The model is stateless, so a
  re-asked model after a crash or a takeover gives the same answer.
* **Tools.** Every one of BFCL's 128 backend methods is a registered tool. A call goes to the tool server with the
  runtime's idempotency key and the owner epoch (docs/design.md §3, §5) and the *model's* call id, which the tool server
  records in its ledger. The agent hands each tool ``{"conversation_id", "entry_id", "call_id", "arguments"}``
  (`BfclAgent`): the tool function itself only gets its arguments and a `ToolCall`, not the model's call id.
* **Number types.** settled stores arguments as RFC 8785 canonical JSON, which writes ``15.0`` as ``15``; BFCL's
  backends tell them apart. The tool restores the ground truth's JSON number types by call id when the received
  arguments are canonically equal to the ground truth's, so the tool server sees the corpus's original values.
* **Approvals** (``--approvals``, issue 16 item 8): every call of a state-changing method
  (`settled_bfcl._approvals.STATE_CHANGING_METHODS`) waits for a signed decision before it runs; the operator's key
  is the app's only ``approver_keys`` entry. Those tools are registered with ``needs_approval=True`` (issue 16 item
  5): ``ctx.tool`` pauses before the call is prepared; a denied call never runs (`ToolApprovalDeniedError`) and the
  model gets settled's structured denial (`settled.runtime.denial_result`) as its result.
* **Idempotency.** A method is declared ``idempotent`` unless its class is named in the ``no_idempotency`` setting
  (the tool server's ``--no-idempotency``): then a call interrupted in doubt is Unknown (DUR-009) and waits for a
  signed ``ResolveUnknown`` (the demo's operator step). A transport error (no answer) is raised as
  `ToolTransportError`, never recorded as a result (docs/design.md §5).

Configuration comes from the environment, read when the app is first built (never at import): see `BfclAppConfig`.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import threading
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from settled.runtime import (
    App,
    Message,
    ModelAgent,
    ModelEvent,
    ModelProvider,
    ModelRequest,
    ModelResponse,
    OpenAIChat,
    OpenAISettings,
    ProviderError,
    RunContext,
    RunOptions,
    ToolApprovalDeniedError,
    ToolCall,
    ToolCallError,
    ToolTransportError,
    declared_call,
    denial_result,
)
from settled.schemas import CanonicalJsonError, DeclaredToolCall, canonical_json
from settled_bfcl._approvals import APPROVER_KEY_ID, needs_approval
from settled_bfcl._backends import BACKEND_CLASSES, JsonValue, method_index
from settled_bfcl._client import ToolServerClient
from settled_bfcl._corpus import CATEGORIES, Corpus, Entry, load_corpus, load_tool_docs
from settled_bfcl._replay import (
    AssistantText,
    AssistantToolCalls,
    ModelToolCall,
    ReplayError,
    ReplayMode,
    ReplayModel,
    ToolResultMessage,
    UserMessage,
)
from settled_bfcl._replay import Message as ReplayMessage

__all__ = [
    "APP_REFERENCE",
    "ENV_ADVERSARIAL",
    "ENV_APPROVALS",
    "ENV_APPROVER_KEY",
    "ENV_MODE",
    "ENV_NO_IDEMPOTENCY",
    "ENV_RESOLVER_KEY",
    "ENV_SEED",
    "ENV_TOOLSERVER_URL",
    "RESOLVER_KEY_ID",
    "BfclAgent",
    "BfclAppConfig",
    "ReplayProvider",
    "TurnInput",
    "build_app",
    "category_of",
    "turn_input",
]

#: The ``--app`` reference workers load.
APP_REFERENCE = "settled_bfcl._app:app"
#: The tool server's base URL, e.g. ``http://127.0.0.1:8765`` (required).
ENV_TOOLSERVER_URL = "SETTLED_BFCL_TOOLSERVER_URL"
#: The replay mode (`ReplayMode` value; default ``one_call``).
ENV_MODE = "SETTLED_BFCL_MODE"
#: The replay model's chunking seed (default 0).
ENV_SEED = "SETTLED_BFCL_SEED"
#: ``1`` for the replay model's adversarial mode (default off).
ENV_ADVERSARIAL = "SETTLED_BFCL_ADVERSARIAL"
#: Comma-separated backend classes whose methods are not idempotent (the tool server's ``--no-idempotency``).
ENV_NO_IDEMPOTENCY = "SETTLED_BFCL_NO_IDEMPOTENCY"
#: Base64 of the operator's raw 32-byte Ed25519 public key, allowed to sign ``ResolveUnknown`` (docs/design.md §4).
ENV_RESOLVER_KEY = "SETTLED_BFCL_RESOLVER_KEY"
#: The key id the operator signs with.
RESOLVER_KEY_ID = "bfcl-operator"
#: ``1`` to gate every state-changing call behind an approval (``--approvals``; default off).
ENV_APPROVALS = "SETTLED_BFCL_APPROVALS"
#: Base64 of the approver's raw 32-byte Ed25519 public key, allowed to sign ``DecideApproval`` (key id
#: `settled_bfcl._approvals.APPROVER_KEY_ID`).
ENV_APPROVER_KEY = "SETTLED_BFCL_APPROVER_KEY"
#: The model provider: ``replay`` (the replay model in process, the default) or ``openai`` (`OpenAIChat`, configured
#: by ``SETTLED_MODEL_BASE_URL``, ``SETTLED_MODEL_NAME`` and ``SETTLED_MODEL_API_KEY``; issue 19).
ENV_PROVIDER = "SETTLED_BFCL_PROVIDER"
#: The providers `BfclAppConfig.provider` accepts.
PROVIDERS = ("replay", "openai")

_PROVIDER_NAME = "bfcl-replay"
_TRUE = frozenset({"1", "true", "yes", "on"})


def category_of(entry_id: str) -> str:
    """Return the corpus category of a BFCL entry id.

    Args:
        entry_id: E.g. ``"multi_turn_base_7"``.

    Returns:
        E.g. ``"base"``.

    Raises:
        ValueError: The id names no multi-turn category.
    """
    short = entry_id.rsplit("_", 1)[0].removeprefix("multi_turn_")
    if short not in CATEGORIES or not entry_id.startswith("multi_turn_"):
        raise ValueError(f"entry_id {entry_id!r} names no multi-turn category (known: {', '.join(CATEGORIES)})")
    return short


@functools.cache
def _corpus(category: str) -> Corpus:
    return load_corpus(category)


def _entry(entry_id: str) -> Entry:
    return _corpus(category_of(entry_id)).get(entry_id)


@dataclass(frozen=True, slots=True)
class TurnInput:
    """A submission's input: which entry and turn it replays, and the user's text.

    Attributes:
        entry_id: The BFCL entry.
        turn: The zero-based turn index.
        text: The user's text (`settled_bfcl.Turn.user_text`).
    """

    entry_id: str
    turn: int
    text: str

    @classmethod
    def parse(cls, text: str) -> TurnInput:
        """Parse a submission's input (canonical JSON text, as the prompt's user message carries it).

        Args:
            text: ``{"entry_id": ..., "turn": ..., "text": ...}`` as JSON.

        Returns:
            The input.

        Raises:
            ValueError: The text is not such an object (names the field).
        """
        try:
            value = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"BFCL turn input is not JSON: {text[:120]!r}") from exc
        if not isinstance(value, dict):
            raise ValueError(f"BFCL turn input must be an object, got {text[:120]!r}")
        entry_id, turn, user = value.get("entry_id"), value.get("turn"), value.get("text")
        if not isinstance(entry_id, str):
            raise ValueError(f"BFCL turn input: entry_id must be a string, got {entry_id!r}")
        if isinstance(turn, bool) or not isinstance(turn, int) or turn < 0:
            raise ValueError(f"BFCL turn input: turn must be an int >= 0, got {turn!r}")
        if not isinstance(user, str):
            raise ValueError(f"BFCL turn input: text must be a string, got {user!r}")
        return cls(entry_id, turn, user)


def turn_input(entry: Entry, turn_index: int) -> dict[str, Any]:
    """Return the submission input of one turn of an entry.

    Args:
        entry: The entry.
        turn_index: The turn.

    Returns:
        ``{"entry_id", "turn", "text"}``.
    """
    return {"entry_id": entry.id, "turn": turn_index, "text": entry.turns[turn_index].user_text}


@dataclass(frozen=True)
class BfclAppConfig:
    """How the BFCL app runs (read from the environment by `from_env`).

    Attributes:
        toolserver_url: The tool server's base URL.
        mode: The replay model's chunking mode.
        seed: The replay model's chunking seed.
        adversarial: The replay model's adversarial mode.
        non_idempotent_classes: Backend classes whose methods are declared not idempotent.
        resolver_key_b64: The operator's Ed25519 public key (base64), or empty for none.
        approvals: Gate every state-changing call behind an approval.
        approver_key_b64: The approver's Ed25519 public key (base64); required with ``approvals``.
        provider: ``replay`` (the replay model, in process) or ``openai`` (`OpenAIChat` against
            ``model_base_url``, e.g. a real model endpoint or `settled_bfcl._replay_server`).
        model_base_url: The OpenAI-compatible endpoint's base URL (``openai`` only).
        model_name: The model name sent to it (``openai`` only).
        tool_timeout_s: ``timeout_s`` of every tool.
        retry_budget_s: How long an in-doubt idempotent call is retried within one attempt (a tool-server restart
            must fit in it).
        http_timeout_s: Timeout of one HTTP request to the tool server.
        max_attempts: Attempts per submission (docs/design.md §5).
        concurrency: Runs at once per worker process.
    """

    toolserver_url: str
    mode: ReplayMode = ReplayMode.ONE_CALL
    seed: int = 0
    adversarial: bool = False
    non_idempotent_classes: frozenset[str] = field(default_factory=frozenset)
    resolver_key_b64: str = ""
    approvals: bool = False
    approver_key_b64: str = ""
    provider: str = "replay"
    model_base_url: str = ""
    model_name: str = ""
    tool_timeout_s: float = 20.0
    retry_budget_s: float = 90.0
    http_timeout_s: float = 15.0
    max_attempts: int = 3
    concurrency: int = 16

    def __post_init__(self) -> None:
        """Check the values.

        Raises:
            ValueError: An unknown backend class, an empty URL, a timeout that is not positive, or approvals without
                an approver key.
        """
        if not self.toolserver_url:
            raise ValueError(f"{ENV_TOOLSERVER_URL} is empty: the BFCL app needs the tool server's URL")
        if self.approvals and not self.approver_key_b64:
            raise ValueError(f"{ENV_APPROVALS}=1 needs {ENV_APPROVER_KEY}: nobody could decide an approval")
        if self.provider not in PROVIDERS:
            raise ValueError(f"{ENV_PROVIDER}={self.provider!r}: expected one of {', '.join(PROVIDERS)}")
        if self.provider == "openai" and not (self.model_base_url and self.model_name):
            raise ValueError(
                f"{ENV_PROVIDER}=openai needs SETTLED_MODEL_BASE_URL and SETTLED_MODEL_NAME, got "
                f"{self.model_base_url!r} and {self.model_name!r}"
            )
        unknown = sorted(self.non_idempotent_classes - set(BACKEND_CLASSES))
        if unknown:
            raise ValueError(f"non_idempotent_classes: unknown backend classes {unknown}; known: {BACKEND_CLASSES}")
        for name in ("tool_timeout_s", "retry_budget_s", "http_timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"BfclAppConfig.{name} must be > 0, got {getattr(self, name)}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> BfclAppConfig:
        """Read the configuration from ``SETTLED_BFCL_*`` variables.

        Args:
            environ: The environment (``os.environ`` when None).

        Returns:
            The configuration.

        Raises:
            ValueError: A variable is missing or malformed (the variable is named).
        """
        env = os.environ if environ is None else environ
        mode_text = env.get(ENV_MODE, ReplayMode.ONE_CALL.value)
        try:
            mode = ReplayMode(mode_text)
        except ValueError:
            known = ", ".join(m.value for m in ReplayMode)
            raise ValueError(f"{ENV_MODE}={mode_text!r} is not a replay mode; known: {known}") from None
        seed_text = env.get(ENV_SEED, "0")
        try:
            seed = int(seed_text)
        except ValueError:
            raise ValueError(f"{ENV_SEED}={seed_text!r} is not an integer") from None
        classes = frozenset(c.strip() for c in env.get(ENV_NO_IDEMPOTENCY, "").split(",") if c.strip())
        return cls(
            toolserver_url=env.get(ENV_TOOLSERVER_URL, ""),
            mode=mode,
            seed=seed,
            adversarial=env.get(ENV_ADVERSARIAL, "").strip().lower() in _TRUE,
            non_idempotent_classes=classes,
            resolver_key_b64=env.get(ENV_RESOLVER_KEY, ""),
            approvals=env.get(ENV_APPROVALS, "").strip().lower() in _TRUE,
            approver_key_b64=env.get(ENV_APPROVER_KEY, ""),
            provider=env.get(ENV_PROVIDER, "replay"),
            model_base_url=env.get(_ENV_MODEL_BASE_URL, ""),
            model_name=env.get(_ENV_MODEL_NAME, ""),
        )

    def env(self) -> dict[str, str]:
        """Return the environment variables that give a worker process this configuration.

        Returns:
            ``SETTLED_BFCL_*`` variables and ``SETTLED_MODEL_BASE_URL``/``SETTLED_MODEL_NAME`` (the timeouts and
            limits are not carried; they keep their defaults).
        """
        return {
            ENV_TOOLSERVER_URL: self.toolserver_url,
            ENV_MODE: self.mode.value,
            ENV_SEED: str(self.seed),
            ENV_ADVERSARIAL: "1" if self.adversarial else "0",
            ENV_NO_IDEMPOTENCY: ",".join(sorted(self.non_idempotent_classes)),
            ENV_RESOLVER_KEY: self.resolver_key_b64,
            ENV_APPROVALS: "1" if self.approvals else "0",
            ENV_APPROVER_KEY: self.approver_key_b64,
            ENV_PROVIDER: self.provider,
            _ENV_MODEL_BASE_URL: self.model_base_url,
            _ENV_MODEL_NAME: self.model_name,
        }


_ENV_MODEL_BASE_URL = "SETTLED_MODEL_BASE_URL"
_ENV_MODEL_NAME = "SETTLED_MODEL_NAME"


# --- the provider --------------------------------------------------------------------------------------------------


def _replay_history(messages: Sequence[Message]) -> tuple[TurnInput, list[ReplayMessage]]:
    """The turn's input and the replay model's history: the last user message and what follows it."""
    last_user = max((i for i, m in enumerate(messages) if m.role == "user"), default=None)
    if last_user is None:
        raise ProviderError("the prompt has no user message", retryable=False)
    try:
        turn = TurnInput.parse(messages[last_user].text)
    except ValueError as exc:
        raise ProviderError(str(exc), retryable=False) from exc
    history: list[ReplayMessage] = [UserMessage(turn.text)]
    for message in messages[last_user + 1 :]:
        if message.role == "assistant":
            if message.tool_calls:
                history.append(
                    AssistantToolCalls(
                        tuple(ModelToolCall(c.call_id, c.tool, json.loads(c.args_json)) for c in message.tool_calls)
                    )
                )
            else:
                history.append(AssistantText(message.text))
        elif message.role == "tool":
            history.append(ToolResultMessage(message.call_id or "", message.text, message.is_error))
    return turn, history


class ReplayProvider:
    """The replay model as a settled `ModelProvider` (stateless: the answer is a function of the prompt).

    Args:
        mode: The chunking mode.
        seed: The chunking seed.
        adversarial: Call the missing function before each miss_func holdout turn.
    """

    def __init__(self, mode: ReplayMode = ReplayMode.ONE_CALL, *, seed: int = 0, adversarial: bool = False) -> None:
        self._mode = mode
        self._seed = seed
        self._adversarial = adversarial
        self._models: dict[str, ReplayModel] = {}
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        """The provider's name, recorded with every response."""
        return _PROVIDER_NAME

    def _model(self, category: str) -> ReplayModel:
        with self._lock:
            model = self._models.get(category)
            if model is None:
                model = ReplayModel(_corpus(category), self._mode, seed=self._seed, adversarial=self._adversarial)
                self._models[category] = model
            return model

    def answer(self, request: ModelRequest) -> ModelResponse:
        """Answer one request (what `stream` yields).

        Args:
            request: The prompt.

        Returns:
            The next tool calls, or the turn's final text.

        Raises:
            ProviderError: The prompt does not fit the entry's plan (not retryable: the same prompt fails again).
        """
        turn, history = _replay_history(request.messages)
        try:
            model = self._model(category_of(turn.entry_id))
            response = model.respond(turn.entry_id, turn.turn, history)
        except (ReplayError, ValueError, KeyError) as exc:
            raise ProviderError(f"replay model: {exc}", retryable=False) from exc
        if response.text is not None:
            return ModelResponse(response.text, model=f"{_PROVIDER_NAME}-{self._mode.value}")
        calls = tuple(declared_call(c.call_id, c.tool_name, c.arguments) for c in response.tool_calls)
        return ModelResponse("", calls, model=f"{_PROVIDER_NAME}-{self._mode.value}")

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        """Yield the one complete response (the replay model streams no deltas).

        Args:
            request: The prompt.

        Yields:
            The response.
        """
        yield self.answer(request)


# --- the agent -----------------------------------------------------------------------------------------------------


class BfclAgent(ModelAgent):
    """`ModelAgent` whose tool calls carry the conversation, the entry and the model's call id to the tool.

    The tool server's ledger records the model's call id (``<entry>/t<k>/c<j>``), which a tool function cannot see
    otherwise; everything else is `ModelAgent`'s loop (calls run one at a time, in declaration order). A denied call
    (``--approvals``: `ToolApprovalDeniedError`, the tool never ran) is answered with settled's structured denial,
    as `ModelAgent` does.
    """

    async def _run_calls(
        self, ctx: RunContext, calls: Sequence[DeclaredToolCall], offered: Sequence[str]
    ) -> list[Message]:
        turn = TurnInput.parse(ctx.input_json)
        out: list[Message] = []
        for call in calls:
            args = {
                "conversation_id": ctx.conversation_id,
                "entry_id": turn.entry_id,
                "call_id": call.call_id,
                "arguments": json.loads(call.args_json),
            }
            try:
                result = await ctx.tool(call.tool, args, offered=offered)
            except ToolApprovalDeniedError as exc:  # not an error: the model is told who said no (issue 16 item 5)
                denial = denial_result(exc.tool, exc.by, exc.reason)
                out.append(Message("tool", canonical_json(denial), call_id=call.call_id))
                continue
            except ToolCallError as exc:  # an application error or a refusal: the model sees it (docs/design.md §5)
                out.append(
                    Message("tool", f"error: {exc.error_type}: {exc.message}", call_id=call.call_id, is_error=True)
                )
                continue
            out.append(Message("tool", canonical_json(result), call_id=call.call_id))
        return out


# --- the tools -----------------------------------------------------------------------------------------------------


def _original_arguments(entry_id: str, call_id: str, method: str, received: dict[str, Any]) -> dict[str, JsonValue]:
    """The ground truth's arguments (with their JSON number types) when ``received`` equals them canonically."""
    try:
        truth = _entry(entry_id).call(call_id)
    except (KeyError, ValueError):
        return received
    original = dict(truth.arguments)
    try:
        same = truth.method == method and canonical_json(original) == canonical_json(received)
    except CanonicalJsonError:
        same = False
    return copy.deepcopy(original) if same else received


class _Tools:
    """The tool functions' shared tool-server client (one per worker process, created at the first call)."""

    def __init__(self, config: BfclAppConfig) -> None:
        self._config = config
        self._client: ToolServerClient | None = None
        self._lock = threading.Lock()

    def client(self) -> ToolServerClient:
        with self._lock:
            if self._client is None:
                self._client = ToolServerClient(self._config.toolserver_url, timeout_s=self._config.http_timeout_s)
            return self._client

    def call(self, method: str, args: dict[str, Any], call: ToolCall) -> str:
        """Run one backend call on the tool server; return BFCL's output string."""
        for name in ("conversation_id", "entry_id", "call_id"):
            if not isinstance(args.get(name), str):
                raise ValueError(f"tool {method!r}: argument {name!r} must be a string, got {args.get(name)!r}")
        arguments = args.get("arguments")
        if not isinstance(arguments, dict):
            raise ValueError(f"tool {method!r}: argument 'arguments' must be an object, got {arguments!r}")
        original = _original_arguments(args["entry_id"], args["call_id"], method, arguments)
        try:
            response = self.client().call(
                args["conversation_id"],
                method,
                original,
                idempotency_key=call.idempotency_key,
                owner_epoch=call.owner_epoch,
                call_id=args["call_id"],
            )
        except httpx.TransportError as exc:  # no answer: in doubt, never a result (docs/design.md §5)
            raise ToolTransportError(f"tool server {self._config.toolserver_url}: {type(exc).__name__}: {exc}") from exc
        return response.output


def build_app(config: BfclAppConfig) -> App:
    """Build the BFCL app: the replay agent and one tool per backend method.

    Args:
        config: The configuration.

    Returns:
        The app.
    """
    provider: ModelProvider
    if config.provider == "openai":  # settings (base URL, model, key) from SETTLED_MODEL_* (issue 19)
        provider = OpenAIChat(OpenAISettings(base_url=config.model_base_url, name=config.model_name))
        model = "default"
    else:
        provider = ReplayProvider(config.mode, seed=config.seed, adversarial=config.adversarial)
        model = f"{_PROVIDER_NAME}-{config.mode.value}"
    docs = load_tool_docs()
    keys = {RESOLVER_KEY_ID: config.resolver_key_b64} if config.resolver_key_b64 else {}
    approvers = {APPROVER_KEY_ID: config.approver_key_b64} if config.approvals else {}
    app = App(
        agent=BfclAgent(provider, model=model, max_turns=32),
        max_attempts=config.max_attempts,
        resolver_keys=keys,
        approver_keys=approvers,
        concurrency=config.concurrency,
        options=RunOptions(abort_grace_s=2.0, delta_flush_every=0),
    )
    tools = _Tools(config)
    for spec in sorted(method_index().values(), key=lambda s: s.name):

        def fn(args: dict[str, Any], call: ToolCall, _method: str = spec.name) -> str:
            return tools.call(_method, args, call)

        fn.__doc__ = f"BFCL {spec.class_name}.{spec.name} on the tool server."
        app.tool(
            fn,
            name=spec.name,
            idempotent=spec.class_name not in config.non_idempotent_classes,
            needs_approval=config.approvals and needs_approval(spec.name),
            timeout_s=config.tool_timeout_s,
            retry_budget_s=config.retry_budget_s,
            # What a model is told: BFCL's own tool doc (BfclAgent wraps the model's arguments for the tool server).
            description=docs[spec.name].description if spec.name in docs else None,
            parameters=docs[spec.name].json_schema() if spec.name in docs else None,
        )
    return app


@functools.lru_cache(maxsize=1)
def _app_from_env() -> App:
    return build_app(BfclAppConfig.from_env())


def __getattr__(name: str) -> App:
    """Build ``app`` from the environment at first access (``settled worker --app settled_bfcl._app:app``).

    Args:
        name: The attribute.

    Returns:
        The app.

    Raises:
        AttributeError: Any other attribute.
    """
    if name == "app":
        return _app_from_env()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
