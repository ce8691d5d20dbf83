"""settled's pure protocol core: the submission state machine, the fold, the decisions (DESIGN.md §1b).

* `EDGES` (`_states`): the submission state machine of spec §3 as one table of edges, plus the edges DESIGN.md §5
  and spec §13 add; `IllegalTransition` for anything else.
* `apply` / `fold` (`_fold`): a partition's conversations as a fold of canonical batches (`PartitionState`,
  `ConversationState`), refusing a stale owner epoch (`StaleEpoch`), a broken chain, an illegal transition or an
  inconsistent log with typed errors.
* `classify` (`_recovery`): the recovery classifier over a submission's persisted facts (DUR-013, spec §15).
* `admit`, `schedule`, `start_attempt`, `terminalize`, `abort`, `resolve`, `quarantine`, … (`_decide`): state +
  one input (+ time and ids) → the events to append and the receipt / settlement / quarantine records to emit.

No Kafka, no Postgres, no clock, no randomness here (an import-linter contract enforces it).
"""

from settled.protocol._decide import (
    Decision,
    SettleAborted,
    StartAttempt,
    abort,
    admit,
    claim,
    interrupt,
    quarantine,
    reason_code,
    reject_command,
    reject_submission,
    resolve,
    schedule,
    start_attempt,
    terminalize,
)
from settled.protocol._errors import (
    ChainBroken,
    IllegalTransition,
    InputAlreadyDecided,
    LogInconsistency,
    ProtocolError,
    StaleEpoch,
    TerminalOutcomeConflict,
    UnknownSubmission,
    WrongConversation,
)
from settled.protocol._fold import (
    BatchLike,
    ConversationState,
    InputKey,
    KeyEntry,
    PartitionState,
    Submission,
    Transition,
    apply,
    apply_traced,
    fold,
    input_key,
    scope_digest,
)
from settled.protocol._recovery import (
    OpenCall,
    ReconcileAnswer,
    Reconciliation,
    Recovery,
    RecoveryAction,
    RecoverySnapshot,
    ToolSafety,
    classify,
)
from settled.protocol._states import (
    EDGES,
    NONTERMINAL_STATES,
    TERMINAL_STATES,
    Edge,
    SubmissionState,
    cause_qualifier,
    edges_from,
    find_edge,
    outcome_state,
)

__all__ = [
    "EDGES",
    "NONTERMINAL_STATES",
    "TERMINAL_STATES",
    "BatchLike",
    "ChainBroken",
    "ConversationState",
    "Decision",
    "Edge",
    "IllegalTransition",
    "InputAlreadyDecided",
    "InputKey",
    "KeyEntry",
    "LogInconsistency",
    "OpenCall",
    "PartitionState",
    "ProtocolError",
    "ReconcileAnswer",
    "Reconciliation",
    "Recovery",
    "RecoveryAction",
    "RecoverySnapshot",
    "SettleAborted",
    "StaleEpoch",
    "StartAttempt",
    "Submission",
    "SubmissionState",
    "TerminalOutcomeConflict",
    "ToolSafety",
    "Transition",
    "UnknownSubmission",
    "WrongConversation",
    "abort",
    "admit",
    "apply",
    "apply_traced",
    "cause_qualifier",
    "claim",
    "classify",
    "edges_from",
    "find_edge",
    "fold",
    "input_key",
    "interrupt",
    "outcome_state",
    "quarantine",
    "reason_code",
    "reject_command",
    "reject_submission",
    "resolve",
    "schedule",
    "scope_digest",
    "start_attempt",
    "terminalize",
]
