"""Flow turns on the real broker with real ``settled worker`` processes (issue 18 item 1).

The refund flow of `tests/integration/engine/flow_app.py` (collect → action → reply) is killed at a named failpoint
in each node: after the collect's extraction response and the refund's prepared record commit, after the refund
returned (its result not recorded), and after the reply's model call returned (the run's reply not settled). A
second worker walks the graph again: the refund's effect happens once, every model response is recorded once, and
the turn settles completed with the flow's outcome. A turn whose collect lacks the amount settles with the question
and runs no tool.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from settled._settings import Settings
from settled.client import Client
from settled.protocol import flow_input
from settled.schemas import ModelResponseCompleted, ReceiptOutcome, SettlementOutcome, ToolCallSettled
from tests.integration.engine._helpers import TIMEOUT_S, effects, events_of, invocations, killed, settled, settlements
from tests.integration.engine.conftest import SpawnWorker
from tests.integration.helpers import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

APP = "tests.integration.engine.flow_app:app"

#: Where the first worker dies, by node: (failpoint, invocations of the refund tool by the end).
KILLS = {
    "collect": ("engine.after_response_commit", 1),  # the extraction's response committed with the refund's prepare
    "action": ("engine.tool_returned", 2),  # the refund ran, its result not recorded: run again under its key
    "reply": ("engine.run_returned", 1),  # the reply's model call returned; the turn not settled
}


@pytest.fixture
def client(topics: Settings) -> Iterator[Client]:
    with Client(topics, principal="ops", default_timeout_s=TIMEOUT_S) as c:
        yield c


@pytest.mark.parametrize("node", list(KILLS))
def test_refund_flow_killed_in_each_node_refunds_once_and_completes(
    topics: Settings, spawn_worker: SpawnWorker, world_db: Path, tmp_path: Path, client: Client, node: str
) -> None:
    s = topics
    point, calls = KILLS[node]
    a = spawn_worker("a", app=APP, failpoints=f"{point}=1*kill")
    receipt = client.submit(f"flow-{node}", flow_input("refund", "Please refund thirty euros"))
    assert receipt.outcome is ReceiptOutcome.ADMITTED, receipt
    killed(a, tmp_path / "a.log")
    spawn_worker("b", app=APP)
    wait_for(lambda: settled(s, receipt.request_id) is not None, TIMEOUT_S, "the flow turn to settle")
    result = settled(s, receipt.request_id)
    assert result is not None and result.outcome is SettlementOutcome.COMPLETED, result
    assert result.reply_json is not None
    assert receipt.run_id is not None
    assert json.loads(result.reply_json) == {
        "flow": "refund",
        "run_id": receipt.run_id,
        "status": "completed",
        "outcome": "refunded",
        "node": "confirmed",
        "messages": ["Your refund is on its way."],
        "state": {"amount": 30, "receipt": {"charged": 30, "tool": "charge_idem"}},
    }
    assert effects(world_db, "charge_idem") == 1, "the refund took effect once"
    assert invocations(world_db, "charge_idem") == calls
    log = events_of(s, receipt.request_id)
    assert len([e for e in log if isinstance(e, ToolCallSettled)]) == 1
    assert [e.text for e in log if isinstance(e, ModelResponseCompleted)] == [
        '{"amount": 30}',
        "Your refund is on its way.",
    ], "each model call recorded once"
    assert [r.submission_id for r in settlements(s)] == [receipt.request_id]


def test_a_collect_lacking_its_field_settles_with_the_question_and_runs_no_tool(
    topics: Settings, spawn_worker: SpawnWorker, world_db: Path, client: Client
) -> None:
    s = topics
    spawn_worker("a", app=APP)
    receipt = client.submit("flow-ask", flow_input("refund", "I want my money back"))
    wait_for(lambda: settled(s, receipt.request_id) is not None, TIMEOUT_S, "the flow turn to settle")
    result = settled(s, receipt.request_id)
    assert result is not None and result.outcome is SettlementOutcome.COMPLETED, result
    assert result.reply_json is not None
    assert json.loads(result.reply_json) == {
        "flow": "refund",
        "run_id": receipt.run_id,
        "status": "waiting",
        "node": "collect_amount",
        "ask": "What amount should the refund be for?",
        "missing": ["amount"],
        "invalid": {},
        "messages": [],
        "state": {},
    }
    assert invocations(world_db, "charge_idem") == 0
    assert [e.text for e in events_of(s, receipt.request_id) if isinstance(e, ModelResponseCompleted)] == ["{}"]
