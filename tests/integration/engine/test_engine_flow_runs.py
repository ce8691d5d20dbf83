"""Flow runs spanning turns on the real broker, PostgreSQL and ``settled worker`` processes (issue 18 item 2).

The seed's refund flow (`tests/integration/engine/flow_app.py` ``refund-approval``: collect → approve → refund tool
→ reply) runs over two turns: the first parks at the collect (no amount), the second names the receipt's run id and
gives it. A worker is killed at a named failpoint in each node (one parametrized case per node, the failpoint's
first hit); another worker finishes the turn. The refund takes
effect once, every turn after the first uses the receipt's run id, and ``ProjectionReader.flow_run`` shows the node
and what the run waits for at each stop. Addressing is fail-closed: an invented run id and another conversation's
get the same ``unknown_target`` (only the rejection and its receipt in the log); ``run_id=X, kind="flow",
flow_name="other"`` resumes X and mints nothing.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from settled._settings import Settings
from settled.client import Client, SubmissionRejectedError
from settled.projections import ProjectionNames, ProjectionReader
from settled.protocol import FlowRunView
from settled.schemas import (
    ReceiptOutcome,
    SettlementOutcome,
    SubmissionAdmitted,
    SubmissionRejected,
    WaitKind,
    WaitRequested,
)
from settled.testing import WorkerProcess
from tests.integration.engine._helpers import TIMEOUT_S, effects, events_of, killed, log_events, settled
from tests.integration.engine.conftest import SpawnWorker
from tests.integration.engine.engine_app import APPROVER_KEY_ID, RESOLVER_PRIVATE_KEY
from tests.integration.helpers import fresh_projection, projecting, wait_for, wait_projected

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

APP = "tests.integration.engine.flow_app:app"
FLOW = "refund-approval"

#: Where the first worker dies, by node: (failpoint, the turn it dies in).
KILLS = {
    "collect": ("engine.run_returned", 1),  # the first turn's walk returned the question, not settled
    "approve": ("engine.after_wait_commit", 2),  # the approval's wait committed, the attempt not ended
    "refund": ("engine.tool_returned", 2),  # the refund ran, its result not recorded
    "reply": ("engine.run_returned", 2),  # the reply's model call returned, the turn not settled
}


@pytest.fixture
def client(topics: Settings) -> Iterator[Client]:
    with Client(topics, principal="ops", default_timeout_s=TIMEOUT_S) as c:
        yield c


@pytest.fixture
def names(postgres_dsn: str) -> Iterator[ProjectionNames]:
    with fresh_projection(postgres_dsn) as n:
        yield n


def _settled_reply(s: Settings, submission_id: str) -> Any:
    wait_for(lambda: settled(s, submission_id) is not None, TIMEOUT_S, f"turn {submission_id} to settle")
    result = settled(s, submission_id)
    assert result is not None and result.outcome is SettlementOutcome.COMPLETED, result
    assert result.reply_json is not None
    return json.loads(result.reply_json)


def _approval(s: Settings, submission_id: str) -> WaitRequested:
    def found() -> WaitRequested | None:
        asked = [e for e in events_of(s, submission_id) if isinstance(e, WaitRequested)]
        return asked[0] if asked else None

    wait_for(lambda: found() is not None, TIMEOUT_S, "the refund's approval request")
    request = found()
    assert request is not None and request.kind is WaitKind.APPROVAL
    return request


def _view(s: Settings, names: ProjectionNames, live: Any, run_id: str, conversation_id: str) -> FlowRunView:
    wait_projected(s, names, TIMEOUT_S, live)
    with ProjectionReader(s.postgres_dsn, names) as reader:
        view = reader.flow_run(run_id, conversation_id=conversation_id)
    # Client.get_run reads the same view (the seed's getRun).
    with Client(s, principal="ops", default_timeout_s=TIMEOUT_S, projection_schema=names.base) as c:
        assert c.get_run(run_id, conversation_id=conversation_id) == view
    assert view is not None
    return view


@pytest.mark.parametrize("node", list(KILLS))
def test_refund_flow_run_killed_in_each_node_refunds_once_and_every_turn_uses_the_receipts_run_id(
    topics: Settings,
    spawn_worker: SpawnWorker,
    world_db: Path,
    tmp_path: Path,
    client: Client,
    names: ProjectionNames,
    node: str,
) -> None:
    s = topics
    conv = f"flow-run-{node}"
    point, turn = KILLS[node]
    with projecting(s, names) as live:
        worker: WorkerProcess = spawn_worker("a", app=APP, failpoints=f"{point}=1*kill" if turn == 1 else "")
        first = client.submit(conv, "I want my money back", kind="flow", flow_name=FLOW)
        assert first.outcome is ReceiptOutcome.ADMITTED and first.run_id is not None, first
        run_id = first.run_id
        if turn == 1:
            killed(worker, tmp_path / "a.log")
            worker = spawn_worker("b", app=APP)
        asked = _settled_reply(s, first.request_id)
        assert (asked["status"], asked["node"], asked["missing"], asked["run_id"]) == (
            "waiting", "collect_amount", ["amount"], run_id)  # fmt: skip
        view = _view(s, names, live, run_id, conv)
        assert (view.flow, view.status, view.node) == (FLOW, "waiting", "collect_amount")
        assert view.waiting_for == {
            "kind": "input",
            "node": "collect_amount",
            "ask": "What amount should the refund be for?",
            "missing": ["amount"],
        }

        if turn == 2:
            assert worker.stop() == 0  # a graceful stop; the next worker dies at the failpoint
            worker = spawn_worker("a2", app=APP, failpoints=f"{point}=1*kill")
        second = client.submit(conv, {"amount": 30}, run_id=run_id)
        assert second.outcome is ReceiptOutcome.ADMITTED and second.run_id == run_id, second
        if node == "approve":
            killed(worker, tmp_path / "a2.log")
            worker = spawn_worker("b", app=APP)
        request = _approval(s, second.request_id)
        view = _view(s, names, live, run_id, conv)
        assert (view.status, view.node) == ("waiting", "issue_refund"), view
        assert view.waiting_for is not None and view.waiting_for["kind"] == "approval"
        assert view.waiting_for["wait_id"] == request.wait_id
        assert effects(world_db, "charge_idem") == 0, "no refund before the approval"
        client.approve(
            conv,
            second.request_id,
            request.wait_id,
            args_digest=json.loads(request.details_json or "null")["args_digest"],
            signing_key=RESOLVER_PRIVATE_KEY,
            key_id=APPROVER_KEY_ID,
        )
        if node in ("refund", "reply"):
            killed(worker, tmp_path / "a2.log")
            spawn_worker("b", app=APP)
        done = _settled_reply(s, second.request_id)
        assert (done["status"], done["outcome"], done["node"], done["run_id"]) == (
            "completed", "refunded", "confirmed", run_id)  # fmt: skip
        assert done["state"] == {"amount": 30, "receipt": {"charged": 30, "tool": "charge_idem"}}
        assert effects(world_db, "charge_idem") == 1, "the refund took effect once"
        view = _view(s, names, live, run_id, conv)
        assert (view.status, view.node, view.outcome, view.waiting_for) == ("completed", "confirmed", "refunded", None)
        assert view.submission_ids == (first.request_id, second.request_id)


def test_addressing_is_fail_closed_and_a_run_id_outranks_kind_and_mints_nothing(
    topics: Settings, spawn_worker: SpawnWorker, client: Client
) -> None:
    s = topics
    spawn_worker("a", app=APP)
    mine = client.submit("flow-mine", "hello", kind="flow", flow_name=FLOW)
    theirs = client.submit("flow-theirs", "hello", kind="flow", flow_name=FLOW)
    assert mine.run_id is not None and theirs.run_id is not None and mine.run_id != theirs.run_id
    _settled_reply(s, mine.request_id)
    rejected: list[tuple[str, str, str | None]] = []
    for run_id in ("fr-invented", theirs.run_id):
        with pytest.raises(SubmissionRejectedError) as refused:
            client.submit("flow-mine", {"amount": 5}, run_id=run_id)
        error = refused.value
        assert (error.reason_code, error.field) == ("unknown_target", "run_id")
        assert error.detail == f"conversation 'flow-mine' holds no flow run {run_id!r}"
        rejected.append((error.receipt.request_id, error.reason_code, error.receipt.run_id))
    resumed = client.submit(
        "flow-mine", {"note": "still no amount"}, run_id=mine.run_id, kind="flow", flow_name="other"
    )
    assert resumed.outcome is ReceiptOutcome.ADMITTED and resumed.run_id == mine.run_id
    # The resumed turn's settlement is the barrier: every record decided before it is in the log. It walked run
    # ``mine`` of flow refund-approval (not "other") and asks again.
    again = _settled_reply(s, resumed.request_id)
    assert (again["flow"], again["run_id"], again["status"], again["node"]) == (
        FLOW, mine.run_id, "waiting", "collect_amount")  # fmt: skip
    for submission_id, _, run_id in rejected:
        assert run_id is None
        assert [type(e) for e in events_of(s, submission_id)] == [SubmissionRejected], "only the rejection"
        assert settled(s, submission_id) is None
    minted = {e.submission_id: e.flow_run_id for e in log_events(s) if isinstance(e, SubmissionAdmitted)}
    assert minted == {
        mine.request_id: mine.run_id,
        theirs.request_id: theirs.run_id,
        resumed.request_id: mine.run_id,
    }, "the resumed turn minted nothing"
