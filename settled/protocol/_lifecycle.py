"""Lifecycle events (issue 17 item 5): a canonical batch → its ``durable.*`` events, one per causing log event.

The partition owner produces what `lifecycle_events` returns to ``settled.lifecycle`` in the transaction that appends
the batch (docs/architecture.md, "Lifecycle events"), so an event exists exactly when its cause is canonical. Each
event is derived from exactly one canonical log event; its id is ``<batch_id>#<index>`` (the causing event's index
in the batch), so a consumer dedupes on it. The mapping (`LIFECYCLE_TYPES` names every type):

====================================  ==============================================================================
log event                             lifecycle event
====================================  ==============================================================================
``AttemptStarted``                    ``durable.started`` (per attempt: a resume is a new attempt)
``StepRecorded`` ``step:<name>``      ``durable.step_completed`` (a workflow step's one recorded result)
``StepRecorded`` ``log:<name>``       ``durable.log``
``WaitRequested`` of kind approval    ``durable.approval_needed`` (not a workflow step's ask: its request record is)
``StepRecorded``                      ``durable.approval_needed`` (a workflow step's ask ``k``, issue 17 item 2)
``approval-request:<step>#<k>``
``ApprovalDecided`` approved          ``durable.approval_granted``
``StepRecorded`` ``approval:<s>#<k>`` ``durable.approval_granted`` (``on_approval_needed`` answered true)
``StepRetryScheduled``                ``durable.retry`` (a workflow step runs again, its ``step`` named)
``SubmissionRetryScheduled``          ``durable.retry`` (a submission's next attempt, ``step`` null; issue 22 item 4)
``Settlement`` failed                 ``durable.failed``
``Settlement`` completed              ``durable.completed``
``WaitRequested`` of a pause          ``durable.paused`` (kind signal, name ``settled.resume``, id
                                      ``<run>#p<ordinal>``: a denial or a ``pause_run``; with its reason)
===================================== ==============================================================================

Everything else (checkpoints, model responses, tool calls, signals, denials, aborted settlements…) has no lifecycle
event. Pure: no I/O, no clock.
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Sequence
from typing import Any, Final, Protocol

from settled.protocol._workflows import (
    APPROVAL_ANSWER_PREFIX,
    APPROVAL_REQUEST_PREFIX,
    RESUME_SIGNAL,
    is_pause_wait,
    step_approval_id,
)
from settled.schemas import (
    ApprovalDecided,
    AttemptStarted,
    LifecycleEvent,
    LogEvent,
    Settlement,
    SettlementOutcome,
    StepRecorded,
    StepRetryScheduled,
    SubmissionRetryScheduled,
    WaitKind,
    WaitRequested,
    canonical_json,
)

__all__ = [
    "LIFECYCLE_TYPES",
    "STEP_LOG_PREFIX",
    "STEP_RESULT_PREFIX",
    "lifecycle_event_id",
    "lifecycle_events",
    "lifecycle_matches",
]

#: Every ``durable.*`` event type, in the seed's order.
LIFECYCLE_TYPES: Final = (
    "durable.started",
    "durable.step_completed",
    "durable.approval_needed",
    "durable.approval_granted",
    "durable.paused",
    "durable.retry",
    "durable.failed",
    "durable.completed",
    "durable.log",
)

#: Name prefix of a workflow step's recorded result (``StepRecorded``; settled/runtime/_workflow_run.py records it).
STEP_RESULT_PREFIX: Final = "step:"
#: Name prefix of a workflow step's log line (``StepRecorded``).
STEP_LOG_PREFIX: Final = "log:"


class _Batch(Protocol):
    """What `lifecycle_events` reads of a canonical batch (a `settled.schemas.LogBatch`)."""

    @property
    def conversation_id(self) -> str: ...  # pragma: no cover - protocol

    @property
    def batch_id(self) -> str: ...  # pragma: no cover - protocol

    @property
    def recorded_at(self) -> Any: ...  # pragma: no cover - protocol

    @property
    def events(self) -> Sequence[LogEvent]: ...  # pragma: no cover - protocol


def lifecycle_event_id(batch_id: str, index: int) -> str:
    """Return the id of the lifecycle event caused by event ``index`` of batch ``batch_id``.

    Args:
        batch_id: The causing canonical batch.
        index: The causing event's index within it (0-based).

    Returns:
        ``<batch_id>#<index>``.
    """
    return f"{batch_id}#{index}"


def lifecycle_events(batch: _Batch) -> tuple[LifecycleEvent, ...]:
    """Return the lifecycle events one canonical batch causes, in the batch's event order.

    Args:
        batch: A canonical (sealed) batch.

    Returns:
        One `LifecycleEvent` per log event the module docstring's table maps; empty for most batches.
    """
    out: list[LifecycleEvent] = []
    for index, event in enumerate(batch.events):
        mapped = _map(event)
        if mapped is None:
            continue
        kind, submission_id, data = mapped
        out.append(
            LifecycleEvent(
                event_id=lifecycle_event_id(batch.batch_id, index),
                type=kind,
                conversation_id=batch.conversation_id,
                submission_id=submission_id,
                batch_id=batch.batch_id,
                index=index,
                data_json=canonical_json(data),
                occurred_at=batch.recorded_at,
            )
        )
    return tuple(out)


def lifecycle_matches(pattern: str, event_type: str) -> bool:
    """Whether ``event_type`` matches a subscription pattern (`fnmatch`, case-sensitive: ``durable.*``).

    Args:
        pattern: E.g. ``"durable.*"``, ``"durable.approval_*"`` or one exact type.
        event_type: A lifecycle event's type.

    Returns:
        True when it matches.
    """
    return fnmatch.fnmatchcase(event_type, pattern)


def _step_approval(event: StepRecorded) -> tuple[str, str, dict[str, Any]] | None:
    """A workflow step's approval request (``durable.approval_needed``) or callback approval (``..._granted``)."""
    if event.name.startswith(APPROVAL_REQUEST_PREFIX):
        step, _, ask = event.name.removeprefix(APPROVAL_REQUEST_PREFIX).rpartition("#")
        value = json.loads(event.result_json)
        approval_id = value.get("approval_id") if isinstance(value, dict) else None
        return "durable.approval_needed", event.submission_id, {"approval_id": approval_id, "name": step}
    step, _, ask = event.name.removeprefix(APPROVAL_ANSWER_PREFIX).rpartition("#")
    answer = json.loads(event.result_json)
    if not (isinstance(answer, dict) and answer.get("approved") is True and ask.isdigit()):
        return None  # denied, or left to a person: that person's decision is the ApprovalDecided
    approval_id = step_approval_id(event.submission_id, step, int(ask))
    return "durable.approval_granted", event.submission_id, {"approval_id": approval_id, "principal": None}


