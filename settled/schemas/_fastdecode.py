"""The codec's fast path for log records: `LogBatch` models from the Avro body without validating them again.

settled has one decoder, `settled.schemas.Codec` (fastavro; framing, upcasting, the precise `DecodeError`); this
class puts a faster path in front of it for the one place a benchmark shows it pays, reading the whole log in a
projection rebuild (`bench/rebuild.py`, "consume + decode"). It lives beside the codec, never in the pure core.

The log is written only by partition owners, which build every batch from validated models; re-validating each
record on the way into Postgres costs about half of the projector's decoding time. `FastBatchDecoder` decodes the
Avro body — a record written with the current `LogBatch` schema (`settled.schemas.Codec.current_header`) through a
reader compiled from that schema (`settled.schemas._avroread`, fastavro's values without its per-value dispatch),
anything else, or a body that reader cannot read, through `settled.schemas.Codec.decode_dict` (same framing and
upcasting checks, and the precise `DecodeError`) — and assembles the models as ``model_construct`` does (generated
constructors), converting only what the fold relies on: enums to their members, nested records to models, arrays to
tuples. The result equals `Codec.decode_batch`'s model for every record a correct owner writes (a unit test
checks every event type); `settled projections check` reads the log through the validating decoder, so a difference
would show there. Pass ``validate_records=True`` to the projector to validate anyway.
"""

from __future__ import annotations

import enum
import types
from collections.abc import Callable, Mapping
from typing import Annotated, Any, Union, get_args, get_origin

from settled.schemas._avroread import READ_ERRORS, RecordCompiler, UnsupportedSchemaError
from settled.schemas._codec import Codec, DecodeError, DecodeFailure
from settled.schemas._envelope import LogBatch
from settled.schemas._events import LOG_EVENT_TYPES, AvroRecord

__all__ = ["FastBatchDecoder"]

Converter = Callable[[Any], Any]

_EVENTS: dict[str, type[AvroRecord]] = {cls.AVRO_NAME: cls for cls in LOG_EVENT_TYPES}
_BATCH_NAME = LogBatch.AVRO_NAME
_BATCH_NAMES = frozenset({_BATCH_NAME})


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
        members = {member.value: member for member in annotation}
        cls = annotation  # a value that names no member: the enum's own ValueError
        return lambda v: members[v] if v in members else cls(v)
    if isinstance(annotation, type) and issubclass(annotation, AvroRecord):
        build = _builder(annotation)
        return build
    return None


_BUILDERS: dict[type[AvroRecord], Converter] = {}

_new = object.__new__
_set = object.__setattr__


def _builder(cls: type[AvroRecord]) -> Converter:
    """Return a function building ``cls`` from its decoded dict, as ``model_construct`` does but faster.

    What ``model_construct`` sets on a model without validators run: its ``__dict__`` (every field, in field order),
    the set of fields given, no extra and no private attributes; nothing else (the log's models have no
    ``model_post_init``, no aliases and ``extra="forbid"``: checked here).
    """
    found = _BUILDERS.get(cls)
    if found is not None:
        return found
    if cls.__pydantic_post_init__ is not None or cls.__pydantic_root_model__:  # pragma: no cover - none of ours
        raise TypeError(f"{cls.__name__}: a model with model_post_init or a root model cannot be built unvalidated")
    if any(f.alias is not None or f.validation_alias is not None for f in cls.model_fields.values()):
        raise TypeError(f"{cls.__name__}: aliased fields cannot be built unvalidated")  # pragma: no cover
    names = tuple(cls.model_fields)
    converters = {name: _converter(cls.model_fields[name].annotation) for name in names}
    # One generated function per model (as dataclasses and attrs generate __init__): a dict display of the fields,
    # each read from the datum and converted when its type needs it; no loop, no per-field call when none does.
    scope: dict[str, Any] = {"new": _new, "set": _set, "cls": cls, "names": names}
    items = []
    for i, name in enumerate(names):
        conv = converters[name]
        if conv is None:
            items.append(f"{name!r}: d[{name!r}]")
        else:
            scope[f"c{i}"] = conv
            items.append(f"{name!r}: c{i}(d[{name!r}])")
    source = (
        "def build(d):\n"
        f"    values = {{{', '.join(items)}}}\n"
        "    model = new(cls)\n"
        "    set(model, '__dict__', values)\n"
        "    set(model, '__pydantic_fields_set__', set_(names))\n"
        "    set(model, '__pydantic_extra__', None)\n"
        "    set(model, '__pydantic_private__', None)\n"
        "    return model\n"
    )
    scope["set_"] = set
    # The source is generated from the model's own field names above, nothing else.
    exec(compile(source, f"<settled.schemas build {cls.__name__}>", "exec"), scope)
    build: Converter = scope["build"]
    _BUILDERS[cls] = build
    return build


