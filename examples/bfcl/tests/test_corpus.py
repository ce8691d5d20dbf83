"""The corpus loader on the data shipped in bfcl-eval 2026.3.23 (issue 8, Build item 1)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import pytest

from settled_bfcl import (
    BFCL_EVAL_VERSION,
    HOLDOUT_USER_TEXT,
    CallParseError,
    Corpus,
    CorpusError,
    load_corpus,
    load_tool_docs,
    method_index,
    parse_call,
)

pytestmark = pytest.mark.bfcl


def test_base_corpus_has_the_measured_shape(base_corpus: Corpus) -> None:
    assert base_corpus.bfcl_version == BFCL_EVAL_VERSION
    assert len(base_corpus) == 200
    assert [e.id for e in base_corpus] == [f"multi_turn_base_{n}" for n in range(200)]
    assert sum(len(e.turns) for e in base_corpus) == 734
    assert sum(len(e.calls) for e in base_corpus) == 1142
    assert {e.category for e in base_corpus} == {"multi_turn_base"}
    assert not any(e.long_context for e in base_corpus)
    # Base offers every tool of the involved classes in every turn and has no holdout turn.
    for entry in base_corpus:
        all_tools = set(entry.tool_docs)
        assert all(set(turn.tools) == all_tools and not turn.is_holdout for turn in entry.turns)
        assert not entry.unoffered_calls


def test_call_ids_are_deterministic(base_corpus: Corpus) -> None:
    entry = base_corpus.get("multi_turn_base_0")
    assert [c.call_id for c in entry.turns[0].calls] == [
        "multi_turn_base_0/t0/c0",
        "multi_turn_base_0/t0/c1",
        "multi_turn_base_0/t0/c2",
    ]
    assert entry.call("multi_turn_base_0/t2/c0").source == "sort('final_report.pdf')"
    ids = [c.call_id for e in base_corpus for c in e.calls]
    assert len(ids) == len(set(ids))


def test_json_number_types_are_kept(base_corpus: Corpus, miss_func_corpus: Corpus) -> None:
    calls = [c for corpus in (base_corpus, miss_func_corpus) for e in corpus for c in e.calls]
    log = next(c for c in calls if c.source == "logarithm(value=630.0, base=10, precision=5)")
    assert log.arguments == {"value": 630.0, "base": 10, "precision": 5}
    assert type(log.arguments["value"]) is float
    assert type(log.arguments["base"]) is int
    assert type(log.arguments["precision"]) is int
    fill = next(c for c in calls if c.source == "fillFuelTank(15.0)")
    assert fill.arguments == {"fuelAmount": 15.0}
    assert type(fill.arguments["fuelAmount"]) is float
    # Booleans stay booleans (bool is an int subclass: a lossy parser would turn True into 1).
    ls = next(c for c in calls if c.method == "ls" and c.arguments)
    assert ls.arguments["a"] is True


def test_positional_arguments_are_named_from_the_signature(base_corpus: Corpus) -> None:
    sort = base_corpus.get("multi_turn_base_0").call("multi_turn_base_0/t2/c0")
    assert sort.method == "sort"
    assert sort.class_name == "GorillaFileSystem"
    assert sort.arguments == {"file_name": "final_report.pdf"}
    assert sort.positional == ("file_name",)
    positional = [c for e in base_corpus for c in e.calls if c.positional]
    assert len(positional) == 40  # research doc §1
    for call in positional:
        parameters = method_index()[call.method].parameters
        assert call.positional == parameters[: len(call.positional)]
        assert set(call.arguments) <= set(parameters)


def test_miss_func_turns_offer_the_tool_set_of_their_turn(miss_func_corpus: Corpus) -> None:
    assert len(miss_func_corpus) == 200
    assert sum(len(e.turns) for e in miss_func_corpus) == 934
    assert sum(len(e.calls) for e in miss_func_corpus) == 1140
    entry = miss_func_corpus.get("multi_turn_miss_func_0")
    assert [t.held_out for t in entry.turns] == [("sort",), ("sort",), ("sort",), (), ()]
    assert [t.restored for t in entry.turns] == [(), (), (), ("sort",), ()]
    assert [t.is_holdout for t in entry.turns] == [False, False, False, True, False]
    assert entry.turns[2].calls == ()  # the turn asks for sort, which is missing: the model should only answer
    assert entry.turns[3].user_message is None
    assert entry.turns[3].user_text == HOLDOUT_USER_TEXT
    assert [c.source for c in entry.turns[3].calls] == ["sort('final_report.pdf')"]
    assert "sort" not in entry.turns[2].tools
    assert "sort" in entry.turns[3].tools and "sort" in entry.turns[4].tools
    assert len(entry.turns[3].tools) == len(entry.turns[2].tools) + 1 == len(entry.tool_docs)
    assert [d.name for d in entry.tools_for_turn(2)] == list(entry.turns[2].tools)
    # Every miss_func entry has exactly one holdout turn.
    assert all(sum(t.is_holdout for t in e.turns) == 1 for e in miss_func_corpus)


def test_the_one_ground_truth_call_of_a_held_out_tool_is_flagged(miss_func_corpus: Corpus) -> None:
    unoffered = [c for e in miss_func_corpus for c in e.unoffered_calls]
    assert [(c.call_id, c.method) for c in unoffered] == [("multi_turn_miss_func_49/t1/c1", "tail")]


def test_tool_docs_convert_to_json_schema() -> None:
    docs = load_tool_docs(("MathAPI", "VehicleControlAPI"))
    assert len(load_tool_docs()) == 128
    schema = docs["logarithm"].json_schema()
    assert schema["type"] == "object"
    assert schema["properties"]["value"]["type"] == "number"
    assert schema["properties"]["precision"]["type"] == "integer"
    assert docs["lockDoors"].json_schema()["properties"]["door"]["type"] == "array"


@pytest.mark.parametrize(
    ("source", "reason"),
    [
        ("mkdir(dir_name='temp'", "syntax"),
        ("os.system('ls')", "bare method name"),
        ("no_such_method(x=1)", "not a public method"),
        ("mkdir(dir_name=folder)", "not a literal"),
        ("mkdir(dir_name=__import__('os').getcwd())", "not a literal"),
        ("mkdir('a', 'b')", "do not fit"),
        ("mkdir(name='a')", "do not fit"),
        ("mkdir(**{'dir_name': 'a'})", "** unpacking"),
        ("mkdir(*['a'])", "* unpacking"),
        ("mkdir(dir_name=('a', 'b'))", "not a JSON value"),
        ("mean(numbers={1: 2})", "non-string key"),
        ("[mkdir(dir_name='a')]", "not a call"),
        ("post_tweet(content='hi')", "not to the entry's classes"),
    ],
)
def test_unparsable_calls_raise_an_error_naming_entry_and_call(source: str, reason: str) -> None:
    with pytest.raises(CallParseError) as caught:
        parse_call(source, entry_id="multi_turn_base_7", involved_classes=("GorillaFileSystem", "MathAPI"))
    message = str(caught.value)
    assert "multi_turn_base_7" in message
    assert repr(source) in message
    assert reason in message
    assert caught.value.entry_id == "multi_turn_base_7"
    assert caught.value.source == source


def test_parsing_never_evaluates(tmp_path: Path) -> None:
    marker = tmp_path / "evaluated"
    source = f"mkdir(dir_name=open({str(marker)!r}, 'w').write('x'))"
    with pytest.raises(CallParseError):
        parse_call(source, entry_id="e")
    assert not marker.exists()


def test_unknown_category_and_broken_files_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(CorpusError, match="unknown multi-turn category 'simple'"):
        load_corpus("simple")
    data = tmp_path / "data"
    (data / "possible_answer").mkdir(parents=True)
    (data / "BFCL_v4_multi_turn_base.json").write_text(
        '{"id": "multi_turn_base_0", "question": [[{"role": "user", "content": "hi"}]], '
        '"initial_config": {}, "involved_classes": ["MathAPI"]}\n'
    )
    (data / "possible_answer" / "BFCL_v4_multi_turn_base.json").write_text(
        '{"id": "multi_turn_base_0", "ground_truth": [["add(a=1, b=)"]]}\n'
    )
    (data / "multi_turn_func_doc").symlink_to(Path(str(resources.files("bfcl_eval") / "data" / "multi_turn_func_doc")))
    with pytest.raises(
        CallParseError, match=r"entry 'multi_turn_base_0': cannot parse ground-truth call 'add\(a=1, b=\)'"
    ):
        load_corpus("base", data_dir=data)
