"""The bulk replay's row shortcuts give exactly the per-batch rows (issue 7: rebuild = live = reference fold)."""

from __future__ import annotations

import pytest

from settled.projections import ProjectionState, RowSet, project_batch
from settled.projections._rows import project_chunk
from settled.schemas import ChainBreakError, LogBatch
from tests.integration.projection_script import script_log


def _rows(batches: list[LogBatch], *, deferred: bool) -> RowSet:
    rows = RowSet(deferred=deferred)
    state = ProjectionState.empty(0)
    for offset, batch in enumerate(batches):
        state = project_batch(state, batch, offset, rows)
    rows.finish()
    return rows


def test_deferred_rows_equal_the_per_batch_merge_at_every_cut_of_the_log() -> None:
    """Conversation and submission rows built once per key in `RowSet.finish` are the rows merged batch by batch.

    Every prefix of the scripted log (admissions, duplicates, claims and recovery, tool calls, Unknowns and their
    resolution, aborts, settlements) is a possible end of a bulk replay.
    """
    batches = script_log()
    for end in range(1, len(batches) + 1):
        expected = _rows(batches[:end], deferred=False)
        got = _rows(batches[:end], deferred=True)
        assert got.tables == expected.tables, f"after {end} batches"
        assert (got.batches, got.events) == (expected.batches, expected.events)


def test_deferred_rows_wait_for_finish_and_finish_once() -> None:
    batches = script_log()
    rows = RowSet(deferred=True)
    state = ProjectionState.empty(0)
    for offset, batch in enumerate(batches):
        state = project_batch(state, batch, offset, rows)
    assert not rows.tables["conversations"] and not rows.tables["submissions"]
    rows.finish()
    once = {name: dict(table) for name, table in rows.tables.items()}
    assert once["conversations"] and once["submissions"]
    rows.finish()
    assert rows.tables == once


def test_a_chunk_folded_ahead_gives_the_rows_and_state_of_batch_by_batch() -> None:
    batches = script_log()
    expected = _rows(batches, deferred=False)
    by_batch = ProjectionState.empty(0)
    for offset, batch in enumerate(batches):
        by_batch = project_batch(by_batch, batch, offset, RowSet())
    for size in (1, 2, 3, 5, 8, len(batches)):
        rows = RowSet(deferred=True)
        state = ProjectionState.empty(0)
        pairs = list(enumerate(batches))
        for start in range(0, len(pairs), size):
            state = project_chunk(state, pairs[start : start + size], rows)
        rows.finish()
        assert rows.tables == expected.tables, f"chunks of {size}"
        assert state.commit().fold == by_batch.commit().fold
        assert state.in_flight() == by_batch.in_flight()


def test_a_refused_batch_in_a_chunk_raises_after_the_rows_before_it() -> None:
    batches = script_log()
    broken = batches[5].model_copy(update={"first_event_seq": batches[5].first_event_seq + 1})
    rows = RowSet()
    with pytest.raises(ChainBreakError):
        project_chunk(ProjectionState.empty(0), [*enumerate(batches[:5]), (5, broken)], rows)
    assert rows.tables == _rows(batches[:5], deferred=False).tables


def test_deferred_attempt_rows_are_merged_before_a_later_row_of_the_attempt_and_at_finish() -> None:
    """An in-state attempt row a deferred set keeps back merges before the attempt's next transition row.

    The scripted log holds all three cases: rows kept back (`RowSet.defer_attempt`), a transition row of an attempt
    with rows kept back (merged after them, `RowSet.add_attempt`), and a ``waiting`` row (added at once).
    """
    batches = script_log()
    for end in range(1, len(batches) + 1):
        rows = RowSet(deferred=True)
        state = ProjectionState.empty(0)
        for offset, batch in enumerate(batches[:end]):
            state = project_batch(state, batch, offset, rows)
        rows.finish()
        assert rows.tables["attempts"] == _rows(batches[:end], deferred=False).tables["attempts"], f"after {end}"
        assert not rows._att_last and not rows._att_first and not rows._att_ended and not rows._att_step


def test_the_delta_shortcut_of_the_fold_pass_is_what_the_event_table_says() -> None:
    """`_BatchProjector.fold` skips `ModelResponseDelta` by name: it must have no rows, no step and a submission."""
    from settled.projections._rows import _EVENT_INFO
    from settled.schemas import ModelResponseDelta

    assert _EVENT_INFO[ModelResponseDelta] == (None, True, None)
    assert ModelResponseDelta.model_fields["submission_id"].annotation is str


def test_the_prepared_call_row_is_built_in_the_tables_column_order() -> None:
    from settled.projections._rows import _PREPARED_COLUMNS
    from settled.projections._tables import TOOL_CALLS

    assert TOOL_CALLS.columns == _PREPARED_COLUMNS
