"""The BFCL CI slice (issue 8 acceptance): `settled demo bfcl` on real input through the real stack.

* 30 base conversations through two worker processes, a projector and the tool server, under a seeded chaos
  schedule (worker SIGKILLs at failpoints, one at "tool applied, settlement not committed"; one tool-server SIGKILL
  and restart; no broker restart: the session's broker is shared): every conversation passes the verdict judged in
  a fresh process, with no duplicate execution, no lost submission, no dead letter, and the projection matching the
  log.
* miss_func with the adversarial model: the model's call of the held-out tool is refused and nothing runs; the
  holdout turn's empty ground truth ends with the model's text and a completed settlement.

The full runs (200 conversations, with and without ``--chaos``, the dedup-off control, ``--no-idempotency``) are
README commands.
"""

from __future__ import annotations

import io
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from confluent_kafka.admin import AdminClient
from rich.console import Console

from settled._settings import Settings
from settled.projections import ProjectionNames, default_schema
from settled.services.bfcl import adversarial_call, load_corpus, replayable_entries
from settled.services.bfcl._demo import TOOL_APPLIED_POINT, DemoOptions, DemoResult, render_demo, run_demo

pytestmark = [pytest.mark.bfcl, pytest.mark.integration]

SEED = 20261129


@pytest.fixture
def demo_namespace(postgres_dsn: str, kafka_admin: AdminClient) -> Iterator[str]:
    """A fresh namespace; its topics on the session broker and its projection schema are dropped at teardown."""
    ns = f"t{uuid.uuid4().hex[:10]}"
    yield ns
    topics = [t for t in kafka_admin.list_topics(timeout=30).topics if t.startswith(f"{ns}.")]
    if topics:
        for fut in kafka_admin.delete_topics(topics, operation_timeout=30).values():
            fut.result()
    schema = ProjectionNames(default_schema(ns)).live
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        for name in (schema, f"{schema}__next", f"{schema}__retired"):
            conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


def _report(result: DemoResult) -> str:
    out = Console(file=io.StringIO(), width=160)
    render_demo(result, out)
    assert isinstance(out.file, io.StringIO)
    return out.file.getvalue()


def test_thirty_base_conversations_pass_under_seeded_kills_and_a_tool_server_restart(
    settings: Settings, demo_namespace: str, tmp_path: Path
) -> None:
    options = DemoOptions(
        category="base",
        conversations=30,
        chaos=True,
        seed=SEED,
        kills=4,
        in_flight=4,  # a longer run: each kill waits for the previous one's recovery (DemoOptions.chaos)
        broker_restart=False,  # the session's shared broker; the full --chaos run restarts the dev stack's
        work_dir=tmp_path / "demo",
        timeout_s=170.0,
    )
    log = io.StringIO()
    s = settings.model_copy(update={"partitions": 6})
    result = run_demo(options, s, namespace=demo_namespace, console=Console(file=log, width=160))
    report = _report(result)
    context = f"{report}\n{log.getvalue()[-4000:]}"
    verdicts = result.summary.verdicts
    assert len(verdicts) == 30 and result.summary.all_passed, context
    assert sum(v.duplicate_executions + v.unexpected_executions for v in verdicts) == 0, context
    assert all(v.executions == v.tool_calls for v in verdicts), context
    assert (result.lost_submissions, result.dead_letters, result.projection_mismatches) == (0, 0, ()), context
    assert result.settled == result.submissions, context
    assert any(spec.startswith(f"{TOOL_APPLIED_POINT}=") for spec in result.schedule), result.schedule
    assert result.kills >= 3, f"only {result.kills} of the scheduled kills fired: {result.schedule}\n{context}"
    assert (result.broker_restarts, result.toolserver_restarts) == (0, 1), context
    assert result.unexpected_exits == 0, context
    assert result.passed, context


def test_miss_func_refuses_the_adversarial_call_and_the_holdout_turn_ends_in_text(
    settings: Settings, demo_namespace: str, tmp_path: Path
) -> None:
    entries = replayable_entries(load_corpus("miss_func"))[:4]
    adversarial = [
        (entry.id, turn.index) for entry in entries for turn in entry.turns if adversarial_call(entry, turn.index)
    ]
    assert adversarial, "the first miss_func entries have holdout turns"
    options = DemoOptions(
        category="miss_func", conversations=4, adversarial=True, seed=SEED, work_dir=tmp_path / "demo", timeout_s=120.0
    )
    log = io.StringIO()
    result = run_demo(options, settings, namespace=demo_namespace, console=Console(file=log, width=160))
    context = f"{_report(result)}\n{log.getvalue()[-3000:]}"
    verdicts = result.summary.verdicts
    # The verdict requires exactly the adversarial calls refused, no execution but the ground truth's, a reply and
    # a completed settlement per turn (the holdout turns' empty ground truth included).
    assert result.passed and len(verdicts) == 4, context
    assert sum(v.refused_calls for v in verdicts) == len(adversarial), context
    assert sum(v.unexpected_executions for v in verdicts) == 0, context
    assert result.settled == result.submissions == sum(len(entry.turns) for entry in entries), context
