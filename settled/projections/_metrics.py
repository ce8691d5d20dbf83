"""The projector's Prometheus metrics (issue 21 item 2; the list is in `settled._metrics`' module doc).

`ProjectionMetrics` counts what the projector commits (settlements by outcome: counted after the PostgreSQL
transaction that stores them commits, so a rolled-back chunk counts nothing and each settlement counts once per
process) and keeps each partition's lag. The gauges of things waiting for a person (open Unknowns and the oldest one's
age, pending approvals) are read from the projection at each scrape by `_WaitingCollector`, on a connection of its
own, so a scrape never touches the projector's transaction.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

import psycopg
from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from psycopg import sql

__all__ = ["ProjectionMetrics"]

#: Bound on connecting to PostgreSQL for one scrape, in seconds.
_SCRAPE_CONNECT_TIMEOUT_S = 5


class _WaitingCollector(Collector):
    """Reads the open Unknowns and pending approvals from the projection at each scrape."""

    def __init__(self, dsn: str, schema: str, clock: Callable[[], datetime]) -> None:
        self._dsn = dsn
        self._schema = schema
        self._clock = clock
        self._lock = threading.Lock()  # one scrape at a time on the collector's connection

    def describe(self) -> Iterable[GaugeMetricFamily]:
        return [
            GaugeMetricFamily("settled_unknown_calls_open", "Tool calls whose outcome is Unknown, not yet resolved."),
            GaugeMetricFamily(
                "settled_unknown_oldest_age_seconds", "Age of the oldest open Unknown tool call (0 when none), in s."
            ),
            GaugeMetricFamily("settled_approvals_pending", "Approvals runs asked for that nobody decided yet."),
        ]

    def collect(self) -> Iterable[GaugeMetricFamily]:
        with self._lock, psycopg.connect(self._dsn, connect_timeout=_SCRAPE_CONNECT_TIMEOUT_S) as conn:
            row = conn.execute(
                sql.SQL("SELECT count(*), min(unknown_since) FROM {}.tool_calls WHERE status = 'unknown'").format(
                    sql.Identifier(self._schema)
                )
            ).fetchone()
            pending = conn.execute(
                sql.SQL("SELECT count(*) FROM {}.approvals WHERE status = 'pending'").format(
                    sql.Identifier(self._schema)
                )
            ).fetchone()
        count, oldest = (0, None) if row is None else row
        age_s = 0.0
        if isinstance(oldest, datetime):
            since = oldest if oldest.tzinfo is not None else oldest.replace(tzinfo=UTC)
            age_s = max(0.0, (self._clock() - since).total_seconds())
        yield GaugeMetricFamily(
            "settled_unknown_calls_open", "Tool calls whose outcome is Unknown, not yet resolved.", value=int(count)
        )
        yield GaugeMetricFamily(
            "settled_unknown_oldest_age_seconds",
            "Age of the oldest open Unknown tool call (0 when none), in s.",
            value=age_s,
        )
        yield GaugeMetricFamily(
            "settled_approvals_pending",
            "Approvals runs asked for that nobody decided yet.",
            value=0 if pending is None else int(pending[0]),
        )


@dataclass
class ProjectionMetrics:
    """A projector process's metrics (module doc).

    Attributes:
        dsn: The PostgreSQL the projection lives in (the scrape-time gauges read it).
        schema: The projection schema written.
        clock: Returns "now" (aware UTC), for ages.
        registry: The registry they are registered on (serve it with `settled._metrics.serve_metrics`).
        settlements_total: Settlements projected by this process, by outcome.
        projection_lag_records: Per log partition, records (and transaction markers) not yet projected.
    """

    dsn: str
    schema: str
    clock: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))
    registry: CollectorRegistry = field(default_factory=lambda: CollectorRegistry(auto_describe=True))
    settlements_total: Counter = field(init=False)
    projection_lag_records: Gauge = field(init=False)

    def __post_init__(self) -> None:
        self.settlements_total = Counter(
            "settled_settlements",
            "Settlements projected by this process, by outcome (completed, failed, aborted).",
            ["outcome"],
            registry=self.registry,
        )
        self.projection_lag_records = Gauge(
            "settled_projection_lag_records",
            "Per log partition: the end of the log minus the projector's position, in records (transaction markers "
            "included).",
            ["partition"],
            registry=self.registry,
        )
        self.registry.register(_WaitingCollector(self.dsn, self.schema, self.clock))

    def settled(self, outcomes: Mapping[str, int]) -> None:
        """Count settlements a committed chunk stored.

        Args:
            outcomes: Outcome → settlements of that outcome in the chunk.
        """
        for outcome, n in outcomes.items():
            self.settlements_total.labels(outcome=outcome).inc(n)

    def lag(self, partition: int, records: int) -> None:
        """Set a partition's lag.

        Args:
            partition: The log partition.
            records: The end of the log minus the projector's position (records and transaction markers).
        """
        self.projection_lag_records.labels(partition=str(partition)).set(max(0, records))
