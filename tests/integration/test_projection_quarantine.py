"""A projector never dies or spins on a row it cannot write; submission ids are per conversation (issue 25 items 3-4).

Real Kafka, real PostgreSQL. The hostile records are put into the log directly, as canonical batches appended through
the transactional appender (as a worker of an older version, admitting any id, would have written them), so these
tests keep exercising the projector whatever admission refuses today.

* An id PostgreSQL cannot store (a NUL character; a key longer than a btree index row) makes each batch of that
  conversation an entry of the projection's quarantine table, in the transaction that moves the offset past it; the
  healthy conversations around it are projected, a restarted projector goes on, a rebuild quarantines the same
  positions, and `settled projections check` lists them (exit 4) with nothing else differing.
* One submission id used in two conversations (raw proposals to the inbox): both are admitted, settle and are
  projected; live equals rebuild; ``settled submissions show`` lists both conversations.
* A projection schema of the previous layout is migrated in place to the new keys.
"""

from __future__ import annotations

import json
import os
import secrets
import string
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from settled._settings import Settings
from settled.producers import AppendBatch, OutRecord, TransactionalAppender, provision_topics
from settled.projections import (
    LAYOUT_VERSION,
    ProjectionLayoutError,
    ProjectionNames,
    check,
    check_layout,
    migrate,
    migrations,
    read_meta,
    rebuild,
    row_group,
)
from settled.runtime import App
from settled.schemas import AttemptStarted, LogBatch, SettlementOutcome, SubmissionReady
from settled.services._worker_service import build_worker
from settled.testing.echo import EchoAgent
from tests._promise import promise
from tests.conftest import Provisioned
from tests.harness.factories import proposal
from tests.integration.admission_load import settlements
from tests.integration.helpers import (
    CODEC,
    check_clean,
    conversations_on,
    fresh_projection,
    produce_inbox,
    projecting,
    projection_rows,
    read_topic,
    running,
    wait_for,
    wait_projected,
)
from tests.integration.projection_script import Script, admitted, settlement

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def names(postgres_dsn: str) -> Iterator[ProjectionNames]:
    with fresh_projection(postgres_dsn) as n:
        yield n


def _append(s: Settings, batches: list[LogBatch]) -> None:
    """Append canonical batches to log partition 0 in one transaction (as a worker would)."""
    appender = TransactionalAppender(
        settings=s, partition=0, input_topic=s.topic("inbox"), group_metadata=lambda: None,
        replace_poison=lambda run, reason: pytest.fail(f"scripted batch refused: {reason}"),
    )  # fmt: skip
    appender.open()
    try:
        out = [
            AppendBatch(
                b.batch_id, b.conversation_id, OutRecord(s.topic("log"), b.conversation_id.encode(), CODEC.encode(b))
            )
            for b in batches
        ]
        appender.checkpoint(out, [], None)
    finally:
        appender.close()


def _lifecycle(script: Script, cid: str, sid: str) -> None:
    """Admitted, started, completed: three batches of one conversation."""
    script.add(cid, admitted(sid, cid, 1, {"q": sid}), SubmissionReady(submission_id=sid, submission_seq=1))
    script.add(cid, AttemptStarted(submission_id=sid, attempt=1, attempt_id=f"{sid}-a1", owner_epoch=script.epoch))
    script.add(cid, settlement(sid, SettlementOutcome.COMPLETED, 1, {"echo": sid}))


def _env(s: Settings, names: ProjectionNames) -> dict[str, str]:
    return {**os.environ, "SETTLED_NAMESPACE": s.namespace, "SETTLED_KAFKA_BOOTSTRAP": s.kafka_bootstrap,
            "SETTLED_POSTGRES_DSN": s.postgres_dsn, "SETTLED_PROJECTION_SCHEMA": names.base}  # fmt: skip


def _cli(s: Settings, names: ProjectionNames, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "settled.services", *args], cwd=ROOT, env=_env(s, names),
                          capture_output=True, text=True, timeout=90)  # fmt: skip


