"""A tiny in-memory log for the protocol tests: seals batches, folds them, keeps committed side records."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from settled.protocol import (
    Decision,
    PartitionState,
    Transition,
    apply_traced,
    claim,
)
from settled.schemas import (
    AbortRequested,
    InputRef,
    LogBatch,
    LogEvent,
    QuarantineRecord,
    Receipt,
    SettlementRecord,
    SubmissionPayload,
    SubmissionProposed,
    canonical_json,
    payload_digest,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
INBOX = "ns.settled.inbox"
PARTITION_CID = "~partition/0"


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def payload(value: object = "hello", tools: tuple[str, ...] = ()) -> SubmissionPayload:
    return SubmissionPayload(input_json=canonical_json(value), tools_offered=tools)


def proposal(
    submission_id: str,
    key: str,
    *,
    conversation_id: str = "c1",
    principal: str = "alice",
    value: object = "hello",
    tools: tuple[str, ...] = (),
    digest: str | None = None,
) -> SubmissionProposed:
    body = payload(value, tools)
    return SubmissionProposed(
        submission_id=submission_id,
        principal=principal,
        conversation_id=conversation_id,
        idempotency_key=key,
        payload=body,
        payload_digest=payload_digest(body) if digest is None else digest,
        proposed_at=T0,
    )


def abort_cmd(
    command_id: str, submission_id: str, *, conversation_id: str = "c1", reason: str | None = "stop"
) -> AbortRequested:
    return AbortRequested(
        command_id=command_id,
        principal="alice",
        conversation_id=conversation_id,
        submission_id=submission_id,
        reason=reason,
        requested_at=T0,
    )


@dataclass
class Log:
    """A partition's log: batches are sealed like the appender does and folded with `apply_traced`."""

    partition: int = 0
    state: PartitionState = field(default_factory=lambda: PartitionState(partition=0))
    epoch: int = 0
    batches: list[LogBatch] = field(default_factory=list)
    transitions: list[Transition] = field(default_factory=list)
    receipts: list[Receipt] = field(default_factory=list)
    settlements: list[SettlementRecord] = field(default_factory=list)
    quarantined: list[QuarantineRecord] = field(default_factory=list)
    next_offset: int = 0

    def ref(self) -> InputRef:
        ref = InputRef(topic=INBOX, partition=self.partition, offset=self.next_offset)
        self.next_offset += 1
        return ref

    def seal(self, conversation_id: str, events: Sequence[LogEvent], *, epoch: int | None = None) -> LogBatch:
        conv = self.state.conversation(conversation_id)
        return LogBatch.seal(
            conversation_id=conversation_id,
            batch_id=f"{conversation_id}:{conv.last_event_seq + 1}",
            first_event_seq=conv.last_event_seq + 1,
            owner_epoch=self.epoch if epoch is None else epoch,
            prev_batch_digest=conv.last_batch_digest,
            recorded_at=T0,
            events=events,
        )

    def append(
        self, conversation_id: str, events: Sequence[LogEvent], *, epoch: int | None = None
    ) -> tuple[Transition, ...]:
        batch = self.seal(conversation_id, events, epoch=epoch)
        self.state, trace = apply_traced(self.state, batch)
        self.batches.append(batch)
        self.transitions.extend(trace)
        return trace

    def commit(self, conversation_id: str, decision: Decision) -> tuple[Transition, ...]:
        trace = self.append(conversation_id, decision.events)
        if decision.receipt is not None:
            self.receipts.append(decision.receipt)
        if decision.settlement is not None:
            self.settlements.append(decision.settlement)
        self.settlements.extend(decision.joined_settlements)
        if decision.quarantine is not None:
            self.quarantined.append(decision.quarantine)
        return trace

    def claim(self, worker_id: str = "w1") -> tuple[Transition, ...]:
        event = claim(self.state, worker_id, T0)
        self.epoch = event.owner_epoch
        return self.append(PARTITION_CID, [event])
