"""The CLI read commands' errors (issue 25 item 6): a clear message and exit code 2, never a traceback.

Before the fix ``settled submissions|runs|conversations show`` printed a traceback (exit 1) for an id that is not
valid UTF-8 (``UnicodeEncodeError`` in the driver), and a traceback after 30 s (the pool's default wait, exit 1) when
PostgreSQL could not be reached. The commands run as real child processes: an argument that is not valid UTF-8 only
exists in a real ``argv``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from settled.services._cli_runs import CONNECT_TIMEOUT_S, EXIT_BAD_INPUT

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
#: An id that is not valid UTF-8 (Python hands it to the command as a lone surrogate, U+DCFF).
NOT_UTF8 = b"sub-\xff-1"
#: How long a command may take beyond its connect timeout, in seconds: five interpreters start at once on a loaded
#: machine, and one direct connection attempt names the cause (the old behaviour took 30 s and more).
SLACK_S = 10.0

READ_COMMANDS: list[list[bytes]] = [
    [b"submissions", b"show", NOT_UTF8],
    [b"runs", b"show", NOT_UTF8],
    [b"conversations", b"show", NOT_UTF8],
    [b"runs", b"list", b"--conversation", NOT_UTF8],
    [b"approvals", b"list", b"--conversation", NOT_UTF8],
]


def _spawn(args: list[bytes], dsn: str) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SETTLED_")}
    env.update(SETTLED_POSTGRES_DSN=dsn, SETTLED_KAFKA_BOOTSTRAP="127.0.0.1:1", SETTLED_NAMESPACE="cli-errors")
    return subprocess.Popen(
        [sys.executable.encode(), b"-m", b"settled.services", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def _finish(proc: subprocess.Popen[bytes], timeout_s: float) -> tuple[int, str]:
    try:
        _, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        return -9, err.decode("utf-8", "replace")
    return proc.returncode, err.decode("utf-8", "replace")


def test_an_id_that_is_not_utf_8_exits_2_naming_the_argument(postgres_dsn: str) -> None:
    procs = [(args, _spawn(args, postgres_dsn)) for args in READ_COMMANDS]
    for args, proc in procs:
        code, err = _finish(proc, 60)
        shown = b" ".join(args).decode("utf-8", "replace")
        assert "Traceback" not in err, f"{shown}: {err}"
        assert code == EXIT_BAD_INPUT, f"{shown}: exit {code}: {err}"
        assert "lone surrogate U+DCFF" in err and "not valid UTF-8" in err, f"{shown}: {err}"
        assert ("--conversation" if b"list" in args else "_ID") in err, f"{shown}: {err}"


def test_unreachable_postgres_exits_2_within_the_connect_timeout() -> None:
    dsn = "postgresql://postgres@127.0.0.1:1/postgres"  # nothing listens on port 1
    commands = [
        [b"submissions", b"show", b"s1"],
        [b"runs", b"show", b"s1"],
        [b"conversations", b"show", b"c1"],
        [b"runs", b"list"],
        [b"unknown", b"list"],
    ]
    started = time.monotonic()
    procs = [(args, _spawn(args, dsn)) for args in commands]
    for args, proc in procs:
        code, err = _finish(proc, 60)
        elapsed_s = time.monotonic() - started
        shown = b" ".join(args).decode()
        assert "Traceback" not in err, f"{shown}: {err}"
        assert code == EXIT_BAD_INPUT, f"{shown}: exit {code}: {err}"
        assert "PostgreSQL at 127.0.0.1:1/postgres did not answer" in err and "Connection refused" in err, err
        assert elapsed_s < CONNECT_TIMEOUT_S + SLACK_S, f"{shown} took {elapsed_s:.1f} s"
