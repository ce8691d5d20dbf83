"""The tool server as a real process on a real SQLite file (issue 8, Build item 3). No mocks."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from settled_bfcl import (
    ConversationConflictError,
    Corpus,
    IdempotencyConflictError,
    StaleEpochError,
    ToolServerError,
    ToolServerProcess,
    ToolServerStore,
    UnknownConversationError,
    check_final_state,
    run_oracle,
)

pytestmark = pytest.mark.bfcl

ToolServerFactory = Callable[..., ToolServerProcess]  # the ``toolserver`` fixture (conftest.py)

TWITTER = {"TwitterAPI": {"authenticated": True, "username": "alice", "tweet_counter": 0}}
TRADING = {"TradingBot": {"authenticated": True}}


def _tweet_id(output: str) -> int:
    tweet_id: int = json.loads(output)["id"]
    return tweet_id


def test_idempotent_replay_returns_the_stored_result_and_executes_once(toolserver: ToolServerFactory) -> None:
    server = toolserver()
    with server.client() as client:
        assert client.create_conversation(
            "c1", entry_id="e", involved_classes=["TwitterAPI"], initial_config=TWITTER
        ).created
        first = client.call(
            "c1", "post_tweet", {"content": "hello"}, idempotency_key="k1", owner_epoch=1, call_id="e/t0/c0"
        )
        again = client.call(
            "c1", "post_tweet", {"content": "hello"}, idempotency_key="k1", owner_epoch=1, call_id="e/t0/c0"
        )
        assert (first.replayed, first.execution_count, first.idempotent) == (False, 1, True)
        assert (again.replayed, again.execution_count) == (True, 1)
        assert again.output == first.output and again.executed_at == first.executed_at
        assert _tweet_id(first.output) == 0
        # The world ran post_tweet once: the next tweet gets id 1, not 2.
        nxt = client.call("c1", "post_tweet", {"content": "next"}, idempotency_key="k2", owner_epoch=1)
        assert _tweet_id(nxt.output) == 1
        [record] = client.ledger("c1", "k1")
        assert (record.execution_count, record.replay_count, record.call_id) == (1, 1, "e/t0/c0")
        assert record.output == first.output and record.arguments == {"content": "hello"}
        assert len(record.executions) == 1
        assert client.ledger("c1", "never-used") == []
        assert client.conversation("c1").executions == 2


def test_the_same_key_with_other_arguments_is_rejected_and_nothing_runs(toolserver: ToolServerFactory) -> None:
    server = toolserver()
    with server.client() as client:
        client.create_conversation("c1", entry_id="e", involved_classes=["TwitterAPI"], initial_config=TWITTER)
        client.call("c1", "post_tweet", {"content": "hello"}, idempotency_key="k1", owner_epoch=1)
        with pytest.raises(IdempotencyConflictError, match="idempotency key 'k1' was used for another call") as caught:
            client.call("c1", "post_tweet", {"content": "other"}, idempotency_key="k1", owner_epoch=1)
        assert caught.value.status_code == 409 and caught.value.code == "idempotency_key_conflict"
        with pytest.raises(IdempotencyConflictError):
            client.call("c1", "get_tweet", {"tweet_id": 0}, idempotency_key="k1", owner_epoch=1)
        [record] = client.ledger("c1", "k1")
        assert (record.execution_count, record.replay_count) == (1, 0)
        assert client.conversation("c1").executions == 1


def test_an_int_and_a_float_argument_are_different_calls(toolserver: ToolServerFactory) -> None:
    server = toolserver()
    with server.client() as client:
        client.create_conversation("c1", entry_id="e", involved_classes=["MathAPI"], initial_config={})
        assert (
            client.call("c1", "add", {"a": 1.0, "b": 2}, idempotency_key="k", owner_epoch=0).output == '{"result": 3.0}'
        )
        with pytest.raises(IdempotencyConflictError):
            client.call("c1", "add", {"a": 1, "b": 2}, idempotency_key="k", owner_epoch=0)
        [record] = client.ledger("c1", "k")
        assert type(record.arguments["a"]) is float and type(record.arguments["b"]) is int


def test_a_lower_owner_epoch_is_refused(toolserver: ToolServerFactory) -> None:
    server = toolserver()
    with server.client() as client:
        client.create_conversation("c1", entry_id="e", involved_classes=["TwitterAPI"], initial_config=TWITTER)
        client.create_conversation("c2", entry_id="e", involved_classes=["TwitterAPI"], initial_config=TWITTER)
        client.call("c1", "post_tweet", {"content": "by owner 5"}, idempotency_key="k1", owner_epoch=5)
        with pytest.raises(StaleEpochError, match="owner epoch 4 is lower than epoch 5") as caught:
            client.call("c1", "post_tweet", {"content": "by owner 4"}, idempotency_key="k2", owner_epoch=4)
        assert caught.value.status_code == 409
        # A fenced owner cannot even read back a stored result.
        with pytest.raises(StaleEpochError):
            client.call("c1", "post_tweet", {"content": "by owner 5"}, idempotency_key="k1", owner_epoch=4)
        assert client.ledger("c1", "k2") == []
        assert client.conversation("c1").executions == 1
        # The same epoch and a higher one are accepted; epochs are per conversation.
        client.call("c1", "get_tweet", {"tweet_id": 0}, idempotency_key="k3", owner_epoch=5)
        client.call("c1", "get_tweet", {"tweet_id": 0}, idempotency_key="k4", owner_epoch=6)
        assert client.conversation("c1").max_epoch == 6
        client.call("c2", "get_tweet", {"tweet_id": 0}, idempotency_key="k1", owner_epoch=0)
        with pytest.raises(StaleEpochError):
            client.call("c1", "get_tweet", {"tweet_id": 0}, idempotency_key="k5", owner_epoch=5)


def test_worlds_and_ledger_survive_kill_9_and_restart(toolserver: ToolServerFactory, base_corpus: Corpus) -> None:
    entry = base_corpus.get("multi_turn_base_0")
    oracle = run_oracle(entry)
    server = toolserver()
    half = len(entry.calls) // 2
    with server.client() as client:
        client.create_conversation_for_entry("conv", entry)
        outputs = [
            client.call(
                "conv", c.method, c.arguments, idempotency_key=c.call_id, owner_epoch=1, call_id=c.call_id
            ).output
            for c in entry.calls[:half]
        ]
    pid = server.pid
    server.kill()
    assert server.pid is None
    server.start()
    assert server.pid != pid
    with server.client() as client:
        info = client.conversation("conv")
        assert (info.executions, info.max_epoch, info.entry_id) == (half, 1, entry.id)
        # Replays after the restart get the stored results without running again.
        for call, output in zip(entry.calls[:half], outputs, strict=True):
            replay = client.call("conv", call.method, call.arguments, idempotency_key=call.call_id, owner_epoch=1)
            assert (replay.replayed, replay.execution_count, replay.output) == (True, 1, output)
        # The restored world continues where it stopped (the second half depends on the first: cd, then mv).
        outputs += [
            client.call(
                "conv", c.method, c.arguments, idempotency_key=c.call_id, owner_epoch=2, call_id=c.call_id
            ).output
            for c in entry.calls[half:]
        ]
        ledger = client.ledger("conv")
    assert outputs == [c.output for c in oracle.calls]
    assert [r.call_id for r in ledger] == [c.call_id for c in entry.calls]
    assert all(r.execution_count == 1 for r in ledger)
    server.kill()
    store = ToolServerStore.open_readonly(server.db_path)
    try:
        assert check_final_state(store.load_world("conv"), oracle.world).valid
        last_seq = ledger[-1].executions[-1].seq
        assert check_final_state(store.world_after(last_seq), oracle.world).valid
    finally:
        store.close()


def test_dedup_off_executes_a_repeated_key_again(toolserver: ToolServerFactory) -> None:
    server = toolserver(dedup=False)
    with server.client() as client:
        caps = client.capabilities()
        assert caps.dedup is False and not any(t.idempotent for t in caps.tools)
        client.create_conversation("c1", entry_id="e", involved_classes=["TwitterAPI"], initial_config=TWITTER)
        first = client.call("c1", "post_tweet", {"content": "hello"}, idempotency_key="k1", owner_epoch=1)
        second = client.call("c1", "post_tweet", {"content": "hello"}, idempotency_key="k1", owner_epoch=1)
        assert (first.replayed, second.replayed) == (False, False)
        assert (first.idempotent, second.execution_count) == (False, 2)
        assert (_tweet_id(first.output), _tweet_id(second.output)) == (0, 1)
        [record] = client.ledger("c1", "k1")
        assert record.execution_count == 2
        assert [_tweet_id(e.output) for e in record.executions] == [0, 1]


def test_no_idempotency_classes_are_reported_and_never_deduplicated(toolserver: ToolServerFactory) -> None:
    server = toolserver(non_idempotent_classes=["TradingBot", "TravelAPI"])
    with server.client() as client:
        caps = client.capabilities()
        assert caps.dedup is True and caps.non_idempotent_classes == ["TradingBot", "TravelAPI"]
        by_method = {t.method: t for t in caps.tools}
        assert len(by_method) == 128
        assert not by_method["place_order"].idempotent and not by_method["book_flight"].idempotent
        assert by_method["post_tweet"].idempotent and by_method["mkdir"].idempotent
        assert client.non_idempotent_methods() == {
            t.method for t in caps.tools if t.class_name in ("TradingBot", "TravelAPI")
        }
        client.create_conversation(
            "c1", entry_id="e", involved_classes=["TradingBot", "TwitterAPI"], initial_config={**TRADING, **TWITTER}
        )
        first = client.call("c1", "fund_account", {"amount": 100.0}, idempotency_key="f", owner_epoch=1)
        second = client.call("c1", "fund_account", {"amount": 100.0}, idempotency_key="f", owner_epoch=1)
        assert first.idempotent is False
        assert json.loads(second.output)["new_balance"] == json.loads(first.output)["new_balance"] + 100.0
        # The operator's question "was key f executed, and with what result?" has an answer.
        [record] = client.ledger("c1", "f")
        assert record.execution_count == 2 and record.output == first.output
        # Other classes are still deduplicated.
        client.call("c1", "post_tweet", {"content": "x"}, idempotency_key="t", owner_epoch=1)
        assert client.call("c1", "post_tweet", {"content": "x"}, idempotency_key="t", owner_epoch=1).replayed


def test_refusals_run_nothing(toolserver: ToolServerFactory, base_corpus: Corpus) -> None:
    server = toolserver()
    with server.client() as client:
        with pytest.raises(UnknownConversationError):
            client.call("nope", "ls", {}, idempotency_key="k", owner_epoch=0)
        with pytest.raises(UnknownConversationError):
            client.ledger("nope")
        client.create_conversation("c1", entry_id="e", involved_classes=["TwitterAPI"], initial_config=TWITTER)
        with pytest.raises(ToolServerError, match="offers no method 'ls'") as caught:
            client.call("c1", "ls", {}, idempotency_key="k", owner_epoch=0)
        assert (caught.value.code, caught.value.status_code) == ("unknown_method", 422)
        with pytest.raises(ToolServerError, match="offers no method '__init__'"):
            client.call("c1", "__init__", {}, idempotency_key="k", owner_epoch=0)
        with pytest.raises(ConversationConflictError):
            client.create_conversation_for_entry("c1", base_corpus.get("multi_turn_base_0"))
        assert (
            client.create_conversation(
                "c1", entry_id="e", involved_classes=["TwitterAPI"], initial_config=TWITTER
            ).created
            is False
        )
        with pytest.raises(ToolServerError, match="invalid_request"):
            client.create_conversation("c2", entry_id="e", involved_classes=["NoSuchAPI"], initial_config={})
        # A backend error is the tool's answer (BFCL's convention), executed and recorded.
        bad = client.call("c1", "get_tweet", {"no_such_arg": 1}, idempotency_key="k", owner_epoch=0)
        assert bad.output.startswith("Error during execution: ") and not bad.replayed
        assert client.conversation("c1").executions == 1
    with httpx.Client(base_url=server.base_url) as raw:
        response = raw.post("/conversations/c1/calls", json={"method": "get_tweet", "owner_epoch": -1})
        assert response.status_code == 422
        assert response.json()["error"] == "invalid_request"
        assert "idempotency_key" in response.json()["detail"]


def test_every_answered_call_is_already_in_the_store_file(toolserver: ToolServerFactory) -> None:
    """Every answered call is already in the SQLite file, read by another connection while the server runs."""
    server = toolserver()
    with server.client() as client:
        client.create_conversation("c1", entry_id="e", involved_classes=["TwitterAPI"], initial_config=TWITTER)
        for n in range(5):
            client.call("c1", "post_tweet", {"content": str(n)}, idempotency_key=f"k{n}", owner_epoch=0)
            with sqlite3.connect(f"{server.db_path.resolve().as_uri()}?mode=ro", uri=True) as db:
                assert db.execute("SELECT COUNT(*) FROM executions").fetchone()[0] == n + 1


def test_command_line_rejects_unknown_classes(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "settled_bfcl.toolserver",
            "--db",
            str(tmp_path / "x.sqlite"),
            "--port",
            "1",
            "--no-idempotency",
            "TradingBot,Nope",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "unknown backend classes ['Nope']" in result.stderr


def test_the_whole_base_corpus_through_the_server_matches_the_oracle(
    toolserver: ToolServerFactory, base_corpus: Corpus
) -> None:
    server = toolserver()
    with server.client() as client:
        for entry in base_corpus:
            client.create_conversation_for_entry(entry.id, entry)
            outputs = [
                client.call(entry.id, c.method, c.arguments, idempotency_key=c.call_id, owner_epoch=0).output
                for c in entry.calls
            ]
            assert outputs == [c.output for c in run_oracle(entry).calls], entry.id
    server.stop()
    store = ToolServerStore.open_readonly(server.db_path)
    try:
        assert store.conversation_ids() == sorted(e.id for e in base_corpus)
        for entry in base_corpus:
            verdict = check_final_state(store.load_world(entry.id), run_oracle(entry).world)
            assert verdict.valid, (entry.id, verdict)
            assert [r.call_id for r in store.ledger(entry.id)] == [None] * len(entry.calls)
            assert [r.idempotency_key for r in store.ledger(entry.id)] == [c.call_id for c in entry.calls]
    finally:
        store.close()
