"""The HTTP API (FastAPI): submissions with ``Idempotency-Key``, reads from the projection, commands (issue 20).

Routes (all under ``/v1``; each needs ``Authorization: Bearer <token>`` with the scope named):

* ``POST /conversations/{cid}/submissions`` (``submit``): the ``Idempotency-Key`` header (or a new UUID) is the
  submission's idempotency key; answers the receipt (201 admitted, 200 duplicate: the same ``submission_id`` and
  ``submission_seq``), 409 naming the key when it was admitted with another payload, 504 naming the key when no
  receipt came in time (never a false success: sending the same request again returns the original receipt).
* Reads (``read``), each with ``after=<request id>`` (a receipt's ``request_id`` in that conversation; waits up to
  ``after_timeout_s`` until the projection holds it: read-your-writes): a submission, its settlement (long poll
  ``wait_s``), runs by status, one run, a conversation and its transcript, open Unknowns.
* Commands, answered with their receipt (200 ``applied`` or ``duplicate``; a rejection is a 409 problem holding the
  rejection receipt, ``unknown_target`` a 404): signal (``approve``), approve and deny (``approve``; signed with the
  API's approver key), abort and steer a run (``submit``), resolve an Unknown and retry a dead letter as a new
  submission (``resolve``; signed with the API's resolver key). The ``Idempotency-Key`` header is the command id (a
  new UUID when absent; a retry's is also its new submission's idempotency key).
* Access (``submit`` to change, ``read`` to list): ``POST /conversations/{cid}/access`` grants a principal ``read``
  or ``act``, ``DELETE /conversations/{cid}/access/{principal}`` revokes it; only the conversation's opener or an
  ``admin`` token may (the owner decides it; anyone else's answers 404, or 403 for a principal that sees it).
  ``GET /conversations/{cid}/access`` lists the opener and the grantees.

The principal of everything the API publishes is the token's, never the body's; with a signing key
(``settled api --signing-key``) the API signs each record (`settled.protocol.api_signing_bytes`, Kafka headers) so
that the partition owner checks the conversation's access: a conversation is its opener's (the principal of its first
submission), its grantees' (``read``: see it; ``act``: see it and act on it) and an ``admin`` token's. A target the
caller may not see answers exactly like a missing one (404), on reads (filtered here from the projection's
``conversation_access``) and commands (rejected ``unknown_target`` by the owner) alike; a ``read`` grantee's
command or submission is a 403 (rejected ``unauthorized``).
Errors are RFC 9457 problem details (`settled.api._problems`).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fastapi import Depends, FastAPI, Header, Path, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, Field, JsonValue
from starlette.exceptions import HTTPException as StarletteHTTPException

from settled._errors import ErrorCategory, SettledError
from settled._settings import Settings
from settled.api._metrics import ApiMetrics
from settled.api._problems import PROBLEM_MEDIA_TYPE, ProblemError, problem_of_error
from settled.api._tokens import Principal, Scope, TokenStore
from settled.api._ui import UiBackend, install_ui
from settled.client import NO_RESULT, Client, CommandRejectedError, SubmissionRejectedError
from settled.projections import ProjectionReader
from settled.projections._schema import ProjectionNames
from settled.protocol import ACCESS_ALL, ACCESS_OWNER
from settled.schemas import LanePolicy, Receipt

__all__ = ["ApiConfig", "ReceiptOut", "create_app"]

API_VERSION = "1"
"""The API's version (the ``/v1`` prefix)."""


@dataclass(frozen=True)
class ApiConfig:
    """What one API process serves.

    Attributes:
        settings: Namespace, Kafka and PostgreSQL.
        names: The projection read from.
        tokens_schema: The schema of the tokens table.
        submit_timeout_s: Deadline of a submission's or a command's receipt, in seconds (then 504).
        max_wait_s: Longest long poll (``wait_s``) and read-your-writes wait (``after_timeout_s``), in seconds.
        approver_key: The API's Ed25519 key signing approval decisions (None: approvals answer 503).
        approver_key_id: Its key id in the workers' ``App.approver_keys``.
        resolver_key: The API's Ed25519 key signing resolutions of Unknowns (None: resolutions answer 503).
        resolver_key_id: Its key id in the workers' ``App.resolver_keys``.
        signing_key: The API's Ed25519 key signing every record it publishes (Kafka headers), so that the partition
            owner trusts the token's principal and checks the conversation's access (None: unsigned records, which
            the owner trusts as from any inbox writer; reads are still filtered here).
        signing_key_id: Its key id in the workers' ``App.api_keys``.
    """

    settings: Settings
    names: ProjectionNames
    tokens_schema: str
    submit_timeout_s: float = 10.0
    max_wait_s: float = 60.0
    approver_key: Ed25519PrivateKey | None = None
    approver_key_id: str = ""
    resolver_key: Ed25519PrivateKey | None = None
    resolver_key_id: str = ""
    signing_key: Ed25519PrivateKey | None = None
    signing_key_id: str = ""


