"""A rebuild's switch cannot be starved by a live projector that keeps moving ahead (issue 7 point 3; DUR-015).

Real Kafka, real Postgres, a real worker (the echo app, in-process) and a live projector thread. At the failpoint
``rebuild.before_switch`` (the new version caught up, the switch transaction not begun) the test submits a turn and
waits until the live projector has projected it — so at every switch the live version is ahead of the new one, the
way heavy live traffic leaves it. A switch that only compares offsets (and retries) fails every attempt; the switch
must instead catch the new version up while it holds the live projector back, and switch at once. A reader polling
throughout must never see a mix of versions, and nothing appended during the rebuild may be missing afterwards.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from settled import _failpoints
from settled._settings import Settings
from settled.client import Client
from settled.producers import provision_topics
from settled.projections import ProjectionNames, Projector, ProjectorConfig, RebuildResult, check, read_offsets, rebuild
from settled.runtime import App
from settled.runtime.echo import EchoAgent
from settled.services._worker_service import build_worker
from tests._promise import promise
from tests.integration.admission_load import settlements
from tests.integration.helpers import CODEC, read_topic, running, wait_for

pytestmark = pytest.mark.integration

BEFORE_SWITCH = "rebuild.before_switch"
SWITCH_ATTEMPTS = 3


@pytest.fixture
def topics(settings: Settings) -> Settings:
    s = settings.model_copy(update={"partitions": 2})
    provision_topics(s, CODEC, datetime.now(UTC))
    return s


@pytest.fixture
def names(postgres_dsn: str) -> Iterator[ProjectionNames]:
    n = ProjectionNames(f"rs_{uuid.uuid4().hex[:12]}")
    yield n
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        for schema in (n.live, n.building, n.retired, n.scratch):
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


@pytest.fixture
def live_projector(topics: Settings, names: ProjectionNames) -> Iterator[Projector]:
    projector = Projector(topics, ProjectorConfig(names=names))
    errors: list[BaseException] = []

    def target() -> None:
        try:
            projector.run()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test thread below
            errors.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    yield projector
    projector.stop()
    thread.join(30)
    if errors:
        raise errors[0]


def _offsets(s: Settings, schema: str) -> dict[int, int]:
    with psycopg.connect(s.postgres_dsn, autocommit=True) as conn:
        try:
            return read_offsets(conn, schema, s.topic("log"))
        except psycopg.errors.UndefinedTable:
            return {}


def _ahead(live: dict[int, int], new: dict[int, int]) -> bool:
    return any(o > new.get(p, 0) for p, o in live.items())


def _wait_live_ahead(s: Settings, names: ProjectionNames, new: dict[int, int]) -> None:
    """Wait until the live projector has projected past the new version's offsets at some partition."""
    wait_for(lambda: _ahead(_offsets(s, names.live), new), 30, f"the live projector ahead of the rebuild at {new}")


class _Reader:
    """Polls the live version in REPEATABLE READ transactions: generation, submissions, offsets, generation again."""

    def __init__(self, s: Settings, names: ProjectionNames) -> None:
        self.s = s
        self.names = names
        self.stop = threading.Event()
        self.polls: list[tuple[int, int, int]] = []
        self.mixes: list[str] = []
        self.retried = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        live = self.names.live
        generation = sql.SQL("SELECT value FROM {} WHERE key = 'generation'").format(sql.Identifier(live, "meta"))
        count = sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(live, "submissions"))
        offsets = sql.SQL("SELECT coalesce(sum(next_offset), 0) FROM {}").format(sql.Identifier(live, "offsets"))
        with psycopg.connect(self.s.postgres_dsn, autocommit=True) as conn:
            conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            while not self.stop.is_set():
                try:
                    with conn.transaction():
                        first = conn.execute(generation).fetchone()
                        n = conn.execute(count).fetchone()
                        at = conn.execute(offsets).fetchone()
                        second = conn.execute(generation).fetchone()
                except (psycopg.errors.DeadlockDetected, psycopg.errors.LockNotAvailable):
                    self.retried += 1
                    continue
                if first is None or second is None or n is None or at is None:
                    self.mixes.append(f"a version without its generation: {first}, {second}")
                    continue
                if first[0] != second[0]:
                    self.mixes.append(f"generation {first[0]} then {second[0]} in one transaction")
                self.polls.append((int(first[0]), int(n[0]), int(at[0])))
                time.sleep(0.005)


