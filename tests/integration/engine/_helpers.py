"""Helpers of the engine tests: sending inbox records, reading the log and settlements, counting the world."""

from __future__ import annotations

import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from settled._settings import Settings
from settled.schemas import (
    AbortRequested,
    AttemptStarted,
    DecideApproval,
    LogEvent,
    Receipt,
    RecoveryDecision,
    RecoveryDecisionKind,
    ResolutionKind,
    ResolveUnknown,
    SendSignal,
    SettlementOutcome,
    SettlementRecord,
    SubmissionProposed,
    ToolCallPrepared,
    ToolCallSettled,
    ToolCallUnknown,
    canonical_json,
)
from settled.testing import Supervisor, WorkerProcess
from tests._promise import promise
from tests.harness.factories import abort_command  # noqa: F401 - its old home, for modules not yet importing the harness
from tests.harness.workers import start_worker as _start_worker
from tests.integration.engine.engine_app import RESOLVER_KEY_ID, RESOLVER_PRIVATE_KEY, WORLD_ENV, world
from tests.integration.helpers import CODEC, produce_inbox, read_topic

KILLED = -9
TIMEOUT_S = 90.0


def send(
    s: Settings, *records: SubmissionProposed | ResolveUnknown | AbortRequested | SendSignal | DecideApproval
) -> None:
    produce_inbox(s, [(r.conversation_id.encode(), CODEC.encode(r)) for r in records])


def log_events(s: Settings) -> list[LogEvent]:
    out: list[LogEvent] = []
    for r in read_topic(s, "log"):
        assert r.value is not None
        out.extend(CODEC.decode_batch(r.value, offset=r.offset).batch.events)
    return out


def events_of(s: Settings, submission_id: str) -> list[LogEvent]:
    return [e for e in log_events(s) if getattr(e, "submission_id", None) == submission_id]


def settlements(s: Settings) -> list[SettlementRecord]:
    out = []
    for r in read_topic(s, "settlements"):
        assert r.value is not None
        rec = CODEC.decode(r.value)
        assert isinstance(rec, SettlementRecord)
        out.append(rec)
    return out


def settled(s: Settings, submission_id: str) -> SettlementRecord | None:
    found = [r for r in settlements(s) if r.submission_id == submission_id]
    return found[0] if found else None


def count(db: Path, sql: str, *args: Any) -> int:
    with world(str(db)) as conn:
        return int(conn.execute(sql, args).fetchone()[0])


def invocations(db: Path, tool: str) -> int:
    return count(db, "SELECT count(*) FROM invocations WHERE tool = ?", tool)


def effects(db: Path, tool: str) -> int:
    return count(db, "SELECT count(*) FROM effects WHERE tool = ?", tool)


