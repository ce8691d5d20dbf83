"""A submission's retry budget (issue 22 item 4; scenario 14; docs/semantics.md §16, DUR-014).

Real worker processes on the real broker. A charged attempt (a death, an uncaught error) within ``max_attempts`` is
retried after a backoff recorded in the log (`SubmissionRetryScheduled` and its timed wait, whose deadline is the
wake-up); after the budget the submission settles failed once, as a dead letter (``retry_budget_exhausted``, naming
the attempts and the last cause), and the conversation's next submission runs; ``settled retry`` (signed with the
resolver's key) then admits the dead letter's payload once more as a new submission (``retry_of``), and a second
retry is a duplicate pointing at the first. The engine app's backoff is 300 ms doubling (test values).
"""

from __future__ import annotations

import base64
import os
import random
import time
from pathlib import Path

import psycopg
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat
from psycopg import sql
from typer.testing import CliRunner

from settled import EXIT_CODES, ErrorCategory
from settled._settings import Settings
from settled.protocol import RETRY_BUDGET_EXHAUSTED
from settled.schemas import (
    AttemptStarted,
    LogEvent,
    Receipt,
    ReceiptOutcome,
    RequestKind,
    Settlement,
    SettlementOutcome,
    SubmissionAdmitted,
    SubmissionDuplicate,
    SubmissionProposed,
    SubmissionRetryScheduled,
    WaitOutcome,
    WaitRequested,
    WaitResolved,
)
from settled.services.cli import app as cli
from settled.testing import Supervisor
from tests._promise import promise
from tests.integration.engine._helpers import MODEL_APP, events_of, log_events, plan, send, settled, settlements
from tests.integration.engine.conftest import SpawnWorker
from tests.integration.engine.engine_app import BACKOFF_BASE_MS, RESOLVER_KEY_ID, RESOLVER_PRIVATE_KEY, flag, world
from tests.integration.engine.model_app import prompts
from tests.integration.helpers import check_clean, fresh_projection, projecting, proposal, wait_projected

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

#: The budget of the engine app (``max_attempts``).
MAX_ATTEMPTS = 3


def _check_backoffs(events: list[LogEvent]) -> None:
    """Each retry n: scheduled after attempt n with a doubling backoff, its wait expired at or after its wake-up,
    and attempt n + 1 started after that expiry."""
    retries = [e for e in events if isinstance(e, SubmissionRetryScheduled)]
    assert [r.retry for r in retries] == list(range(1, MAX_ATTEMPTS)), retries
    for r in retries:
        low = BACKOFF_BASE_MS * 2 ** (r.retry - 1)
        assert low <= r.backoff_ms <= low * 1.2, r  # doubling, plus up to 20% jitter
    assert retries[0].wake_at < retries[1].wake_at, retries  # the recorded wake-ups increase
    index = {id(e): i for i, e in enumerate(events)}
    starts = {e.attempt: e for e in events if isinstance(e, AttemptStarted)}
    assert sorted(starts) == list(range(1, MAX_ATTEMPTS + 1)), starts
    for r in retries:
        (request,) = [e for e in events if isinstance(e, WaitRequested) and e.wait_id == r.wait_id]
        (resolved,) = [e for e in events if isinstance(e, WaitResolved) and e.wait_id == r.wait_id]
        assert request.deadline == r.wake_at, (request, r)
        assert resolved.outcome is WaitOutcome.EXPIRED and resolved.decided_at >= r.wake_at, (resolved, r)
        assert r.attempt_id == starts[r.retry].attempt_id, (r, starts)
        assert index[id(starts[r.retry])] < index[id(r)] < index[id(request)] < index[id(resolved)]
        assert index[id(resolved)] < index[id(starts[r.retry + 1])], "the next attempt started before its wake-up"


