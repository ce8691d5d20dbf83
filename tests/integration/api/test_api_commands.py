"""Commands over HTTP (issue 20 item 1): signals, approvals, aborts and resolutions answered with their receipt.

A real ``settled worker`` child runs the engine test app, a real ``settled api`` child signs approvals and
resolutions with the key the workers know, and a live projector serves the reads.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from typer.testing import CliRunner

from settled._settings import Settings
from settled.api import TokenStore
from settled.projections._schema import ProjectionNames
from settled.schemas import CommandRejected, WaitKind, WaitRequested, WaitResolved
from settled.services.cli import app as cli_app
from tests.integration.api.conftest import SpawnWorker, StartApi, TokenFactory, http
from tests.integration.engine._helpers import events_of, invocations, plan
from tests.integration.engine._helpers import settled as settled_record
from tests.integration.engine.engine_app import APPROVER_KEY_ID
from tests.integration.helpers import wait_for

pytestmark = [pytest.mark.integration]

SUBMIT = "/v1/conversations/{cid}/submissions"


def _wait_request(s: Settings, sid: str, kind: WaitKind) -> WaitRequested:
    def found() -> list[WaitRequested]:
        return [e for e in events_of(s, sid) if isinstance(e, WaitRequested) and e.kind is kind]

    wait_for(lambda: bool(found()), 60, f"the run's {kind.value} wait request")
    [request] = found()
    return request


def _pending(client: httpx.Client, cid: str, ready: Callable[[list[dict[str, Any]]], bool]) -> list[dict[str, Any]]:
    """Poll ``GET /v1/approvals`` for a conversation until ``ready(rows)`` (the projection catches up)."""
    deadline = time.monotonic() + 60
    while True:
        rows = client.get("/v1/approvals", params={"conversation_id": cid}).json()
        if ready(rows) or time.monotonic() > deadline:
            return list(rows)
        time.sleep(0.1)


def test_a_signal_and_an_approval_over_http_are_consumed_once(
    topics: Settings, spawn_worker: SpawnWorker, start_api: StartApi, token: TokenFactory, tmp_path: Path
) -> None:
    spawn_worker("w1")
    api = start_api()
    refund = {"approve": "refund", "description": "order o-7", "then": {"tool": "charge_once", "args": {"amount": 5}}}
    # Two tokens of alice's (the conversation's opener): one to submit and read, one to approve and signal.
    with http(api, token("alice", "submit", "read")) as alice, http(api, token("alice", "approve")) as approver:
        sub = alice.post(SUBMIT.format(cid="c-cmd"), json={"input": plan({"signal": "go"}, refund)}).json()
        sid = sub["submission_id"]
        _wait_request(topics, sid, WaitKind.SIGNAL)
        path = f"/v1/conversations/c-cmd/runs/{sid}/signals/go"
        sent = approver.post(path, json={"payload": {"cents": 250}}, headers={"Idempotency-Key": "sig-1"})
        assert sent.status_code == 200 and sent.json()["outcome"] == "applied", sent.text
        again = approver.post(path, json={"payload": {"cents": 250}}, headers={"Idempotency-Key": "sig-1"})
        assert again.status_code == 200 and again.json()["outcome"] == "duplicate", again.text
        # A reader cannot approve: 403 naming the scope.
        request = _wait_request(topics, sid, WaitKind.APPROVAL)
        digest = json.loads(request.details_json or "null")["args_digest"]
        # The pending approval is listed with what it asks (read scope), once the request is projected.
        listed = _pending(alice, "c-cmd", lambda rows: len(rows) == 1)
        assert listed[0]["approval_id"] == request.wait_id and listed[0]["title"] == "refund", listed
        assert listed[0]["args_digest"] == digest and listed[0]["status"] == "pending", listed
        approve = f"/v1/conversations/c-cmd/runs/{sid}/approvals/{quote(request.wait_id, safe='')}/approve"
        refused = alice.post(approve, json={"args_digest": digest}, headers={"Idempotency-Key": "ap-x"})
        assert refused.status_code == 403 and refused.json()["value"] == "approve", refused.text
        decision = {"args_digest": digest, "reason": "fine"}
        ok = approver.post(approve, json=decision, headers={"Idempotency-Key": "ap-1"})
        assert ok.status_code == 200 and ok.json()["outcome"] == "applied", ok.text
        dup = approver.post(approve, json=decision, headers={"Idempotency-Key": "ap-1"})
        assert dup.status_code == 200 and dup.json()["outcome"] == "duplicate", dup.text
        after = alice.get("/v1/approvals", params={"conversation_id": "c-cmd", "after": ok.json()["request_id"]})
        assert after.status_code == 200 and after.json() == [], after.text  # decided: no longer pending
        done = alice.get(f"/v1/conversations/c-cmd/submissions/{sid}/settlement", params={"wait_s": 60}).json()
        assert done["settled"] and done["settlement"]["outcome"] == "completed", done
    results = json.loads(done["settlement"]["reply_json"])["results"]
    assert results[0] == {"signal": {"cents": 250}}
    assert results[1]["approved"] is True and results[1]["by"] == APPROVER_KEY_ID
    assert invocations(tmp_path / "world.sqlite", "charge_once") == 1
    resolved = [e for e in events_of(topics, sid) if isinstance(e, WaitResolved)]
    assert sorted(e.source_id or "" for e in resolved) == ["ap-1", "sig-1"]  # each delivered once
    delivered = json.loads(resolved[-1].payload_json or "null")
    assert delivered["principal"] == "alice"  # the token's principal, signed by the API's key


def test_an_abort_racing_the_final_append_returns_the_winner(
    topics: Settings, spawn_worker: SpawnWorker, start_api: StartApi, token: TokenFactory
) -> None:
    spawn_worker("w1")
    api = start_api()
    with http(api, token("alice", "submit", "read")) as h:
        for i, sleep_s in enumerate((0.0, 0.05, 0.3)):
            cid = f"c-race-{i}"
            sub = h.post(SUBMIT.format(cid=cid), json={"input": plan({"sleep_s": sleep_s})}).json()
            answer = h.post(f"/v1/conversations/{cid}/submissions/{sub['submission_id']}/abort", json={"reason": "r"})
            record = h.get(  # after=: the submission may not be projected yet when the abort's answer comes
                f"/v1/conversations/{cid}/submissions/{sub['submission_id']}/settlement",
                params={"wait_s": 60, "after": sub["submission_id"]},
            ).json()
            assert record["settled"], record
            outcome = record["settlement"]["outcome"]
            if answer.status_code == 200:
                assert answer.json()["outcome"] == "applied" and outcome == "aborted", (answer.text, record)
            else:
                assert answer.status_code == 409, answer.text
                problem = answer.json()
                assert problem["type"] == "urn:settled:problem:already_terminal", problem
                assert outcome in problem["detail"] and outcome != "aborted", (problem, record)


def test_a_command_for_a_missing_run_is_404_and_the_log_holds_only_its_rejection(
    topics: Settings, spawn_worker: SpawnWorker, start_api: StartApi, token: TokenFactory
) -> None:
    spawn_worker("w1")
    api = start_api()
    with http(api, token("ops", "admin")) as h:
        sub = h.post(SUBMIT.format(cid="c-miss"), json={"input": plan({"now": True})}).json()
        answer = h.post("/v1/conversations/c-miss/runs/no-such-run/signals/go", json={"payload": 1})
        assert answer.status_code == 404, answer.text
        assert answer.json()["receipt"]["reason"].startswith("unknown_target"), answer.text
        denied = h.post(
            "/v1/conversations/c-miss/runs/no-such-run/approvals/no-such-run%23w0/deny",
            json={"args_digest": "0" * 64, "reason": "no"},
            headers={"Idempotency-Key": "deny-1"},
        )
        assert denied.status_code == 404, denied.text
        assert denied.json()["receipt"]["reason"].startswith("unknown_target"), denied.text
        h.get(f"/v1/conversations/c-miss/submissions/{sub['submission_id']}/settlement", params={"wait_s": 60})
    events = events_of(topics, "no-such-run")
    assert [type(e) for e in events] == [CommandRejected, CommandRejected], events
    assert settled_record(topics, sub["submission_id"]) is not None


def test_scopes_and_tokens(
    topics: Settings, names: ProjectionNames, start_api: StartApi, token: TokenFactory, tokens: TokenStore
) -> None:
    api = start_api()
    # settled tokens create|list|revoke: the token answers until it is revoked, then 401.
    env = {"SETTLED_NAMESPACE": topics.namespace, "SETTLED_POSTGRES_DSN": topics.postgres_dsn}
    cli = CliRunner()
    made = cli.invoke(cli_app, ["tokens", "create", "carol", "--scope", "read", "--schema", names.base], env=env)
    assert made.exit_code == 0, made.output
    created = json.loads(made.stdout)
    assert created["principal"] == "carol" and created["scopes"] == ["read"]
    listed = cli.invoke(cli_app, ["tokens", "list", "--schema", names.base], env=env)
    rows = [json.loads(line) for line in listed.stdout.splitlines()]
    assert [r["token_id"] for r in rows if r["principal"] == "carol"] == [created["token_id"]]
    assert all("token" not in r for r in rows)  # never the secret
    assert tokens.authenticate(created["token"]) is not None
    with http(api, created["token"]) as carol:
        assert carol.get("/v1/runs").status_code == 200
        revoked = cli.invoke(cli_app, ["tokens", "revoke", created["token_id"], "--schema", names.base], env=env)
        assert revoked.exit_code == 0, revoked.output
        assert carol.get("/v1/runs").status_code == 401
    unknown = cli.invoke(cli_app, ["tokens", "revoke", "no-such-token", "--schema", names.base], env=env)
    assert unknown.exit_code == 1 and "no-such-token" in unknown.stderr
    bad = cli.invoke(cli_app, ["tokens", "create", "dave", "--scope", "root", "--schema", names.base], env=env)
    assert bad.exit_code == 2 and "'root'" in bad.stderr
    with http(api, token("reader", "read")) as reader:
        denied = reader.post(
            "/v1/conversations/c/submissions/s/unknowns/call-1/resolve", json={"kind": "safe_to_retry"}
        )
        assert denied.status_code == 403, denied.text
        assert denied.json()["value"] == "resolve" and "insufficient_scope" in denied.headers["www-authenticate"]
        no_submit = reader.post(SUBMIT.format(cid="c"), json={"input": 1})
        assert no_submit.status_code == 403 and no_submit.json()["value"] == "submit"
    with http(api, "stl_wrong") as stranger:
        assert stranger.get("/v1/runs").status_code == 401
    anonymous = http(api, "x")
    anonymous.headers.pop("Authorization")
    with anonymous:
        answer = anonymous.get("/v1/runs")
        assert answer.status_code == 401 and answer.json()["field"] == "Authorization", answer.text
