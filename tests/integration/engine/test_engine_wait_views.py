"""What runs wait for, as the projection and the CLI show it (issue 16 item 7), through real workers.

A real ``settled worker`` child runs the engine test app: one run asks ``ctx.approve("refund", ...)``, another waits
for a signal with a deadline. An in-process projector keeps the live projection. While they wait, ``settled runs
list`` shows each run's wait (kind, name, since, deadline) and ``settled approvals list`` the pending approval with
its title, description, arguments and the digest a decision must name. Once approved (``--after`` the decision's
receipt: read-your-writes), the approval is no longer pending and shows who decided and why; the transcript shows the
request and the decision. Live, a fresh rebuild and the reference fold agree (``check``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest

from settled._settings import Settings
from settled.client import Client
from settled.projections import ProjectionNames
from settled.schemas import Receipt, WaitKind, WaitRequested
from tests.integration.engine._helpers import TIMEOUT_S, events_of, plan
from tests.integration.engine.conftest import ROOT, SpawnWorker
from tests.integration.engine.engine_app import APPROVER_KEY_ID, RESOLVER_PRIVATE_KEY
from tests.integration.helpers import check_clean, fresh_projection, projecting, wait_for, wait_projected

pytestmark = [pytest.mark.integration]

REFUND = {
    "approve": "refund",
    "description": "refund order o-7",
    "then": {"tool": "charge_once", "args": {"amount": 120}},
}


@pytest.fixture
def client(topics: Settings) -> Iterator[Client]:
    with Client(topics, principal="ops", default_timeout_s=TIMEOUT_S) as c:
        yield c


@pytest.fixture
def names(postgres_dsn: str) -> Iterator[ProjectionNames]:
    with fresh_projection(postgres_dsn) as n:
        yield n


def _cli(s: Settings, names: ProjectionNames, *args: str) -> list[dict[str, Any]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SETTLED_FAILPOINT")}
    env.update(
        SETTLED_NAMESPACE=s.namespace,
        SETTLED_KAFKA_BOOTSTRAP=s.kafka_bootstrap,
        SETTLED_POSTGRES_DSN=s.postgres_dsn,
        SETTLED_PROJECTION_SCHEMA=names.live,
    )
    done = subprocess.run([sys.executable, "-m", "settled.services", *args, "--json"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def _request(s: Settings, sid: str) -> WaitRequested | None:
    found = [e for e in events_of(s, sid) if isinstance(e, WaitRequested)]
    return found[0] if found else None


def _after(receipt: Receipt) -> str:
    return receipt.model_dump_json()


def test_runs_and_approvals_show_what_runs_wait_for_and_the_transcript_shows_the_decision(
    topics: Settings, spawn_worker: SpawnWorker, client: Client, names: ProjectionNames
) -> None:
    s = topics
    with projecting(s, names) as live:
        spawn_worker("w1")
        refund = client.submit("conv-wv1", plan(REFUND))
        paid = client.submit("conv-wv2", plan({"signal": "paid", "deadline_s": 3600}))
        wait_for(lambda: _request(s, refund.request_id) is not None, TIMEOUT_S, "the approval request")
        wait_for(lambda: _request(s, paid.request_id) is not None, TIMEOUT_S, "the signal request")
        approval, signal = _request(s, refund.request_id), _request(s, paid.request_id)
        assert approval is not None and approval.kind is WaitKind.APPROVAL
        assert signal is not None and signal.kind is WaitKind.SIGNAL and signal.deadline is not None
        wait_projected(s, names, TIMEOUT_S, live)

        runs = {r["submission_id"]: r for r in _cli(s, names, "runs", "list", "--incomplete")}
        assert {sid: (r["status"], r["waiting_kind"], r["waiting_name"]) for sid, r in runs.items()} == {
            refund.request_id: ("waiting", "approval", "refund"),
            paid.request_id: ("waiting", "signal", "paid"),
        }
        assert runs[refund.request_id]["waiting_deadline"] is None
        assert runs[paid.request_id]["waiting_deadline"] is not None
        assert _instant(runs[paid.request_id]["waiting_deadline"]) == signal.deadline
        assert all(r["waiting_since"] is not None for r in runs.values())

        pending = _cli(s, names, "approvals", "list")
        details = json.loads(approval.details_json or "null")
        assert [(a["conversation_id"], a["submission_id"], a["approval_id"], a["status"]) for a in pending] == [
            ("conv-wv1", refund.request_id, approval.wait_id, "pending")]  # fmt: skip
        shown = pending[0]
        assert (shown["title"], shown["description"], shown["tool"], shown["deadline"]) == (
            "refund", "refund order o-7", None, None)  # fmt: skip
        assert json.loads(shown["args_json"]) == {"description": "refund order o-7", "title": "refund"}
        assert shown["args_digest"] == details["args_digest"] and shown["requested_at"] is not None

        decided = client.approve(
            "conv-wv1", refund.request_id, approval.wait_id, args_digest=details["args_digest"],
            signing_key=RESOLVER_PRIVATE_KEY, key_id=APPROVER_KEY_ID, reason="within policy", principal="supervisor",
        )  # fmt: skip
        # Read-your-writes: once the decision's receipt is projected, its approval is no longer pending.
        assert _cli(s, names, "approvals", "list", "--after", _after(decided)) == []
        everything = _cli(s, names, "approvals", "list", "--all", "--conversation", "conv-wv1")
        assert [(a["status"], a["decided_by"], a["principal"], a["reason"], a["command_id"]) for a in everything] == [
            ("approved", APPROVER_KEY_ID, "supervisor", "within policy", decided.request_id)]  # fmt: skip
        assert client.wait(refund, TIMEOUT_S).outcome.value == "completed"

        sent = client.signal("conv-wv2", paid.request_id, "paid", {"ok": True})
        assert client.wait(paid, TIMEOUT_S).outcome.value == "completed"
        wait_projected(s, names, TIMEOUT_S, live)
        (conv,) = _cli(s, names, "conversations", "show", "conv-wv1", "--after", _after(decided))
        entries = {e["kind"]: e for e in conv["transcript"]}
        request = json.loads(entries["wait"]["content"])
        assert (request["kind"], request["name"], request["details"]["description"]) == (
            "approval", "refund", "refund order o-7")  # fmt: skip
        decision = json.loads(entries["approval"]["content"])
        assert (decision["approved"], decision["by"], decision["reason"]) == (True, APPROVER_KEY_ID, "within policy")
        assert entries["approval"]["name"] == "supervisor"
        assert _cli(s, names, "runs", "list", "--incomplete", "--after", _after(sent)) == []
        check_clean(s, names, "DUR-015.rebuild")


def _instant(text: str) -> datetime:
    return datetime.fromisoformat(text)


def test_an_approval_bound_to_a_tool_call_shows_the_tool_and_its_arguments_and_a_denial_shows_who_and_why(
    topics: Settings, spawn_worker: SpawnWorker, client: Client, names: ProjectionNames
) -> None:
    s = topics
    with projecting(s, names) as live:
        spawn_worker("w1", app="tests.integration.engine.tool_approval_app:app")
        sub = client.submit("conv-wv3", plan({"tool": "refund", "args": {"amount": 250, "order": "o-9"}}))
        sid = sub.request_id
        wait_for(lambda: _request(s, sid) is not None, TIMEOUT_S, "the tool call's approval request")
        request = _request(s, sid)
        assert request is not None
        wait_projected(s, names, TIMEOUT_S, live)
        (run,) = _cli(s, names, "runs", "list", "--incomplete", "--conversation", "conv-wv3")
        assert (run["status"], run["waiting_kind"], run["waiting_name"]) == ("waiting", "approval", "refund")
        (shown,) = _cli(s, names, "approvals", "list", "--submission", sid)
        assert (shown["approval_id"], shown["call_id"], shown["tool"], shown["title"], shown["status"]) == (
            request.wait_id, f"{sid}#0", "refund", "refund", "pending")  # fmt: skip
        assert json.loads(shown["args_json"]) == {"amount": 250, "order": "o-9"}
        assert shown["description"].startswith("Refund an amount to the customer")  # the tool's docstring
        details = json.loads(request.details_json or "null")
        assert shown["args_digest"] == details["args_digest"]
        denied = client.deny(
            "conv-wv3", sid, request.wait_id, args_digest=shown["args_digest"], signing_key=RESOLVER_PRIVATE_KEY,
            key_id=APPROVER_KEY_ID, reason="over the limit", principal="supervisor",
        )  # fmt: skip
        assert _cli(s, names, "approvals", "list", "--after", _after(denied)) == []
        (decided,) = _cli(s, names, "approvals", "list", "--all", "--submission", sid)
        assert (decided["status"], decided["decided_by"], decided["principal"], decided["reason"]) == (
            "denied", APPROVER_KEY_ID, "supervisor", "over the limit")  # fmt: skip
        assert client.wait(sub, TIMEOUT_S).outcome.value == "completed"
        wait_projected(s, names, TIMEOUT_S, live)
        assert _cli(s, names, "runs", "list", "--incomplete", "--conversation", "conv-wv3") == []
