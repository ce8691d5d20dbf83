"""The effects one checkpoint resolves wake a run loop once (`batched_wakeups`, `_Doorbell`), and none is lost."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any

import pytest

from settled.processors import batched_wakeups, defer_wakeup
from settled.runtime._pipeline import _Doorbell


class CountingLoop(asyncio.SelectorEventLoop):
    """A real event loop that counts its thread-safe wake-ups."""

    def __init__(self) -> None:
        super().__init__()
        self.rings = 0

    def call_soon_threadsafe(self, callback: Callable[..., Any], *args: Any, context: Any = None) -> Any:
        self.rings += 1
        return super().call_soon_threadsafe(callback, *args, context=context)


@pytest.fixture
def loop() -> Iterator[CountingLoop]:
    lp = CountingLoop()
    thread = threading.Thread(target=lp.run_forever, daemon=True)
    thread.start()
    yield lp
    lp.call_soon_threadsafe(lp.stop)
    thread.join(5)
    lp.close()


def _post_many(bell: _Doorbell, n: int, ran: list[int], done: threading.Event) -> None:
    for i in range(n):
        fut: Future[None] = Future()

        def record(_f: Future[None], i: int = i) -> None:
            ran.append(i)
            if len(ran) == n:
                done.set()

        bell.post(record, fut)


def test_a_batch_of_resolutions_wakes_the_loop_once_at_its_end_and_runs_every_callback(loop: CountingLoop) -> None:
    bell = _Doorbell(loop)
    ran: list[int] = []
    done = threading.Event()
    with batched_wakeups():
        _post_many(bell, 50, ran, done)
        assert loop.rings == 0 and ran == [], "the loop was woken inside the batch"
    assert done.wait(5), f"only {len(ran)} of 50 callbacks ran"
    assert ran == list(range(50)) and loop.rings == 1


def test_outside_a_batch_each_post_rings_unless_a_ring_is_already_due(loop: CountingLoop) -> None:
    bell = _Doorbell(loop)
    ran: list[int] = []
    done = threading.Event()
    _post_many(bell, 1, ran, done)
    assert done.wait(5) and loop.rings == 1
    assert not defer_wakeup(lambda: None), "no batch is open: nothing may be deferred"


def test_nested_batches_join_the_outermost() -> None:
    woken: list[str] = []
    with batched_wakeups():
        with batched_wakeups():
            assert defer_wakeup(lambda: woken.append("inner"))
        assert woken == []
    assert woken == ["inner"]
