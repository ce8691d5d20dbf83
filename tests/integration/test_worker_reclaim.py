"""A worker that drops and claims a partition again never skips an input it read (issue 25 items 2 and 5).

The drop is forced by a fatal producer error injected at the commit (``appender.fatal_commit_error``), so the test
does not depend on which input makes a batch too large: any path that drops and re-claims a partition must rewind
the consumer to the last committed input offset, or to the partition's start when none is committed yet.
"""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path

import pytest

from settled import _failpoints
from settled._settings import Settings
from settled.processors import Worker
from settled.protocol import PartitionState
from settled.runtime import App
from settled.schemas import OwnershipClaimed, Receipt, ReceiptOutcome, SettlementRecord
from settled.services._worker_service import build_worker
from settled.testing import EchoAgent
from tests._promise import promise
from tests.harness.factories import proposal
from tests.integration.helpers import CODEC, produce_inbox, read_topic, running, wait_for

pytestmark = pytest.mark.integration


def _decoded(s: Settings, short: str) -> list[object]:
    return [CODEC.decode(r.value) for r in read_topic(s, short)]


def _has_receipt(s: Settings, submission_id: str) -> bool:
    return any(isinstance(r, Receipt) and r.request_id == submission_id for r in _decoded(s, "receipts"))


def _claims(s: Settings) -> list[int]:
    return [
        e.owner_epoch
        for r in read_topic(s, "log")
        for e in CODEC.decode_batch(r.value, offset=r.offset).batch.events
        if isinstance(e, OwnershipClaimed)
    ]


def test_inputs_read_before_a_fatal_drop_with_no_committed_offset_are_decided_after_the_reclaim(
    topics: Settings, tmp_path: Path
) -> None:
    """The partition's first inputs are read, their checkpoint fails fatally, the worker drops and re-claims the
    partition: no input offset was ever committed, so the claim must rewind to the partition's start. Before the fix
    it rewound only to a committed offset and resumed past the inputs it had read: they were never decided."""
    s = topics
    sent = [proposal(f"conv-rewind-{i}") for i in range(3)]
    produce_inbox(s, [(p.conversation_id.encode(), CODEC.encode(p)) for p in sent], partition=0)
    # Hit 1 is the claim's own transaction (OwnershipClaimed); hit 2 the first one deciding inputs.
    _failpoints.configure("appender.fatal_commit_error=2*raise", control_dir=tmp_path / "fp")
    try:
        worker: Worker[PartitionState] = build_worker(s, App(agent=EchoAgent(delay_s=0.0)))
        with running(worker):
            wait_for(lambda: len(_claims(s)) >= 2, 60, "the partition to be dropped and claimed again")
            # Barrier: a proposal produced after the re-claim is decided only once everything before it was read.
            barrier = proposal("conv-rewind-barrier")
            produce_inbox(s, [(barrier.conversation_id.encode(), CODEC.encode(barrier))], partition=0)
            wait_for(lambda: _has_receipt(s, barrier.submission_id), 60, "the barrier proposal's receipt")
            wait_for(
                lambda: sum(isinstance(r, SettlementRecord) for r in _decoded(s, "settlements")) >= len(sent) + 1,
                20,
                "a settlement per proposal",
            )
    except AssertionError:
        receipts = [r.request_id for r in _decoded(s, "receipts") if isinstance(r, Receipt)]
        lost = [p.submission_id for p in sent if p.submission_id not in receipts]
        promise("DUR-002.no-skipped-input", not lost, f"inputs read before the re-claim were never decided: {lost}")
        raise
    finally:
        _failpoints.reset()
    assert _claims(s) == [1, 2], "the injected fatal error did not make the worker drop and re-claim the partition"
    receipts = [r for r in _decoded(s, "receipts") if isinstance(r, Receipt)]
    by_id = Counter(r.request_id for r in receipts)
    lost = [p.submission_id for p in sent if by_id[p.submission_id] == 0]
    promise("DUR-002.no-skipped-input", not lost, f"inputs read before the re-claim were never decided: {lost}")
    assert all(r.outcome is ReceiptOutcome.ADMITTED for r in receipts), receipts
    assert all(n == 1 for n in by_id.values()), by_id
    settled = Counter(r.submission_id for r in _decoded(s, "settlements") if isinstance(r, SettlementRecord))
    assert settled == Counter({p.submission_id: 1 for p in [*sent, barrier]}), settled


def test_an_invalid_producer_id_mapping_is_fatal_never_aborted_and_the_partition_is_claimed_again(
    topics: Settings, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The coordinator answers a commit with ``INVALID_PRODUCER_ID_MAPPING`` (our transactional.id expired while we
    were stopped, so the partition may have a newer owner). Aborting would have librdkafka re-acquire the id and fence
    that owner: the worker must drop the producer and the partition's state without aborting and claim again through
    the claim order. Before the fix it was handled as abortable: aborted and retried on the same producer, no claim."""
    s = topics
    caplog.set_level(logging.WARNING, logger="settled.producers._appender")
    sent = [proposal(f"conv-mapping-{i}") for i in range(2)]
    produce_inbox(s, [(p.conversation_id.encode(), CODEC.encode(p)) for p in sent], partition=0)
    # Hit 1 is the claim's own transaction (OwnershipClaimed); hit 2 the first one deciding inputs.
    _failpoints.configure("appender.invalid_producer_id_mapping=2*raise", control_dir=tmp_path / "fp")
    try:
        worker: Worker[PartitionState] = build_worker(s, App(agent=EchoAgent(delay_s=0.0)))
        with running(worker):
            wait_for(
                lambda: sum(isinstance(r, SettlementRecord) for r in _decoded(s, "settlements")) >= len(sent),
                60,
                "a settlement per proposal",
            )
    finally:
        _failpoints.reset()
    aborted = [r.getMessage() for r in caplog.records if r.getMessage() == "transaction aborted"]
    assert not aborted, "the transaction was aborted (librdkafka would re-acquire the expired id)"
    assert _claims(s) == [1, 2], "the worker did not drop the partition and claim it again"
    admitted = Counter(r.request_id for r in _decoded(s, "receipts") if isinstance(r, Receipt))
    assert admitted == Counter({p.submission_id: 1 for p in sent}), admitted
