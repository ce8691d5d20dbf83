"""Approvals in the BFCL job (issue 16 item 8), without Kafka: the gated list, the operator's rule, the replay model
after a denial, and the verdict against the reference run with the denied calls skipped.

Runs are simulated (``simulate_conversation``: the replay model, a real tool-server process on its SQLite file, an
in-test runtime loop that gates the state-changing calls with the operator's rule); the judge reads that file.
"""

from __future__ import annotations

import base64
import copy
import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from settled.protocol import approval_details
from settled.runtime import denial_result
from settled.schemas import canonical_json
from settled_bfcl import (
    CATEGORIES,
    Corpus,
    Entry,
    FaultKind,
    ReplayMode,
    ReplayModel,
    SimulationFault,
    ToolResultMessage,
    ToolServerClient,
    ToolServerProcess,
    UserMessage,
    VerdictCheck,
    final_reply_text,
    judge_store,
    load_corpus,
    method_index,
    run_oracle,
    simulate_conversation,
)
from settled_bfcl._app import BfclAppConfig, build_app
from settled_bfcl._approvals import (
    APPROVER_KEY_ID,
    DENY_FRACTION,
    STATE_CHANGING_METHODS,
    approval_granted,
    approval_subject,
    denied_calls,
    expected_decisions,
    needs_approval,
    parse_denial,
)
from settled_bfcl._replay import AssistantToolCalls

pytestmark = pytest.mark.bfcl

SEED = 20261205
_RUN = itertools.count()


def _public(instance: object) -> dict[str, object]:
    return {k: copy.deepcopy(v) for k, v in vars(instance).items() if not k.startswith("_")}


def test_the_gated_list_names_real_methods_and_every_state_change_in_the_corpus() -> None:
    methods = set(method_index())
    assert STATE_CHANGING_METHODS <= methods, sorted(STATE_CHANGING_METHODS - methods)
    changed: set[str] = set()
    for category in CATEGORIES:
        for entry in load_corpus(category):
            world = entry.world()
            for call in entry.calls:
                instance = world.instances[world.class_of(call.method)]
                before = _public(instance)
                world.execute(call.method, call.arguments)
                if _public(instance) != before:
                    changed.add(call.method)
    # Every call that changed what BFCL's state checker compares is of a gated method: read-only ones never do.
    assert changed <= STATE_CHANGING_METHODS, sorted(changed - STATE_CHANGING_METHODS)
    assert not needs_approval("ls") and not needs_approval("get_stock_info") and not needs_approval("add")
    assert needs_approval("place_order") and needs_approval("cd") and needs_approval("post_tweet")


def test_the_operators_rule_is_a_function_of_the_seed_and_the_call_and_denies_about_a_quarter(
    base_corpus: Corpus,
) -> None:
    decisions = [d for entry in base_corpus for d in expected_decisions(entry, SEED).values()]
    assert decisions == [d for entry in base_corpus for d in expected_decisions(entry, SEED).values()]
    denied_share = decisions.count(False) / len(decisions)
    assert abs(denied_share - DENY_FRACTION) < 0.05, denied_share
    assert [approval_granted(SEED + 1, f"x/t0/c{i}") for i in range(40)] != [
        approval_granted(SEED, f"x/t0/c{i}") for i in range(40)
    ]
    entry = base_corpus.get("multi_turn_base_0")
    assert set(expected_decisions(entry, SEED)) == {c.call_id for c in entry.calls if needs_approval(c.method)}


def test_the_request_and_the_denial_read_back() -> None:
    args = {"arguments": {"dir_name": "x"}, "call_id": "e/t0/c1", "conversation_id": "e", "entry_id": "e"}
    details = approval_details("mkdir", "BFCL GorillaFileSystem.mkdir", canonical_json(args), tool="mkdir")
    assert approval_subject(details) == ("e/t0/c1", "mkdir")
    assert approval_subject(approval_details("refund", "", "{}", tool=None)) is None
    assert approval_subject(None) is None and approval_subject('{"description": "plain words"}') is None
    denial = parse_denial(canonical_json(denial_result("mkdir", "bfcl-approver", "no")))
    assert denial is not None and (denial.tool, denial.by, denial.reason) == ("mkdir", "bfcl-approver", "no")
    assert parse_denial('"ok"') is None and parse_denial('{"denied": true, "tool": "x"}') is None


def test_the_replay_model_goes_on_after_a_denial_and_names_it_in_its_final_text(base_corpus: Corpus) -> None:
    entry = base_corpus.get("multi_turn_base_0")
    turn = next(t for t in entry.turns if len(t.calls) >= 2)
    model = ReplayModel(base_corpus, ReplayMode.ONE_CALL)
    first, second = turn.calls[0], turn.calls[1]
    history: list[UserMessage | AssistantToolCalls | ToolResultMessage] = [UserMessage(turn.user_text)]
    response = model.respond(entry.id, turn.index, history)
    denial = canonical_json(denial_result(first.method, "k", "no"))
    history += [response.as_message(), ToolResultMessage(first.call_id, denial)]
    response = model.respond(entry.id, turn.index, history)
    assert [c.call_id for c in response.tool_calls] == [second.call_id], "the plan goes on after the denial"
    for call in turn.calls[1:]:
        response = model.respond(entry.id, turn.index, history)
        assert [c.call_id for c in response.tool_calls] == [call.call_id]
        history += [response.as_message(), ToolResultMessage(call.call_id, '"ok"')]
    final = model.respond(entry.id, turn.index, history)
    assert final.text == final_reply_text(entry, turn.index, [first.call_id])
    assert f"denied: {first.call_id}" in (final.text or "")
    assert final_reply_text(entry, turn.index) != final.text


