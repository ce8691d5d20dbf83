"""Running the API under uvicorn, and its OpenAPI document (``settled api``; issue 20)."""

from __future__ import annotations

import json
from typing import Any

import uvicorn

from settled._settings import Settings
from settled.api._app import ApiConfig, create_app
from settled.projections._schema import ProjectionNames

__all__ = ["openapi_document", "openapi_text", "serve"]


def serve(config: ApiConfig, *, host: str, port: int, log_level: str = "info") -> None:
    """Serve the API until interrupted (SIGINT/SIGTERM end it gracefully).

    Args:
        config: What it serves.
        host: The address to listen on.
        port: The TCP port (0: any free one; the chosen one is logged).
        log_level: uvicorn's log level.
    """
    uvicorn.run(create_app(config), host=host, port=port, log_level=log_level, access_log=False)


def openapi_document() -> dict[str, Any]:
    """The API's OpenAPI document (independent of settings: routes and models only).

    Returns:
        The document as FastAPI generates it.
    """
    config = ApiConfig(settings=Settings(), names=ProjectionNames("settled"), tokens_schema="settled__tokens")
    return create_app(config).openapi()


def openapi_text(document: dict[str, Any]) -> str:
    """The committed form of an OpenAPI document: sorted keys, two-space indent, a final newline.

    Args:
        document: The document.

    Returns:
        Its text, as ``docs/openapi.json`` holds it.
    """
    return json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
