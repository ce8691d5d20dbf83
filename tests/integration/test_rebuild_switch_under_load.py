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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from settled import _failpoints
from settled._settings import Settings
from settled.client import Client
from settled.projections import ProjectionNames, Projector, RebuildResult, check, read_offsets, rebuild
from settled.runtime import App
from settled.services._worker_service import build_worker
from settled.testing.echo import EchoAgent
from tests._promise import promise
from tests.integration.admission_load import settlements
from tests.integration.helpers import committed_log_ends, fresh_projection, projecting, running, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.partitions(2)]

BEFORE_SWITCH = "rebuild.before_switch"
SWITCH_ATTEMPTS = 3


@pytest.fixture
def names(postgres_dsn: str) -> Iterator[ProjectionNames]:
    with fresh_projection(postgres_dsn) as n:
        yield n


@pytest.fixture
def live_projector(topics: Settings, names: ProjectionNames) -> Iterator[Projector]:
    with projecting(topics, names) as live:
        yield live.projector


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


def _wait_live_caught_up(s: Settings, names: ProjectionNames, timeout_s: float, what: str) -> None:
    """Wait until the live version has projected every committed log record."""
    ends = committed_log_ends(s)
    wait_for(lambda: all(_offsets(s, names.live).get(p, 0) >= o for p, o in ends.items()), timeout_s, what)


def _submit(client: Client, sent: list[str], prefix: str, **extra: Any) -> None:
    """Submit turn ``len(sent)`` of four conversations ``<prefix>-0..3``; remember its request id."""
    i = len(sent)
    sent.append(client.submit(f"{prefix}-{i % 4}", {"i": i, **extra}, timeout_s=30).request_id)


def _settled_and_projected(
    s: Settings, names: ProjectionNames, client: Client, sent: list[str], prefix: str, turns: int
) -> None:
    """Submit ``turns`` turns (`_submit`), wait until every turn sent is settled and the live projection has offsets."""
    for _ in range(turns):
        _submit(client, sent, prefix)
    wait_for(lambda: len(settlements(s)) >= len(sent), 60, "the first submissions settled")
    wait_for(lambda: bool(_offsets(s, names.live)), 30, "the live projection")


def _projected(s: Settings, names: ProjectionNames) -> set[str]:
    """The submission ids in the live version."""
    with psycopg.connect(s.postgres_dsn, autocommit=True) as conn:
        query = sql.SQL("SELECT submission_id FROM {}").format(sql.Identifier(names.live, "submissions"))
        return {r[0] for r in conn.execute(query).fetchall()}


