"""settled.api: settled over HTTP, with principals (issue 20; docs/architecture.md, "The HTTP API").

* `TokenStore`, `Principal`, `Scope` (`_tokens`): bearer tokens mapping to a principal and scopes, kept as SHA-256
  digests in a PostgreSQL table of their own, outside the projections (``settled tokens create|list|revoke``).
* `ApiConfig`, `create_app` (`_app`, needs the ``http`` extra: FastAPI): the routes; `serve` runs them under uvicorn
  (``settled api``); `openapi_document` is the OpenAPI document committed as ``docs/openapi.json``.
* `ProblemError`, `STATUS_OF_CATEGORY` (`_problems`): errors as RFC 9457 problem details, one status per
  `settled.ErrorCategory`.

Only this package imports FastAPI, uvicorn and httpx; the command line imports it only when an ``api`` command runs.
"""

from settled.api._tokens import (
    Principal,
    Scope,
    TokenInfo,
    TokenNotFoundError,
    TokenStore,
    default_tokens_schema,
    parse_scopes,
    token_digest,
)

__all__ = [
    "Principal",
    "Scope",
    "TokenInfo",
    "TokenNotFoundError",
    "TokenStore",
    "default_tokens_schema",
    "parse_scopes",
    "token_digest",
]
