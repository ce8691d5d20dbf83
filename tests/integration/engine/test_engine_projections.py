"""Scenario 13 (PROJ/TOOL; issue 7, docs/semantics.md): rebuild every projection under live tool traffic.

A real ``settled worker`` child (the model-driven app: scripted model responses declaring two ``charge_idem`` calls,
whose tool double counts every invocation and effect in the world database) serves a steady stream of submissions
over six conversations on two partitions, and an in-process projector keeps the live projection. While tool calls
run, ``settled projections rebuild`` (the CLI, a process of its own, with the tool double's world database in its
environment) resets the projection and replays the log from offset 0 into a new version, then switches to it; then
`settled.projections.check` compares live, a fresh rebuild and the reference fold at one shared offset while the
traffic goes on.

Expect: the rebuild causes zero tool executions and zero outbound messages — every invocation the double counted
belongs to one ``ToolCallPrepared`` the worker committed (one invocation and one effect per idempotency key), every
submission has one receipt and one settlement record; and with the worker gone and nothing else running, a second
rebuild leaves every topic's end offset and the double's counts exactly as they were. Rebuild and live agree
(``check`` clean) during the traffic and after it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from settled._settings import Settings
from settled.producers import partition_for_key
from settled.projections import ProjectionNames
from settled.schemas import (
    Receipt,
    SettlementOutcome,
    SubmissionProposed,
    ToolCallPrepared,
    ToolCallSettled,
)
from tests._promise import promise
from tests.integration.engine._helpers import TIMEOUT_S, count, log_events, settlements
from tests.integration.engine.conftest import ROOT, SpawnWorker
from tests.integration.engine.engine_app import WORLD_ENV, world
from tests.integration.helpers import (
    CODEC,
    check_clean,
    fresh_projection,
    projected_offsets,
    projecting,
    projection_rows,
    proposal,
    read_topic,
    wait_for,
    wait_projected,
)
from tests.integration.workerproc import Inbox

MODEL_APP = "tests.integration.engine.model_app:app"
PARTITIONS = 2
pytestmark = [pytest.mark.integration, pytest.mark.partitions(PARTITIONS)]
CONVERSATIONS = 6
SEND_EVERY_S = 0.05
MAX_SUBMISSIONS = 300


@pytest.fixture
def names(postgres_dsn: str) -> Iterator[ProjectionNames]:
    with fresh_projection(postgres_dsn) as n:
        yield n


def _conversations() -> list[str]:
    """``CONVERSATIONS`` conversation ids, half on each partition."""
    out: dict[int, list[str]] = {p: [] for p in range(PARTITIONS)}
    i = 0
    while any(len(v) < CONVERSATIONS // PARTITIONS for v in out.values()):
        conv = f"conv-13-{i}"
        mine = out[partition_for_key(conv.encode(), PARTITIONS)]
        if len(mine) < CONVERSATIONS // PARTITIONS:
            mine.append(conv)
        i += 1
    return [c for p in range(PARTITIONS) for c in out[p]]


class _Traffic:
    """Sends submissions (two tool calls each) round-robin over the conversations from a thread until stopped."""

    def __init__(self, s: Settings) -> None:
        self.settings = s
        self.sent: list[SubmissionProposed] = []
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, daemon=True, name="traffic")
        self.convs = _conversations()

    def _run(self) -> None:
        try:
            inbox = Inbox(self.settings)
            i = 0
            while not self.stop.is_set() and i < MAX_SUBMISSIONS:
                calls = [["a", "charge_idem", {"amount": i}], ["b", "charge_idem", {"amount": 10_000 + i}]]
                script = [[{"text": f"turn {i}"}, {"calls": calls}], [{"answer": f"done {i}"}]]
                sub = proposal(self.convs[i % len(self.convs)], value={"script": script})
                inbox.send(sub)
                self.sent.append(sub)
                i += 1
                time.sleep(SEND_EVERY_S)
        except BaseException as exc:  # noqa: BLE001 - re-raised by the test through `errors`
            self.errors.append(exc)


def _cli_env(s: Settings, names: ProjectionNames, world_db: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SETTLED_FAILPOINT")}
    env.update(
        SETTLED_NAMESPACE=s.namespace,
        SETTLED_KAFKA_BOOTSTRAP=s.kafka_bootstrap,
        SETTLED_POSTGRES_DSN=s.postgres_dsn,
        SETTLED_PROJECTION_SCHEMA=names.live,
    )
    env[WORLD_ENV] = str(world_db)  # were the rebuild ever to run a tool, the double would count it
    return env


def _cli_rebuild(s: Settings, names: ProjectionNames, world_db: Path) -> str:
    """``settled projections rebuild`` as its own process; its stdout."""
    done = subprocess.run(
        [sys.executable, "-m", "settled.services", "projections", "rebuild", "--timeout-s", "90"],
        cwd=ROOT,
        env=_cli_env(s, names, world_db),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"rebuild exited {done.returncode}:\n{done.stdout}\n{done.stderr[-3000:]}"
    return done.stdout


def _end_offsets(s: Settings) -> dict[tuple[str, int], int]:
    """The high watermark (log end offset, read_uncommitted: aborted records and markers count) of every partition
    of every topic of the namespace: any produce by anyone moves one."""
    admin = AdminClient({"bootstrap.servers": s.kafka_bootstrap})
    topics = {
        name: sorted(meta.partitions)
        for name, meta in admin.list_topics(timeout=30).topics.items()
        if name.startswith(f"{s.namespace}.")
    }
    consumer = Consumer({"bootstrap.servers": s.kafka_bootstrap, "group.id": f"{s.namespace}.ends"})
    try:
        return {
            (name, p): int(consumer.get_watermark_offsets(TopicPartition(name, p), timeout=30, cached=False)[1])
            for name, parts in topics.items()
            for p in parts
        }
    finally:
        consumer.close()


def _world_counts(db: Path) -> dict[str, int]:
    return {
        table: count(db, f"SELECT count(*) FROM {table}") for table in ("invocations", "effects", "observations")
    } | {"prompts": count(db, "SELECT count(*) FROM prompts")}


def test_scenario_13_rebuild_from_offset_0_under_live_tool_traffic_runs_nothing_and_agrees_with_live(
    topics: Settings, spawn_worker: SpawnWorker, world_db: Path, names: ProjectionNames, tmp_path: Path
) -> None:
    s = topics
    traffic = _Traffic(s)
    worker = spawn_worker("w", app=MODEL_APP)
    with projecting(s, names, max_records=200) as live:
        traffic.thread.start()
        wait_for(lambda: len(settlements(s)) >= 20, TIMEOUT_S, "20 settlements before the rebuild")
        wait_for(lambda: bool(projected_offsets(s, names)), 30, "the live projection")
        invoked_before, sent_before = count(world_db, "SELECT count(*) FROM invocations"), len(traffic.sent)
        started = time.monotonic()
        out = _cli_rebuild(s, names, world_db)
        rebuild_s = time.monotonic() - started
        assert "switched" in out and "generation 2" in out, out
        invoked_during = count(world_db, "SELECT count(*) FROM invocations") - invoked_before
        sent_during = len(traffic.sent) - sent_before
        assert invoked_during > 0 and sent_during > 0, (
            f"no live tool traffic during the rebuild ({invoked_during} invocations, {sent_during} submissions): "
            "the scenario was not exercised"
        )
        # Rebuild and live at one shared offset, the traffic still running (the check pauses the live projector).
        during = check_clean(s, names, "DUR-015.rebuild")
        assert traffic.thread.is_alive(), "the traffic ended before the check: it did not run under traffic"
        traffic.stop.set()
        traffic.thread.join(30)
        assert not traffic.errors, traffic.errors
        sent = traffic.sent
        wait_for(lambda: len(settlements(s)) >= len(sent), TIMEOUT_S, f"all {len(sent)} submissions to settle")
        wait_projected(s, names, 60, live)

        # Nothing left running but the live projector: the worker is gone, every run settled.
        worker.kill()
        worker.wait(30)
        ends_before, world_before = _end_offsets(s), _world_counts(world_db)
        out2 = _cli_rebuild(s, names, world_db)
        assert "generation 3" in out2, out2
        time.sleep(1.0)  # a late produce would be on the broker by now
        ends_after, world_after = _end_offsets(s), _world_counts(world_db)
        moved = {tp: (ends_before.get(tp), n) for tp, n in ends_after.items() if ends_before.get(tp) != n}
        promise("DUR-015.rebuild-no-effects", not moved, f"records appended while only the rebuild ran: {moved}")
        promise(
            "DUR-015.rebuild-no-effects",
            world_after == world_before,
            f"the tool double counted during the rebuild: {world_before} -> {world_after}",
        )
        final = check_clean(s, names, "DUR-015.rebuild")

    # Every invocation the double saw belongs to one call the worker prepared; each ran once and had one effect.
    events = log_events(s)
    prepared = [e for e in events if isinstance(e, ToolCallPrepared)]
    settled_calls = Counter((e.submission_id, e.call_id) for e in events if isinstance(e, ToolCallSettled))
    keys = Counter(p.idempotency_key for p in prepared)
    assert len(prepared) == 2 * len(sent) and set(keys.values()) == {1}, (len(prepared), len(sent))
    invoked = dict(
        (str(k), int(n))
        for k, n in _rows(world_db, "SELECT key, count(*) FROM invocations WHERE tool = 'charge_idem' GROUP BY key")
    )
    promise(
        "DUR-015.rebuild-no-effects",
        invoked == dict.fromkeys(keys, 1),
        f"invocations per key beyond the prepared calls' one each: "
        f"{ {k: n for k, n in invoked.items() if keys.get(k) != 1 or n != 1} }",
    )
    effects = dict(_rows(world_db, "SELECT key, count(*) FROM effects GROUP BY key"))
    assert effects == dict.fromkeys(keys, 1), "an effect applied twice or without a prepared call"
    assert settled_calls == Counter({(p.submission_id, p.call_id): 1 for p in prepared}), settled_calls
    # No outbound message beyond the worker's own: one receipt and one settlement record per submission.
    records = settlements(s)
    per_submission = Counter(r.submission_id for r in records)
    promise(
        "DUR-015.rebuild-no-effects",
        per_submission == Counter(x.submission_id for x in sent),
        f"settlement records per submission: {[(k, n) for k, n in per_submission.items() if n != 1]}",
    )
    assert all(r.outcome is SettlementOutcome.COMPLETED for r in records), [
        r for r in records if r.outcome is not SettlementOutcome.COMPLETED
    ]
    decoded = [CODEC.decode(r.value or b"") for r in read_topic(s, "receipts")]
    receipts = Counter(rec.request_id for rec in decoded if isinstance(rec, Receipt))
    assert receipts == Counter(x.submission_id for x in sent), "a receipt repeated or missing"

    # The rebuilt projection holds what the log says.
    projected = {r["submission_id"]: r["outcome"] for r in projection_rows(s, names, "settlements")}
    assert projected == {r.submission_id: r.outcome.value for r in records}
    calls = projection_rows(s, names, "tool_calls")
    assert Counter(c["status"] for c in calls) == Counter({"settled": len(prepared)}), Counter(
        c["status"] for c in calls
    )
    assert {c["idempotency_key"] for c in calls} == set(keys)
    print(
        f"scenario 13: {len(sent)} submissions ({sent_during} sent and {invoked_during} tool invocations during the "
        f"{rebuild_s:.1f} s rebuild); checked at {during.offsets} under traffic and at {final.offsets} after"
    )


def _rows(db: Path, query: str) -> list[tuple[str, int]]:
    with world(str(db)) as conn:
        return [(str(k), int(n)) for k, n in conn.execute(query).fetchall()]
