"""``ctx.emit`` without a stream (issue 19 item 2): a bad part is refused at the call, a good one changes nothing.

Publishing itself is exercised against the real broker (tests/integration/engine/test_engine_stream.py).
"""

from __future__ import annotations

from typing import Any

import pytest

from settled.producers import StreamPartError
from settled.runtime import App, RunContext
from settled.schemas import canonical_json
from tests.unit.runtime.test_context import Recorder, attempt, run


def test_a_part_that_is_not_json_is_refused_naming_it_and_a_good_one_records_nothing() -> None:
    async def agent(ctx: RunContext) -> Any:
        ctx.emit({"ok": [1, 2]})
        with pytest.raises(StreamPartError, match="not a JSON value"):
            ctx.emit({"bad": {1, 2}})
        return "done"

    rec = Recorder()
    assert run(App(agent=agent), attempt(rec)) == canonical_json("done")
    assert rec.events == []  # provisional: nothing reaches the log