# ---------------------------------------------------------------------------------------------------- models


class ReceiptOut(BaseModel):
    """A receipt as the API answers it.

    Attributes:
        conversation_id: The conversation.
        request_kind: ``submission`` or ``command``.
        request_id: The submission or command id answered (``after=`` takes it).
        outcome: ``admitted``, ``duplicate``, ``applied`` or ``rejected``.
        reason: A rejection's reason code and detail.
        submission_id: For a submission: the admitted submission (the original one for a duplicate); for a
            command: its target submission (None for an access command).
        submission_seq: For a submission: its sequence in the conversation.
        idempotency_key: For a submission: its key; for a command: its command id.
        decided_at: When the owner decided.
    """

    conversation_id: str
    request_kind: str
    request_id: str
    outcome: str
    reason: str | None = None
    submission_id: str | None = None
    submission_seq: int | None = None
    idempotency_key: str
    decided_at: str

    @classmethod
    def of(cls, receipt: Receipt, key: str, target: str | None = None) -> ReceiptOut:
        """Build from a client receipt.

        Args:
            receipt: The receipt.
            key: The idempotency key or command id.
            target: A command's target submission.

        Returns:
            The API receipt.
        """
        submission_id = receipt.original_submission_id or (target if target is not None else receipt.request_id)
        return cls(
            conversation_id=receipt.conversation_id,
            request_kind=receipt.request_kind.value,
            request_id=receipt.request_id,
            outcome=receipt.outcome.value,
            reason=receipt.reason,
            submission_id=submission_id,
            submission_seq=receipt.submission_seq,
            idempotency_key=key,
            decided_at=receipt.decided_at.isoformat(),
        )


class SubmissionIn(BaseModel):
    """A turn.

    Attributes:
        input: The turn's input, any JSON value.
        tools_offered: Names of the tools offered for this turn.
        lane: The lane policy of the conversation this turn opens (ignored by a later turn; see ``Client.submit``).
    """

    input: JsonValue
    tools_offered: list[str] = Field(default_factory=list)
    lane: LanePolicy | None = None


class SignalIn(BaseModel):
    """A signal's payload.

    Attributes:
        payload: Any JSON value.
    """

    payload: JsonValue = None


class DecisionIn(BaseModel):
    """An approval decision.

    Attributes:
        args_digest: The digest of the canonical arguments the approver saw (the request's ``args_digest``).
        reason: Why, recorded and shown to the run.
    """

    args_digest: str
    reason: str | None = None


class AbortIn(BaseModel):
    """An abort.

    Attributes:
        reason: Free text recorded with the abort.
    """

    reason: str | None = None


class LaneIn(BaseModel):
    """A conversation's new lane policy (see ``Client.set_lane``).

    Attributes:
        lane: ``queue``, ``join``, ``reject``, ``interrupt`` or ``keep_newest``.
    """

    lane: LanePolicy


class SteerIn(BaseModel):
    """A steering message for an active run (see ``Client.steer``).

    Attributes:
        text: The message the run's next model call shows the model (non-empty, bounded by the input contract).
    """

    text: str = Field(min_length=1)


class RetryIn(BaseModel):
    """A retry of a dead letter (see ``Client.retry_submission``).

    Attributes:
        new_submission_id: The id of the submission the retry admits (default: a new UUID).
    """

    new_submission_id: str | None = None


