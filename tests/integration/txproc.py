"""The test processor: settled's worker loop with a minimal decider, run in-process or as a child process.

Its decider admits every proposal (no key index: admission proper is the admission issue's), quarantines what cannot
be decoded, and replaces an oversized or poison batch by a rejection. It drives the appender's tests through the
real worker loop: real consumer group, real claims, real transactions.

Run as a child: ``python -m tests.integration.txproc --namespace NS`` (environment: SETTLED_KAFKA_BOOTSTRAP,
failpoints through SETTLED_FAILPOINTS / SETTLED_FAILPOINT_DIR).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType

from settled._settings import Settings
from settled.processors import Decision, InboxInput, Worker, WorkerConfig
from settled.schemas import (
    InputQuarantined,
    LogBatch,
    QuarantineReason,
    QuarantineRecord,
    Receipt,
    ReceiptOutcome,
    RequestKind,
    SubmissionAdmitted,
    SubmissionProposed,
    SubmissionReady,
    SubmissionRejected,
    SubmissionRejectReason,
)

QUARANTINE_RAW_BYTES = 1024


@dataclass(frozen=True)
class TxState:
    """Per-conversation submission counts; immutable, so the pending overlay never leaks into committed state."""

    seqs: MappingProxyType[str, int] = field(default_factory=lambda: MappingProxyType({}))
    batches: int = 0


class TxDecider:
    """Admit everything; quarantine the undecodable; reject what cannot be appended."""

    def initial_state(self, partition: int) -> TxState:
        return TxState()

    def fold(self, state: TxState, batch: LogBatch) -> TxState:
        seqs = dict(state.seqs)
        for event in batch.events:
            if isinstance(event, SubmissionAdmitted):
                seqs[event.conversation_id] = event.submission_seq
        return TxState(MappingProxyType(seqs), state.batches + 1)

    def decide(self, state: TxState, inp: InboxInput, now: datetime) -> Sequence[Decision]:
        record = inp.record
        if record is None or inp.error is not None:
            conversation = _conversation_of(inp)
            raw = inp.value or b""
            reason = QuarantineReason(inp.error_reason or QuarantineReason.OTHER)
            detail = inp.error or "unknown"
            return [
                Decision(
                    conversation_id=conversation,
                    events=(
                        InputQuarantined(reason=reason, detail=detail, raw_size_bytes=len(raw), input_ref=inp.ref),
                    ),
                    quarantined=(
                        QuarantineRecord(
                            topic=inp.topic,
                            partition=inp.partition,
                            offset=inp.offset,
                            reason=reason,
                            detail=detail,
                            key=(inp.key or b"")[:QUARANTINE_RAW_BYTES] or None,
                            raw=raw[:QUARANTINE_RAW_BYTES],
                            raw_size_bytes=len(raw),
                            quarantined_at=now,
                        ),
                    ),
                    inputs=frozenset({inp.offset}),
                )
            ]
        assert isinstance(record, SubmissionProposed), record
        seq = state.seqs.get(record.conversation_id, 0) + 1
        return [
            Decision(
                conversation_id=record.conversation_id,
                submission_id=record.submission_id,
                events=(
                    SubmissionAdmitted(
                        submission_id=record.submission_id,
                        conversation_id=record.conversation_id,
                        principal=record.principal,
                        idempotency_key=record.idempotency_key,
                        payload_digest=record.payload_digest,
                        submission_seq=seq,
                        tools_offered=record.payload.tools_offered,
                        input_json=record.payload.input_json,
                        input_ref=inp.ref,
                    ),
                    SubmissionReady(submission_id=record.submission_id, submission_seq=seq),
                ),
                receipts=(
                    Receipt(
                        request_kind=RequestKind.SUBMISSION,
                        request_id=record.submission_id,
                        outcome=ReceiptOutcome.ADMITTED,
                        submission_seq=seq,
                        conversation_id=record.conversation_id,
                        decided_at=now,
                    ),
                ),
                inputs=frozenset({inp.offset}),
            )
        ]

    def poison(self, state: TxState, decisions: Sequence[Decision], reason: str, now: datetime) -> Sequence[Decision]:
        out = []
        for d in decisions:
            admitted = next(e for e in d.events if isinstance(e, SubmissionAdmitted))
            out.append(
                Decision(
                    conversation_id=d.conversation_id,
                    submission_id=d.submission_id,
                    events=(
                        SubmissionRejected(
                            submission_id=admitted.submission_id,
                            idempotency_key=admitted.idempotency_key,
                            reason=SubmissionRejectReason.OTHER,
                            detail=reason,
                            input_ref=admitted.input_ref,
                        ),
                    ),
                    receipts=(
                        Receipt(
                            request_kind=RequestKind.SUBMISSION,
                            request_id=admitted.submission_id,
                            outcome=ReceiptOutcome.REJECTED,
                            reason=reason,
                            conversation_id=d.conversation_id,
                            decided_at=now,
                        ),
                    ),
                    inputs=d.inputs,
                )
            )
        return out


def _conversation_of(inp: InboxInput) -> str:
    try:
        key = (inp.key or b"").decode()
    except UnicodeDecodeError:
        key = ""
    return key or f"~quarantine/{inp.partition}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--max-record-bytes", type=int, default=1_000_000)
    parser.add_argument("--worker-id", default=f"txproc-{os.getpid()}")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(message)s")
    settings = Settings(namespace=args.namespace)
    worker: Worker[TxState] = Worker(
        settings=settings,
        decider_factory=lambda _p: TxDecider(),
        config=WorkerConfig(max_record_bytes=args.max_record_bytes),
        worker_id=args.worker_id,
    )
    worker.install_signal_handlers()
    worker.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
