"""The operator's page (``/ui`` of ``settled api``; issue 21 item 1): server-rendered HTML over the API's own code.

What waits for a person, and the commands that act on it, without reading Kafka topics:

* ``/ui/approvals``: pending approvals with the call and its arguments; Approve and Deny (``approve`` scope).
* ``/ui/unknowns``: the Unknown tool calls with their age and the prepared call; resolve with a result, or
  "safe to retry" (``resolve`` scope).
* ``/ui/runs``: runs by status with what they wait for (kind, name, since, deadline).
* ``/ui/conversations/{cid}``: a conversation's transcript.

Login posts a bearer token (``settled tokens create``). The API keeps a session in its memory holding only the
token's SHA-256 digest and the session's CSRF token; the browser gets an opaque session id in an ``HttpOnly``,
``SameSite=Strict`` cookie (``Secure`` over HTTPS), never the token. Every request looks the digest up again, so a
revoked token ends its sessions at once; a session also ends at logout, after `SESSION_LIFETIME_S`, or when the API
process restarts. Every form carries the session's CSRF token and every POST is refused (403) without it (the login
form is guarded by its own pre-session cookie, so a page elsewhere cannot log a browser in as someone else).

Actions are shown only for the scopes the session's token holds, and a POST without the scope is refused (403) even
when made by hand. The decisions go through the very functions the API's command routes use (`UiBackend`, built by
`settled.api._app.create_app`), so the API's signing, the owner's access check and the receipts are the same; a
conversation the token may not see answers exactly like a missing one (404), as in the API.
"""

from __future__ import annotations

import hmac
import json
import secrets
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Literal
from urllib.parse import parse_qs, quote, urlencode

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from jinja2 import Environment, FileSystemLoader, select_autoescape

from settled._errors import SettledError
from settled._faults import fault_enabled
from settled.api._problems import ProblemError, problem_of_error
from settled.api._tokens import Principal, Scope, TokenStore, token_digest
from settled.client import NO_RESULT
from settled.projections import ProjectionReader

__all__ = ["CSRF_FIELD", "LOGIN_COOKIE", "SESSION_COOKIE", "SESSION_LIFETIME_S", "UiBackend", "install_ui"]

SESSION_COOKIE = "settled_session"
"""The cookie holding the opaque session id."""

LOGIN_COOKIE = "settled_login"
"""The pre-session cookie guarding the login form (its value is the login form's CSRF token)."""

CSRF_FIELD = "csrf_token"
"""The form field every POST must carry."""

SESSION_LIFETIME_S = 8 * 3600.0
"""How long a session lasts after login, in seconds."""

_TEMPLATES = Path(__file__).parent / "templates"
_PAGE_HEADERS = {
    "Cache-Control": "no-store",
    # No script, no frame around the page (clickjacking an Approve button), forms post only to this origin.
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'unsafe-inline'; img-src 'self'; form-action 'self'; frame-ancestors 'none'"
    ),
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
}
_LIST_LIMIT = 200


@dataclass(frozen=True)
class UiBackend:
    """What the page needs from the API: its reader and tokens, and its command functions.

    Attributes:
        reader: The projection reader.
        tokens: The tokens table.
        visible: ``visible(cid, principal)``: whether the principal may see the conversation.
        decide: ``decide(cid, run_id, approval_id, args_digest, reason, principal, command_id, approved)``: the API's
            approval decision (signed with its approver key); raises `ProblemError` as the API answers.
        resolve: ``resolve(cid, submission_id, call_id, result, principal, command_id)``: the API's resolution of an
            Unknown (``result`` `NO_RESULT`: safe to retry); raises `ProblemError` as the API answers.
    """

    reader: ProjectionReader
    tokens: TokenStore
    visible: Callable[[str, Principal], bool]
    decide: Callable[[str, str, str, str, str | None, Principal, str, bool], Any]
    resolve: Callable[[str, str, str, Any, Principal, str], Any]


@dataclass(frozen=True)
class _Session:
    token_sha256: str
    csrf_token: str
    expires_at_s: float  # time.monotonic()


class _Sessions:
    """The page's sessions, in this process's memory: session id → the token's digest and the CSRF token."""

    def __init__(self, lifetime_s: float) -> None:
        self._lifetime_s = lifetime_s
        self._by_id: dict[str, _Session] = {}
        self._lock = threading.Lock()

    def open(self, token_sha256: str) -> str:
        session_id = secrets.token_urlsafe(32)
        with self._lock:
            now_s = time.monotonic()
            for stale in [k for k, v in self._by_id.items() if v.expires_at_s <= now_s]:
                del self._by_id[stale]
            self._by_id[session_id] = _Session(token_sha256, secrets.token_urlsafe(32), now_s + self._lifetime_s)
        return session_id

    def get(self, session_id: str | None) -> _Session | None:
        if not session_id:
            return None
        with self._lock:
            session = self._by_id.get(session_id)
            if session is not None and session.expires_at_s <= time.monotonic():
                del self._by_id[session_id]
                return None
            return session

    def close(self, session_id: str | None) -> None:
        with self._lock:
            self._by_id.pop(session_id or "", None)