def _strip(annotation: Any) -> Any:
    while get_origin(annotation) is Annotated:
        annotation = get_args(annotation)[0]
    return annotation


def _optional(annotation: Any) -> Any | None:
    """The ``X`` of ``X | None`` (one option besides None), else None."""
    if get_origin(annotation) in (Union, types.UnionType):
        options = [a for a in get_args(annotation) if a is not type(None)]
        if len(options) == 1 and len(options) < len(get_args(annotation)):
            return _strip(options[0])
    return None


def _base_slot_setter(name: str) -> Callable[[Any, Any], None]:
    """The ``__set__`` of the descriptor that ``object.__setattr__(model, name, value)`` uses for a `BaseModel` slot.

    Raises:
        UnsupportedSchemaError: No class of `AvroRecord`'s bases defines it (another pydantic layout).
    """
    for klass in AvroRecord.__mro__:
        descriptor = klass.__dict__.get(name)
        if descriptor is not None:
            setter = getattr(descriptor, "__set__", None)
            if setter is None:  # pragma: no cover - pydantic 2's slots are data descriptors
                break
            found: Callable[[Any, Any], None] = setter
            return found
    raise UnsupportedSchemaError(f"{name} is not a slot of the models' base")  # pragma: no cover - see above


class _ModelCompiler(RecordCompiler):
    """Compiles the log's schema into a reader that builds the models directly (no intermediate dicts).

    Each record with a model is read into locals and built as `_builder` builds it from fastavro's dict: the same
    conversions (`_converter`: enum members, nested models, tuples), done where the value is read. A field whose
    (Avro type, annotation) pair is not one of those raises `UnsupportedSchemaError`: the dict reader is used instead.
    """

    def __init__(self, named: Mapping[str, Any], models: Mapping[str, type[AvroRecord]]) -> None:
        super().__init__(named)
        self.models = models
        # BaseModel's own slots, set through their descriptors (what object.__setattr__ looks up for each name).
        slots = {name: _base_slot_setter(name) for name in ("__dict__", "__pydantic_fields_set__", "__pydantic_extra__",
                                                              "__pydantic_private__")}  # fmt: skip
        self.scope.update(
            NEW=_new,
            SET_DICT=slots["__dict__"],
            SET_FIELDS_SET=slots["__pydantic_fields_set__"],
            SET_EXTRA=slots["__pydantic_extra__"],
            SET_PRIVATE=slots["__pydantic_private__"],
        )

    def record(self, schema: Mapping[str, Any]) -> str:
        name = str(schema["name"])
        model = self.models.get(name)
        if model is None:
            raise UnsupportedSchemaError(f"record {name} has no model")
        found = self.records.get(name)
        if found is not None:
            return found
        function = f"model{len(self.records)}"
        self.records[name] = function
        fields = {str(f["name"]): f["type"] for f in schema["fields"]}
        if list(fields) != list(model.model_fields):
            raise UnsupportedSchemaError(f"{name}: Avro fields {list(fields)} are not the model's fields")
        if model.__pydantic_post_init__ is not None or model.__pydantic_root_model__:  # pragma: no cover - none
            raise UnsupportedSchemaError(f"{model.__name__} has model_post_init or is a root model")
        lines = [f"def {function}(d, p, n):  # {name}"]
        for i, (field_name, avro) in enumerate(fields.items()):
            lines += self.field(avro, model.model_fields[field_name].annotation, f"f{i}", "    ", 0)
        # Every field set (a copy of one set per model: copying a set is faster than building it from names).
        cls, names = self.constant(model), self.constant(set(fields))
        values = ", ".join(f"{field_name!r}: f{i}" for i, field_name in enumerate(fields))
        lines += [
            f"    m = NEW({cls})",
            f"    SET_DICT(m, {{{values}}})",
            f"    SET_FIELDS_SET(m, {names}.copy())",
            "    SET_EXTRA(m, None)",
            "    SET_PRIVATE(m, None)",
            "    return m, p",
        ]
        self.sources.append("\n".join(lines))
        return function

    def field(self, avro: Any, annotation: Any, var: str, ind: str, depth: int) -> list[str]:
        """Read one value of Avro type ``avro`` into ``var`` as the model field ``annotation`` holds it."""
        annotation = _strip(annotation)
        t = self.resolve(avro)
        inner = _optional(annotation)
        if inner is not None:
            if not (isinstance(t, list) and len(t) == 2 and "null" in [self.resolve(b) for b in t]):
                raise UnsupportedSchemaError(f"optional {annotation!r} read from {t!r}")
            null = [self.resolve(b) for b in t].index("null")
            lines = self.varint("u", ind)
            lines += [f"{ind}if u == {null}:", f"{ind}    {var} = None", f"{ind}elif u == {1 - null}:"]
            lines += self.field(t[1 - null], inner, var, ind + "    ", depth + 1)
            return [*lines, f"{ind}else:", f"{ind}    raise ValueError"]
        if get_origin(annotation) is tuple:
            if not (isinstance(t, dict) and t.get("type") == "array"):
                raise UnsupportedSchemaError(f"tuple {annotation!r} read from {t!r}")
            item_annotation = get_args(annotation)[0]
            count, item, items = f"c{depth}", f"i{depth}", f"l{depth}"
            return [
                f"{ind}{items} = []",
                *self.varint(count, ind),
                f"{ind}while {count}:",
                f"{ind}    if {count} < 0:",
                f"{ind}        {count} = -{count}",
                *self.varint("m", ind + "        "),
                f"{ind}    for _ in range({count}):",
                *self.item(t["items"], item_annotation, item, ind + "        ", depth + 1),
                f"{ind}        {items}.append({item})",
                *self.varint(count, ind + "    "),
                f"{ind}{var} = tuple({items})",
            ]
        if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
            if not (isinstance(t, dict) and t.get("type") == "enum"):
                raise UnsupportedSchemaError(f"enum {annotation.__name__} read from {t!r}")
            convert = _converter(annotation)
            assert convert is not None
            members = self.constant(tuple(convert(symbol) for symbol in t["symbols"]))  # a stray symbol raises here
            return [
                *self.varint("m", ind),
                f"{ind}if m < 0:",
                f"{ind}    raise ValueError",
                f"{ind}{var} = {members}[m]",
            ]
        if isinstance(annotation, type) and issubclass(annotation, AvroRecord):
            if not (isinstance(t, dict) and t.get("type") == "record" and t["name"] == annotation.AVRO_NAME):
                raise UnsupportedSchemaError(f"record {annotation.__name__} read from {t!r}")
            return [f"{ind}{var}, p = {self.record(t)}(d, p, n)"]
        if _converter(annotation) is not None:  # pragma: no cover - every converted kind is handled above
            raise UnsupportedSchemaError(f"{annotation!r} needs a conversion this compiler does not make")
        if isinstance(t, list) or (isinstance(t, dict) and t.get("type") in ("record", "array", "enum")):
            raise UnsupportedSchemaError(f"{annotation!r} read from {t!r}")
        return self.read(t, var, ind, depth)

    def item(self, avro: Any, annotation: Any, var: str, ind: str, depth: int) -> list[str]:
        """An array item: a field value, or one of a union of records (the batch's events) built as its model."""
        annotation = _strip(annotation)
        t = self.resolve(avro)
        if get_origin(annotation) in (Union, types.UnionType) and _optional(annotation) is None:
            branches = [self.resolve(b) for b in t] if isinstance(t, list) else []
            if not branches or any(not (isinstance(b, dict) and b.get("type") == "record") for b in branches):
                raise UnsupportedSchemaError(f"union {annotation!r} read from {t!r}")
            options = {cls.AVRO_NAME: cls for cls in get_args(annotation)}
            functions = []
            for branch in branches:
                if branch["name"] not in options:
                    raise UnsupportedSchemaError(f"{branch['name']} is not one of {sorted(options)}")
                functions.append(self.record(branch))
            # The branch's reader by its index: one lookup instead of a comparison per branch.
            table = f"BRANCHES{len(self.sources)}"
            self.sources.append(f"{table} = ({', '.join(functions)},)")
            return [
                *self.varint("u", ind),
                f"{ind}if u < 0:",
                f"{ind}    raise ValueError",
                f"{ind}{var}, p = {table}[u](d, p, n)",
            ]
        return self.field(avro, annotation, var, ind, depth)