def _check_lane_moved_on(s: Settings, dead: SubmissionProposed, after: SubmissionProposed) -> None:
    """The dead letter settled once, and the conversation's next submission ran after it and completed."""
    counts = [r.submission_id for r in settlements(s)].count(dead.submission_id)
    assert counts == 1, f"{counts} settlements of the dead-lettered submission"
    nxt = settled(s, after.submission_id)
    assert nxt is not None and nxt.outcome is SettlementOutcome.COMPLETED, nxt
    log = log_events(s)
    (dead_at,) = [i for i, e in enumerate(log) if isinstance(e, Settlement) and e.submission_id == dead.submission_id]
    started = [i for i, e in enumerate(log) if isinstance(e, AttemptStarted) and e.submission_id == after.submission_id]
    assert started and min(started) > dead_at, "the next submission started before the dead letter settled"


def _write_key(path: Path, key: Ed25519PrivateKey) -> str:
    """Write a signing key as ``settled retry --key-file`` reads it (base64 of the raw 32 bytes); return the path."""
    path.write_text(base64.b64encode(key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())).decode())
    return str(path)


def _retry_cli(s: Settings, dead: SubmissionProposed, key_file: str) -> tuple[int, Receipt]:
    """Run ``settled retry`` (its entry function, in this process) for a dead letter; return its exit code and reply."""
    env = {"SETTLED_NAMESPACE": s.namespace, "SETTLED_KAFKA_BOOTSTRAP": s.kafka_bootstrap}
    args = ["retry", dead.submission_id, "--conversation", dead.conversation_id, "--key-file", key_file,
            "--key-id", RESOLVER_KEY_ID, "--principal", "ops", "--timeout-s", "60"]  # fmt: skip
    done = CliRunner().invoke(cli, args, env=env)
    assert done.stdout.strip(), done.output
    return done.exit_code, Receipt.model_validate_json(done.stdout.strip().splitlines()[0])


def _check_retry(s: Settings, dead: SubmissionProposed, tmp_path: Path, postgres_dsn: str) -> None:
    """``settled retry`` admits the dead letter's payload once as a new submission that runs and completes; a forged
    key is refused; a second retry is a duplicate pointing at the first; the projection shows ``retry_of``."""
    code, forged = _retry_cli(s, dead, _write_key(tmp_path / "forged.key", Ed25519PrivateKey.generate()))
    assert code == EXIT_CODES[ErrorCategory.REJECTED] == 1, forged
    assert forged.outcome is ReceiptOutcome.REJECTED and (forged.reason or "").startswith("bad_signature"), forged
    key_file = _write_key(tmp_path / "resolver.key", RESOLVER_PRIVATE_KEY)
    code, first = _retry_cli(s, dead, key_file)
    assert code == 0, first
    assert (first.request_kind, first.outcome, first.submission_seq) == (
        RequestKind.COMMAND,
        ReceiptOutcome.APPLIED,
        3,  # the dead letter was 1, the submission after it 2
    ), first
    retried = first.original_submission_id
    assert retried is not None and retried != dead.submission_id, first
    deadline = time.monotonic() + 60
    while settled(s, retried) is None:
        assert time.monotonic() < deadline, f"the retry {retried} did not settle: {settlements(s)}"
        time.sleep(0.3)
    result = settled(s, retried)
    assert result is not None and result.outcome is SettlementOutcome.COMPLETED, result
    assert result.attempt_count == 1, result  # a new submission with a budget of its own
    code, again = _retry_cli(s, dead, key_file)
    assert code == 0, again
    assert (again.outcome, again.original_submission_id, again.submission_seq) == (
        ReceiptOutcome.DUPLICATE,
        retried,
        3,
    ), again
    # The duplicate's receipt commits with its log record: the log read now holds every decision about the retries.
    log = log_events(s)
    admitted = [e for e in log if isinstance(e, SubmissionAdmitted) and e.retry_of == dead.submission_id]
    assert [a.submission_id for a in admitted] == [retried], admitted
    assert (admitted[0].input_json, admitted[0].submission_seq) == (dead.payload.input_json, 3), admitted
    duplicates = [e for e in log if isinstance(e, SubmissionDuplicate) and e.original_submission_id == retried]
    assert len(duplicates) == 1, duplicates
    dead_settlements = [r for r in settlements(s) if r.submission_id == dead.submission_id]
    assert [(r.outcome, r.error_type) for r in dead_settlements] == [
        (SettlementOutcome.FAILED, RETRY_BUDGET_EXHAUSTED)
    ], dead_settlements  # the dead letter's failed settlement stands
    with fresh_projection(postgres_dsn) as names, projecting(s, names) as live:
        wait_projected(s, names, 60, live)
        with psycopg.connect(postgres_dsn, autocommit=True) as conn:
            rows = conn.execute(
                sql.SQL(
                    "SELECT submission_id, retry_of, outcome FROM {}.submissions WHERE conversation_id = %s "
                    "ORDER BY submission_seq"
                ).format(sql.Identifier(names.live)),
                (dead.conversation_id,),
            ).fetchall()
        assert rows == [
            (dead.submission_id, None, "failed"),
            (rows[1][0], None, "completed"),
            (retried, dead.submission_id, "completed"),
        ], rows
        check_clean(s, names, "DUR-015.rebuild")


