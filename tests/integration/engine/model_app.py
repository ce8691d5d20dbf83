"""The model-driven test app: `ModelAgent` over a scripted provider whose script travels in the user's input.

The input is ``{"script": [response, ...]}``; the run's n-th model call gets ``response[n]``, a list of steps:
``{"text": s}`` / ``{"reasoning": s}`` (a delta), ``{"sleep": s}``, then ``{"answer": s}`` (a text response) or
``{"calls": [[call id, tool, args], ...]}`` (a response declaring tool calls), or ``{"fail": message}`` (a retryable
`ProviderError`, e.g. an overloaded provider). Every prompt is written to the world
database's ``prompts`` table (operation id, position, messages), so a test sees exactly what the model was shown.
The tools are the engine app's tool doubles.
"""

from __future__ import annotations

import json
from typing import Any

from settled.runtime import (
    App,
    Message,
    ModelAgent,
    ModelRequest,
    ModelResponse,
    ProviderError,
    ReasoningDelta,
    RunOptions,
    ScriptedProvider,
    TextDelta,
    declared_call,
)
from settled.runtime._model import ScriptStep
from tests.integration.engine import engine_app
from tests.integration.engine.engine_app import world


def _is_input(message: Message) -> bool:
    """Whether a user message is a turn's input (a JSON script), not a steering message the runtime appended."""
    if message.role != "user":
        return False
    try:
        value = json.loads(message.text)
    except ValueError:
        return False
    return isinstance(value, dict) and "script" in value


def _position(request: ModelRequest) -> int:
    last_input = max(i for i, m in enumerate(request.messages) if _is_input(m))
    return sum(1 for m in request.messages[last_input:] if m.role == "assistant")


def _script(request: ModelRequest) -> list[ScriptStep]:
    position = _position(request)
    messages = [m.to_json() for m in request.messages]
    with world() as db:
        db.execute("CREATE TABLE IF NOT EXISTS prompts (op TEXT, position INTEGER, messages TEXT)")
        db.execute("INSERT INTO prompts VALUES (?, ?, ?)", (request.operation_id, position, json.dumps(messages)))
    user = json.loads([m for m in request.messages if _is_input(m)][-1].text)
    steps: list[ScriptStep] = []
    for step in user["script"][position]:
        if "text" in step:
            steps.append(TextDelta(step["text"]))
        elif "reasoning" in step:
            steps.append(ReasoningDelta(step["reasoning"]))
        elif "sleep" in step:
            steps.append(float(step["sleep"]))
        elif "answer" in step:
            steps.append(ModelResponse(step["answer"], model="scripted-1"))
        elif "fail" in step:
            steps.append(ProviderError(str(step["fail"]), retryable=True))
        elif "calls" in step:
            calls = tuple(declared_call(cid, tool, args) for cid, tool, args in step["calls"])
            steps.append(ModelResponse("", calls, model="scripted-1"))
    return steps


def prompts(path: str) -> list[tuple[str, int, list[dict[str, Any]]]]:
    """Every prompt the provider was shown, in order: (operation id, position, messages)."""
    with world(path) as db:
        db.execute("CREATE TABLE IF NOT EXISTS prompts (op TEXT, position INTEGER, messages TEXT)")
        rows = db.execute("SELECT op, position, messages FROM prompts ORDER BY rowid").fetchall()
    return [(op, pos, json.loads(m)) for op, pos, m in rows]


app = App(
    agent=ModelAgent(ScriptedProvider(_script), model="scripted-1"),
    resolver_keys=engine_app.app.resolver_keys,
    tools=engine_app.app.tools,
    options=RunOptions(abort_grace_s=1.0, delta_flush_every=1, model_backoff_s=0.05),
)
