"""Lane policies over HTTP (issue 22 item 1 through issue 20's API).

A real ``settled worker`` child runs the engine test app and a real ``settled api`` child serves the routes: the
``lane`` of the submission that opens a conversation is recorded with its admission and decides the next ones, and
``PUT /v1/conversations/{cid}/lane`` (`Client.set_lane`) changes it, answering like every other command.
"""

from __future__ import annotations

import pytest

from settled._settings import Settings
from settled.schemas import LanePolicy, LaneSet, SubmissionAdmitted, WaitKind
from tests.integration.api.conftest import SpawnWorker, StartApi, TokenFactory, http
from tests.integration.api.test_api_commands import _wait_request
from tests.integration.engine._helpers import log_events, plan

pytestmark = [pytest.mark.integration]

SUBMIT = "/v1/conversations/{cid}/submissions"
LANE = "/v1/conversations/{cid}/lane"


def test_a_reject_lane_set_over_http_refuses_a_busy_turn_until_it_is_changed(
    topics: Settings, spawn_worker: SpawnWorker, start_api: StartApi, token: TokenFactory
) -> None:
    spawn_worker("w1")
    api = start_api()
    with (
        http(api, token("alice", "submit", "read")) as alice,
        http(api, token("alice", "approve")) as approver,
        http(api, token("bob", "submit", "read")) as bob,
    ):
        bad = alice.post(SUBMIT.format(cid="c-lane"), json={"input": 1, "lane": "sometimes"})
        assert bad.status_code == 422 and bad.json()["field"] == "lane", bad.text
        opened = alice.post(SUBMIT.format(cid="c-lane"), json={"input": plan({"signal": "go"}), "lane": "reject"})
        assert opened.status_code == 201, opened.text
        sid = opened.json()["submission_id"]
        _wait_request(topics, sid, WaitKind.SIGNAL)  # the run holds the lane, waiting for its signal
        busy = alice.post(SUBMIT.format(cid="c-lane"), json={"input": plan({})})
        assert busy.status_code == 409, busy.text
        assert busy.json()["receipt"]["reason"].startswith("busy"), busy.text
        bad_lane = alice.put(LANE.format(cid="c-lane"), json={"lane": "never"})
        assert bad_lane.status_code == 422 and bad_lane.json()["field"] == "lane", bad_lane.text
        hidden = bob.put(LANE.format(cid="c-lane"), json={"lane": "queue"})
        assert hidden.status_code == 404, hidden.text  # another principal's conversation: as if there were none
        missing = alice.put(LANE.format(cid="c-nobody-opened"), json={"lane": "queue"})
        assert missing.status_code == 404, missing.text
        changed = alice.put(LANE.format(cid="c-lane"), json={"lane": "queue"}, headers={"Idempotency-Key": "ln-1"})
        assert changed.status_code == 200, changed.text
        assert (changed.json()["outcome"], changed.json()["idempotency_key"]) == ("applied", "ln-1"), changed.text
        again = alice.put(LANE.format(cid="c-lane"), json={"lane": "queue"}, headers={"Idempotency-Key": "ln-1"})
        assert again.status_code == 200 and again.json()["outcome"] == "duplicate", again.text
        queued = alice.post(SUBMIT.format(cid="c-lane"), json={"input": plan({})})
        assert queued.status_code == 201, queued.text
        go = approver.post(f"/v1/conversations/c-lane/runs/{sid}/signals/go", json={"payload": 1})
        assert go.status_code == 200, go.text
        qid = queued.json()["submission_id"]
        done = alice.get(f"/v1/conversations/c-lane/submissions/{qid}/settlement", params={"wait_s": 60}).json()
        assert done["settled"], done
    events = log_events(topics)  # this test's namespace: c-lane's events only
    admitted = {e.submission_id: e.lane for e in events if isinstance(e, SubmissionAdmitted)}
    assert admitted == {sid: LanePolicy.REJECT, qid: None}, admitted  # recorded on the opening admission only
    lane_sets = [e for e in events if isinstance(e, LaneSet)]
    assert {(e.command_id, e.lane) for e in lane_sets} == {("ln-1", LanePolicy.QUEUE)}, lane_sets
