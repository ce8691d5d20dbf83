"""A scripted canonical log for the projection tests: tool calls, errors, a refusal, an Unknown, a resolution, an
abort of a queued submission, an ownership change under a running attempt, duplicates and a rejection.

Pure (no services): `script_log()` returns the batches of one partition in log order; the unit tests project them
in memory, the integration test appends them through the transactional appender. `CHECKPOINT` is the number of
batches after which submission ``s1`` waits in Unknown on call ``D`` (the obligation an operator sees).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from settled.schemas import (
    AbortRecorded,
    AttemptStarted,
    DeclaredToolCall,
    Genesis,
    InputApplied,
    LogBatch,
    LogEvent,
    ModelResponseCompleted,
    OwnershipClaimed,
    RecoveryDecision,
    RecoveryDecisionKind,
    ResolutionKind,
    Settlement,
    SettlementOutcome,
    StepRecorded,
    SubmissionAdmitted,
    SubmissionDuplicate,
    SubmissionReady,
    SubmissionRejected,
    SubmissionRejectReason,
    ToolCallPrepared,
    ToolCallRefused,
    ToolCallSettled,
    ToolCallUnknown,
    ToolError,
    UnknownResolved,
    canonical_json,
    json_digest,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)


@dataclass
class Script:
    """Builds a partition's batches with valid chains, one second apart."""

    partition: int = 0
    epoch: int = 0
    batches: list[LogBatch] = field(default_factory=list)
    heads: dict[str, tuple[int, str]] = field(default_factory=dict)

    def add(self, conversation: str, *events: LogEvent) -> LogBatch:
        seq, prev = self.heads.get(conversation, (0, None))  # type: ignore[arg-type]
        batch = LogBatch.seal(
            conversation_id=conversation,
            batch_id=f"{conversation}:{seq + 1}",
            first_event_seq=seq + 1,
            owner_epoch=self.epoch,
            prev_batch_digest=prev,
            recorded_at=T0 + timedelta(seconds=len(self.batches)),
            events=list(events),
        )
        self.heads[conversation] = (batch.last_event_seq, batch.batch_digest)
        self.batches.append(batch)
        return batch

    def claim(self, epoch: int, worker: str) -> None:
        self.epoch = epoch
        now = T0 + timedelta(seconds=len(self.batches))
        self.add(f"~partition/{self.partition}", OwnershipClaimed(
            partition=self.partition, owner_epoch=epoch, worker_id=worker, claimed_at=now))  # fmt: skip


def _json(value: object) -> tuple[str, str]:
    text = canonical_json(value)
    return text, json_digest(text)


def admitted(sid: str, conv: str, seq: int, value: object, tools: tuple[str, ...] = ()) -> SubmissionAdmitted:
    return SubmissionAdmitted(
        submission_id=sid,
        conversation_id=conv,
        principal="tester",
        idempotency_key=f"key-{sid}",
        payload_digest=json_digest(canonical_json([sid])),
        submission_seq=seq,
        tools_offered=tools,
        input_json=canonical_json(value),
    )


def prepared(sid: str, attempt: str, call: str, tool: str, ordinal: int, epoch: int) -> ToolCallPrepared:
    args, digest = _json({"call": call})
    return ToolCallPrepared(
        submission_id=sid, run_id=f"run-{sid}", attempt_id=attempt, call_id=call, ordinal=ordinal, tool=tool,
        args_json=args, args_digest=digest, idempotency_key=f"idem-{call}", owner_epoch=epoch,
    )  # fmt: skip


def settled(sid: str, attempt: str, call: str, value: object) -> ToolCallSettled:
    result, digest = _json(value)
    return ToolCallSettled(submission_id=sid, attempt_id=attempt, call_id=call, result_json=result,
                           result_digest=digest)  # fmt: skip


def settlement(sid: str, outcome: SettlementOutcome, attempts: int, reply: object | None = None) -> Settlement:
    reply_json, reply_digest = _json(reply) if reply is not None else (None, None)
    return Settlement(submission_id=sid, outcome=outcome, reply_json=reply_json, reply_digest=reply_digest,
                      attempt_count=attempts, settled_at=T0)  # fmt: skip


CHECKPOINT = 15
"""Batches after which ``s1`` is Unknown on call ``D`` and ``s3`` is running (before the second claim)."""


