"""Conversation access through the API (issue 20 items 2-3): another principal's token sees nothing of a conversation.

A real ``settled worker`` (with the API's public key in ``App.api_keys``), a real ``settled api`` signing every record
with its key, a live projector. Alice opens two conversations: one whose run waits for a signal and then an approval,
one whose run is stopped on an Unknown call. Bob's token (every scope but admin) gets, on reads and commands alike,
exactly the answer a missing target gets (404), and the log read back holds only rejection decisions for his
commands; alice's own commands act, and an admin token reads everything.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from settled._settings import Settings
from settled.schemas import (
    CommandRejected,
    LogEvent,
    RecoveryDecisionKind,
    SubmissionRejected,
    ToolCallUnknown,
    WaitKind,
    WaitRequested,
)
from tests.integration.api.conftest import SpawnWorker, StartApi, TokenFactory, http
from tests.integration.engine._helpers import decisions, events_of, log_events, plan
from tests.integration.engine.engine_app import flag, world
from tests.integration.helpers import wait_for

pytestmark = [pytest.mark.integration]

SUBMIT = "/v1/conversations/{cid}/submissions"


def _same_as_missing(
    hidden: httpx.Response, missing: httpx.Response, hidden_id: str, missing_id: str, key: str = ""
) -> None:
    assert hidden.status_code == missing.status_code == 404, (hidden.text, missing.text)
    a, b = hidden.json(), missing.json()
    for body in (a, b):
        body.pop("instance")
        body.get("receipt", {}).pop("request_id", None)
        body.get("receipt", {}).pop("decided_at", None)
        body.pop("command_id", None)
    if key:  # each command has its own id, named in the detail
        a["detail"] = a["detail"].replace(key, "#")
        b["detail"] = b["detail"].replace(key + "-m", "#")
    assert str(a).replace(hidden_id, "?") == str(b).replace(missing_id, "?"), (a, b)


def _waiting(s: Settings, sid: str) -> WaitRequested:
    def found() -> list[LogEvent]:
        return [e for e in events_of(s, sid) if isinstance(e, WaitRequested) and e.kind is WaitKind.SIGNAL]

    wait_for(lambda: bool(found()), 60, "the run's signal wait")
    (request,) = found()
    assert isinstance(request, WaitRequested)
    return request


def test_another_principals_token_gets_404_on_reads_and_commands_and_the_log_holds_only_rejections(
    topics: Settings, spawn_worker: SpawnWorker, start_api: StartApi, token: TokenFactory, tmp_path: Path
) -> None:
    with world(str(tmp_path / "world.sqlite")) as db:
        flag(db, "server_down", True)  # remote_once gets no answer: its call goes Unknown
    spawn_worker("w1")
    api = start_api()
    alice = http(api, token("alice", "submit", "read", "approve"))
    bob = http(api, token("bob", "submit", "read", "approve", "resolve"))
    admin = http(api, token("ops", "admin"))
    with alice, bob, admin:
        waits = alice.post(SUBMIT.format(cid="c-a1"), json={"input": plan({"signal": "go"})}).json()
        stuck = alice.post(SUBMIT.format(cid="c-a2"), json={"input": plan({"tool": "remote_once"})}).json()
        sid, stuck_sid = waits["submission_id"], stuck["submission_id"]
        _waiting(topics, sid)
        wait_for(lambda: bool(decisions(topics, stuck_sid)), 60, "the Unknown decision")
        assert decisions(topics, stuck_sid) == [RecoveryDecisionKind.UNKNOWN]
        (unknown,) = [e for e in events_of(topics, stuck_sid) if isinstance(e, ToolCallUnknown)]
        # Alice sees her Unknown; bob sees none there, as for a conversation without one.
        assert [u["call_id"] for u in alice.get("/v1/conversations/c-a2/unknowns").json()] == [unknown.call_id]
        assert bob.get("/v1/conversations/c-a2/unknowns").json() == []
        # Reads: exactly like a missing target.
        reads = [
            ("/v1/conversations/{c}", "c-a1", "c-none"),
            ("/v1/conversations/{c}/submissions/" + sid, "c-a1", "c-none"),
            ("/v1/conversations/{c}/submissions/" + sid + "/settlement", "c-a1", "c-none"),
            ("/v1/conversations/{c}/runs/" + sid, "c-a1", "c-none"),
        ]
        for path, cid, missing_cid in reads:
            _same_as_missing(bob.get(path.format(c=cid)), bob.get(path.format(c=missing_cid)), cid, missing_cid)
        assert sid not in {r["submission_id"] for r in bob.get("/v1/runs").json()}
        assert sid in {r["submission_id"] for r in alice.get("/v1/runs").json()}
        # Commands: the same answers as for a run that does not exist.
        commands: list[tuple[str, dict[str, Any], str]] = [
            ("/v1/conversations/c-a1/submissions/{s}/abort", {"reason": "mine now"}, "b-abort"),
            ("/v1/conversations/c-a1/runs/{s}/signals/go", {"payload": "bob"}, "b-signal"),
            (
                "/v1/conversations/c-a1/runs/{s}/approvals/{s}%23w0/approve",
                {"args_digest": "0" * 64},
                "b-approve",
            ),
        ]
        for path, body, key in commands:
            hidden = bob.post(path.format(s=sid), json=body, headers={"Idempotency-Key": key})
            missing = bob.post(path.format(s="no-such-run"), json=body, headers={"Idempotency-Key": key + "-m"})
            _same_as_missing(hidden, missing, sid, "no-such-run", key)
        call = quote(unknown.call_id, safe="")
        resolve = f"/v1/conversations/c-a2/submissions/{stuck_sid}/unknowns/{call}/resolve"
        hidden = bob.post(resolve, json={"kind": "safe_to_retry"}, headers={"Idempotency-Key": "b-resolve"})
        assert hidden.status_code == 404, hidden.text
        assert hidden.json()["receipt"]["reason"].startswith("unknown_target"), hidden.text
        taken = bob.post(SUBMIT.format(cid="c-a1"), json={"input": "hi"}, headers={"Idempotency-Key": "b-sub"})
        assert taken.status_code == 404 and taken.json()["field"] == "conversation_id", taken.text
        # The log holds only rejection decisions for bob's records.
        ids = {"b-abort", "b-signal", "b-approve", "b-resolve"}
        everything = log_events(topics)
        naming = [
            e for e in everything if getattr(e, "command_id", None) in ids or getattr(e, "source_id", None) in ids
        ]
        assert [type(e) for e in naming] == [CommandRejected] * 4, naming
        assert all(isinstance(e, CommandRejected) and e.reason.value == "unknown_target" for e in naming), naming
        keyed = [e for e in everything if getattr(e, "idempotency_key", None) == "b-sub"]
        assert [type(e) for e in keyed] == [SubmissionRejected], keyed
        # Alice's own signal acts; an admin token reads her conversation.
        sent = alice.post(f"/v1/conversations/c-a1/runs/{sid}/signals/go", json={"payload": "alice"})
        assert sent.status_code == 200 and sent.json()["outcome"] == "applied", sent.text
        done = alice.get(f"/v1/conversations/c-a1/submissions/{sid}/settlement", params={"wait_s": 60}).json()
        assert done["settled"] and done["settlement"]["outcome"] == "completed", done
        assert admin.get("/v1/conversations/c-a1").status_code == 200
        # An admin token resolves alice's Unknown (signed with the API's resolver key): the run goes on.
        resolved = admin.post(resolve, json={"kind": "call_outcome", "result": {"by": "ops"}})
        assert resolved.status_code == 200 and resolved.json()["outcome"] == "applied", resolved.text
        after = admin.get(f"/v1/conversations/c-a2/submissions/{stuck_sid}/settlement", params={"wait_s": 60}).json()
        assert after["settled"] and after["settlement"]["outcome"] == "completed", after
