"""The provisional stream across a worker kill, followed by `Client.stream` (issue 19 item 2).

A ``settled worker`` child runs `tests/integration/engine/stream_app.py`; it waits at ``engine.after_step_commit``
(its k-th hit, k drawn from a logged seed) until the followers have read its parts, and is killed there. A second
worker takes the run over: it replays the recorded steps without publishing and publishes from its first live
position under its own attempt. One follower reads throughout; another reads the first part, disconnects, and
reconnects from that part's cursor after the kill.
"""

from __future__ import annotations

import os
import random

import pytest

from settled._settings import Settings
from settled.client import Client, Part, StreamItem, Superseded
from settled.schemas import SettlementOutcome
from tests.integration.engine._helpers import TIMEOUT_S
from tests.integration.engine.conftest import SpawnWorker

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

APP = "tests.integration.engine.stream_app:app"
STEPS = 4


def test_a_follower_across_a_worker_kill_sees_the_failed_attempt_superseded_and_a_cursor_misses_nothing(
    topics: Settings, spawn_worker: SpawnWorker
) -> None:
    s = topics
    seed = int(os.environ.get("SETTLED_TEST_SEED", random.randrange(1 << 30)))
    k = random.Random(seed).randint(1, STEPS - 1)  # the kill after the k-th step's commit
    print(f"SETTLED_TEST_SEED={seed}: kill at engine.after_step_commit hit {k}")
    a = spawn_worker("a", app=APP, failpoints=f"engine.after_step_commit={k}*pause(60s)")
    with Client(s) as client:
        receipt = client.submit("conv-stream", {"steps": STEPS})
        with client.stream(receipt, timeout_s=TIMEOUT_S) as whole:
            reconnecting = client.stream(receipt, timeout_s=TIMEOUT_S)
            first = next(reconnecting)
            reconnecting.close()  # a disconnect after one item
            assert a.control is not None
            a.control.wait_reached("engine.after_step_commit", TIMEOUT_S)
            # Attempt 1 published its start and the parts after steps 0..k-2 before it stopped at step k-1's commit.
            a1 = [{"at": "start"}, *({"after": i} for i in range(k - 1))]
            seen: list[StreamItem] = [next(whole) for _ in a1]
            a.kill()
            a.wait(30)
            spawn_worker("b", app=APP)
            seen.extend(whole)
            settlement = whole.settlement
        with client.stream(receipt, cursor=first.cursor, timeout_s=TIMEOUT_S) as resumed:
            rest = list(resumed)
    assert settlement is not None and settlement.outcome is SettlementOutcome.COMPLETED, settlement
    parts = [i for i in seen if isinstance(i, Part)]
    markers = [i for i in seen if isinstance(i, Superseded)]
    assert [(p.attempt, p.data) for p in parts[: len(a1)]] == [(1, d) for d in a1]
    assert [(m.attempt, m.by_attempt) for m in markers] == [(1, 2)], seen
    assert seen[len(a1)] == markers[0], "the marker comes before the new attempt's first part"
    # Attempt 2 replayed steps 0..k-1 silently; its parts are those after steps k-1..n-1, once each, in order.
    final = [(p.attempt, p.seq, p.data) for p in seen[len(a1) + 1 :] if isinstance(p, Part)]
    assert final == [(2, j, {"after": i}) for j, i in enumerate(range(k - 1, STEPS))], seen
    assert isinstance(first, Part) and first == seen[0]
    assert [first, *rest] == seen, "the reconnect from the first part's cursor yields exactly what followed it"
