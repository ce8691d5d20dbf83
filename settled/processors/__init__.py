"""settled.processors: the conversation worker — partition ownership, restore, decisions, checkpoints."""

from settled.processors._partition import Decider, Decision, InboxInput, PartitionOwner, StaleEpochError
from settled.processors._worker import Worker, WorkerConfig

__all__ = ["Decider", "Decision", "InboxInput", "PartitionOwner", "StaleEpochError", "Worker", "WorkerConfig"]