def script_log(partition: int = 0, genesis: LogBatch | None = None) -> list[LogBatch]:
    """Return the scripted partition log (module doc).

    With ``genesis`` (a topic's real genesis batch), the script continues its chain and does not repeat it.
    """
    s = Script(partition=partition)
    if genesis is None:
        s.add(f"~partition/{partition}", Genesis(namespace="scripted", partition_count=1, created_at=T0))
    else:
        s.heads[genesis.conversation_id] = (genesis.last_event_seq, genesis.batch_digest)
        s.batches.append(genesis)
    s.claim(1, "worker-a")
    c1, c2 = "conv-tools", "conv-claimed"
    tools = ("search", "pay", "fly")
    s.add(c1, admitted("s1", c1, 1, {"q": "trip"}, tools), SubmissionReady(submission_id="s1", submission_seq=1))
    s.add(
        c1,
        admitted("s2", c1, 2, {"q": "later"}),
        SubmissionReady(submission_id="s2", submission_seq=2),
        SubmissionDuplicate(submission_id="dup-s1", original_submission_id="s1", idempotency_key="key-s1"),
        SubmissionRejected(submission_id="rej-s1", idempotency_key="key-s1",
                           reason=SubmissionRejectReason.IDEMPOTENCY_CONFLICT, detail="other payload"),
    )  # fmt: skip
    s.add(c1, AttemptStarted(submission_id="s1", attempt=1, attempt_id="a1", owner_epoch=1))
    declared = [DeclaredToolCall(call_id=c, tool=t, args_json=_json({"call": c})[0], args_digest=_json({"call": c})[1])
                for c, t in (("A", "search"), ("B", "pay"), ("C", "fly"))]  # fmt: skip
    s.add(
        c1,
        InputApplied(submission_id="s1", attempt_id="a1", input_digest=json_digest(canonical_json({"q": "trip"}))),
        ModelResponseCompleted(submission_id="s1", attempt_id="a1", response_ordinal=0, provider="replay",
                               model="m1", text="calling tools", tool_calls=tuple(declared)),
    )  # fmt: skip
    s.add(c1, prepared("s1", "a1", "A", "search", 0, 1))
    s.add(c1, settled("s1", "a1", "A", {"hits": 3}))
    s.add(
        c1,
        prepared("s1", "a1", "B", "pay", 1, 1),
        ToolCallSettled(submission_id="s1", attempt_id="a1", call_id="B",
                        error=ToolError(type="Declined", message="card declined", non_retryable=True)),
    )  # fmt: skip
    s.add(c1, ToolCallRefused(submission_id="s1", attempt_id="a1", call_id="C", tool="fly",
                              args_digest=_json({"call": "C"})[1], reason="not offered"))  # fmt: skip
    s.add(c1, prepared("s1", "a1", "D", "pay", 2, 1))
    s.add(c1, ToolCallUnknown(submission_id="s1", call_id="D", reason="timed out after 5 s"))
    s.add(c1, RecoveryDecision(submission_id="s1", attempt_id="a1", decision=RecoveryDecisionKind.UNKNOWN,
                               reason="pay is neither idempotent nor reconcilable", call_ids=("D",)))  # fmt: skip
    s.add(c2, admitted("s3", c2, 1, {"q": "echo"}), SubmissionReady(submission_id="s3", submission_seq=1))
    s.add(c2, AttemptStarted(submission_id="s3", attempt=1, attempt_id="a3", owner_epoch=1))
    assert len(s.batches) == CHECKPOINT
    s.claim(2, "worker-b")
    s.add(c1, AbortRecorded(command_id="cmd-abort", submission_id="s2", principal="tester", reason="not needed"))
    s.add(c1, settlement("s2", SettlementOutcome.ABORTED, 0))
    s.add(c1, UnknownResolved(command_id="cmd-resolve", submission_id="s1", call_id="D",
                              kind=ResolutionKind.SAFE_TO_RETRY, principal="operator", key_id="k1"))  # fmt: skip
    s.add(c1, AttemptStarted(submission_id="s1", attempt=2, attempt_id="a2", owner_epoch=2))
    s.add(c1, prepared("s1", "a2", "D", "pay", 2, 2), settled("s1", "a2", "D", {"paid": True}))
    result, digest = _json({"summary": "ok"})
    s.add(c1, StepRecorded(submission_id="s1", attempt_id="a2", name="summarize", version=1, step_id="st1",
                           ordinal=0, result_json=result, result_digest=digest))  # fmt: skip
    s.add(c1, settlement("s1", SettlementOutcome.COMPLETED, 2, {"answer": "booked"}))
    s.add(c2, RecoveryDecision(submission_id="s3", attempt_id="a3", decision=RecoveryDecisionKind.RESUME,
                               reason="no effect in doubt", call_ids=()))  # fmt: skip
    s.add(c2, AttemptStarted(submission_id="s3", attempt=2, attempt_id="a4", owner_epoch=2))
    s.add(c2, settlement("s3", SettlementOutcome.COMPLETED, 2, {"echo": "echo"}))
    return s.batches
