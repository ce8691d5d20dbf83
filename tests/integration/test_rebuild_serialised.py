"""Rebuilds and checks of one projection run one at a time (settled.projections._rebuild module doc; docs/design.md §6).

Real Kafka, real Postgres, a real worker (the echo app) and a live projector thread. A first rebuild (A) is held at
``rebuild.before_switch`` while the live projector moves ahead, then released into its switch with slow catch-up
commits, so it holds the live tables ``IN EXCLUSIVE MODE`` while its catch-up projector writes ``<base>__next``. A
second rebuild (B) and a check started then must fail at once with `RebuildInProgressError` — before the fix B's
``DROP SCHEMA <base>__next`` either dropped the schema A had just switched to live, or queued behind A's switch while
A's catch-up queued behind it (a deadlock PostgreSQL cannot detect). A must switch, the live projection must exist,
and `check` must then be clean (which also shows that A released the lock).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from settled import _failpoints
from settled._settings import Settings
from settled.client import Client
from settled.projections import (
    ProjectionNames,
    Projector,
    RebuildInProgressError,
    RebuildResult,
    check,
    maintenance_lock_key,
    read_meta,
    rebuild,
    schema_exists,
)
from settled.runtime import App
from settled.services._worker_service import build_worker
from settled.testing.echo import EchoAgent
from tests.integration.admission_load import settlements
from tests.integration.helpers import running, wait_for
from tests.integration.test_rebuild_switch_under_load import (  # noqa: F401 - fixtures
    _offsets,
    _settled_and_projected,
    _submit,
    _wait_live_ahead,
    live_projector,
    names,
)

pytestmark = [pytest.mark.integration, pytest.mark.partitions(2)]

BEFORE_SWITCH = "rebuild.before_switch"
FAIL_FAST_S = 5.0


def _settled_then_held(
    s: Settings,
    names: ProjectionNames,  # noqa: F811
    client: Client,
    prefix: str,
    maintaining: threading.Thread,
    control: _failpoints.FailpointControl,
    point: str = BEFORE_SWITCH,
) -> list[str]:
    """Settle four turns and see them projected live, then start the rebuild or check thread and wait until it is
    held at the failpoint ``point`` (armed by the caller). Returns the turns' request ids."""
    sent: list[str] = []
    _settled_and_projected(s, names, client, sent, prefix, 4)
    maintaining.start()
    control.wait_reached(point, 60)
    return sent


def _end_lock_session(s: Settings, names: ProjectionNames) -> list[tuple[Any, ...]]:  # noqa: F811
    """Terminate the session holding the projection's maintenance lock (as a network cut or an administrator's
    ``pg_terminate_backend`` does); returns one ``(True,)`` per session ended."""
    key = maintenance_lock_key(names.base)
    with psycopg.connect(s.postgres_dsn, autocommit=True) as admin:
        return admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND granted "
            "AND objsubid = 1 AND classid = %s::bigint::oid AND objid = %s::bigint::oid",
            ((key >> 32) & 0xFFFFFFFF, key & 0xFFFFFFFF),
        ).fetchall()


def test_the_maintenance_lock_key_is_deterministic_and_per_projection() -> None:
    assert maintenance_lock_key("settled") == maintenance_lock_key("settled")
    assert maintenance_lock_key("settled") != maintenance_lock_key("other")
    assert -(2**63) <= maintenance_lock_key("settled") < 2**63


@pytest.mark.parametrize(("max_records", "delay"), [(10_000, "1500ms"), (1, "500ms")], ids=["one-chunk", "chunks"])
def test_a_second_rebuild_during_the_locked_catch_up_fails_fast_and_the_first_switches(
    max_records: int,
    delay: str,
    topics: Settings,
    names: ProjectionNames,  # noqa: F811
    live_projector: Projector,  # noqa: F811
    tmp_path: Path,
) -> None:
    s = topics
    fp_dir = tmp_path / "fp"
    _failpoints.configure(f"{BEFORE_SWITCH}=1*pause(60s)", control_dir=fp_dir)
    control = _failpoints.FailpointControl(fp_dir)
    outcome: dict[str, Any] = {}

    def run(label: str, **kwargs: Any) -> None:
        started = time.monotonic()
        try:
            outcome[label] = rebuild(s, names, workers=1, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - examined below
            outcome[label] = exc
        outcome[label + "_s"] = time.monotonic() - started

    worker = build_worker(s, App(agent=EchoAgent(delay_s=0.0)))
    first = threading.Thread(target=run, args=("A",), kwargs={"timeout_s": 40.0, "max_records": max_records})
    first.daemon = True
    try:
        with running(worker), Client(s) as client:
            sent = _settled_then_held(s, names, client, "rs", first, control)
            new = _offsets(s, names.building)
            for _ in range(3):
                _submit(client, sent, "rs")
            wait_for(lambda: len(settlements(s)) >= len(sent), 60, "the later submissions settled")
            _wait_live_ahead(s, names, new)
            # Slow catch-up commits: A's switch catches up under the live lock for a few seconds.
            control.arm("projector.before_commit", f"1+*delay({delay})")
            control.release(BEFORE_SWITCH)
            time.sleep(0.7)  # A: in its switch transaction, catching up under the lock
            second = threading.Thread(target=run, args=("B",), kwargs={"timeout_s": 40.0}, daemon=True)
            second.start()
            second.join(FAIL_FAST_S)
            assert not second.is_alive(), f"the second rebuild did not fail fast (still running after {FAIL_FAST_S} s)"
            b = outcome.get("B")
            assert isinstance(b, RebuildInProgressError), f"the second rebuild: {b!r}"
            assert names.base in str(b) and b.base == names.base
            assert outcome["B_s"] < FAIL_FAST_S
            if first.is_alive():  # a check started meanwhile is refused too
                with pytest.raises(RebuildInProgressError, match=names.base):
                    check(s, names, timeout_s=20.0)
            first.join(45)
            assert not first.is_alive(), "the first rebuild did not finish"
            control.disarm("projector.before_commit")
    finally:
        _failpoints.reset()
        if first.is_alive():  # only on failure: unblock the fixtures' teardown
            with psycopg.connect(s.postgres_dsn, autocommit=True) as conn:
                conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND application_name LIKE 'settled-projections%%' AND query LIKE %s",
                    (f"%{names.base}%",),
                )
    a = outcome.get("A")
    assert isinstance(a, RebuildResult), f"the first rebuild: {a!r}"
    assert a.generation == 2
    with psycopg.connect(s.postgres_dsn, autocommit=True) as conn:
        assert schema_exists(conn, names.live), f"the live projection schema {names.live} is gone"
        assert not schema_exists(conn, names.building)
    report = check(s, names, timeout_s=60.0)  # takes the lock: A released it
    assert report.ok, report.differences
    assert sum(report.offsets.values()) > 0


