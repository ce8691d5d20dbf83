"""The HTTP API's own Prometheus metrics, served on its ``/metrics`` (issue 21 item 2).

`settled api` is a long-running process like the worker and the projector; it serves its figures on its own port and
path, ``GET /metrics`` (no token: aggregate figures only, no id of anything), from a registry of the app's own:

- ``settled_http_requests_total{method, route, status}``: requests answered, by route template (``/v1/runs``, not the
  concrete path, so ids never become label values; ``unmatched`` for a path no route serves);
- ``settled_http_request_duration_seconds{method, route}``: how long answering took, in seconds.

The settlement, Unknown, approval and lag figures come from the worker and the projector (`settled._metrics`).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from starlette.requests import Request
from starlette.responses import Response

__all__ = ["ApiMetrics"]

#: Buckets of a request's duration, in seconds (a read answers in ms; a long poll waits up to its ``wait_s``).
_DURATION_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class ApiMetrics:
    """The API app's registry and its request figures (module doc).

    Attributes:
        registry: The app's own registry.
    """

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._requests = Counter(
            "settled_http_requests",
            "HTTP requests the API answered, by method, route template and status.",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self._duration = Histogram(
            "settled_http_request_duration_seconds",
            "How long the API took to answer a request, by method and route template, in seconds.",
            ["method", "route"],
            buckets=_DURATION_BUCKETS_S,
            registry=self.registry,
        )

    async def middleware(self, request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        """Time and count one request (an HTTP middleware of the app).

        Args:
            request: The request.
            call_next: The rest of the app.

        Returns:
            The app's response, unchanged.
        """
        started_s = time.perf_counter()
        response = await call_next(request)
        route = request.scope.get("route")
        template = str(getattr(route, "path", "unmatched"))
        self._duration.labels(request.method, template).observe(time.perf_counter() - started_s)
        self._requests.labels(request.method, template, str(response.status_code)).inc()
        return response

    def response(self) -> Response:
        """The ``/metrics`` answer: the registry in Prometheus' text format.

        Returns:
            The response.
        """
        return Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST)
