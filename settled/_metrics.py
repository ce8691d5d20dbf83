"""Prometheus metrics of settled's long-running processes (issue 21 item 2; docs/architecture.md, "Metrics").

Each process builds its own metrics object (`WorkerMetrics`, `settled.projections.ProjectionMetrics`) on a registry
of its own, and serves it on ``/metrics`` when ``SETTLED_METRICS_PORT`` is set (`serve_metrics`); nothing is
registered or served at import. Names carry their unit (``_seconds``, ``_records``) as Prometheus' conventions ask.

- Worker (``settled worker``): ``settled_commit_duration_seconds``, a histogram of the owners' checkpoint
  transactions that committed batches (begin to commit: one partition's batches and input offsets);
  ``settled_transaction_records``, a histogram of the records each committed transaction held (0: offsets only);
  ``settled_transaction_call_seconds_total{call}``, the seconds the worker's loop spent in each Kafka call of those
  transactions (docs/architecture.md, "Records per transaction").
- Projector (``settled projections run``): ``settled_settlements_total{outcome}``, settlements projected by this
  process (each committed settlement once: they are counted with the projection transaction that stores them);
  ``settled_projection_lag_records{partition}``; and, read from the projection at each scrape,
  ``settled_unknown_calls_open``, ``settled_unknown_oldest_age_seconds`` and ``settled_approvals_pending``.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server

__all__ = ["COMMIT_BUCKETS_S", "TRANSACTION_RECORDS_BUCKETS", "MetricsServer", "WorkerMetrics", "serve_metrics"]

#: Histogram buckets of a commit's duration, in seconds: a local broker commits in a few ms, a loaded one in 100s.
COMMIT_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
#: Histogram buckets of a transaction's record count: one per count up to 10 (where a loaded worker's transactions
#: lie), then coarser.
TRANSACTION_RECORDS_BUCKETS = (0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 15, 20, 30, 50, 100, 200, 500, 1000)


@dataclass(frozen=True)
class MetricsServer:
    """A running ``/metrics`` endpoint.

    Attributes:
        port: The port it listens on (the one asked for, or the one the OS chose for port 0).
        server: The HTTP server.
        thread: Its serving thread (a daemon).
    """

    port: int
    server: WSGIServer
    thread: threading.Thread

    def close(self) -> None:
        """Stop serving and close the socket."""
        self.server.shutdown()
        self.server.server_close()


def serve_metrics(registry: CollectorRegistry, host: str, port: int) -> MetricsServer:
    """Serve ``registry`` on ``http://host:port/metrics`` from a daemon thread.

    Args:
        registry: The process's metrics.
        host: The address to bind (``SETTLED_METRICS_HOST``).
        port: The port (``SETTLED_METRICS_PORT``); 0 lets the OS choose.

    Returns:
        The running server.

    Raises:
        OSError: The address cannot be bound (in use, not local).
    """
    server, thread = start_http_server(port, addr=host, registry=registry)
    return MetricsServer(port=int(server.server_port), server=server, thread=thread)


@dataclass
class WorkerMetrics:
    """A worker process's metrics (module doc).

    Attributes:
        registry: The registry they are registered on (serve it with `serve_metrics`).
        commit_duration_seconds: Checkpoint transactions that committed something, begin to commit.
        transaction_records: Records per committed transaction.
        transaction_call_seconds: Seconds spent in the committed transactions' Kafka calls, by call.
    """

    registry: CollectorRegistry = field(default_factory=lambda: CollectorRegistry(auto_describe=True))
    commit_duration_seconds: Histogram = field(init=False)
    transaction_records: Histogram = field(init=False)
    transaction_call_seconds: Counter = field(init=False)

    def __post_init__(self) -> None:
        self.commit_duration_seconds = Histogram(
            "settled_commit_duration_seconds",
            "Duration of the owners' checkpoint transactions that committed batches, begin to commit, in seconds.",
            buckets=COMMIT_BUCKETS_S,
            registry=self.registry,
        )
        self.transaction_records = Histogram(
            "settled_transaction_records",
            "Records held by each committed transaction of the owners' appenders (0: input offsets only).",
            buckets=TRANSACTION_RECORDS_BUCKETS,
            registry=self.registry,
        )
        self.transaction_call_seconds = Counter(
            "settled_transaction_call_seconds",
            "Seconds the worker spent in each Kafka call of its committed transactions.",
            ["call"],
            registry=self.registry,
        )

    def transaction_committed(self, records: int, call_s: Mapping[str, float]) -> None:
        """Observe one committed transaction (`settled.producers.TransactionObserver`).

        Args:
            records: The records it held.
            call_s: Seconds spent in each of its Kafka calls, by call name.
        """
        self.transaction_records.observe(records)
        for call, seconds in call_s.items():
            self.transaction_call_seconds.labels(call).inc(seconds)
