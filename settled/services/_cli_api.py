"""``settled api`` (the HTTP API under uvicorn) and ``settled tokens create|list|revoke`` (issue 20).

``settled api`` needs the ``http`` extra (``pip install 'settled[http]'``): FastAPI and uvicorn are imported only when
it runs, so the rest of the command line works without them. ``settled api --openapi`` prints the OpenAPI document
(``docs/openapi.json`` is that output; regenerate it with ``settled api --openapi > docs/openapi.json``).

Tokens live in the table `settled.api.TokenStore` keeps beside the projection (``<schema>__tokens``): ``create``
prints the token once (only its SHA-256 digest is stored), ``list`` shows ids, principals, scopes and revocations,
``revoke`` ends a token at once.
"""

from __future__ import annotations

import json
import sys

import typer

from settled._errors import BadInputError
from settled.api import TokenStore, default_tokens_schema, parse_scopes
from settled.client import load_signing_key
from settled.services._cli_projections import SCHEMA_ENV_VAR, projection_names
from settled.services._cli_root import command, configure_logging, fail, resolve_settings

__all__ = ["api_command", "tokens_app"]

tokens_app = typer.Typer(no_args_is_help=True, help="Bearer tokens of the HTTP API: principal and scopes.")

_SCHEMA = typer.Option(None, "--schema", envvar=SCHEMA_ENV_VAR, help="Projection schema (default: the namespace).")


def _store(schema: str | None) -> TokenStore:
    settings = resolve_settings(kafka=False, postgres=True)
    names = projection_names(settings, schema)
    return TokenStore(settings.postgres_dsn, default_tokens_schema(names.base))


@tokens_app.command("create")
@command
def create(
    principal: str = typer.Argument(..., metavar="PRINCIPAL", help="Who the token speaks for."),
    scope: list[str] = typer.Option(  # noqa: B008
        ..., "--scope", help="submit, read, approve, resolve or admin (repeatable)."
    ),
    schema: str | None = _SCHEMA,
) -> None:
    """Create a token; print it once as a JSON line (only its SHA-256 digest is stored)."""
    scopes = parse_scopes(tuple(scope))
    token_id, token = _store(schema).create(principal, scopes)
    out = {"token_id": token_id, "principal": principal, "scopes": sorted(s.value for s in scopes), "token": token}
    sys.stdout.write(json.dumps(out) + "\n")


@tokens_app.command("list")
@command
def list_tokens(schema: str | None = _SCHEMA) -> None:
    """List tokens (never their secrets) as JSON lines."""
    for info in _store(schema).list():
        row = {
            "token_id": info.token_id,
            "principal": info.principal,
            "scopes": list(info.scopes),
            "created_at": info.created_at.isoformat(),
            "revoked_at": None if info.revoked_at is None else info.revoked_at.isoformat(),
        }
        sys.stdout.write(json.dumps(row) + "\n")


@tokens_app.command("revoke")
@command
def revoke(
    token_id: str = typer.Argument(..., metavar="TOKEN_ID", help="The token's id (`settled tokens list`)."),
    schema: str | None = _SCHEMA,
) -> None:
    """Revoke a token: requests bearing it answer 401 from now on."""
    _store(schema).revoke(token_id)


@command
def api_command(
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
    port: int = typer.Option(8080, "--port", help="TCP port to listen on."),
    schema: str | None = _SCHEMA,
    submit_timeout_s: float = typer.Option(10.0, "--submit-timeout-s", help="Deadline of a receipt (then 504)."),
    approver_key: str | None = typer.Option(None, "--approver-key", help="Private key file signing approvals."),
    approver_key_id: str = typer.Option("api", "--approver-key-id", help="Its id in App.approver_keys."),
    resolver_key: str | None = typer.Option(None, "--resolver-key", help="Private key file signing resolutions."),
    resolver_key_id: str = typer.Option("api", "--resolver-key-id", help="Its id in App.resolver_keys."),
    signing_key: str | None = typer.Option(
        None, "--signing-key", help="Private key file signing every record (access checked by the workers)."
    ),
    signing_key_id: str = typer.Option("api", "--signing-key-id", help="Its id in App.api_keys."),
    log_level: str = typer.Option("INFO", "--log-level", help="Log level."),
    openapi: bool = typer.Option(False, "--openapi", help="Print the OpenAPI document and exit."),
) -> None:
    """Serve the HTTP API (needs the http extra): submissions, reads from the projection, commands."""
    try:
        from settled.api._app import ApiConfig
        from settled.api._server import openapi_document, openapi_text, serve
    except ImportError as exc:
        fail(BadInputError(f"settled api needs the http extra (pip install 'settled[http]'): {exc}"))
    if openapi:
        sys.stdout.write(openapi_text(openapi_document()))
        return
    if submit_timeout_s <= 0:
        fail(BadInputError(f"--submit-timeout-s must be positive, got {submit_timeout_s}"))
    configure_logging(log_level)
    settings = resolve_settings(kafka=True, postgres=True)
    names = projection_names(settings, schema)
    config = ApiConfig(
        settings=settings,
        names=names,
        tokens_schema=default_tokens_schema(names.base),
        submit_timeout_s=submit_timeout_s,
        approver_key=None if approver_key is None else load_signing_key(approver_key),
        approver_key_id=approver_key_id,
        resolver_key=None if resolver_key is None else load_signing_key(resolver_key),
        resolver_key_id=resolver_key_id,
        signing_key=None if signing_key is None else load_signing_key(signing_key),
        signing_key_id=signing_key_id,
    )
    serve(config, host=host, port=port, log_level=log_level.lower())
