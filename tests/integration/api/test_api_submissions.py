"""Submissions over HTTP (issue 20 item 1; scenario 18 of the scenarios list through the API).

A real ``settled worker`` child, a real ``settled api`` child and a live projector; the broker and PostgreSQL are the
shared real ones.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from settled._settings import Settings
from settled.projections import rebuild
from settled.projections._schema import ProjectionNames
from tests.integration.api.conftest import SpawnWorker, StartApi, TokenFactory, http
from tests.integration.engine._helpers import events_of, plan
from tests.integration.engine._helpers import settled as settled_record

pytestmark = [pytest.mark.integration]

SUBMIT = "/v1/conversations/{cid}/submissions"


def _same_receipt(a: dict[str, Any], b: dict[str, Any]) -> bool:
    keys = ("conversation_id", "submission_id", "submission_seq", "idempotency_key")
    return all(a[k] == b[k] for k in keys)


def test_scenario_18_the_same_key_returns_the_same_receipt_and_another_payload_is_a_conflict_naming_it(
    topics: Settings, names: ProjectionNames, spawn_worker: SpawnWorker, start_api: StartApi, token: TokenFactory
) -> None:
    worker = spawn_worker("w1")
    api = start_api()
    bearer = token("alice", "submit", "read")
    body = {"input": plan({"now": True})}
    with http(api, bearer) as h:
        first = h.post(SUBMIT.format(cid="c18"), json=body, headers={"Idempotency-Key": "k"})
        assert first.status_code == 201, first.text
        original = first.json()
        assert original["outcome"] == "admitted" and original["idempotency_key"] == "k"
        # At once, and concurrently: the same receipt every time (200, outcome duplicate).
        again = h.post(SUBMIT.format(cid="c18"), json=body, headers={"Idempotency-Key": "k"})
        assert again.status_code == 200, again.text
        assert again.json()["outcome"] == "duplicate" and _same_receipt(again.json(), original)
        with ThreadPoolExecutor(6) as pool:
            answers = list(
                pool.map(
                    lambda _: h.post(SUBMIT.format(cid="c18"), json=body, headers={"Idempotency-Key": "k"}), range(6)
                )
            )
        assert [a.status_code for a in answers] == [200] * 6
        assert all(_same_receipt(a.json(), original) for a in answers)
        # Its settlement by long poll, and the reads with after=<receipt>.
        settlement = h.get(
            f"/v1/conversations/c18/submissions/{original['submission_id']}/settlement",
            params={"wait_s": 60, "after": original["request_id"]},
        )
        assert settlement.status_code == 200, settlement.text
        assert settlement.json()["settled"] is True
        assert settlement.json()["settlement"]["outcome"] == "completed"
    # A full restart (API and worker): the same request returns the same receipt.
    api.stop()
    worker.stop()
    spawn_worker("w2")
    api = start_api()
    with http(api, bearer) as h:
        restarted = h.post(SUBMIT.format(cid="c18"), json=body, headers={"Idempotency-Key": "k"})
        assert restarted.status_code == 200, restarted.text
        assert _same_receipt(restarted.json(), original)
        # Another payload under k: 409 naming the key.
        conflict = h.post(SUBMIT.format(cid="c18"), json={"input": "other"}, headers={"Idempotency-Key": "k"})
        assert conflict.status_code == 409, conflict.text
        assert conflict.headers["content-type"].startswith("application/problem+json")
        problem = conflict.json()
        assert problem["type"] == "urn:settled:problem:idempotency_conflict"
        assert problem["field"] == "idempotency_key" and "'k'" in problem["detail"], problem
        assert problem["receipt"]["outcome"] == "rejected"
        # The key is scoped by conversation: k on another conversation is a new submission.
        elsewhere = h.post(SUBMIT.format(cid="c18-other"), json=body, headers={"Idempotency-Key": "k"})
        assert elsewhere.status_code == 201, elsewhere.text
        assert elsewhere.json()["submission_id"] != original["submission_id"]
        # After a projection rebuild: the same receipt again, the same token still valid (its table is not a
        # projection: the rebuild does not touch it), and the reads find the submission in the rebuilt version.
        rebuild(topics, names, timeout_s=60)
        rebuilt = h.post(SUBMIT.format(cid="c18"), json=body, headers={"Idempotency-Key": "k"})
        assert rebuilt.status_code == 200, rebuilt.text
        assert _same_receipt(rebuilt.json(), original)
        row = h.get(
            f"/v1/conversations/c18/submissions/{original['submission_id']}",
            params={"after": rebuilt.json()["request_id"]},
        )
        assert row.status_code == 200 and row.json()["idempotency_key"] == "k", row.text
    # The log holds one admission for (c18, k) and one settlement.
    record = settled_record(topics, original["submission_id"])
    assert record is not None and record.outcome.value == "completed"
    assert len(json.loads(record.reply_json or "null")["results"]) == 1
    admissions = [e for e in events_of(topics, original["submission_id"]) if type(e).__name__ == "SubmissionAdmitted"]
    assert len(admissions) == 1, admissions


def test_reads_take_after_and_a_missing_target_is_a_problem_naming_it(
    topics: Settings, spawn_worker: SpawnWorker, start_api: StartApi, token: TokenFactory
) -> None:
    spawn_worker("w1")
    api = start_api()
    with http(api, token("bob", "submit", "read")) as h:
        receipt = h.post(SUBMIT.format(cid="c-read"), json={"input": plan({"sleep_s": 0.2})}).json()
        sid, rid = receipt["submission_id"], receipt["request_id"]
        row = h.get(f"/v1/conversations/c-read/submissions/{sid}", params={"after": rid})
        assert row.status_code == 200, row.text
        assert row.json()["principal"] == "bob"  # from the token, never from the body
        done = h.get(f"/v1/conversations/c-read/submissions/{sid}/settlement", params={"wait_s": 60})
        assert done.json()["settled"] is True, done.text
        run = h.get(f"/v1/conversations/c-read/runs/{sid}", params={"after": rid})
        assert run.status_code == 200 and run.json()["attempts"], run.text
        conversation = h.get("/v1/conversations/c-read", params={"after": rid})
        assert [t["kind"] for t in conversation.json()["transcript"]] == ["input", "reply"], conversation.text
        runs = h.get("/v1/runs", params={"conversation_id": "c-read", "after": rid}).json()
        assert [r["submission_id"] for r in runs] == [sid]
        assert h.get("/v1/runs", params={"conversation_id": "c-read", "status": "incomplete"}).json() == []
        missing = h.get("/v1/conversations/c-read/submissions/nope")
        assert missing.status_code == 404
        assert missing.json()["field"] == "submission_id" and missing.json()["value"] == "nope"
        bad = h.get("/v1/runs", params={"limit": 0})
        assert bad.status_code == 422 and bad.json()["field"] == "limit" and bad.json()["value"] == "0", bad.text
        unsent = h.get("/v1/conversations/c-read/submissions/x", params={"after": "never-sent", "after_timeout_s": 0.2})
        assert unsent.status_code == 503 and unsent.headers["retry-after"] == "1", unsent.text
