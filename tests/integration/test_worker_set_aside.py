"""A decision whose typed failure is itself too large to append is set aside, never looped on (issue 25 item 5).

The worker's record limit is lowered (``WorkerConfig.max_record_bytes``) so that an admission with a large input is
too large, and so is its replacement, a rejection that repeats the conversation id of 256 four-byte characters.
Before the fix the appender raised a fatal error, the worker dropped and re-claimed the partition and met the same
batch again, forever: nothing behind it on the partition was decided. Now the input is quarantined (reason
``oversized``, naming why) and the healthy submission behind it settles.
"""

from __future__ import annotations

from typing import Any

import pytest

from settled._settings import Settings
from settled.processors import Worker, WorkerConfig
from settled.protocol import PartitionState
from settled.runtime import App, RunContext
from settled.schemas import (
    OwnershipClaimed,
    QuarantineReason,
    QuarantineRecord,
    Receipt,
    ReceiptOutcome,
    Settlement,
    SettlementOutcome,
    SettlementRecord,
)
from settled.services._worker_service import build_worker
from settled.testing import EchoAgent
from tests.conftest import Provisioned
from tests.harness.factories import proposal
from tests.integration.helpers import CODEC, produce_inbox, read_topic, running, wait_for

pytestmark = pytest.mark.integration


def _decoded(s: Settings, short: str) -> list[object]:
    return [CODEC.decode(r.value) for r in read_topic(s, short)]


def test_an_input_whose_rejection_is_too_large_too_is_quarantined_and_the_next_one_settles(
    provisioned: Provisioned,
) -> None:
    s = provisioned(1)
    huge = proposal("\U0001d11e" * 256, value="x" * 4000)  # a 1 KB conversation id (the contract's 256 characters)
    healthy = proposal("conv-behind")
    produce_inbox(s, [(p.conversation_id.encode(), CODEC.encode(p)) for p in (huge, healthy)], partition=0)
    config = WorkerConfig(max_record_bytes=1800)
    worker: Worker[PartitionState] = build_worker(s, App(agent=EchoAgent(delay_s=0.0)), config=config)
    with running(worker):
        wait_for(
            lambda: any(isinstance(r, SettlementRecord) for r in _decoded(s, "settlements")),
            60,
            "the healthy submission behind the oversized one to settle",
        )
    quarantined = [r for r in _decoded(s, "quarantine") if isinstance(r, QuarantineRecord)]
    assert len(quarantined) == 1, quarantined
    assert quarantined[0].reason is QuarantineReason.OVERSIZED
    assert "exceeds the limit of 1800 bytes" in quarantined[0].detail, quarantined[0].detail
    receipts = [r for r in _decoded(s, "receipts") if isinstance(r, Receipt)]
    assert [(r.request_id, r.outcome) for r in receipts] == [(healthy.submission_id, ReceiptOutcome.ADMITTED)]
    claims = [
        e.owner_epoch
        for r in read_topic(s, "log")
        for e in CODEC.decode_batch(r.value, offset=r.offset).batch.events
        if isinstance(e, OwnershipClaimed)
    ]
    assert claims == [1], f"the partition was dropped and claimed again: epochs {claims}"


async def _big_step(ctx: RunContext) -> Any:
    return await ctx.step("big", lambda: "y" * 6000)


def test_a_step_result_too_large_for_the_log_fails_the_run_naming_the_record_its_size_and_the_limit(
    provisioned: Provisioned,
) -> None:
    """A step result (not a tool settlement) too large for the log has no typed failure of its own: the run fails at
    once (no retry) with ``record_too_large`` naming the record's events, its size and the limit. Before the fix the
    worker raised ``ValueError: no typed failure replaces ['StepRecorded']`` and exited; then (with the set-aside)
    the run was refused as superseded and retried until ``max_attempts``."""
    s = provisioned(1)
    sent = proposal("conv-big-step")
    produce_inbox(s, [(sent.conversation_id.encode(), CODEC.encode(sent))], partition=0)
    config = WorkerConfig(max_record_bytes=5000)
    worker: Worker[PartitionState] = build_worker(s, App(agent=_big_step), config=config)
    with running(worker):
        wait_for(lambda: bool(_settlements(s)), 60, "the submission's settlement")
    (record,) = _settlements(s)
    assert record.outcome is SettlementOutcome.FAILED, record
    assert record.error_type == "record_too_large", record
    reason = record.error_reason or ""
    assert "StepRecorded" in reason and "exceeds the limit of 5000 bytes" in reason, reason
    settled = [
        e
        for r in read_topic(s, "log")
        for e in CODEC.decode_batch(r.value, offset=r.offset).batch.events
        if isinstance(e, Settlement)
    ]
    assert [e.attempt_count for e in settled] == [1], settled


def _settlements(s: Settings) -> list[SettlementRecord]:
    return [r for r in _decoded(s, "settlements") if isinstance(r, SettlementRecord)]