def _map(event: LogEvent) -> tuple[str, str, dict[str, Any]] | None:
    """The lifecycle type, run and data of one log event, or ``None`` (the module docstring's table)."""
    if isinstance(event, AttemptStarted):
        return "durable.started", event.submission_id, {"attempt": event.attempt, "attempt_id": event.attempt_id}
    if isinstance(event, StepRecorded):
        if event.name.startswith((APPROVAL_REQUEST_PREFIX, APPROVAL_ANSWER_PREFIX)):
            return _step_approval(event)
        if event.name.startswith(STEP_RESULT_PREFIX):
            step = event.name.removeprefix(STEP_RESULT_PREFIX)
            return "durable.step_completed", event.submission_id, {"step": step, "attempt_id": event.attempt_id}
        if event.name.startswith(STEP_LOG_PREFIX):
            step = event.name.removeprefix(STEP_LOG_PREFIX)
            return (
                "durable.log",
                event.submission_id,
                {"step": step, "message": json.loads(event.result_json), "attempt_id": event.attempt_id},
            )
        return None
    if isinstance(event, WaitRequested):
        if (
            event.kind is WaitKind.SIGNAL
            and event.name == RESUME_SIGNAL
            and is_pause_wait(event.submission_id, event.wait_id)
        ):
            details = json.loads(event.details_json or "{}")
            keys = ("approval_id", "reason", "source", "step")
            data = {key: details.get(key) for key in keys} if isinstance(details, dict) else {}
            return "durable.paused", event.submission_id, {"wait_id": event.wait_id, **data}
        if event.kind is not WaitKind.APPROVAL or event.wait_id.startswith(f"{event.submission_id}#approve:"):
            return None  # a workflow step's ask was announced by its request record
        return "durable.approval_needed", event.submission_id, {"approval_id": event.wait_id, "name": event.name}
    if isinstance(event, ApprovalDecided):
        if not event.approved:
            return None
        return (
            "durable.approval_granted",
            event.submission_id,
            {"approval_id": event.approval_id, "principal": event.principal},
        )
    if isinstance(event, StepRetryScheduled):
        return (
            "durable.retry",
            event.submission_id,
            {
                "step": event.step,
                "retry": event.retry,
                "error_type": event.error_type,
                "error_message": event.error_message,
                "wake_at": event.wake_at.isoformat(),
            },
        )
    if isinstance(event, SubmissionRetryScheduled):
        return (
            "durable.retry",
            event.submission_id,
            {
                "step": None,
                "retry": event.retry,
                "attempt_id": event.attempt_id,
                "cause": event.cause,
                "backoff_ms": event.backoff_ms,
                "wake_at": event.wake_at.isoformat(),
            },
        )
    if isinstance(event, Settlement):
        if event.outcome is SettlementOutcome.COMPLETED:
            return "durable.completed", event.submission_id, {"attempt_count": event.attempt_count}
        if event.outcome is SettlementOutcome.FAILED:
            return (
                "durable.failed",
                event.submission_id,
                {
                    "error_type": event.error_type,
                    "error_reason": event.error_reason,
                    "attempt_count": event.attempt_count,
                },
            )
    return None