# --- the verdict on simulated runs -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ToolServerClient, Path]]:
    folder = tmp_path_factory.mktemp("approvals")
    process = ToolServerProcess(folder / "toolserver.sqlite").start()
    c = process.client()
    try:
        yield c, process.db_path
    finally:
        c.close()
        process.stop()


def _run(
    client: tuple[ToolServerClient, Path],
    corpus: Corpus,
    entry_id: str,
    *,
    faults: tuple[SimulationFault, ...] = (),
    judge_seed: int | None = SEED,
) -> tuple[Entry, list[VerdictCheck], int, int]:
    server, db_path = client
    model = ReplayModel(corpus, ReplayMode.RANDOM_CHUNKS, seed=3, entry_id_for=lambda cid: cid.split("~", 1)[0])
    entry = corpus.get(entry_id)
    log = simulate_conversation(
        entry, server, model, conversation_id=f"{entry_id}~{next(_RUN)}", faults=faults, approvals_seed=SEED
    )
    [verdict] = judge_store(list(corpus), db_path, [log], approvals_seed=judge_seed)
    return entry, sorted({r.check for r in verdict.reasons}), verdict.approvals, verdict.denials


# Entries where the rule denies calls whose skipping changes the end state, over several backends.
WITH_DENIALS = [f"multi_turn_base_{n}" for n in (0, 2, 4, 14, 30, 55, 100, 150, 187)]


def test_runs_with_denials_pass_against_the_reference_with_the_denied_calls_skipped(
    client: tuple[ToolServerClient, Path], base_corpus: Corpus
) -> None:
    denials_total = 0
    differs = 0
    for entry_id in WITH_DENIALS:
        entry, checks, approvals, denials = _run(client, base_corpus, entry_id)
        assert checks == [], (entry_id, checks)
        expected = expected_decisions(entry, SEED)
        assert (approvals, denials) == (list(expected.values()).count(True), list(expected.values()).count(False))
        denials_total += denials
        skipped = run_oracle(entry, skip=denied_calls(entry, SEED))
        assert [c.call.call_id for c in skipped.calls] == [
            c.call_id for c in entry.calls if c.call_id not in denied_calls(entry, SEED)
        ]
        differs += skipped.outputs != {k: v for k, v in run_oracle(entry).outputs.items() if k in skipped.outputs}
    assert denials_total >= 5, "the rule denies calls in these entries"
    assert differs >= 1, "a skipped call changes a later call's output in some entry: the reference is not the oracle"


def test_a_denied_call_that_runs_fails_the_ledger(client: tuple[ToolServerClient, Path], base_corpus: Corpus) -> None:
    entry = base_corpus.get("multi_turn_base_2")
    denied = next(c for c in entry.calls if c.call_id in denied_calls(entry, SEED))
    _, checks, _, _ = _run(
        client, base_corpus, entry.id, faults=(SimulationFault(FaultKind.DENIED_RUNS, denied.call_id),)
    )
    assert VerdictCheck.LEDGER in checks and VerdictCheck.TOOL_RESULTS in checks, checks


def test_a_denial_the_model_never_saw_fails_the_reply_check(
    client: tuple[ToolServerClient, Path], base_corpus: Corpus
) -> None:
    entry = base_corpus.get("multi_turn_base_2")
    denied = next(c for c in entry.calls if c.call_id in denied_calls(entry, SEED))
    _, checks, _, _ = _run(
        client, base_corpus, entry.id, faults=(SimulationFault(FaultKind.DENIAL_HIDDEN, denied.call_id),)
    )
    assert checks == [VerdictCheck.REPLIES], checks


def test_decisions_other_than_the_rules_or_judged_as_a_run_without_approvals_fail(
    client: tuple[ToolServerClient, Path], base_corpus: Corpus
) -> None:
    _, checks, _, _ = _run(client, base_corpus, "multi_turn_base_2", judge_seed=SEED + 1)
    assert VerdictCheck.APPROVALS in checks, checks
    _, checks, _, _ = _run(client, base_corpus, "multi_turn_base_2", judge_seed=None)
    assert VerdictCheck.APPROVALS in checks and VerdictCheck.LEDGER in checks, checks


def test_the_app_gates_exactly_the_state_changing_tools_and_needs_the_approvers_key() -> None:
    key = base64.b64encode(
        Ed25519PrivateKey.generate().public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    ).decode()
    config = BfclAppConfig(toolserver_url="http://127.0.0.1:1", approvals=True, approver_key_b64=key)
    assert BfclAppConfig.from_env(config.env()) == config
    app = build_app(config)
    assert {spec.name for spec in app.tools if spec.gated} == STATE_CHANGING_METHODS
    assert dict(app.approver_keys) == {APPROVER_KEY_ID: key}
    assert not any(spec.gated for spec in build_app(BfclAppConfig(toolserver_url="http://127.0.0.1:1")).tools)
    with pytest.raises(ValueError, match="SETTLED_BFCL_APPROVER_KEY"):
        BfclAppConfig(toolserver_url="http://127.0.0.1:1", approvals=True)
