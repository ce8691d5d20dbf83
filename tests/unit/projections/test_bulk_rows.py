"""The bulk replay's row shortcuts give exactly the per-batch rows (issue 7: rebuild = live = reference fold)."""

from __future__ import annotations

from settled.projections import ProjectionState, RowSet, project_batch
from settled.schemas import LogBatch
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
