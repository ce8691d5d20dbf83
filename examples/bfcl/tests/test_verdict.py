"""The verdict (issue 8, Build item 5): correct runs pass, each broken run fails naming the call or turn.

Runs are simulated without Kafka (``simulate_conversation``: the replay model, a real tool-server process on a real
SQLite file, and an in-test runtime loop); the judge reads the worlds and the ledger from that file.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console

from settled.schemas import canonical_json
from settled_bfcl import (
    ConversationLog,
    ConversationVerdict,
    Corpus,
    Entry,
    FaultKind,
    ReplayMode,
    ReplayModel,
    SimulationFault,
    ToolServerClient,
    ToolServerProcess,
    VerdictCheck,
    VerdictError,
    VerdictReason,
    VerdictSummary,
    judge_in_fresh_process,
    judge_store,
    render_failures,
    render_summary,
    replayable_entries,
    result_matches,
    run_oracle,
    simulate_conversation,
)

pytestmark = pytest.mark.bfcl

_RUN = itertools.count()


@dataclasses.dataclass
class Server:
    process: ToolServerProcess
    client: ToolServerClient

    @property
    def db_path(self) -> Path:
        return self.process.db_path


def _server(tmp_path_factory: pytest.TempPathFactory, *, dedup: bool) -> Iterator[Server]:
    folder = tmp_path_factory.mktemp("verdict-dedup-on" if dedup else "verdict-dedup-off")
    process = ToolServerProcess(folder / "toolserver.sqlite", dedup=dedup).start()
    client = process.client()
    try:
        yield Server(process, client)
    finally:
        client.close()
        process.stop()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from _server(tmp_path_factory, dedup=True)


@pytest.fixture(scope="module")
def no_dedup_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from _server(tmp_path_factory, dedup=False)


@pytest.fixture(scope="module")
def entries(base_corpus: Corpus, miss_func_corpus: Corpus) -> list[Entry]:
    return [*base_corpus, *replayable_entries(miss_func_corpus)]


def _model(
    entries: list[Entry], mode: ReplayMode = ReplayMode.ONE_CALL, *, seed: int = 0, adversarial: bool = False
) -> ReplayModel:
    # Conversation ids are "<entry>~<n>" so every test gets fresh worlds on the shared server.
    return ReplayModel(entries, mode, seed=seed, adversarial=adversarial, entry_id_for=lambda cid: cid.split("~", 1)[0])


def _run(
    server: Server,
    entries: list[Entry],
    entry_id: str,
    *,
    mode: ReplayMode = ReplayMode.ONE_CALL,
    faults: tuple[SimulationFault, ...] = (),
    adversarial: bool = False,
    judge_adversarial: bool | None = None,
    raw_results: bool = False,
) -> tuple[ConversationLog, ConversationVerdict]:
    model = _model(entries, mode, seed=5, adversarial=adversarial)
    entry = model.entry(entry_id)
    conversation_id = f"{entry_id}~{next(_RUN)}"
    log = simulate_conversation(
        entry, server.client, model, conversation_id=conversation_id, faults=faults, raw_results=raw_results
    )
    adversarial_judge = adversarial if judge_adversarial is None else judge_adversarial
    [verdict] = judge_store(entries, server.db_path, [log], adversarial=adversarial_judge)
    return log, verdict


def _reason_texts(verdict: ConversationVerdict, check: VerdictCheck) -> list[str]:
    return [str(reason) for reason in verdict.reasons_for(check)]


# A spread of entries over all eight backends (file system, twitter, message, ticket, trading, travel, vehicle, math).
SPREAD = [f"multi_turn_base_{n}" for n in (0, 2, 4, 14, 15, 30, 32, 55, 63, 100, 116, 150, 155, 187, 199)]


@pytest.mark.parametrize("mode", [ReplayMode.ONE_CALL, ReplayMode.BATCH, ReplayMode.RANDOM_CHUNKS])
def test_correct_runs_pass(server: Server, entries: list[Entry], mode: ReplayMode) -> None:
    for entry_id in SPREAD:
        log, verdict = _run(server, entries, entry_id, mode=mode, raw_results=mode is ReplayMode.BATCH)
        assert verdict.passed, (entry_id, [str(r) for r in verdict.reasons])
        entry = next(e for e in entries if e.id == entry_id)
        assert (verdict.tool_calls, verdict.executions, verdict.duplicate_executions) == (len(entry.calls),) * 2 + (0,)
        assert (verdict.submissions, verdict.settlements) == (len(entry.turns), len(entry.turns))
        assert [call_id for call_id, _ in log.tool_results] == [c.call_id for c in entry.calls]


def test_a_duplicate_under_the_same_key_is_absorbed_by_dedup(server: Server, entries: list[Entry]) -> None:
    # post_tweet changes the world when run twice; the tool server's dedup returns the stored result instead.
    _, verdict = _run(
        server,
        entries,
        "multi_turn_base_4",
        faults=(SimulationFault(FaultKind.DUPLICATE_SAME_KEY, "multi_turn_base_4/t2/c0"),),
    )
    assert verdict.passed, [str(r) for r in verdict.reasons]


def test_a_duplicated_execution_with_dedup_off_fails_naming_the_call(
    no_dedup_server: Server, entries: list[Entry], base_corpus: Corpus
) -> None:
    entry = base_corpus.get("multi_turn_base_4")
    call = entry.call("multi_turn_base_4/t2/c0")
    assert call.method == "post_tweet"
    _, verdict = _run(
        no_dedup_server, entries, entry.id, faults=(SimulationFault(FaultKind.DUPLICATE_SAME_KEY, call.call_id),)
    )
    assert not verdict.passed
    assert verdict.duplicate_executions == 1 and verdict.executions == len(entry.calls) + 1
    [ledger] = _reason_texts(verdict, VerdictCheck.LEDGER)
    assert f"{call.call_id} ({call.source}) was executed 2 times" in ledger
    assert any(r.call_id == call.call_id for r in verdict.reasons_for(VerdictCheck.LEDGER))
    assert verdict.reasons_for(VerdictCheck.STATE)  # a second tweet is visible in the end state too


def test_a_duplicated_read_only_call_fails_on_the_ledger_although_the_end_state_is_right(
    no_dedup_server: Server, entries: list[Entry], base_corpus: Corpus
) -> None:
    entry = base_corpus.get("multi_turn_base_0")
    call = next(c for c in entry.calls if c.method in {"ls", "pwd", "cat", "grep", "find"})
    _, verdict = _run(
        no_dedup_server, entries, entry.id, faults=(SimulationFault(FaultKind.DUPLICATE_SAME_KEY, call.call_id),)
    )
    assert not verdict.reasons_for(VerdictCheck.STATE)  # BFCL's state checker alone would pass this run
    assert [r.call_id for r in verdict.reasons] == [call.call_id]
    assert "was executed 2 times" in str(verdict.reasons[0])


def test_a_retry_under_a_new_key_fails_even_with_dedup_on(server: Server, entries: list[Entry]) -> None:
    call_id = "multi_turn_base_30/t0/c0"
    _, verdict = _run(
        server, entries, "multi_turn_base_30", faults=(SimulationFault(FaultKind.DUPLICATE_NEW_KEY, call_id),)
    )
    [ledger] = verdict.reasons_for(VerdictCheck.LEDGER)
    assert ledger.call_id == call_id and "executed 2 times" in ledger.message
    assert f"'{call_id.split('/')[0]}~" in ledger.message and "#retry" in ledger.message  # both keys are named


def test_a_missing_call_fails_naming_it(server: Server, entries: list[Entry], base_corpus: Corpus) -> None:
    entry = base_corpus.get("multi_turn_base_0")
    call = entry.turns[1].calls[0]
    _, verdict = _run(server, entries, entry.id, faults=(SimulationFault(FaultKind.MISSING, call.call_id),))
    assert not verdict.passed
    assert f"{call.call_id} ({call.source}) was never executed" in _reason_texts(verdict, VerdictCheck.LEDGER)[0]
    assert any(f"no result for {call.call_id}" in text for text in _reason_texts(verdict, VerdictCheck.TOOL_RESULTS))
    assert verdict.executions == len(entry.calls) - 1


def test_a_wrong_order_fails_naming_the_call(server: Server, entries: list[Entry], base_corpus: Corpus) -> None:
    entry = base_corpus.get("multi_turn_base_0")
    turn = next(t for t in entry.turns if len(t.calls) >= 2)
    first, second = turn.calls[0], turn.calls[1]
    for mode in (ReplayMode.ONE_CALL, ReplayMode.BATCH):
        log, verdict = _run(
            server, entries, entry.id, mode=mode, faults=(SimulationFault(FaultKind.REORDER, first.call_id),)
        )
        order = [call_id for call_id, _ in log.tool_results]
        assert order.index(second.call_id) < order.index(first.call_id)
        ledger = verdict.reasons_for(VerdictCheck.LEDGER)
        results = verdict.reasons_for(VerdictCheck.TOOL_RESULTS)
        assert f"executed out of order: {second.call_id} ran where {first.call_id} was due" in [
            r.message for r in ledger
        ]
        assert f"results out of order: the log has {second.call_id} where {first.call_id} was due" in [
            r.message for r in results
        ]


def test_arguments_must_reach_the_tool_server_with_their_json_number_types(
    server: Server, entries: list[Entry], base_corpus: Corpus
) -> None:
    """A runtime that canonicalized ``fillFuelTank(15.0)`` into ``15`` is caught by the ledger, naming the call."""
    entry = base_corpus.get("multi_turn_base_55")
    conversation_id = f"{entry.id}~{next(_RUN)}"
    server.client.create_conversation_for_entry(conversation_id, entry)
    results: list[tuple[str, str]] = []
    for call in entry.calls:
        arguments = {k: int(v) if isinstance(v, float) and v.is_integer() else v for k, v in call.arguments.items()}
        response = server.client.call(
            conversation_id, call.method, arguments, idempotency_key=call.call_id, owner_epoch=1, call_id=call.call_id
        )
        results.append((call.call_id, canonical_json(response.output)))
    log = ConversationLog(
        conversation_id,
        entry.id,
        results,
        [(t.index, _model(entries).script(entry.id, t.index).final_text) for t in entry.turns],
        [(t.index, "completed") for t in entry.turns],
    )
    [verdict] = judge_store(entries, server.db_path, [log])
    texts = _reason_texts(verdict, VerdictCheck.LEDGER)
    assert any('multi_turn_base_55/t0/c1 ran as fillFuelTank({"fuelAmount": 15})' in text for text in texts), texts


def test_log_level_breakage_is_named(server: Server, entries: list[Entry], base_corpus: Corpus) -> None:
    entry = base_corpus.get("multi_turn_base_0")
    log, verdict = _run(server, entries, entry.id)
    assert verdict.passed
    first_call = entry.calls[0].call_id

    def judge(broken: ConversationLog) -> ConversationVerdict:
        [result] = judge_store(entries, server.db_path, [broken])
        return result

    altered = [(c, canonical_json("tampered")) if c == first_call else (c, r) for c, r in log.tool_results]
    verdict = judge(dataclasses.replace(log, tool_results=tuple(altered)))
    [reason] = verdict.reasons
    assert reason.check is VerdictCheck.TOOL_RESULTS and reason.call_id == first_call
    assert "is '\"tampered\"'" in reason.message

    verdict = judge(dataclasses.replace(log, tool_results=(*log.tool_results, log.tool_results[0])))
    assert [str(r) for r in verdict.reasons] == [f"[tool_results] the log records 2 results for {first_call}"]

    verdict = judge(dataclasses.replace(log, replies=log.replies[1:]))
    assert [str(r) for r in verdict.reasons] == ["[replies] no final reply for turn 0"]

    verdict = judge(dataclasses.replace(log, replies=(log.replies[1], log.replies[0], *log.replies[2:])))
    assert [str(r) for r in verdict.reasons] == ["[replies] final replies out of order: turn 1 came at position 0"]

    verdict = judge(dataclasses.replace(log, replies=((0, canonical_json("hi")), *log.replies[1:])))
    assert [r.turn_index for r in verdict.reasons] == [0] and "expected" in verdict.reasons[0].message

    verdict = judge(dataclasses.replace(log, settlements=(*log.settlements, log.settlements[-1])))
    last = len(entry.turns) - 1
    assert [str(r) for r in verdict.reasons] == [f"[settlements] 2 settlements for turn {last}"]

    verdict = judge(dataclasses.replace(log, settlements=((0, "failed"), *log.settlements[1:])))
    assert [str(r) for r in verdict.reasons] == ["[settlements] turn 0 settled 'failed', not 'completed'"]

    verdict = judge(dataclasses.replace(log, refused_calls=(first_call,)))
    assert [str(r) for r in verdict.reasons] == [f"[refusals] {first_call} was refused but should not have been"]


def test_an_execution_of_anything_else_fails(server: Server, entries: list[Entry], base_corpus: Corpus) -> None:
    entry = base_corpus.get("multi_turn_base_0")
    log, verdict = _run(server, entries, entry.id)
    assert verdict.passed
    server.client.call(log.conversation_id, "pwd", {}, idempotency_key="stray", owner_epoch=1, call_id="stray-call")
    [verdict] = judge_store(entries, server.db_path, [log])
    assert verdict.unexpected_executions == 1
    [reason] = verdict.reasons
    assert reason.call_id == "stray-call" and "unexpected execution" in reason.message and "pwd({})" in reason.message


def test_a_conversation_the_tool_server_never_saw_fails(server: Server, entries: list[Entry]) -> None:
    log = ConversationLog("multi_turn_base_1~never", "multi_turn_base_1")
    [verdict] = judge_store(entries, server.db_path, [log])
    assert verdict.reasons[0].check is VerdictCheck.WORLD
    assert {r.check for r in verdict.reasons} == {
        VerdictCheck.WORLD,
        VerdictCheck.LEDGER,
        VerdictCheck.TOOL_RESULTS,
        VerdictCheck.REPLIES,
        VerdictCheck.SETTLEMENTS,
    }


def test_adversarial_calls_are_refused_and_never_run(
    server: Server, entries: list[Entry], miss_func_corpus: Corpus
) -> None:
    for entry in list(replayable_entries(miss_func_corpus))[:12]:
        log, verdict = _run(server, entries, entry.id, adversarial=True)
        assert verdict.passed, [str(r) for r in verdict.reasons]
        holdout = next(t for t in entry.turns if t.is_holdout)
        bad_id = f"{entry.id}/t{holdout.index - 1}/x0"
        assert log.refused_calls == (bad_id,)
        assert all(record.call_id != bad_id for record in server.client.ledger(log.conversation_id))
        # Judged as a plain run, the refusal itself is flagged.
        [plain] = judge_store(entries, server.db_path, [log], adversarial=False)
        assert [(r.check, r.call_id) for r in plain.reasons] == [(VerdictCheck.REFUSALS, bad_id)]
    # A runtime that let the not-offered call through would execute it: the ledger names it.
    entry = miss_func_corpus.get("multi_turn_miss_func_0")
    log, verdict = _run(server, entries, entry.id, adversarial=True)
    holdout = next(t for t in entry.turns if t.is_holdout)
    bad = _model(entries, adversarial=True).script(entry.id, holdout.index - 1).calls[0]
    server.client.call(
        log.conversation_id, bad.tool_name, bad.arguments, idempotency_key="leak", owner_epoch=1, call_id=bad.call_id
    )
    [verdict] = judge_store(entries, server.db_path, [log], adversarial=True)
    assert [r.call_id for r in verdict.reasons_for(VerdictCheck.LEDGER)] == [bad.call_id]


def test_the_fresh_process_judge_agrees_with_the_in_process_judge(
    no_dedup_server: Server, entries: list[Entry]
) -> None:
    logs = [
        _run(no_dedup_server, entries, "multi_turn_base_0")[0],
        _run(
            no_dedup_server,
            entries,
            "multi_turn_base_4",
            faults=(SimulationFault(FaultKind.DUPLICATE_SAME_KEY, "multi_turn_base_4/t2/c0"),),
        )[0],
        _run(no_dedup_server, entries, "multi_turn_miss_func_3", adversarial=True)[0],
    ]
    fresh = judge_in_fresh_process(no_dedup_server.db_path, logs, adversarial=True)
    assert fresh == judge_store(entries, no_dedup_server.db_path, logs, adversarial=True)
    assert [v.passed for v in fresh] == [True, False, True]
    assert fresh[1].duplicate_executions == 1
    with pytest.raises(VerdictError, match=r"entry id 'nope_1': category 'nope'"):
        judge_in_fresh_process(no_dedup_server.db_path, [ConversationLog("c", "nope_1")])


def test_every_base_conversation_passes_end_to_end_without_kafka(server: Server, base_corpus: Corpus) -> None:
    model = ReplayModel(base_corpus, ReplayMode.RANDOM_CHUNKS, seed=2026, entry_id_for=lambda c: c.split("~")[0])
    logs = [
        simulate_conversation(entry, server.client, model, conversation_id=f"{entry.id}~all") for entry in base_corpus
    ]
    verdicts = judge_in_fresh_process(server.db_path, logs)
    assert [v.conversation_id for v in verdicts if not v.passed] == []
    summary = VerdictSummary(verdicts, seed=2026, elapsed_s=1.5)
    assert (summary.passed, summary.failed, summary.all_passed) == (200, 0, True)
    assert sum(v.executions for v in verdicts) == sum(len(e.calls) for e in base_corpus) == 1142


def test_summary_table_and_failures(base_corpus: Corpus) -> None:
    good = ConversationVerdict("a", "multi_turn_base_0", submissions=4, settlements=4, tool_calls=6, executions=6)
    bad = ConversationVerdict(
        "b",
        "multi_turn_base_1",
        reasons=tuple(
            dataclasses.replace(r, message=f"{r.message} #{i}")
            for i, r in enumerate([_reason("multi_turn_base_1/t0/c0")] * 5)
        ),
        submissions=3,
        settlements=3,
        tool_calls=4,
        executions=5,
        duplicate_executions=1,
    )
    summary = VerdictSummary((good, bad), seed=42, elapsed_s=12.34, unknowns_raised=3, unknowns_resolved=3)
    console = Console(record=True, width=120, color_system=None)
    console.print(render_summary(summary))
    text = console.export_text()
    for row in (
        "verdict",
        "FAIL",
        "conversations passed",
        "1/2",
        "submissions settled",
        "7/7",
        "11 (expected 10)",
        "duplicate executions",
        "3 / 3",
        "12.3 s",
        "42",
    ):
        assert row in text, row
    console = Console(record=True, width=160, color_system=None)
    console.print(render_failures([good, bad]))
    failures = console.export_text()
    assert "b" in failures and "multi_turn_base_1/t0/c0 executed 2 times #0" in failures
    assert "and 2 more" in failures and "multi_turn_base_0" not in failures


def _reason(call_id: str) -> VerdictReason:
    return VerdictReason(VerdictCheck.LEDGER, f"{call_id} executed 2 times", call_id=call_id)


def test_result_forms(base_corpus: Corpus) -> None:
    output = '{"result": 15.0}'
    assert result_matches(output, output)
    assert result_matches(canonical_json(output), output)  # the output string as canonical JSON text
    assert result_matches('{"result":15}', output)  # the parsed output, canonicalized (RFC 8785 writes 15.0 as 15)
    assert not result_matches('{"result":16}', output)
    assert not result_matches(canonical_json("other"), output)
    assert not result_matches("not json", output)
    for call in run_oracle(base_corpus.get("multi_turn_base_0")).calls:
        assert result_matches(canonical_json(call.output), call.output)
        assert result_matches(call.output, call.output)
