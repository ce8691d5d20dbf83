"""The engine tests' app: an agent that follows a plan from its input, and tool doubles that count what they do.

The tool doubles are "the outside world": every invocation and every effect is a row in a SQLite file (path in
``ENGINE_WORLD_DB``) that outlives the killed worker processes, so a test counts invocations and effects
separately. ``charge_idem`` dedupes its effect by the idempotency key (an outside system honouring keys);
``charge_once`` applies its effect on every invocation (an ordinary, non-idempotent API). Both hit the failpoint
``testtool.mid_invocation`` after counting the invocation and before applying the effect ("during invocation",
docs/semantics.md §15).

The agent's input is ``{"plan": [op, ...]}``; each op's outcome is appended to the reply and also written to the
``observations`` table with the attempt number, so a test compares what each attempt saw:

* ``{"tool": name, "args": {...}}`` → the result, or ``{"error": [type, message]}`` for a `ToolCallError`;
* ``{"now": true}`` / ``{"uuid": true}`` → the recorded value;
* ``{"step": name, "fail_first": true}`` → a durable step whose body counts its runs and fails on the first;
  ``"pure": true`` makes it a pure step (its record posted, issue 24 item 2);
* ``{"approve": title, "description": text, "then": {"tool": ..., "args": ...}}`` → ``ctx.approve``'s decision,
  and the ``then`` tool's result only if approved (issue 16);
* ``{"model": text}`` → a model call (a scripted provider that answers with the user messages it was shown: the
  op's text, then any inputs a ``join`` lane's run took in at this boundary, issue 22 item 2), decoded;
* ``{"sleep_s": s}`` → sleeps; ``{"exit": code}`` → ``os._exit(code)`` (a poison submission); with
  ``"while_flag": name`` only while that world flag is set (a poison the test can cure), else ``{"cured": name}``.

``app_changed`` is the same agent with changed code: it calls ``charge_other`` where the plan says ``charge_idem``.
"""

from __future__ import annotations

import asyncio
import base64
import fcntl
import json
import os
import sqlite3
import time
from datetime import timedelta
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from settled._failpoints import failpoint
from settled.runtime import (
    App,
    Message,
    ModelRequest,
    ModelResponse,
    RunContext,
    RunOptions,
    ScriptedProvider,
    ToolCall,
    ToolCallError,
    WaitExpiredError,
)
from settled.runtime._model import ScriptStep
from settled.schemas import canonical_json

WORLD_ENV = "ENGINE_WORLD_DB"

#: The resolver's signing key (a fixed test key) and its id.
RESOLVER_KEY_ID = "engine-test-resolver"
#: The same key pair also signs approvals, under its own id in ``App.approver_keys`` (issue 16).
APPROVER_KEY_ID = "engine-test-approver"
RESOLVER_PRIVATE_KEY = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))
RESOLVER_PUBLIC_B64 = base64.b64encode(
    RESOLVER_PRIVATE_KEY.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
).decode()

_SCHEMA = """
CREATE TABLE IF NOT EXISTS invocations (tool TEXT, key TEXT, epoch INTEGER, submission TEXT, attempt INTEGER);
CREATE TABLE IF NOT EXISTS effects (tool TEXT, key TEXT, amount INTEGER);
CREATE TABLE IF NOT EXISTS observations (submission TEXT, attempt INTEGER, op INTEGER, value TEXT);
CREATE TABLE IF NOT EXISTS step_runs (submission TEXT, name TEXT, attempt INTEGER);
CREATE TABLE IF NOT EXISTS returns (tool TEXT, key TEXT);
CREATE TABLE IF NOT EXISTS flags (name TEXT PRIMARY KEY);
"""


#: The world files this process has seen created (`_create_once`).
_created: set[str] = set()


