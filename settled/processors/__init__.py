"""settled.processors: the conversation worker — partition ownership, restore, decisions, checkpoints, attempts."""

from settled.processors._conductor import (
    JOURNAL_EVENT_TYPES,
    Agent,
    AgentRun,
    AttemptSupersededError,
    CancelSignal,
    Conductor,
    HistoryTurn,
    RunFailedError,
    RunLauncher,
    ToolPolicy,
    batched_wakeups,
    defer_wakeup,
)
from settled.processors._ledger import LedgerDecider, load_public_key, to_loop_decision
from settled.processors._partition import Decider, Decision, InboxInput, PartitionOwner
from settled.processors._watchdog import WATCHDOG_EXIT_CODE, default_turn_watchdog_s
from settled.processors._worker import (
    INSTANCE_FENCED_EXIT_CODE,
    MEMBERSHIP_LOST_EXIT_CODE,
    InstanceFencedError,
    PartitionConductor,
    StaticMembershipLostError,
    Worker,
    WorkerConfig,
)
from settled.producers import murmur2, partition_for_key

__all__ = [
    "INSTANCE_FENCED_EXIT_CODE",
    "JOURNAL_EVENT_TYPES",
    "MEMBERSHIP_LOST_EXIT_CODE",
    "WATCHDOG_EXIT_CODE",
    "Agent",
    "AgentRun",
    "AttemptSupersededError",
    "CancelSignal",
    "Conductor",
    "Decider",
    "Decision",
    "HistoryTurn",
    "InboxInput",
    "InstanceFencedError",
    "LedgerDecider",
    "PartitionConductor",
    "PartitionOwner",
    "RunFailedError",
    "RunLauncher",
    "StaticMembershipLostError",
    "ToolPolicy",
    "Worker",
    "WorkerConfig",
    "batched_wakeups",
    "default_turn_watchdog_s",
    "defer_wakeup",
    "load_public_key",
    "murmur2",
    "partition_for_key",
    "to_loop_decision",
]
