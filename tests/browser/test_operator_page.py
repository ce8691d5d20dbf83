"""The operator's page in a real browser (issue 21 item 1): Playwright driving Debian's chromium.

Real broker, PostgreSQL, projector, ``settled worker`` (`tests/browser/ui_app.py`) and ``settled api`` processes. An
operator logs in with a token, sees a run waiting for the approval of a ``refund`` call with its arguments, approves
it (the tool runs once), sees an Unknown ``remote_once`` call with its growing age and resolves it from the page;
a read-only token sees no action, and a POST made by hand with its session is refused (403) and publishes nothing.
Screenshots of every page go to ``.ci/artifacts/ui/`` (their paths printed).
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Locator, Page

from settled._settings import Settings
from settled.testing import WorkerProcess
from tests.browser.conftest import screenshot
from tests.integration.api.conftest import StartApi, TokenFactory, http
from tests.integration.engine._helpers import invocations, log_events, plan
from tests.integration.engine.engine_app import flag, world

pytestmark = [pytest.mark.integration]

SUBMIT = "/v1/conversations/{cid}/submissions"
SETTLEMENT = "/v1/conversations/{cid}/submissions/{sid}/settlement"


def _login(page: Page, base_url: str, bearer: str, shot: str | None = None) -> None:
    page.goto(f"{base_url}/ui/approvals")
    assert page.url.endswith("/ui/login"), page.url  # no session yet: the login form
    page.fill("#token", bearer)
    if shot:
        screenshot(page, shot)
    page.click("#login")
    page.wait_for_url("**/ui/approvals")


def _rows(page: Page, url: str, selector: str, timeout_s: float = 60.0) -> Locator:
    """Load ``url`` again until ``selector`` matches (the projection catches up); its rows."""
    deadline = time.monotonic() + timeout_s
    while True:
        page.goto(url)
        rows = page.locator(selector)
        if rows.count() > 0:
            return rows
        if time.monotonic() > deadline:
            raise AssertionError(f"{url}: nothing matched {selector!r} within {timeout_s} s:\n{page.content()}")
        time.sleep(0.2)


def _age_s(text: str) -> int:
    match = re.fullmatch(r"(?:(\d+)h )?(?:(\d+)m )?(\d+)s", text.strip())
    assert match is not None, f"an age like '1m 05s', got {text!r}"
    hours, minutes, seconds = (int(g or 0) for g in match.groups())
    return hours * 3600 + minutes * 60 + seconds


def _settled(client: Any, cid: str, sid: str) -> dict[str, Any]:
    done = client.get(SETTLEMENT.format(cid=cid, sid=sid), params={"wait_s": 60}).json()
    assert done["settled"], done
    return dict(done["settlement"])


def test_an_operator_approves_a_call_and_resolves_an_unknown_from_the_page(
    topics: Settings,
    worker: WorkerProcess,
    start_api: StartApi,
    token: TokenFactory,
    page: Page,
    world_path: Path,
) -> None:
    with world(str(world_path)) as db:
        flag(db, "server_down", True)  # remote_once gets no answer: its call goes Unknown
    api = start_api()
    operator = token("alice", "submit", "read", "approve", "resolve")
    with http(api, operator) as alice:
        refund = plan({"tool": "refund", "args": {"amount": 42, "order": "o-7"}})
        sid = alice.post(SUBMIT.format(cid="c-ui-refund"), json={"input": refund}).json()["submission_id"]
        remote = plan({"tool": "remote_once", "args": {"host": "billing"}})
        stuck = alice.post(SUBMIT.format(cid="c-ui-stuck"), json={"input": remote}).json()["submission_id"]
        _login(page, api.url, operator, shot="login")

        # Runs by status: the refund run waits for an approval, named, with since.
        waiting = _rows(page, f"{api.url}/ui/runs", f"tr.run[data-submission-id='{sid}']:has-text('approval')")
        assert "waiting" in waiting.inner_text(), waiting.inner_text()
        screenshot(page, "runs")

        # The pending approval, with the call and its arguments; Approve runs the tool once.
        (row,) = _rows(page, f"{api.url}/ui/approvals", "tr.approval").all()
        assert row.locator(".tool").inner_text() == "refund"
        assert json.loads(row.locator(".args").inner_text()) == {"amount": 42, "order": "o-7"}
        screenshot(page, "approvals")
        row.get_by_role("button", name="Approve").click()
        page.wait_for_url("**/ui/approvals?notice=*")
        assert "applied" in page.locator(".notice").inner_text()
        settlement = _settled(alice, "c-ui-refund", sid)
        assert settlement["outcome"] == "completed", settlement
        assert json.loads(settlement["reply_json"])["results"] == [{"refunded": 42}]
        assert invocations(world_path, "refund") == 1

        # The Unknown, with its prepared call and an age that grows; resolved from the page with the call's result.
        (row,) = _rows(page, f"{api.url}/ui/unknowns", "tr.unknown").all()
        assert row.locator(".tool").inner_text() == "remote_once"
        assert json.loads(row.locator(".args").inner_text()) == {"host": "billing"}
        first_age_s = _age_s(row.locator(".age").inner_text())
        (row,) = _rows(page, f"{api.url}/ui/unknowns", f"tr.unknown:not(:has(td.age:text-is('{first_age_s}s')))").all()
        assert _age_s(row.locator(".age").inner_text()) > first_age_s
        screenshot(page, "unknowns")
        row.locator("textarea[name=result]").fill('{"charged": true}')
        row.get_by_role("button", name="Record result").click()
        page.wait_for_url("**/ui/unknowns?notice=*")
        assert "applied" in page.locator(".notice").inner_text()
        settlement = _settled(alice, "c-ui-stuck", stuck)
        assert settlement["outcome"] == "completed", settlement
        assert json.loads(settlement["reply_json"])["results"] == [{"charged": True}]
        assert invocations(world_path, "remote_once") == 1  # resolved, never run again

    # Both runs settled; the conversation's transcript holds the approved call and its result.
    _rows(page, f"{api.url}/ui/runs?status=all", "tr.run:has-text('completed') >> nth=1")
    screenshot(page, "runs-all")
    page.goto(f"{api.url}/ui/conversations/c-ui-refund")
    transcript = page.locator("#transcript").inner_text()
    assert "tool_call" in transcript and "refund" in transcript and "tool_result" in transcript, transcript
    screenshot(page, "conversation")
    page.click("#logout")
    page.wait_for_url("**/ui/login")
    page.goto(f"{api.url}/ui/unknowns")
    assert page.url.endswith("/ui/login"), page.url  # the session ended


def test_a_read_only_token_sees_no_action_and_a_hand_made_post_is_refused(
    topics: Settings,
    worker: WorkerProcess,
    start_api: StartApi,
    token: TokenFactory,
    page: Page,
    world_path: Path,
) -> None:
    api = start_api()
    with http(api, token("alice", "submit", "read", "approve")) as alice:
        refund = plan({"tool": "refund", "args": {"amount": 7}})
        sid = alice.post(SUBMIT.format(cid="c-ui-ro"), json={"input": refund}).json()["submission_id"]
        _login(page, api.url, token("alice", "read"))
        (row,) = _rows(page, f"{api.url}/ui/approvals", "tr.approval").all()
        assert json.loads(row.locator(".args").inner_text()) == {"amount": 7}
        assert page.locator("form[action='/ui/approvals/decide']").count() == 0
        assert page.get_by_role("button", name="Approve").count() == 0
        screenshot(page, "approvals-read-only")
        page.goto(f"{api.url}/ui/unknowns")
        assert page.locator("form[action='/ui/unknowns/resolve']").count() == 0
        # A POST made by hand with the session's cookie and CSRF token (the logout form's): refused for the scope.
        csrf = page.locator("input[name=csrf_token]").first.get_attribute("value")
        (pending,) = alice.get("/v1/approvals", params={"conversation_id": "c-ui-ro"}).json()
        form = {
            "csrf_token": csrf or "",
            "conversation_id": "c-ui-ro",
            "submission_id": sid,
            "approval_id": pending["approval_id"],
            "args_digest": pending["args_digest"],
            "command_id": "ui-hand-made",
            "decision": "approve",
        }
        refused = page.request.post(f"{api.url}/ui/approvals/decide", form=form, max_redirects=0)
        assert refused.status == 403 and "lacks scope &#39;approve&#39;" in refused.text(), refused.text()
        # The barrier: the API's own approval (another command) completes the run; the hand-made one is nowhere.
        approve = f"/v1/conversations/c-ui-ro/runs/{sid}/approvals/{pending['approval_id'].replace('#', '%23')}/approve"
        ok = alice.post(approve, json={"args_digest": pending["args_digest"]}, headers={"Idempotency-Key": "api-ok"})
        assert ok.status_code == 200 and ok.json()["outcome"] == "applied", ok.text
        assert _settled(alice, "c-ui-ro", sid)["outcome"] == "completed"
    ids = [(e, getattr(e, "command_id", None), getattr(e, "source_id", None)) for e in log_events(topics)]
    named = [e for e, command_id, source_id in ids if "ui-hand-made" in (command_id, source_id)]
    assert named == [], named
    assert invocations(world_path, "refund") == 1