def _create_once(path: str) -> None:
    """Create the world database (WAL, the tables) once, under an exclusive file lock shared by every process.

    Switching a database to WAL takes an exclusive lock, and SQLite answers a concurrent switch with "database is
    locked" at once, without waiting out its busy timeout: 50 tool calls starting together in a fresh world saw it.
    So the first opener creates the world while holding ``<path>.lock`` and later openers skip it (WAL mode is
    persistent in the file).
    """
    if path in _created and os.path.exists(path):
        return
    with open(f"{path}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            conn = sqlite3.connect(path, timeout=30, isolation_level=None)
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                conn.executescript(_SCHEMA)
            finally:
                conn.close()
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    _created.add(path)


def world(path: str | None = None) -> sqlite3.Connection:
    """Open the world database (autocommit, WAL: several processes write it), creating it on first use."""
    where = path or os.environ[WORLD_ENV]
    _create_once(where)
    return sqlite3.connect(where, timeout=30, isolation_level=None)


def _invoked(tool: str, call: ToolCall) -> int:
    with world() as db:
        db.execute(
            "INSERT INTO invocations VALUES (?, ?, ?, ?, ?)",
            (tool, call.idempotency_key, call.owner_epoch, call.submission_id, call.attempt),
        )
        (n,) = db.execute("SELECT count(*) FROM invocations WHERE key = ?", (call.idempotency_key,)).fetchone()
    return int(n)


def _charge(tool: str, args: dict[str, Any], call: ToolCall, *, dedupe: bool) -> dict[str, Any]:
    _invoked(tool, call)
    failpoint("testtool.mid_invocation")
    with world() as db:
        seen = db.execute("SELECT count(*) FROM effects WHERE key = ?", (call.idempotency_key,)).fetchone()[0]
        if not (dedupe and seen):
            db.execute("INSERT INTO effects VALUES (?, ?, ?)", (tool, call.idempotency_key, int(args["amount"])))
    return {"charged": int(args["amount"]), "tool": tool}


#: The plan agent's settlements are handed over at once (no linger, docs/design.md §3): its kill tests count the crash
#: boundaries of back-to-back calls as separate commits ("after tool result commit" before the next call is
#: prepared). The model app (`model_app`) keeps the default linger, where a settlement may share the next commit.
OPTIONS = RunOptions(abort_grace_s=1.0, retry_backoff_s=0.05, settle_linger_s=0)
#: Test values (the production default is 1 s doubling up to 60 s): a retried submission's backoff (issue 22 item 4).
BACKOFF_BASE_MS, BACKOFF_MAX_MS = 300, 3_000
app = App(
    agent=lambda ctx: _agent(ctx, {}),
    resolver_keys={RESOLVER_KEY_ID: RESOLVER_PUBLIC_B64},
    approver_keys={APPROVER_KEY_ID: RESOLVER_PUBLIC_B64},
    max_attempts=3,
    options=OPTIONS,
    attempt_backoff_base_ms=BACKOFF_BASE_MS,
    attempt_backoff_max_ms=BACKOFF_MAX_MS,
)
#: The same agent and tools with settlements that linger up to 1 s for the run's next record (or its end).
app_lingering = App(
    agent=lambda ctx: _agent(ctx, {}),
    resolver_keys={RESOLVER_KEY_ID: RESOLVER_PUBLIC_B64},
    max_attempts=3,
    tools=app.tools,
    options=RunOptions(abort_grace_s=1.0, retry_backoff_s=0.05, settle_linger_s=1.0),
    attempt_backoff_base_ms=BACKOFF_BASE_MS,
    attempt_backoff_max_ms=BACKOFF_MAX_MS,
)
#: The same agent and tools with posted records (settlements, pure steps) that wait up to 60 s for the run's next
#: awaited record: a pure step's record is still in the worker when the step after it runs (issue 24 item 2).
app_held_posts = App(
    agent=lambda ctx: _agent(ctx, {}),
    resolver_keys={RESOLVER_KEY_ID: RESOLVER_PUBLIC_B64},
    max_attempts=3,
    tools=app.tools,
    options=RunOptions(abort_grace_s=1.0, retry_backoff_s=0.05, settle_linger_s=60.0),
)
app_changed = App(
    agent=lambda ctx: _agent(ctx, {"charge_idem": "charge_other"}),
    resolver_keys={RESOLVER_KEY_ID: RESOLVER_PUBLIC_B64},
    max_attempts=3,
    tools=app.tools,
    options=OPTIONS,
)


def flag(db: sqlite3.Connection, name: str, on: bool) -> None:
    """Set or clear a world flag (e.g. ``"server_down"``)."""
    if on:
        db.execute("INSERT OR IGNORE INTO flags VALUES (?)", (name,))
    else:
        db.execute("DELETE FROM flags WHERE name = ?", (name,))


def _flagged(name: str) -> bool:
    with world() as db:
        (n,) = db.execute("SELECT count(*) FROM flags WHERE name = ?", (name,)).fetchone()
    return bool(n)


def _slow(tool: str, args: dict[str, Any], call: ToolCall, *, dedupe: bool) -> dict[str, Any]:
    n = _invoked(tool, call)
    if n == 1 or not args.get("first_only"):
        time.sleep(float(args["sleep_s"]))
    with world() as db:
        db.execute("INSERT INTO returns VALUES (?, ?)", (tool, call.idempotency_key))
        seen = db.execute("SELECT count(*) FROM effects WHERE key = ?", (call.idempotency_key,)).fetchone()[0]
        if not (dedupe and seen):
            db.execute("INSERT INTO effects VALUES (?, ?, ?)", (tool, call.idempotency_key, 1))
    return {"slept": float(args["sleep_s"]), "tool": tool}


def _remote(tool: str, call: ToolCall, *, dedupe: bool) -> dict[str, Any]:
    _invoked(tool, call)
    if _flagged("server_down"):
        raise ConnectionRefusedError("tool server at 127.0.0.1:9 refused the connection")
    with world() as db:
        seen = db.execute("SELECT count(*) FROM effects WHERE key = ?", (call.idempotency_key,)).fetchone()[0]
        if not (dedupe and seen):
            db.execute("INSERT INTO effects VALUES (?, ?, ?)", (tool, call.idempotency_key, 1))
    return {"tool": tool}


@app.tool(idempotent=True, timeout_s=10)
def charge_idem(args: dict[str, Any], call: ToolCall) -> dict[str, Any]:
    """Idempotent: the effect is applied once per idempotency key."""
    return _charge("charge_idem", args, call, dedupe=True)


@app.tool(timeout_s=10)
def charge_once(args: dict[str, Any], call: ToolCall) -> dict[str, Any]:
    """Not idempotent: every invocation applies the effect."""
    return _charge("charge_once", args, call, dedupe=False)


@app.tool(idempotent=True, timeout_s=10)
def charge_other(args: dict[str, Any], call: ToolCall) -> dict[str, Any]:
    """What the changed code calls instead of ``charge_idem``."""
    return _charge("charge_other", args, call, dedupe=True)


@app.tool(timeout_s=10)
def flaky(args: dict[str, Any], call: ToolCall) -> str:
    """Raises on its first invocation per key (an application error), answers afterwards."""
    if _invoked("flaky", call) == 1:
        raise ValueError("boom on the first invocation")
    return "fine"


@app.tool(idempotent=True, timeout_s=1.0)
def slow_idem(args: dict[str, Any], call: ToolCall) -> dict[str, Any]:
    """Idempotent; sleeps ``sleep_s`` (only on its first invocation with ``first_only``); 1 s timeout."""
    return _slow("slow_idem", args, call, dedupe=True)


@app.tool(timeout_s=1.0)
def slow_once(args: dict[str, Any], call: ToolCall) -> dict[str, Any]:
    """Not idempotent; sleeps ``sleep_s``; 1 s timeout."""
    return _slow("slow_once", args, call, dedupe=False)


@app.tool(timeout_s=30.0)
def slow_long(args: dict[str, Any], call: ToolCall) -> dict[str, Any]:
    """Not idempotent; sleeps ``sleep_s`` within a generous timeout (an abort, not a timeout, stops the wait)."""
    return _slow("slow_long", args, call, dedupe=False)


@app.tool(idempotent=True, timeout_s=30.0)
def slow_long_idem(args: dict[str, Any], call: ToolCall) -> dict[str, Any]:
    """Idempotent; sleeps ``sleep_s`` within a generous timeout."""
    return _slow("slow_long_idem", args, call, dedupe=True)


@app.tool(idempotent=True, timeout_s=10)
def remote_idem(args: dict[str, Any], call: ToolCall) -> dict[str, Any]:
    """Idempotent; refuses connections while the world flag ``server_down`` is set."""
    return _remote("remote_idem", call, dedupe=True)


@app.tool(timeout_s=10)
def remote_once(args: dict[str, Any], call: ToolCall) -> dict[str, Any]:
    """Not idempotent; refuses connections while the world flag ``server_down`` is set."""
    return _remote("remote_once", call, dedupe=False)


@app.tool(idempotent=True, timeout_s=30.0)
def hold_until_flag(args: dict[str, Any], call: ToolCall) -> dict[str, Any]:
    """Idempotent; stays in flight until the world flag ``args["flag"]`` is set (the test's barrier: the run is
    active while the test acts, e.g. steers it)."""
    _invoked("hold_until_flag", call)
    while not _flagged(str(args["flag"])):
        time.sleep(0.02)
    return {"held": args["flag"]}


@app.tool(timeout_s=10)
def exit_inside(args: dict[str, Any], call: ToolCall) -> None:
    """Not idempotent; ends the worker process on its first invocation (a death inside a tool call)."""
    if _invoked("exit_inside", call) == 1:
        os._exit(1)


def _step_body(submission_id: str, name: str, attempt: int, fail_first: bool) -> dict[str, Any]:
    with world() as db:
        db.execute("INSERT INTO step_runs VALUES (?, ?, ?)", (submission_id, name, attempt))
        (runs,) = db.execute(
            "SELECT count(*) FROM step_runs WHERE submission = ? AND name = ?", (submission_id, name)
        ).fetchone()
    if fail_first and runs == 1:
        raise RuntimeError(f"step {name} fails on its first run")
    return {"step": name, "runs_when_recorded": runs}


def _echo(request: ModelRequest) -> list[ScriptStep]:
    """The plan's model: answers with the texts of the user messages it was shown, in order."""
    return [ModelResponse(canonical_json([m.text for m in request.messages if m.role == "user"]), model="echo-1")]


ECHO = ScriptedProvider(_echo, name="echo")


async def _agent(ctx: RunContext, rename: dict[str, str]) -> Any:
    plan = ctx.input.get("plan", []) if isinstance(ctx.input, dict) else []
    results: list[Any] = []
    for i, op in enumerate(plan):
        value: Any
        if "tool" in op:
            try:
                value = await ctx.tool(rename.get(op["tool"], op["tool"]), op.get("args", {}))
            except ToolCallError as exc:
                value = {"error": [exc.error_type, exc.message]}
        elif "parallel" in op:  # parallel tool calls: one event-loop tick, their settlements may share a record
            calls = [ctx.tool(o["tool"], o.get("args", {})) for o in op["parallel"]]
            value = [len(canonical_json(r)) for r in await asyncio.gather(*calls)]
        elif "now" in op:
            value = ctx.now().isoformat()
        elif "uuid" in op:
            value = str(ctx.uuid())
        elif "step" in op:
            value = await ctx.step(
                op["step"],
                _step_body,
                ctx.submission_id,
                op["step"],
                ctx.attempt,
                bool(op.get("fail_first")),
                pure=bool(op.get("pure")),
            )
        elif "signal" in op:  # issue 16: wait for a signal (optionally with a deadline, seconds from now)
            deadline = timedelta(seconds=float(op["deadline_s"])) if "deadline_s" in op else None
            try:
                value = {"signal": await ctx.signal(op["signal"], deadline=deadline)}
            except WaitExpiredError as exc:
                value = {"expired": exc.name}
        elif "approve" in op:  # issue 16 item 4: ask a person; run op["then"] (a tool call) only if approved
            decision = await ctx.approve(op["approve"], op.get("description", ""))
            value = {"approved": decision.approved, "by": decision.by, "reason": decision.reason}
            if decision.approved and "then" in op:
                value["result"] = await ctx.tool(op["then"]["tool"], op["then"].get("args", {}))
        elif "model" in op:  # a model boundary: where a join lane's run takes in the turns queued behind it
            response = await ctx.model(ECHO, [Message("user", str(op["model"]))], model="echo-1")
            value = json.loads(response.text)
        elif "sleep_s" in op:
            await asyncio.sleep(float(op["sleep_s"]))
            value = op["sleep_s"]
        elif "exit" in op:
            if "while_flag" in op and not _flagged(op["while_flag"]):
                value = {"cured": op["while_flag"]}
            else:
                os._exit(int(op["exit"]))  # a poison submission: its agent code ends the whole worker process
        else:
            raise ValueError(f"unknown plan op {op!r}")
        with world() as db:
            db.execute(
                "INSERT INTO observations VALUES (?, ?, ?, ?)",
                (ctx.submission_id, ctx.attempt, i, canonical_json(value)),
            )
        results.append(value)
    return {"results": results}


@app.tool(idempotent=True, timeout_s=10, parallel_safe=True)
def sleep_par(args: dict[str, Any], call: ToolCall) -> dict[str, Any]:
    """Idempotent and parallel-safe; sleeps ``sleep_s`` then applies one effect per key (scenario 17's batch)."""
    return _slow("sleep_par", args, call, dedupe=True)


@app.tool(timeout_s=30.0)
def charge_then_hang(args: dict[str, Any], call: ToolCall) -> dict[str, Any]:
    """Not idempotent; applies its effect at once, then stays in flight ``hang_s`` (past a graceful revoke's bound)."""
    _invoked("charge_then_hang", call)
    with world() as db:
        db.execute("INSERT INTO effects VALUES (?, ?, ?)", ("charge_then_hang", call.idempotency_key, 1))
    time.sleep(float(args["hang_s"]))
    return {"tool": "charge_then_hang"}


@app.tool(idempotent=True, timeout_s=10, parallel_safe=True)
def blob(args: dict[str, Any], call: ToolCall) -> str:
    """Idempotent and parallel-safe; returns a string of ``bytes`` characters (records near the size limits)."""
    return "x" * int(args["bytes"])
