"""The fold's `_replace` and `_new_conversation` build what ``dataclasses.replace`` and ``__init__`` build.

The projection's rebuild folds every batch through it (`settled.protocol._fold`).
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from settled.protocol import (
    ConversationState,
    PartitionState,
    Submission,
    SubmissionState,
    fold,
)
from settled.protocol._fold import _new_conversation, _replace
from settled.schemas import SettlementOutcome
from tests.integration.projection_script import script_log


def _values(cls: type[object], obj: object) -> tuple[object, ...]:
    return tuple(getattr(obj, f.name) for f in dataclasses.fields(cls))  # type: ignore[arg-type]


def _folded() -> list[ConversationState]:
    state = fold(PartitionState(partition=0), script_log())
    return [conv for conv in state.conversations.values() if conv.submissions]


def test_a_conversation_built_slot_by_slot_equals_its_init() -> None:
    for made in _folded():
        fast = _new_conversation(*_values(ConversationState, made))
        assert type(fast) is ConversationState
        assert fast == made
        assert _values(ConversationState, fast) == _values(ConversationState, made)


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
        for size in range(1, len(changes) + 1):
            for names in itertools.combinations(changes, size):
                picked = {name: changes[name] for name in names}
                expected = dataclasses.replace(sub, **picked)  # type: ignore[arg-type]
                fast = _replace(sub, **picked)
                assert fast == expected, names
                assert _values(Submission, fast) == _values(Submission, expected)


def test_replace_refuses_a_field_submission_does_not_have() -> None:
    sub = next(sub for conv in _folded() for sub in conv.submissions.values())
    with pytest.raises(TypeError, match="no field 'attempts'"):
        _replace(sub, attempts=2)