def _quarantine(s: Settings, schema: str) -> list[tuple[int, int, str, str]]:
    with psycopg.connect(s.postgres_dsn, autocommit=True) as conn:
        rows = conn.execute(
            sql.SQL(
                "SELECT partition, log_offset, event_types, refused_groups, error FROM {} "
                "ORDER BY partition, log_offset"
            ).format(sql.Identifier(schema, "projection_quarantine"))
        ).fetchall()
    return [(int(p), int(o), f"{t} / {g}", str(e)) for p, o, t, g, e in rows]


_ALPHABET = string.ascii_letters + string.digits


def test_a_nul_in_an_id_is_quarantined_and_the_projection_goes_on(settings: Settings, names: ProjectionNames) -> None:
    """PostgreSQL text cannot hold NUL: the driver refuses the value before sending it (no SQLSTATE)."""
    _refused_rows_are_quarantined(settings, names, "nul", "conv-with-\x00-nul", "NUL")


def test_an_id_too_long_for_an_index_is_quarantined_and_the_projection_goes_on(
    settings: Settings, names: ProjectionNames
) -> None:
    """54000 ``index row size exceeds btree maximum`` is no lost connection (psycopg raises it as OperationalError).

    Random characters: a btree index row holds about 2.7 KB after compression, which they defeat.
    """
    bad_id = "conv-long-" + "".join(secrets.choice(_ALPHABET) for _ in range(6000))
    _refused_rows_are_quarantined(settings, names, "long", bad_id, "index row size")


def _refused_rows_are_quarantined(
    settings: Settings, names: ProjectionNames, case: str, bad_id: str, error: str
) -> None:
    s = settings.model_copy(update={"partitions": 1})
    provision_topics(s, CODEC, datetime.now(UTC))
    genesis = CODEC.decode_batch(read_topic(s, "log")[0].value, offset=0).batch
    script = Script(partition=0)
    script.heads[genesis.conversation_id] = (genesis.last_event_seq, genesis.batch_digest)
    script.claim(1, "worker-old")
    _lifecycle(script, "conv-before", "s-before")
    # Offsets: the genesis record (0) and its transaction's marker (1), then one record per batch (one transaction).
    first_bad = 2 + len(script.batches)
    _lifecycle(script, bad_id, "s-bad")
    _lifecycle(script, "conv-after", "s-after")
    bad_offsets = [first_bad, first_bad + 1, first_bad + 2]
    _append(s, script.batches)

    with projecting(s, names) as live:
        try:
            wait_projected(s, names, 20, live)
            stuck = ""
        except AssertionError as exc:
            stuck = str(exc)
        promise(
            "DUR-015.refused-row-quarantined",
            not stuck and live.alive(),
            f"the projector did not get past the {case} id's records and project its neighbours: {stuck}",
        )
        assert live.projector.quarantined == 3
    quarantined = _quarantine(s, names.live)
    assert [(p, o) for p, o, _, _ in quarantined] == [(0, o) for o in bad_offsets], quarantined
    bad_group = row_group(bad_id)
    assert quarantined[0][2] == f"SubmissionAdmitted,SubmissionReady / {bad_group}"
    assert all(error in e for _, _, _, e in quarantined), quarantined
    settled = {r["submission_id"] for r in projection_rows(s, names, "settlements")}
    assert settled == {"s-before", "s-after"}

    # A restarted projector goes on from the stored offset; what is appended later is projected. A new owner's claim
    # spans every conversation of the partition: only the refused one's rows are left out, the neighbours' are written.
    later = Script(partition=0, epoch=1, heads=dict(script.heads))
    later.claim(2, "worker-new")
    claim_offset = first_bad + 6 + 1  # after the first transaction's last record and its marker
    _lifecycle(later, "conv-later", "s-later")
    _append(s, later.batches)
    with projecting(s, names) as live:
        wait_projected(s, names, 20, live)
        assert live.projector.quarantined == 1
    bad_offsets.append(claim_offset)
    quarantined = _quarantine(s, names.live)
    assert [(p, o) for p, o, _, _ in quarantined] == [(0, o) for o in bad_offsets], quarantined
    assert quarantined[-1][2] == f"OwnershipClaimed / {bad_group}"
    assert {r["submission_id"] for r in projection_rows(s, names, "settlements")} == {"s-before", "s-after", "s-later"}
    assert [(r["claim_epoch"], r["claimed_by"]) for r in projection_rows(s, names, "partitions")] == [(2, "worker-new")]
    epochs = {r["conversation_id"]: r["owner_epoch"] for r in projection_rows(s, names, "conversations")}
    assert epochs == {"conv-before": 2, "conv-after": 2, "conv-later": 2}

    # The check compares everything else and lists the quarantined positions; the CLI exits 4 while any exist.
    report = check_clean(s, names, "DUR-015.exactly-once")
    assert [(q.partition, q.log_offset) for q in report.quarantined] == [(0, o) for o in bad_offsets]
    checked = _cli(s, names, "projections", "check")
    assert checked.returncode == 4, checked.stdout + checked.stderr
    assert f"(0, {bad_offsets[0]})" in checked.stdout, checked.stdout

    # A rebuild (the bulk replay) quarantines the same positions and switches.
    result = rebuild(s, names, timeout_s=60)
    assert result.generation == 2
    assert [(p, o) for p, o, _, _ in _quarantine(s, names.live)] == [(0, o) for o in bad_offsets]
    assert {r["submission_id"] for r in projection_rows(s, names, "settlements")} == {"s-before", "s-after", "s-later"}
    assert check(s, names, timeout_s=60).ok


