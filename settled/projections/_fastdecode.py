"""Pydantic off the projector's hot path: build `LogBatch` models from `Codec.decode_dict` without validating them.

The log is written only by partition owners, which build every batch from validated models; re-validating each
record on the way into Postgres costs about half of the projector's decoding time. `FastBatchDecoder` decodes the
Avro body (`settled.schemas.Codec.decode_dict`, same framing and upcasting checks) and assembles the models with
``model_construct``, converting only what the fold relies on: enums to their members, nested records to models,
arrays to tuples. The result equals `Codec.decode_batch`'s model for every record a correct owner writes (a unit test
checks every event type); `settled projections check` reads the log through the validating decoder, so a difference
would show there. Pass ``validate_records=True`` to the projector to validate anyway.
"""

from __future__ import annotations

import enum
import types
from collections.abc import Callable
from typing import Annotated, Any, Union, get_args, get_origin

from settled.schemas import LOG_EVENT_TYPES, AvroRecord, Codec, DecodeError, DecodeFailure, LogBatch

__all__ = ["FastBatchDecoder"]

Converter = Callable[[Any], Any]

_EVENTS: dict[str, type[AvroRecord]] = {cls.AVRO_NAME: cls for cls in LOG_EVENT_TYPES}


def _converter(annotation: Any) -> Converter | None:
    """Return how to turn a decoded Avro value into the field's Python value (None: use it as is)."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _converter(get_args(annotation)[0])
    if origin is Union or origin is types.UnionType:
        options = [a for a in get_args(annotation) if a is not type(None)]
        if len(options) != 1:
            return None  # a union of records (the batch's events): the caller builds the members itself
        inner = _converter(options[0])
        if inner is None:
            return None
        return lambda v: None if v is None else inner(v)
    if origin is tuple:
        item = _converter(get_args(annotation)[0])
        if item is None:
            return tuple
        return lambda v: tuple(item(x) for x in v)
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return annotation
    if isinstance(annotation, type) and issubclass(annotation, AvroRecord):
        build = _builder(annotation)
        return build
    return None


_BUILDERS: dict[type[AvroRecord], Converter] = {}


def _builder(cls: type[AvroRecord]) -> Converter:
    found = _BUILDERS.get(cls)
    if found is not None:
        return found
    converters = {name: _converter(f.annotation) for name, f in cls.model_fields.items()}
    plain = [name for name, conv in converters.items() if conv is None]
    converted = [(name, conv) for name, conv in converters.items() if conv is not None]
    construct = cls.model_construct

    def build(datum: dict[str, Any]) -> AvroRecord:
        values = {name: datum[name] for name in plain if name in datum}
        for name, conv in converted:
            if name in datum:
                values[name] = conv(datum[name])
        return construct(**values)

    _BUILDERS[cls] = build
    return build


class FastBatchDecoder:
    """Decodes ``settled.log`` records into `LogBatch` models without pydantic validation (module doc).

    Attributes:
        codec: The codec whose framing, schemas and upcasters are used.
    """

    def __init__(self, codec: Codec) -> None:
        """Build the per-type constructors.

        Args:
            codec: The codec.
        """
        self.codec = codec
        self._events = {name: _builder(cls) for name, cls in _EVENTS.items()}
        self._batch = _builder(LogBatch)

    def decode(self, value: bytes | None, *, topic: str, partition: int, offset: int) -> LogBatch:
        """Decode one log record.

        Args:
            value: The record value.
            topic: The log topic (named in errors).
            partition: Its partition (named in errors).
            offset: Its offset (named in errors).

        Returns:
            The batch.

        Raises:
            DecodeError: The value is not a decodable `LogBatch`, or an event names a type that is not a log event.
        """
        decoded = self.codec.decode_dict(value, topic=topic, partition=partition, offset=offset,
                                         expected=(LogBatch.AVRO_NAME,))  # fmt: skip
        datum = decoded.datum
        events = []
        for name, event in datum["events"]:
            build = self._events.get(name)
            if build is None:
                raise DecodeError(topic, partition, offset, DecodeFailure.UNEXPECTED_TYPE,
                                  f"events: {name!r} is not a settled log event")  # fmt: skip
            events.append(build(event))
        batch = self._batch({**datum, "events": tuple(events)})
        if not isinstance(batch, LogBatch):  # pragma: no cover - _builder(LogBatch) builds LogBatch
            raise TypeError(f"built a {type(batch).__name__}, not a LogBatch")
        return batch
