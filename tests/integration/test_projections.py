"""Postgres projections of the log, exactly once, rebuilt from the log, read-your-writes (issue 7; DUR-015).

Real Kafka, real Postgres, real workers (the echo app, in-process) and projector child processes
(``python -m settled.services projections run``) killed at the failpoint ``projector.before_commit`` (the chunk's
rows written, its offset not yet). `settled.projections.check` compares live, a fresh rebuild and the reference fold
of the log at identical offsets; its differences fail the promise ``DUR-015.*``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka import Consumer, TopicPartition
from psycopg import sql

from settled import _failpoints
from settled._settings import Settings
from settled.client import Client
from settled.producers import AppendBatch, OutRecord, TransactionalAppender, provision_topics
from settled.projections import (
    ProjectionNames,
    ProjectionReader,
    Projector,
    ProjectorConfig,
    check,
    maintenance_lock_key,
    read_offsets,
    rebuild,
)
from settled.runtime import App
from settled.schemas import LogBatch, Receipt
from settled.services._worker_service import build_worker
from settled.testing.echo import EchoAgent
from tests._promise import promise
from tests.integration.admission_load import make_load, produce_load, receipts, settlements
from tests.integration.helpers import CODEC, fresh_projection, projecting, read_topic, running, wait_for
from tests.integration.projection_script import CHECKPOINT, script_log
from tests.integration.workerproc import spawn_worker

pytestmark = [pytest.mark.integration, pytest.mark.partitions(2)]

ROOT = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------------------------------------------- fixtures


@pytest.fixture
def names(postgres_dsn: str) -> Iterator[ProjectionNames]:
    """A fresh projection (its live, building, retired and scratch schemas are dropped at teardown)."""
    with fresh_projection(postgres_dsn) as n:
        yield n


# ---------------------------------------------------------------------------------------------------- helpers


class Child:
    """A ``settled projections run`` child process and its log file."""

    def __init__(self, proc: subprocess.Popen[bytes], log: Path) -> None:
        self.proc = proc
        self.log = log

    def tail(self, lines: int = 30) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def logged(self, message: str) -> int:
        if not self.log.exists():
            return 0
        count = 0
        for line in self.log.read_text(errors="replace").splitlines():
            try:
                if json.loads(line).get("message") == message:
                    count += 1
            except ValueError:
                continue
        return count

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode


def _env(s: Settings, names: ProjectionNames) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SETTLED_FAILPOINT")}
    env.update(
        SETTLED_NAMESPACE=s.namespace,
        SETTLED_KAFKA_BOOTSTRAP=s.kafka_bootstrap,
        SETTLED_POSTGRES_DSN=s.postgres_dsn,
        SETTLED_PROJECTION_SCHEMA=names.live,
    )
    return env


def spawn_projector(
    s: Settings, names: ProjectionNames, tmp_path: Path, name: str, *args: str, env: dict[str, str] | None = None
) -> Child:
    log = tmp_path / f"{name}.log"
    full_env = {**_env(s, names), **(env or {})}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "settled.services", "projections", "run", *args],
            cwd=ROOT,
            env=full_env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    return Child(proc, log)


def log_next_offsets(s: Settings) -> dict[int, int]:
    """Per partition, the offset after the last committed log record (what a caught-up projector stores)."""
    out: dict[int, int] = {}
    for r in read_topic(s, "log"):
        out[r.partition] = r.offset + 1
    return out


def stored(s: Settings, names: ProjectionNames) -> dict[int, int]:
    with psycopg.connect(s.postgres_dsn, autocommit=True) as conn:
        return read_offsets(conn, names.live, s.topic("log"))


def wait_projected(s: Settings, names: ProjectionNames, timeout_s: float, *children: Child) -> bool:
    """Wait until the live offsets reach the log's end; False if it does not or a child projector exits."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(c.proc.poll() is not None for c in children):
            return False
        ends = log_next_offsets(s)
        try:
            have = stored(s, names)
        except psycopg.Error:
            have = {}
        if all(have.get(p, 0) >= end for p, end in ends.items()):
            return True
        time.sleep(0.3)
    return False