@dataclass(frozen=True)
class _Viewer:
    session_id: str
    csrf_token: str
    principal: Principal


def csrf_matches(expected: str, sent: str | None) -> bool:
    """Whether a POST's CSRF token is the session's (constant-time).

    Args:
        expected: The session's (or the login cookie's) token.
        sent: The form's ``csrf_token`` field, None when absent.

    Returns:
        True when they are equal and not empty.
    """
    if fault_enabled("ui_csrf_unchecked"):
        return True  # the fault switch: any POST acts, wherever the form came from
    return bool(expected) and sent is not None and hmac.compare_digest(expected.encode(), sent.encode())


def _age(value: Any) -> str:
    """A duration as ``1h 02m 03s`` (whole seconds)."""
    if not isinstance(value, timedelta):
        return "" if value is None else str(value)
    total_s = max(int(value.total_seconds()), 0)
    hours, rest = divmod(total_s, 3600)
    minutes, seconds = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes:02d}m {seconds:02d}s"
    if minutes:
        return f"{minutes}m {seconds:02d}s"
    return f"{seconds}s"


def _when(value: Any) -> str:
    if isinstance(value, datetime):
        return value.isoformat(timespec="seconds")
    return "" if value is None else str(value)


def _pretty_json(text: Any) -> str:
    if text is None:
        return ""
    try:
        return json.dumps(json.loads(str(text)), indent=2, sort_keys=True, ensure_ascii=False)
    except ValueError:
        return str(text)


def _environment() -> Environment:
    env = Environment(loader=FileSystemLoader(str(_TEMPLATES)), autoescape=select_autoescape(["html"]))
    env.filters["age"] = _age
    env.filters["when"] = _when
    env.filters["pretty_json"] = _pretty_json
    env.filters["q"] = lambda value: quote(str(value), safe="")
    return env


