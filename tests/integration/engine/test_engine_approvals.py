"""Approvals through real workers (issue 16 item 4): the refund flow, and decisions that are refused.

A real ``settled worker`` child runs the engine test app; a plan op ``{"approve": title, "then": {tool}}`` is
``ctx.approve(title)`` and runs the tool only if approved. The worker is killed at the named failpoint
``engine.after_wait_commit`` (the approval request is canonical, the attempt not ended); the decision is sent while
no worker runs and decided when the next worker owns the partition.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from settled._settings import Settings
from settled.client import ApprovalRejectedError, Client
from settled.protocol import arguments_digest
from settled.schemas import (
    ApprovalDecided,
    CommandRejected,
    DecideApproval,
    LogEvent,
    Receipt,
    ReceiptOutcome,
    WaitKind,
    WaitRequested,
    WaitResolved,
)
from tests.integration.engine._helpers import KILLED, TIMEOUT_S, events_of, invocations, plan, receipt, send
from tests.integration.engine.conftest import SpawnWorker
from tests.integration.engine.engine_app import APPROVER_KEY_ID, RESOLVER_PRIVATE_KEY
from tests.integration.helpers import wait_for

pytestmark = [pytest.mark.integration]

REFUND = {
    "approve": "refund",
    "description": "refund order o-7",
    "then": {"tool": "charge_once", "args": {"amount": 120}},
}


@pytest.fixture
def client(topics: Settings) -> Iterator[Client]:
    with Client(topics, principal="ops", default_timeout_s=TIMEOUT_S) as c:
        yield c


def _decision(
    request: WaitRequested,
    conversation_id: str,
    *,
    command_id: str,
    approved: bool = True,
    args_digest: str | None = None,
    submission_id: str | None = None,
    signer: Ed25519PrivateKey | None = RESOLVER_PRIVATE_KEY,
) -> DecideApproval:
    details = json.loads(request.details_json or "null")
    unsigned = DecideApproval(
        command_id=command_id,
        principal="supervisor",
        conversation_id=conversation_id,
        submission_id=submission_id or request.submission_id,
        approval_id=request.wait_id,
        args_digest=args_digest or details["args_digest"],
        approved=approved,
        reason="within policy" if approved else "over the limit",
        key_id=APPROVER_KEY_ID,
        signature=b"",
        requested_at=datetime.now(UTC),
    )
    if signer is None:
        return unsigned
    return unsigned.model_copy(update={"signature": signer.sign(unsigned.signing_bytes())})


def _approval_request(s: Settings, sid: str) -> WaitRequested:
    found = [e for e in events_of(s, sid) if isinstance(e, WaitRequested) and e.kind is WaitKind.APPROVAL]
    assert len(found) == 1, found
    return found[0]


def _decided(events: list[LogEvent]) -> list[LogEvent]:
    return [e for e in events if isinstance(e, (ApprovalDecided, WaitResolved))]


def test_refund_approved_while_no_worker_runs_runs_once_and_refused_decisions_change_nothing(
    topics: Settings, spawn_worker: SpawnWorker, world_db: Path, client: Client
) -> None:
    """Scenario 2 (docs/semantics.md): the run suspends on an approval, every worker stops, the approval is sent while
    none runs, and the next worker rebuilds the run from the log and consumes the approval once."""
    s = topics
    w1 = spawn_worker("w1", failpoints="engine.after_wait_commit=1*kill")
    sub = client.submit("conv-ap1", plan(REFUND))
    sid = sub.request_id
    assert w1.wait(TIMEOUT_S) == KILLED  # killed right after the approval request committed: every worker stopped
    request = _approval_request(s, sid)
    assert request.wait_id == f"{sid}#w0"
    # Refused decisions, sent while no worker runs: other arguments, unsigned, naming another run. The approval
    # itself comes last, so the refused ones are decided (and shown to change nothing) before it.
    mismatch = _decision(request, "conv-ap1", command_id="bad-digest", args_digest=arguments_digest('{"amount":9}'))
    unsigned = _decision(request, "conv-ap1", command_id="bad-unsigned", signer=None)
    other_run = _decision(request, "conv-ap1", command_id="bad-other-run", submission_id="another-run")
    approval = _decision(request, "conv-ap1", command_id="ok-1")
    send(s, mismatch, unsigned, other_run, approval)
    spawn_worker("w2")
    settled = client.wait(sub, TIMEOUT_S)
    assert settled.outcome.value == "completed", settled
    reply = json.loads(settled.reply_json or "null")["results"][0]
    assert reply == {
        "approved": True,
        "by": APPROVER_KEY_ID,
        "reason": "within policy",
        "result": {"charged": 120, "tool": "charge_once"},
    }
    assert invocations(world_db, "charge_once") == 1
    for command_id, reason in (
        ("bad-digest", "digest_mismatch"),
        ("bad-unsigned", "unsigned"),
        ("bad-other-run", "other_run"),
    ):
        r = _receipt_of(s, command_id)
        assert r is not None and r.outcome is ReceiptOutcome.REJECTED and (r.reason or "").startswith(f"{reason}: "), r
    events = events_of(s, sid)
    rejected = [e for e in events if isinstance(e, CommandRejected)]
    assert {e.command_id for e in rejected} == {"bad-digest", "bad-unsigned"}
    decided = _decided(events)
    assert [(type(e).__name__, getattr(e, "command_id", None) or getattr(e, "source_id", None)) for e in decided] == [
        ("ApprovalDecided", "ok-1"),
        ("WaitResolved", "ok-1"),
    ]  # only the approval decided the wait
    # The same approval again: a duplicate receipt, nothing runs again.
    again = client.approve(
        "conv-ap1",
        sid,
        request.wait_id,
        args_digest=json.loads(request.details_json or "null")["args_digest"],
        signing_key=RESOLVER_PRIVATE_KEY,
        key_id=APPROVER_KEY_ID,
        reason="within policy",
        principal="supervisor",
        command_id="ok-1",
    )
    assert again.outcome is ReceiptOutcome.DUPLICATE
    with pytest.raises(ApprovalRejectedError, match="already_terminal"):
        client.deny(
            "conv-ap1",
            sid,
            request.wait_id,
            args_digest=json.loads(request.details_json or "null")["args_digest"],
            signing_key=RESOLVER_PRIVATE_KEY,
            key_id=APPROVER_KEY_ID,
        )


def test_a_denied_refund_never_runs_and_the_run_reads_who_denied_and_why(
    topics: Settings, spawn_worker: SpawnWorker, world_db: Path, client: Client
) -> None:
    spawn_worker("w1")
    sub = client.submit("conv-ap2", plan(REFUND))
    wait_for(lambda: _approval_request_or_none(topics, sub.request_id) is not None, TIMEOUT_S, "the approval request")
    request = _approval_request(topics, sub.request_id)
    denied = client.deny(
        "conv-ap2",
        sub.request_id,
        request.wait_id,
        args_digest=json.loads(request.details_json or "null")["args_digest"],
        signing_key=RESOLVER_PRIVATE_KEY,
        key_id=APPROVER_KEY_ID,
        reason="over the limit",
    )
    assert denied.outcome is ReceiptOutcome.APPLIED
    settled = client.wait(sub, TIMEOUT_S)
    assert settled.outcome.value == "completed", settled
    reply = json.loads(settled.reply_json or "null")["results"][0]
    assert reply == {"approved": False, "by": APPROVER_KEY_ID, "reason": "over the limit"}
    assert invocations(world_db, "charge_once") == 0


def _approval_request_or_none(s: Settings, sid: str) -> WaitRequested | None:
    found = [e for e in events_of(s, sid) if isinstance(e, WaitRequested) and e.kind is WaitKind.APPROVAL]
    return found[0] if found else None


def _receipt_of(s: Settings, command_id: str) -> Receipt:
    wait_for(lambda: receipt(s, command_id) is not None, TIMEOUT_S, f"the receipt of {command_id}")
    found = receipt(s, command_id)
    assert found is not None
    return found