def run_load(s: Settings, seed: int, total: int, *, conversations: int = 8) -> int:
    """Produce a seeded load (duplicates, re-sends, conflicts) and run a worker until each original settles."""
    load = make_load(
        seed, conversations=conversations, total=total, duplicates=total // 10, resends=total // 20,
        conflicts=total // 12, adjacent=total // 30,
    )  # fmt: skip
    before = len(settlements(s))
    produce_load(s, load)
    worker = build_worker(s, App(agent=EchoAgent(delay_s=0.0)))
    originals = load.count["original"]
    with running(worker):
        wait_for(lambda: len(settlements(s)) >= before + originals, 60, f"{originals} settlements")
    return originals


@pytest.fixture
def live_projector(topics: Settings, names: ProjectionNames) -> Iterator[Projector]:
    """An in-process live projector running in a thread for the test's duration."""
    with projecting(topics, names) as live:
        yield live.projector


def _assert_matches_topics(s: Settings, names: ProjectionNames) -> None:
    """The projection's receipts and settlements are the ones on the receipts and settlements topics."""
    with psycopg.connect(s.postgres_dsn, autocommit=True) as conn:
        got = dict(conn.execute(sql.SQL("SELECT request_id, outcome FROM {}").format(
            sql.Identifier(names.live, "receipts"))).fetchall())  # fmt: skip
        settled = dict(conn.execute(sql.SQL("SELECT submission_id, outcome FROM {}").format(
            sql.Identifier(names.live, "settlements"))).fetchall())  # fmt: skip
    first: dict[str, str] = {}
    for r in receipts(s):  # a re-sent request (same id) is answered again: the projection keeps its first decision
        first.setdefault(r.request_id, r.outcome.value)
    assert got == first
    assert settled == {r.submission_id: r.outcome.value for r in settlements(s)}


def _check_clean(s: Settings, names: ProjectionNames, promise_id: str) -> None:
    report = check(s, names, timeout_s=50)
    shown = "\n".join(f"  {d}" for d in report.differences[:15])
    promise(promise_id, report.ok, f"live, rebuild and reference fold differ at {report.offsets}:\n{shown}")


# ---------------------------------------------------------------------------------------------------- tests


def test_live_rebuild_and_reference_agree_after_a_load_and_a_projector_killed_mid_batch(
    topics: Settings, names: ProjectionNames, tmp_path: Path
) -> None:
    """Acceptance: duplicates, conflicts and a projector SIGKILLed with a chunk's rows written, offset not."""
    s = topics
    run_load(s, seed=7, total=120)
    first = spawn_projector(s, names, tmp_path, "first", "--max-records", "25",
                            env={"SETTLED_FAILPOINTS": "projector.before_commit=2*kill"})  # fmt: skip
    assert first.proc.wait(45) == -9, first.tail()
    at_kill = stored(s, names)
    ends = log_next_offsets(s)
    assert sum(at_kill.values()) < sum(ends.values()), "the kill came before the projector caught up"
    second = spawn_projector(s, names, tmp_path, "second", "--max-records", "200")
    try:
        run_load(s, seed=8, total=60)  # the worker appends while the restarted projector runs
        ok = wait_projected(s, names, 40, second)
        promise(
            "DUR-015.exactly-once",
            ok,
            f"the restarted projector did not resume from its stored offsets {at_kill} and catch up "
            f"(exit code {second.proc.poll()}):\n{second.tail()}",
        )
        _check_clean(s, names, "DUR-015.exactly-once")
        _assert_matches_topics(s, names)
    finally:
        second.stop()


