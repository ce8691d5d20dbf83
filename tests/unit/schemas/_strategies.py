"""Hypothesis strategies for every settled record, derived from the models' annotations (issue 4)."""

from __future__ import annotations

import enum
import types
import typing
from datetime import UTC, datetime
from typing import Any, Union, get_args, get_origin

from annotated_types import Ge, Le
from hypothesis import strategies as st
from pydantic import ValidationError

from settled.schemas import (
    LOG_EVENT_TYPES,
    AvroRecord,
    CanonicalJson,
    Digest,
    LogBatch,
    LogEvent,
    ResolutionKind,
    ResolveUnknown,
    SettlementOutcome,
    ToolCallSettled,
    ToolError,
    canonical_json,
    json_digest,
)

TEXT = st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=20)
JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53) + 1, max_value=2**53 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | TEXT,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(TEXT, children, max_size=4),
    max_leaves=10,
)
CANONICAL_JSON = JSON_VALUES.map(canonical_json)
DIGESTS = st.binary(min_size=32, max_size=32).map(bytes.hex)
TIMES = st.datetimes(min_value=datetime(1900, 1, 1), max_value=datetime(2200, 1, 1), timezones=st.just(UTC)).map(
    lambda value: value.replace(microsecond=value.microsecond // 1000 * 1000)
)


def _for_annotation(annotation: Any, metadata: tuple[Any, ...] = ()) -> st.SearchStrategy[Any]:
    if annotation == CanonicalJson:
        return CANONICAL_JSON
    if annotation == Digest:
        return DIGESTS
    origin = get_origin(annotation)
    if origin is typing.Annotated:
        base, *extra = get_args(annotation)
        more = list(metadata)
        for item in extra:
            more.extend(getattr(item, "metadata", []) or [])
            more.append(item)
        return _for_annotation(base, tuple(more))
    if origin in (Union, types.UnionType):
        args = get_args(annotation)
        if annotation == LogEvent:
            return st.one_of([records(cls) for cls in LOG_EVENT_TYPES])
        branches = [arg for arg in args if arg is not type(None)]
        assert len(branches) == 1
        return st.none() | _for_annotation(branches[0], metadata)
    if origin is tuple:
        return st.lists(_for_annotation(get_args(annotation)[0]), max_size=3).map(tuple)
    if annotation is str:
        return TEXT
    if annotation is bool:
        return st.booleans()
    if annotation is bytes:
        return st.binary(max_size=64)
    if annotation is int:
        low = max([item.ge for item in metadata if isinstance(item, Ge)], default=-(2**63))
        high = min([item.le for item in metadata if isinstance(item, Le)], default=2**63 - 1)
        return st.integers(min_value=low, max_value=high)
    if annotation is datetime:
        return TIMES
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return st.sampled_from(list(annotation))
    if isinstance(annotation, type) and issubclass(annotation, AvroRecord):
        return records(annotation)
    raise AssertionError(f"no strategy for {annotation!r}")


def _fix_digests(values: dict[str, Any]) -> dict[str, Any]:
    if "error" in values and "result_json" in values and values["error"] is not None:
        values["result_json"] = None  # ToolCallSettled: a result or an error
    for name in list(values):
        if name.endswith("_json") and values[name] is not None:
            digest_name = name.removesuffix("_json") + "_digest"
            if digest_name in values:
                values[digest_name] = json_digest(values[name])
    return values


@st.composite
def _record(draw: st.DrawFn, model: type[AvroRecord]) -> AvroRecord:
    last: ValidationError | None = None
    for _ in range(100):
        values = {}
        for name, info in model.model_fields.items():
            annotation = info.annotation
            if info.metadata:
                annotation = typing.Annotated[(annotation, *info.metadata)]
            values[name] = draw(_for_annotation(annotation))
        if model is ToolCallSettled and values["result_json"] is None and values["error"] is None:
            values["error"] = draw(records(ToolError))
        if model is ResolveUnknown:
            if values["kind"] is ResolutionKind.OUTCOME_FOR_SUBMISSION:
                values["outcome"] = values["outcome"] or draw(st.sampled_from(list(SettlementOutcome)))
            else:
                values["outcome"] = None
            if values["kind"] is ResolutionKind.CALL_OUTCOME and values["result_json"] is None:
                values["result_json"] = draw(CANONICAL_JSON)
        try:
            return model.model_validate(_fix_digests(values))
        except ValidationError as exc:
            last = exc
            continue
    raise AssertionError(f"could not draw a valid {model.__name__}: {last}")


def records(model: type[AvroRecord]) -> st.SearchStrategy[AvroRecord]:
    """Valid instances of one record type."""
    if model is LogBatch:
        return batches()
    return _record(model)


@st.composite
def batches(draw: st.DrawFn) -> LogBatch:
    """Sealed batches with 1-3 random events."""
    events = draw(st.lists(st.one_of([records(cls) for cls in LOG_EVENT_TYPES]), min_size=1, max_size=3))
    return LogBatch.seal(
        conversation_id=draw(TEXT),
        batch_id=draw(TEXT),
        first_event_seq=draw(st.integers(min_value=1, max_value=2**40)),
        owner_epoch=draw(st.integers(min_value=0, max_value=2**40)),
        prev_batch_digest=draw(st.none() | DIGESTS),
        recorded_at=draw(TIMES),
        events=events,
        submission_id=draw(st.none() | TEXT),
    )
