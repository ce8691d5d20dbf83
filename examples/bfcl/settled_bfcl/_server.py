"""The tool server's HTTP shell: FastAPI over :class:`ToolService` (run by ``settled_bfcl.toolserver``).

Endpoints (bodies in ``_wire``; errors are ``{"error": code, "detail": text}`` with the status in ``ERROR_CODES``):

=======  ====================================================  ============================================
GET      ``/health``                                           ``{"status": "ok"}``
GET      ``/capabilities``                                     :class:`Capabilities`
GET      ``/conversations``                                    ``{"conversation_ids": [...]}``
PUT      ``/conversations/{conversation_id}``                  :class:`CreateConversationRequest` →
                                                               :class:`ConversationInfo` (201 created, 200 existed)
GET      ``/conversations/{conversation_id}``                  :class:`ConversationInfo`
POST     ``/conversations/{conversation_id}/calls``            :class:`CallRequest` → :class:`CallResponse`
GET      ``/conversations/{conversation_id}/ledger[?idempotency_key=K]``   ``list[LedgerRecord]``
=======  ====================================================  ============================================

The handlers are plain functions (run in the server's thread pool); the service's lock serialises them, and every
answer to a call is sent after its SQLite commit.
"""

from __future__ import annotations

from fastapi import FastAPI, Request, Response, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from settled_bfcl._errors import ToolServerError
from settled_bfcl._service import ToolService
from settled_bfcl._wire import (
    CallRequest,
    CallResponse,
    Capabilities,
    ConversationInfo,
    CreateConversationRequest,
    ErrorBody,
    LedgerRecord,
)

__all__ = ["create_app"]


def create_app(service: ToolService) -> FastAPI:
    """Build the FastAPI application around a service.

    Args:
        service: The tool service (owns the store).

    Returns:
        The application.
    """
    app = FastAPI(title="settled BFCL tool server", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(ToolServerError)
    async def _tool_server_error(_: Request, exc: ToolServerError) -> JSONResponse:
        body = ErrorBody(error=exc.code, detail=exc.detail)
        return JSONResponse(status_code=exc.status_code, content=body.model_dump())

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in error.get('loc', ()))}: {error.get('msg', '')}" for error in exc.errors()
        )
        body = ErrorBody(error="invalid_request", detail=problems)
        return JSONResponse(status_code=status.HTTP_422_UNPROCESSABLE_CONTENT, content=body.model_dump())

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/capabilities")
    def capabilities() -> Capabilities:
        return service.capabilities()

    @app.get("/conversations")
    def conversations() -> dict[str, list[str]]:
        return {"conversation_ids": list(service.conversation_ids())}

    @app.put("/conversations/{conversation_id}")
    def create_conversation(
        conversation_id: str, body: CreateConversationRequest, response: Response
    ) -> ConversationInfo:
        info = service.create_conversation(conversation_id, body)
        response.status_code = status.HTTP_201_CREATED if info.created else status.HTTP_200_OK
        return info

    @app.get("/conversations/{conversation_id}")
    def conversation(conversation_id: str) -> ConversationInfo:
        return service.conversation(conversation_id)

    @app.post("/conversations/{conversation_id}/calls")
    def call(conversation_id: str, body: CallRequest) -> CallResponse:
        return service.call(conversation_id, body)

    @app.get("/conversations/{conversation_id}/ledger")
    def ledger(conversation_id: str, idempotency_key: str | None = None) -> list[LedgerRecord]:
        return service.ledger(conversation_id, idempotency_key)

    return app
