"""The replay model provider (issue 8, Build item 2): pure logic, no tool server, no Kafka."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from settled_bfcl import (
    AssistantText,
    AssistantToolCalls,
    Corpus,
    Entry,
    Message,
    ModelResponse,
    ModelToolCall,
    ReplayError,
    ReplayHistoryError,
    ReplayMode,
    ReplayModel,
    ToolResultMessage,
    UnreplayableEntryError,
    UserMessage,
    adversarial_call,
    final_reply_text,
    replayable_entries,
    run_oracle,
)

pytestmark = pytest.mark.bfcl

MODES = [ReplayMode.ONE_CALL, ReplayMode.BATCH, ReplayMode.RANDOM_CHUNKS]


def _identical(left: object, right: object) -> bool:
    """JSON equality that keeps int, float and bool apart (15 is not 15.0)."""
    if type(left) is not type(right):
        return False
    if isinstance(left, list) and isinstance(right, list):
        return len(left) == len(right) and all(_identical(a, b) for a, b in zip(left, right, strict=True))
    if isinstance(left, dict) and isinstance(right, dict):
        return left.keys() == right.keys() and all(_identical(left[k], right[k]) for k in left)
    return left == right


def _drive(model: ReplayModel, entry: Entry, *, check_replays: Iterable[ReplayModel] = ()) -> list[list[ModelResponse]]:
    """Run every turn, feeding back the model's own calls and the oracle's outputs (refusing unoffered tools).

    At every step the same history is also given to ``check_replays`` (other instances: a takeover) and to the
    model again (a replay); each must give the same response.
    """
    outputs = run_oracle(entry).outputs
    turns: list[list[ModelResponse]] = []
    for turn in entry.turns:
        history: list[Message] = [UserMessage(turn.user_text)]
        responses: list[ModelResponse] = []
        while True:
            response = model.respond(entry.id, turn.index, history)
            assert model.respond(entry.id, turn.index, list(history)) == response
            for other in check_replays:
                assert other.respond(entry.id, turn.index, list(history)) == response
            responses.append(response)
            assert len(responses) <= len(turn.calls) + 2, f"{entry.id} turn {turn.index} does not end"
            if response.is_final:
                break
            history.append(response.as_message())
            for call in response.tool_calls:
                if call.tool_name in turn.tools:
                    history.append(ToolResultMessage(call.call_id, outputs[call.call_id]))
                else:
                    history.append(ToolResultMessage(call.call_id, "refused: not offered", is_error=True))
        turns.append(responses)
    return turns


def _check_reproduces_ground_truth(model: ReplayModel, entry: Entry, turns: list[list[ModelResponse]]) -> None:
    for turn, responses in zip(entry.turns, turns, strict=True):
        calls = [call for response in responses for call in response.tool_calls]
        assert [c.call_id for c in calls] == [g.call_id for g in turn.calls], (entry.id, turn.index)
        assert [c.call_id for c in calls] == [f"{entry.id}/t{turn.index}/c{j}" for j in range(len(turn.calls))]
        for call, truth in zip(calls, turn.calls, strict=True):
            assert call.tool_name == truth.method
            assert _identical(call.arguments, dict(truth.arguments)), (call.call_id, call.arguments, truth.source)
        assert responses[-1] == ModelResponse(text=final_reply_text(entry, turn.index))
        assert all(not r.is_final for r in responses[:-1])
        sizes = [len(r.tool_calls) for r in responses[:-1]]
        if model.mode is ReplayMode.ONE_CALL:
            assert sizes == [1] * len(turn.calls)
        elif model.mode is ReplayMode.BATCH:
            assert sizes == ([len(turn.calls)] if turn.calls else [])
        else:
            assert sum(sizes) == len(turn.calls) and all(size >= 1 for size in sizes)


@pytest.mark.parametrize("mode", MODES)
def test_every_base_entry_replays_its_ground_truth_exactly(base_corpus: Corpus, mode: ReplayMode) -> None:
    model = ReplayModel(base_corpus, mode, seed=11)
    takeover = ReplayModel(base_corpus, mode.value, seed=11)  # a fresh instance (a new owner) answers the same
    assert len(replayable_entries(base_corpus)) == 200
    for entry in base_corpus:
        _check_reproduces_ground_truth(model, entry, _drive(model, entry, check_replays=[takeover]))


@pytest.mark.parametrize("mode", MODES)
def test_every_replayable_miss_func_entry_replays_its_ground_truth(miss_func_corpus: Corpus, mode: ReplayMode) -> None:
    model = ReplayModel(miss_func_corpus, mode, seed=3)
    entries = replayable_entries(miss_func_corpus)
    assert len(entries) == 199
    for entry in entries:
        _check_reproduces_ground_truth(model, entry, _drive(model, entry))


def test_random_chunks_depend_on_the_seed_and_nothing_else(base_corpus: Corpus) -> None:
    def shapes(model: ReplayModel) -> list[tuple[int, ...]]:
        out: list[tuple[int, ...]] = []
        for entry in base_corpus:
            for turn in entry.turns:
                out.append(tuple(len(chunk) for chunk in model.script(entry.id, turn.index).chunks))
        return out

    seven = shapes(ReplayModel(base_corpus, ReplayMode.RANDOM_CHUNKS, seed=7))
    assert shapes(ReplayModel(base_corpus, ReplayMode.RANDOM_CHUNKS, seed=7)) == seven
    assert shapes(ReplayModel(base_corpus, ReplayMode.RANDOM_CHUNKS, seed=8)) != seven
    multi_call_turns = [shape for shape in seven if sum(shape) > 1]
    assert any(len(shape) == 1 for shape in multi_call_turns)  # some turns are one batch
    assert any(len(shape) == sum(shape) for shape in multi_call_turns)  # some are one call at a time
    assert any(1 < len(shape) < sum(shape) for shape in multi_call_turns)  # and some are really chunked


def test_position_comes_from_the_results_present_so_a_partly_answered_batch_resumes(base_corpus: Corpus) -> None:
    entry = next(e for e in base_corpus if any(len(t.calls) >= 4 for t in e.turns))
    turn = next(t for t in entry.turns if len(t.calls) >= 4)
    model = ReplayModel(base_corpus, ReplayMode.BATCH)
    outputs = run_oracle(entry).outputs
    history: list[Message] = [UserMessage(turn.user_text)]
    batch = model.respond(entry.id, turn.index, history)
    assert len(batch.tool_calls) == len(turn.calls)
    history.append(batch.as_message())
    for done, call in enumerate(batch.tool_calls[:2], start=1):
        history.append(ToolResultMessage(call.call_id, outputs[call.call_id]))
        # A crash after ``done`` results: the model is asked again and continues with the rest of the batch.
        rest = model.respond(entry.id, turn.index, history)
        assert rest.tool_calls == batch.tool_calls[done:]
    # The same position without the dangling assistant message (a runtime that re-asks from the results alone).
    partial: list[Message] = [
        UserMessage(turn.user_text),
        AssistantToolCalls(batch.tool_calls[:2]),
        *(ToolResultMessage(c.call_id, outputs[c.call_id]) for c in batch.tool_calls[:2]),
    ]
    assert model.respond(entry.id, turn.index, partial).tool_calls == batch.tool_calls[2:]


def test_earlier_turns_in_the_history_are_ignored(base_corpus: Corpus) -> None:
    entry = base_corpus.get("multi_turn_base_0")
    model = ReplayModel(base_corpus)
    earlier: list[Message] = [UserMessage(entry.turns[0].user_text), AssistantText("whatever came before")]
    fresh = model.respond(entry.id, 1, [UserMessage(entry.turns[1].user_text)])
    assert model.respond(entry.id, 1, [*earlier, UserMessage(entry.turns[1].user_text)]) == fresh


def test_arguments_keep_float_and_int_and_are_fresh_copies(base_corpus: Corpus) -> None:
    entry = base_corpus.get("multi_turn_base_55")
    assert entry.call("multi_turn_base_55/t0/c1").source == "fillFuelTank(15.0)"
    model = ReplayModel(base_corpus, ReplayMode.BATCH)
    history: list[Message] = [UserMessage(entry.turns[0].user_text)]
    first = model.respond(entry.id, 0, history)
    call = first.tool_calls[1]
    assert call == ModelToolCall("multi_turn_base_55/t0/c1", "fillFuelTank", {"fuelAmount": 15.0})
    assert type(call.arguments["fuelAmount"]) is float
    call.arguments["fuelAmount"] = 99  # a consumer that mutates what it got cannot change the next answer
    again = model.respond(entry.id, 0, history).tool_calls[1].arguments["fuelAmount"]
    assert again == 15.0 and type(again) is float
    assert dict(entry.call("multi_turn_base_55/t0/c1").arguments) == {"fuelAmount": 15.0}


def test_adversarial_mode_calls_the_missing_function_in_the_turn_before_the_holdout(miss_func_corpus: Corpus) -> None:
    model = ReplayModel(miss_func_corpus, ReplayMode.ONE_CALL, adversarial=True)
    entries = replayable_entries(miss_func_corpus)
    for entry in entries:
        turns = _drive(model, entry)
        holdout = next(t for t in entry.turns if t.is_holdout)
        before = entry.turns[holdout.index - 1]
        for turn, responses in zip(entry.turns, turns, strict=True):
            calls = [c for r in responses for c in r.tool_calls]
            if turn is before:
                bad = calls[0]
                assert bad.call_id == f"{entry.id}/t{turn.index}/x0"
                assert bad.tool_name not in turn.tools and bad.tool_name in turn.held_out
                assert bad.tool_name in holdout.restored
                assert bad == adversarial_call(entry, turn.index)
                assert [c.call_id for c in calls[1:]] == [g.call_id for g in turn.calls] == []
            else:
                assert [c.call_id for c in calls] == [g.call_id for g in turn.calls]
            assert responses[-1].text == final_reply_text(entry, turn.index)
    # It names the holdout turn's own call when it uses the missing function (wc in miss_func_0's case, say).
    entry = miss_func_corpus.get("multi_turn_miss_func_0")
    holdout = next(t for t in entry.turns if t.is_holdout)
    missing = adversarial_call(entry, holdout.index - 1)
    assert missing is not None
    used = next(c for c in holdout.calls if c.method == missing.tool_name)
    assert missing.arguments == dict(used.arguments)


def test_adversarial_mode_changes_nothing_without_held_out_functions(base_corpus: Corpus) -> None:
    plain = ReplayModel(base_corpus, ReplayMode.ONE_CALL)
    adversarial = ReplayModel(base_corpus, ReplayMode.ONE_CALL, adversarial=True)
    for entry in list(base_corpus)[:50]:
        for turn in entry.turns:
            assert adversarial.script(entry.id, turn.index) == plain.script(entry.id, turn.index)


def test_the_entry_calling_a_tool_before_it_is_offered_is_refused(miss_func_corpus: Corpus) -> None:
    model = ReplayModel(miss_func_corpus)
    entry = miss_func_corpus.get("multi_turn_miss_func_49")
    with pytest.raises(UnreplayableEntryError, match=r"multi_turn_miss_func_49/t1/c1") as caught:
        model.respond(entry.id, 0, [UserMessage(entry.turns[0].user_text)])
    assert caught.value.call_ids == ("multi_turn_miss_func_49/t1/c1",)
    assert entry not in replayable_entries(miss_func_corpus)


def test_conversation_ids_map_to_entries(base_corpus: Corpus) -> None:
    model = ReplayModel(base_corpus, entry_id_for=lambda cid: cid.split("~", 1)[0])
    entry = base_corpus.get("multi_turn_base_3")
    response = model.respond("multi_turn_base_3~run2", 0, [UserMessage(entry.turns[0].user_text)])
    assert response.tool_calls[0].call_id == "multi_turn_base_3/t0/c0"
    assert model.tools("multi_turn_base_3~run2", 0) == entry.tools_for_turn(0)
    assert model.user_text("multi_turn_base_3~run2", 0) == entry.turns[0].user_text
    with pytest.raises(ReplayError, match=r"'nope~1' maps to entry 'nope'"):
        model.respond("nope~1", 0, [])


def test_histories_that_do_not_fit_the_turn_are_refused_with_the_message_named(base_corpus: Corpus) -> None:
    entry = base_corpus.get("multi_turn_base_0")
    turn = next(t for t in entry.turns if len(t.calls) >= 2)
    model = ReplayModel(base_corpus, ReplayMode.ONE_CALL)
    user = UserMessage(turn.user_text)
    first = model.respond(entry.id, turn.index, [user]).tool_calls[0]
    second_id = turn.calls[1].call_id
    cases: list[tuple[list[Message], str]] = [
        ([], "has no user message"),
        ([UserMessage("something else")], "is the user message 'something else'"),
        ([user, ToolResultMessage(first.call_id, "x")], rf"result for call '{first.call_id}'; expected no result"),
        (
            [user, AssistantToolCalls((first,)), ToolResultMessage(second_id, "x")],
            rf"result for call '{second_id}'; expected {first.call_id}",
        ),
        (
            [user, AssistantToolCalls((first._replace(call_id="bogus"),))],
            rf"tool call 'bogus' where the plan has {first.call_id}",
        ),
        (
            [user, AssistantToolCalls((first._replace(arguments={"x": 1}),))],
            rf"call '{first.call_id}' is {first.tool_name}\(\{{'x': 1\}}\)",
        ),
        ([user, AssistantText("done")], "a final text already given"),
    ]
    for history, message in cases:
        with pytest.raises(ReplayHistoryError, match=message):
            model.respond(entry.id, turn.index, history)
    with pytest.raises(ReplayError, match=r"turn_index 99 is out of range for entry 'multi_turn_base_0'"):
        model.respond(entry.id, 99, [user])


def test_bad_constructor_arguments_are_named(base_corpus: Corpus) -> None:
    with pytest.raises(ReplayError, match=r"mode 'sometimes' is not a replay mode"):
        ReplayModel(base_corpus, "sometimes")
    with pytest.raises(ReplayError, match=r"seed '7' must be an int"):
        ReplayModel(base_corpus, seed="7")  # type: ignore[arg-type]
    with pytest.raises(ReplayError, match=r"'multi_turn_base_0' appears twice"):
        ReplayModel([base_corpus.get("multi_turn_base_0")] * 2)
    with pytest.raises(ValueError, match=r"exactly one of tool_calls"):
        ModelResponse()
