"""`AsyncClient` against a real broker and a real worker (issue 24 item 5; `settled/client/_async.py`).

Many submissions and waits run concurrently on one event loop; the waits hold no thread while they wait (the thread
count stays flat with 60 waits open), each gets its own settlement, a wait past its deadline raises
`SettlementTimeoutError` naming the submission, and a settlement read before its wait began is returned at once.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from settled._settings import Settings
from settled.client import AsyncClient, SettlementTimeoutError
from settled.runtime import App
from settled.schemas import SettlementOutcome, canonical_json
from settled.services._worker_service import build_worker
from settled.testing.echo import EchoAgent
from tests.integration.helpers import running

pytestmark = [pytest.mark.integration, pytest.mark.partitions(2)]

TIMEOUT_S = 60.0


def test_concurrent_submits_and_waits_on_one_loop_hold_no_thread_per_wait(topics: Settings) -> None:
    worker = build_worker(topics, App(agent=EchoAgent(delay_s=0.0)))

    async def scenario() -> None:
        async with AsyncClient(topics, default_timeout_s=TIMEOUT_S, request_threads=8) as client:
            slow = await asyncio.gather(*(client.submit(f"conv-slow-{i}", {"n": i, "delay_s": 3}) for i in range(60)))
            threads_before = threading.active_count()
            waits = [asyncio.ensure_future(client.wait(r)) for r in slow]
            reader = client.client.settlements_reader

            async def registered() -> None:
                while reader.waiting < len(slow):  # every wait registered with the shared reader
                    await asyncio.sleep(0.01)

            await asyncio.wait_for(registered(), TIMEOUT_S)
            assert not any(w.done() for w in waits), "the 3 s runs cannot have settled yet"
            # 60 open waits: at most the 8 request threads and the one settlements reader beyond what ran before.
            assert threading.active_count() <= threads_before + 9, threading.enumerate()
            settled = await asyncio.gather(*waits)
            assert [s.reply_json for s in settled] == [
                canonical_json({"attempt": 1, "echo": {"delay_s": 3, "n": i}}) for i in range(60)
            ]
            again = await client.wait(slow[0])  # read before this wait began: from the reader's cache
            assert again.submission_id == slow[0].request_id
            assert again.outcome is SettlementOutcome.COMPLETED

    with running(worker):
        asyncio.run(scenario())


def test_a_wait_past_its_deadline_raises_naming_the_submission(topics: Settings) -> None:
    worker = build_worker(topics, App(agent=EchoAgent(delay_s=0.0)))

    async def scenario() -> None:
        async with AsyncClient(topics, default_timeout_s=TIMEOUT_S) as client:
            receipt = await client.submit("conv-late", {"delay_s": 30})
            with pytest.raises(SettlementTimeoutError, match=receipt.request_id):
                await client.wait(receipt, timeout_s=1.0)

    with running(worker):
        asyncio.run(scenario())
