"""The worker app of the operator-page tests (issue 21 item 1): a tool that needs approval and one that goes Unknown.

Action code follows a plan in its input (`tests/integration/engine/tool_approval_app.py`): ``refund`` needs a
person's approval for every call; ``remote_once`` (not idempotent) gets no answer while the world flag
``server_down`` is set, so its call goes Unknown. Both count their invocations in the engine tests' world database.
The API's signing key is among the app's ``api_keys``, its approver and resolver keys among its approver and resolver
keys (`tests/integration/api/api_app.py`).
"""

from __future__ import annotations

from settled.runtime import App
from tests.integration.api.api_app import API_KEY_ID
from tests.integration.engine import tool_approval_app
from tests.integration.engine.engine_app import APPROVER_KEY_ID, RESOLVER_KEY_ID, RESOLVER_PUBLIC_B64
from tests.integration.engine.engine_app import app as engine_app

app = App(
    agent=tool_approval_app._plan_agent,
    resolver_keys={RESOLVER_KEY_ID: RESOLVER_PUBLIC_B64},
    approver_keys={APPROVER_KEY_ID: RESOLVER_PUBLIC_B64},
    api_keys={API_KEY_ID: RESOLVER_PUBLIC_B64},
    max_attempts=3,
    options=tool_approval_app.OPTIONS,
)
app.tools.register(tool_approval_app.app.tools.get("refund"))
app.tools.register(engine_app.tools.get("remote_once"))