def test_rebuild_while_the_worker_appends_switches_atomically(
    topics: Settings, names: ProjectionNames, live_projector: Projector
) -> None:
    s = topics
    stop = threading.Event()
    sent: list[str] = []
    polls: list[tuple[int, int]] = []
    mixes: list[str] = []
    retried: list[str] = []

    def feed() -> None:
        with Client(s) as client:
            i = 0
            while not stop.is_set():
                sent.append(client.submit(f"rb-{i % 6}", {"i": i}, timeout_s=30).request_id)
                i += 1
                time.sleep(0.01)

    def read() -> None:
        t = {name: sql.Identifier(names.live, name) for name in ("meta", "submissions", "conversations",
                                                                  "settlements")}  # fmt: skip
        generation = sql.SQL("SELECT value FROM {} WHERE key = 'generation'").format(t["meta"])
        with psycopg.connect(s.postgres_dsn, autocommit=True) as conn:
            conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            while not stop.is_set():
                try:
                    with conn.transaction():
                        row = conn.execute(generation).fetchone()
                        if row is None:
                            continue
                        gen = int(row[0])
                        subs = conn.execute(sql.SQL("SELECT submission_id, conversation_id, submission_seq, state "
                                                    "FROM {}").format(t["submissions"])).fetchall()  # fmt: skip
                        convs = conn.execute(sql.SQL("SELECT conversation_id, last_submission_seq, queue_depth FROM {}")
                                             .format(t["conversations"])).fetchall()  # fmt: skip
                        setts = conn.execute(sql.SQL("SELECT submission_id FROM {}").format(t["settlements"]))
                        settled_ids = {r[0] for r in setts.fetchall()}
                        row2 = conn.execute(generation).fetchone()
                except (psycopg.errors.DeadlockDetected, psycopg.errors.LockNotAvailable) as exc:
                    retried.append(type(exc).__name__)
                    continue
                gen2 = -1 if row2 is None else int(row2[0])
                if gen2 != gen:
                    mixes.append(f"generation {gen} then {gen2} in one snapshot")
                by_conv: dict[str, list[tuple[int, str]]] = {}
                states = {sid: state for sid, _, _, state in subs}
                for _sid, conv, seq, state in subs:
                    by_conv.setdefault(conv, []).append((seq, state))
                for conv, last, depth in convs:
                    mine = by_conv.get(conv, [])
                    if max((q for q, _ in mine), default=0) != last:
                        mixes.append(f"gen {gen}: {conv} last seq {last}, submissions up to {mine}")
                    if sum(1 for _, st in mine if st not in ("completed", "failed", "aborted")) != depth:
                        mixes.append(f"gen {gen}: {conv} queue depth {depth} vs {mine}")
                for sid in settled_ids:
                    if states.get(sid) not in ("completed", "failed", "aborted"):
                        mixes.append(f"gen {gen}: settlement of {sid} but its state is {states.get(sid)}")
                polls.append((gen, len(subs)))

    worker = build_worker(s, App(agent=EchoAgent(delay_s=0.0)))
    threads = [threading.Thread(target=feed, daemon=True), threading.Thread(target=read, daemon=True)]
    with running(worker):
        threads[0].start()
        wait_for(lambda: len(sent) >= 40, 30, "submissions before the rebuild")
        wait_for(lambda: bool(stored(s, names)), 30, "the live projection")
        threads[1].start()
        result = rebuild(s, names, timeout_s=40)
        at_switch = len(sent)
        wait_for(lambda: len(sent) >= at_switch + 20, 20, "submissions after the switch")
        stop.set()
        for t in threads:
            t.join(30)
        wait_for(lambda: len(settlements(s)) >= len(set(sent)), 30, "every submission settled")
    assert wait_projected(s, names, 30), "the live projector did not catch up after the switch"
    promise("DUR-015.atomic-switch", not mixes, f"a reader saw a mix: {mixes[:5]}")
    generations = [g for g, _ in polls]
    assert generations[0] == 1 and generations[-1] == 2, f"generations seen: {sorted(set(generations))}"
    assert generations == sorted(generations), "a reader saw the old version after the new one"
    counts = [n for _, n in polls]
    promise("DUR-015.atomic-switch", counts == sorted(counts), "the submission count went down between two polls")
    with psycopg.connect(s.postgres_dsn, autocommit=True) as conn:
        projected = {r[0] for r in conn.execute(sql.SQL("SELECT submission_id FROM {}").format(
            sql.Identifier(names.live, "submissions"))).fetchall()}  # fmt: skip
    promise("DUR-015.atomic-switch", set(sent) <= projected, f"missing after the rebuild: {set(sent) - projected}")
    assert result.generation == 2
    _check_clean(s, names, "DUR-015.rebuild")


