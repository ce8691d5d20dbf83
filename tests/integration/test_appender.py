"""The transactional appender through the real worker loop (issue 4 item 5)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from settled._settings import Settings
from settled.processors import Worker
from settled.producers._topics import provision_topics
from settled.schemas import LogBatch, Receipt, ReceiptOutcome, SubmissionAdmitted, verify_chain
from tests.integration.helpers import CODEC, produce_inbox, proposal, read_topic, running, wait_for
from tests.integration.txproc import TxDecider, TxState

pytestmark = pytest.mark.integration


@pytest.fixture
def topics(settings: Settings) -> Settings:
    s = settings.model_copy(update={"partitions": 1})
    provision_topics(s, CODEC, datetime.now(UTC))
    return s


def _receipts(s: Settings) -> list[Receipt]:
    out = []
    for r in read_topic(s, "receipts"):
        rec = CODEC.decode(r.value, topic=s.topic("receipts"))
        assert isinstance(rec, Receipt)
        out.append(rec)
    return out


def _batches(s: Settings) -> list[tuple[int, LogBatch]]:
    return [(r.offset, CODEC.decode_batch(r.value, offset=r.offset).batch) for r in read_topic(s, "log")]


def test_round_trip_admits_each_submission_once_with_a_valid_chain(topics: Settings) -> None:
    s = topics
    props = [proposal(f"c{i % 3}") for i in range(12)]
    produce_inbox(s, [(p.conversation_id.encode(), CODEC.encode(p)) for p in props])
    worker: Worker[TxState] = Worker(settings=s, decider_factory=lambda _p: TxDecider())
    with running(worker):
        wait_for(lambda: len(_receipts(s)) >= 12, 60, "12 receipts")
    receipts = _receipts(s)
    assert sorted(r.request_id for r in receipts) == sorted(p.submission_id for p in props)
    assert all(r.outcome == ReceiptOutcome.ADMITTED for r in receipts)
    by_conv: dict[str, list[tuple[int, LogBatch]]] = {}
    for offset, batch in _batches(s):
        by_conv.setdefault(batch.conversation_id, []).append((offset, batch))
    for conv in ("c0", "c1", "c2"):
        verify_chain(by_conv[conv])
        seqs = [e.submission_seq for _, b in by_conv[conv] for e in b.events if isinstance(e, SubmissionAdmitted)]
        assert seqs == [1, 2, 3, 4]
