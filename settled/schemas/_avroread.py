"""A reader compiled from one Avro schema: the same values as fastavro's ``schemaless_reader``, without its dispatch.

fastavro's compiled reader interprets the schema for every value it reads: a chain of type-name comparisons, a
named-type lookup, one file-object call per varint byte. `compile_reader` turns a parsed schema (fastavro's
``parse_schema`` form, as `settled.schemas.NamedSchema.parsed` holds it) into Python source once — one function per
record type, every field read in place from the bytes — and returns a function decoding one body into exactly what
``schemaless_reader(fo, schema, None, return_record_name=True, return_record_name_override=True)`` returns: records as
dicts, arrays as lists, enums as their symbols, ``timestamp-millis`` as aware UTC datetimes, a union with more than
one record branch as ``(full name, dict)``.

It covers the Avro the log's schemas use (records, arrays, enums, unions, null, boolean, int, long, string and
``timestamp-millis``); `compile_reader` raises `UnsupportedSchemaError` for anything else. It checks what it reads (a
string or varint past the end, a union branch or enum symbol out of range, bytes after the body) by raising; the
caller then decodes the record the slow way, which names what is wrong. A unit test compares it with fastavro on
every log event type and on generated batches. `settled.schemas._fastdecode` subclasses its compiler to build the
models directly; `compile_reader` is the compiler's entry point for a plain record schema (its unit tests).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from settled._errors import ErrorCategory, SettledError

__all__ = ["READ_ERRORS", "RecordCompiler", "UnsupportedSchemaError", "compile_reader"]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

READ_ERRORS = (IndexError, ValueError, EOFError, TypeError, KeyError, OverflowError)
"""What a compiled reader raises on a body it cannot read (``UnicodeDecodeError`` is a ``ValueError``; a
timestamp out of `datetime`'s range is an ``OverflowError``)."""

_PRIMITIVES = frozenset({"string", "int", "long", "boolean", "null"})


class UnsupportedSchemaError(SettledError, TypeError):
    """The schema uses Avro this compiler does not cover (bytes, fixed, float, double, maps, other logical types)."""

    category = ErrorCategory.BAD_INPUT


_ZIGZAG = tuple((b >> 1) ^ -(b & 1) for b in range(128))
"""The value of each one-byte zig-zag varint (a lookup instead of three operations)."""


def _long_tail(data: bytes, pos: int, first: int) -> tuple[int, int]:
    """The rest of a zig-zag varint whose first byte (``first``, at ``pos - 1``) has its continuation bit set."""
    n = first & 0x7F
    shift = 7
    while True:
        b = data[pos]
        pos += 1
        n |= (b & 0x7F) << shift
        if b < 0x80:
            break
        shift += 7
        if shift > 63:
            raise ValueError("a varint longer than 10 bytes")
    if n >= 1 << 64:
        raise ValueError("a varint past 64 bits")
    return (n >> 1) ^ -(n & 1), pos


class RecordCompiler:
    """Writes the Python source of one reader function per record type (`compile_reader`; subclassed to build models).

    Args:
        named: The schema's named types, by full name (fastavro's ``__named_schemas``).
    """

    def __init__(self, named: Mapping[str, Any]) -> None:
        self.named = named
        self.sources: list[str] = []
        self.scope: dict[str, Any] = {"EPOCH": _EPOCH, "TD": timedelta, "LONG": _long_tail, "ZIGZAG": _ZIGZAG}
        self.records: dict[str, str] = {}

    def constant(self, value: Any) -> str:
        name = f"K{len(self.scope)}"
        self.scope[name] = value
        return name

    def resolve(self, t: Any) -> Any:
        if isinstance(t, str) and t in self.named:
            return self.named[t]
        if isinstance(t, dict) and isinstance(t.get("type"), dict | list):
            return t["type"]
        if isinstance(t, dict) and t.get("type") in _PRIMITIVES and "logicalType" not in t:
            return t["type"]
        return t

    def record(self, schema: Mapping[str, Any]) -> str:
        name = str(schema["name"])
        found = self.records.get(name)
        if found is not None:
            return found
        function = f"record{len(self.records)}"
        self.records[name] = function
        lines = [f"def {function}(d, p, n):  # {name}"]
        values = []
        for i, f in enumerate(schema["fields"]):
            lines += self.read(f["type"], f"f{i}", "    ", 0)
            values.append(f"{str(f['name'])!r}: f{i}")
        lines.append(f"    return {{{', '.join(values)}}}, p")
        self.sources.append("\n".join(lines))
        return function

    @staticmethod
    def varint(var: str, ind: str) -> list[str]:
        # One- and two-byte varints (values -8192..8191: lengths, indexes, sequences) without a call; longer ones
        # (timestamps) through LONG.
        return [
            f"{ind}b = d[p]",
            f"{ind}p += 1",
            f"{ind}if b < 128:",
            f"{ind}    {var} = ZIGZAG[b]",
            f"{ind}elif d[p] < 128:",
            f"{ind}    b = (b & 127) | (d[p] << 7)",
            f"{ind}    p += 1",
            f"{ind}    {var} = (b >> 1) ^ -(b & 1)",
            f"{ind}else:",
            f"{ind}    {var}, p = LONG(d, p, b)",
        ]

    @staticmethod
    def wide_varint(var: str, ind: str) -> list[str]:
        # A varint of any length read in place (timestamps take six bytes): what LONG does, without the call.
        return [
            f"{ind}b = d[p]",
            f"{ind}p += 1",
            f"{ind}if b < 128:",
            f"{ind}    {var} = ZIGZAG[b]",
            f"{ind}else:",
            f"{ind}    {var} = b & 127",
            f"{ind}    s = 7",
            f"{ind}    b = d[p]",
            f"{ind}    p += 1",
            f"{ind}    while b >= 128:",
            f"{ind}        {var} |= (b & 127) << s",
            f"{ind}        s += 7",
            f"{ind}        if s > 63:",
            f"{ind}            raise ValueError",
            f"{ind}        b = d[p]",
            f"{ind}        p += 1",
            f"{ind}    {var} |= b << s",
            f"{ind}    if {var} >= 18446744073709551616:",
            f"{ind}        raise ValueError",
            f"{ind}    {var} = ({var} >> 1) ^ -({var} & 1)",
        ]

    def read(self, t: Any, var: str, ind: str, depth: int) -> list[str]:
        t = self.resolve(t)
        if t == "string":
            return [
                *self.varint("m", ind),
                f"{ind}e = p + m",
                f"{ind}if m < 0 or e > n:",
                f"{ind}    raise EOFError",
                f"{ind}{var} = d[p:e].decode()",
                f"{ind}p = e",
            ]
        if t in ("int", "long"):
            return self.varint(var, ind)
        if t == "boolean":
            return [f"{ind}{var} = d[p] != 0", f"{ind}p += 1"]
        if t == "null":
            return [f"{ind}{var} = None"]
        if isinstance(t, list):
            return self.union(t, var, ind, depth)
        if not isinstance(t, dict):
            raise UnsupportedSchemaError(f"Avro type {t!r}")
        kind, logical = t.get("type"), t.get("logicalType")
        if logical is not None:
            if kind == "long" and logical == "timestamp-millis":
                # timedelta(0, 0, 0, ms) is timedelta(microseconds=ms * 1000) (integers, exact), without keywords.
                return [*self.wide_varint(var, ind), f"{ind}{var} = EPOCH + TD(0, 0, 0, {var})"]
            raise UnsupportedSchemaError(f"logical type {logical!r} of {kind!r}")
        if kind == "record":
            return [f"{ind}{var}, p = {self.record(t)}(d, p, n)"]
        if kind == "enum":
            symbols = self.constant(tuple(t["symbols"]))
            return [
                *self.varint("m", ind),
                f"{ind}if m < 0:",
                f"{ind}    raise ValueError",
                f"{ind}{var} = {symbols}[m]",
            ]
        if kind == "array":
            count, item = f"c{depth}", f"i{depth}"
            return [
                f"{ind}{var} = []",
                *self.varint(count, ind),
                f"{ind}while {count}:",
                f"{ind}    if {count} < 0:  # a block with its byte size",
                f"{ind}        {count} = -{count}",
                *self.varint("m", ind + "        "),
                f"{ind}    for _ in range({count}):",
                *self.read(t["items"], item, ind + "        ", depth + 1),
                f"{ind}        {var}.append({item})",
                *self.varint(count, ind + "    "),
            ]
        raise UnsupportedSchemaError(f"Avro type {kind!r}")

    def union(self, branches: list[Any], var: str, ind: str, depth: int) -> list[str]:
        resolved = [self.resolve(b) for b in branches]
        records = sum(1 for b in resolved if isinstance(b, dict) and b.get("type") == "record")
        lines = self.varint("u", ind)
        for i, branch in enumerate(resolved):
            lines.append(f"{ind}{'if' if i == 0 else 'elif'} u == {i}:")
            lines += self.read(branch, var, ind + "    ", depth + 1)
            if records > 1 and isinstance(branch, dict) and branch.get("type") == "record":
                # return_record_name with return_record_name_override: named only among several records
                lines.append(f"{ind}    {var} = ({str(branch['name'])!r}, {var})")
        lines += [f"{ind}else:", f"{ind}    raise ValueError"]
        return lines


def compile_reader(parsed: Mapping[str, Any]) -> Callable[[bytes, int], dict[str, Any]]:
    """Compile a parsed record schema into a reader of its Avro binary bodies (module doc).

    Args:
        parsed: The record's schema as fastavro's ``parse_schema`` returns it (``__named_schemas`` included).

    Returns:
        ``read(value, start)``: decodes ``value[start:]`` as one body and returns the record; raises one of
        `READ_ERRORS` when the bytes are not such a body (bytes left after it included).

    Raises:
        UnsupportedSchemaError: The schema uses a type this compiler does not cover.
    """
    if parsed.get("type") != "record":
        raise UnsupportedSchemaError("only a record schema is compiled")
    compiler = RecordCompiler(parsed.get("__named_schemas", {}))
    top = compiler.record(parsed)
    source = "\n\n\n".join(compiler.sources)
    # The source is generated above from the schema's structure; names and symbols enter only as repr() literals.
    exec(compile(source, f"<settled.schemas avro reader {parsed['name']}>", "exec"), compiler.scope)
    function: Callable[[bytes, int, int], tuple[dict[str, Any], int]] = compiler.scope[top]

    def read(value: bytes, start: int) -> dict[str, Any]:
        datum, end = function(value, start, len(value))
        if end != len(value):
            raise ValueError(f"{len(value) - end} bytes trail the body")
        return datum

    return read
