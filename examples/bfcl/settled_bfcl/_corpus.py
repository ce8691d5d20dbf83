"""The BFCL multi-turn corpus as typed entries (issue 8, Build item 1; research doc §1).

The data ships inside the pinned ``bfcl-eval`` wheel (``bfcl_eval/data``): one JSON-lines file of questions per
category, one of ground truth under ``possible_answer/`` and one tool-doc file per backend class under
``multi_turn_func_doc/``. Every ground-truth call string is parsed with :mod:`ast` (never ``eval``): the callee must
be a bare backend method name and every argument a literal. Positional arguments are named from the backend method's
signature, so every :class:`GroundTruthCall` carries named JSON arguments only; ``ast.literal_eval`` keeps an int an
int and a float a float (``fillFuelTank(15.0)`` stays ``15.0``).

miss_func entries hold some functions back: BFCL removes their docs from the tool list and restores them at the turn
named in ``missed_function``, a turn whose question is empty and for which BFCL substitutes the user text
:data:`HOLDOUT_USER_TEXT`. :attr:`Turn.tools` is the tool set offered in each turn and :attr:`Turn.held_out` what
is missing from it.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from importlib import resources
from importlib.resources.abc import Traversable
from inspect import Parameter
from pathlib import Path
from typing import Any

from bfcl_eval.constants.default_prompts import DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC
from bfcl_eval.constants.type_mappings import GORILLA_TO_OPENAPI

from settled_bfcl._backends import (
    BACKEND_CLASSES,
    JsonValue,
    World,
    check_bfcl_version,
    method_index,
)
from settled_bfcl._errors import CallParseError, CorpusError

__all__ = [
    "CATEGORIES",
    "HOLDOUT_USER_TEXT",
    "Corpus",
    "Entry",
    "GroundTruthCall",
    "ToolDoc",
    "Turn",
    "call_id_for",
    "load_corpus",
    "load_tool_docs",
    "parse_call",
]

#: Multi-turn categories this loader reads (issue 8 needs ``base`` and ``miss_func``; the other two share the shape).
CATEGORIES = ("base", "miss_func", "miss_param", "long_context")

#: The user text BFCL sends in a miss_func holdout turn (``DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC``).
HOLDOUT_USER_TEXT: str = DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC

_FUNC_DOC_FILES: Mapping[str, str] = {
    "GorillaFileSystem": "gorilla_file_system.json",
    "MathAPI": "math_api.json",
    "MessageAPI": "message_api.json",
    "TwitterAPI": "posting_api.json",
    "TicketAPI": "ticket_api.json",
    "TradingBot": "trading_bot.json",
    "TravelAPI": "travel_booking.json",
    "VehicleControlAPI": "vehicle_control.json",
}


def call_id_for(entry_id: str, turn_index: int, call_index: int) -> str:
    """Return the deterministic call id of a ground-truth call (issue 8: ``<entry>/t<k>/c<j>``).

    Args:
        entry_id: The BFCL entry id, e.g. ``"multi_turn_base_0"``.
        turn_index: Zero-based turn index.
        call_index: Zero-based index of the call within its turn.

    Returns:
        The call id, e.g. ``"multi_turn_base_0/t1/c0"``.
    """
    return f"{entry_id}/t{turn_index}/c{call_index}"


@dataclass(frozen=True, slots=True)
class GroundTruthCall:
    """One ground-truth call, parsed.

    Attributes:
        call_id: ``<entry>/t<k>/c<j>`` (:func:`call_id_for`).
        entry_id: The entry it belongs to.
        turn_index: Zero-based turn index.
        call_index: Zero-based index within the turn (calls in a turn depend on their order).
        source: The call string exactly as the corpus writes it.
        method: The bare backend method name.
        class_name: The backend class defining the method.
        arguments: Named JSON arguments in signature order (positional ones named from the signature). Treat as
            read-only; executors deep-copy it.
        positional: The names of the arguments the source gave positionally, in order.
        offered: False when the turn's tool set does not offer the method. One shipped call is like that:
            ``multi_turn_miss_func_49/t1/c1`` calls ``tail`` two turns before the holdout turn restores it (BFCL's
            checker executes whatever the model calls, so it never notices; a runtime that refuses unoffered tools
            cannot replay that call).
    """

    call_id: str
    entry_id: str
    turn_index: int
    call_index: int
    source: str
    method: str
    class_name: str
    arguments: Mapping[str, JsonValue] = field(hash=False)
    positional: tuple[str, ...] = ()
    offered: bool = True


@dataclass(frozen=True, slots=True)
class ToolDoc:
    """One backend method's tool description, as shipped in ``multi_turn_func_doc``.

    Attributes:
        name: The method name.
        class_name: The backend class.
        description: The description BFCL gives the model.
        parameters: BFCL's parameter schema (``{"type": "dict", "properties": ..., "required": ...}``).
        response: BFCL's description of the response.
    """

    name: str
    class_name: str
    description: str
    parameters: Mapping[str, Any] = field(hash=False)
    response: Mapping[str, Any] = field(hash=False)

    def json_schema(self) -> dict[str, Any]:
        """Return the parameters as a JSON Schema object, with BFCL's type mapping (``dict``→``object``, ...).

        The mapping is BFCL's ``GORILLA_TO_OPENAPI``; an unknown type becomes ``string``, as in BFCL.

        Returns:
            A new JSON Schema dict.
        """
        converted = _to_json_schema(self.parameters)
        if not isinstance(converted, dict):
            raise CorpusError(f"tool {self.name!r}: parameters are not an object: {self.parameters!r}")
        return converted


def _to_json_schema(node: object) -> object:
    if isinstance(node, dict):
        out: dict[str, object] = {}
        for key, value in node.items():
            if key == "type" and isinstance(value, str):
                out[key] = GORILLA_TO_OPENAPI.get(value, "string")
            elif key == "properties" and isinstance(value, dict):
                out[key] = {name: _to_json_schema(prop) for name, prop in value.items()}
            else:
                out[key] = _to_json_schema(value)
        return out
    if isinstance(node, list):
        return [_to_json_schema(item) for item in node]
    return node


@dataclass(frozen=True, slots=True)
class Turn:
    """One user turn of an entry.

    Attributes:
        index: Zero-based turn index.
        user_message: The user's message as the corpus gives it; None for a miss_func holdout turn.
        calls: The turn's ground-truth calls, in order (empty when the model should only answer in text).
        tools: Names of the methods offered to the model in this turn, in BFCL's doc order.
        held_out: Methods of the involved classes that are not offered in this turn (miss_func).
        restored: Methods offered again from this turn on (non-empty only in a miss_func holdout turn).
    """

    index: int
    user_message: str | None
    calls: tuple[GroundTruthCall, ...]
    tools: tuple[str, ...]
    held_out: tuple[str, ...] = ()
    restored: tuple[str, ...] = ()

    @property
    def is_holdout(self) -> bool:
        """True for a miss_func turn that restores held-out functions and has no question of its own."""
        return self.user_message is None

    @property
    def user_text(self) -> str:
        """The text the model receives: the user's message, or BFCL's substitute in a holdout turn."""
        return HOLDOUT_USER_TEXT if self.user_message is None else self.user_message


@dataclass(frozen=True, slots=True)
class Entry:
    """One BFCL multi-turn conversation with its ground truth.

    Attributes:
        id: The entry id, e.g. ``"multi_turn_base_0"``.
        category: The category, e.g. ``"multi_turn_base"`` (BFCL: ``id.rsplit("_", 1)[0]``).
        initial_config: Backend class name to its scenario dict (read-only; :meth:`world` deep-copies it).
        involved_classes: The backend classes instantiated for this conversation.
        turns: The user turns, in order.
        long_context: BFCL's long-context flag for ``_load_scenario`` (category contains ``long_context``).
        excluded_functions: The corpus's ``excluded_function`` list (no BFCL code reads it; kept for reference).
        tool_docs: Name to tool doc for every method of the involved classes.
    """

    id: str
    category: str
    initial_config: Mapping[str, Any] = field(hash=False)
    involved_classes: tuple[str, ...]
    turns: tuple[Turn, ...]
    long_context: bool = False
    excluded_functions: tuple[str, ...] = ()
    tool_docs: Mapping[str, ToolDoc] = field(default_factory=dict, hash=False)

    @property
    def calls(self) -> tuple[GroundTruthCall, ...]:
        """Every ground-truth call of the entry, turn by turn, in order."""
        return tuple(call for turn in self.turns for call in turn.calls)

    @property
    def unoffered_calls(self) -> tuple[GroundTruthCall, ...]:
        """Ground-truth calls of a method their turn does not offer (see :attr:`GroundTruthCall.offered`)."""
        return tuple(call for call in self.calls if not call.offered)

    def call(self, call_id: str) -> GroundTruthCall:
        """Return one ground-truth call by its id.

        Args:
            call_id: ``<entry>/t<k>/c<j>``.

        Returns:
            The call.

        Raises:
            KeyError: The entry has no such call.
        """
        for candidate in self.calls:
            if candidate.call_id == call_id:
                return candidate
        raise KeyError(f"entry {self.id!r} has no call {call_id!r}")

    def tools_for_turn(self, turn_index: int) -> tuple[ToolDoc, ...]:
        """Return the tool docs offered in one turn.

        Args:
            turn_index: Zero-based turn index.

        Returns:
            The docs, in BFCL's order.
        """
        return tuple(self.tool_docs[name] for name in self.turns[turn_index].tools)

    def world(self) -> World:
        """Build a fresh world from this entry's ``initial_config`` (deep copies; see :class:`World`).

        Returns:
            The new world.
        """
        return World.from_config(self.initial_config, self.involved_classes, long_context=self.long_context)


@dataclass(frozen=True, slots=True)
class Corpus:
    """The entries of one category, in file order.

    Attributes:
        category: The short category name, e.g. ``"base"``.
        entries: The entries.
        bfcl_version: The ``bfcl-eval`` version they were read from.
    """

    category: str
    entries: tuple[Entry, ...]
    bfcl_version: str

    def __len__(self) -> int:
        """Return the number of entries."""
        return len(self.entries)

    def __iter__(self) -> Iterator[Entry]:
        """Iterate over the entries in file order."""
        return iter(self.entries)

    def get(self, entry_id: str) -> Entry:
        """Return one entry by id.

        Args:
            entry_id: E.g. ``"multi_turn_base_7"``.

        Returns:
            The entry.

        Raises:
            KeyError: No entry has that id.
        """
        for entry in self.entries:
            if entry.id == entry_id:
                return entry
        raise KeyError(f"corpus {self.category!r} has no entry {entry_id!r}")


def _check_json(value: object, where: str) -> JsonValue:
    """Check that a literal is a JSON value and return it unchanged (bool, int and float keep their types)."""
    if value is None or isinstance(value, str | bool | int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{where} is {value!r}, which JSON cannot carry")
        return value
    if isinstance(value, list):
        return [_check_json(item, f"{where}[{i}]") for i, item in enumerate(value)]
    if isinstance(value, dict):
        out: dict[str, JsonValue] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise ValueError(f"{where} has the non-string key {key!r}, which JSON cannot carry")
            out[key] = _check_json(item, f"{where}[{key!r}]")
        return out
    raise ValueError(f"{where} is a {type(value).__name__} ({value!r}), which is not a JSON value")


def parse_call(
    source: str,
    *,
    entry_id: str,
    turn_index: int = 0,
    call_index: int = 0,
    involved_classes: tuple[str, ...] | None = None,
) -> GroundTruthCall:
    """Parse one call string such as ``"mv(source='a', destination='b')"`` or ``"sort('report.pdf')"``.

    Only a bare backend method name called with literal arguments is accepted; nothing is evaluated.

    Args:
        source: The call string.
        entry_id: The entry it belongs to (named in errors and in the call id).
        turn_index: Zero-based turn index (for the call id).
        call_index: Zero-based index within the turn (for the call id).
        involved_classes: When given, the method's class must be one of these.

    Returns:
        The parsed call with named JSON arguments.

    Raises:
        CallParseError: The string is not such a call, names an unknown method, has a non-literal or non-JSON
            argument, or its arguments do not bind to the method's signature.
    """

    def fail(reason: str) -> CallParseError:
        return CallParseError(entry_id, source, reason)

    try:
        tree = ast.parse(source.strip(), mode="eval")
    except SyntaxError as exc:
        raise fail(f"not valid Python syntax ({exc.msg})") from exc
    node = tree.body
    if not isinstance(node, ast.Call):
        raise fail(f"not a call but a {type(node).__name__}")
    if not isinstance(node.func, ast.Name):
        raise fail("the callee must be a bare method name")
    method = node.func.id
    spec = method_index().get(method)
    if spec is None:
        raise fail(f"{method!r} is not a public method of any BFCL multi-turn backend")
    if involved_classes is not None and spec.class_name not in involved_classes:
        raise fail(f"{method!r} belongs to {spec.class_name}, not to the entry's classes {list(involved_classes)}")

    def literal(arg: ast.expr, where: str) -> JsonValue:
        if isinstance(arg, ast.Starred):
            raise fail(f"{where} uses * unpacking")
        try:
            value = ast.literal_eval(arg)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError) as exc:
            raise fail(f"{where} is not a literal: {ast.unparse(arg)!r}") from exc
        try:
            return _check_json(value, where)
        except ValueError as exc:
            raise fail(str(exc)) from exc

    positional = [literal(arg, f"positional argument {i}") for i, arg in enumerate(node.args)]
    keywords: dict[str, JsonValue] = {}
    for keyword in node.keywords:
        if keyword.arg is None:
            raise fail("uses ** unpacking")
        keywords[keyword.arg] = literal(keyword.value, f"argument {keyword.arg!r}")
    try:
        bound = spec.signature.bind(*positional, **keywords)
    except TypeError as exc:
        raise fail(f"arguments do not fit {spec.class_name}.{method}{spec.signature}: {exc}") from exc
    for name in bound.arguments:
        if spec.signature.parameters[name].kind not in (Parameter.POSITIONAL_OR_KEYWORD, Parameter.KEYWORD_ONLY):
            raise fail(f"parameter {name!r} of {spec.class_name}.{method} cannot be passed by name")
    return GroundTruthCall(
        call_id=call_id_for(entry_id, turn_index, call_index),
        entry_id=entry_id,
        turn_index=turn_index,
        call_index=call_index,
        source=source,
        method=method,
        class_name=spec.class_name,
        arguments=dict(bound.arguments),
        positional=tuple(spec.parameters[: len(positional)]),
    )


def _data_root(data_dir: Path | None) -> Traversable:
    if data_dir is not None:
        return data_dir
    return resources.files("bfcl_eval") / "data"


def _read_jsonl(path: Traversable) -> list[dict[str, Any]]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise CorpusError(f"cannot read corpus file {path}: {exc}") from exc
    rows: list[dict[str, Any]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise CorpusError(f"{path}:{number}: not JSON: {exc}") from exc
        if not isinstance(row, dict):
            raise CorpusError(f"{path}:{number}: a line holds a {type(row).__name__}, not an object")
        rows.append(row)
    return rows


def load_tool_docs(class_names: tuple[str, ...] | None = None, *, data_dir: Path | None = None) -> dict[str, ToolDoc]:
    """Load the tool docs of some backend classes.

    Args:
        class_names: The classes; all eight when None.
        data_dir: A ``bfcl_eval/data``-shaped folder; the installed wheel's data when None.

    Returns:
        Method name to its doc, class by class in the given order and, within a class, in file order.

    Raises:
        CorpusError: A class is unknown, a doc lacks a field, or a doc names a method its class does not define.
    """
    root = _data_root(data_dir)
    index = method_index()
    docs: dict[str, ToolDoc] = {}
    for class_name in class_names if class_names is not None else tuple(BACKEND_CLASSES):
        file_name = _FUNC_DOC_FILES.get(class_name)
        if file_name is None:
            raise CorpusError(f"no tool-doc file for backend class {class_name!r}")
        for row in _read_jsonl(root / "multi_turn_func_doc" / file_name):
            try:
                doc = ToolDoc(
                    name=row["name"],
                    class_name=class_name,
                    description=row["description"],
                    parameters=row["parameters"],
                    response=row.get("response", {}),
                )
            except KeyError as exc:
                raise CorpusError(f"{file_name}: a tool doc lacks the field {exc.args[0]!r}: {row!r}") from exc
            spec = index.get(doc.name)
            if spec is None or spec.class_name != class_name:
                raise CorpusError(f"{file_name}: tool doc {doc.name!r} is not a method of {class_name}")
            docs[doc.name] = doc
    return docs


def _user_message(entry_id: str, turn_index: int, messages: object) -> str | None:
    if not isinstance(messages, list):
        raise CorpusError(f"entry {entry_id!r}: question[{turn_index}] is a {type(messages).__name__}, not a list")
    if not messages:
        return None
    if len(messages) != 1:
        raise CorpusError(f"entry {entry_id!r}: question[{turn_index}] has {len(messages)} messages, expected 1")
    message = messages[0]
    if not isinstance(message, dict) or message.get("role") != "user" or not isinstance(message.get("content"), str):
        raise CorpusError(f"entry {entry_id!r}: question[{turn_index}] is not one user message: {message!r}")
    content: str = message["content"]
    return content


def _missed_functions(entry_id: str, raw: object, turn_count: int) -> dict[int, tuple[str, ...]]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise CorpusError(f"entry {entry_id!r}: missed_function is a {type(raw).__name__}, not an object")
    out: dict[int, tuple[str, ...]] = {}
    for key, names in raw.items():
        try:
            turn_index = int(key)
        except ValueError:
            raise CorpusError(f"entry {entry_id!r}: missed_function key {key!r} is not a turn index") from None
        if not 0 <= turn_index < turn_count:
            raise CorpusError(f"entry {entry_id!r}: missed_function turn {turn_index} is outside 0..{turn_count - 1}")
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise CorpusError(f"entry {entry_id!r}: missed_function[{key!r}] is not a list of names: {names!r}")
        out[turn_index] = tuple(names)
    return out


def _build_entry(category: str, row: dict[str, Any], ground_truth: object, docs: Mapping[str, ToolDoc]) -> Entry:
    entry_id = row.get("id")
    if not isinstance(entry_id, str):
        raise CorpusError(f"a {category} entry has no string id: {str(row)[:200]}")
    questions = row.get("question")
    involved = row.get("involved_classes")
    initial_config = row.get("initial_config", {})
    if not isinstance(questions, list):
        raise CorpusError(f"entry {entry_id!r}: question is not a list")
    if not isinstance(involved, list) or not all(isinstance(c, str) and c in BACKEND_CLASSES for c in involved):
        raise CorpusError(f"entry {entry_id!r}: involved_classes {involved!r} is not a list of backend classes")
    if not isinstance(initial_config, dict):
        raise CorpusError(f"entry {entry_id!r}: initial_config is a {type(initial_config).__name__}, not an object")
    if not isinstance(ground_truth, list) or len(ground_truth) != len(questions):
        raise CorpusError(
            f"entry {entry_id!r}: ground truth has {len(ground_truth) if isinstance(ground_truth, list) else '?'} "
            f"turns but the question has {len(questions)}"
        )
    involved_classes = tuple(involved)
    missed = _missed_functions(entry_id, row.get("missed_function"), len(questions))
    class_docs = [name for name, doc in docs.items() if doc.class_name in involved_classes]
    class_docs.sort(key=lambda name: involved_classes.index(docs[name].class_name))
    for turn_index, names in missed.items():
        unknown = [n for n in names if n not in class_docs]
        if unknown:
            raise CorpusError(f"entry {entry_id!r}: missed_function[{turn_index}] names unknown tools {unknown}")

    turns: list[Turn] = []
    for turn_index, (messages, gt_calls) in enumerate(zip(questions, ground_truth, strict=True)):
        user_message = _user_message(entry_id, turn_index, messages)
        restored = missed.get(turn_index, ())
        if (user_message is None) != bool(restored):
            raise CorpusError(
                f"entry {entry_id!r}: turn {turn_index} has "
                f"{'no question' if user_message is None else 'a question'} but "
                f"{'restores ' + str(list(restored)) if restored else 'restores no function'}; "
                "only a miss_func holdout turn may have an empty question"
            )
        held_out = tuple(name for later, names in sorted(missed.items()) if later > turn_index for name in names)
        if not isinstance(gt_calls, list) or not all(isinstance(c, str) for c in gt_calls):
            raise CorpusError(f"entry {entry_id!r}: ground truth of turn {turn_index} is not a list of strings")
        calls = tuple(
            parse_call(
                source,
                entry_id=entry_id,
                turn_index=turn_index,
                call_index=call_index,
                involved_classes=involved_classes,
            )
            for call_index, source in enumerate(gt_calls)
        )
        offered = tuple(name for name in class_docs if name not in held_out)
        calls = tuple(call if call.method in offered else dataclasses.replace(call, offered=False) for call in calls)
        turns.append(Turn(turn_index, user_message, calls, offered, held_out, restored))

    excluded = row.get("excluded_function", [])
    return Entry(
        id=entry_id,
        category=entry_id.rsplit("_", 1)[0],
        initial_config=initial_config,
        involved_classes=involved_classes,
        turns=tuple(turns),
        long_context="long_context" in category,
        excluded_functions=tuple(excluded) if isinstance(excluded, list) else (),
        tool_docs={name: docs[name] for name in class_docs},
    )


def load_corpus(category: str = "base", *, data_dir: Path | None = None) -> Corpus:
    """Load one BFCL v4 multi-turn category.

    Args:
        category: One of :data:`CATEGORIES` (``"base"``, ``"miss_func"``, ...).
        data_dir: A ``bfcl_eval/data``-shaped folder; the installed wheel's data when None (then the pinned
            ``bfcl-eval`` version is checked first).

    Returns:
        The corpus, entries in file order.

    Raises:
        BfclVersionError: ``data_dir`` is None and the pinned ``bfcl-eval`` is not installed.
        CorpusError: The category is unknown, a file is unreadable, or an entry does not have the known shape
            (the message names the entry and field); :class:`CallParseError` for a call string.
    """
    if category not in CATEGORIES:
        raise CorpusError(f"unknown multi-turn category {category!r}; known: {', '.join(CATEGORIES)}")
    version = check_bfcl_version() if data_dir is None else "unknown"
    root = _data_root(data_dir)
    file_name = f"BFCL_v4_multi_turn_{category}.json"
    questions = _read_jsonl(root / file_name)
    answers: dict[str, object] = {}
    for row in _read_jsonl(root / "possible_answer" / file_name):
        answer_id = row.get("id")
        if not isinstance(answer_id, str) or "ground_truth" not in row:
            raise CorpusError(f"possible_answer/{file_name}: a row lacks id or ground_truth: {str(row)[:200]}")
        answers[answer_id] = row["ground_truth"]
    docs = load_tool_docs(data_dir=data_dir)
    entries: list[Entry] = []
    for row in questions:
        entry_id = row.get("id")
        if not isinstance(entry_id, str) or entry_id not in answers:
            raise CorpusError(f"{file_name}: entry {entry_id!r} has no ground truth in possible_answer/{file_name}")
        entries.append(_build_entry(category, row, answers.pop(entry_id), docs))
    if answers:
        raise CorpusError(f"possible_answer/{file_name} has ground truth for unknown entries {sorted(answers)[:5]}")
    return Corpus(category=category, entries=tuple(entries), bfcl_version=version)