def install_ui(app: FastAPI, backend: UiBackend, *, lifetime_s: float = SESSION_LIFETIME_S) -> None:
    """Add the operator's page (``/ui``) to the API.

    Args:
        app: The API application.
        backend: The API's reader, tokens and command functions.
        lifetime_s: How long a session lasts after login, in seconds.
    """
    env = _environment()
    sessions = _Sessions(lifetime_s)

    def cookie_flags(request: Request) -> dict[str, Any]:
        return {"httponly": True, "samesite": "strict", "secure": request.url.scheme == "https", "path": "/ui"}

    def page(name: str, viewer: _Viewer | None, status: int = 200, **context: Any) -> HTMLResponse:
        principal = None if viewer is None else viewer.principal
        html = env.get_template(name).render(
            viewer=viewer,
            principal=principal,
            csrf_field=CSRF_FIELD,
            can_approve=principal is not None and principal.allows(Scope.APPROVE),
            can_resolve=principal is not None and principal.allows(Scope.RESOLVE),
            **context,
        )
        return HTMLResponse(html, status_code=status, headers=_PAGE_HEADERS)

    def message(viewer: _Viewer | None, status: int, title: str, detail: str) -> HTMLResponse:
        return page("message.html", viewer, status=status, title=title, detail=detail)

    def viewer_of(request: Request) -> _Viewer | None:
        session_id = request.cookies.get(SESSION_COOKIE)
        session = sessions.get(session_id)
        if session is None or session_id is None:
            return None
        principal = backend.tokens.authenticate_digest(session.token_sha256)
        if principal is None:  # revoked since login: the session ends with it
            sessions.close(session_id)
            return None
        return _Viewer(session_id, session.csrf_token, principal)

    def to_login() -> RedirectResponse:
        return RedirectResponse("/ui/login", status_code=303)

    async def form_of(request: Request) -> dict[str, str] | HTMLResponse:
        media = request.headers.get("content-type", "").split(";")[0].strip().lower()
        body = await request.body()
        if media != "application/x-www-form-urlencoded" and body:
            return message(
                None, 415, "Unsupported media type", f"Content-Type: expected a form, got {media or 'none'!r}"
            )
        fields = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
        return {name: values[-1] for name, values in fields.items()}

    async def guarded_post(request: Request, scope: Scope | None) -> tuple[_Viewer, dict[str, str]] | Response:
        """Session (401), CSRF token (403) and scope (403), in that order, for a POST."""
        viewer = await run_in_threadpool(viewer_of, request)
        if viewer is None:
            return message(None, 401, "Not logged in", "this action needs a session: log in again at /ui/login")
        form = await form_of(request)
        if isinstance(form, HTMLResponse):
            return form
        if not csrf_matches(viewer.csrf_token, form.get(CSRF_FIELD)):
            return message(
                viewer, 403, "Forbidden", f"{CSRF_FIELD}: missing or not this session's; reload the page and retry"
            )
        if scope is not None and not viewer.principal.allows(scope):
            held = ", ".join(sorted(s.value for s in viewer.principal.scopes))
            return message(
                viewer,
                403,
                "Forbidden",
                f"the token of principal {viewer.principal.name!r} lacks scope {scope.value!r} (it has {held})",
            )
        return viewer, form

    def required(form: Mapping[str, str], *names: str) -> list[str] | str:
        missing = [n for n in names if not form.get(n)]
        if missing:
            return f"{missing[0]}: required, got {form.get(missing[0], '')!r}"
        return [form[n] for n in names]

    def after_command(where: str, what: str, answer: Any) -> RedirectResponse:
        notice = f"{what}: {getattr(answer, 'outcome', 'done')}"
        return RedirectResponse(f"{where}?{urlencode({'notice': notice})}", status_code=303)

    def problem_page(viewer: _Viewer, exc: SettledError) -> HTMLResponse:
        """The API's answer to a command (a `ProblemError`, or a `SettledError` as the API maps it) as a page."""
        problem = exc if isinstance(exc, ProblemError) else problem_of_error(exc)
        return message(viewer, problem.status, problem.title, problem.detail)

    # -- login and logout -----------------------------------------------------------------------------------------

    @app.get("/ui", include_in_schema=False)
    def ui_root() -> RedirectResponse:
        return RedirectResponse("/ui/approvals", status_code=303)

    @app.get("/ui/login", include_in_schema=False)
    def login_form(request: Request) -> HTMLResponse:
        login_csrf = secrets.token_urlsafe(32)
        response = page("login.html", None, login_csrf=login_csrf, error=None)
        response.set_cookie(LOGIN_COOKIE, login_csrf, max_age=3600, **cookie_flags(request))
        return response

    @app.post("/ui/login", include_in_schema=False)
    async def login(request: Request) -> Response:
        form = await form_of(request)
        if isinstance(form, HTMLResponse):
            return form
        if not csrf_matches(request.cookies.get(LOGIN_COOKIE, ""), form.get(CSRF_FIELD)):
            return message(None, 403, "Forbidden", f"{CSRF_FIELD}: missing or not this login form's; reload /ui/login")
        token = form.get("token", "").strip()
        principal = await run_in_threadpool(backend.tokens.authenticate, token) if token else None
        if principal is None:
            login_csrf = secrets.token_urlsafe(32)
            response: Response = page(
                "login.html", None, status=401, login_csrf=login_csrf, error="token: unknown or revoked"
            )
            response.set_cookie(LOGIN_COOKIE, login_csrf, max_age=3600, **cookie_flags(request))
            return response
        response = RedirectResponse("/ui/approvals", status_code=303)
        response.set_cookie(SESSION_COOKIE, sessions.open(token_digest(token)), **cookie_flags(request))
        response.delete_cookie(LOGIN_COOKIE, path="/ui")
        return response

    @app.post("/ui/logout", include_in_schema=False)
    async def logout(request: Request) -> Response:
        checked = await guarded_post(request, None)
        if isinstance(checked, Response):
            return checked
        sessions.close(checked[0].session_id)
        response = RedirectResponse("/ui/login", status_code=303)
        response.delete_cookie(SESSION_COOKIE, path="/ui")
        return response

    # -- approvals ------------------------------------------------------------------------------------------------

    def approvals_page(viewer: _Viewer, notice: str | None) -> HTMLResponse:
        rows = backend.reader.approvals(pending=True, limit=_LIST_LIMIT)
        seen = {cid: backend.visible(cid, viewer.principal) for cid in {str(r["conversation_id"]) for r in rows}}
        mine = [r for r in rows if seen[str(r["conversation_id"])]]
        return page("approvals.html", viewer, approvals=mine, notice=notice, new_id=lambda: str(uuid.uuid4()))

    @app.get("/ui/approvals", include_in_schema=False)
    def approvals(request: Request, notice: str | None = None) -> Response:
        viewer = viewer_of(request)
        return to_login() if viewer is None else approvals_page(viewer, notice)

    @app.post("/ui/approvals/decide", include_in_schema=False)
    async def decide(request: Request) -> Response:
        checked = await guarded_post(request, Scope.APPROVE)
        if isinstance(checked, Response):
            return checked
        viewer, form = checked
        fields = required(form, "conversation_id", "submission_id", "approval_id", "args_digest", "command_id")
        if isinstance(fields, str):
            return message(viewer, 422, "Bad input", fields)
        cid, sid, aid, digest, command_id = fields
        choice = form.get("decision")
        if choice not in ("approve", "deny"):
            return message(viewer, 422, "Bad input", f"decision: must be approve or deny, got {choice!r}")
        reason = form.get("reason") or None
        try:
            answer = await run_in_threadpool(
                backend.decide, cid, sid, aid, digest, reason, viewer.principal, command_id, choice == "approve"
            )
        except SettledError as exc:  # a ProblemError, or what the API maps to one
            return problem_page(viewer, exc)
        return after_command("/ui/approvals", f"{choice} {aid}", answer)

    # -- Unknowns -------------------------------------------------------------------------------------------------

    def unknowns_page(viewer: _Viewer, notice: str | None) -> HTMLResponse:
        rows = backend.reader.unknown_obligations()
        seen = {cid: backend.visible(cid, viewer.principal) for cid in {str(r["conversation_id"]) for r in rows}}
        mine = [dict(r) for r in rows if seen[str(r["conversation_id"])]]
        transcripts: dict[str, list[dict[str, Any]]] = {}
        for row in mine:
            cid = str(row["conversation_id"])
            if cid not in transcripts:
                conversation = backend.reader.conversation(cid)
                transcripts[cid] = [] if conversation is None else list(conversation["transcript"])
            call = (row["submission_id"], row["call_id"])
            calls = [t for t in transcripts[cid] if t["kind"] == "tool_call"]
            prepared = [t for t in calls if (t["submission_id"], t["call_id"]) == call]
            row["args_json"] = prepared[-1]["content"] if prepared else None
        return page("unknowns.html", viewer, unknowns=mine, notice=notice, new_id=lambda: str(uuid.uuid4()))

    @app.get("/ui/unknowns", include_in_schema=False)
    def unknowns(request: Request, notice: str | None = None) -> Response:
        viewer = viewer_of(request)
        return to_login() if viewer is None else unknowns_page(viewer, notice)

    @app.post("/ui/unknowns/resolve", include_in_schema=False)
    async def resolve(request: Request) -> Response:
        checked = await guarded_post(request, Scope.RESOLVE)
        if isinstance(checked, Response):
            return checked
        viewer, form = checked
        fields = required(form, "conversation_id", "submission_id", "call_id", "command_id")
        if isinstance(fields, str):
            return message(viewer, 422, "Bad input", fields)
        cid, sid, call_id, command_id = fields
        kind = form.get("kind")
        result: Any
        if kind == "safe_to_retry":
            result = NO_RESULT
        elif kind == "call_outcome":
            text = form.get("result", "")
            try:
                result = json.loads(text)
            except ValueError as exc:
                return message(viewer, 422, "Bad input", f"result: not JSON ({exc}), got {text!r}")
        else:
            return message(viewer, 422, "Bad input", f"kind: must be call_outcome or safe_to_retry, got {kind!r}")
        try:
            answer = await run_in_threadpool(backend.resolve, cid, sid, call_id, result, viewer.principal, command_id)
        except SettledError as exc:  # a ProblemError, or what the API maps to one
            return problem_page(viewer, exc)
        return after_command("/ui/unknowns", f"{kind} {call_id}", answer)

    # -- runs and conversations -----------------------------------------------------------------------------------

    @app.get("/ui/runs", include_in_schema=False)
    def runs(request: Request, status: Literal["incomplete", "all"] = "incomplete") -> Response:
        viewer = viewer_of(request)
        if viewer is None:
            return to_login()
        rows = backend.reader.runs(incomplete=status == "incomplete", limit=_LIST_LIMIT)
        seen = {cid: backend.visible(cid, viewer.principal) for cid in {str(r["conversation_id"]) for r in rows}}
        mine = [r for r in rows if seen[str(r["conversation_id"])]]
        by_status: dict[str, int] = {}
        for r in mine:
            by_status[str(r["status"])] = by_status.get(str(r["status"]), 0) + 1
        return page("runs.html", viewer, runs=mine, shown=status, by_status=sorted(by_status.items()))

    @app.get("/ui/conversations", include_in_schema=False)
    def find_conversation(request: Request, conversation_id: str = "") -> Response:
        if not conversation_id:
            return RedirectResponse("/ui/runs", status_code=303)
        return RedirectResponse(f"/ui/conversations/{quote(conversation_id, safe='')}", status_code=303)

    @app.get("/ui/conversations/{cid}", include_in_schema=False)
    def conversation(request: Request, cid: str) -> Response:
        viewer = viewer_of(request)
        if viewer is None:
            return to_login()
        row = backend.reader.conversation(cid)  # read first, then the access check (see the API's `visible`)
        if row is not None and not backend.visible(cid, viewer.principal):
            row = None
        if row is None:  # hidden or missing: the same answer
            return message(viewer, 404, "Not found", f"conversation_id {cid!r}: no such conversation")
        return page("conversation.html", viewer, conversation=row, cid=cid)
