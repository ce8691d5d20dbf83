"""The shared settlements reader behind `Client.wait` (issue 24 item 5; `settled/client/_waits.py`).

Settlement records are committed the way an owner commits them (one transaction, keyed by conversation) and read back
through `SettlementsReader`: every wait of a client on one consumer; a settlement read before its wait began is
served from the cache; a wait older than what the reader covers, or whose settlement was evicted, makes the reader
seek back and still finds it; waits match (conversation, submission), not the submission id alone; and
`Client.wait` returns settlements of a real worker under concurrent waits.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from confluent_kafka import Producer

from settled._settings import Settings
from settled.client import Client, SettlementTimeoutError, partition_for_key
from settled.client._waits import SettlementsReader
from settled.producers import producer_config
from settled.runtime import App
from settled.schemas import SettlementOutcome, SettlementRecord, canonical_json, json_digest
from settled.services._worker_service import build_worker
from settled.testing.echo import EchoAgent
from tests.integration.helpers import CODEC, running

PARTITIONS = 2
pytestmark = [pytest.mark.integration, pytest.mark.partitions(PARTITIONS)]
TIMEOUT_S = 30.0


def _settle(s: Settings, records: Sequence[SettlementRecord]) -> None:
    """Commit settlement records as an owner does: one transaction, keyed by conversation, murmur2 placement."""
    p = Producer(producer_config(s, transactional_id=f"{s.namespace}.test-settler.{uuid.uuid4().hex[:6]}"))
    p.init_transactions(30)
    p.begin_transaction()
    for r in records:
        p.produce(s.topic("settlements"), key=r.conversation_id.encode(), value=CODEC.encode(r))
    p.commit_transaction(30)


def _settlement(conversation: str, submission_id: str, reply: Any) -> SettlementRecord:
    text = canonical_json(reply)
    return SettlementRecord(
        conversation_id=conversation,
        submission_id=submission_id,
        submission_seq=1,
        outcome=SettlementOutcome.COMPLETED,
        reply_json=text,
        reply_digest=json_digest(text),
        attempt_count=1,
        settled_at=datetime.now(UTC),
    )


def _same_partition(n: int) -> list[str]:
    """``n`` conversation ids on partition 0."""
    out: list[str] = []
    while len(out) < n:
        cid = f"conv-{uuid.uuid4().hex[:8]}"
        if partition_for_key(cid.encode(), PARTITIONS) == 0:
            out.append(cid)
    return out


def _since() -> datetime:
    return datetime.now(UTC) - timedelta(seconds=60)


def test_a_settlement_read_before_its_wait_is_served_without_another_seek(topics: Settings) -> None:
    s = topics
    a, b = _same_partition(2)
    reader = SettlementsReader(s, CODEC)
    try:
        since = _since()
        _settle(s, [_settlement(a, "sub-a", "A"), _settlement(b, "sub-b", "B")])
        assert reader.wait(b, "sub-b", since, TIMEOUT_S).reply_json == canonical_json("B")
        seeks = reader.seeks_applied
        assert reader.wait(a, "sub-a", since, TIMEOUT_S).reply_json == canonical_json("A")  # read with B's, cached
        assert reader.seeks_applied == seeks
    finally:
        reader.close()


def test_waits_match_the_conversation_not_only_the_submission_id(topics: Settings) -> None:
    s = topics
    first, second = _same_partition(2)
    reader = SettlementsReader(s, CODEC)
    try:
        since = _since()
        _settle(s, [_settlement(first, "same-id", "first"), _settlement(second, "same-id", "second")])
        assert reader.wait(second, "same-id", since, TIMEOUT_S).reply_json == canonical_json("second")
        assert reader.wait(first, "same-id", since, TIMEOUT_S).reply_json == canonical_json("first")
    finally:
        reader.close()


def test_an_evicted_settlement_is_read_again_by_seeking_back(topics: Settings) -> None:
    s = topics
    convs = _same_partition(5)
    reader = SettlementsReader(s, CODEC, cache_bytes=1)  # the cache keeps the newest record only
    try:
        since = _since()
        _settle(s, [_settlement(c, f"sub-{i}", i) for i, c in enumerate(convs)])
        assert reader.wait(convs[-1], "sub-4", since, TIMEOUT_S).reply_json == canonical_json(4)
        seeks = reader.seeks_applied
        assert reader.wait(convs[0], "sub-0", since, TIMEOUT_S).reply_json == canonical_json(0)
        assert reader.seeks_applied == seeks + 1  # sub-0 was evicted: the partition was read again from `since`
    finally:
        reader.close()


def test_a_wait_older_than_the_covered_range_seeks_back(topics: Settings) -> None:
    s = topics
    old, new = _same_partition(2)
    reader = SettlementsReader(s, CODEC)
    try:
        early = _since()
        _settle(s, [_settlement(old, "sub-old", "old")])
        late = datetime.now(UTC)  # after the old settlement's timestamp
        _settle(s, [_settlement(new, "sub-new", "new")])
        assert reader.wait(new, "sub-new", late, TIMEOUT_S).reply_json == canonical_json("new")
        assert reader.wait(old, "sub-old", early, TIMEOUT_S).reply_json == canonical_json("old")
    finally:
        reader.close()


def test_a_wait_times_out_naming_the_submission(topics: Settings) -> None:
    reader = SettlementsReader(topics, CODEC)
    try:
        with pytest.raises(SettlementTimeoutError, match="sub-never"):
            reader.wait("conv-x", "sub-never", _since(), 1.0)
    finally:
        reader.close()


def test_concurrent_client_waits_each_get_their_own_settlement_on_one_reader(topics: Settings) -> None:
    s = topics
    worker = build_worker(s, App(agent=EchoAgent(delay_s=0.0)))
    with running(worker), Client(s, default_timeout_s=TIMEOUT_S) as client:
        receipts = [client.submit(f"conv-w{i}", {"n": i}) for i in range(40)]
        barrier = threading.Barrier(8)

        def wait_slice(k: int) -> list[tuple[int, Any]]:
            barrier.wait(TIMEOUT_S)
            return [(i, client.wait(receipts[i]).reply_json) for i in range(k, len(receipts), 8)]

        with ThreadPoolExecutor(8) as pool:
            got = [pair for part in pool.map(wait_slice, range(8)) for pair in part]
        assert sorted(got) == [(i, canonical_json({"attempt": 1, "echo": {"n": i}})) for i in range(40)]
        assert (
            client._settlements.seeks_applied <= 2 * PARTITIONS
        )  # one reader; a seek per partition (plus a back-seek)
