"""Canonical JSON (RFC 8785) and its SHA-256 digest (docs/design.md §5).

Tool arguments and results, submission inputs, step results and replies travel inside settled's Avro records as
RFC 8785 (JSON Canonicalization Scheme) text together with a digest of that text. The digest is the lowercase
hexadecimal SHA-256 of the UTF-8 bytes of the canonical text (64 characters). Canonical text is opaque to settled:
floats included, it is compared and digested byte for byte.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import rfc8785

from settled._errors import ErrorCategory, SettledError

__all__ = [
    "DIGEST_HEX_CHARS",
    "CanonicalJsonError",
    "canonical_json",
    "canonicalize_json_text",
    "json_digest",
]

_MAX_SAFE_INTEGER = 2**53 - 1

DIGEST_HEX_CHARS = 64
"""Length of a digest: hexadecimal SHA-256."""


class CanonicalJsonError(SettledError, ValueError):
    """A value or text cannot be represented as RFC 8785 canonical JSON, or a text is not canonical.

    Attributes:
        reason: Why, in words.
    """

    category = ErrorCategory.BAD_INPUT

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def canonical_json(value: Any) -> str:
    """Serialize a JSON-compatible Python value as RFC 8785 canonical JSON text.

    Args:
        value: ``None``, ``bool``, ``int`` (within ±(2**53 - 1), RFC 8785's integer domain), finite ``float``,
            ``str``, and lists / dicts (string keys) of these.

    Returns:
        The canonical text (sorted keys, no whitespace, ECMAScript number formatting).

    Raises:
        CanonicalJsonError: If the value is not representable (NaN, infinity, an integer outside the domain, a
            non-string key, an unsupported type).
    """
    try:
        return rfc8785.dumps(value).decode("utf-8")
    except (rfc8785.CanonicalizationError, TypeError, ValueError) as exc:
        raise CanonicalJsonError(f"value is not representable as RFC 8785 canonical JSON: {exc}") from exc


def canonicalize_json_text(text: str) -> str:
    """Parse JSON text and return its RFC 8785 canonical form.

    Numbers are IEEE 754 doubles in RFC 8785: an integer literal beyond ±(2**53 - 1) (which is how RFC 8785 writes
    a large double, e.g. ``1e16``) is read as a double, so canonical text always canonicalizes to itself.

    Args:
        text: Any JSON text.

    Returns:
        The canonical form of the parsed value (equal to ``text`` when ``text`` is already canonical).

    Raises:
        CanonicalJsonError: If ``text`` is not JSON or its value is not representable (see `canonical_json`).
    """
    try:
        value = json.loads(text, parse_int=_parse_int)
    except ValueError as exc:
        raise CanonicalJsonError(f"not JSON text: {exc}") from exc
    return canonical_json(value)


def _parse_int(literal: str) -> int | float:
    value = int(literal)
    return value if -_MAX_SAFE_INTEGER <= value <= _MAX_SAFE_INTEGER else float(literal)


def json_digest(text: str) -> str:
    """Return the digest of canonical JSON text: lowercase hex SHA-256 of its UTF-8 bytes (docs/design.md §5).

    Args:
        text: Canonical JSON text (from `canonical_json`); the digest is taken over the text as given.

    Returns:
        64 lowercase hexadecimal characters.
    """
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