def _rebuild_with_the_live_projector_ahead(
    s: Settings,
    names: ProjectionNames,
    control: _failpoints.FailpointControl,
    client: Client,
    sent: list[str],
    kwargs: dict[str, Any],
    *,
    prefix: str,
    turns: int,
    join_s: float,
    before_release: Callable[[], None] = lambda: None,
) -> tuple[RebuildResult | BaseException, list[tuple[dict[int, int], dict[int, int]]]]:
    """Run ``rebuild(s, names, **kwargs)`` in a thread, with the live projector ahead of it at every switch.

    At each hit of `BEFORE_SWITCH` (armed to pause; the new version caught up, the switch not begun): submit
    ``turns`` turns, wait until the live projector has projected past the new version, call ``before_release``, and
    let the switch go on.

    Returns:
        What the rebuild returned or raised, and per switch: (the new version's offsets, the live offsets when the
        switch was let go on).
    """
    outcome: list[RebuildResult | BaseException] = []

    def run_rebuild() -> None:
        try:
            outcome.append(rebuild(s, names, **kwargs))
        except BaseException as exc:  # noqa: BLE001 - examined by the caller
            outcome.append(exc)

    rebuilding = threading.Thread(target=run_rebuild, daemon=True)
    rebuilding.start()
    handled: set[tuple[int, int]] = set()
    behind_at_switch: list[tuple[dict[int, int], dict[int, int]]] = []
    deadline = time.monotonic() + 120
    while rebuilding.is_alive() and time.monotonic() < deadline:
        hits = [h for h in control.waiting(BEFORE_SWITCH) if (h.pid, h.hit) not in handled]
        if not hits:
            time.sleep(0.01)
            continue
        new = _offsets(s, names.building)
        for _ in range(turns):
            _submit(client, sent, prefix)
        _wait_live_ahead(s, names, new)
        behind_at_switch.append((new, _offsets(s, names.live)))
        before_release()
        handled.update((h.pid, h.hit) for h in hits)
        control.release(BEFORE_SWITCH)
    rebuilding.join(join_s)
    assert outcome, "the rebuild did not finish"
    return outcome[0], behind_at_switch


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

    def close(self) -> None:
        """Stop polling and wait for the polling thread (if it was started)."""
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join(30)


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

    worker = build_worker(s, App(agent=EchoAgent(delay_s=0.0)))
    try:
        with running(worker), Client(s) as client:
            _settled_and_projected(s, names, client, sent, "sw", 12)
            reader.thread.start()
            # The new version is caught up at each switch; one more turn puts the live projector ahead of it.
            result, behind_at_switch = _rebuild_with_the_live_projector_ahead(
                s, names, control, client, sent, kwargs, prefix="sw", turns=1, join_s=30
            )
            live_at_last_release = behind_at_switch[-1][1] if behind_at_switch else {}
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
                _submit(client, sent, "sw", after=j)
            wait_for(lambda: len(settlements(s)) >= len(sent), 60, "every submission settled")
        _wait_live_caught_up(s, names, 30, "the live projector caught up after the switch")
    finally:
        reader.close()
        _failpoints.reset()

    promise("DUR-015.atomic-switch", not reader.mixes, f"a reader saw a mix: {reader.mixes[:5]}")
    generations = [g for g, _, _ in reader.polls]
    assert generations and generations[0] == 1 and generations[-1] == 2, sorted(set(generations))
    assert generations == sorted(generations), "a reader saw the old version after the new one"
    counts = [n for _, n, _ in reader.polls]
    promise("DUR-015.atomic-switch", counts == sorted(counts), "the submission count went down between two polls")
    at = [o for _, _, o in reader.polls]
    promise("DUR-015.atomic-switch", at == sorted(at), "the projected offsets went down between two polls")
    projected = _projected(s, names)
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
    reader = _Reader(s, names)
    kwargs: dict[str, Any] = {
        "switch_attempts": 2,
        "workers": 1,
        "max_records": 1,
        "locked_catch_up_timeout_s": 0.3,
        "timeout_s": 120.0,
    }

    worker = build_worker(s, App(agent=EchoAgent(delay_s=0.0)))
    try:
        with running(worker), Client(s) as client:
            _settled_and_projected(s, names, client, sent, "tb", 8)
            reader.thread.start()
            # Two turns a switch: a gap of several records, several one-record steps of 1 s each.
            result, _behind = _rebuild_with_the_live_projector_ahead(
                s,
                names,
                control,
                client,
                sent,
                kwargs,
                prefix="tb",
                turns=2,
                join_s=60,
                before_release=lambda: control.arm("projector.before_commit", "1+*delay(1s)"),
            )
            assert isinstance(result, TimeoutError), f"the switch waited for its slow catch-up: {result!r}"
            assert "bound" in str(result), result
            # The live projector goes on: everything is projected into the (old) live version.
            control.disarm("projector.before_commit")
            _submit(client, sent, "tb", after=True)
            wait_for(lambda: len(settlements(s)) >= len(sent), 60, "every submission settled")
        _wait_live_caught_up(s, names, 60, "the live projector caught up after the rolled-back switches")
    finally:
        reader.close()
        _failpoints.reset()

    promise("DUR-015.atomic-switch", not reader.mixes, f"a reader saw a mix: {reader.mixes[:5]}")
    assert {g for g, _, _ in reader.polls} == {1}, "a rolled-back switch changed the live version"
    projected = _projected(s, names)
    assert set(sent) <= projected, f"missing from the live version: {set(sent) - projected}"
