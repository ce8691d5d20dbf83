"""`AsyncClient`: the client for asyncio servers (issue 24 item 5).

A request (a submission or a command) produces one record and waits a few milliseconds for its receipt: it runs on a
small thread pool of the client's own, so an event loop is never blocked and its default executor is not taken. A
wait for a settlement takes no thread at all: it is an asyncio future that the client's one shared settlements reader
(`settled.client._waits`) completes through ``call_soon_threadsafe``, so a server can hold thousands of waits open.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from types import TracebackType
from typing import Any, ParamSpec, Self, TypeVar

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from settled._settings import Settings
from settled.client._client import Client
from settled.client._errors import ClientError, SettlementTimeoutError
from settled.client._lifecycle import LifecycleStream
from settled.schemas import LifecycleEvent, Receipt, SettlementRecord

__all__ = ["AsyncClient", "AsyncLifecycleStream"]

P = ParamSpec("P")
R = TypeVar("R")


class AsyncClient:
    """An asyncio façade over one `Client`: the same requests, awaitable (module doc).

    Build it inside or outside a running loop; use it from one event loop. Close it with ``await aclose()`` or
    ``async with``.

    Attributes:
        client: The synchronous client it drives (its settings, principal and timeouts apply).
    """

    def __init__(self, settings: Settings, *, request_threads: int = 32, **client_options: Any) -> None:
        """Build the client; nothing connects until the first request.

        Args:
            settings: Namespace and Kafka settings.
            request_threads: Threads that run requests (each waits for its receipt), i.e. requests in flight at once.
            **client_options: `Client`'s keyword arguments (``principal``, ``default_timeout_s``, ...).

        Raises:
            ValueError: ``request_threads`` is below 1, or a client option is out of range (named).
        """
        if request_threads < 1:
            raise ValueError(f"request_threads must be at least 1, got {request_threads}")
        self.client = Client(settings, **client_options)
        self._pool = ThreadPoolExecutor(max_workers=request_threads, thread_name_prefix="settled-async-request")

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self, timeout_s: float = 10.0) -> None:
        """Finish the requests in flight, then close the client (see `Client.close`).

        Args:
            timeout_s: Bound on the producer's final flush and on stopping the readers, in seconds.
        """
        await asyncio.get_running_loop().run_in_executor(None, self._close, timeout_s)

    def _close(self, timeout_s: float) -> None:
        self._pool.shutdown(wait=True)
        self.client.close(timeout_s)

    async def _run(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, functools.partial(fn, *args, **kwargs))

    async def lifecycle_events(
        self, pattern: str = "durable.*", *, idle_timeout_s: float | None = None, poll_s: float = 0.5, **options: Any
    ) -> AsyncLifecycleStream:
        """`Client.lifecycle_events`, awaitable: positioned when it returns, then iterated with ``async for``.

        Args:
            pattern: Which types to yield (``fnmatch``), e.g. ``"durable.*"``.
            idle_timeout_s: Stop after this long without a matching event, in seconds; ``None``: never stop.
            poll_s: Longest read slice on the stream's own thread, in seconds.
            **options: `Client.lifecycle_events`'s other keyword arguments (``from_beginning``, ``since``).

        Returns:
            An async iterator of `settled.schemas.LifecycleEvent` (close it with ``aclose`` or ``async with``).

        Raises:
            ValueError: ``pattern`` is empty or ``poll_s`` is not positive.
            BrokerUnavailableError: The topic does not exist, or Kafka did not answer the position lookups.
        """
        if poll_s <= 0:
            raise ValueError(f"poll_s must be positive, got {poll_s}")
        reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="settled-async-lifecycle")
        try:
            stream = await asyncio.get_running_loop().run_in_executor(
                reader, functools.partial(self.client.lifecycle_events, pattern, **options)
            )
        except BaseException:
            reader.shutdown(wait=False)
            raise
        return AsyncLifecycleStream(stream, reader, idle_timeout_s=idle_timeout_s, poll_s=poll_s)

    async def submit(self, conversation_id: str, input: Any, **options: Any) -> Receipt:
        """`Client.submit`, awaitable: propose one turn and return its receipt.

        Args:
            conversation_id: The conversation.
            input: The turn's input, a JSON-compatible value.
            **options: `Client.submit`'s keyword arguments (``idempotency_key``, ``principal``, ``lane``, ...).

        Returns:
            The receipt (admitted, or duplicate of the original).

        Raises:
            SettledError: As `Client.submit` raises (rejected, conflict, outcome unknown, ...).
        """
        return await self._run(self.client.submit, conversation_id, input, **options)

    async def abort(self, conversation_id: str, submission_id: str, **options: Any) -> Receipt:
        """`Client.abort`, awaitable.

        Args:
            conversation_id: The conversation.
            submission_id: The submission to abort.
            **options: `Client.abort`'s keyword arguments.

        Returns:
            The command's receipt.

        Raises:
            SettledError: As `Client.abort` raises.
        """
        return await self._run(self.client.abort, conversation_id, submission_id, **options)

    async def signal(self, conversation_id: str, run_id: str, name: str, payload: Any, **options: Any) -> Receipt:
        """`Client.signal`, awaitable.

        Args:
            conversation_id: The conversation.
            run_id: The run (the submission id of an agent run).
            name: The signal's name.
            payload: Its JSON payload.
            **options: `Client.signal`'s keyword arguments.

        Returns:
            The command's receipt.

        Raises:
            SettledError: As `Client.signal` raises.
        """
        return await self._run(self.client.signal, conversation_id, run_id, name, payload, **options)

    async def steer(self, conversation_id: str, run_id: str, text: str, **options: Any) -> Receipt:
        """`Client.steer`, awaitable: send a steering message to an active run.

        Args:
            conversation_id: The conversation.
            run_id: The run (the submission id of an agent run).
            text: The message.
            **options: `Client.steer`'s keyword arguments (``command_id``, ``principal``, ``timeout_s``).

        Returns:
            The command's receipt.

        Raises:
            SettledError: As `Client.steer` raises (rejected, outcome unknown, ...).
        """
        return await self._run(self.client.steer, conversation_id, run_id, text, **options)

    async def retry_submission(
        self,
        conversation_id: str,
        submission_id: str,
        *,
        signing_key: Ed25519PrivateKey,
        key_id: str,
        **options: Any,
    ) -> Receipt:
        """`Client.retry_submission`, awaitable: admit a dead letter's payload again as a new submission.

        Args:
            conversation_id: The conversation.
            submission_id: The dead letter.
            signing_key: The resolver's Ed25519 private key.
            key_id: The id the workers know the matching public key by.
            **options: `Client.retry_submission`'s other keyword arguments (``new_submission_id``, ``command_id``,
                ``principal``, ``timeout_s``).

        Returns:
            The command's receipt, naming the new submission (`wait` on it waits for that submission's settlement).

        Raises:
            SettledError: As `Client.retry_submission` raises (rejected, outcome unknown, ...).
            TypeError: ``signing_key`` is not an ``Ed25519PrivateKey``.
        """
        return await self._run(
            self.client.retry_submission,
            conversation_id,
            submission_id,
            signing_key=signing_key,
            key_id=key_id,
            **options,
        )

    async def set_lane(self, conversation_id: str, lane: Any, **options: Any) -> Receipt:
        """`Client.set_lane`, awaitable: change a conversation's lane policy (issue 22 item 1).

        Args:
            conversation_id: The conversation.
            lane: The lane policy (a `settled.protocol.LanePolicy` or its name).
            **options: `Client.set_lane`'s keyword arguments.

        Returns:
            The command's receipt.

        Raises:
            SettledError: As `Client.set_lane` raises.
        """
        return await self._run(self.client.set_lane, conversation_id, lane, **options)

    async def request(self, method: Callable[..., Receipt], *args: Any, **kwargs: Any) -> Receipt:
        """Run any other request of `client` (``approve``, ``deny``, ``resolve_unknown``, ...) on the request threads.

        Args:
            method: A bound method of `client`, e.g. ``client.client.approve``.
            *args: Its positional arguments.
            **kwargs: Its keyword arguments.

        Returns:
            Its receipt.

        Raises:
            ValueError: ``method`` is not a method of this client's `Client`.
            SettledError: As the method raises.
        """
        if getattr(method, "__self__", None) is not self.client:
            raise ValueError(f"method {method!r} is not a method of this AsyncClient's Client")
        return await self._run(method, *args, **kwargs)

    async def wait(self, receipt: Receipt, timeout_s: float | None = None) -> SettlementRecord:
        """`Client.wait`, awaitable, holding no thread while it waits.

        Args:
            receipt: An ``admitted`` or ``duplicate`` submission receipt.
            timeout_s: Deadline, in seconds (default: the client's).

        Returns:
            The settlement.

        Raises:
            ValueError: The receipt is not an admitted or duplicate submission receipt.
            SettlementTimeoutError: None within the deadline; names the submission.
            BrokerUnavailableError: The settlements topic does not exist, or Kafka did not answer.
            ClientError: The client is closed.
        """
        client = self.client
        if client.closed:
            raise ClientError("the client is closed")
        conversation_id, submission_id, since = client.settlement_target(receipt)
        timeout = client.timeout_s(timeout_s)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[SettlementRecord] = loop.create_future()

        def on_result(result: SettlementRecord | Exception) -> None:  # the reader's thread
            loop.call_soon_threadsafe(_settle_future, future, result)

        reader = client.settlements_reader
        found = await self._run(reader.expect, conversation_id, submission_id, since, timeout, on_result)
        if isinstance(found, SettlementRecord):
            return found
        try:
            return await asyncio.wait_for(future, timeout)
        except TimeoutError:
            raise SettlementTimeoutError(
                submission_id, conversation_id, client.settings.topic("settlements"), found.partition, timeout
            ) from None
        finally:
            reader.forget(found)


class AsyncLifecycleStream:
    """A positioned `LifecycleStream` read on a thread of its own, as an async iterator (issue 17 item 5).

    Each ``__anext__`` reads in slices of ``poll_s`` on that one thread, so the loop is never blocked and the
    consumer is only ever touched by one thread; ``aclose`` (or leaving ``async with``) closes the stream after the
    slice in flight.
    """

    def __init__(
        self, stream: LifecycleStream, reader: ThreadPoolExecutor, *, idle_timeout_s: float | None, poll_s: float
    ) -> None:
        """Wrap a positioned stream.

        Args:
            stream: The positioned synchronous stream (built on ``reader``).
            reader: The one thread that touches ``stream``.
            idle_timeout_s: Stop after this long without a matching event, in seconds; ``None``: never stop.
            poll_s: Longest read slice, in seconds.
        """
        self._stream = stream
        self._reader = reader
        self._idle_timeout_s = idle_timeout_s
        self._poll_s = poll_s
        self._last_s = time.monotonic()
        self._closed = False

    def __aiter__(self) -> AsyncLifecycleStream:
        return self

    async def __anext__(self) -> LifecycleEvent:
        """Return the next matching event, waiting for one without blocking the loop.

        Raises:
            StopAsyncIteration: ``idle_timeout_s`` passed without an event, or the stream is closed.
            DecodeError: A record is not a lifecycle event.
            KafkaException: A consumer error about a record.
        """
        loop = asyncio.get_running_loop()
        while not self._closed and not self._stream.closed:
            event = await loop.run_in_executor(self._reader, self._stream.poll, self._poll_s)
            if event is not None:
                self._last_s = time.monotonic()
                return event
            idle = self._idle_timeout_s
            if idle is not None and time.monotonic() - self._last_s >= idle:
                await self.aclose()
        raise StopAsyncIteration

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the stream (after the read slice in flight, on its thread) and release the thread."""
        if self._closed:
            return
        self._closed = True
        closing = self._reader.submit(self._stream.close)
        self._reader.shutdown(wait=False)
        await asyncio.wrap_future(closing)


def _settle_future(future: asyncio.Future[SettlementRecord], result: SettlementRecord | Exception) -> None:
    if future.done():  # cancelled by a timeout
        return
    if isinstance(result, Exception):
        future.set_exception(result)
    else:
        future.set_result(result)