def test_two_projectors_on_one_partition_apply_nothing_twice(
    topics: Settings, names: ProjectionNames, tmp_path: Path
) -> None:
    """No advisory lock: only the offset row's lock and the expected-offset check keep the two apart.

    The race is made, not hoped for: ``a`` stops at a barrier inside its first chunk's transaction (the offset row
    locked, its rows written), ``b`` reaches the same partition's offset row and waits on that lock (seen in
    ``pg_stat_activity``), then ``a`` commits, so ``b`` finds the stored offset moved under it: an offset conflict.
    """
    s = topics
    run_load(s, seed=11, total=80)
    args = ("--no-advisory-lock", "--max-records", "10")
    control = _failpoints.FailpointControl(tmp_path / "fp")
    a = spawn_projector(s, names, tmp_path, "a", *args, env=control.env("projector.before_commit=1*pause(120s)"))
    b = None
    try:
        # b starts only once a holds its first chunk open: started together, b could project every record before a
        # reached its first commit, and a would then find nothing to do and never reach the barrier.
        control.wait_reached("projector.before_commit", 60)
        b = spawn_projector(s, names, tmp_path, "b", *args)
        wait_for(lambda: _waiting_on_a_lock(s, names) >= 1, 30, "projector b waiting on a's offset row lock")
        control.release("projector.before_commit")
        run_load(s, seed=12, total=40)
        ok = wait_projected(s, names, 40, a, b)
        assert ok, f"not caught up: a exit {a.proc.poll()}:\n{a.tail()}\nb exit {b.proc.poll()}:\n{b.tail()}"
    finally:
        codes = (a.stop(), b.stop() if b is not None else None)
    assert b is not None
    assert codes == (0, 0), f"{a.tail()}\n{b.tail()}"
    conflicts = a.logged("offset conflict") + b.logged("offset conflict")
    assert conflicts >= 1, "the two projectors never raced (the test proves nothing)"
    _check_clean(s, names, "DUR-015.no-double-apply")
    _assert_matches_topics(s, names)


def _waiting_on_a_lock(s: Settings, names: ProjectionNames) -> int:
    """How many sessions wait on a row lock in a statement naming the projection's schema."""
    with psycopg.connect(s.postgres_dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND strpos(query, %s) > 0",
            (names.live,),
        ).fetchone()
    return int(row[0]) if row else 0


def test_a_standby_projector_takes_over_when_the_writer_dies(
    topics: Settings, names: ProjectionNames, tmp_path: Path
) -> None:
    s = topics
    run_load(s, seed=21, total=40)
    a = spawn_projector(s, names, tmp_path, "a")
    try:
        wait_for(lambda: a.logged("partition taken") == 2, 20, "a takes both partitions")
        b = spawn_projector(s, names, tmp_path, "b")
        try:
            assert wait_projected(s, names, 30, a, b)
            assert b.logged("partition taken") == 0, "the standby wrote while the writer held the locks"
            a.proc.kill()
            a.proc.wait(10)
            run_load(s, seed=22, total=30)
            wait_for(lambda: b.logged("partition taken") == 2, 20, "the standby takes both partitions")
            assert wait_projected(s, names, 30, b), b.tail()
        finally:
            b.stop()
    finally:
        a.stop()
    _check_clean(s, names, "DUR-015.exactly-once")


