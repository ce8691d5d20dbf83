"""The codec: settled records to and from Kafka record values (issue 4 item 3; docs/design.md §7).

Two wire formats, both decodable by any Avro library from the shipped ``.avsc`` files:

* **Avro single-object encoding** (default): ``C3 01``, the 8-byte little-endian CRC-64-AVRO fingerprint of the
  writer schema's Parsing Canonical Form, then the Avro binary body. The fingerprint identifies the record type and
  its schema version (every version kept in ``avsc/history/`` is known).
* **Confluent Schema Registry wire format** (when a registry is configured): ``00``, the 4-byte big-endian schema id,
  then the Avro binary body. Each record type is registered under the subject of its full name (Confluent's
  ``record_subject_name_strategy``: the inbox carries three record types).

A decoder reads both formats whatever it encodes with (the first byte tells them apart), so a submission retried in
the other format is the same submission (docs/design.md §4). What cannot be decoded raises `DecodeError` naming topic,
partition, offset and a `DecodeFailure` reason; a registry that does not answer raises
`SchemaRegistryUnavailableError` instead (not the record's fault: never quarantine on it).

Old versions are read in steps: the body is read with its writer's schema (version *w*), then for each following
kept version an upcaster registered for (record name, version) maps the dict to the next version's shape, or, when
none is registered, Avro schema resolution does. ``encode_dict`` / ``decode_dict`` skip pydantic for hot paths.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol

from fastavro import parse_schema
from fastavro.read import SchemaResolutionError
from fastavro.schema import fingerprint, to_parsing_canonical_form
from fastavro.validation import ValidationError as AvroValidationError
from pydantic import ValidationError

from settled._errors import ErrorCategory, SettledError
from settled.schemas._binary import read_body, write_body
from settled.schemas._envelope import ChainEntry, LogBatch, body_batch_digest
from settled.schemas._events import (
    LOG_EVENT_TYPES,
    SCHEMA_VERSION,
    TOPIC_RECORD_TYPES,
    AvroRecord,
    DeclaredToolCall,
    InputRef,
    QuarantineReason,
    SubmissionPayload,
    ToolError,
    Usage,
)
from settled.schemas._schemaset import NamedSchema, SchemaSet, current_schemas, history_schemas, history_versions

__all__ = [
    "CONFLUENT_MAGIC",
    "SINGLE_OBJECT_MAGIC",
    "Codec",
    "DecodeError",
    "DecodeFailure",
    "Decoded",
    "EncodeError",
    "SchemaRegistry",
    "SchemaRegistryUnavailableError",
    "Upcaster",
    "WireFormat",
]

SINGLE_OBJECT_MAGIC: Final = b"\xc3\x01"
"""First two bytes of an Avro single-object encoded record."""

CONFLUENT_MAGIC: Final = b"\x00"
"""First byte of a Confluent Schema Registry framed record."""

_SINGLE_OBJECT_HEADER_BYTES = 10
_CONFLUENT_FIRST = CONFLUENT_MAGIC[0]
_SINGLE_OBJECT_FIRST, _SINGLE_OBJECT_SECOND = SINGLE_OBJECT_MAGIC[0], SINGLE_OBJECT_MAGIC[1]
_CONFLUENT_HEADER_BYTES = 5

Upcaster = Callable[[dict[str, Any]], dict[str, Any]]
"""Maps a record's dict in one schema version's shape to the next kept version's shape."""

_RECORD_TYPES: tuple[type[AvroRecord], ...] = (
    *TOPIC_RECORD_TYPES,
    LogBatch,
    *LOG_EVENT_TYPES,
    InputRef,
    SubmissionPayload,
    ToolError,
    Usage,
    DeclaredToolCall,
)

_READ_ERRORS = (
    EOFError,
    ValueError,
    TypeError,
    IndexError,
    KeyError,
    OverflowError,
    SchemaResolutionError,
    AvroValidationError,
)


class WireFormat(enum.StrEnum):
    """A record value's framing."""

    SINGLE_OBJECT = "single_object"
    CONFLUENT = "confluent"