def test_a_submission_that_kills_its_worker_backs_off_dead_letters_and_the_lane_moves_on(
    topics: Settings, spawn_worker: SpawnWorker, world_db: Path, tmp_path: Path, postgres_dsn: str
) -> None:
    """Scenario 14. Catches the fault switch ``attempt_count_after_start`` (each death must follow its count).

    Then ``settled retry``: the poison kills its worker only while the world flag ``poison`` is set; once the test
    clears it, the dead letter's payload admitted again completes.
    """
    seed = int(os.environ.get("SETTLED_TEST_SEED") or random.randrange(2**32))
    print(f"scenario 14 seed {seed} (SETTLED_TEST_SEED={seed} replays it)")
    rng = random.Random(seed)
    s = topics
    with world(str(world_db)) as db:
        flag(db, "poison", True)
    poison = proposal(
        "conv-p", value=plan({"sleep_s": round(rng.uniform(0.0, 0.3), 3)}, {"exit": 1, "while_flag": "poison"})
    )
    after = proposal("conv-p", value=plan())
    neighbour = proposal("conv-n", value=plan({"sleep_s": round(rng.uniform(0.0, 0.5), 3)}))
    everyone = [poison, after, neighbour]
    send(s, *everyone)
    supervisor = Supervisor(lambda n: spawn_worker(f"w{n}"))
    supervisor.start()
    deaths = 0
    deadline = time.monotonic() + 180
    while not all(settled(s, p.submission_id) is not None for p in everyone):
        assert time.monotonic() < deadline, f"not everything settled after {deaths} deaths: {settlements(s)}"
        code = supervisor.exit_code()
        if code is None:
            time.sleep(0.3)
            continue
        assert code == 1, f"worker ended with {code}"
        deaths += 1
        # The worker died in the poison's attempt: that attempt's count must be canonical already.
        counted = [e.attempt for e in events_of(s, poison.submission_id) if isinstance(e, AttemptStarted)]
        promise(
            "DUR-014.attempt-count-before-start",
            counted == list(range(1, deaths + 1)),
            f"after death {deaths} the log holds the poison's attempts {counted}: an attempt ran before its count",
        )
        assert deaths <= MAX_ATTEMPTS, f"{deaths} deaths: the poison submission is crash-looping its worker"
        supervisor.restart()
    result = settled(s, poison.submission_id)
    assert result is not None
    promise(
        "DUR-014.poison-fails",
        result.outcome is SettlementOutcome.FAILED and result.attempt_count == MAX_ATTEMPTS,
        f"the poison submission: {result}",
    )
    assert deaths == MAX_ATTEMPTS, f"{deaths} deaths: one per poison attempt"
    assert result.error_type == RETRY_BUDGET_EXHAUSTED, result
    assert result.error_reason is not None and "3 attempts charged (max_attempts 3)" in result.error_reason, result
    assert "last cause: WorkerDied: attempt 3" in result.error_reason, result
    _check_backoffs(events_of(s, poison.submission_id))
    _check_lane_moved_on(s, poison, after)
    n = settled(s, neighbour.submission_id)
    assert n is not None and n.outcome is SettlementOutcome.COMPLETED, n
    with world(str(world_db)) as db:
        flag(db, "poison", False)
    _check_retry(s, poison, tmp_path, postgres_dsn)


