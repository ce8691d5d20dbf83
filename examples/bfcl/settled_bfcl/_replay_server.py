"""A local OpenAI-compatible Chat Completions server that answers as BFCL's replay model (issue 19 item 1).

It lets the main job run its ``--provider openai`` path offline, through the real ``openai`` SDK and settled's
`OpenAIChat`, against a server that speaks the real protocol: ``POST /v1/chat/completions`` with ``stream: true``
answers ``text/event-stream`` chunks (text, or tool calls whose arguments are split across two deltas), a usage chunk
(``stream_options.include_usage``) and ``data: [DONE]``. The answer is the replay model's for the prompt: the request's
messages are turned back into settled's `Message` values and handed to `ReplayProvider`, so a conversation driven
through it is the one the replay provider drives in process.

Run it alone with ``python -m settled_bfcl._replay_server --port 8400``; the demo starts one itself for
``--provider openai`` without ``--base-url``.
"""

from __future__ import annotations

import argparse
import json
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from settled.runtime import Message, ModelRequest, ProviderError, declared_call
from settled_bfcl._app import ReplayProvider
from settled_bfcl._replay import ReplayMode

__all__ = ["ReplayServer", "messages_of", "serve_replay"]

#: The model name the server answers with.
MODEL_NAME = "bfcl-replay-openai"


def messages_of(body: dict[str, Any]) -> tuple[Message, ...]:
    """Turn a Chat Completions request's messages back into settled's `Message` values.

    Args:
        body: The request's JSON body.

    Returns:
        The messages, in order.

    Raises:
        ValueError: A message has an unknown role or lacks a field it needs (named).
    """
    out: list[Message] = []
    for i, raw in enumerate(body.get("messages") or []):
        role = raw.get("role")
        content = raw.get("content") or ""
        if not isinstance(content, str):
            raise ValueError(f"messages[{i}].content must be a string, got {type(content).__name__}")
        if role in ("system", "user"):
            out.append(Message(role, content))
        elif role == "assistant":
            calls = tuple(
                declared_call(c["id"], c["function"]["name"], json.loads(c["function"]["arguments"] or "{}"))
                for c in raw.get("tool_calls") or []
            )
            out.append(Message("assistant", content, tool_calls=calls))
        elif role == "tool":
            call_id = raw.get("tool_call_id")
            if not isinstance(call_id, str):
                raise ValueError(f"messages[{i}].tool_call_id must be a string, got {call_id!r}")
            out.append(Message("tool", content, call_id=call_id, is_error=content.startswith("error: ")))
        else:
            raise ValueError(f"messages[{i}].role {role!r} is not system, user, assistant or tool")
    return tuple(out)


def _chunk(completion_id: str, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": 0,
        "model": MODEL_NAME,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def _chunks(provider: ReplayProvider, body: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The streamed answer's chunks (usage last, as ``include_usage`` asks)."""
    messages = messages_of(body)
    response = provider.answer(ModelRequest(operation_id="replay-server", model=MODEL_NAME, messages=messages))
    completion_id = f"chatcmpl-{uuid.uuid4().hex[:12]}"
    yield _chunk(completion_id, {"role": "assistant"})
    if response.tool_calls:
        for index, call in enumerate(response.tool_calls):
            half = len(call.args_json) // 2
            yield _chunk(
                completion_id,
                {"tool_calls": [{"index": index, "id": call.call_id, "type": "function",
                                 "function": {"name": call.tool, "arguments": call.args_json[:half]}}]},
            )  # fmt: skip
            yield _chunk(
                completion_id, {"tool_calls": [{"index": index, "function": {"arguments": call.args_json[half:]}}]}
            )
        yield _chunk(completion_id, {}, "tool_calls")
    else:
        half = len(response.text) // 2
        for part in (response.text[:half], response.text[half:]):
            if part:
                yield _chunk(completion_id, {"content": part})
        yield _chunk(completion_id, {}, "stop")
    prompt_tokens = sum(len(m.text.split()) for m in messages)
    yield {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": 0,
        "model": MODEL_NAME,
        "choices": [],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 1, "total_tokens": prompt_tokens + 1},
    }


class _Handler(BaseHTTPRequestHandler):
    server: ReplayServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the demo's table says what happened."""

    def _error(self, status: int, message: str) -> None:
        body = json.dumps({"error": {"message": message, "type": "invalid_request_error"}}).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        if self.path.rstrip("/").split("?")[0] not in ("/v1/chat/completions", "/chat/completions"):
            self._error(404, f"no route {self.path}")
            return
        length = int(self.headers.get("content-length") or 0)
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
            chunks = list(_chunks(self.server.provider, body))
        except (ValueError, KeyError, ProviderError) as exc:  # a prompt the replay model cannot answer: a 400
            self._error(400, f"{type(exc).__name__}: {exc}")
            return
        self.server.requests += 1
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("x-request-id", f"req-{uuid.uuid4().hex[:12]}")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        for event in [*(f"data: {json.dumps(c)}\n\n" for c in chunks), "data: [DONE]\n\n"]:
            data = event.encode()
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.write(b"0\r\n\r\n")


class ReplayServer(ThreadingHTTPServer):
    """The server (module doc); `requests` counts the completions it answered.

    Attributes:
        provider: The replay provider answering the prompts.
        requests: Completions answered so far.
    """

    daemon_threads = True

    def __init__(self, host: str, port: int, mode: ReplayMode = ReplayMode.ONE_CALL, seed: int = 0) -> None:
        super().__init__((host, port), _Handler)
        self.provider = ReplayProvider(mode, seed=seed)
        self.requests = 0

    @property
    def base_url(self) -> str:
        """The ``base_url`` to give an OpenAI client (``http://host:port/v1``)."""
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}/v1"


@contextmanager
def serve_replay(
    host: str = "127.0.0.1", port: int = 0, mode: ReplayMode = ReplayMode.ONE_CALL, seed: int = 0
) -> Iterator[ReplayServer]:
    """Run a `ReplayServer` in a daemon thread for the block.

    Args:
        host: The address to bind.
        port: The port (0: one the OS chooses).
        mode: The replay model's chunking mode.
        seed: Its chunking seed.

    Yields:
        The running server (its `ReplayServer.base_url`).
    """
    server = ReplayServer(host, port, mode, seed)
    thread = threading.Thread(target=server.serve_forever, name="bfcl-replay-server", daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def main(argv: list[str] | None = None) -> None:
    """``python -m settled_bfcl._replay_server [--host H] [--port P]``: serve until interrupted."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8400)
    args = ap.parse_args(argv)
    server = ReplayServer(args.host, args.port)
    print(f"serving BFCL's replay model as an OpenAI-compatible endpoint at {server.base_url}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
