"""A worker started while its broker is down waits for it instead of exiting (a supervisor's restart loop).

Its own broker (`private_broker`): the topics are provisioned, the broker is stopped, and real ``settled worker``
children start against it. Each logs ``waiting for the broker`` with the cause and keeps trying with a bounded
backoff; the turn watchdog does not end it while it waits, SIGTERM stops it at once (exit 0), and once the broker is
back it serves a submission.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from settled._settings import Settings
from settled.client import Client
from settled.producers import provision_topics
from settled.schemas import ReceiptOutcome, SettlementOutcome
from settled.services._devstack import KafkaBroker, StackError
from settled.testing import WorkerProcess
from tests.harness.workers import start_worker
from tests.integration.helpers import CODEC

pytestmark = [pytest.mark.integration]

WAITING = "waiting for the broker"


def _logged_wait(worker: WorkerProcess, tries: int, timeout_s: float) -> dict[str, Any]:
    """The worker's ``waiting for the broker`` line of try ``tries``; fails when the worker ends or none comes."""
    deadline = time.monotonic() + timeout_s
    while True:
        lines = [line for line in worker.logged(WAITING) if line.get("tries") == tries]
        if lines:
            return lines[0]
        code = worker.poll()
        assert code is None, f"the worker ended with {code} instead of waiting for the broker:\n{worker.tail()}"
        assert time.monotonic() < deadline, f"no {WAITING!r} line of try {tries} in {timeout_s} s:\n{worker.tail()}"
        time.sleep(0.1)  # polling the log file for a line, not waiting for a state


def test_a_worker_started_while_the_broker_is_down_waits_for_it_then_serves(
    private_broker: Callable[..., KafkaBroker], namespace: str, tmp_path: Path
) -> None:
    broker = private_broker()
    broker.start()
    s = Settings(namespace=namespace, kafka_bootstrap=broker.bootstrap, partitions=1)
    provision_topics(s, CODEC, datetime.now(UTC))
    broker.stop()

    # A 1 s turn watchdog and 1 s admin calls: by its fifth try the worker has waited ~12 s in all, far past the
    # watchdog's bound of one try (1 s + 7 calls of 1 s); it is still alive, and SIGTERM ends it gracefully at once.
    quick = {"SETTLED_WORKER_TURN_WATCHDOG_S": "1", "SETTLED_KAFKA_CALL_TIMEOUT_S": "1"}
    first = start_worker(s, tmp_path / "w1.log", name="w1", env=quick)
    try:
        line = _logged_wait(first, 1, 60)
        assert line["level"] == "WARNING" and line["bootstrap"] == broker.bootstrap, line
        assert "transport" in line["cause"].lower() or "timed out" in line["cause"].lower(), line
        waits = [_logged_wait(first, tries, 60)["wait_s"] for tries in range(1, 6)]
        assert waits == [0.5, 1.0, 2.0, 4.0, 8.0], waits  # bounded backoff: doubling up to 10 s
        first.send_signal(signal.SIGTERM)
        started = time.monotonic()
        assert first.wait(30) == 0, first.tail()
        elapsed_s = time.monotonic() - started
        assert elapsed_s < 8.0, f"SIGTERM took {elapsed_s:.1f} s to stop a worker waiting for its broker"
        assert first.logged("worker stopped while waiting for the broker"), first.tail()
    finally:
        first.kill_and_wait()

    second = start_worker(s, tmp_path / "w2.log", name="w2")
    try:
        _logged_wait(second, 1, 60)
        try:  # a restarted broker JVM has been seen to exit right after starting on this shared machine: twice
            broker.start()
        except StackError:
            broker.start()
        with Client(s) as client:
            receipt = client.submit("conv-broker-wait", "hello", timeout_s=90)
            assert receipt.outcome is ReceiptOutcome.ADMITTED
            settlement = client.wait(receipt, 90)
        assert settlement.outcome is SettlementOutcome.COMPLETED, settlement
        assert second.poll() is None, second.tail()
        assert second.logged("the broker answered"), second.tail()
        assert second.stop(30) == 0, second.tail()
    finally:
        second.kill_and_wait()


def test_a_worker_whose_topics_are_missing_still_fails_at_once_naming_them(settings: Settings, tmp_path: Path) -> None:
    worker = start_worker(settings, tmp_path / "w.log", name="w")
    try:
        assert worker.wait(60) == 1, worker.tail()
        failed = worker.logged("worker failed: exiting with 1")
        assert failed and "topics missing" in failed[0]["exception"], worker.tail()
        assert f"{settings.topic('inbox')}" in failed[0]["exception"] and "settled topics create" in worker.tail()
        assert not worker.logged(WAITING), worker.tail()  # the broker answered: nothing to wait for
    finally:
        worker.kill_and_wait()