class DecodeFailure(enum.StrEnum):
    """Why a record value could not be decoded."""

    EMPTY = "empty"
    """No value (a null or empty Kafka record value)."""
    BAD_MAGIC = "bad_magic"
    """Neither ``C3 01`` nor ``00``."""
    TRUNCATED = "truncated"
    """The header or body ends early."""
    UNKNOWN_FINGERPRINT = "unknown_fingerprint"
    """A single-object fingerprint of no shipped or kept schema."""
    UNKNOWN_SCHEMA_ID = "unknown_schema_id"
    """A Confluent schema id the registry does not know, or that names no settled record."""
    NO_REGISTRY = "no_registry"
    """A Confluent-framed value but no registry is configured."""
    INVALID = "invalid"
    """The body is not valid for its schema, or bytes trail it."""
    INVALID_FIELD = "invalid_field"
    """Valid Avro, but a field breaks a model rule (`DecodeError.field` names it, `DecodeError.datum` holds the
    decoded dict): for an inbox record, the admission answers with a rejection, not quarantine (docs/design.md §4)."""
    UNEXPECTED_TYPE = "unexpected_type"
    """A valid record of a type the caller does not accept here (e.g. a receipt on the inbox)."""
    UPCAST_FAILED = "upcast_failed"
    """An old version could not be brought to the current one."""

    @property
    def quarantine_reason(self) -> QuarantineReason:
        """The `QuarantineReason` recorded when an inbox record fails this way.

        Returns:
            ``truncated`` and ``unknown_fingerprint`` map to themselves; the rest to ``undecodable``.
        """
        if self is DecodeFailure.TRUNCATED:
            return QuarantineReason.TRUNCATED
        if self is DecodeFailure.UNKNOWN_FINGERPRINT:
            return QuarantineReason.UNKNOWN_FINGERPRINT
        return QuarantineReason.UNDECODABLE


