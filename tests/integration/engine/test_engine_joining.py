"""Joining through real workers (issue 22 item 2, DUR-016): a running run takes in the ready turns queued behind it.

A real ``settled worker`` child runs the model-driven test app (`tests/integration/engine/model_app.py`), whose
scripted provider writes every prompt it is shown to the world database. Turn A opens its conversation with the
``join`` lane; its first model call declares ``hold_until_flag``, which keeps A running until the test sets the world
flag. Meanwhile B, C and D are submitted (their receipts say admitted: each is canonical and ready) and C is aborted
(settled before A's next model call). Setting the flag lets A's second model call start: the owner joins the
contiguous ready prefix queued behind A, across the aborted C (B and D), in one `SubmissionsJoined` committed before
that call, and B and D settle with A, in A's batch, with A's outcome. The kills happen at named failpoints: just
before the join record is committed (`conductor.after_join_staged`) and just after (`engine.after_join_commit`).

Issue 22's burst of 20 under ``join`` is the ``join`` case of `tests/integration/engine/test_engine_lanes.py`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from settled._settings import Settings
from settled.client import Client
from settled.protocol import check_joining
from settled.schemas import (
    AttemptStarted,
    LogBatch,
    ModelResponseCompleted,
    ReceiptOutcome,
    Settlement,
    SettlementOutcome,
    SubmissionsJoined,
    canonical_json,
)
from tests._promise import promise
from tests.integration.engine._helpers import (
    TIMEOUT_S,
    events_of,
    invocations,
    killed,
    log_events,
    settlements,
)
from tests.integration.engine.conftest import SpawnWorker
from tests.integration.engine.engine_app import flag, world
from tests.integration.engine.model_app import prompts
from tests.integration.helpers import CODEC, read_topic, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

MODEL_APP = "tests.integration.engine.model_app:app"
CONV = "conv-join"
SCRIPT = {
    "script": [
        [{"calls": [["c1", "hold_until_flag", {"flag": "queued"}]]}],
        [{"answer": "done"}],
    ]
}


@pytest.fixture
def client(topics: Settings) -> Iterator[Client]:
    with Client(topics, principal="ops", default_timeout_s=TIMEOUT_S) as c:
        yield c


def _batches(s: Settings) -> list[LogBatch]:
    out = []
    for r in read_topic(s, "log"):
        assert r.value is not None
        out.append(CODEC.decode_batch(r.value, offset=r.offset).batch)
    return out


def _after_input(messages: list[dict[str, object]]) -> list[object]:
    """The user texts of a prompt after the turn's own input: what the runtime appended (the joined inputs)."""
    texts = [m["text"] for m in messages if m["role"] == "user"]
    return texts[texts.index(canonical_json(SCRIPT)) + 1 :]


def _queue_behind_a_running_a(client: Client, world_db: Path) -> dict[str, str]:
    """A runs (its tool in flight) and B, C, D are canonical and ready behind it; C is aborted and settled."""
    a = client.submit(CONV, SCRIPT, lane="join")
    wait_for(lambda: invocations(world_db, "hold_until_flag") == 1, TIMEOUT_S, "A's tool in flight")
    ids = {"A": a.request_id}
    for name in "BCD":
        receipt = client.submit(CONV, f"{name}: and one more thing")
        assert receipt.outcome is ReceiptOutcome.ADMITTED, receipt
        ids[name] = receipt.request_id
    aborted = client.abort(CONV, ids["C"], reason="never mind")
    assert aborted.outcome is ReceiptOutcome.APPLIED, aborted
    return ids