def test_one_submission_id_in_two_conversations_is_admitted_settles_and_projects(
    provisioned: Provisioned, names: ProjectionNames
) -> None:
    s = provisioned(2)
    (c0,) = conversations_on(0, 2, "reuse")
    (c1,) = conversations_on(1, 2, "reuse")
    sid = "shared-submission-id"
    raw = []
    for cid in (c0, c1):
        p = proposal(cid, value={"in": cid}).model_copy(update={"submission_id": sid})
        raw.append((cid.encode(), CODEC.encode(p)))
    produce_inbox(s, raw)
    worker = build_worker(s, App(agent=EchoAgent(delay_s=0.0)))
    with running(worker):
        wait_for(lambda: len(settlements(s)) >= 2, 60, "both settlements")
    assert sorted((r.conversation_id, r.submission_id, r.outcome.value) for r in settlements(s)) == sorted(
        [(c0, sid, "completed"), (c1, sid, "completed")]
    )
    with projecting(s, names) as live:
        wait_projected(s, names, 30, live)
    subs = sorted(
        (r["conversation_id"], r["submission_id"], r["state"]) for r in projection_rows(s, names, "submissions")
    )
    assert subs == sorted([(c0, sid, "completed"), (c1, sid, "completed")])
    assert len(projection_rows(s, names, "settlements")) == 2
    assert len(projection_rows(s, names, "attempts")) == 2
    check_clean(s, names, "DUR-015.exactly-once")
    rebuild(s, names, timeout_s=60)
    subs_rebuilt = sorted(
        (r["conversation_id"], r["submission_id"], r["state"]) for r in projection_rows(s, names, "submissions")
    )
    assert subs_rebuilt == subs

    shown = _cli(s, names, "submissions", "show", sid, "--json")
    assert shown.returncode == 0, shown.stderr
    rows: list[dict[str, Any]] = [json.loads(line) for line in shown.stdout.splitlines()]
    assert sorted(r["conversation_id"] for r in rows) == sorted([c0, c1])
    one = _cli(s, names, "submissions", "show", sid, "--conversation", c1, "--json")
    assert one.returncode == 0, one.stderr
    assert [json.loads(line)["conversation_id"] for line in one.stdout.splitlines()] == [c1]
    runs = _cli(s, names, "runs", "show", sid, "--json")
    assert runs.returncode == 0, runs.stderr
    assert sorted(json.loads(line)["conversation_id"] for line in runs.stdout.splitlines()) == sorted([c0, c1])