def killed(proc: WorkerProcess, log: Path) -> None:
    try:
        code = proc.wait(TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the worker was not killed at its failpoint:\n{log.read_text()[-3000:]}") from None
    assert code == KILLED, f"worker exited {code}, not by its failpoint's SIGKILL:\n{log.read_text()[-3000:]}"


def plan(*ops: dict[str, Any]) -> dict[str, Any]:
    return {"plan": list(ops)}


def sign_resolution(
    conversation_id: str,
    submission_id: str,
    call_id: str,
    result: Any = None,
    *,
    kind: ResolutionKind = ResolutionKind.CALL_OUTCOME,
    outcome: SettlementOutcome | None = None,
    key: Ed25519PrivateKey | None = RESOLVER_PRIVATE_KEY,
    key_id: str = RESOLVER_KEY_ID,
) -> ResolveUnknown:
    """A ``ResolveUnknown`` signed with ``key`` (the resolver's by default; None: unsigned)."""
    fields: dict[str, Any] = {
        "command_id": f"resolve-{uuid.uuid4().hex[:8]}",
        "principal": "ops",
        "conversation_id": conversation_id,
        "submission_id": submission_id,
        "call_id": call_id,
        "kind": kind,
        "outcome": outcome,
        "result_json": None if result is None else canonical_json(result),
        "key_id": key_id,
        "requested_at": datetime.now(UTC),
    }
    unsigned = ResolveUnknown(**fields, signature=b"")
    if key is None:
        return unsigned
    return ResolveUnknown(**fields, signature=key.sign(unsigned.signing_bytes()))


def receipt(s: Settings, request_id: str) -> Receipt | None:
    for r in read_topic(s, "receipts"):
        assert r.value is not None
        rec = CODEC.decode(r.value)
        if isinstance(rec, Receipt) and rec.request_id == request_id:
            return rec
    return None


def returns(db: Path, tool: str) -> int:
    return count(db, "SELECT count(*) FROM returns WHERE tool = ?", tool)


def decisions(s: Settings, submission_id: str) -> list[RecoveryDecisionKind]:
    return [e.decision for e in events_of(s, submission_id) if isinstance(e, RecoveryDecision)]


ENGINE_APP = "tests.integration.engine.engine_app:app"
MODEL_APP = "tests.integration.engine.model_app:app"


def start_worker(
    s: Settings,
    world_db: Path,
    log_path: Path,
    name: str,
    *,
    env: dict[str, str] | None = None,
    app: str = ENGINE_APP,
) -> WorkerProcess:
    """Start a ``settled worker`` child (`WorkerProcess`) on ``s``'s namespace and broker, outside the fixtures.

    For tests that need their own broker or one failpoint control folder per worker process (e.g. the chaos
    suite's); the caller kills what it started.

    Args:
        s: Namespace and bootstrap servers.
        world_db: The tool doubles' world database.
        log_path: The child's log file (stderr).
        name: The worker id.
        env: Further environment (e.g. ``FailpointControl.env()``); ``SETTLED_FAILPOINT*`` of the test process are
            not inherited.
        app: The app (``module:attribute``).

    Returns:
        The child process.
    """
    full = {WORLD_ENV: str(world_db), **(env or {})}
    return _start_worker(s, log_path, name=name, app=app, env=full)


def per_key(db: Path, table: str, tool: str) -> dict[str, int]:
    """Rows per idempotency key of one tool in a world table (``invocations``, ``effects``, ``returns``)."""
    if table not in ("invocations", "effects", "returns"):
        raise ValueError(f"per_key: table {table!r} is not a world table with keys")
    with world(str(db)) as conn:
        rows = conn.execute(f"SELECT key, count(*) FROM {table} WHERE tool = ? GROUP BY key", (tool,)).fetchall()
    return {str(k): int(n) for k, n in rows}


def check_parallel_batch(
    events: list[LogEvent],
    result: SettlementRecord | None,
    world_db: Path,
    settled_at_kill: set[str] | None,
    where: str,
) -> None:
    """Scenario 17's expectations for one submission whose run declared three parallel-safe ``sleep_par`` calls.

    One Prepared/Settled pair per call (a second Prepared only for a call in doubt at the kill, under the same key),
    one effect per call, no re-run of a call settled before the kill, no Unknown, and attempt numbers that rise only
    on a real retry: ``[1]`` without a kill, ``[1, 2]`` after one.

    Args:
        events: The submission's committed log events, in log order.
        result: Its settlement record (None: not settled, which fails).
        world_db: The tool doubles' world database.
        settled_at_kill: Call ids settled when the worker was killed; None when no kill was drawn.
        where: The seed and failpoint, for failure messages.
    """
    assert result is not None and result.outcome is SettlementOutcome.COMPLETED, (where, result)
    assert result.reply_json == '"done"', where
    prepared = [e for e in events if isinstance(e, ToolCallPrepared)]
    settled_ = Counter(e.call_id for e in events if isinstance(e, ToolCallSettled))
    call_ids = sorted({p.call_id for p in prepared})
    assert len(call_ids) == 3, (where, call_ids)
    promise("DUR-010.one-settlement-per-call", settled_ == Counter(dict.fromkeys(call_ids, 1)), f"{where} {settled_}")
    before = set(call_ids) if settled_at_kill is None else settled_at_kill
    prepared_n = Counter(p.call_id for p in prepared)
    expected_prepared = {c: 1 if c in before else 2 for c in call_ids}
    assert dict(prepared_n) == expected_prepared, (
        f"{where} Prepared per call {prepared_n}, expected {expected_prepared}"
    )
    keys = {p.call_id: p.idempotency_key for p in prepared}
    assert all(p.idempotency_key == keys[p.call_id] for p in prepared), f"{where} a re-prepared call changed its key"
    effects_ = per_key(world_db, "effects", "sleep_par")
    mine = {k: effects_.get(k, 0) for k in keys.values()}
    promise("DUR-010.one-effect", mine == dict.fromkeys(keys.values(), 1), f"{where} effects per key {mine}")
    invoked = per_key(world_db, "invocations", "sleep_par")
    for call_id in before:
        assert invoked.get(keys[call_id]) == 1, f"{where} the call {call_id}, settled before the kill, ran again"
    assert not [e for e in events if isinstance(e, ToolCallUnknown)], where
    attempts = [e.attempt for e in events if isinstance(e, AttemptStarted)]
    want = [1] if settled_at_kill is None else [1, 2]
    promise(
        "DUR-013.attempts-only-on-retry",
        attempts == want and result.attempt_count == len(want),
        f"{where} attempts {attempts} (settlement says {result.attempt_count}); expected {want}",
    )
    kinds = [e.decision for e in events if isinstance(e, RecoveryDecision)]
    if settled_at_kill is None:
        assert kinds == [], f"{where} recovery decisions {kinds} without a kill"
        return
    retried = sorted(set(call_ids) - settled_at_kill)
    # Calls in doubt at the kill are retried under their keys; with none in doubt the run simply resumes.
    expected_kind = RecoveryDecisionKind.SAFE_RETRY if retried else RecoveryDecisionKind.RESUME
    assert kinds == [expected_kind], f"{where} recovery decisions {kinds} (calls in doubt: {retried})"


def supervise_until_settled(
    s: Settings,
    submissions: Sequence[SubmissionProposed],
    spawn: Callable[[str], WorkerProcess],
    *,
    max_deaths: int,
    timeout_s: float,
    poll_s: float,
) -> tuple[int, WorkerProcess]:
    """Keep one worker running under a `Supervisor` until every submission settled.

    A worker that ends must have exited 1 (a poison submission's ``os._exit(1)``); it is counted and started again
    (incarnation ``n`` is ``spawn(f"w{n}")``).

    Returns:
        The deaths counted and the worker running at the end.

    Raises:
        AssertionError: A worker ended otherwise, more than ``max_deaths`` deaths (a crash loop), or not everything
            settled within ``timeout_s`` seconds.
    """
    supervisor = Supervisor(lambda n: spawn(f"w{n}"))
    supervisor.start()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(settled(s, p.submission_id) is not None for p in submissions):
            return supervisor.restarts, supervisor.worker
        code = supervisor.exit_code()
        if code is not None:
            assert code == 1, f"worker ended with {code}"
            deaths = supervisor.restarts + 1
            assert deaths <= max_deaths, f"{deaths} deaths: the poison submission is crash-looping its worker"
            supervisor.restart()
        time.sleep(poll_s)
    raise AssertionError(f"not everything settled after {supervisor.restarts} deaths: {settlements(s)}")
