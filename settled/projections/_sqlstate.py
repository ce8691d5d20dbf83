"""Telling a lost database from a row PostgreSQL refuses, by SQLSTATE (issue 25 item 3).

psycopg maps SQLSTATE classes onto the DB-API exception types loosely for this purpose: ``54000 program limit
exceeded`` (an index row over the btree maximum) is a `psycopg.OperationalError`, like a dropped connection, so a
projector that reconnected on every ``OperationalError`` retried the same refused row forever. `classify` decides by
the error's ``sqlstate`` (PostgreSQL's "Appendix A. PostgreSQL Error Codes") instead:

* `ErrorKind.TRANSIENT`: the database, not the row — class 08 connection exception, 53 insufficient resources,
  57P01-57P05 (admin, crash shutdown, cannot connect now, database dropped, idle session timeout), 57014 query
  canceled, 40 transaction rollback (serialization failure, deadlock), 58 system error; and an error raised by the
  driver itself without a SQLSTATE when the connection is gone (`psycopg.OperationalError`,
  `psycopg.InterfaceError`). Reconnect and write the same rows again.
* `ErrorKind.DATA`: the rows — class 22 data exception, 23 integrity constraint violation, 54 program limit
  exceeded; and a value the driver refuses before sending it (`psycopg.DataError` without a SQLSTATE: a NUL
  character in text; `UnicodeEncodeError`: a lone surrogate). Writing them again fails again: quarantine the record.
* `ErrorKind.OTHER`: anything else (a missing table, a syntax error, an internal error): a defect or a broken schema
  that no retry or quarantine fixes; the caller raises it.

Fault switch ``projection_data_error_retried`` (`settled._faults`): a data error is classified transient, as the
projector did before (it reconnects and retries the refused row forever); `tests/fault_switches.toml` names the test
that must catch it.
"""

from __future__ import annotations

import enum

import psycopg

from settled._faults import fault_enabled

__all__ = ["ErrorKind", "classify", "describe"]

_TRANSIENT_CLASSES = frozenset({"08", "40", "53", "58"})
_TRANSIENT_STATES = frozenset({"57P01", "57P02", "57P03", "57P04", "57P05", "57014"})
_DATA_CLASSES = frozenset({"22", "23", "54"})

MAX_ERROR_CHARS = 1000
"""Longest error text kept in the quarantine table (the error can quote the refused value)."""


class ErrorKind(enum.Enum):
    """What a database error says about the rows being written (module doc)."""

    TRANSIENT = "transient"
    DATA = "data"
    OTHER = "other"


def classify(exc: BaseException) -> ErrorKind:
    """Classify an error raised while writing rows (module doc).

    Args:
        exc: The error.

    Returns:
        Its kind.
    """
    if isinstance(exc, UnicodeEncodeError):
        return _data()
    if not isinstance(exc, psycopg.Error):
        return ErrorKind.OTHER
    state = exc.sqlstate
    if state is None:
        if isinstance(exc, psycopg.DataError):
            return _data()
        if isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError)):
            return ErrorKind.TRANSIENT
        return ErrorKind.OTHER
    if state[:2] in _TRANSIENT_CLASSES or state in _TRANSIENT_STATES:
        return ErrorKind.TRANSIENT
    if state[:2] in _DATA_CLASSES:
        return _data()
    return ErrorKind.OTHER


def _data() -> ErrorKind:
    if fault_enabled("projection_data_error_retried"):  # fault switch: a refused row taken for a lost connection
        return ErrorKind.TRANSIENT
    return ErrorKind.DATA


def describe(exc: BaseException) -> tuple[str | None, str]:
    """Return an error's SQLSTATE and its text, bounded and storable in a ``text`` column.

    Args:
        exc: The error.

    Returns:
        (SQLSTATE or None, ``<type>: <message>`` with NUL characters escaped, cut to `MAX_ERROR_CHARS`).
    """
    state = exc.sqlstate if isinstance(exc, psycopg.Error) else None
    text = f"{type(exc).__name__}: {exc}".replace("\x00", "\\x00")
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    if len(text) > MAX_ERROR_CHARS:
        text = text[: MAX_ERROR_CHARS - 1] + "…"
    return state, text
