"""The oracle and the state verdict (issue 8, item 5's oracle), cross-checked against BFCL's own execution."""

from __future__ import annotations

import uuid

import pytest
from bfcl_eval.eval_checker.multi_turn_eval.func_source_code.posting_api import TwitterAPI
from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker
from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils import execute_multi_turn_func_call

from settled_bfcl import BfclError, Corpus, Entry, World, check_final_state, run_oracle

pytestmark = pytest.mark.bfcl


def _bfcl_execution(entry: Entry) -> tuple[list[str], World]:
    """BFCL's own executor (``eval`` on rewritten strings), with a fresh model name so no cached state is reused."""
    model_name = f"settled_{uuid.uuid4().hex}"
    outputs: list[str] = []
    instances: dict[str, object] = {}
    for turn in entry.turns:
        turn_outputs, instances = execute_multi_turn_func_call(
            [c.source for c in turn.calls],
            dict(entry.initial_config),
            list(entry.involved_classes),
            model_name,
            entry.id,
            long_context=entry.long_context,
        )
        outputs += turn_outputs
    return outputs, World(instances)


@pytest.mark.parametrize("corpus_name", ["base_corpus", "miss_func_corpus"])
def test_oracle_matches_bfcl_execution_on_every_entry(corpus_name: str, request: pytest.FixtureRequest) -> None:
    corpus: Corpus = request.getfixturevalue(corpus_name)
    for entry in corpus:
        oracle = run_oracle(entry)
        assert [c.call for c in oracle.calls] == list(entry.calls)
        bfcl_outputs, bfcl_world = _bfcl_execution(entry)
        assert [c.output for c in oracle.calls] == bfcl_outputs, entry.id
        verdict = check_final_state(oracle.world, bfcl_world)
        assert verdict.valid, (entry.id, verdict)


def test_bfcl_checker_accepts_the_ground_truth_as_model_calls(base_corpus: Corpus, miss_func_corpus: Corpus) -> None:
    for entry in [*list(base_corpus)[:5], miss_func_corpus.get("multi_turn_miss_func_0")]:
        gt = [[c.source for c in turn.calls] for turn in entry.turns]
        model_calls = [[turn] if turn else [] for turn in gt]
        raw = {"id": entry.id, "initial_config": dict(entry.initial_config), "involved_classes": entry.involved_classes}
        result = multi_turn_checker(model_calls, gt, raw, entry.category, f"settled_{uuid.uuid4().hex}")
        assert result == {"valid": True}, entry.id


def test_two_oracle_runs_agree_and_a_pickled_world_is_the_same_world(base_corpus: Corpus) -> None:
    for entry in list(base_corpus)[:20]:
        first, second = run_oracle(entry), run_oracle(entry)
        assert first.outputs == second.outputs
        assert check_final_state(first.world, second.world).valid
        assert check_final_state(World.loads(first.world.dumps()), second.world).valid


def test_state_check_catches_a_duplicated_side_effect(base_corpus: Corpus) -> None:
    entry = next(e for e in base_corpus if any(c.method == "post_tweet" for c in e.calls))
    oracle = run_oracle(entry)
    candidate = entry.world()
    for call in entry.calls:
        candidate.execute(call.method, call.arguments)
        if call.method == "post_tweet":
            candidate.execute(call.method, call.arguments)  # the duplicate
    verdict = check_final_state(candidate, oracle.world)
    assert not verdict.valid
    assert verdict.class_name == "TwitterAPI"
    assert "tweet_counter" in verdict.differences
    assert "TwitterAPI" in verdict.message


def test_state_check_cannot_see_a_duplicated_read(base_corpus: Corpus) -> None:
    """End state alone does not prove exactly-once (research §3): why the ledger and output checks exist."""
    entry = next(e for e in base_corpus if any(c.method == "ls" for c in e.calls))
    candidate = entry.world()
    for call in entry.calls:
        candidate.execute(call.method, call.arguments)
        if call.method == "ls":
            candidate.execute(call.method, call.arguments)
    assert check_final_state(candidate, run_oracle(entry).world).valid


def test_worlds_of_different_classes_are_refused(base_corpus: Corpus) -> None:
    one, other = base_corpus.get("multi_turn_base_0"), base_corpus.get("multi_turn_base_199")
    assert set(one.involved_classes) != set(other.involved_classes)
    with pytest.raises(BfclError, match="different classes"):
        check_final_state(one.world(), other.world())


def test_error_to_output_convention() -> None:
    world = World.from_config({}, ["MathAPI", "GorillaFileSystem"])
    assert world.execute("add", {"a": 1, "b": 2}) == '{"result": 3}'
    assert world.execute("add", {"a": 1.0, "b": 2}) == '{"result": 3.0}'  # a float stays a float
    # A dict json.dumps cannot encode falls back to str(): logarithm returns an mpmath mpf.
    assert world.execute("logarithm", {"value": 8, "base": 2, "precision": 5}).startswith("{'result': mpf(")
    assert world.execute("add", {"a": 1, "c": 2}).startswith("Error during execution: ")
    assert world.execute("mkdir", {"dir_name": "x"}) == "None"
    assert world.execute("ls", {}) == '{"current_directory_content": ["x"]}'


def test_mutable_defaults_are_fresh_per_call() -> None:
    """BFCL shares ``post_tweet``'s default ``mentions=[]`` across calls and ``mention()`` extends it."""
    default_mentions = TwitterAPI.post_tweet.__defaults__
    config = {"TwitterAPI": {"authenticated": True, "username": "u"}}
    world = World.from_config(config, ["TwitterAPI"])
    world.execute("post_tweet", {"content": "a"})
    world.execute("mention", {"tweet_id": 0, "mentioned_usernames": ["@bob"]})
    assert '"mentions": []' in world.execute("post_tweet", {"content": "b"})
    assert '"mentions": []' in World.from_config(config, ["TwitterAPI"]).execute("post_tweet", {"content": "c"})
    assert TwitterAPI.post_tweet.__defaults__ == default_mentions == ([], [])


def test_arguments_are_not_aliased_by_the_world() -> None:
    world = World.from_config({"TwitterAPI": {"authenticated": True}}, ["TwitterAPI"])
    tags = ["#a"]
    world.execute("post_tweet", {"content": "a", "tags": tags})
    world.instances["TwitterAPI"].tweets[0]["tags"].append("#changed")
    assert tags == ["#a"]
