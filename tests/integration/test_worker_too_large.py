"""Records too large for the log are replaced by typed failures, whatever they hold (issue 25 item 5).

Two cases of the issue, against the real broker with an in-process worker and its default size limit (the smallest
of the topics' ``max.message.bytes`` and the producer's ``message.max.bytes``):

* five parallel tool calls each returning about 250 KB (each under ``max_result_bytes``), whose settlements share one
  record of about 1.25 MB: the record is split, each call's result kept;
* one 3 MB result with ``max_result_bytes`` raised above the limit: the call's settlement becomes the error
  ``result_too_large`` naming the tool, its size and the limit, and the agent sees that error.

Before the fix both raised ``ValueError: no typed failure replaces ['ToolCallSettled']`` out of the worker loop.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from typing import Any

import pytest

from settled._settings import Settings
from settled.processors import Worker
from settled.processors._worker import PRODUCER_MESSAGE_MAX_BYTES, RECORD_OVERHEAD_BYTES
from settled.protocol import PartitionState
from settled.runtime import App, RunContext, RunOptions, ToolCall, ToolCallError
from settled.schemas import (
    RESULT_TOO_LARGE,
    LogEvent,
    SettlementOutcome,
    SettlementRecord,
    ToolCallSettled,
)
from settled.services._worker_service import build_worker
from tests.harness.factories import proposal
from tests.integration.helpers import CODEC, produce_inbox, read_topic, running, wait_for

pytestmark = pytest.mark.integration

#: Each settlement of the parallel case: under max_result_bytes (262,144), five together over 1,000,000.
PARALLEL_BYTES = 250_000
#: The one large result: over every record limit, under the raised max_result_bytes.
LARGE_BYTES = 3_000_000
#: A result between the producer's message.max.bytes (1,000,000) and the topics' max.message.bytes (1,048,588).
BETWEEN_LIMITS_BYTES = 1_010_000


async def _agent(ctx: RunContext) -> Any:
    n, size = int(ctx.input["calls"]), int(ctx.input["bytes"])
    calls = [ctx.tool("blob", {"bytes": size, "i": i}) for i in range(n)]
    out: list[Any] = []
    for result in await asyncio.gather(*calls, return_exceptions=True):
        if isinstance(result, ToolCallError):
            out.append({"error": [result.error_type, result.message]})
        elif isinstance(result, BaseException):
            raise result
        else:
            out.append(len(result))
    return out


def _app(options: RunOptions) -> App:
    app = App(agent=_agent, options=options)

    @app.tool(idempotent=True, parallel_safe=True, timeout_s=30)
    def blob(args: dict[str, Any], call: ToolCall) -> str:
        """Returns a string of ``bytes`` characters."""
        return "x" * int(args["bytes"])

    return app


def _events(s: Settings) -> list[LogEvent]:
    return [e for r in read_topic(s, "log") for e in CODEC.decode_batch(r.value, offset=r.offset).batch.events]


def _settlement(s: Settings, submission_id: str) -> SettlementRecord | None:
    records = [CODEC.decode(x.value) for x in read_topic(s, "settlements")]
    mine = [r for r in records if isinstance(r, SettlementRecord) and r.submission_id == submission_id]
    assert len(mine) <= 1, mine
    return mine[0] if mine else None


def _run(s: Settings, app: App, calls: int, size: int) -> tuple[SettlementRecord, list[ToolCallSettled]]:
    p = proposal("conv-large", value={"calls": calls, "bytes": size})
    produce_inbox(s, [(p.conversation_id.encode(), CODEC.encode(p))])
    worker: Worker[PartitionState] = build_worker(s, app)
    with running(worker) as thread:  # re-raises what ended the worker loop, if anything did
        wait_for(
            lambda: _settlement(s, p.submission_id) is not None or not thread.is_alive(), 60, "the submission to settle"
        )
    settlement = _settlement(s, p.submission_id)
    assert settlement is not None
    settled = [e for e in _events(s) if isinstance(e, ToolCallSettled) and e.submission_id == p.submission_id]
    return settlement, settled


def test_a_shared_settlement_record_of_five_parallel_250_kb_results_is_split_and_every_result_kept(
    topics: Settings,
) -> None:
    # Settlements linger up to 1 s for the run's next record: the five parallel calls' settlements share one record.
    app = _app(RunOptions(settle_linger_s=1.0))
    settlement, settled = _run(topics, app, 5, PARALLEL_BYTES)
    assert settlement.outcome is SettlementOutcome.COMPLETED, settlement
    assert json.loads(settlement.reply_json or "null") == [PARALLEL_BYTES] * 5, settlement.reply_json
    assert len(settled) == 5 and all(e.error is None for e in settled), [e.error for e in settled]
    assert Counter(len(json.loads(e.result_json or '""')) for e in settled) == Counter({PARALLEL_BYTES: 5})


@pytest.mark.parametrize("size", [LARGE_BYTES, BETWEEN_LIMITS_BYTES], ids=["3MB", "between-producer-and-topic-limit"])
def test_one_large_result_with_max_result_bytes_raised_becomes_the_calls_error_naming_tool_size_and_limit(
    topics: Settings, size: int
) -> None:
    """A 3 MB result, and one of 1.01 MB: under the topics' 1,048,588 bytes but over the producer's 1,000,000, so the
    limit must be the producer's (before the fix it was the topics', and the producer's refusal aborted the
    transaction twice before the record was replaced as poison)."""
    app = _app(RunOptions(max_result_bytes=2 * LARGE_BYTES))
    settlement, settled = _run(topics, app, 1, size)
    (call,) = {e.call_id for e in settled}
    errors = [e.error for e in settled if e.error is not None]
    assert [e.type for e in errors] == [RESULT_TOO_LARGE], settled
    message = errors[0].message
    assert "'blob'" in message and f"of {size + 2} bytes" in message, message
    assert f"exceeds the limit of {PRODUCER_MESSAGE_MAX_BYTES - RECORD_OVERHEAD_BYTES} bytes" in message, message
    assert all(e.result_json is None for e in settled), "the 3 MB result reached the log"
    # The agent saw what the log holds: the error, not the result it had in memory.
    assert settlement.outcome is SettlementOutcome.COMPLETED, settlement
    reply = json.loads(settlement.reply_json or "null")
    assert reply == [{"error": [RESULT_TOO_LARGE, message]}], (call, reply)
