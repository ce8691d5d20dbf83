"""The follower's pure rule and the stream envelope (issue 19 item 2; settled/client/_stream.py).

A part of an earlier attempt after a part of a later one is dropped; the first part of a later attempt comes after a
`Superseded` marker; a repeat is dropped; a cursor resumes with the same filter.
"""

from __future__ import annotations

from typing import Any

import pytest

from settled.client import Part, Superseded
from settled.client._stream import _Follow, follow_state, parse_cursor
from settled.producers import STREAM_PART_VERSION, StreamPart, StreamPartError, decode_part, encode_part


def part(attempt: int, seq: int, data: Any = None) -> StreamPart:
    return StreamPart("s1", "c1", f"a{attempt}", attempt, seq, "emit", data if data is not None else [attempt, seq])


def follow(state: _Follow, parts: list[StreamPart]) -> list[Part | Superseded]:
    out: list[Part | Superseded] = []
    for p in parts:
        out.extend(follow_state(state, p, state.offset + 1))
    return out


def shape(items: list[Part | Superseded]) -> list[tuple[Any, ...]]:
    return [
        ("part", i.attempt, i.seq) if isinstance(i, Part) else ("superseded", i.attempt, i.by_attempt) for i in items
    ]


def test_a_later_attempt_supersedes_an_earlier_one_and_its_late_parts_are_dropped() -> None:
    state = _Follow(partition=3, offset=10)
    items = follow(state, [part(1, 0), part(1, 1), part(2, 0), part(1, 2), part(2, 1), part(3, 0), part(2, 2)])
    assert shape(items) == [
        ("part", 1, 0),
        ("part", 1, 1),
        ("superseded", 1, 2),
        ("part", 2, 0),
        ("part", 2, 1),
        ("superseded", 2, 3),
        ("part", 3, 0),
    ]
    assert state.offset == 17


def test_a_first_part_of_a_later_attempt_needs_no_marker_and_a_repeat_is_dropped() -> None:
    state = _Follow(partition=0, offset=0)
    assert shape(follow(state, [part(2, 0), part(2, 0), part(2, 1), part(2, 1)])) == [("part", 2, 0), ("part", 2, 1)]


def test_each_cursor_resumes_exactly_after_its_item() -> None:
    parts = [part(1, 0), part(1, 1), part(2, 0), part(1, 2), part(2, 1)]
    whole = follow(_Follow(partition=1, offset=100), parts)
    for i, item in enumerate(whole):
        p, offset, attempt, last_seq = parse_cursor(item.cursor)
        state = _Follow(p, offset, attempt, last_seq)
        assert follow(state, parts[offset - 100 :]) == whole[i + 1 :], item.cursor


@pytest.mark.parametrize("cursor", ["", "s1.0.1.1", "s2.0.1.1.0", "s1.x.1.1.0", "s1.0.-1.1.0", "s1.0.1.1.-2"])
def test_a_malformed_cursor_is_refused_naming_it(cursor: str) -> None:
    with pytest.raises(ValueError, match="cursor"):
        parse_cursor(cursor)


def test_the_envelope_round_trips_and_carries_its_version() -> None:
    p = StreamPart("s1", "c1", "a1", 1, 4, "text", "héllo")
    value = encode_part(p)
    assert f'"v":{STREAM_PART_VERSION}' in value.decode()
    assert decode_part(value) == p


@pytest.mark.parametrize(
    ("value", "field"),
    [
        (b"not json", "not JSON"),
        (b"[1]", "not an object"),
        (b'{"v": 99}', "field v"),
        (b'{"v": 1, "run": 1}', "field run"),
        (b'{"v": 1, "run": "s", "conversation": "c", "attempt_id": "a", "attempt": -1, "seq": 0}', "field attempt"),
        (
            b'{"v": 1, "run": "s", "conversation": "c", "attempt_id": "a", "attempt": 1, "seq": 0, "kind": "x"}',
            "field kind",
        ),
    ],
)
def test_a_bad_envelope_is_refused_naming_the_field(value: bytes, field: str) -> None:
    with pytest.raises(StreamPartError, match=field):
        decode_part(value)


def test_a_part_that_is_not_json_or_too_large_is_refused() -> None:
    with pytest.raises(StreamPartError, match="not a JSON value"):
        encode_part(StreamPart("s1", "c1", "a1", 1, 0, "emit", {1, 2}))
    with pytest.raises(StreamPartError, match="over the"):
        encode_part(StreamPart("s1", "c1", "a1", 1, 0, "emit", "x" * 1_000_000))
