"""The committed OpenAPI document is the one the API serves (issue 20 item 1)."""

from __future__ import annotations

import json
from pathlib import Path

from settled.api._server import openapi_document, openapi_text

DOC = Path(__file__).resolve().parents[3] / "docs" / "openapi.json"


def test_the_committed_openapi_document_is_the_served_one() -> None:
    served = openapi_text(openapi_document())
    committed = DOC.read_text(encoding="utf-8")
    assert committed == served, (
        "docs/openapi.json differs from the API's document: regenerate it with "
        "`settled api --openapi > docs/openapi.json` and review the difference"
    )


def test_every_route_answers_problems_and_needs_a_bearer_token() -> None:
    doc = json.loads(DOC.read_text(encoding="utf-8"))
    assert doc["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    for path, methods in doc["paths"].items():
        assert path.startswith("/v1/"), path
        for method, op in methods.items():
            assert op.get("security") == [{"HTTPBearer": []}], (method, path)
            assert "application/problem+json" in op["responses"]["404"]["content"], (method, path)