@pytest.mark.parametrize(
    ("max_gap", "attempts", "workers"),
    [
        pytest.param(None, 1, 1, id="caught-up-under-the-lock"),
        # The catch-up under the lock through the replaying child processes (spawned: this process runs threads).
        pytest.param(None, 1, 2, id="caught-up-under-the-lock-by-2-workers"),
        # A gap above the bound: one more catch-up round outside the lock, then the next switch catches up under it.
        pytest.param(0, 2, 1, id="gap-too-large-once"),
    ],
)
def test_the_switch_catches_up_under_the_lock_while_the_live_projector_keeps_moving_ahead(
    topics: Settings,
    names: ProjectionNames,
    live_projector: Projector,
    tmp_path: Path,
    max_gap: int | None,
    attempts: int,
    workers: int,
) -> None:
    s = topics
    fp_dir = tmp_path / "fp"
    _failpoints.configure(f"{BEFORE_SWITCH}=1+*pause(60s)", control_dir=fp_dir)
    control = _failpoints.FailpointControl(fp_dir)
    sent: list[str] = []
    outcome: list[RebuildResult | BaseException] = []
    reader = _Reader(s, names)
    # Every switch begins behind the live projector: a switch that merely retries gives up after these.
    kwargs: dict[str, Any] = {
        "switch_attempts": SWITCH_ATTEMPTS,
        "workers": workers,
        "parallel_min_records": 0,
        "timeout_s": 120.0,
    }
    if max_gap is not None:
        kwargs["locked_catch_up_max_offsets"] = max_gap

    def run_rebuild() -> None:
        try:
            outcome.append(rebuild(s, names, **kwargs))
        except BaseException as exc:  # noqa: BLE001 - examined in the test thread below
            outcome.append(exc)

    worker = build_worker(s, App(agent=EchoAgent(delay_s=0.0)))
    try:
        with running(worker), Client(s) as client:
            for i in range(12):
                sent.append(client.submit(f"sw-{i % 4}", {"i": i}, timeout_s=30).request_id)
            wait_for(lambda: len(settlements(s)) >= len(sent), 60, "the first submissions settled")
            wait_for(lambda: bool(_offsets(s, names.live)), 30, "the live projection")
            reader.thread.start()
            rebuilding = threading.Thread(target=run_rebuild, daemon=True)
            rebuilding.start()
            handled: set[tuple[int, int]] = set()
            behind_at_switch: list[tuple[dict[int, int], dict[int, int]]] = []
            live_at_last_release: dict[int, int] = {}
            deadline = time.monotonic() + 120
            while rebuilding.is_alive() and time.monotonic() < deadline:
                hits = [h for h in control.waiting(BEFORE_SWITCH) if (h.pid, h.hit) not in handled]
                if not hits:
                    time.sleep(0.01)
                    continue
                # The new version is caught up; append and let the live projector get ahead of it before the switch.
                new = _offsets(s, names.building)
                i = len(sent)
                sent.append(client.submit(f"sw-{i % 4}", {"i": i}, timeout_s=30).request_id)
                _wait_live_ahead(s, names, new)
                live_at_last_release = _offsets(s, names.live)
                behind_at_switch.append((new, live_at_last_release))
                handled.update((h.pid, h.hit) for h in hits)
                control.release(BEFORE_SWITCH)
            rebuilding.join(30)
            assert outcome, "the rebuild did not finish"
            result = outcome[0]
            promise(
                "DUR-015.rebuild-switch-converges",
                isinstance(result, RebuildResult),
                f"the rebuild gave up while the live projector kept moving ahead ({behind_at_switch}): {result!r}",
            )
            assert isinstance(result, RebuildResult)
            assert result.generation == 2 and result.switch_attempts == attempts, result
            assert result.workers == workers, result
            assert result.phases.get("locked_catch_up", 0.0) > 0, f"nothing caught up under the lock: {result.phases}"
            assert len(behind_at_switch) == attempts, behind_at_switch  # each switch began behind
            # Caught up to the live projector under its lock: at or past where it was when the switch began.
            promise(
                "DUR-015.atomic-switch",
                all(result.offsets.get(p, 0) >= o for p, o in live_at_last_release.items()),
                f"switched at {result.offsets}, behind the live offsets {live_at_last_release}",
            )
            # Records appended after the switch go on into the new version.
            for j in range(4):
                i = len(sent)
                sent.append(client.submit(f"sw-{i % 4}", {"i": i, "after": j}, timeout_s=30).request_id)
            wait_for(lambda: len(settlements(s)) >= len(sent), 60, "every submission settled")
        ends = _last_records(s)
        wait_for(
            lambda: all(_offsets(s, names.live).get(p, 0) >= o for p, o in ends.items()),
            30,
            "the live projector caught up after the switch",
        )
    finally:
        reader.stop.set()
        if reader.thread.is_alive():
            reader.thread.join(30)
        _failpoints.reset()

    promise("DUR-015.atomic-switch", not reader.mixes, f"a reader saw a mix: {reader.mixes[:5]}")
    generations = [g for g, _, _ in reader.polls]
    assert generations and generations[0] == 1 and generations[-1] == 2, sorted(set(generations))
    assert generations == sorted(generations), "a reader saw the old version after the new one"
    counts = [n for _, n, _ in reader.polls]
    promise("DUR-015.atomic-switch", counts == sorted(counts), "the submission count went down between two polls")
    at = [o for _, _, o in reader.polls]
    promise("DUR-015.atomic-switch", at == sorted(at), "the projected offsets went down between two polls")
    with psycopg.connect(s.postgres_dsn, autocommit=True) as conn:
        projected = {r[0] for r in conn.execute(sql.SQL("SELECT submission_id FROM {}").format(
            sql.Identifier(names.live, "submissions"))).fetchall()}  # fmt: skip
    promise("DUR-015.atomic-switch", set(sent) <= projected, f"missing after the rebuild: {set(sent) - projected}")
    report = check(s, names, timeout_s=60)
    shown = "\n".join(f"  {d}" for d in report.differences[:15])
    promise("DUR-015.rebuild", report.ok, f"live, rebuild and reference fold differ at {report.offsets}:\n{shown}")


