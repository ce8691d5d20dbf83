"""A submission while the broker is stopped answers 504 naming its key, never a false success (issue 20 item 1).

Its own broker (`private_broker`), stopped and started again on the same port; a real ``settled worker`` and a real
``settled api`` child. After the restart the same request returns the original receipt: one admission for the key.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from settled._settings import Settings
from settled.api import Scope, TokenStore
from settled.producers import provision_topics
from settled.schemas import SubmissionAdmitted
from settled.services._devstack import KafkaBroker
from settled.testing import ApiProcess, WorkerProcess
from tests.integration.engine._helpers import log_events, plan
from tests.integration.engine.engine_app import WORLD_ENV
from tests.integration.helpers import CODEC

pytestmark = [pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[3]


def test_broker_stopped_answers_504_naming_the_key_and_the_same_request_after_the_restart_returns_the_receipt(
    private_broker: Callable[..., KafkaBroker], postgres_dsn: str, tmp_path: Path
) -> None:
    broker = private_broker()
    broker.start()
    s = Settings(namespace=f"api-{uuid.uuid4().hex[:8]}", kafka_bootstrap=broker.bootstrap, postgres_dsn=postgres_dsn)
    s = s.model_copy(update={"partitions": 1})
    provision_topics(s, CODEC, datetime.now(UTC))
    schema = f"p_{uuid.uuid4().hex[:12]}"
    bearer = TokenStore(postgres_dsn, f"{schema}__tokens").create("alice", frozenset({Scope.SUBMIT}))[1]
    env = {WORLD_ENV: str(tmp_path / "world.sqlite")}
    app = "tests.integration.api.api_app:app"
    worker = WorkerProcess.start(s, app=app, log_path=tmp_path / "w.log", worker_id="w", env=env, cwd=ROOT)
    api = ApiProcess.start(s, schema=schema, log_path=tmp_path / "api.log", args=("--submit-timeout-s", "3"))
    url = "/v1/conversations/c-out/submissions"
    body = {"input": plan({"now": True})}
    try:
        with httpx.Client(base_url=api.url, headers={"Authorization": f"Bearer {bearer}"}, timeout=60) as h:
            warm = h.post(url, json=body, headers={"Idempotency-Key": "k0"})
            assert warm.status_code == 201, warm.text
            broker.stop()
            lost = h.post(url, json=body, headers={"Idempotency-Key": "k1"})
            assert lost.status_code == 504, lost.text  # never a false success, never a false failure
            problem = lost.json()
            assert problem["idempotency_key"] == "k1" and "'k1'" in problem["detail"], problem
            assert problem["category"] == "outcome_unknown"
            broker.start()
            if worker.poll() is not None:  # a worker may end on a long outage; a supervisor would restart it
                worker = WorkerProcess.start(
                    s, app=app, log_path=tmp_path / "w2.log", worker_id="w2", env=env, cwd=ROOT
                )
            deadline = time.monotonic() + 90
            while True:  # what the 504 tells the caller to do: the same request again
                again = h.post(url, json=body, headers={"Idempotency-Key": "k1"})
                if again.status_code != 504 or time.monotonic() > deadline:
                    break
            assert again.status_code in (200, 201), again.text
            receipt = again.json()
            assert receipt["idempotency_key"] == "k1" and receipt["outcome"] in ("admitted", "duplicate"), receipt
            once_more = h.post(url, json=body, headers={"Idempotency-Key": "k1"})
            assert once_more.status_code == 200 and once_more.json()["submission_id"] == receipt["submission_id"]
        admissions = [e for e in log_events(s) if isinstance(e, SubmissionAdmitted) and e.idempotency_key == "k1"]
        assert [e.submission_id for e in admissions] == [receipt["submission_id"]], admissions
    finally:
        api.stop()
        worker.kill()
        worker.wait(30)
