"""A local test server speaking streamed Chat Completions over HTTP (SSE), for `OpenAIChat` tests (issue 19).

A test double for a thing we do not own, speaking the real protocol: the real ``openai`` SDK talks to it over
HTTP/1.1. Each ``POST /v1/chat/completions`` takes the next scripted answer:

* `Stream`: a 200 ``text/event-stream`` response, chunked, one ``data: {chunk}`` event per chunk, then
  ``data: [DONE]`` — or, with ``cut=True``, the connection closes after the chunks without the final empty chunk
  of the chunked body (a stream cut mid-way, as a dropped connection leaves it).
* `Status`: an error status with headers (e.g. ``retry-after``) and an OpenAI-shaped error body.

Every request is kept (headers and JSON body), so a test sees how many requests reached the server.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["Received", "Status", "Stream", "chunk", "serve", "usage_chunk"]


@dataclass(frozen=True)
class Stream:
    """A streamed answer: its chunks (JSON objects), cut before ``[DONE]`` when ``cut``."""

    chunks: list[dict[str, Any]]
    cut: bool = False


@dataclass(frozen=True)
class Status:
    """An error answer: HTTP ``status`` with ``headers``."""

    status: int
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Received:
    """One request the server received."""

    headers: dict[str, str]
    body: dict[str, Any]


def chunk(
    *,
    content: str | None = None,
    tool_calls: list[dict[str, Any]] | None = None,
    finish_reason: str | None = None,
    model: str = "local-1",
) -> dict[str, Any]:
    """A ``chat.completion.chunk`` with one choice."""
    delta: dict[str, Any] = {}
    if content is not None:
        delta["content"] = content
    if tool_calls is not None:
        delta["tool_calls"] = tool_calls
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
    }


def usage_chunk(prompt: int, completion: int, *, cached: int = 0, reasoning: int = 0) -> dict[str, Any]:
    """The final usage chunk of ``stream_options={"include_usage": True}`` (no choices)."""
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "local-1",
        "choices": [],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
            "completion_tokens_details": {"reasoning_tokens": reasoning},
        },
    }


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, answers: list[Stream | Status]) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.answers = answers
        self.received: list[Received] = []
        self.lock = threading.Lock()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length", "0"))
        body = json.loads(self.rfile.read(length) or b"{}")
        with self.server.lock:
            self.server.received.append(Received({k.lower(): v for k, v in self.headers.items()}, body))
            answer = self.server.answers.pop(0) if self.server.answers else Status(500)
        if isinstance(answer, Status):
            payload = json.dumps({"error": {"message": f"status {answer.status}", "type": "test", "code": None}})
            self.send_response(answer.status)
            for name, value in answer.headers.items():
                self.send_header(name, value)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload.encode())
            return
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("transfer-encoding", "chunked")
        self.send_header("x-request-id", f"req-{len(self.server.received)}")
        self.end_headers()
        events = [f"data: {json.dumps(c)}\n\n" for c in answer.chunks]
        if not answer.cut:
            events.append("data: [DONE]\n\n")
        for event in events:
            data = event.encode()
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()
        if answer.cut:
            self.close_connection = True  # no terminating chunk: the body is incomplete
            return
        self.wfile.write(b"0\r\n\r\n")


@contextmanager
def serve(answers: list[Stream | Status]) -> Iterator[tuple[str, list[Received]]]:
    """Run the server on a free port of 127.0.0.1.

    Args:
        answers: The answers, in order; a request past the last gets a 500.

    Yields:
        The base URL (``http://127.0.0.1:<port>/v1``) and the list of requests received (grows as they arrive).
    """
    server = _Server(list(answers))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1", server.received
    finally:
        server.shutdown()
        server.server_close()