def test_a_catch_up_under_the_lock_past_its_bound_rolls_the_switch_back_and_the_live_projector_goes_on(
    topics: Settings, names: ProjectionNames, live_projector: Projector, tmp_path: Path
) -> None:
    """The live projector waits for the switch's catch-up at most ``locked_catch_up_timeout_s`` (review finding 5).

    Every switch begins behind the live projector (as above), and from the first switch on every projector commit in
    this process is slowed (``projector.before_commit``: 1 s) while the rebuild catches up one record per step: the
    catch-up under the lock cannot reach the live offsets within its 0.3 s bound. Each switch must then roll back
    (the live version stays, the live projector goes on) instead of holding the live projector back until the
    catch-up ends; with two attempts the rebuild gives up naming the bound.
    """
    s = topics
    fp_dir = tmp_path / "fp"
    _failpoints.configure(f"{BEFORE_SWITCH}=1+*pause(60s)", control_dir=fp_dir)
    control = _failpoints.FailpointControl(fp_dir)
    sent: list[str] = []
    outcome: list[RebuildResult | BaseException] = []
    reader = _Reader(s, names)
    kwargs: dict[str, Any] = {
        "switch_attempts": 2,
        "workers": 1,
        "max_records": 1,
        "locked_catch_up_timeout_s": 0.3,
        "timeout_s": 120.0,
    }

    def run_rebuild() -> None:
        try:
            outcome.append(rebuild(s, names, **kwargs))
        except BaseException as exc:  # noqa: BLE001 - examined in the test thread below
            outcome.append(exc)

    worker = build_worker(s, App(agent=EchoAgent(delay_s=0.0)))
    try:
        with running(worker), Client(s) as client:
            for i in range(8):
                sent.append(client.submit(f"tb-{i % 4}", {"i": i}, timeout_s=30).request_id)
            wait_for(lambda: len(settlements(s)) >= len(sent), 60, "the first submissions settled")
            wait_for(lambda: bool(_offsets(s, names.live)), 30, "the live projection")
            reader.thread.start()
            rebuilding = threading.Thread(target=run_rebuild, daemon=True)
            rebuilding.start()
            handled: set[tuple[int, int]] = set()
            deadline = time.monotonic() + 120
            while rebuilding.is_alive() and time.monotonic() < deadline:
                hits = [h for h in control.waiting(BEFORE_SWITCH) if (h.pid, h.hit) not in handled]
                if not hits:
                    time.sleep(0.01)
                    continue
                new = _offsets(s, names.building)
                for _ in range(2):  # a gap of several records: several one-record steps of 1 s each
                    i = len(sent)
                    sent.append(client.submit(f"tb-{i % 4}", {"i": i}, timeout_s=30).request_id)
                _wait_live_ahead(s, names, new)
                control.arm("projector.before_commit", "1+*delay(1s)")
                handled.update((h.pid, h.hit) for h in hits)
                control.release(BEFORE_SWITCH)
            rebuilding.join(60)
            assert outcome, "the rebuild did not finish"
            result = outcome[0]
            assert isinstance(result, TimeoutError), f"the switch waited for its slow catch-up: {result!r}"
            assert "bound" in str(result), result
            # The live projector goes on: everything is projected into the (old) live version.
            control.disarm("projector.before_commit")
            i = len(sent)
            sent.append(client.submit(f"tb-{i % 4}", {"i": i, "after": True}, timeout_s=30).request_id)
            wait_for(lambda: len(settlements(s)) >= len(sent), 60, "every submission settled")
        ends = _last_records(s)
        wait_for(
            lambda: all(_offsets(s, names.live).get(p, 0) >= o for p, o in ends.items()),
            60,
            "the live projector caught up after the rolled-back switches",
        )
    finally:
        reader.stop.set()
        if reader.thread.is_alive():
            reader.thread.join(30)
        _failpoints.reset()

    promise("DUR-015.atomic-switch", not reader.mixes, f"a reader saw a mix: {reader.mixes[:5]}")
    assert {g for g, _, _ in reader.polls} == {1}, "a rolled-back switch changed the live version"
    with psycopg.connect(s.postgres_dsn, autocommit=True) as conn:
        projected = {r[0] for r in conn.execute(sql.SQL("SELECT submission_id FROM {}").format(
            sql.Identifier(names.live, "submissions"))).fetchall()}  # fmt: skip
    assert set(sent) <= projected, f"missing from the live version: {set(sent) - projected}"


def _last_records(s: Settings) -> dict[int, int]:
    """Per partition, the offset after the last committed log record (what a caught-up projector stores)."""
    out: dict[int, int] = {}
    for r in read_topic(s, "log"):
        out[r.partition] = r.offset + 1
    return out
