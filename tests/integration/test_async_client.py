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
from settled.client import AsyncClient, RetryRejectedError, SettlementTimeoutError, SteerRejectedError
from settled.runtime import App
from settled.schemas import ReceiptOutcome, SettlementOutcome, canonical_json
from settled.services._worker_service import build_worker
from settled.testing.echo import EchoAgent
from tests.integration.engine.engine_app import RESOLVER_KEY_ID, RESOLVER_PRIVATE_KEY, RESOLVER_PUBLIC_B64
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


def test_steer_and_retry_submission_are_awaitable_and_answer_as_the_client_does(topics: Settings) -> None:
    app = App(agent=EchoAgent(delay_s=0.0), max_attempts=1, resolver_keys={RESOLVER_KEY_ID: RESOLVER_PUBLIC_B64})
    worker = build_worker(topics, app)
    signed = {"signing_key": RESOLVER_PRIVATE_KEY, "key_id": RESOLVER_KEY_ID}

    async def scenario() -> None:
        async with AsyncClient(topics, default_timeout_s=TIMEOUT_S) as client:
            slow = await client.submit("conv-steer", {"delay_s": 3})
            run_id = slow.request_id
            steered = await client.steer("conv-steer", run_id, "shorter, please", command_id="steer-1")
            assert steered.outcome is ReceiptOutcome.APPLIED, steered
            again = await client.steer("conv-steer", run_id, "shorter, please", command_id="steer-1")
            assert again.outcome is ReceiptOutcome.DUPLICATE, again
            await client.wait(slow)
            with pytest.raises(SteerRejectedError, match="already_terminal"):
                await client.steer("conv-steer", run_id, "too late")

            dead = await client.submit("conv-dead", {"raise": "always"})
            failed = await client.wait(dead)
            assert (failed.outcome, failed.error_type) == (SettlementOutcome.FAILED, "retry_budget_exhausted"), failed
            retried = await client.retry_submission("conv-dead", dead.request_id, command_id="retry-1", **signed)
            assert retried.outcome is ReceiptOutcome.APPLIED and retried.submission_seq == 2, retried
            assert retried.original_submission_id not in (None, dead.request_id), retried
            second = await client.retry_submission("conv-dead", dead.request_id, command_id="retry-2", **signed)
            assert second.outcome is ReceiptOutcome.DUPLICATE, second  # one retry per dead letter
            assert second.original_submission_id == retried.original_submission_id, second
            with pytest.raises(RetryRejectedError, match="not_dead_lettered"):
                await client.retry_submission("conv-steer", run_id, **signed)  # it completed

    with running(worker):
        asyncio.run(scenario())
