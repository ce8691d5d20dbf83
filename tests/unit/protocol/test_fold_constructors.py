"""The fold's builders make exactly what the dataclasses' own ``__init__`` and ``dataclasses.replace`` make.

The fold builds its values as drafts whose class is then set to the frozen dataclass (`settled.protocol._fold`,
`_draft_class`): every value it folds goes through these builders, so each is compared field by field with the
dataclass's own constructor, and the result must be an ordinary frozen instance.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import FrozenInstanceError
from typing import Any

import pytest

from settled.protocol import (
    EDGES,
    ConversationState,
    KeyEntry,
    PartitionState,
    Submission,
    SubmissionState,
    Transition,
    fold,
)
from settled.protocol._fold import (
    _check_builder,
    _draft_class,
    _new_conversation,
    _new_key_entry,
    _new_transition,
    _replace,
)
from settled.schemas import SettlementOutcome
from tests.integration.projection_script import script_log


def _values(cls: type[object], obj: object) -> tuple[Any, ...]:
    return tuple(getattr(obj, f.name) for f in dataclasses.fields(cls))  # type: ignore[arg-type]


def _folded() -> list[ConversationState]:
    state = fold(PartitionState(partition=0), script_log())
    return [conv for conv in state.conversations.values() if conv.submissions]


def _same(cls: type[object], fast: object, made: object) -> None:
    assert type(fast) is cls
    assert fast == made
    try:
        expected_hash = hash(made)
    except TypeError:  # a conversation holds mappings: unhashable either way
        with pytest.raises(TypeError):
            hash(fast)
    else:
        assert hash(fast) == expected_hash
    assert repr(fast) == repr(made)
    assert _values(cls, fast) == _values(cls, made)


def test_a_conversation_built_as_a_draft_equals_its_init() -> None:
    folded = _folded()
    assert folded
    for made in folded:
        _same(ConversationState, _new_conversation(*_values(ConversationState, made)), made)


def test_a_transition_and_a_key_entry_built_as_drafts_equal_their_init() -> None:
    event = script_log()[0].events[0]
    for edge in EDGES:
        _same(Transition, _new_transition("c", "s", edge, event), Transition("c", "s", edge, event))
    _same(KeyEntry, _new_key_entry("s", "digest", 3), KeyEntry("s", "digest", 3))


def test_replace_equals_dataclasses_replace_for_every_set_of_changed_fields() -> None:
    changes = {
        "state": SubmissionState.TERMINALIZING,
        "attempt_count": 2,
        "open_calls": frozenset(),
        "reserved_outcome": SettlementOutcome.ABORTED,
        "input_json": None,
    }
    subs = [sub for conv in _folded() for sub in conv.submissions.values()]
    assert subs
    for sub in subs:
        _same(Submission, _replace(sub), sub)
        for size in range(1, len(changes) + 1):
            for names in itertools.combinations(changes, size):
                picked = {name: changes[name] for name in names}
                expected = dataclasses.replace(sub, **picked)  # type: ignore[arg-type]
                _same(Submission, _replace(sub, **picked), expected)


def test_replace_refuses_a_field_submission_does_not_have() -> None:
    sub = next(sub for conv in _folded() for sub in conv.submissions.values())
    with pytest.raises(TypeError, match="no field 'attempts'"):
        _replace(sub, attempts=2)


def test_what_the_builders_make_stays_frozen() -> None:
    sub = next(sub for conv in _folded() for sub in conv.submissions.values())
    built = _replace(sub, attempt_count=7)
    with pytest.raises(FrozenInstanceError):
        built.attempt_count = 8  # type: ignore[misc]
    assert built.attempt_count == 7
    conv = _new_conversation(*_values(ConversationState, _folded()[0]))
    with pytest.raises(FrozenInstanceError):
        conv.queue = ()  # type: ignore[misc]


def test_a_dataclass_whose_init_does_more_gets_no_draft() -> None:
    @dataclasses.dataclass(frozen=True, slots=True)
    class Checked:
        n: int

        def __post_init__(self) -> None:
            if self.n < 0:
                raise ValueError("n")

    @dataclasses.dataclass(frozen=True)
    class NoSlots:
        n: int

    for cls in (Checked, NoSlots):
        with pytest.raises(TypeError, match="does more than store its fields"):
            _draft_class(cls)


def test_a_builder_missing_a_field_is_named() -> None:
    @dataclasses.dataclass(frozen=True, slots=True)
    class Pair:
        a: int
        b: int

    draft = _draft_class(Pair)
    half = object.__new__(draft)
    half.a = 1
    half.__class__ = Pair
    with pytest.raises(TypeError, match=r"builder of Pair does not set \['b'\]"):
        _check_builder(Pair, half)
    _check_builder(Pair, Pair(1, 2))
