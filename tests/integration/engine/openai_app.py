"""The OpenAI-backed test app: `ModelAgent` over `OpenAIChat`, configured from ``SETTLED_MODEL_*`` (issue 19).

The test points ``SETTLED_MODEL_BASE_URL`` at its local Chat Completions server
(`tests/unit/runtime/openai_server.py`). The tools are the engine app's tool doubles.
"""

from __future__ import annotations

from settled.runtime import App, ModelAgent, OpenAIChat, RunOptions
from tests.integration.engine import engine_app

app = App(
    agent=ModelAgent(OpenAIChat()),
    resolver_keys=engine_app.app.resolver_keys,
    tools=engine_app.app.tools,
    options=RunOptions(delta_flush_every=1, model_backoff_s=0.05),
)
