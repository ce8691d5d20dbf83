"""settled.processors: the conversation worker — partition ownership, restore, decisions, checkpoints, attempts."""

from settled.processors._conductor import Agent, AgentRun, Conductor, RunFailed
from settled.processors._ledger import LedgerDecider, load_public_key, to_loop_decision
from settled.processors._partition import Decider, Decision, InboxInput, PartitionOwner, StaleEpochError
from settled.processors._worker import PartitionConductor, Worker, WorkerConfig
from settled.producers import murmur2, partition_for_key

__all__ = [
    "Agent",
    "AgentRun",
    "Conductor",
    "Decider",
    "Decision",
    "InboxInput",
    "LedgerDecider",
    "PartitionConductor",
    "PartitionOwner",
    "RunFailed",
    "StaleEpochError",
    "Worker",
    "WorkerConfig",
    "load_public_key",
    "murmur2",
    "partition_for_key",
    "to_loop_decision",
]