def _check_joined_once(s: Settings, client: Client, ids: dict[str, str], world_db: Path) -> SubmissionsJoined:
    """Every promise of joining that holds whatever was killed; returns the one join record."""
    wait_for(lambda: {r.submission_id for r in settlements(s)} >= {ids["A"], ids["C"]}, TIMEOUT_S, "A and C settled")
    # B and D settle in A's batch, right after A: one transaction, so they are on the log together with A.
    settling = [
        b for b in _batches(s) if any(isinstance(e, Settlement) and e.submission_id == ids["A"] for e in b.events)
    ]
    assert len(settling) == 1
    in_batch = [(e.submission_id, e.joined_to) for e in settling[0].events if isinstance(e, Settlement)]
    promise(
        "DUR-016.settles-with-host",
        in_batch == [(ids["A"], None), (ids["B"], ids["A"]), (ids["D"], ids["A"])],
        f"the host and every submission it joined settle in one batch (one commit), the host first: {in_batch}",
    )
    by_id = {name: [r for r in settlements(s) if r.submission_id == sid] for name, sid in ids.items()}
    promise(
        "DUR-016.settles-once",
        all(len(found) == 1 for found in by_id.values()),
        f"each submission settles exactly once: {by_id}",
    )
    a, b, c, d = (by_id[n][0] for n in "ABCD")
    assert a.outcome is SettlementOutcome.COMPLETED and a.reply_json == canonical_json("done") and a.joined_to is None
    assert (c.outcome, c.error_reason, c.joined_to) == (SettlementOutcome.ABORTED, "never mind", None)
    promise(
        "DUR-016.settles-with-host",
        all((r.outcome, r.reply_json, r.joined_to) == (a.outcome, a.reply_json, ids["A"]) for r in (b, d)),
        f"a joined submission settles with its host's outcome and reply, naming it: {b}, {d}",
    )
    # In the log: one join record, B and D across the aborted C; their settlements in A's batch, right after A's.
    events = log_events(s)
    joins = [e for e in events if isinstance(e, SubmissionsJoined)]
    assert [(j.submission_id, j.joined_ids) for j in joins] == [(ids["A"], (ids["B"], ids["D"]))], joins
    conversation = [e for b in _batches(s) if b.conversation_id == CONV for e in b.events]
    broken = check_joining(conversation)
    promise("DUR-016.settles-with-host", broken == [], f"the pure checker over the log: {broken}")
    # A joined submission never runs as its own turn.
    started = {e.submission_id for e in events if isinstance(e, AttemptStarted)}
    assert started == {ids["A"]}, started
    return joins[0]


def _prompts_show_b_and_d_once(world_db: Path) -> None:
    seen = prompts(str(world_db))
    assert [pos for _, pos, _ in seen] == [0, 1], seen  # one first call; the second was made once, by one attempt
    assert _after_input(seen[0][2]) == []
    messages = seen[1][2]
    promise(
        "DUR-016.joined-once",
        _after_input(messages) == ["B: and one more thing", "D: and one more thing"],
        f"the joined inputs reach the model once each, in sequence order: {messages}",
    )
    # A's input, its call, the tool's result, then the joined inputs: no history, since no turn before A settled (the
    # aborted C, which settled while A ran, comes after A and is no part of A's history, whichever attempt asks).
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "user", "user"], messages


def test_a_running_run_joins_the_ready_prefix_across_an_aborted_turn_and_each_settles_with_it(
    topics: Settings, spawn_worker: SpawnWorker, world_db: Path, client: Client
) -> None:
    spawn_worker("a", app=MODEL_APP)
    ids = _queue_behind_a_running_a(client, world_db)
    with world(str(world_db)) as db:
        flag(db, "queued", True)
    joined = _check_joined_once(topics, client, ids, world_db)
    completed = [e for e in events_of(topics, ids["A"]) if isinstance(e, ModelResponseCompleted)]
    assert joined.response_ordinal == completed[-1].response_ordinal  # at the boundary of A's second call
    _prompts_show_b_and_d_once(world_db)


@pytest.mark.parametrize(
    ("failpoint", "joined_by"),
    [
        # The join was decided but never committed: B and D stay ready, and A's next attempt joins them.
        ("conductor.after_join_staged", "the next attempt"),
        # The join committed, the model never saw it: the next attempt gets B and D from the log and shows them once.
        ("engine.after_join_commit", "the killed attempt"),
    ],
)
def test_a_kill_around_the_join_record_joins_each_turn_once(
    topics: Settings,
    spawn_worker: SpawnWorker,
    world_db: Path,
    tmp_path: Path,
    client: Client,
    failpoint: str,
    joined_by: str,
) -> None:
    a = spawn_worker("a", app=MODEL_APP, failpoints=f"{failpoint}=1*kill")
    ids = _queue_behind_a_running_a(client, world_db)
    with world(str(world_db)) as db:
        flag(db, "queued", True)
    killed(a, tmp_path / "a.log")
    spawn_worker("b", app=MODEL_APP)
    joined = _check_joined_once(topics, client, ids, world_db)
    attempts = [e.attempt_id for e in events_of(topics, ids["A"]) if isinstance(e, AttemptStarted)]
    assert len(attempts) == 2, attempts
    expected = attempts[1] if joined_by == "the next attempt" else attempts[0]
    assert joined.attempt_id == expected, (joined, attempts)
    _prompts_show_b_and_d_once(world_db)
    assert invocations(world_db, "hold_until_flag") == 1
