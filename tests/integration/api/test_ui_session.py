"""The operator page's session and CSRF check (issue 21 item 1), over plain HTTP against a real ``settled api``.

A real ``settled worker`` and ``settled api`` and a live projector. Login sets an opaque, HttpOnly, SameSite=Strict
session cookie (never the token); every POST must carry the session's CSRF token, and one without it, or with a wrong
one, is refused before anything is published: a barrier command with the right token is decided on the log, the
refused ones are not there. Another principal's conversation answers exactly like a missing one. Deny from the page
is the API's signed decision, and the same form posted twice is one command (its second answer a duplicate).
"""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import pytest

from settled._settings import Settings
from settled.api._ui import CSRF_FIELD, SESSION_COOKIE
from settled.schemas import CommandRejected
from tests._promise import promise
from tests.integration.api.conftest import SpawnWorker, StartApi, TokenFactory, http
from tests.integration.engine._helpers import log_events
from tests.integration.engine.engine_app import APPROVER_KEY_ID
from tests.integration.helpers import wait_for

pytestmark = [pytest.mark.integration]

_CSRF = re.compile(rf'name="{CSRF_FIELD}" value="([^"]+)"')


def _browser(base_url: str) -> httpx.Client:
    """A client keeping cookies and not following redirects, as a browser's page would see them."""
    return httpx.Client(base_url=base_url, timeout=60.0, follow_redirects=False)


def _login(client: httpx.Client, bearer: str) -> str:
    """Log ``client`` in with ``bearer``; return its session's CSRF token."""
    form = client.get("/ui/login")
    assert form.status_code == 200, form.text
    (login_csrf,) = _CSRF.findall(form.text)
    done = client.post("/ui/login", data={"token": bearer, CSRF_FIELD: login_csrf})
    assert done.status_code == 303 and done.headers["location"] == "/ui/approvals", done.text
    cookie = next(c for c in done.headers.get_list("set-cookie") if c.startswith(SESSION_COOKIE + "="))
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and bearer not in cookie, cookie
    approvals = client.get("/ui/approvals")
    assert approvals.status_code == 200, approvals.text
    assert "frame-ancestors 'none'" in approvals.headers["content-security-policy"]  # no clickjacking of a button
    csrf = set(_CSRF.findall(approvals.text))
    assert len(csrf) == 1, csrf  # the logout form's
    return csrf.pop()


def _decision(command_id: str, **extra: str) -> dict[str, Any]:
    return {
        "conversation_id": "c-ui-csrf",
        "submission_id": "no-such-run",
        "approval_id": "no-such-run#w0",
        "args_digest": "0" * 64,
        "command_id": command_id,
        "decision": "approve",
        **extra,
    }


def test_a_ui_post_without_the_sessions_csrf_token_is_refused_and_publishes_nothing(
    topics: Settings, spawn_worker: SpawnWorker, start_api: StartApi, token: TokenFactory
) -> None:
    spawn_worker("w1")
    api = start_api()
    admin_token = token("ops", "admin")
    # The login form is guarded too: a login posted without its token is refused.
    with httpx.Client(base_url=api.url, timeout=60.0) as stranger:
        forged = stranger.post("/ui/login", data={"token": admin_token})
        promise(
            "UI-001.csrf-checked",
            forged.status_code == 403 and CSRF_FIELD in forged.text,
            f"a login posted without the login form's CSRF token was not refused: {forged.status_code}",
        )
        assert SESSION_COOKIE not in forged.headers.get("set-cookie", "")
    with _browser(api.url) as client:
        csrf = _login(client, admin_token)
        missing = client.post("/ui/approvals/decide", data=_decision("ui-no-csrf"))
        wrong = client.post("/ui/approvals/decide", data=_decision("ui-bad-csrf", **{CSRF_FIELD: csrf[::-1]}))
        for answer in (missing, wrong):
            promise(
                "UI-001.csrf-checked",
                answer.status_code == 403 and CSRF_FIELD in answer.text,
                f"a POST without the session's CSRF token was not refused: {answer.status_code} {answer.text[:300]}",
            )
        # The barrier: the same command with the session's token is decided (no such run: rejected, 404 page).
        barrier = client.post("/ui/approvals/decide", data=_decision("ui-barrier", **{CSRF_FIELD: csrf}))
        assert barrier.status_code == 404 and "no-such-run" in barrier.text, barrier.text

        def rejected() -> set[str]:
            return {e.command_id for e in log_events(topics) if isinstance(e, CommandRejected)}

        wait_for(lambda: "ui-barrier" in rejected(), 60, "the barrier command's rejection on the log")
        published = rejected() & {"ui-no-csrf", "ui-bad-csrf"}
        promise("UI-001.csrf-checked", not published, f"refused POSTs reached the log: {sorted(published)}")
        # Logout needs the token too, then ends the session.
        assert client.post("/ui/logout", data={}).status_code == 403
        out = client.post("/ui/logout", data={CSRF_FIELD: csrf})
        assert out.status_code == 303 and out.headers["location"] == "/ui/login", out.text
        assert client.get("/ui/approvals").headers.get("location") == "/ui/login"


