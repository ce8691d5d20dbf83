"""The BFCL multi-turn workload (issue 8; docs/design.md §9; examples/bfcl/README.md).

* Corpus: :func:`load_corpus` reads ``BFCL_v4_multi_turn_{base,miss_func,...}`` from the pinned ``bfcl-eval`` wheel
  into typed :class:`Entry` / :class:`Turn` / :class:`GroundTruthCall` values (calls parsed with ``ast``, never
  ``eval``; positional arguments named from the backend signatures; ints stay ints).
* Worlds: :class:`World` runs calls on BFCL's backends with BFCL's error-to-output convention.
* Oracle: :func:`run_oracle` executes an entry's ground truth on a fresh world; :func:`check_final_state` runs
  BFCL's own ``state_checker`` on a candidate world against the oracle's.
* Tool server: a separate process (``python -m settled_bfcl.toolserver``) honouring idempotency keys and
  owner epochs, with a durable execution ledger; :class:`ToolServerProcess` runs it, :class:`ToolServerClient`
  talks to it, :class:`ToolServerStore` reads its SQLite file.
* Replay model: :class:`ReplayModel` emits each turn's ground-truth calls as model tool calls (call ids
  ``<entry>/t<k>/c<j>``), statelessly, from the history it is given; modes :class:`ReplayMode`, plus adversarial.
* Verdict: :func:`judge_in_fresh_process` / :func:`judge_store` / :func:`judge_conversation` judge each conversation
  against an independent oracle run (state, ledger, tool results, replies, settlements, refusals);
  :func:`render_summary` prints the table; :func:`simulate_conversation` runs a conversation without Kafka.

Install: ``pip install --no-deps bfcl-eval==2026.3.23 mpmath==1.3.0`` plus the ``bfcl`` extra.
"""

from settled_bfcl._backends import (
    BACKEND_CLASSES,
    BFCL_EVAL_VERSION,
    JsonValue,
    MethodSpec,
    World,
    bfcl_output,
    check_bfcl_version,
    method_index,
    method_spec,
)
from settled_bfcl._client import ToolServerClient, ToolServerProcess
from settled_bfcl._corpus import (
    CATEGORIES,
    HOLDOUT_USER_TEXT,
    Corpus,
    Entry,
    GroundTruthCall,
    ToolDoc,
    Turn,
    call_id_for,
    load_corpus,
    load_tool_docs,
    parse_call,
)
from settled_bfcl._errors import (
    BfclError,
    BfclVersionError,
    CallParseError,
    ConversationConflictError,
    CorpusError,
    IdempotencyConflictError,
    StaleEpochError,
    ToolServerError,
    ToolServerProcessError,
    UnknownConversationError,
    UnknownMethodError,
)
from settled_bfcl._oracle import OracleCall, OracleRun, StateVerdict, check_final_state, run_oracle
from settled_bfcl._replay import (
    AssistantText,
    AssistantToolCalls,
    Message,
    ModelResponse,
    ModelToolCall,
    ReplayError,
    ReplayHistoryError,
    ReplayMode,
    ReplayModel,
    ToolResultMessage,
    TurnScript,
    UnreplayableEntryError,
    UserMessage,
    adversarial_call,
    adversarial_call_id,
    final_reply_text,
    replayable,
    replayable_entries,
)
from settled_bfcl._service import ToolServerConfig, ToolService, request_fingerprint
from settled_bfcl._store import ConversationRow, StoreError, ToolServerStore
from settled_bfcl._verdict import (
    ConversationLog,
    ConversationVerdict,
    FaultKind,
    SimulationFault,
    VerdictCheck,
    VerdictError,
    VerdictReason,
    VerdictSummary,
    judge_conversation,
    judge_in_fresh_process,
    judge_store,
    render_failures,
    render_summary,
    result_matches,
    simulate_conversation,
)
from settled_bfcl._wire import (
    CallRequest,
    CallResponse,
    Capabilities,
    ConversationInfo,
    CreateConversationRequest,
    ErrorBody,
    ExecutionRecord,
    LedgerRecord,
    ToolInfo,
)

__all__ = [
    "BACKEND_CLASSES",
    "BFCL_EVAL_VERSION",
    "CATEGORIES",
    "HOLDOUT_USER_TEXT",
    "AssistantText",
    "AssistantToolCalls",
    "BfclError",
    "BfclVersionError",
    "CallParseError",
    "CallRequest",
    "CallResponse",
    "Capabilities",
    "ConversationConflictError",
    "ConversationInfo",
    "ConversationLog",
    "ConversationRow",
    "ConversationVerdict",
    "Corpus",
    "CorpusError",
    "CreateConversationRequest",
    "Entry",
    "ErrorBody",
    "ExecutionRecord",
    "FaultKind",
    "GroundTruthCall",
    "IdempotencyConflictError",
    "JsonValue",
    "LedgerRecord",
    "Message",
    "MethodSpec",
    "ModelResponse",
    "ModelToolCall",
    "OracleCall",
    "OracleRun",
    "ReplayError",
    "ReplayHistoryError",
    "ReplayMode",
    "ReplayModel",
    "SimulationFault",
    "StaleEpochError",
    "StateVerdict",
    "StoreError",
    "ToolDoc",
    "ToolInfo",
    "ToolResultMessage",
    "ToolServerClient",
    "ToolServerConfig",
    "ToolServerError",
    "ToolServerProcess",
    "ToolServerProcessError",
    "ToolServerStore",
    "ToolService",
    "Turn",
    "TurnScript",
    "UnknownConversationError",
    "UnknownMethodError",
    "UnreplayableEntryError",
    "UserMessage",
    "VerdictCheck",
    "VerdictError",
    "VerdictReason",
    "VerdictSummary",
    "World",
    "adversarial_call",
    "adversarial_call_id",
    "bfcl_output",
    "call_id_for",
    "check_bfcl_version",
    "check_final_state",
    "final_reply_text",
    "judge_conversation",
    "judge_in_fresh_process",
    "judge_store",
    "load_corpus",
    "load_tool_docs",
    "method_index",
    "method_spec",
    "parse_call",
    "render_failures",
    "render_summary",
    "replayable",
    "replayable_entries",
    "request_fingerprint",
    "result_matches",
    "run_oracle",
    "simulate_conversation",
]
