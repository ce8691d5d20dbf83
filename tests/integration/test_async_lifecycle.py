"""`AsyncClient.lifecycle_events` against a real broker and an in-process worker (issue 17 item 5).

Two agent runs on two partitions: the async subscriber, positioned before they are submitted, yields each run's
``durable.started`` then ``durable.completed`` (read until both terminal events: the barrier), only the types its
pattern matches; closed, it ends.
"""

from __future__ import annotations

import asyncio

import pytest

from settled._settings import Settings
from settled.client import AsyncClient
from settled.runtime import App
from settled.schemas import LifecycleEvent
from settled.services._worker_service import build_worker
from settled.testing.echo import EchoAgent
from tests.integration.helpers import running

pytestmark = [pytest.mark.integration, pytest.mark.partitions(2)]

TIMEOUT_S = 60.0


def test_the_async_subscriber_yields_each_runs_events_in_order_and_only_matching_types(topics: Settings) -> None:
    worker = build_worker(topics, App(agent=EchoAgent(delay_s=0.0)))

    async def scenario() -> None:
        async with AsyncClient(topics, default_timeout_s=TIMEOUT_S) as client:
            # Positioned when awaited: before the runs exist.
            events = await client.lifecycle_events("durable.*", idle_timeout_s=TIMEOUT_S)
            only_done = await client.lifecycle_events("durable.completed", idle_timeout_s=TIMEOUT_S)
            receipts = [await client.submit(f"conv-life-{i}", {"n": i}) for i in range(2)]
            runs = {r.request_id for r in receipts}
            seen: list[LifecycleEvent] = []
            while sum(e.type == "durable.completed" for e in seen) < len(runs):  # the barrier: both terminal
                seen.append(await asyncio.wait_for(anext(events), TIMEOUT_S))
            await events.aclose()
            by_run = {sid: [e.type for e in seen if e.submission_id == sid] for sid in runs}
            assert by_run == {sid: ["durable.started", "durable.completed"] for sid in runs}, by_run
            assert len({e.event_id for e in seen}) == len(seen)
            async with only_done:
                completed = [await asyncio.wait_for(anext(only_done), TIMEOUT_S) for _ in runs]
            assert {e.submission_id for e in completed} == runs
            assert {e.type for e in completed} == {"durable.completed"}
            with pytest.raises(StopAsyncIteration):
                await anext(events)  # closed

    with running(worker):
        asyncio.run(scenario())
