"""The pydantic models mirror the shipped .avsc files one to one (issue 4 item 1, docs/design.md §7)."""

from __future__ import annotations

import enum
import types
import typing
from datetime import datetime
from typing import Any, Union, get_args, get_origin

import pytest
from annotated_types import Le

import settled.schemas as S
from settled.schemas import AVRO_NAMESPACE, AvroRecord, current_schemas, history_schemas, history_versions

MODELS = [
    obj for obj in vars(S).values() if isinstance(obj, type) and issubclass(obj, AvroRecord) and obj is not AvroRecord
]
ENUMS = [
    obj
    for obj in vars(S).values()
    if isinstance(obj, type) and issubclass(obj, enum.StrEnum) and obj.__module__ == "settled.schemas._events"
]


def _short(full: str) -> str:
    return full.rpartition(".")[2]


def _expected_avro(annotation: Any, metadata: list[Any]) -> Any:
    """Map a pydantic annotation to the Avro type the .avsc must declare (settled's convention)."""
    origin = get_origin(annotation)
    if origin is typing.Annotated:
        base, *extra = get_args(annotation)
        more = list(metadata)
        for item in extra:
            more.extend(getattr(item, "metadata", []) or [])
            more.append(item)
        return _expected_avro(base, more)
    if origin in (Union, types.UnionType):
        branches = [arg for arg in get_args(annotation) if arg is not type(None)]
        if type(None) not in get_args(annotation):  # the log-event union: records only
            return [_expected_avro(branch, []) for branch in branches]
        assert len(branches) == 1, annotation
        return ["null", _expected_avro(branches[0], metadata)]
    if origin is tuple:
        items, ellipsis = get_args(annotation)
        assert ellipsis is Ellipsis
        return {"type": "array", "items": _expected_avro(items, [])}
    simple = {str: "string", bool: "boolean", bytes: "bytes"}
    if annotation in simple:
        return simple[annotation]
    if annotation is int:
        bounds = [item.le for item in metadata if isinstance(item, Le)]
        return "int" if bounds and bounds[0] <= 2**31 - 1 else "long"
    if annotation is datetime:
        return {"type": "long", "logicalType": "timestamp-millis"}
    if isinstance(annotation, type) and issubclass(annotation, enum.StrEnum | AvroRecord):
        return annotation.__name__
    raise AssertionError(f"no Avro mapping for {annotation!r}")


def _declared(avro_type: Any) -> Any:
    if isinstance(avro_type, str):
        return _short(avro_type) if "." in avro_type else avro_type
    if isinstance(avro_type, list):
        return [_declared(branch) for branch in avro_type]
    if avro_type.get("type") == "array":
        return {"type": "array", "items": _declared(avro_type["items"])}
    return {key: value for key, value in avro_type.items() if key in ("type", "logicalType")}


def test_every_named_avro_type_has_a_model_and_back() -> None:
    names = {_short(name) for name in current_schemas().schemas}
    assert names == {cls.__name__ for cls in MODELS} | {cls.__name__ for cls in ENUMS}
    assert all(name.startswith(AVRO_NAMESPACE + ".") for name in current_schemas().schemas)


@pytest.mark.parametrize("model", MODELS, ids=lambda cls: cls.__name__)
def test_model_fields_match_the_avsc(model: type[AvroRecord]) -> None:
    source = current_schemas().get(model.AVRO_NAME).source
    assert source["type"] == "record"
    avro_fields = source["fields"]
    assert [item["name"] for item in avro_fields] == list(model.model_fields)
    for item, (name, info) in zip(avro_fields, model.model_fields.items(), strict=True):
        annotation = typing.Annotated[(info.annotation, *info.metadata)] if info.metadata else info.annotation
        assert _declared(item["type"]) == _expected_avro(annotation, []), name
        if isinstance(item["type"], list):
            assert item.get("default", "missing") is None and info.default is None, name
        elif "default" in item:
            assert not info.is_required() and info.default == item["default"], name
        else:
            assert info.is_required(), name


@pytest.mark.parametrize("enum_type", ENUMS, ids=lambda cls: cls.__name__)
def test_enum_symbols_match_the_avsc(enum_type: type[enum.StrEnum]) -> None:
    source = current_schemas().get(f"{AVRO_NAMESPACE}.{enum_type.__name__}").source
    assert source["type"] == "enum"
    assert source["symbols"] == [member.value for member in enum_type]
    if "other" in source["symbols"]:
        assert source["default"] == "other"


def test_the_current_version_is_kept_in_history() -> None:
    assert S.SCHEMA_VERSION in history_versions()
    kept = history_schemas(S.SCHEMA_VERSION)
    assert {name: s.canonical_form for name, s in kept.schemas.items()} == {
        name: s.canonical_form for name, s in current_schemas().schemas.items()
    }


def test_log_event_union_lists_every_event() -> None:
    assert typing.get_args(S.LogEvent) == S.LOG_EVENT_TYPES
    assert typing.get_args(S.InboxRecord) == S.INBOX_TYPES