def test_a_conversation_the_token_may_not_see_answers_like_a_missing_one(
    spawn_worker: SpawnWorker, start_api: StartApi, token: TokenFactory
) -> None:
    spawn_worker("w1")
    api = start_api()
    with http(api, token("alice", "submit", "read")) as alice:
        sent = alice.post("/v1/conversations/c-ui-alice/submissions", json={"input": {"plan": []}})
        assert sent.status_code == 201, sent.text
        wait_for(lambda: alice.get("/v1/conversations/c-ui-alice").status_code == 200, 60, "the projection")
    with _browser(api.url) as page_of_alice, _browser(api.url) as page_of_bob:
        _login(page_of_alice, token("alice", "read"))
        _login(page_of_bob, token("bob", "read", "approve", "resolve"))
        assert page_of_alice.get("/ui/conversations/c-ui-alice").status_code == 200
        hidden = page_of_bob.get("/ui/conversations/c-ui-alice")
        missing = page_of_bob.get("/ui/conversations/c-ui-none")
        assert hidden.status_code == missing.status_code == 404, (hidden.text, missing.text)
        assert hidden.text.replace("c-ui-alice", "?") == missing.text.replace("c-ui-none", "?")


def test_deny_from_the_page_is_the_apis_decision_and_the_same_form_posted_twice_is_one_command(
    spawn_worker: SpawnWorker, start_api: StartApi, token: TokenFactory
) -> None:
    spawn_worker("w1")
    api = start_api()
    bearer = token("alice", "submit", "read", "approve")
    with http(api, bearer) as alice, _browser(api.url) as page:
        ask = {"plan": [{"approve": "refund", "description": "order o-9"}]}
        sid = alice.post("/v1/conversations/c-ui-deny/submissions", json={"input": ask}).json()["submission_id"]
        csrf = _login(page, bearer)
        wait_for(lambda: bool(alice.get("/v1/approvals").json()), 60, "the pending approval")
        (pending,) = alice.get("/v1/approvals").json()
        listed = page.get("/ui/approvals")
        assert f'data-approval-id="{pending["approval_id"]}"' in listed.text and "order o-9" in listed.text
        form = {
            CSRF_FIELD: csrf,
            "conversation_id": "c-ui-deny",
            "submission_id": sid,
            "approval_id": pending["approval_id"],
            "args_digest": pending["args_digest"],
            "command_id": "ui-deny-1",
            "decision": "deny",
            "reason": "not today",
        }
        first = page.post("/ui/approvals/decide", data=form)
        again = page.post("/ui/approvals/decide", data=form)  # the same form posted twice: one command
        assert first.status_code == again.status_code == 303, (first.text, again.text)
        assert first.headers["location"].endswith("applied") and again.headers["location"].endswith("duplicate")
        done = alice.get(f"/v1/conversations/c-ui-deny/submissions/{sid}/settlement", params={"wait_s": 60}).json()
    assert done["settled"] and done["settlement"]["outcome"] == "completed", done
    (result,) = json.loads(done["settlement"]["reply_json"])["results"]
    assert result == {"approved": False, "by": APPROVER_KEY_ID, "reason": "not today"}, result