def test_read_your_writes_with_100_threads(topics: Settings, names: ProjectionNames, live_projector: Projector) -> None:
    s = topics
    worker = build_worker(s, App(agent=EchoAgent(delay_s=0.0)))
    with running(worker), Client(s) as client, ProjectionReader(s.postgres_dsn, names) as reader:

        def one(i: int) -> tuple[Receipt, dict[str, Any] | None]:
            receipt = client.submit(f"ryw-{i % 10}", {"i": i}, timeout_s=30)
            return receipt, reader.submission(receipt.request_id, after=receipt, timeout_s=30)

        with ThreadPoolExecutor(100) as pool:
            results = list(pool.map(one, range(100)))
        missing = [r.request_id for r, row in results if row is None or row["submission_id"] != r.request_id]
        promise("DUR-015.read-your-writes", not missing, f"not visible right after after=receipt: {missing}")
        assert {row["conversation_id"] for _, row in results if row} == {f"ryw-{i}" for i in range(10)}

        # Once through the CLI: `settled submit` prints the receipt, `--after` takes it.
        env = _env(s, names)
        out = subprocess.run(
            [sys.executable, "-m", "settled.services", "submit", "ryw-cli", '{"cli": true}'],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        receipt_line = out.stdout.strip().splitlines()[0]
        receipt = Receipt.model_validate_json(receipt_line)
        shown = subprocess.run(
            [sys.executable, "-m", "settled.services", "submissions", "show", receipt.request_id, "--after",
             receipt_line, "--json"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert shown.returncode == 0, shown.stderr
        promise(
            "DUR-015.read-your-writes",
            json.loads(shown.stdout)["submission_id"] == receipt.request_id,
            f"the CLI did not show the submission: {shown.stdout}",
        )


def test_postgres_restarted_under_the_projector_mid_batch_resumes_from_stored_offsets(
    topics: Settings, private_postgres: Callable[[], Any], tmp_path: Path
) -> None:
    pg = private_postgres()
    pg.start()
    s = topics.model_copy(update={"postgres_dsn": pg.dsn})
    names = ProjectionNames("p_restart")
    run_load(s, seed=31, total=80)
    control = _failpoints.FailpointControl(tmp_path / "fp")
    child = spawn_projector(s, names, tmp_path, "projector", "--max-records", "25",
                            env=control.env("projector.before_commit=3*pause(60s)"))  # fmt: skip
    try:
        control.wait_reached("projector.before_commit", 30)
        before = stored(s, names)  # the paused chunk's transaction is open: these are the committed offsets
        pg.stop("fast")
        pg.start()
        assert stored(s, names) == before, "the open transaction must not survive the restart"
        control.release("projector.before_commit")
        ok = wait_projected(s, names, 40, child)
        promise(
            "DUR-015.resume-after-postgres-restart",
            ok and child.proc.poll() is None,
            f"the projector did not resume from {before} (exit {child.proc.poll()}):\n{child.tail()}",
        )
        assert child.logged("postgres reconnected") >= 1, child.tail()
        assert child.logged("stored offset went backwards: restoring from offset 0") == 0
    finally:
        child.stop()
    _check_clean(s, names, "DUR-015.resume-after-postgres-restart")
    _assert_matches_topics(s, names)


def test_tool_calls_unknown_obligations_and_transcript(settings: Settings, names: ProjectionNames) -> None:
    """A scripted log (tool calls, an error, a refusal, an Unknown resolved as safe to retry, an abort, a claim)."""
    s = settings.model_copy(update={"partitions": 1})
    provision_topics(s, CODEC, datetime.now(UTC))
    genesis = CODEC.decode_batch(read_topic(s, "log")[0].value, offset=0).batch
    batches = script_log(0, genesis=genesis)

    def append(part: list[LogBatch]) -> None:
        appender = TransactionalAppender(
            settings=s, partition=0, input_topic=s.topic("inbox"), group_metadata=lambda: None,
            replace_poison=lambda run, reason: pytest.fail(f"scripted batch refused: {reason}"),
        )  # fmt: skip
        appender.open()
        try:
            out = [
                AppendBatch(
                    b.batch_id,
                    b.conversation_id,
                    OutRecord(s.topic("log"), b.conversation_id.encode(), CODEC.encode(b)),
                )
                for b in part
            ]
            appender.checkpoint(out, [], None)  # fmt: skip
        finally:
            appender.close()

    projector = Projector(s, ProjectorConfig(names=names))
    thread = threading.Thread(target=projector.run, daemon=True)
    thread.start()
    env = _env(s, names)
    try:
        with ProjectionReader(s.postgres_dsn, names) as reader:
            append(batches[1:CHECKPOINT])
            assert wait_projected(s, names, 20)
            unknown = reader.unknown_obligations()
            assert [(u["submission_id"], u["call_id"], u["tool"], u["submission_state"]) for u in unknown] == [
                ("s1", "D", "pay", "unknown")]  # fmt: skip
            assert unknown[0]["age"].total_seconds() > 0
            conv = reader.conversation("conv-tools")
            assert conv is not None and conv["blocked_by_unknown"] and conv["queue_depth"] == 2
            runs = {r["submission_id"]: r for r in reader.runs(incomplete=True)}
            assert (runs["s1"]["status"], runs["s1"]["waiting_kind"], runs["s1"]["waiting_name"]) == (
                "waiting", "unknown", "pay")  # fmt: skip
            assert runs["s3"]["status"] == "running" and runs["s2"]["status"] == "queued"
            cli = subprocess.run([sys.executable, "-m", "settled.services", "unknown", "list", "--json"],
                                 cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
            assert cli.returncode == 0, cli.stderr
            assert [json.loads(line)["call_id"] for line in cli.stdout.splitlines()] == ["D"]
            incomplete = _cli(env, "runs", "list", "--incomplete", "--json")
            assert sorted((r["submission_id"], r["status"]) for r in incomplete) == [
                ("s1", "waiting"), ("s2", "queued"), ("s3", "running")]  # fmt: skip

            append(batches[CHECKPOINT:])
            assert wait_projected(s, names, 20)
            assert reader.unknown_obligations() == []
            assert reader.runs(incomplete=True) == []
            run = reader.run("s1")
            assert run is not None
            assert [(a["attempt"], a["status"]) for a in run["attempts"]] == [(1, "interrupted"), (2, "completed")]
            assert {c["call_id"]: c["status"] for c in run["tool_calls"]} == {
                "A": "settled", "B": "error", "C": "refused", "D": "settled"}  # fmt: skip
            conv = reader.conversation("conv-tools")
            assert conv is not None
            assert [e["kind"] for e in conv["transcript"]][-4:] == ["tool_call", "tool_result", "step", "reply"]
            assert reader.submission("s2", timeout_s=1) is not None
            assert (reader.receipt("dup-s1") or {}).get("outcome") == "duplicate"
            shown = subprocess.run(
                [sys.executable, "-m", "settled.services", "conversations", "show", "conv-tools", "--json"],
                cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            assert shown.returncode == 0, shown.stderr
            assert json.loads(shown.stdout)["transcript"][0]["content"] == '{"q":"trip"}'
            shown_run = _cli(env, "runs", "show", "s1", "--json")[0]
            assert [a["status"] for a in shown_run["attempts"]] == ["interrupted", "completed"]
            # The operator commands: a rebuild (progress bar on stderr) and a check, with the projector running.
            rebuilt = subprocess.run([sys.executable, "-m", "settled.services", "projections", "rebuild"],
                                     cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
            assert rebuilt.returncode == 0, rebuilt.stderr
            assert "switched" in rebuilt.stdout and "generation 2" in rebuilt.stdout, rebuilt.stdout
            checked = subprocess.run([sys.executable, "-m", "settled.services", "projections", "check"],
                                     cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
            assert checked.returncode == 0, checked.stdout + checked.stderr
            assert "agree" in checked.stdout
            # One at a time: with the projection's maintenance lock held elsewhere both exit 3, naming the holder.
            with psycopg.connect(s.postgres_dsn, autocommit=True, application_name="cli-holder") as holder:
                holder.execute("SELECT pg_advisory_lock(%s::bigint)", (maintenance_lock_key(names.base),))
                for command in ("rebuild", "check"):
                    refused = subprocess.run([sys.executable, "-m", "settled.services", "projections", command],
                                             cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
                    assert refused.returncode == 3, f"{command}: {refused.returncode} {refused.stderr}"
                    assert "cli-holder" in refused.stderr, refused.stderr
            assert [a["status"] for a in (reader.run("s1") or {})["attempts"]] == ["interrupted", "completed"]
    finally:
        projector.stop()
        thread.join(30)
    _check_clean(s, names, "DUR-015.exactly-once")


def _cli(env: dict[str, str], *args: str) -> list[dict[str, Any]]:
    done = subprocess.run([sys.executable, "-m", "settled.services", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def _uncommitted_log_records(s: Settings) -> int:
    """How many log records a read_uncommitted reader sees (aborted ones included)."""
    consumer = Consumer({"bootstrap.servers": s.kafka_bootstrap, "group.id": f"{s.namespace}.uncommitted",
                         "isolation.level": "read_uncommitted", "enable.auto.commit": False})  # fmt: skip
    try:
        total = 0
        for p in range(s.partitions):
            tp = TopicPartition(s.topic("log"), p)
            end = consumer.get_watermark_offsets(tp, timeout=10, cached=False)[1]
            consumer.assign([TopicPartition(s.topic("log"), p, 0)])
            position = 0
            while position < end:
                msg = consumer.poll(1.0)
                if msg is None:
                    position = consumer.position([tp])[0].offset
                    continue
                total += 1
                position = (msg.offset() or 0) + 1
        return total
    finally:
        consumer.close()


def test_a_worker_transaction_aborted_by_a_crash_never_reaches_the_projection(
    topics: Settings, names: ProjectionNames, live_projector: Projector, tmp_path: Path
) -> None:
    """Scenario 12: records sent, the worker killed before the commit, the partition moved to another worker."""
    s = topics
    load = make_load(41, conversations=6, total=60, duplicates=6, resends=3, conflicts=4, adjacent=2)
    produce_load(s, load)
    first = spawn_worker(s, tmp_path, "w1", failpoints="appender.after_produce=5*kill")
    assert first.proc.wait(60) == -9, first.tail()
    second = spawn_worker(s, tmp_path, "w2")
    try:
        wait_for(lambda: len(settlements(s)) >= load.count["original"], 60, "every original settled")
    finally:
        second.kill_and_wait()
    committed = len(read_topic(s, "log"))
    assert _uncommitted_log_records(s) > committed, "no aborted records in the log: the crash came too late"
    assert wait_projected(s, names, 30)
    _check_clean(s, names, "DUR-015.read-committed")
    _assert_matches_topics(s, names)
