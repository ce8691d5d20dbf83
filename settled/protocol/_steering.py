"""Steering (issue 22 item 3): a run's ordered stream of steering messages and what its model calls saw of it.

A `SteerRun` accepted by the owner (`steer`) is a canonical `SteeringReceived`; the run's steering stream is those
records in log order, each command id once. Before each model call the runtime shows the model the messages that
no earlier call of the run saw, and records them with the call's response (`SteeringDelivered`): replay reads
which messages a recorded call saw from the log, never from what arrived since. See docs/architecture.md
"Steering".
"""

from __future__ import annotations

from collections.abc import Iterable

from settled.schemas import LogEvent, SteeringDelivered, SteeringReceived

__all__ = ["steering_delivered", "steering_stream", "undelivered_steering"]


def steering_stream(journal: Iterable[LogEvent], submission_id: str) -> list[SteeringReceived]:
    """Return a run's steering stream: its `SteeringReceived` records in log order, a repeated command id once.

    Args:
        journal: The run's committed records in log order (only `SteeringReceived` is read).
        submission_id: The run.

    Returns:
        The stream, oldest first.
    """
    seen: set[str] = set()
    stream: list[SteeringReceived] = []
    for e in journal:
        if isinstance(e, SteeringReceived) and e.submission_id == submission_id and e.command_id not in seen:
            seen.add(e.command_id)
            stream.append(e)
    return stream


def steering_delivered(journal: Iterable[LogEvent], submission_id: str) -> list[str]:
    """Return the command ids of the steering messages the run's recorded model calls saw, in delivery order.

    Args:
        journal: The run's committed records in log order (only `SteeringDelivered` is read).
        submission_id: The run.

    Returns:
        The ids, each once.
    """
    ids: list[str] = []
    for e in journal:
        if isinstance(e, SteeringDelivered) and e.submission_id == submission_id:
            ids.extend(i for i in e.command_ids if i not in ids)
    return ids


def undelivered_steering(
    journal: Iterable[LogEvent], submission_id: str, delivered: Iterable[str]
) -> list[SteeringReceived]:
    """Return the steering messages the run's next model call sees first: canonical, and seen by no earlier call.

    Args:
        journal: The run's committed records in log order.
        submission_id: The run.
        delivered: Command ids earlier model calls of the run saw (recorded, or this attempt's own).

    Returns:
        The messages, in log order.
    """
    done = set(delivered)
    return [m for m in steering_stream(journal, submission_id) if m.command_id not in done]