def _models(annotation: Any, out: dict[str, type[AvroRecord]]) -> dict[str, type[AvroRecord]]:
    """Every model class reachable from an annotation (the batch, its events, their nested records), by Avro name."""
    annotation = _strip(annotation)
    if isinstance(annotation, type) and issubclass(annotation, AvroRecord):
        if annotation.AVRO_NAME not in out:
            out[annotation.AVRO_NAME] = annotation
            for info in annotation.model_fields.values():
                _models(info.annotation, out)
    for arg in get_args(annotation):
        _models(arg, out)
    return out


def _compile_batch_reader(codec: Codec) -> Callable[[bytes, int], LogBatch] | None:
    """The fused reader of current `LogBatch` records (`_ModelCompiler`), or None when the schema is not covered."""
    parsed = codec.schema(_BATCH_NAME).parsed
    try:
        compiler = _ModelCompiler(parsed.get("__named_schemas", {}), _models(LogBatch, {}))
        top = compiler.record(parsed)
    except (UnsupportedSchemaError, ValueError, KeyError):
        return None
    source = "\n\n\n".join(compiler.sources)
    # The source is generated from the schema's structure and the models' field names (repr() literals only).
    exec(compile(source, "<settled.schemas LogBatch reader>", "exec"), compiler.scope)
    function: Callable[[bytes, int, int], tuple[LogBatch, int]] = compiler.scope[top]

    def read(value: bytes, start: int) -> LogBatch:
        batch, end = function(value, start, len(value))
        if end != len(value):
            raise ValueError(f"{len(value) - end} bytes trail the body")
        return batch

    return read


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
        self._header = codec.current_header(_BATCH_NAME)
        self._read_batch: Callable[[bytes, int], LogBatch] | None = None
        if self._header:
            self._read_batch = _compile_batch_reader(codec)  # None: a field it does not cover; dicts then

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
        if self._read_batch is not None and value is not None and value.startswith(self._header):
            try:
                return self._read_batch(value, len(self._header))
            except READ_ERRORS:
                pass  # the full path decodes it or says why
        # Another framing or version, a schema the compiled reader does not cover, or a broken record: the codec's
        # fastavro path decodes it or says why.
        datum = self.codec.decode_dict(
            value, topic=topic, partition=partition, offset=offset, expected=_BATCH_NAMES, body_digest=False
        ).datum
        events = self._events
        raw = datum["events"]
        try:
            datum["events"] = tuple([events[name](event) for name, event in raw])
        except KeyError as exc:
            unknown = [name for name, _ in raw if name not in events]
            if unknown:
                raise DecodeError(topic, partition, offset, DecodeFailure.UNEXPECTED_TYPE,
                                  f"events: {unknown[0]!r} is not a settled log event") from exc  # fmt: skip
            raise DecodeError(topic, partition, offset, DecodeFailure.INVALID, f"an event lacks field {exc}") from exc
        try:
            batch = self._batch(datum)
        except KeyError as exc:
            raise DecodeError(topic, partition, offset, DecodeFailure.INVALID, f"the batch lacks field {exc}") from exc
        if not isinstance(batch, LogBatch):  # pragma: no cover - _builder(LogBatch) builds LogBatch
            raise TypeError(f"built a {type(batch).__name__}, not a LogBatch")
        return batch
