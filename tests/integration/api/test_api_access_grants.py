"""Access granted and revoked through the API (issue 20 item 3): a grantee sees and acts; once revoked, 404 again.

A real ``settled worker`` (with the API's public key in ``App.api_keys``), a real ``settled api`` signing every record
with its key, a live projector. Alice opens a conversation whose run waits for a signal, then for an approval. Bob's
token gets 404 until alice grants him access: ``read`` lets him see the conversation (``after=`` the grant's command
id: read-your-writes) but his signal is a 403; ``act`` lets him signal the run and approve its pending approval, which
he reads, to completion; he may not grant anyone. Once alice revokes him, his reads (the approvals list included) and
commands answer exactly as for a missing target again, and the log holds only rejection decisions for his commands
after the revocation (and for his own attempt to grant himself).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

import pytest

from settled._settings import Settings
from settled.schemas import AccessGranted, AccessRevoked, CommandRejected, SignalReceived
from tests.integration.api.conftest import SpawnWorker, StartApi, TokenFactory, http
from tests.integration.api.test_api_access import SUBMIT, _same_as_missing, _waiting
from tests.integration.engine._helpers import log_events, plan
from tests.integration.helpers import wait_for

pytestmark = [pytest.mark.integration]


def test_a_granted_principal_sees_and_acts_and_once_revoked_gets_404_and_only_rejections(
    topics: Settings, spawn_worker: SpawnWorker, start_api: StartApi, token: TokenFactory, tmp_path: Path
) -> None:
    spawn_worker("w1")
    api = start_api()
    alice = http(api, token("alice", "submit", "read", "approve"))
    bob = http(api, token("bob", "submit", "read", "approve"))
    with alice, bob:
        opened = alice.post(SUBMIT.format(cid="c-g1"), json={"input": plan({"signal": "go"}, {"approve": "pay"})})
        assert opened.status_code == 201, opened.text
        sid = opened.json()["submission_id"]
        _waiting(topics, sid)
        conversation = "/v1/conversations/c-g1"
        signal = f"/v1/conversations/c-g1/runs/{sid}/signals/go"
        assert bob.get(conversation).status_code == 404
        # Bob cannot grant himself: as for a missing conversation.
        self_grant = bob.post(
            f"{conversation}/access", json={"principal": "bob", "access": "act"}, headers={"Idempotency-Key": "b-g"}
        )
        assert self_grant.status_code == 404, self_grant.text
        assert self_grant.json()["receipt"]["reason"].startswith("unknown_target"), self_grant.text
        # Read access: bob sees the conversation (read-your-writes on the grant), but may not act on it.
        read = alice.post(f"{conversation}/access", json={"principal": "bob", "access": "read"})
        assert read.status_code == 200 and read.json()["outcome"] == "applied", read.text
        assert read.json()["submission_id"] is None
        seen = bob.get(conversation, params={"after": read.json()["request_id"]})
        assert seen.status_code == 200 and seen.json()["conversation_id"] == "c-g1", seen.text
        assert bob.get(f"/v1/conversations/c-g1/submissions/{sid}").status_code == 200
        refused = bob.post(signal, json={"payload": "bob"}, headers={"Idempotency-Key": "b-read-signal"})
        assert refused.status_code == 403, refused.text
        assert refused.json()["receipt"]["reason"].startswith("unauthorized"), refused.text
        # Act access (replaces read): bob's signal is consumed and the run completes; bob may not grant others.
        act = alice.post(f"{conversation}/access", json={"principal": "bob", "access": "act"})
        assert act.status_code == 200 and act.json()["outcome"] == "applied", act.text
        listed = alice.get(f"{conversation}/access", params={"after": act.json()["request_id"]}).json()
        assert [(r["principal"], r["access"]) for r in listed] == [("alice", "opener"), ("bob", "act")], listed
        sent = bob.post(signal, json={"payload": "bob"}, headers={"Idempotency-Key": "b-signal"})
        assert sent.status_code == 200 and sent.json()["outcome"] == "applied", sent.text
        # The pending approval the run asks for next: bob reads it and approves it.
        wait_for(lambda: bool(bob.get("/v1/approvals", params={"conversation_id": "c-g1"}).json()), 60, "the approval")
        (pending,) = bob.get("/v1/approvals", params={"conversation_id": "c-g1"}).json()
        approved = bob.post(
            f"/v1/conversations/c-g1/runs/{sid}/approvals/{quote(pending['approval_id'], safe='')}/approve",
            json={"args_digest": pending["args_digest"]},
            headers={"Idempotency-Key": "b-approve"},
        )
        assert approved.status_code == 200 and approved.json()["outcome"] == "applied", approved.text
        done = bob.get(f"/v1/conversations/c-g1/submissions/{sid}/settlement", params={"wait_s": 60}).json()
        assert done["settled"] and done["settlement"]["outcome"] == "completed", done
        onward = bob.post(f"{conversation}/access", json={"principal": "carol"}, headers={"Idempotency-Key": "b-g2"})
        assert onward.status_code == 403, onward.text
        # Revoked: bob's reads and commands answer exactly as for a missing target again.
        revoked = alice.delete(f"{conversation}/access/bob")
        assert revoked.status_code == 200 and revoked.json()["outcome"] == "applied", revoked.text
        gone = bob.get(conversation, params={"after": revoked.json()["request_id"]})
        assert gone.status_code == 404, gone.text
        for path in (conversation, f"/v1/conversations/c-g1/submissions/{sid}", f"/v1/conversations/c-g1/runs/{sid}"):
            _same_as_missing(bob.get(path), bob.get(path.replace("c-g1", "c-none")), "c-g1", "c-none")
        abort = "/v1/conversations/c-g1/submissions/{s}/abort"
        hidden = bob.post(abort.format(s=sid), json={}, headers={"Idempotency-Key": "b-abort"})
        missing = bob.post(abort.format(s="no-such-run"), json={}, headers={"Idempotency-Key": "b-abort-m"})
        _same_as_missing(hidden, missing, sid, "no-such-run", "b-abort")
        everyone = {"status": "all", "conversation_id": "c-g1"}
        assert [a["approval_id"] for a in alice.get("/v1/approvals", params=everyone).json()] == [
            pending["approval_id"]
        ]
        assert bob.get("/v1/approvals", params=everyone).json() == []
        again = alice.delete(f"{conversation}/access/bob")  # nothing left to revoke: as for a missing principal
        assert again.status_code == 404, again.text
        assert [r["principal"] for r in alice.get(f"{conversation}/access").json()] == ["alice"]
        # The log: the grants and the revocation alice made; for bob's refused commands only their rejections.
        everything = log_events(topics)
        changes = [e for e in everything if isinstance(e, AccessGranted | AccessRevoked)]
        assert [(type(e).__name__, e.grantee, e.principal) for e in changes] == [
            ("AccessGranted", "bob", "alice"),
            ("AccessGranted", "bob", "alice"),
            ("AccessRevoked", "bob", "alice"),
        ], changes
        refused_ids = {"b-g", "b-read-signal", "b-g2", "b-abort"}
        naming = [e for e in everything if getattr(e, "command_id", None) in refused_ids]
        assert sorted((e.command_id, e.reason.value) for e in naming if isinstance(e, CommandRejected)) == [
            ("b-abort", "unknown_target"),
            ("b-g", "unknown_target"),
            ("b-g2", "unauthorized"),
            ("b-read-signal", "unauthorized"),
        ], naming
        assert len(naming) == 4, naming
        assert [e.command_id for e in everything if isinstance(e, SignalReceived)] == ["b-signal"]


def _cli(s: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SETTLED_NAMESPACE": s.namespace, "SETTLED_KAFKA_BOOTSTRAP": s.kafka_bootstrap}
    return subprocess.run(
        [sys.executable, "-m", "settled.services", *args], env=env, capture_output=True, text=True, timeout=90
    )


def test_settled_access_grant_and_revoke_are_trusted_inbox_writers_whose_receipts_the_cli_prints(
    topics: Settings, spawn_worker: SpawnWorker, start_api: StartApi, token: TokenFactory
) -> None:
    spawn_worker("w1")
    api = start_api()
    alice = http(api, token("alice", "submit", "read"))
    bob = http(api, token("bob", "read"))
    with alice, bob:
        opened = alice.post(SUBMIT.format(cid="c-cli"), json={"input": plan()})
        assert opened.status_code == 201, opened.text
        assert bob.get("/v1/conversations/c-cli").status_code == 404
        # Unsigned (the command line is a trusted inbox writer): applied whoever it names as the granting principal.
        granted = _cli(topics, "access", "grant", "c-cli", "bob", "--access", "read", "--principal", "ops")
        assert granted.returncode == 0, granted.stderr
        receipt = json.loads(granted.stdout)
        assert receipt["outcome"] == "applied", receipt
        assert bob.get("/v1/conversations/c-cli", params={"after": receipt["request_id"]}).status_code == 200
        revoked = _cli(topics, "access", "revoke", "c-cli", "bob")
        assert revoked.returncode == 0, revoked.stderr
        gone = json.loads(revoked.stdout)
        assert bob.get("/v1/conversations/c-cli", params={"after": gone["request_id"]}).status_code == 404
        # Nothing left to revoke: the rejection receipt on stdout, exit 1 (rejected), the reason on stderr.
        again = _cli(topics, "access", "revoke", "c-cli", "bob")
        assert again.returncode == 1, (again.stdout, again.stderr)
        assert json.loads(again.stdout)["reason"].startswith("unknown_target"), again.stdout
        bad = _cli(topics, "access", "grant", "c-cli", "bob", "--access", "write")
        assert bad.returncode == 2 and "access must be one of read, act, got 'write'" in bad.stderr, bad.stderr
