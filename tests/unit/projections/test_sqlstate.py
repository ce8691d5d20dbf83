"""SQLSTATE classification of the projector's write errors (issue 25 item 3): the class, not the exception type."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import errors

from settled.projections import ErrorKind, classify
from settled.projections._sqlstate import MAX_ERROR_CHARS, describe


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        # 54000 is an OperationalError to psycopg, like a lost connection: it is the row, not the database.
        (errors.ProgramLimitExceeded("index row size 6032 exceeds btree version 4 maximum 2704"), ErrorKind.DATA),
        (errors.CharacterNotInRepertoire("invalid byte sequence for encoding UTF8: 0x00"), ErrorKind.DATA),
        (errors.UniqueViolation("duplicate key value"), ErrorKind.DATA),
        (errors.NotNullViolation("null value"), ErrorKind.DATA),
        (errors.NumericValueOutOfRange("out of range"), ErrorKind.DATA),
        (psycopg.DataError("PostgreSQL text fields cannot contain NUL (0x00) bytes"), ErrorKind.DATA),  # client side
        (UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed"), ErrorKind.DATA),  # a lone surrogate
        (errors.AdminShutdown("terminating connection due to administrator command"), ErrorKind.TRANSIENT),
        (errors.CrashShutdown("crash"), ErrorKind.TRANSIENT),
        (errors.CannotConnectNow("starting up"), ErrorKind.TRANSIENT),
        (errors.ConnectionFailure("connection failure"), ErrorKind.TRANSIENT),
        (errors.TooManyConnections("too many"), ErrorKind.TRANSIENT),
        (errors.DiskFull("disk full"), ErrorKind.TRANSIENT),
        (errors.SerializationFailure("serialize"), ErrorKind.TRANSIENT),
        (errors.DeadlockDetected("deadlock"), ErrorKind.TRANSIENT),
        (errors.QueryCanceled("statement timeout"), ErrorKind.TRANSIENT),
        (psycopg.OperationalError("consuming input failed: server closed the connection"), ErrorKind.TRANSIENT),
        (psycopg.InterfaceError("the connection is closed"), ErrorKind.TRANSIENT),
        (errors.UndefinedTable("relation does not exist"), ErrorKind.OTHER),
        (errors.SyntaxError("syntax error"), ErrorKind.OTHER),
        (errors.InternalError_("internal"), ErrorKind.OTHER),
        (psycopg.ProgrammingError("no results to fetch"), ErrorKind.OTHER),
        (ValueError("not a database error"), ErrorKind.OTHER),
    ],
)
def test_errors_are_classified_by_sqlstate(exc: BaseException, kind: ErrorKind) -> None:
    assert classify(exc) is kind


def test_the_stored_error_is_bounded_and_storable() -> None:
    state, text = describe(errors.UniqueViolation("key (" + "x\x00" * 5000 + ") exists"))
    assert state == "23505"
    assert len(text) == MAX_ERROR_CHARS
    assert "\x00" not in text and text.startswith("UniqueViolation: key (x\\x00")
    assert describe(psycopg.DataError("PostgreSQL text fields cannot contain NUL (0x00) bytes"))[0] is None
