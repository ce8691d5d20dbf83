"""The HTTP API's ``/metrics`` (issue 21 item 2): request counts by route template and status, durations.

The app is driven in process (Starlette's test client, no lifespan: nothing here reaches Kafka or PostgreSQL); the
scrape is parsed with ``prometheus_client``'s own parser.
"""

from __future__ import annotations

from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from settled._settings import Settings
from settled.api._app import ApiConfig, create_app
from settled.projections import ProjectionNames


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_requests_are_counted_by_route_template_and_status_without_ids() -> None:
    config = ApiConfig(settings=Settings(), names=ProjectionNames("settled"), tokens_schema="settled__tokens")
    http = TestClient(create_app(config))
    assert http.get("/v1/conversations/conv-secret/runs/run-secret").status_code == 401  # no token
    assert http.get("/no/such/path").status_code == 404
    scrape = http.get("/metrics")
    assert scrape.status_code == 200 and scrape.headers["content-type"].startswith("text/plain")
    samples = _samples(scrape.text)
    runs = (("method", "GET"), ("route", "/v1/conversations/{cid}/runs/{rid}"), ("status", "401"))
    assert samples[("settled_http_requests_total", runs)] == 1
    assert samples[("settled_http_requests_total", (("method", "GET"), ("route", "unmatched"), ("status", "404")))] == 1
    count = (
        "settled_http_request_duration_seconds_count",
        (("method", "GET"), ("route", "/v1/conversations/{cid}/runs/{rid}")),
    )
    assert samples[count] == 1
    assert "secret" not in scrape.text  # ids never become label values
