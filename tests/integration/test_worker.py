"""The conversation worker: admission, FIFO scheduling, echo runs, settlement (issue 5)."""

from __future__ import annotations

from collections import Counter, defaultdict

import pytest

from settled._settings import Settings
from settled.processors import Worker
from settled.protocol import PartitionState
from settled.runtime import App
from settled.schemas import Receipt, ReceiptOutcome, SettlementOutcome, SettlementRecord, SubmissionAdmitted
from settled.services._worker_service import build_worker
from settled.testing.echo import EchoAgent
from tests._promise import promise
from tests.harness.factories import proposal
from tests.integration.helpers import CODEC, produce_inbox, read_topic, running, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.partitions(2)]


def _records(s: Settings, short: str) -> list:
    return [CODEC.decode(r.value) for r in read_topic(s, short)]


def test_duplicates_conflicts_and_fifo_settlement(topics: Settings) -> None:
    s = topics
    sent = []
    for i in range(6):
        for c in range(4):
            sent.append(proposal(f"conv-{c}", key=f"k{i}", value={"n": i}))
    dups = [p.model_copy(update={"submission_id": f"dup-{p.submission_id}"}) for p in sent[::5]]
    conflicts = [proposal(p.conversation_id, key=p.idempotency_key, value={"other": True}) for p in sent[1::7]]
    everything = sent[:12] + dups[:2] + sent[12:] + dups[2:] + conflicts
    produce_inbox(s, [(p.conversation_id.encode(), CODEC.encode(p)) for p in everything])
    worker: Worker[PartitionState] = build_worker(s, App(agent=EchoAgent(delay_s=0.0)))
    with running(worker):
        wait_for(lambda: len(_records(s, "settlements")) >= len(sent), 90, "a settlement per admitted submission")
        wait_for(lambda: len(_records(s, "receipts")) >= len(everything), 30, "a receipt per proposal")
    receipts = {r.request_id: r for r in _records(s, "receipts") if isinstance(r, Receipt)}
    assert all(receipts[p.submission_id].outcome is ReceiptOutcome.ADMITTED for p in sent)
    for d in dups:
        r = receipts[d.submission_id]
        assert r.outcome is ReceiptOutcome.DUPLICATE
        assert r.original_submission_id == d.submission_id.removeprefix("dup-")
    for c in conflicts:
        assert receipts[c.submission_id].outcome is ReceiptOutcome.REJECTED
        assert "idempotency_conflict" in (receipts[c.submission_id].reason or "")
    settlements = [r for r in _records(s, "settlements") if isinstance(r, SettlementRecord)]
    counts = Counter(r.submission_id for r in settlements)
    promise("DUR-002.one-settlement", counts == Counter({p.submission_id: 1 for p in sent}), f"{counts}")
    assert all(r.outcome is SettlementOutcome.COMPLETED for r in settlements)
    # Per conversation, settlement order equals admitted order (DUR-004).
    admitted: dict[str, list[str]] = defaultdict(list)
    for r in read_topic(s, "log"):
        for e in CODEC.decode_batch(r.value, offset=r.offset).batch.events:
            if isinstance(e, SubmissionAdmitted):
                admitted[e.conversation_id].append(e.submission_id)
    settled_order: dict[str, list[str]] = defaultdict(list)
    for r in settlements:
        settled_order[r.conversation_id].append(r.submission_id)
    promise("DUR-004.fifo", dict(settled_order) == dict(admitted), f"{dict(settled_order)} vs {dict(admitted)}")
