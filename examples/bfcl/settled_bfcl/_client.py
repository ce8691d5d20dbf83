"""A client for the BFCL tool server, and a helper that runs the server as a separate process.

:class:`ToolServerClient` turns the server's error answers into typed exceptions. A transport failure (connection
refused or reset, timeout) is raised as ``httpx.TransportError``, untouched: the caller cannot know whether the call
ran, so it is *in doubt* (docs/design.md §5), never a tool result.

:class:`ToolServerProcess` starts ``python -m settled_bfcl.toolserver`` on a private port, waits until it
answers, and stops it gracefully (SIGTERM) or kills it (SIGKILL, the crash that the store must survive).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import httpx
from pydantic import TypeAdapter, ValidationError

from settled.services._devstack import free_port
from settled_bfcl._corpus import Entry
from settled_bfcl._errors import (
    ConversationConflictError,
    IdempotencyConflictError,
    StaleEpochError,
    ToolServerError,
    ToolServerProcessError,
    UnknownConversationError,
)
from settled_bfcl._wire import (
    CallRequest,
    CallResponse,
    Capabilities,
    ConversationInfo,
    CreateConversationRequest,
    ErrorBody,
    LedgerRecord,
)

__all__ = ["ToolServerClient", "ToolServerProcess"]

_ERROR_CLASSES: Mapping[str, type[ToolServerError]] = {
    "unknown_conversation": UnknownConversationError,
    "conversation_conflict": ConversationConflictError,
    "idempotency_key_conflict": IdempotencyConflictError,
    "stale_epoch": StaleEpochError,
}
_LEDGER = TypeAdapter(list[LedgerRecord])


def _check_conversation_id(conversation_id: str) -> str:
    if not conversation_id or "/" in conversation_id:
        raise ValueError(f"conversation_id {conversation_id!r} must be non-empty and contain no '/'")
    return conversation_id


class ToolServerClient:
    """A synchronous HTTP client of one tool server."""

    def __init__(self, base_url: str, *, timeout_s: float = 10.0, transport: httpx.BaseTransport | None = None) -> None:
        """Connect lazily to a server.

        Args:
            base_url: E.g. ``"http://127.0.0.1:8765"``.
            timeout_s: Timeout of each request.
            transport: An httpx transport to use instead of the network (None: the network).
        """
        self._http = httpx.Client(base_url=base_url, timeout=timeout_s, transport=transport)

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def __enter__(self) -> Self:
        """Return the client."""
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """Close the client."""
        self.close()

    def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        response = self._http.request(method, path, **kwargs)
        if response.is_success:
            return response
        try:
            body = ErrorBody.model_validate_json(response.content)
        except ValidationError:
            raise ToolServerError("http_error", response.status_code, response.text[:500]) from None
        error_class = _ERROR_CLASSES.get(body.error, ToolServerError)
        raise error_class(body.error, response.status_code, body.detail)

    def health(self) -> bool:
        """Ask whether the server is up.

        Returns:
            True when it answers ``{"status": "ok"}``.

        Raises:
            httpx.TransportError: It cannot be reached.
        """
        return bool(self._send("GET", "/health").json().get("status") == "ok")

    def capabilities(self) -> Capabilities:
        """Ask which methods are deduplicated (idempotent) and whether dedup is on.

        Returns:
            The capabilities.
        """
        return Capabilities.model_validate_json(self._send("GET", "/capabilities").content)

    def non_idempotent_methods(self) -> frozenset[str]:
        """Return the methods the server does not deduplicate (settled makes their interrupted calls Unknown).

        Returns:
            The method names.
        """
        return frozenset(tool.method for tool in self.capabilities().tools if not tool.idempotent)

    def create_conversation(
        self,
        conversation_id: str,
        *,
        entry_id: str,
        involved_classes: Iterable[str],
        initial_config: Mapping[str, Any],
        long_context: bool = False,
    ) -> ConversationInfo:
        """Create a conversation's world (a no-op when it exists with the same spec).

        Args:
            conversation_id: The conversation (no ``/``).
            entry_id: The BFCL entry.
            involved_classes: The backend classes.
            initial_config: The entry's ``initial_config``.
            long_context: BFCL's long-context flag.

        Returns:
            Its info; ``created`` tells whether this call built it.

        Raises:
            ConversationConflictError: It exists with another spec.
            ValueError: The conversation id is empty or contains ``/``.
        """
        body = CreateConversationRequest(
            entry_id=entry_id,
            involved_classes=list(involved_classes),
            initial_config=dict(initial_config),
            long_context=long_context,
        )
        path = f"/conversations/{_check_conversation_id(conversation_id)}"
        return ConversationInfo.model_validate_json(self._send("PUT", path, json=body.model_dump(mode="json")).content)

    def create_conversation_for_entry(self, conversation_id: str, entry: Entry) -> ConversationInfo:
        """Create a conversation's world from a corpus entry.

        Args:
            conversation_id: The conversation (no ``/``).
            entry: The entry.

        Returns:
            Its info.
        """
        return self.create_conversation(
            conversation_id,
            entry_id=entry.id,
            involved_classes=entry.involved_classes,
            initial_config=entry.initial_config,
            long_context=entry.long_context,
        )

    def conversation(self, conversation_id: str) -> ConversationInfo:
        """Describe one conversation (its highest epoch and execution count).

        Args:
            conversation_id: The conversation.

        Returns:
            Its info.

        Raises:
            UnknownConversationError: It does not exist.
        """
        path = f"/conversations/{_check_conversation_id(conversation_id)}"
        return ConversationInfo.model_validate_json(self._send("GET", path).content)

    def conversation_ids(self) -> list[str]:
        """List the conversations the server holds.

        Returns:
            The ids, sorted.
        """
        ids: list[str] = self._send("GET", "/conversations").json()["conversation_ids"]
        return ids

    def call(
        self,
        conversation_id: str,
        method: str,
        arguments: Mapping[str, Any],
        *,
        idempotency_key: str,
        owner_epoch: int,
        call_id: str | None = None,
    ) -> CallResponse:
        """Execute one tool call.

        Args:
            conversation_id: The conversation.
            method: The bare backend method name.
            arguments: Named JSON arguments (ints and floats keep their types on the wire).
            idempotency_key: The runtime's idempotency key.
            owner_epoch: The caller's owner epoch.
            call_id: The runtime's call id, recorded in the ledger.

        Returns:
            The output and whether it was replayed.

        Raises:
            UnknownConversationError: No world exists for the conversation.
            StaleEpochError: The epoch is lower than one the server already saw for the conversation.
            IdempotencyConflictError: The key was used for another call.
            ToolServerError: ``unknown_method`` or another refusal.
            httpx.TransportError: No answer; the call is in doubt.
        """
        body = CallRequest(
            method=method,
            arguments=dict(arguments),
            idempotency_key=idempotency_key,
            owner_epoch=owner_epoch,
            call_id=call_id,
        )
        path = f"/conversations/{_check_conversation_id(conversation_id)}/calls"
        return CallResponse.model_validate_json(self._send("POST", path, json=body.model_dump(mode="json")).content)

    def ledger(self, conversation_id: str, idempotency_key: str | None = None) -> list[LedgerRecord]:
        """Ask the ledger whether a key was executed and with what result (or list a conversation's ledger).

        Args:
            conversation_id: The conversation.
            idempotency_key: One key, or None for every key of the conversation.

        Returns:
            The records (empty when the key never ran), in order of first execution.
        """
        params = {} if idempotency_key is None else {"idempotency_key": idempotency_key}
        path = f"/conversations/{_check_conversation_id(conversation_id)}/ledger"
        return _LEDGER.validate_json(self._send("GET", path, params=params).content)


class ToolServerProcess:
    """The tool server as a child process, for tests and the demo."""

    def __init__(
        self,
        db_path: Path,
        *,
        port: int | None = None,
        host: str = "127.0.0.1",
        dedup: bool = True,
        non_idempotent_classes: Iterable[str] = (),
        log_path: Path | None = None,
    ) -> None:
        """Describe the server to run (nothing starts yet).

        Args:
            db_path: Its SQLite file.
            port: Its port; a free one when None (kept across restarts).
            host: Its listen address.
            dedup: False for the negative control (``--no-dedup``).
            non_idempotent_classes: Classes passed to ``--no-idempotency``.
            log_path: Where its stdout and stderr go (appended); ``<db>.log`` when None.
        """
        self.db_path = db_path
        self.host = host
        self.port = port if port is not None else free_port()
        self.dedup = dedup
        self.non_idempotent_classes = tuple(sorted(non_idempotent_classes))
        self.log_path = log_path if log_path is not None else db_path.with_suffix(".log")
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        """The server's URL, e.g. ``http://127.0.0.1:8765``."""
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        """The running process's pid, or None."""
        return self._process.pid if self._process is not None and self._process.poll() is None else None

    def command(self) -> list[str]:
        """Return the command line that starts the server.

        Returns:
            The argv.
        """
        argv = [
            sys.executable,
            "-m",
            "settled_bfcl.toolserver",
            "--db",
            str(self.db_path),
            "--host",
            self.host,
            "--port",
            str(self.port),
        ]
        if not self.dedup:
            argv.append("--no-dedup")
        if self.non_idempotent_classes:
            argv += ["--no-idempotency", ",".join(self.non_idempotent_classes)]
        return argv

    def client(self, *, timeout_s: float = 10.0) -> ToolServerClient:
        """Return a new client of this server (close it when done).

        Args:
            timeout_s: Per-request timeout.

        Returns:
            The client.
        """
        return ToolServerClient(self.base_url, timeout_s=timeout_s)

    def _log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-2000:]
        except OSError:
            return "(no log)"

    def start(self, *, timeout_s: float = 30.0) -> Self:
        """Start the server and wait until ``/health`` answers.

        Args:
            timeout_s: How long to wait for it.

        Returns:
            self.

        Raises:
            ToolServerProcessError: It is already running, exited early, or did not answer in time.
        """
        if self.pid is not None:
            raise ToolServerProcessError(f"tool server pid {self.pid} is already running on {self.base_url}")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self._process = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        with ToolServerClient(self.base_url, timeout_s=1.0) as client:
            while True:
                code = self._process.poll()
                if code is not None:
                    raise ToolServerProcessError(f"tool server exited with code {code}; log:\n{self._log_tail()}")
                try:
                    up = client.health()
                except httpx.TransportError:
                    up = False  # not listening yet
                if up:
                    return self
                if time.monotonic() > deadline:
                    self.kill()
                    raise ToolServerProcessError(
                        f"tool server did not answer on {self.base_url} within {timeout_s} s; log:\n{self._log_tail()}"
                    )
                time.sleep(0.05)

    def stop(self, *, timeout_s: float = 10.0) -> None:
        """Stop the server gracefully (SIGTERM), killing it if it does not exit in time. No-op when not running.

        Args:
            timeout_s: How long to wait after SIGTERM.
        """
        process = self._process
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        """Kill the server with SIGKILL and reap it (the crash its store must survive). No-op when not running."""
        process = self._process
        if process is None or process.poll() is not None:
            return
        process.kill()  # SIGKILL
        process.wait()

    def restart(self, *, timeout_s: float = 30.0) -> Self:
        """Stop the server if it runs, then start it again on the same port and file.

        Args:
            timeout_s: How long to wait for it to answer.

        Returns:
            self.
        """
        self.stop()
        return self.start(timeout_s=timeout_s)

    def __enter__(self) -> Self:
        """Start the server."""
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """Stop the server."""
        self.stop()