def test_an_attempt_that_raises_each_time_backs_off_in_one_worker_and_settles_failed_with_its_last_error(
    topics: Settings, spawn_worker: SpawnWorker, postgres_dsn: str
) -> None:
    """The error path, one worker; the projection shows the dead letter and its retries' waits, and rebuilds equal."""
    s = topics
    failing = proposal("conv-e", value=plan({"no such op": True}))  # the agent raises ValueError each attempt
    after = proposal("conv-e", value=plan())
    send(s, failing, after)
    worker = spawn_worker("w")
    deadline = time.monotonic() + 90
    while not all(settled(s, p.submission_id) is not None for p in (failing, after)):
        assert worker.poll() is None, "the worker ended"
        assert time.monotonic() < deadline, settlements(s)
        time.sleep(0.3)
    result = settled(s, failing.submission_id)
    assert result is not None and result.outcome is SettlementOutcome.FAILED, result
    assert (result.attempt_count, result.error_type) == (MAX_ATTEMPTS, RETRY_BUDGET_EXHAUSTED), result
    assert result.error_reason is not None and "last cause: ValueError: unknown plan op" in result.error_reason
    events = events_of(s, failing.submission_id)
    _check_backoffs(events)
    causes = [e.cause for e in events if isinstance(e, SubmissionRetryScheduled)]
    assert all(c.startswith("ValueError: unknown plan op") for c in causes), causes
    _check_lane_moved_on(s, failing, after)
    with fresh_projection(postgres_dsn) as names, projecting(s, names) as live:
        wait_projected(s, names, 60, live)
        with psycopg.connect(postgres_dsn, autocommit=True) as conn:
            row = conn.execute(
                sql.SQL("SELECT outcome, error_type, error_reason FROM {}.settlements WHERE submission_id = %s").format(
                    sql.Identifier(names.live)
                ),
                (failing.submission_id,),
            ).fetchone()
            waits = conn.execute(
                sql.SQL(
                    "SELECT name FROM {}.transcript WHERE submission_id = %s AND kind = 'wait' ORDER BY name"
                ).format(sql.Identifier(names.live)),
                (failing.submission_id,),
            ).fetchall()
        assert row == ("failed", RETRY_BUDGET_EXHAUSTED, result.error_reason), row
        assert [w[0] for w in waits] == ["settled.retry#1", "settled.retry#2"], waits
        check_clean(s, names, "DUR-015.rebuild")


def test_a_model_call_past_its_own_budget_fails_the_submission_without_another_attempt(
    topics: Settings, spawn_worker: SpawnWorker, world_db: Path
) -> None:
    """One retry layer each: the model call's budget (``model_retries`` 3: four requests) is not multiplied by the
    submission's (``max_attempts`` 3) — before, each attempt called the model again with a fresh budget (12)."""
    s = topics
    overloaded = proposal("conv-m", value={"script": [[{"fail": "overloaded"}]]})
    send(s, overloaded)
    spawn_worker("w", app=MODEL_APP)
    deadline = time.monotonic() + 90
    while settled(s, overloaded.submission_id) is None:
        assert time.monotonic() < deadline, settlements(s)
        time.sleep(0.3)
    result = settled(s, overloaded.submission_id)
    assert result is not None and result.outcome is SettlementOutcome.FAILED, result
    assert (result.attempt_count, result.error_type) == (1, "ProviderError"), result
    requests = prompts(str(world_db))
    assert len(requests) == 4, f"{len(requests)} model requests: the per-operation and submission budgets stacked"
    assert not [e for e in events_of(s, overloaded.submission_id) if isinstance(e, SubmissionRetryScheduled)]
