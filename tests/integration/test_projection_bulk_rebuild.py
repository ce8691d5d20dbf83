"""A rebuild's bulk replay in child processes gives the live projector's rows; check is clean after it (issue 7).

The live projector upserts chunk by chunk; the rebuild folds each partition in memory and writes the final rows once
with COPY, its partitions split over processes (``workers=2`` even on a short log), then catches up through seeded
projectors and switches. Both must hold the same rows, and `settled projections check` must find live, a fresh
(parallel) rebuild and the reference fold equal.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from psycopg import sql

from settled._settings import Settings
from settled.producers import provision_topics
from settled.projections import (
    TABLES,
    ProjectionNames,
    Projector,
    ProjectorConfig,
    check,
    read_offsets,
    read_table,
    rebuild,
)
from settled.runtime import App
from settled.services._worker_service import build_worker
from settled.testing.echo import EchoAgent
from tests._promise import promise
from tests.integration.admission_load import make_load, produce_load, settlements
from tests.integration.helpers import CODEC, read_topic, running, wait_for


@pytest.fixture
def names(postgres_dsn: str) -> Iterator[ProjectionNames]:
    n = ProjectionNames(f"pb_{uuid.uuid4().hex[:12]}")
    yield n
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        for schema in (n.live, n.building, n.retired, n.scratch):
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def _tables(s: Settings, schema: str) -> dict[str, Any]:
    with psycopg.connect(s.postgres_dsn, autocommit=True) as conn:
        return {name: dict(read_table(conn, schema, spec)) for name, spec in TABLES.items()}


def _differing(a: dict[Any, Any], b: dict[Any, Any]) -> int:
    return sum(1 for key in a.keys() | b.keys() if a.get(key) != b.get(key))


def _projected(s: Settings, names: ProjectionNames) -> bool:
    ends: dict[int, int] = {}
    for r in read_topic(s, "log"):
        ends[r.partition] = r.offset + 1
    with psycopg.connect(s.postgres_dsn, autocommit=True) as conn:
        try:
            stored = read_offsets(conn, names.live, s.topic("log"))
        except psycopg.errors.UndefinedTable:
            return False
    return all(stored.get(p, 0) >= end for p, end in ends.items())


def test_a_parallel_rebuild_holds_the_live_rows_and_check_is_clean(settings: Settings, names: ProjectionNames) -> None:
    s = settings.model_copy(update={"partitions": 3})
    provision_topics(s, CODEC, datetime.now(UTC))
    load = make_load(7, conversations=9, total=150, duplicates=15, resends=8, conflicts=12, adjacent=5)
    produce_load(s, load)
    worker = build_worker(s, App(agent=EchoAgent(delay_s=0.0)))
    with running(worker):
        wait_for(lambda: len(settlements(s)) >= load.count["original"], 90, "every original settled")

    projector = Projector(s, ProjectorConfig(names=names))
    thread = threading.Thread(target=projector.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: _projected(s, names), 60, "the live projection caught up")
        live = _tables(s, names.live)
        assert len(live["submissions"]) == load.count["original"]

        # A projector thread runs in this process: the rebuild's children are spawned, not forked.
        result = rebuild(s, names, workers=2, parallel_min_records=0, timeout_s=120)
        assert result.workers == 2
        assert result.work.records > 0 and result.work.rows_written > 0
        rebuilt = _tables(s, names.live)
        differ = {name: _differing(live[name], rebuilt[name]) for name in TABLES}
        promise("DUR-015.rebuild", live == rebuilt, f"rows differing per table after the bulk rebuild: {differ}")

        report = check(s, names, workers=2, parallel_min_records=0, timeout_s=120)
        shown = "\n".join(f"  {d}" for d in report.differences[:15])
        promise("DUR-015.rebuild", report.ok, f"live, rebuild and reference fold differ:\n{shown}")
    finally:
        projector.stop()
        thread.join(30)
