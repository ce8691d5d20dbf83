"""Loading the shipped ``.avsc`` files (docs/design.md §7).

Each named Avro type (record or enum) lives in its own file ``settled/schemas/avsc/<Name>.avsc`` and refers to the
others by name. `SchemaSet` parses a folder of such files, and for every named type builds its *standalone* schema:
the type with every referenced named type defined inline at its first use and referred to by full name afterwards,
which is a valid Avro schema on its own (what the Schema Registry and other languages receive). From that it
computes the Parsing Canonical Form and the CRC-64-AVRO (Rabin) fingerprint of the Avro specification.

Kept versions live in ``avsc/history/v<N>/`` with the same layout.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Any

from fastavro import parse_schema
from fastavro.schema import UnknownType, fingerprint, to_parsing_canonical_form

from settled._errors import ErrorCategory, SettledError

__all__ = [
    "NamedSchema",
    "SchemaError",
    "SchemaSet",
    "current_schemas",
    "history_schemas",
    "history_versions",
]

_PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})


class SchemaError(SettledError, ValueError):
    """A shipped ``.avsc`` folder is inconsistent (unparsable file, unresolvable or duplicate name).

    Attributes:
        path: The offending file or folder.
        reason: What is wrong.
    """

    category = ErrorCategory.BAD_INPUT

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


@dataclass(frozen=True)
class NamedSchema:
    """One named Avro type of a `SchemaSet`.

    Attributes:
        full_name: E.g. ``"dev.settled.v1.Receipt"``.
        file_name: The ``.avsc`` file defining it.
        source: The file's JSON, as written.
        standalone: The self-contained schema (named types inlined at first use).
        standalone_json: ``standalone`` as compact JSON text (what the Schema Registry gets).
        canonical_form: Avro Parsing Canonical Form of ``standalone``.
        fingerprint: CRC-64-AVRO fingerprint of the canonical form, as an unsigned 64-bit integer (Java's
            ``SchemaNormalization.parsingFingerprint64`` as unsigned).
        parsed: fastavro's parsed form of ``standalone``, for reading and writing.
    """

    full_name: str
    file_name: str
    source: Mapping[str, Any] = field(repr=False)
    standalone: Mapping[str, Any] = field(repr=False)
    standalone_json: str = field(repr=False)
    canonical_form: str = field(repr=False)
    fingerprint: int
    parsed: Any = field(repr=False, compare=False)

    @property
    def fingerprint_bytes(self) -> bytes:
        """The fingerprint as the 8 little-endian bytes of a single-object encoding header.

        Returns:
            8 bytes.
        """
        return self.fingerprint.to_bytes(8, "little")

    @property
    def is_record(self) -> bool:
        """Whether the type is an Avro record (enums are not encodable on their own by settled).

        Returns:
            True for records.
        """
        return self.source.get("type") == "record"


@dataclass(frozen=True)
class SchemaSet:
    """The named types of one schema folder (the current one, or a kept history version).

    Attributes:
        label: Where it came from, e.g. ``"current"`` or ``"history/v1"``.
        schemas: Full name → `NamedSchema`.
        file_order: File names in dependency order (each after every type it references); a Java
            ``Schema.Parser`` that parses the files in this order resolves every name.
    """

    label: str
    schemas: Mapping[str, NamedSchema]
    file_order: tuple[str, ...]

    def get(self, full_name: str) -> NamedSchema:
        """Return one named type.

        Args:
            full_name: E.g. ``"dev.settled.v1.Receipt"``.

        Returns:
            The named schema.

        Raises:
            KeyError: If the set has no such type.
        """
        try:
            return self.schemas[full_name]
        except KeyError:
            raise KeyError(f"{self.label}: no Avro type named {full_name!r}") from None

    @classmethod
    def load(cls, folder: Traversable, label: str) -> SchemaSet:
        """Parse every ``*.avsc`` file of a folder.

        Args:
            folder: The folder (a path or an `importlib.resources` traversable).
            label: A name for error messages.

        Returns:
            The schema set.

        Raises:
            SchemaError: If a file is not JSON, defines no or a duplicate name, or references an unknown name.
        """
        sources: dict[str, tuple[str, dict[str, Any]]] = {}
        for entry in sorted(folder.iterdir(), key=lambda item: item.name):
            if not entry.name.endswith(".avsc") or not entry.is_file():
                continue
            try:
                source = json.loads(entry.read_text(encoding="utf-8"))
            except ValueError as exc:
                raise SchemaError(f"{label}/{entry.name}", f"not JSON: {exc}") from exc
            if not isinstance(source, dict) or "name" not in source:
                raise SchemaError(f"{label}/{entry.name}", "a file must define one named type (record or enum)")
            full_name = _full_name(source)
            if full_name in sources:
                raise SchemaError(f"{label}/{entry.name}", f"{full_name} is also defined in {sources[full_name][0]}")
            sources[full_name] = (entry.name, source)
        return cls._build(label, sources)

    @classmethod
    def _build(cls, label: str, sources: Mapping[str, tuple[str, dict[str, Any]]]) -> SchemaSet:
        order = _dependency_order(label, sources)
        schemas: dict[str, NamedSchema] = {}
        for full_name in order:
            file_name, source = sources[full_name]
            standalone = _inline(source, {name: src for name, (_, src) in sources.items()}, set())
            text = json.dumps(standalone, separators=(",", ":"), ensure_ascii=False)
            try:
                parsed = parse_schema(json.loads(text))
            except (UnknownType, ValueError, TypeError) as exc:
                raise SchemaError(f"{label}/{file_name}", f"invalid Avro schema: {exc}") from exc
            canonical = to_parsing_canonical_form(parsed)
            fp = int.from_bytes(bytes.fromhex(fingerprint(canonical, "CRC-64-AVRO")), "little")
            schemas[full_name] = NamedSchema(
                full_name=full_name,
                file_name=file_name,
                source=source,
                standalone=standalone,
                standalone_json=text,
                canonical_form=canonical,
                fingerprint=fp,
                parsed=parsed,
            )
        return cls(label=label, schemas=schemas, file_order=tuple(sources[name][0] for name in order))


def _full_name(schema: Mapping[str, Any], enclosing_namespace: str = "") -> str:
    name = str(schema["name"])
    if "." in name:
        return name
    namespace = schema.get("namespace", enclosing_namespace)
    return f"{namespace}.{name}" if namespace else name


def _resolve(name: str, namespace: str) -> str:
    return name if "." in name or not namespace else f"{namespace}.{name}"


def _references(schema: Any, namespace: str) -> Iterable[str]:
    if isinstance(schema, str):
        if schema not in _PRIMITIVES:
            yield _resolve(schema, namespace)
    elif isinstance(schema, list):
        for branch in schema:
            yield from _references(branch, namespace)
    elif isinstance(schema, dict):
        kind = schema.get("type")
        if kind in ("record", "error"):
            inner = _full_name(schema, namespace).rpartition(".")[0]
            for item in schema.get("fields", []):
                yield from _references(item["type"], inner)
        elif kind == "array":
            yield from _references(schema["items"], namespace)
        elif kind == "map":
            yield from _references(schema["values"], namespace)
        elif kind in ("enum", "fixed"):
            return
        else:
            yield from _references(kind, namespace)


def _dependency_order(label: str, sources: Mapping[str, tuple[str, dict[str, Any]]]) -> list[str]:
    order: list[str] = []
    state: dict[str, str] = {}

    def visit(name: str, via: str) -> None:
        if state.get(name) == "done":
            return
        if state.get(name) == "active":
            raise SchemaError(label, f"recursive reference through {name} is not supported")
        if name not in sources:
            raise SchemaError(f"{label}/{via}", f"references unknown Avro type {name!r}")
        state[name] = "active"
        file_name, source = sources[name]
        namespace = _full_name(source).rpartition(".")[0]
        for reference in _references(source, namespace):
            if reference != name:
                visit(reference, file_name)
        state[name] = "done"
        order.append(name)

    for name in sorted(sources):
        visit(name, sources[name][0])
    return order


def _inline(schema: Any, sources: Mapping[str, dict[str, Any]], defined: set[str], namespace: str = "") -> Any:
    """Return ``schema`` with named references replaced by their definition at first use (full name after)."""
    if isinstance(schema, str):
        if schema in _PRIMITIVES:
            return schema
        full = _resolve(schema, namespace)
        if full in defined:
            return full
        return _inline(sources[full], sources, defined, namespace)
    if isinstance(schema, list):
        return [_inline(branch, sources, defined, namespace) for branch in schema]
    if not isinstance(schema, dict):
        return schema
    kind = schema.get("type")
    if kind in ("record", "error", "enum", "fixed"):
        full = _full_name(schema, namespace)
        defined.add(full)
        out = dict(schema)
        out["name"] = full.rpartition(".")[2]
        out["namespace"] = full.rpartition(".")[0]
        if kind in ("record", "error"):
            inner = full.rpartition(".")[0]
            out["fields"] = [
                {**item, "type": _inline(item["type"], sources, defined, inner)} for item in schema["fields"]
            ]
        return out
    if kind == "array":
        return {**schema, "items": _inline(schema["items"], sources, defined, namespace)}
    if kind == "map":
        return {**schema, "values": _inline(schema["values"], sources, defined, namespace)}
    if isinstance(kind, str | list | dict) and kind not in _PRIMITIVES:
        return {**schema, "type": _inline(kind, sources, defined, namespace)}
    return schema


_PACKAGE = "settled.schemas"


@functools.cache
def current_schemas() -> SchemaSet:
    """Return the current schemas shipped in ``settled/schemas/avsc/`` (loaded once, on first use).

    Returns:
        The current schema set.

    Raises:
        SchemaError: If a shipped file is inconsistent.
    """
    return SchemaSet.load(resources.files(_PACKAGE).joinpath("avsc"), "current")


def history_versions() -> tuple[int, ...]:
    """Return the schema versions kept in ``settled/schemas/avsc/history/`` (``v1``, ``v2``, ...).

    Returns:
        The versions, ascending.
    """
    folder = resources.files(_PACKAGE).joinpath("avsc", "history")
    if not folder.is_dir():
        return ()
    versions = [
        int(entry.name[1:])
        for entry in folder.iterdir()
        if entry.is_dir() and entry.name.startswith("v") and entry.name[1:].isdigit()
    ]
    return tuple(sorted(versions))


@functools.cache
def history_schemas(version: int) -> SchemaSet:
    """Return a kept schema version (loaded once, on first use).

    Args:
        version: The version number, e.g. ``1`` for ``avsc/history/v1/``.

    Returns:
        That version's schema set.

    Raises:
        SchemaError: If the version is not kept or a file is inconsistent.
    """
    folder = resources.files(_PACKAGE).joinpath("avsc", "history", f"v{version}")
    if not folder.is_dir():
        raise SchemaError(f"history/v{version}", f"schema version {version} is not kept (kept: {history_versions()})")
    return SchemaSet.load(folder, f"history/v{version}")