class ResolveIn(BaseModel):
    """A resolution of an Unknown tool call (see ``Client.resolve_unknown``).

    Attributes:
        kind: ``call_outcome``, ``safe_to_retry`` or ``outcome_for_submission``.
        result: For ``call_outcome``: the call's result (leave it out otherwise).
        outcome: For ``outcome_for_submission``: ``completed``, ``failed`` or ``aborted``.
        reply: For ``outcome_for_submission`` with ``completed``: the reply.
    """

    kind: Literal["call_outcome", "safe_to_retry", "outcome_for_submission"]
    result: JsonValue = None
    outcome: Literal["completed", "failed", "aborted"] | None = None
    reply: JsonValue = None


class AccessIn(BaseModel):
    """A grant of access to a conversation.

    Attributes:
        principal: The principal granted access (a token's principal).
        access: ``read`` (see the conversation) or ``act`` (see it, submit turns and send commands).
    """

    principal: str = Field(min_length=1)
    access: Literal["read", "act"] = "read"


class SettlementOut(BaseModel):
    """A long poll's answer.

    Attributes:
        settled: Whether the submission has its terminal outcome.
        state: The submission's state in the projection.
        settlement: The settlement row when settled.
    """

    settled: bool
    state: str
    settlement: dict[str, Any] | None = None


# ----------------------------------------------------------------------------------------------------- app

_BEARER = HTTPBearer(auto_error=False, description="A token from `settled tokens create`.")


def needs(scope: Scope) -> Callable[..., Principal]:
    """A dependency: the principal of the request's bearer token, which must have ``scope`` (else 401/403)."""

    def check(
        request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_BEARER)]
    ) -> Principal:
        challenge = {"WWW-Authenticate": 'Bearer realm="settled"'}
        if credentials is None:
            raise ProblemError(
                ErrorCategory.BAD_INPUT,
                "Authorization: a bearer token is required",
                kind="unauthenticated",
                status=401,
                title="Unauthenticated",
                headers=challenge,
                field="Authorization",
            )
        tokens: TokenStore = request.app.state.tokens
        principal = tokens.authenticate(credentials.credentials)
        if principal is None:
            raise ProblemError(
                ErrorCategory.BAD_INPUT,
                "Authorization: the bearer token is unknown or revoked",
                kind="unauthenticated",
                status=401,
                title="Unauthenticated",
                headers={"WWW-Authenticate": 'Bearer realm="settled", error="invalid_token"'},
                field="Authorization",
            )
        if not principal.allows(scope):
            raise ProblemError(
                ErrorCategory.REJECTED,
                f"the token of principal {principal.name!r} lacks scope {scope.value!r} "
                f"(it has {', '.join(sorted(s.value for s in principal.scopes))})",
                kind="insufficient_scope",
                status=403,
                title="Forbidden",
                headers={"WWW-Authenticate": f'Bearer realm="settled", error="insufficient_scope", scope="{scope}"'},
                field="scope",
                value=scope.value,
            )
        return principal

    return check


Submitter = Annotated[Principal, Depends(needs(Scope.SUBMIT))]
Reader = Annotated[Principal, Depends(needs(Scope.READ))]
Approver = Annotated[Principal, Depends(needs(Scope.APPROVE))]
Resolver = Annotated[Principal, Depends(needs(Scope.RESOLVE))]
Cid = Annotated[str, Path(description="The conversation id.")]
KeyHeader = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        description="The submission's idempotency key (a command's id); a new UUID when absent.",
    ),
]
After = Annotated[
    str | None,
    Query(description="A receipt's request_id in this conversation: wait until the projection holds it."),
]
AfterTimeout = Annotated[float, Query(ge=0, description="Longest wait for `after`, in seconds.")]


def _problem_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return {
        status: {"description": "A problem detail (RFC 9457)", "content": {PROBLEM_MEDIA_TYPE: {}}}
        for status in statuses
    }


def _rows(value: Any) -> Any:
    return jsonable_encoder(value)


