"""`OpenAIChat` in a real worker: usage reaches the log and the projection (issue 19 item 1; docs/semantics.md §9).

A ``settled worker`` child runs `ModelAgent` over `OpenAIChat` (`tests/integration/engine/openai_app.py`) against
the local streamed Chat Completions server of `tests/unit/runtime/openai_server.py`, through the real ``openai``
SDK. The run's first stream is cut mid-way (recorded as interrupted, its usage unknown); its retry declares a tool
call whose arguments arrive split across deltas; the last call answers. An in-process projector keeps the live
projection; a rebuild agrees with it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from settled._settings import Settings
from settled.client import Client, Part
from settled.projections import ProjectionNames
from settled.schemas import (
    ModelResponseCompleted,
    ModelResponseDelta,
    ModelResponseInterrupted,
    SettlementOutcome,
    Usage,
)
from tests.integration.engine._helpers import (
    TIMEOUT_S,
    events_of,
    invocations,
    receipt,
    send,
    settled,
    start_worker,
)
from tests.integration.helpers import (
    check_clean,
    fresh_projection,
    projecting,
    projection_rows,
    proposal,
    wait_for,
    wait_projected,
)
from tests.unit.runtime.openai_server import Status, Stream, chunk, serve, usage_chunk

pytestmark = [pytest.mark.integration]

APP = "tests.integration.engine.openai_app:app"


@pytest.fixture
def names(postgres_dsn: str) -> Iterator[ProjectionNames]:
    with fresh_projection(postgres_dsn) as n:
        yield n


def test_usage_reaches_the_log_and_the_projection_and_a_cut_stream_stays_as_audit(
    topics: Settings, world_db: Path, tmp_path: Path, names: ProjectionNames
) -> None:
    s = topics
    answers: list[Stream | Status] = [
        Stream([chunk(content="Let me "), chunk(content="look")], cut=True),
        Stream(
            [
                chunk(
                    tool_calls=[{"index": 0, "id": "call_9", "type": "function", "function": {"name": "charge_idem"}}]
                ),
                chunk(tool_calls=[{"index": 0, "function": {"arguments": '{"amou'}}]),
                chunk(tool_calls=[{"index": 0, "function": {"arguments": 'nt": 5}'}}], finish_reason="tool_calls"),
                usage_chunk(100, 20, cached=64, reasoning=8),
            ]
        ),
        Stream([chunk(content="Charged."), chunk(finish_reason="stop"), usage_chunk(130, 4)]),
    ]
    with serve(answers) as (url, received), projecting(s, names) as live:
        env = {"SETTLED_MODEL_BASE_URL": url, "SETTLED_MODEL_NAME": "local-1"}
        worker = start_worker(s, world_db, tmp_path / "w.log", "w", env=env, app=APP)
        try:
            sub = proposal("conv-o", value="charge five", tools=("charge_idem",))
            send(s, sub)
            wait_for(lambda: settled(s, sub.submission_id) is not None, TIMEOUT_S, "the settlement")
            result = settled(s, sub.submission_id)
            assert result is not None and result.outcome is SettlementOutcome.COMPLETED, result
            assert result.reply_json == '"Charged."'
            assert invocations(world_db, "charge_idem") == 1
            assert len(received) == 3, "one request per call: the cut one, its retry, the answer"
            got = receipt(s, sub.submission_id)
            assert got is not None
            with Client(s) as client, client.stream(got, timeout_s=TIMEOUT_S) as follower:
                streamed = [(p.kind, p.data) for p in follower if isinstance(p, Part)]
            # The text deltas were published as they came (issue 19 item 2), the cut try's marked interrupted.
            assert streamed == [
                ("text", "Let me "),
                ("text", "look"),
                ("interrupted", {"response_ordinal": 0, "error": "ProviderError"}),
                ("text", "Charged."),
            ]
            wait_projected(s, names, TIMEOUT_S, live)
        finally:
            worker.kill()
            worker.wait(30)
    events = events_of(s, sub.submission_id)
    done = [e for e in events if isinstance(e, ModelResponseCompleted)]
    assert [(e.provider, e.model, e.usage) for e in done] == [
        ("openai", "local-1", Usage(input_tokens=100, output_tokens=20, cached_input_tokens=64, reasoning_tokens=8)),
        ("openai", "local-1", Usage(input_tokens=130, output_tokens=4, cached_input_tokens=0, reasoning_tokens=0)),
    ]
    assert done[0].tool_calls[0].args_json == '{"amount":5}'
    sent = [r.headers["idempotency-key"] for r in received]
    assert [done[0].operation_id, done[1].operation_id] == [sent[1], sent[2]] and sent[0] == sent[1], (
        "the cut call and its retry share the operation id, and each completed response records the one it sent"
    )
    # The cut stream left its deltas as audit content and no completed response (docs/semantics.md §9), and is
    # recorded as interrupted: its usage unknown (the usage chunk never came), the output it sent counted (issue 19).
    deltas = [(e.response_ordinal, e.delta_index, e.text) for e in events if isinstance(e, ModelResponseDelta)]
    assert deltas == [(0, 0, "Let me "), (0, 1, "look"), (2, 0, "Charged.")]  # the tool call is ordinal 1
    (cut,) = [e for e in events if isinstance(e, ModelResponseInterrupted)]
    assert (cut.response_ordinal, cut.operation_id, cut.first_delta_index, cut.delta_count) == (0, sent[0], 0, 2)
    assert (cut.output_chars, cut.usage) == (len("Let me look"), None)
    rows = projection_rows(s, names, "model_usage")
    assert sorted(
        ((r["input_tokens"], r["output_tokens"], r["request_id"]) for r in rows), key=lambda r: r[2] or ""
    ) == [(None, None, None), (100, 20, "req-2"), (130, 4, "req-3")]
    (run,) = projection_rows(s, names, "run_usage")
    summed = (
        "submission_id",
        "model_calls",
        "calls_with_usage",
        "input_tokens",
        "output_tokens",
        "cached_input_tokens",
        "reasoning_tokens",
    )
    assert tuple(run[c] for c in summed) == (sub.submission_id, 3, 2, 230, 24, 64, 8)
    check_clean(s, names, "DUR-015.rebuild")  # the usage rows are a projection of the log like every other
