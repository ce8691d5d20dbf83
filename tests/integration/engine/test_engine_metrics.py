"""Prometheus metrics of the worker and the projector (issue 21 item 2), scraped over HTTP from real processes.

A ``settled worker`` child runs the engine test app and a ``settled projections run`` child projects its log, both
with ``SETTLED_METRICS_PORT``. After completed submissions, aborted ones, one that leaves a tool call Unknown (its tool
server refuses connections) and one that waits for an approval: the projector's ``settled_settlements_total`` by
outcome equals the settlements topic's count by outcome, its Unknown gauges show the open call with an age that grows,
its approvals gauge the pending one, and the worker's commit histogram has observed the commits. Scrapes are parsed
with ``prometheus_client``'s own text parser.
"""

from __future__ import annotations

import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from settled._settings import Settings
from settled.client import Client
from settled.projections import ProjectionNames
from settled.services._devstack import free_port
from tests.integration.engine._helpers import TIMEOUT_S, plan, settlements
from tests.integration.engine.conftest import SpawnWorker
from tests.integration.engine.engine_app import flag, world
from tests.integration.helpers import fresh_projection, wait_for
from tests.integration.test_projections import spawn_projector

pytestmark = [pytest.mark.integration]


@pytest.fixture
def names(postgres_dsn: str) -> Iterator[ProjectionNames]:
    with fresh_projection(postgres_dsn) as n:
        yield n


def _scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Sample (name, sorted labels) → value, from ``http://127.0.0.1:port/metrics``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def _settled_by_outcome(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> dict[str, int]:
    return {
        dict(labels)["outcome"]: int(value)
        for (name, labels), value in samples.items()
        if name == "settled_settlements_total"
    }


def _lags(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> dict[str, float]:
    return {
        dict(labels)["partition"]: value
        for (name, labels), value in samples.items()
        if name == "settled_projection_lag_records"
    }


def _reachable(port: int) -> bool:
    try:
        _scrape(port)
    except OSError:
        return False
    return True


def test_scraped_counters_equal_the_settlements_topic_and_the_unknown_gauges_age(
    topics: Settings, spawn_worker: SpawnWorker, world_db: Path, tmp_path: Path, names: ProjectionNames
) -> None:
    s = topics
    with world(str(world_db)) as db:
        flag(db, "server_down", True)
    worker_port, projector_port = free_port(), free_port()
    spawn_worker("w", env={"SETTLED_METRICS_PORT": str(worker_port)})
    projector = spawn_projector(s, names, tmp_path, "projector", env={"SETTLED_METRICS_PORT": str(projector_port)})
    try:
        with Client(s, principal="ops", default_timeout_s=TIMEOUT_S) as client:
            stuck = client.submit("conv-unknown", plan({"tool": "remote_once"}))
            asking = client.submit("conv-approval", plan({"approve": "refund", "description": "order o-1"}))
            done = [client.submit(f"conv-done-{i}", plan()) for i in range(5)]
            slow = [client.submit(f"conv-abort-{i}", plan({"sleep_s": 60})) for i in range(3)]
            for receipt in slow:
                client.abort(receipt.conversation_id, receipt.request_id, reason="metrics test abort")
            for receipt in [*done, *slow]:
                client.wait(receipt)
        topic = Counter(r.outcome.value for r in settlements(s))
        assert topic == {"completed": 5, "aborted": 3}, topic  # the Unknown one holds its lane, unsettled
        assert {stuck.request_id, asking.request_id}.isdisjoint(r.submission_id for r in settlements(s))

        wait_for(lambda: _reachable(projector_port), TIMEOUT_S, "the projector's /metrics")
        wait_for(
            lambda: _settled_by_outcome(_scrape(projector_port)) == dict(topic),
            TIMEOUT_S,
            f"the projector's settlements counter to reach the topic's {dict(topic)}",
        )
        wait_for(
            lambda: _scrape(projector_port)[("settled_unknown_calls_open", ())] == 1,
            TIMEOUT_S,
            "the open Unknown in the projector's gauge",
        )
        wait_for(
            lambda: _scrape(projector_port)[("settled_approvals_pending", ())] == 1,
            TIMEOUT_S,
            "the pending approval in the projector's gauge",
        )
        first_age_s = _scrape(projector_port)[("settled_unknown_oldest_age_seconds", ())]
        assert first_age_s > 0
        wait_for(
            lambda: _scrape(projector_port)[("settled_unknown_oldest_age_seconds", ())] > first_age_s,
            TIMEOUT_S,
            "the Unknown's age to grow",
        )
        wait_for(
            lambda: _lags(_scrape(projector_port)) == {"0": 0.0},
            TIMEOUT_S,
            "the projector's lag gauge of its one partition to read 0 once it caught up",
        )
        worker = _scrape(worker_port)
        assert worker[("settled_commit_duration_seconds_count", ())] > 0
        assert worker[("settled_commit_duration_seconds_sum", ())] > 0
        # Each committed transaction's record count (a checkpoint that committed batches holds one at least).
        committing = worker[("settled_commit_duration_seconds_count", ())]
        assert worker[("settled_transaction_records_count", ())] >= committing
        assert worker[("settled_transaction_records_sum", ())] > 0
        assert worker[("settled_transaction_call_seconds_total", (("call", "commit_transaction"),))] > 0
    finally:
        projector.proc.terminate()
        projector.proc.wait(timeout=30)
