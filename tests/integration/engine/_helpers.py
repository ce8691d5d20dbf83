"""Helpers of the engine tests: sending inbox records, reading the log and settlements, counting the world."""

from __future__ import annotations

import subprocess
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from settled._settings import Settings
from settled.schemas import (
    AbortRequested,
    LogEvent,
    Receipt,
    RecoveryDecision,
    RecoveryDecisionKind,
    ResolutionKind,
    ResolveUnknown,
    SettlementOutcome,
    SettlementRecord,
    SubmissionProposed,
    canonical_json,
)
from tests.integration.engine.engine_app import RESOLVER_KEY_ID, RESOLVER_PRIVATE_KEY, world
from tests.integration.helpers import CODEC, produce_inbox, read_topic

KILLED = -9
TIMEOUT_S = 90.0


def send(s: Settings, *records: SubmissionProposed | ResolveUnknown | AbortRequested) -> None:
    produce_inbox(s, [(r.conversation_id.encode(), CODEC.encode(r)) for r in records])


def log_events(s: Settings) -> list[LogEvent]:
    out: list[LogEvent] = []
    for r in read_topic(s, "log"):
        assert r.value is not None
        out.extend(CODEC.decode_batch(r.value, offset=r.offset).batch.events)
    return out


def events_of(s: Settings, submission_id: str) -> list[LogEvent]:
    return [e for e in log_events(s) if getattr(e, "submission_id", None) == submission_id]


def settlements(s: Settings) -> list[SettlementRecord]:
    out = []
    for r in read_topic(s, "settlements"):
        assert r.value is not None
        rec = CODEC.decode(r.value)
        assert isinstance(rec, SettlementRecord)
        out.append(rec)
    return out


def settled(s: Settings, submission_id: str) -> SettlementRecord | None:
    found = [r for r in settlements(s) if r.submission_id == submission_id]
    return found[0] if found else None


def count(db: Path, sql: str, *args: Any) -> int:
    with world(str(db)) as conn:
        return int(conn.execute(sql, args).fetchone()[0])


def invocations(db: Path, tool: str) -> int:
    return count(db, "SELECT count(*) FROM invocations WHERE tool = ?", tool)


def effects(db: Path, tool: str) -> int:
    return count(db, "SELECT count(*) FROM effects WHERE tool = ?", tool)


def killed(proc: subprocess.Popen[bytes], log: Path) -> None:
    try:
        code = proc.wait(TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the worker was not killed at its failpoint:\n{log.read_text()[-3000:]}") from None
    assert code == KILLED, f"worker exited {code}, not by its failpoint's SIGKILL:\n{log.read_text()[-3000:]}"


def plan(*ops: dict[str, Any]) -> dict[str, Any]:
    return {"plan": list(ops)}


def sign_resolution(
    conversation_id: str,
    submission_id: str,
    call_id: str,
    result: Any = None,
    *,
    kind: ResolutionKind = ResolutionKind.CALL_OUTCOME,
    outcome: SettlementOutcome | None = None,
    key: Ed25519PrivateKey | None = RESOLVER_PRIVATE_KEY,
    key_id: str = RESOLVER_KEY_ID,
) -> ResolveUnknown:
    """A ``ResolveUnknown`` signed with ``key`` (the resolver's by default; None: unsigned)."""
    fields: dict[str, Any] = {
        "command_id": f"resolve-{uuid.uuid4().hex[:8]}",
        "principal": "ops",
        "conversation_id": conversation_id,
        "submission_id": submission_id,
        "call_id": call_id,
        "kind": kind,
        "outcome": outcome,
        "result_json": None if result is None else canonical_json(result),
        "key_id": key_id,
        "requested_at": datetime.now(UTC),
    }
    unsigned = ResolveUnknown(**fields, signature=b"")
    if key is None:
        return unsigned
    return ResolveUnknown(**fields, signature=key.sign(unsigned.signing_bytes()))


def receipt(s: Settings, request_id: str) -> Receipt | None:
    for r in read_topic(s, "receipts"):
        assert r.value is not None
        rec = CODEC.decode(r.value)
        if isinstance(rec, Receipt) and rec.request_id == request_id:
            return rec
    return None


def abort_command(conversation_id: str, submission_id: str) -> AbortRequested:
    return AbortRequested(
        command_id=f"abort-{uuid.uuid4().hex[:8]}",
        principal="tester",
        conversation_id=conversation_id,
        submission_id=submission_id,
        reason="test abort while a tool runs",
        requested_at=datetime.now(UTC),
    )


def returns(db: Path, tool: str) -> int:
    return count(db, "SELECT count(*) FROM returns WHERE tool = ?", tool)


def decisions(s: Settings, submission_id: str) -> list[RecoveryDecisionKind]:
    return [e.decision for e in events_of(s, submission_id) if isinstance(e, RecoveryDecision)]