def create_app(
    config: ApiConfig,
    *,
    client: Client | None = None,
    reader: ProjectionReader | None = None,
    tokens: TokenStore | None = None,
) -> FastAPI:
    """Build the API.

    Args:
        config: What it serves.
        client: The settled client publishing to the inbox (default: one built from ``config.settings``, closed
            with the app).
        reader: The projection reader (default: one on ``config.settings.postgres_dsn``, closed with the app).
        tokens: The tokens table (default: ``config.tokens_schema`` on the same PostgreSQL).

    Returns:
        The FastAPI application.
    """
    owned: list[Callable[[], None]] = []
    admin_client = client
    if client is None:
        signer = config.signing_key
        client = Client(
            config.settings,
            default_timeout_s=config.submit_timeout_s,
            api_signer=None if signer is None else (config.signing_key_id, signer, ACCESS_OWNER),
        )
        owned.append(client.close)
        admin_client = client
        if signer is not None:  # an admin token's records are signed with access "all"
            admin_client = Client(
                config.settings,
                default_timeout_s=config.submit_timeout_s,
                api_signer=(config.signing_key_id, signer, ACCESS_ALL),
            )
            owned.append(admin_client.close)
    if reader is None:
        reader = ProjectionReader(config.settings.postgres_dsn, config.names, pool_size=8)
        owned.append(reader.close)
    if tokens is None:
        tokens = TokenStore(config.settings.postgres_dsn, config.tokens_schema)
        owned.append(tokens.close)
    the_reader, the_tokens = reader, tokens
    owner_client, all_client = client, admin_client if admin_client is not None else client

    def client_of(principal: Principal) -> Client:
        return all_client if Scope.ADMIN in principal.scopes else owner_client

    def visible(cid: str, principal: Principal) -> bool:
        """Whether the caller may see the conversation: an admin, its opener, a grantee, or nobody opened it yet.

        Asked after the rows it guards were read: the opener's access row commits with the admission's rows, so a
        row read first is never shown as "nobody opened it yet" (asked before, the projection could catch up between
        the two reads), and a revocation projected in between is honoured.
        """
        if Scope.ADMIN in principal.scopes:
            return True
        return the_reader.access(cid, principal.name) is not None

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        await run_in_threadpool(the_tokens.ensure)
        yield
        for close in owned:
            await run_in_threadpool(close)

    app = FastAPI(
        title="settled",
        version=API_VERSION,
        description="Durable AI-agent conversations over HTTP: submissions, reads, commands (issue 20).",
        lifespan=lifespan,
        responses=_problem_responses(401, 403, 404, 409, 422, 503, 504),
    )
    app.state.tokens = the_tokens
    metrics = ApiMetrics()
    app.middleware("http")(metrics.middleware)

    @app.get("/metrics", include_in_schema=False)
    def prometheus_metrics() -> Response:  # aggregate figures only: no token (settled/api/_metrics.py)
        return metrics.response()

    @app.exception_handler(ProblemError)
    async def _on_problem(request: Request, exc: ProblemError) -> JSONResponse:
        return exc.response(request.url.path)

    @app.exception_handler(SettledError)
    async def _on_settled_error(request: Request, exc: SettledError) -> JSONResponse:
        return problem_of_error(exc).response(request.url.path)

    @app.exception_handler(StarletteHTTPException)
    async def _on_http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        category = ErrorCategory.NOT_FOUND if exc.status_code == 404 else ErrorCategory.BAD_INPUT
        problem = ProblemError(
            category,
            f"{request.method} {request.url.path}: {exc.detail}",
            kind="no_route" if exc.status_code == 404 else "http",
            status=exc.status_code,
            title=str(exc.detail),
            headers=exc.headers,
        )
        return problem.response(request.url.path)

    @app.exception_handler(RequestValidationError)
    async def _on_validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first = errors[0] if errors else {}
        field = ".".join(str(part) for part in first.get("loc", ()) if part not in ("body", "query", "path"))
        value = first.get("input")
        problem = ProblemError(
            ErrorCategory.BAD_INPUT,
            f"{field or 'request'}: {first.get('msg', 'invalid')}, got {value!r}",
            field=field or None,
            value=jsonable_encoder(value),
            errors=jsonable_encoder([{k: e.get(k) for k in ("loc", "msg", "type")} for e in errors]),
        )
        return problem.response(request.url.path)

    def key_of(header: str | None) -> str:
        return header if header is not None else str(uuid.uuid4())

    def bad_value(exc: ValueError) -> ProblemError:
        return ProblemError(ErrorCategory.BAD_INPUT, str(exc))

    def wait_after(cid: str, after: str | None, timeout_s: float) -> None:
        if after is None:
            return
        bounded = min(timeout_s, config.max_wait_s)
        # ProjectionReader.wait_for reads only the receipt's conversation and request id.
        the_reader.wait_for(Receipt.model_construct(conversation_id=cid, request_id=after), bounded)

    def not_found(what: str, field: str, value: str) -> ProblemError:
        return ProblemError(ErrorCategory.NOT_FOUND, f"{field} {value!r}: no such {what}", field=field, value=value)

    def command_answer(call: Callable[[], Receipt], key: str, target: str | None) -> ReceiptOut:
        try:
            receipt = call()
        except CommandRejectedError as exc:
            problem = problem_of_error(exc)
            if exc.reason_code == "unknown_target":
                problem.status = 404
                problem.title = "Not found"
            elif exc.reason_code == "unauthorized":  # it may see the conversation, not act on it (a read grant)
                problem.status = 403
                problem.title = "Forbidden"
            raise problem from exc
        except ValueError as exc:
            if isinstance(exc, SettledError):
                raise
            raise bad_value(exc) from exc
        return ReceiptOut.of(receipt, key, target)

    # -- submissions ---------------------------------------------------------------------------------------------

    @app.post(
        "/v1/conversations/{cid}/submissions",
        response_model=ReceiptOut,
        status_code=201,
        summary="Submit a turn",
        responses={200: {"description": "A duplicate: the same key and payload were admitted before"}},
    )
    def submit(
        cid: Cid, body: SubmissionIn, principal: Submitter, response: Response, idempotency_key: KeyHeader = None
    ) -> ReceiptOut:
        key = key_of(idempotency_key)
        try:
            receipt = client_of(principal).submit(
                cid,
                body.input,
                idempotency_key=key,
                principal=principal.name,
                tools_offered=body.tools_offered,
                lane=body.lane,
            )
        except SubmissionRejectedError as exc:
            if exc.reason_code == "unauthorized":
                if not visible(cid, principal):  # another principal's conversation: as if there were none
                    raise not_found("conversation", "conversation_id", cid) from exc
                problem = problem_of_error(exc)  # a read grant: it sees the conversation, it may not submit
                problem.status = 403
                problem.title = "Forbidden"
                raise problem from exc
            raise
        except ValueError as exc:
            if isinstance(exc, SettledError):
                raise
            raise bad_value(exc) from exc
        if receipt.outcome.value == "duplicate":
            response.status_code = 200
        return ReceiptOut.of(receipt, key)

    @app.get("/v1/conversations/{cid}/submissions/{sid}", summary="A submission's ledger row")
    def get_submission(
        cid: Cid, sid: str, principal: Reader, after: After = None, after_timeout_s: AfterTimeout = 10.0
    ) -> dict[str, Any]:
        wait_after(cid, after, after_timeout_s)
        row = the_reader.submission(sid, conversation_id=cid)
        if row is not None and not visible(cid, principal):
            row = None
        if row is None:
            raise not_found("submission", "submission_id", sid)
        return dict(_rows(row))

    @app.get(
        "/v1/conversations/{cid}/submissions/{sid}/settlement",
        response_model=SettlementOut,
        summary="A submission's settlement (long poll)",
    )
    async def get_settlement(
        cid: Cid,
        sid: str,
        principal: Reader,
        wait_s: Annotated[float, Query(ge=0, description="Long poll: wait up to this long for it, in seconds.")] = 0,
        after: After = None,
        after_timeout_s: AfterTimeout = 10.0,
    ) -> SettlementOut:
        await run_in_threadpool(wait_after, cid, after, after_timeout_s)
        deadline = time.monotonic() + min(wait_s, config.max_wait_s)
        pause_s = 0.02
        while True:
            row = await run_in_threadpool(the_reader.submission, sid, conversation_id=cid)
            if row is None or not await run_in_threadpool(visible, cid, principal):
                raise not_found("submission", "submission_id", sid)
            if row.get("settled_at") is not None:
                settlement = await run_in_threadpool(the_reader.settlement, sid, conversation_id=cid)
                if settlement is not None:
                    return SettlementOut(settled=True, state=str(row["state"]), settlement=_rows(settlement))
            left = deadline - time.monotonic()
            if left <= 0:
                return SettlementOut(settled=False, state=str(row["state"]))
            await asyncio.sleep(min(pause_s, left))
            pause_s = min(pause_s * 2, 0.25)

    # -- runs, conversations, unknowns ---------------------------------------------------------------------------

    @app.get("/v1/runs", summary="Runs by status")
    def list_runs(
        principal: Reader,
        status: Annotated[Literal["all", "incomplete"], Query(description="`incomplete`: not settled yet.")] = "all",
        conversation_id: Annotated[str | None, Query(description="Only this conversation's runs.")] = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
        after: Annotated[str | None, Query(description="With conversation_id: a receipt's request_id.")] = None,
        after_timeout_s: AfterTimeout = 10.0,
    ) -> list[dict[str, Any]]:
        if after is not None:
            if conversation_id is None:
                raise ProblemError(
                    ErrorCategory.BAD_INPUT,
                    f"after {after!r} needs conversation_id: a request id is unique within its conversation",
                    field="conversation_id",
                )
            wait_after(conversation_id, after, after_timeout_s)
        rows = the_reader.runs(incomplete=status == "incomplete", conversation_id=conversation_id, limit=limit)
        seen: dict[str, bool] = {}
        for cid in {str(r["conversation_id"]) for r in rows}:
            seen[cid] = visible(cid, principal)
        mine = [r for r in rows if seen[str(r["conversation_id"])]]
        return list(_rows(mine))

    @app.get("/v1/conversations/{cid}/runs/{rid}", summary="One run with its attempts and tool calls")
    def get_run(
        cid: Cid, rid: str, principal: Reader, after: After = None, after_timeout_s: AfterTimeout = 10.0
    ) -> dict[str, Any]:
        wait_after(cid, after, after_timeout_s)
        row = the_reader.run(rid, conversation_id=cid)
        if row is not None and not visible(cid, principal):
            row = None
        if row is None:
            raise not_found("run", "run_id", rid)
        return dict(_rows(row))

    @app.get("/v1/conversations/{cid}", summary="A conversation's state and transcript")
    def get_conversation(
        cid: Cid, principal: Reader, after: After = None, after_timeout_s: AfterTimeout = 10.0
    ) -> dict[str, Any]:
        wait_after(cid, after, after_timeout_s)
        row = the_reader.conversation(cid)
        if row is not None and not visible(cid, principal):
            row = None
        if row is None:
            raise not_found("conversation", "conversation_id", cid)
        return dict(_rows(row))

    @app.get("/v1/conversations/{cid}/unknowns", summary="A conversation's open Unknown tool calls")
    def list_unknowns(
        cid: Cid, principal: Reader, after: After = None, after_timeout_s: AfterTimeout = 10.0
    ) -> list[dict[str, Any]]:
        wait_after(cid, after, after_timeout_s)
        rows = [r for r in the_reader.unknown_obligations() if r["conversation_id"] == cid]
        if not visible(cid, principal):
            return []  # as for a conversation with no Unknown
        return list(_rows(rows))

    @app.get("/v1/approvals", summary="Approvals runs asked for: pending ones by default, with the call")
    def list_approvals(
        principal: Reader,
        status: Annotated[Literal["pending", "all"], Query(description="`all`: decided ones too.")] = "pending",
        conversation_id: Annotated[str | None, Query(description="Only this conversation's approvals.")] = None,
        submission_id: Annotated[str | None, Query(description="Only this run's (with conversation_id).")] = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
        after: Annotated[str | None, Query(description="With conversation_id: a receipt's request_id.")] = None,
        after_timeout_s: AfterTimeout = 10.0,
    ) -> list[dict[str, Any]]:
        if (after is not None or submission_id is not None) and conversation_id is None:
            field = "after" if after is not None else "submission_id"
            raise ProblemError(
                ErrorCategory.BAD_INPUT,
                f"{field} needs conversation_id: a request or submission id is unique within its conversation",
                field="conversation_id",
            )
        if after is not None and conversation_id is not None:
            wait_after(conversation_id, after, after_timeout_s)
        rows = the_reader.approvals(
            pending=status == "pending", conversation_id=conversation_id, submission_id=submission_id, limit=limit
        )
        seen = {cid: visible(cid, principal) for cid in {str(r["conversation_id"]) for r in rows}}
        return list(_rows([r for r in rows if seen[str(r["conversation_id"])]]))

    # -- commands ------------------------------------------------------------------------------------------------

    @app.post("/v1/conversations/{cid}/runs/{rid}/signals/{name}", response_model=ReceiptOut, summary="Signal a run")
    def signal(
        cid: Cid, rid: str, name: str, body: SignalIn, principal: Approver, idempotency_key: KeyHeader = None
    ) -> ReceiptOut:
        key = key_of(idempotency_key)
        return command_answer(
            lambda: client_of(principal).signal(cid, rid, name, body.payload, signal_id=key, principal=principal.name),
            key,
            rid,
        )

    def decide(cid: str, rid: str, aid: str, body: DecisionIn, principal: Principal, key: str, approved: bool) -> Any:
        signing_key = config.approver_key
        if signing_key is None:
            raise ProblemError(
                ErrorCategory.UNAVAILABLE,
                "this API has no approver key (settled api --approver-key): it cannot sign approval decisions",
                field="approver_key",
            )
        return command_answer(
            lambda: client_of(principal).decide_approval(
                cid,
                rid,
                aid,
                approved=approved,
                args_digest=body.args_digest,
                signing_key=signing_key,
                key_id=config.approver_key_id,
                reason=body.reason,
                principal=principal.name,
                command_id=key,
            ),
            key,
            rid,
        )

    @app.post(
        "/v1/conversations/{cid}/runs/{rid}/approvals/{aid}/approve",
        response_model=ReceiptOut,
        summary="Approve an approval",
    )
    def approve(
        cid: Cid, rid: str, aid: str, body: DecisionIn, principal: Approver, idempotency_key: KeyHeader = None
    ) -> ReceiptOut:
        result: ReceiptOut = decide(cid, rid, aid, body, principal, key_of(idempotency_key), True)
        return result

    @app.post(
        "/v1/conversations/{cid}/runs/{rid}/approvals/{aid}/deny", response_model=ReceiptOut, summary="Deny an approval"
    )
    def deny(
        cid: Cid, rid: str, aid: str, body: DecisionIn, principal: Approver, idempotency_key: KeyHeader = None
    ) -> ReceiptOut:
        result: ReceiptOut = decide(cid, rid, aid, body, principal, key_of(idempotency_key), False)
        return result

    @app.post(
        "/v1/conversations/{cid}/submissions/{sid}/abort", response_model=ReceiptOut, summary="Abort a submission"
    )
    def abort(cid: Cid, sid: str, body: AbortIn, principal: Submitter, idempotency_key: KeyHeader = None) -> ReceiptOut:
        key = key_of(idempotency_key)
        return command_answer(
            lambda: client_of(principal).abort(cid, sid, reason=body.reason, principal=principal.name, command_id=key),
            key,
            sid,
        )

    @app.put("/v1/conversations/{cid}/lane", response_model=ReceiptOut, summary="Change a conversation's lane policy")
    def set_lane(cid: Cid, body: LaneIn, principal: Submitter, idempotency_key: KeyHeader = None) -> ReceiptOut:
        key = key_of(idempotency_key)
        return command_answer(
            lambda: client_of(principal).set_lane(cid, body.lane, principal=principal.name, command_id=key),
            key,
            cid,
        )

    @app.post("/v1/conversations/{cid}/runs/{rid}/steer", response_model=ReceiptOut, summary="Steer an active run")
    def steer(cid: Cid, rid: str, body: SteerIn, principal: Submitter, idempotency_key: KeyHeader = None) -> ReceiptOut:
        key = key_of(idempotency_key)
        return command_answer(
            lambda: client_of(principal).steer(cid, rid, body.text, command_id=key, principal=principal.name),
            key,
            rid,
        )

    @app.post(
        "/v1/conversations/{cid}/submissions/{sid}/retry",
        response_model=ReceiptOut,
        summary="Retry a dead letter as a new submission",
    )
    def retry(cid: Cid, sid: str, body: RetryIn, principal: Resolver, idempotency_key: KeyHeader = None) -> ReceiptOut:
        signing_key = config.resolver_key
        if signing_key is None:
            raise ProblemError(
                ErrorCategory.UNAVAILABLE,
                "this API has no resolver key (settled api --resolver-key): it cannot sign retries",
                field="resolver_key",
            )
        key = key_of(idempotency_key)
        return command_answer(
            lambda: client_of(principal).retry_submission(
                cid,
                sid,
                signing_key=signing_key,
                key_id=config.resolver_key_id,
                new_submission_id=body.new_submission_id,
                principal=principal.name,
                command_id=key,
            ),
            key,
            sid,
        )

    @app.post(
        "/v1/conversations/{cid}/submissions/{sid}/unknowns/{call_id}/resolve",
        response_model=ReceiptOut,
        summary="Resolve an Unknown tool call",
    )
    def resolve(
        cid: Cid,
        sid: str,
        call_id: str,
        body: ResolveIn,
        principal: Resolver,
        idempotency_key: KeyHeader = None,
    ) -> ReceiptOut:
        return resolve_unknown(cid, sid, call_id, body, principal, key_of(idempotency_key))

    def resolve_unknown(
        cid: str, sid: str, call_id: str, body: ResolveIn, principal: Principal, key: str
    ) -> ReceiptOut:
        signing_key = config.resolver_key
        if signing_key is None:
            raise ProblemError(
                ErrorCategory.UNAVAILABLE,
                "this API has no resolver key (settled api --resolver-key): it cannot sign resolutions",
                field="resolver_key",
            )
        result = body.result if "result" in body.model_fields_set else NO_RESULT
        return command_answer(
            lambda: client_of(principal).resolve_unknown(
                cid,
                sid,
                call_id,
                kind=body.kind,
                signing_key=signing_key,
                key_id=config.resolver_key_id,
                result=result,
                outcome=body.outcome,
                reply=body.reply,
                principal=principal.name,
                command_id=key,
            ),
            key,
            sid,
        )

    # -- access (issue 20 item 3) -------------------------------------------------------------------------------

    @app.get("/v1/conversations/{cid}/access", summary="Who may see a conversation: its opener and its grantees")
    def list_access(
        cid: Cid, principal: Reader, after: After = None, after_timeout_s: AfterTimeout = 10.0
    ) -> list[dict[str, Any]]:
        wait_after(cid, after, after_timeout_s)
        rows = the_reader.access_list(cid)
        if not rows or not visible(cid, principal):
            raise not_found("conversation", "conversation_id", cid)
        return list(_rows(rows))

    @app.post(
        "/v1/conversations/{cid}/access",
        response_model=ReceiptOut,
        summary="Grant a principal access to a conversation (its opener or an admin)",
    )
    def grant_access(cid: Cid, body: AccessIn, principal: Submitter, idempotency_key: KeyHeader = None) -> ReceiptOut:
        key = key_of(idempotency_key)
        answer = command_answer(
            lambda: client_of(principal).grant_access(
                cid, body.principal, body.access, principal=principal.name, command_id=key
            ),
            key,
            None,
        )
        return answer.model_copy(update={"submission_id": None})

    @app.delete(
        "/v1/conversations/{cid}/access/{grantee}",
        response_model=ReceiptOut,
        summary="Revoke a principal's granted access to a conversation (its opener or an admin)",
    )
    def revoke_access(
        cid: Cid,
        grantee: Annotated[str, Path(description="The principal whose access ends.")],
        principal: Submitter,
        idempotency_key: KeyHeader = None,
    ) -> ReceiptOut:
        key = key_of(idempotency_key)
        answer = command_answer(
            lambda: client_of(principal).revoke_access(cid, grantee, principal=principal.name, command_id=key),
            key,
            None,
        )
        return answer.model_copy(update={"submission_id": None})

    # -- the operator's page (/ui, issue 21 item 1): the same commands, under a browser session ------------------

    def ui_decide(
        cid: str, rid: str, aid: str, args_digest: str, reason: str | None, principal: Principal, key: str, yes: bool
    ) -> ReceiptOut:
        body = DecisionIn(args_digest=args_digest, reason=reason)
        answer: ReceiptOut = decide(cid, rid, aid, body, principal, key, yes)
        return answer

    def ui_resolve(cid: str, sid: str, call_id: str, result: Any, principal: Principal, key: str) -> ReceiptOut:
        body = ResolveIn(kind="safe_to_retry") if result is NO_RESULT else ResolveIn(kind="call_outcome", result=result)
        return resolve_unknown(cid, sid, call_id, body, principal, key)

    backend = UiBackend(reader=the_reader, tokens=the_tokens, visible=visible, decide=ui_decide, resolve=ui_resolve)
    install_ui(app, backend)
    return app
