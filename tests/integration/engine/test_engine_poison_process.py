"""A poison submission on one partition, healthy ones on another, one worker process (issue 6; docs/design.md §5).

"A death is charged only to an attempt that ran alone: after an unexplained death the new owner resumes the
interrupted attempts one at a time" — in the whole worker process, not per partition (`ResumeGate`): a worker owning
both partitions must not resume a healthy attempt of one partition while the poison one of the other runs, or the
poison's next death is charged to the healthy attempt too (with ``max_attempts`` 3 it would dead-letter it).

Two partitions, one worker at a time, restarted by the test after every death like a supervisor would.
"""

from __future__ import annotations

from collections import Counter

import pytest

from settled._settings import Settings
from settled.schemas import SettlementOutcome
from tests._promise import promise
from tests.integration.engine._helpers import plan, send, settled, settlements, supervise_until_settled
from tests.integration.engine.conftest import SpawnWorker
from tests.integration.helpers import conversations_on, proposal

pytestmark = [pytest.mark.integration, pytest.mark.chaos, pytest.mark.partitions(2)]


def test_a_poison_submission_resumes_alone_in_the_process_and_its_neighbours_on_another_partition_complete(
    topics: Settings, spawn_worker: SpawnWorker
) -> None:
    s = topics
    healthy = [proposal(c, value=plan({"sleep_s": 1.0})) for c in conversations_on(0, 2, "conv-h", 2)]
    (poison_conv,) = conversations_on(1, 2, "conv-p")
    poison = proposal(poison_conv, value=plan({"sleep_s": 0.5}, {"exit": 1}))
    everyone = [*healthy, poison]
    send(s, *everyone)  # all four run at once on the first worker, which the poison one kills
    deaths, _ = supervise_until_settled(s, everyone, spawn_worker, max_deaths=5, timeout_s=200, poll_s=0.3)
    result = settled(s, poison.submission_id)
    assert result is not None
    promise(
        "DUR-014.poison-fails",
        result.outcome is SettlementOutcome.FAILED and result.attempt_count == 3,
        f"the poison submission: {result}",
    )
    for p in healthy:
        r = settled(s, p.submission_id)
        # Charged once: for the first death, which interrupted every attempt then running (docs/design.md §5).
        promise(
            "DUR-014.neighbours-complete",
            r is not None and r.outcome is SettlementOutcome.COMPLETED and r.attempt_count == 2,
            f"a healthy submission on the other partition: {r}",
        )
    assert deaths == 3, f"{deaths} deaths: one per poison attempt"
    counts = Counter(r.submission_id for r in settlements(s))
    assert counts == Counter({p.submission_id: 1 for p in everyone}), counts