def test_a_layout_1_schema_is_migrated_in_place(postgres_dsn: str, names: ProjectionNames) -> None:
    """A projection written by the previous release (layout 1, keys by id alone) takes the new keys on `migrate`,

    and layout 7 names the openers of the conversations it holds; layout 9 adds ``submissions.retry_of`` (NULL for
    every submission it held).
    """
    schema = names.live
    first = migrations()[0]
    assert first.version == 1
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        ident = sql.Identifier(schema)
        with conn.transaction():
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(ident))
            conn.execute(
                sql.SQL(
                    "CREATE TABLE {}.schema_migrations (version integer PRIMARY KEY, name text NOT NULL, "
                    "applied_at timestamptz NOT NULL DEFAULT now())"
                ).format(ident)
            )
            conn.execute(sql.SQL("SET LOCAL search_path TO {}").format(ident))
            conn.execute(first.text.encode())
            conn.execute("INSERT INTO schema_migrations (version, name) VALUES (1, %s)", (first.name,))
            conn.execute("INSERT INTO meta (key, value) VALUES ('layout', '1'), ('generation', '1')")
            conn.execute(
                "INSERT INTO receipts (request_id, request_kind, conversation_id, outcome, decided_at, log_offset) "
                "VALUES ('r1', 'submission', 'c1', 'admitted', now(), 3)"
            )
            for sid, seq, principal in (("s1", 1, "alice"), ("s2", 2, "bob")):
                conn.execute(
                    "INSERT INTO submissions (submission_id, conversation_id, partition, submission_seq, principal, "
                    "idempotency_key, payload_digest, tools_offered, state, receipt_outcome, attempt_count, "
                    "input_applied, abort_requested, open_calls, unknown_calls, admitted_at, admitted_offset, "
                    "updated_at, last_offset) VALUES (%s, 'c1', 0, %s, %s, %s, 'd', '{}', 'admitted', 'admitted', 0, "
                    "false, false, 0, 0, now(), %s, now(), %s)",
                    (sid, seq, principal, sid, seq, seq),
                )
        with pytest.raises(ProjectionLayoutError, match="layout '1'"):
            check_layout(conn, schema)
        assert migrate(conn, schema) == [2, 3, 4, 5, 6, 7, 8, 9]
        check_layout(conn, schema)
        # The same request id in a second conversation is a second row now; the first one is kept.
        conn.execute(
            sql.SQL(
                "INSERT INTO {} (request_id, request_kind, conversation_id, outcome, decided_at, log_offset) "
                "VALUES ('r1', 'submission', 'c2', 'admitted', now(), 4)"
            ).format(sql.Identifier(schema, "receipts"))
        )
        rows = conn.execute(
            sql.SQL("SELECT conversation_id FROM {} ORDER BY 1").format(sql.Identifier(schema, "receipts"))
        ).fetchall()
        assert [r[0] for r in rows] == ["c1", "c2"]
        assert read_meta(conn, schema)["layout"] == str(LAYOUT_VERSION) == "9"
        retried = conn.execute(
            sql.SQL("SELECT submission_id, retry_of FROM {} ORDER BY 1").format(sql.Identifier(schema, "submissions"))
        ).fetchall()
        assert retried == [("s1", None), ("s2", None)]
        # Layout 7 names each projected conversation's opener (the API's reads depend on it), and only the opener.
        access = conn.execute(
            sql.SQL("SELECT conversation_id, principal, access FROM {}").format(
                sql.Identifier(schema, "conversation_access")
            )
        ).fetchall()
        assert access == [("c1", "alice", "opener")]
