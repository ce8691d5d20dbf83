"""Tool results held across a partition drop go to the next claim only when it directly follows (issue 25 item 5).

`Worker._hand_over_held` gives the dropped owner's uncommitted tool results to the new claim's conductor when the
claim's epoch is the dropped owner's plus one (no other owner claimed the partition in between, so none can have
classified the calls); otherwise they are dropped and the log's owner classifies the calls. Real `Worker`,
`Conductor` and `PartitionOwner` objects, no Kafka (nothing here talks to it).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from settled._settings import Settings
from settled.processors import Conductor, LedgerDecider, Worker
from settled.processors._conductor import HeldSettlement
from settled.protocol import PartitionState
from settled.schemas import Codec, ToolCallSettled, json_digest
from tests.unit.processors.test_partition_stage import owner
from tests.unit.protocol._sim import T0


def _agent(run: object) -> str:
    raise AssertionError("no run is started here")


@pytest.mark.parametrize(("epoch", "adopted"), [(2, True), (3, False), (1, False)])
def test_held_results_go_to_the_claim_that_directly_follows_the_dropped_owner(epoch: int, adopted: bool) -> None:
    settings = Settings(namespace="unit-held", kafka_bootstrap="127.0.0.1:1", partitions=1)
    worker: Worker[PartitionState] = Worker(
        settings=settings, decider_factory=lambda p: LedgerDecider(partition=p, partition_count=1)
    )
    with ThreadPoolExecutor(1) as pool:
        conductor = Conductor(owner=owner(Codec(), fast=True), agent=_agent, pool=pool, clock=lambda: T0)
        result = '{"charged":7}'
        settled = ToolCallSettled(
            submission_id="s1", attempt_id="a1", call_id="s1#0", result_json=result, result_digest=json_digest(result)
        )
        held = (HeldSettlement("c1", "s1", (settled,)),)
        worker._held[0] = (1, held)  # dropped at epoch 1
        worker._hand_over_held(0, epoch, conductor)
        assert conductor._adopted == (list(held) if adopted else [])
        assert 0 not in worker._held  # handed over or dropped, never kept for a later claim
