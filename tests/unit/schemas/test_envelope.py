"""The canonical batch envelope and verify_chain (issue 4 item 2)."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from pydantic import ValidationError

from settled.schemas import (
    AttemptStarted,
    ChainBreakError,
    ChainEntry,
    LogBatch,
    RepeatedBatchError,
    RepeatedBatchGuard,
    SubmissionReady,
    body_batch_digest,
    current_schemas,
    verify_chain,
)
from settled.schemas._binary import write_body
from tests.unit.schemas._strategies import batches

AT = datetime(2026, 1, 1, tzinfo=UTC)


def _chain(count: int, conversation: str = "conv-1", events_per_batch: int = 2) -> list[tuple[int, LogBatch]]:
    """``count`` chained batches at offsets 10, 20, ... (gaps like transaction markers)."""
    out: list[tuple[int, LogBatch]] = []
    prev: LogBatch | None = None
    for index in range(count):
        first = 1 if prev is None else prev.last_event_seq + 1
        events = [SubmissionReady(submission_id=f"s{index}.{n}", submission_seq=index) for n in range(events_per_batch)]
        prev = LogBatch.seal(
            conversation_id=conversation,
            batch_id=f"{conversation}/b{index}",
            first_event_seq=first,
            owner_epoch=1 + index // 3,
            prev_batch_digest=None if prev is None else prev.batch_digest,
            recorded_at=AT,
            events=events,
        )
        out.append((10 * (index + 1), prev))
    return out


def test_a_sound_chain_verifies_and_returns_its_head() -> None:
    chain = _chain(5)
    head = verify_chain(chain)
    assert (head.batch_count, head.last_offset, head.last_event_seq) == (5, 50, 10)
    assert head.last_batch_digest == chain[-1][1].batch_digest
    more = _chain(7)[5:]
    assert verify_chain(more, after=head).batch_count == 7


def test_the_digest_is_sha256_of_the_body_with_the_digest_emptied() -> None:
    batch = _chain(1)[0][1]
    schema = current_schemas().get(LogBatch.AVRO_NAME).parsed
    body = write_body(schema, batch.to_avro())
    emptied = write_body(schema, {**batch.to_avro(), "batch_digest": ""})
    assert batch.batch_digest == hashlib.sha256(emptied).hexdigest() == body_batch_digest(body)
    assert body[:2] == b"\x80\x01" and body[2:66] == batch.batch_digest.encode()


def test_a_dropped_batch_is_named_at_the_next_offset() -> None:
    chain = _chain(5)
    del chain[2]
    with pytest.raises(ChainBreakError) as info:
        verify_chain(chain)
    assert (info.value.offset, info.value.kind) == (40, "prev_digest_mismatch")


def test_an_altered_batch_is_named_at_its_own_offset() -> None:
    chain = _chain(5)
    offset, batch = chain[3]
    altered = batch.model_copy(
        update={"events": (AttemptStarted(submission_id="x", attempt=1, attempt_id="a", owner_epoch=1),) * 2}
    )
    chain[3] = (offset, altered)
    with pytest.raises(ChainBreakError) as info:
        verify_chain(chain)
    assert (info.value.offset, info.value.kind) == (40, "digest_mismatch")


def test_a_resealed_batch_with_a_gap_is_a_seq_gap() -> None:
    chain = _chain(3)
    offset, batch = chain[2]
    chain[2] = (
        offset,
        LogBatch.seal(
            conversation_id=batch.conversation_id,
            batch_id=batch.batch_id,
            first_event_seq=batch.first_event_seq + 1,
            owner_epoch=batch.owner_epoch,
            prev_batch_digest=batch.prev_batch_digest,
            recorded_at=AT,
            events=batch.events,
        ),
    )
    with pytest.raises(ChainBreakError) as info:
        verify_chain(chain)
    assert (info.value.offset, info.value.kind) == (30, "seq_gap")


def test_a_chain_missing_its_first_batch_breaks_at_the_first_offset() -> None:
    with pytest.raises(ChainBreakError) as info:
        verify_chain(_chain(3)[1:])
    assert (info.value.offset, info.value.kind) == (20, "prev_digest_mismatch")


def test_owner_epoch_must_not_go_back() -> None:
    chain = _chain(2)
    offset, batch = chain[1]
    chain[1] = (
        offset,
        LogBatch.seal(
            conversation_id=batch.conversation_id,
            batch_id=batch.batch_id,
            first_event_seq=batch.first_event_seq,
            owner_epoch=0,
            prev_batch_digest=batch.prev_batch_digest,
            recorded_at=AT,
            events=batch.events,
        ),
    )
    with pytest.raises(ChainBreakError) as info:
        verify_chain(chain)
    assert (info.value.offset, info.value.kind) == (20, "epoch_regression")


def test_another_conversations_batch_breaks_the_chain() -> None:
    chain = _chain(2)
    chain.append((99, _chain(1, conversation="conv-2")[0][1]))
    with pytest.raises(ChainBreakError) as info:
        verify_chain(chain)
    assert (info.value.offset, info.value.kind) == (99, "conversation_mismatch")


def test_a_repeated_batch_raises_repeated_batch_error() -> None:
    chain = _chain(3)
    chain.append((45, chain[1][1]))
    with pytest.raises(RepeatedBatchError) as info:
        verify_chain(chain)
    assert (info.value.offset, info.value.first_offset, info.value.batch_id) == (45, 20, "conv-1/b1")
    guard = RepeatedBatchGuard()
    guard.check("b", 1)
    guard.check("b", 1)  # the same record read again (e.g. after a rewind) is not a repeat
    with pytest.raises(RepeatedBatchError):
        guard.check("b", 2)


def test_a_body_digest_from_the_codec_is_used_instead_of_recomputing() -> None:
    (offset, batch), *_ = _chain(1)
    assert verify_chain([ChainEntry(offset, batch, batch.batch_digest)]).batch_count == 1
    with pytest.raises(ChainBreakError, match="digest_mismatch"):
        verify_chain([ChainEntry(offset, batch, "0" * 64)])


def test_event_sequence_must_match_the_events() -> None:
    batch = _chain(1)[0][1]
    with pytest.raises(ValidationError, match="last_event_seq"):
        LogBatch.model_validate({**batch.model_dump(), "last_event_seq": 5})
    with pytest.raises(ValidationError, match="at least one event"):
        LogBatch.seal(
            conversation_id="c",
            batch_id="b",
            first_event_seq=1,
            owner_epoch=0,
            prev_batch_digest=None,
            recorded_at=AT,
            events=[],
        )


def test_empty_input_is_an_error_not_a_pass() -> None:
    with pytest.raises(ValueError, match="at least one batch"):
        verify_chain([])


@settings(deadline=None, max_examples=50)
@given(batches())
def test_any_sealed_batch_verifies_from_model_and_from_bytes(batch: LogBatch) -> None:
    body = write_body(current_schemas().get(LogBatch.AVRO_NAME).parsed, batch.to_avro())
    assert body_batch_digest(body) == batch.batch_digest == batch.compute_digest()