class DecodeError(SettledError, ValueError):
    """A record value that cannot be decoded (issue 4 item 3).

    Attributes:
        topic: The record's topic ("" when not from Kafka).
        partition: Its partition (-1 when not from Kafka).
        offset: Its offset (-1 when not from Kafka).
        reason: Why.
        detail: Human-readable detail.
        avro_name: For ``invalid_field``: the record's full name, else None.
        field: For ``invalid_field``: the dotted path of the first offending field, e.g. ``"payload.input_json"``.
        datum: For ``invalid_field``: the decoded dict (ids for a rejection receipt), else None.
    """

    category = ErrorCategory.BAD_INPUT

    def __init__(
        self,
        topic: str,
        partition: int,
        offset: int,
        reason: DecodeFailure,
        detail: str,
        *,
        avro_name: str | None = None,
        field: str | None = None,
        datum: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(f"cannot decode {topic}[{partition}]@{offset}: {reason.value}: {detail}")
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.reason = reason
        self.detail = detail
        self.avro_name = avro_name
        self.field = field
        self.datum = datum


class EncodeError(SettledError, ValueError):
    """A record or dict that does not fit its schema.

    Attributes:
        avro_name: The record's full Avro name.
        detail: fastavro's complaint.
    """

    category = ErrorCategory.BAD_INPUT

    def __init__(self, avro_name: str, detail: str) -> None:
        super().__init__(f"cannot encode {avro_name}: {detail}")
        self.avro_name = avro_name
        self.detail = detail


class SchemaRegistryUnavailableError(SettledError, RuntimeError):
    """The Schema Registry did not answer; the record itself may be fine (retry, do not quarantine)."""

    category = ErrorCategory.UNAVAILABLE


class SchemaRegistry(Protocol):
    """What the codec needs from a Schema Registry.

    `settled.schemas.registry.ConfluentSchemaRegistry` adapts confluent-kafka's ``SchemaRegistryClient``.
    """

    def register(self, subject: str, schema_json: str) -> int:
        """Register (or find) a schema under a subject and return its id.

        Args:
            subject: The subject.
            schema_json: The Avro schema text.

        Returns:
            The schema id.

        Raises:
            SchemaRegistryUnavailableError: If the registry does not answer.
        """
        ...

    def schema_json(self, schema_id: int) -> str | None:
        """Return the schema text of an id.

        Args:
            schema_id: The id.

        Returns:
            The schema text, or None when the registry has no such id.

        Raises:
            SchemaRegistryUnavailableError: If the registry does not answer.
        """
        ...


@dataclass(frozen=True)
class Decoded:
    """A decoded record value as a dict (``decode_dict``).

    Attributes:
        avro_name: The record's full Avro name.
        datum: The record in the current schema's shape (events of a `LogBatch` as ``(full name, dict)``).
        writer_version: The schema version it was written with.
        wire_format: Its framing.
        body_digest: For a `LogBatch`: `settled.schemas.body_batch_digest` of the body as written, else None.
    """

    avro_name: str
    datum: dict[str, Any]
    writer_version: int
    wire_format: WireFormat
    body_digest: str | None = None


@dataclass(frozen=True)
class _Writer:
    """A schema a value may have been written with."""

    schema: NamedSchema
    version: int


class Codec:
    """Encodes and decodes settled records (issue 4 item 3).

    One codec per process is enough; it is safe to share between threads once built (its caches only grow, by
    idempotent inserts).
    """

    def __init__(
        self,
        *,
        registry: SchemaRegistry | None = None,
        schemas: SchemaSet | None = None,
        history: Mapping[int, SchemaSet] | None = None,
        version: int = SCHEMA_VERSION,
        record_types: Iterable[type[AvroRecord]] = _RECORD_TYPES,
    ) -> None:
        """Build a codec.

        Args:
            registry: A Schema Registry: encode in the Confluent wire format. None: single-object encoding.
            schemas: The current schemas (default: the shipped ones).
            history: Kept versions, version → schema set (default: ``avsc/history/``).
            version: The current schema version.
            record_types: The models `decode` builds, by their ``AVRO_NAME``.

        Raises:
            ValueError: If two distinct schemas share a fingerprint (a CRC-64 collision; never expected).
        """
        self._registry = registry
        self._current = schemas if schemas is not None else current_schemas()
        if history is None:
            history = {kept: history_schemas(kept) for kept in history_versions()}
        self._history = dict(history)
        self._version = version
        self._models = {cls.AVRO_NAME: cls for cls in record_types}
        self._upcasters: dict[tuple[str, int], Upcaster] = {}
        self._versions = sorted({*self._history, version})
        self._by_fingerprint: dict[int, _Writer] = {}
        for kept in sorted(self._history):
            for named in self._history[kept].schemas.values():
                self._add_writer(named, kept)
        for named in self._current.schemas.values():
            self._add_writer(named, version)
        self._schema_ids: dict[str, int] = {}
        self._by_schema_id: dict[int, _Writer] = {}

    def _add_writer(self, named: NamedSchema, version: int) -> None:
        known = self._by_fingerprint.get(named.fingerprint)
        if known is not None and known.schema.canonical_form != named.canonical_form:
            raise ValueError(f"fingerprint collision: {known.schema.full_name} and {named.full_name}")
        self._by_fingerprint[named.fingerprint] = _Writer(named, version)

    # ------------------------------------------------------------------------------------------------ encode

    @property
    def wire_format(self) -> WireFormat:
        """The format `encode` writes.

        Returns:
            Confluent when a registry is configured, else single-object.
        """
        return WireFormat.SINGLE_OBJECT if self._registry is None else WireFormat.CONFLUENT

    @property
    def version(self) -> int:
        """The current schema version.

        Returns:
            The version records are written with.
        """
        return self._version

    def schema(self, avro_name: str) -> NamedSchema:
        """Return the current schema of a named type.

        Args:
            avro_name: Full name, e.g. ``"dev.settled.v1.Receipt"``.

        Returns:
            The named schema (fingerprint, standalone JSON, parsed form).

        Raises:
            KeyError: If there is no such type.
        """
        return self._current.get(avro_name)

    def encode(self, record: AvroRecord) -> bytes:
        """Encode a record in the codec's wire format.

        Args:
            record: Any settled record.

        Returns:
            The Kafka record value.

        Raises:
            EncodeError: If the record does not fit its schema.
            SchemaRegistryUnavailableError: If a registry is configured and does not answer.
        """
        return self.encode_dict(record.AVRO_NAME, record.to_avro())

    def encode_dict(self, avro_name: str, datum: dict[str, Any]) -> bytes:
        """Encode a record given as the dict fastavro writes, without building a model (hot path).

        Args:
            avro_name: The record's full name.
            datum: The record as a dict (nested records as dicts, arrays as lists, times as aware datetimes,
                log events of a batch as ``(full name, dict)``). Written strictly: no missing or unknown field.

        Returns:
            The Kafka record value.

        Raises:
            EncodeError: If the dict does not fit the schema or the name is unknown.
            SchemaRegistryUnavailableError: If a registry is configured and does not answer.
        """
        named = self._named_for_encode(avro_name)
        return self._header(named) + self._body(named, datum)

    def encode_batch_dict(self, datum: dict[str, Any]) -> tuple[bytes, str]:
        """Seal and encode a `LogBatch` given as a dict: compute ``batch_digest`` from the body (hot path).

        Args:
            datum: The envelope dict; its ``batch_digest`` is ignored and replaced.

        Returns:
            The Kafka record value and the batch digest.

        Raises:
            EncodeError: If the dict does not fit the schema.
            SchemaRegistryUnavailableError: If a registry is configured and does not answer.
        """
        named = self._named_for_encode(LogBatch.AVRO_NAME)
        body = bytearray(self._body(named, {**datum, "batch_digest": "0" * 64}))
        digest = body_batch_digest(body)
        body[2:66] = digest.encode("ascii")
        return self._header(named) + bytes(body), digest

    def _named_for_encode(self, avro_name: str) -> NamedSchema:
        try:
            return self._current.get(avro_name)
        except KeyError as exc:
            raise EncodeError(avro_name, "no such Avro type") from exc

    def _body(self, named: NamedSchema, datum: dict[str, Any]) -> bytes:
        if not named.is_record:
            raise EncodeError(named.full_name, "only records are encoded on their own")
        try:
            return write_body(named.parsed, datum)
        except (ValueError, TypeError, KeyError, OverflowError, AvroValidationError) as exc:
            raise EncodeError(named.full_name, str(exc)) from exc

    def _header(self, named: NamedSchema) -> bytes:
        if self._registry is None:
            return SINGLE_OBJECT_MAGIC + named.fingerprint_bytes
        schema_id = self._schema_ids.get(named.full_name)
        if schema_id is None:
            schema_id = self._registry.register(named.full_name, named.standalone_json)
            self._schema_ids[named.full_name] = schema_id
            self._by_schema_id.setdefault(schema_id, _Writer(named, self._version))
        return CONFLUENT_MAGIC + schema_id.to_bytes(4, "big")

    # ------------------------------------------------------------------------------------------------ decode

    def register_upcaster(self, avro_name: str, from_version: int, upcaster: Upcaster) -> None:
        """Register a function that maps a record's dict from one kept version to the next (applied on read).

        Args:
            avro_name: The record's full name (for a batch's events: ``LogBatch``'s, walking its events).
            from_version: The version whose shape it reads; it returns the next kept version's shape.
            upcaster: The function.

        Raises:
            ValueError: If ``from_version`` is not a kept version below the current one, or one is registered.
        """
        if from_version not in self._versions or from_version >= self._version:
            raise ValueError(
                f"from_version={from_version}: upcasters map a kept version below {self._version} "
                f"(kept: {self._versions})"
            )
        if (avro_name, from_version) in self._upcasters:
            raise ValueError(f"an upcaster for {avro_name} v{from_version} is already registered")
        self._upcasters[(avro_name, from_version)] = upcaster

    def decode(
        self,
        value: bytes | None,
        *,
        topic: str = "",
        partition: int = -1,
        offset: int = -1,
        expected: tuple[type[AvroRecord], ...] | None = None,
    ) -> AvroRecord:
        """Decode a Kafka record value into its model.

        Args:
            value: The record value, in either wire format.
            topic: The record's topic (named in errors).
            partition: Its partition (named in errors).
            offset: Its offset (named in errors).
            expected: The record types accepted here, or None for any.

        Returns:
            The record.

        Raises:
            DecodeError: If the value cannot be decoded, is of an unexpected type, or breaks a model rule.
            SchemaRegistryUnavailableError: If a Confluent-framed value's schema id is not cached and the registry
                does not answer.
        """
        names = None if expected is None else {cls.AVRO_NAME for cls in expected}
        decoded = self._decode(value, topic, partition, offset, names)
        model = self._models.get(decoded.avro_name)
        if model is None:
            raise DecodeError(
                topic, partition, offset, DecodeFailure.UNEXPECTED_TYPE, f"{decoded.avro_name} has no model"
            )
        try:
            return model.from_avro(decoded.datum)
        except ValueError as exc:  # pydantic.ValidationError is a ValueError
            raise _invalid_field(topic, partition, offset, decoded, exc) from exc

    def decode_dict(
        self,
        value: bytes | None,
        *,
        topic: str = "",
        partition: int = -1,
        offset: int = -1,
        expected: Iterable[str] | None = None,
        body_digest: bool = True,
    ) -> Decoded:
        """Decode a Kafka record value into a dict, without building a model (hot path; no model rules checked).

        Args:
            value: The record value, in either wire format.
            topic: The record's topic (named in errors).
            partition: Its partition (named in errors).
            offset: Its offset (named in errors).
            expected: Full Avro names accepted here, or None for any.
            body_digest: For a `LogBatch`, compute `Decoded.body_digest` (a SHA-256 of the body; the projections,
                which do not verify chains, skip it).

        Returns:
            The decoded dict and its provenance.

        Raises:
            DecodeError: If the value cannot be decoded or is of an unexpected type.
            SchemaRegistryUnavailableError: As in `decode`.
        """
        if expected is not None and not isinstance(expected, frozenset | set):
            expected = frozenset(expected)
        return self._decode(value, topic, partition, offset, expected, body_digest)

    def current_header(self, avro_name: str) -> bytes:
        """Return the single-object header of records written with the current schema of a type, for hot paths.

        A value starting with it decodes with `schema(avro_name).parsed` and needs no upcasting, so a caller may
        read such bodies its own way (and hand anything else, or a body it cannot read, to `decode_dict`).

        Args:
            avro_name: The record's full name.

        Returns:
            ``C3 01`` and the fingerprint; empty when there is no such record type or its records are upcast on
            read (a later schema version is kept).
        """
        try:
            named = self._current.get(avro_name)
        except KeyError:
            return b""
        writer = self._by_fingerprint.get(named.fingerprint)
        if writer is None or not named.is_record or writer.version < self._versions[-1]:
            return b""
        return SINGLE_OBJECT_MAGIC + named.fingerprint_bytes

    def decode_batch(self, value: bytes | None, *, topic: str = "", partition: int = -1, offset: int) -> ChainEntry:
        """Decode a ``settled.log`` record into a `settled.schemas.ChainEntry` for `settled.schemas.verify_chain`.

        Args:
            value: The record value.
            topic: The log topic (named in errors).
            partition: Its partition (named in errors).
            offset: Its offset.

        Returns:
            The offset, the batch and the digest of its body as written.

        Raises:
            DecodeError: If the value is not a decodable `LogBatch`.
            SchemaRegistryUnavailableError: As in `decode`.
        """
        decoded = self._decode(value, topic, partition, offset, {LogBatch.AVRO_NAME})
        try:
            batch = LogBatch.from_avro(decoded.datum)
        except ValueError as exc:
            raise _invalid_field(topic, partition, offset, decoded, exc) from exc
        return ChainEntry(offset, batch, decoded.body_digest)

    def _decode(
        self,
        value: bytes | None,
        topic: str,
        partition: int,
        offset: int,
        expected: frozenset[str] | set[str] | None,
        body_digest: bool = True,
    ) -> Decoded:
        def fail(reason: DecodeFailure, detail: str) -> DecodeError:
            return DecodeError(topic, partition, offset, reason, detail)

        if not value:
            raise fail(DecodeFailure.EMPTY, "the record has no value")
        view = memoryview(value)
        first = view[0]
        if first == _CONFLUENT_FIRST:
            if len(view) < _CONFLUENT_HEADER_BYTES:
                raise fail(DecodeFailure.TRUNCATED, f"{len(view)} bytes, a Confluent header takes 5")
            writer = self._writer_for_schema_id(int.from_bytes(view[1:5], "big"), fail)
            wire_format, body = WireFormat.CONFLUENT, view[_CONFLUENT_HEADER_BYTES:]
        elif first == _SINGLE_OBJECT_FIRST and len(view) >= 2 and view[1] == _SINGLE_OBJECT_SECOND:
            if len(view) < _SINGLE_OBJECT_HEADER_BYTES:
                raise fail(DecodeFailure.TRUNCATED, f"{len(view)} bytes, a single-object header takes 10")
            fp = int.from_bytes(view[2:10], "little")
            found = self._by_fingerprint.get(fp)
            if found is None:
                raise fail(DecodeFailure.UNKNOWN_FINGERPRINT, f"fingerprint {fp:016x} is no settled schema")
            writer, wire_format, body = found, WireFormat.SINGLE_OBJECT, view[_SINGLE_OBJECT_HEADER_BYTES:]
        elif first == _SINGLE_OBJECT_FIRST and len(view) < 2:
            raise fail(DecodeFailure.TRUNCATED, "1 byte, a single-object header takes 10")
        else:
            raise fail(DecodeFailure.BAD_MAGIC, f"starts with {bytes(view[:2]).hex()}, expected c301 or 00")
        name = writer.schema.full_name
        if expected is not None and name not in expected:
            raise fail(DecodeFailure.UNEXPECTED_TYPE, f"{name} is not accepted here (expected {sorted(expected)})")
        if not writer.schema.is_record:
            raise fail(DecodeFailure.UNEXPECTED_TYPE, f"{name} is not a record")
        datum = self._read(body, writer, fail)
        digest = None
        if body_digest and name == LogBatch.AVRO_NAME:
            try:
                digest = body_batch_digest(body)
            except ValueError as exc:
                raise fail(DecodeFailure.INVALID, str(exc)) from exc
        return Decoded(name, datum, writer.version, wire_format, digest)

    def _read(self, body: memoryview, writer: _Writer, fail: Callable[[DecodeFailure, str], DecodeError]) -> Any:
        name = writer.schema.full_name
        try:
            datum, used = read_body(body, writer.schema.parsed)
        except _READ_ERRORS as exc:
            if _is_truncation(exc):
                raise fail(DecodeFailure.TRUNCATED, f"the {name} body ends early ({exc!r})") from exc
            raise fail(DecodeFailure.INVALID, f"the {name} body is invalid: {exc!r}") from exc
        if used != len(body):
            raise fail(DecodeFailure.INVALID, f"{len(body) - used} bytes trail the {name} body")
        if writer.version >= self._versions[-1]:
            return datum  # written with the latest schema: nothing to upcast
        later = [kept for kept in self._versions if kept > writer.version]
        version, schema = writer.version, writer.schema
        for kept in later:
            target = self._schemas_of(kept).schemas.get(name)
            if target is None:
                raise fail(DecodeFailure.UPCAST_FAILED, f"{name} does not exist in schema version {kept}")
            upcaster = self._upcasters.get((name, version))
            try:
                if upcaster is not None:
                    datum = upcaster(datum)
                else:
                    datum, _ = read_body(write_body(schema.parsed, datum), schema.parsed, target.parsed)
            except _READ_ERRORS as exc:
                raise fail(DecodeFailure.UPCAST_FAILED, f"{name} v{version} → v{kept}: {exc!r}") from exc
            version, schema = kept, target
        return datum

    def _schemas_of(self, version: int) -> SchemaSet:
        return self._current if version == self._version else self._history[version]

    def _writer_for_schema_id(self, schema_id: int, fail: Callable[[DecodeFailure, str], DecodeError]) -> _Writer:
        known = self._by_schema_id.get(schema_id)
        if known is not None:
            return known
        if self._registry is None:
            raise fail(DecodeFailure.NO_REGISTRY, f"Confluent-framed (schema id {schema_id}) but no registry is set")
        text = self._registry.schema_json(schema_id)
        if text is None:
            raise fail(DecodeFailure.UNKNOWN_SCHEMA_ID, f"the registry has no schema id {schema_id}")
        try:
            canonical = to_parsing_canonical_form(parse_schema(json.loads(text)))
        except (ValueError, TypeError, KeyError) as exc:
            raise fail(DecodeFailure.UNKNOWN_SCHEMA_ID, f"schema id {schema_id} is not Avro: {exc}") from exc
        fp = int.from_bytes(bytes.fromhex(fingerprint(canonical, "CRC-64-AVRO")), "little")
        found = self._by_fingerprint.get(fp)
        if found is None:
            raise fail(DecodeFailure.UNKNOWN_SCHEMA_ID, f"schema id {schema_id} is no settled schema (fp {fp:016x})")
        self._by_schema_id[schema_id] = found
        return found


def _is_truncation(exc: BaseException) -> bool:
    """Whether fastavro failed by reading past the end of the body.

    The pure-Python reader raises `EOFError`; the compiled reader raises `EOFError` for a short string or bytes
    and ``IndexError("string index out of range")`` for a varint cut short (a unit test cuts a body at every byte).
    """
    return isinstance(exc, EOFError) or (isinstance(exc, IndexError) and str(exc) == "string index out of range")


def _invalid_field(topic: str, partition: int, offset: int, decoded: Decoded, exc: ValueError) -> DecodeError:
    field = None
    if isinstance(exc, ValidationError) and exc.errors():
        field = ".".join(str(part) for part in exc.errors()[0]["loc"]) or None
    return DecodeError(
        topic,
        partition,
        offset,
        DecodeFailure.INVALID_FIELD,
        f"{decoded.avro_name}: {exc}",
        avro_name=decoded.avro_name,
        field=field,
        datum=decoded.datum,
    )