def test_a_rebuild_and_a_check_are_refused_while_the_lock_is_held_and_change_nothing(
    topics: Settings,
    names: ProjectionNames,  # noqa: F811
) -> None:
    with psycopg.connect(topics.postgres_dsn, autocommit=True, application_name="holder") as holder:
        holder.execute("SELECT pg_advisory_lock(%s::bigint)", (maintenance_lock_key(names.base),))
        started = time.monotonic()
        with pytest.raises(RebuildInProgressError, match=names.base) as refused:
            rebuild(topics, names, workers=1, timeout_s=20.0)
        assert "'holder'" in str(refused.value)
        with pytest.raises(RebuildInProgressError, match=names.base):
            check(topics, names, timeout_s=20.0)
        assert time.monotonic() - started < FAIL_FAST_S
        with psycopg.connect(topics.postgres_dsn, autocommit=True) as conn:
            assert not schema_exists(conn, names.building)
            assert not schema_exists(conn, names.scratch)


def _held_while_its_lock_session_ends(
    s: Settings,
    names: ProjectionNames,  # noqa: F811
    point: str,
    call: Callable[[], object],
    tmp_path: Path,
) -> object:
    """Run ``call`` (a rebuild or a check) in a thread once four turns are settled and projected, hold it at the
    failpoint ``point``, end the session holding its maintenance lock (`_end_lock_session`), release it, and return
    what it returned or raised."""
    fp_dir = tmp_path / "fp"
    _failpoints.configure(f"{point}=1*pause(60s)", control_dir=fp_dir)
    control = _failpoints.FailpointControl(fp_dir)
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(call())
        except BaseException as exc:  # noqa: BLE001 - returned, examined by the caller
            outcome.append(exc)

    worker = build_worker(s, App(agent=EchoAgent(delay_s=0.0)))
    maintaining = threading.Thread(target=run, daemon=True)
    try:
        with running(worker), Client(s) as client:
            _settled_then_held(s, names, client, "ld", maintaining, control, point)
            ended = _end_lock_session(s, names)
            assert ended == [(True,)], f"the lock's session: {ended}"
            control.release(point)
            maintaining.join(45)
            assert not maintaining.is_alive(), f"held at {point}: it did not end"
    finally:
        _failpoints.reset()
    return outcome[0]


def test_a_rebuild_whose_lock_session_dropped_switches_nothing_and_the_next_rebuild_does(
    topics: Settings,
    names: ProjectionNames,  # noqa: F811
    live_projector: Projector,  # noqa: F811
    tmp_path: Path,
) -> None:
    """The rebuild switches on the session that holds its maintenance lock: once that session is gone (here
    terminated at ``rebuild.before_switch``; a network drop or an administrator does the same), the lock is gone, so
    another rebuild could have started, and the switch must fail instead of renaming the schemas unserialised."""
    s = topics
    a = _held_while_its_lock_session_ends(
        s, names, BEFORE_SWITCH, lambda: rebuild(s, names, workers=1, timeout_s=40.0), tmp_path
    )
    assert isinstance(a, psycopg.OperationalError), f"the rebuild without its lock: {a!r}"
    with psycopg.connect(s.postgres_dsn, autocommit=True) as conn:
        assert read_meta(conn, names.live).get("generation") == "1", "the live version was switched without the lock"
    again = rebuild(s, names, workers=1, timeout_s=40.0)
    assert again.generation == 2
    report = check(s, names, timeout_s=60.0)
    assert report.ok, report.differences


def test_a_check_whose_lock_session_dropped_reports_nothing(
    topics: Settings,
    names: ProjectionNames,  # noqa: F811
    live_projector: Projector,  # noqa: F811
    tmp_path: Path,
) -> None:
    """A check reads the live and scratch tables on sessions of their own: once its lock's session is gone another
    rebuild or check may rewrite ``<base>__check``, so it must fail instead of returning a report."""
    s = topics
    result = _held_while_its_lock_session_ends(
        s, names, "check.before_snapshot", lambda: check(s, names, timeout_s=40.0, keep_scratch=True), tmp_path
    )
    assert isinstance(result, psycopg.OperationalError), f"the check without its lock: {result!r}"
    report = check(s, names, timeout_s=60.0)  # the lock is free again
    assert report.ok, report.differences
