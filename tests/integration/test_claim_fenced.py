"""A claim fenced by another producer of its ``transactional.id`` is claimed again, not abandoned (docs/design.md §3).

Between the claim's fence (appender ``open``, claim steps 2-3) and its first checkpoint (step 5), another producer
with the partition's ``transactional.id`` runs ``init_transactions`` — a zombie of an earlier owner, or a newer owner.
The claim's checkpoint is then fenced. The partition is still assigned to this worker and paused (claim step 1):
dropping the claim for good (what the worker did before a review found it) leaves it assigned, paused and unowned
until some unrelated rebalance, so nothing submitted to it is ever admitted. The worker must claim it again once a
session timeout has passed with the partition still assigned, as after a fenced checkpoint.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka import Producer

from settled import _failpoints
from settled._settings import Settings
from settled.client import Client
from settled.producers import producer_config, transactional_id
from settled.runtime import App
from settled.schemas import ReceiptOutcome
from settled.services._worker_service import build_worker
from settled.testing.echo import EchoAgent
from tests.integration.helpers import running

pytestmark = pytest.mark.integration


def test_a_claim_fenced_before_its_first_checkpoint_is_claimed_again_and_admits(
    topics: Settings, tmp_path: Path
) -> None:
    s = topics
    fp_dir = tmp_path / "fp"
    _failpoints.configure("owner.after_fence=1*pause(60s)", control_dir=fp_dir)
    control = _failpoints.FailpointControl(fp_dir)
    worker = build_worker(s, App(agent=EchoAgent(delay_s=0.0)))
    try:
        with running(worker), Client(s) as client:
            control.wait_reached("owner.after_fence", 60)
            zombie = Producer(producer_config(s, transactional_id=transactional_id(s, 0)))
            zombie.init_transactions(30)  # fences the claim's producer
            control.release("owner.after_fence")
            # The claim's checkpoint is fenced; a claim again after a session timeout admits this submission.
            receipt = client.submit("conv-fenced-claim", {"x": 1}, timeout_s=s.session_timeout_ms / 1000 + 30)
            assert receipt.outcome is ReceiptOutcome.ADMITTED, receipt
            assert 0 in worker.owners, "the partition has no owner"
    finally:
        _failpoints.reset()
