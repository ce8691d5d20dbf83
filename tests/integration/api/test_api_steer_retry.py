"""Steering a run and retrying a dead letter over HTTP (issues 22 items 3-4 through issue 20's API).

A real ``settled worker`` child runs the engine test app (``max_attempts`` 3, short backoffs), a real ``settled api``
child signs every record and the retries with the key the workers know, and a live projector serves the reads.
Each command answers its receipt: 200 ``applied`` or ``duplicate`` (the ``Idempotency-Key`` is the command id), a
409 problem holding the rejection receipt, 404 for a run or conversation the caller may not see, 403 for a token
without the route's scope.
"""

from __future__ import annotations

import pytest

from settled._settings import Settings
from settled.schemas import SteeringReceived, WaitKind
from tests.integration.api.conftest import SpawnWorker, StartApi, TokenFactory, http
from tests.integration.api.test_api_commands import _wait_request
from tests.integration.engine._helpers import events_of, plan

pytestmark = [pytest.mark.integration]

SUBMIT = "/v1/conversations/{cid}/submissions"


def test_steering_a_run_over_http_is_applied_once_and_only_by_who_may_act_on_it(
    topics: Settings, spawn_worker: SpawnWorker, start_api: StartApi, token: TokenFactory
) -> None:
    spawn_worker("w1")
    api = start_api()
    with (
        http(api, token("alice", "submit", "read")) as alice,
        http(api, token("alice", "approve")) as approver,
        http(api, token("bob", "submit", "read")) as bob,
        http(api, token("reader", "read")) as reader,
    ):
        sub = alice.post(SUBMIT.format(cid="c-steer"), json={"input": plan({"signal": "go"})}).json()
        sid = sub["submission_id"]
        _wait_request(topics, sid, WaitKind.SIGNAL)  # the run is active, waiting for its signal
        path = f"/v1/conversations/c-steer/runs/{sid}/steer"
        sent = alice.post(path, json={"text": "keep it short"}, headers={"Idempotency-Key": "st-1"})
        assert sent.status_code == 200, sent.text
        answer = sent.json()
        assert (answer["outcome"], answer["request_kind"]) == ("applied", "command"), answer
        assert (answer["submission_id"], answer["idempotency_key"]) == (sid, "st-1"), answer
        again = alice.post(path, json={"text": "keep it short"}, headers={"Idempotency-Key": "st-1"})
        assert again.status_code == 200 and again.json()["outcome"] == "duplicate", again.text
        # Another principal's run answers exactly like a missing one; so does a run nobody submitted.
        hidden = bob.post(path, json={"text": "hijack"}, headers={"Idempotency-Key": "st-bob"})
        assert hidden.status_code == 404, hidden.text
        assert hidden.json()["receipt"]["reason"].startswith("unknown_target"), hidden.text
        missing = alice.post("/v1/conversations/c-steer/runs/no-such-run/steer", json={"text": "x"})
        assert missing.status_code == 404 and missing.json()["receipt"]["reason"].startswith("unknown_target")
        no_scope = reader.post(path, json={"text": "x"})
        assert no_scope.status_code == 403 and no_scope.json()["value"] == "submit", no_scope.text
        empty = alice.post(path, json={"text": ""})
        assert empty.status_code == 422 and empty.json()["field"] == "text", empty.text
        no_text = alice.post(path, json={})
        assert no_text.status_code == 422 and no_text.json()["field"] == "text", no_text.text
        go = approver.post(f"/v1/conversations/c-steer/runs/{sid}/signals/go", json={"payload": 1})
        assert go.status_code == 200, go.text
        done = alice.get(f"/v1/conversations/c-steer/submissions/{sid}/settlement", params={"wait_s": 60}).json()
        assert done["settled"], done
        late = alice.post(path, json={"text": "too late"}, headers={"Idempotency-Key": "st-late"})
        assert late.status_code == 409, late.text
        problem = late.json()
        assert problem["type"] == "urn:settled:problem:already_terminal", problem
        assert problem["receipt"]["outcome"] == "rejected", problem
    steering = [e for e in events_of(topics, sid) if isinstance(e, SteeringReceived)]
    # One message (a duplicate writes its record again with its own input_ref; it changes nothing), the token's.
    assert {(e.command_id, e.text, e.principal) for e in steering} == {("st-1", "keep it short", "alice")}


def test_a_dead_letter_is_retried_over_http_once_as_a_new_submission(
    topics: Settings, spawn_worker: SpawnWorker, start_api: StartApi, token: TokenFactory
) -> None:
    spawn_worker("w1")
    api = start_api()
    with (
        http(api, token("alice", "submit", "read")) as alice,
        http(api, token("alice", "resolve")) as resolver,
        http(api, token("bob", "resolve", "read")) as bob,
    ):
        # The agent raises on an unknown plan op each attempt: after 3 charged attempts a dead letter.
        dead = alice.post(SUBMIT.format(cid="c-dead"), json={"input": plan({"no such op": True})}).json()
        ok = alice.post(SUBMIT.format(cid="c-dead"), json={"input": plan({"now": True})}).json()
        dead_sid = dead["submission_id"]
        for sid in (dead_sid, ok["submission_id"]):
            done = alice.get(f"/v1/conversations/c-dead/submissions/{sid}/settlement", params={"wait_s": 60}).json()
            assert done["settled"], done
        assert done["settlement"]["outcome"] == "completed", done
        path = f"/v1/conversations/c-dead/submissions/{dead_sid}/retry"
        refused = alice.post(path, json={})
        assert refused.status_code == 403 and refused.json()["value"] == "resolve", refused.text
        hidden = bob.post(path, json={}, headers={"Idempotency-Key": "rt-bob"})
        assert hidden.status_code == 404, hidden.text  # bob may not see alice's conversation
        assert hidden.json()["receipt"]["reason"].startswith("unknown_target"), hidden.text
        sent = resolver.post(path, json={"new_submission_id": "c-dead-retry"}, headers={"Idempotency-Key": "rt-1"})
        assert sent.status_code == 200, sent.text
        answer = sent.json()
        assert answer["outcome"] == "applied" and answer["idempotency_key"] == "rt-1", answer
        assert (answer["submission_id"], answer["submission_seq"]) == ("c-dead-retry", 3), answer
        again = resolver.post(path, json={"new_submission_id": "c-dead-retry"}, headers={"Idempotency-Key": "rt-1"})
        assert again.status_code == 200 and again.json()["outcome"] == "duplicate", again.text
        second = resolver.post(path, json={}, headers={"Idempotency-Key": "rt-2"})
        assert second.status_code == 200, second.text  # a second retry points at the first
        assert (second.json()["outcome"], second.json()["submission_id"]) == ("duplicate", "c-dead-retry")
        completed = resolver.post(f"/v1/conversations/c-dead/submissions/{ok['submission_id']}/retry", json={})
        assert completed.status_code == 409, completed.text
        assert completed.json()["receipt"]["reason"].startswith("not_dead_lettered"), completed.text
        # after= the command's id (the retry's receipt is the command's): the projection holds it with the admission.
        row = alice.get("/v1/conversations/c-dead/submissions/c-dead-retry", params={"after": "rt-1"}).json()
        assert (row.get("retry_of"), row.get("submission_seq")) == (dead_sid, 3), row
