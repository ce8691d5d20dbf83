"""Fault-switch runner: prove that each durability promise's test catches the switch that breaks it (issue 3).

Reads ``tests/fault_switches.toml``::

    [[switch]]
    name = "random_transactional_id"                 # a name from settled._faults.KNOWN_FAULTS
    test = "tests/integration/test_x.py::test_y"     # a pytest node id, relative to --root
    promise = "DUR-006"                              # the assertion id the test must fail with

and runs each test once, in its own pytest process, with ``SETTLED_FAULT=<name>``. A switch is **caught only
when** pytest reports a failure (exit code 1) **and** the output holds ``[PROMISE <promise>]`` (see
``tests/_promise.py``). Prints a table and exits 1 if any switch was not caught, 2 on a bad registry or usage.

Usage: ``.venv/bin/python scripts/fault_switches.py [--list] [--only NAME ...] [--registry PATH] [--root DIR]``.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from settled._faults import FAULT_ENV_VAR, KNOWN_FAULTS

REPO = Path(__file__).resolve().parent.parent
# Same format as tests/_promise.py's PROMISE_MARKER; tests/unit/failpoints/test_fault_runner.py checks they agree.
PROMISE_MARKER = "[PROMISE {assertion_id}]"
_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]*")
_SEEN_RE = re.compile(r"\[PROMISE ([A-Za-z0-9][A-Za-z0-9_.:-]*)\]")
_TAIL_LINES = 40


class RegistryError(Exception):
    """The registry file is missing or malformed."""


@dataclass(frozen=True)
class Entry:
    """One registered switch: its name, the pytest node id that must catch it, and the expected assertion id."""

    name: str
    test: str
    promise: str


@dataclass(frozen=True)
class Outcome:
    """The result of running one entry's test with its switch on."""

    entry: Entry
    caught: bool
    reason: str
    duration_s: float
    output: str


def load_registry(path: Path) -> list[Entry]:
    """Read and validate the registry.

    Args:
        path: The TOML file.

    Returns:
        The entries, in file order.

    Raises:
        RegistryError: If the file is missing, not TOML, or an entry is malformed, names an unknown switch, or
            repeats a (switch, test) pair.
    """
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise RegistryError(f"registry {path} does not exist") from exc
    except tomllib.TOMLDecodeError as exc:
        raise RegistryError(f"registry {path} is not valid TOML: {exc}") from exc
    extra = set(data) - {"switch"}
    if extra:
        raise RegistryError(f"registry {path}: unexpected top-level keys {sorted(extra)} (only [[switch]] tables)")
    raw = data.get("switch", [])
    if not isinstance(raw, list):
        raise RegistryError(f"registry {path}: 'switch' must be an array of tables ([[switch]])")
    entries: list[Entry] = []
    for index, item in enumerate(raw, start=1):
        where = f"registry {path}, switch #{index}"
        if not isinstance(item, dict) or set(item) != {"name", "test", "promise"}:
            keys = sorted(item) if isinstance(item, dict) else item
            raise RegistryError(f"{where}: needs exactly the keys name, test, promise; got {keys}")
        for key in ("name", "test", "promise"):
            if not isinstance(item[key], str) or not item[key].strip():
                raise RegistryError(f"{where}: {key} must be a non-empty string, got {item[key]!r}")
        entry = Entry(item["name"], item["test"], item["promise"])
        if entry.name not in KNOWN_FAULTS:
            raise RegistryError(f"{where}: unknown switch {entry.name!r}; known: {', '.join(sorted(KNOWN_FAULTS))}")
        if _ID_RE.fullmatch(entry.promise) is None:
            raise RegistryError(f"{where}: promise {entry.promise!r} is not an assertion id like 'DUR-006'")
        if any((e.name, e.test) == (entry.name, entry.test) for e in entries):
            raise RegistryError(f"{where}: ({entry.name}, {entry.test}) is listed twice")
        entries.append(entry)
    return entries


def run_entry(entry: Entry, *, root: Path, python: str, timeout_s: float) -> Outcome:
    """Run one entry's test in its own pytest process with its switch on, and judge it.

    Args:
        entry: The registered switch.
        root: Working folder of pytest (node ids are relative to it).
        python: The interpreter that runs pytest.
        timeout_s: The test's time limit; a test that runs over it is not caught.

    Returns:
        Whether the switch was caught, why, how long it took, and pytest's output.
    """
    env = {**os.environ, FAULT_ENV_VAR: entry.name}
    command = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--color=no", entry.test]
    started = time.monotonic()
    process = subprocess.Popen(
        command, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        output, _ = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # the test may have spawned workers: end its whole session
        output, _ = process.communicate()
        return Outcome(entry, False, f"timed out after {timeout_s:g} s", time.monotonic() - started, output)
    duration_s = time.monotonic() - started
    marker = PROMISE_MARKER.format(assertion_id=entry.promise)
    seen = sorted(set(_SEEN_RE.findall(output)))
    if process.returncode == 0:
        return Outcome(entry, False, "test passed", duration_s, output)
    if process.returncode != 1:
        reason = f"pytest exit {process.returncode} (not a test failure: usage, collection or internal error)"
        return Outcome(entry, False, reason, duration_s, output)
    if marker not in output:
        reason = f"failed without {marker}" + (f" (saw {', '.join(seen)})" if seen else "")
        return Outcome(entry, False, reason, duration_s, output)
    return Outcome(entry, True, f"failed with {marker}", duration_s, output)


def _table(rows: Sequence[tuple[str, ...]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the fault switches; see the module docstring.

    Args:
        argv: Command-line arguments (default: ``sys.argv[1:]``).

    Returns:
        0 if every selected switch was caught (or none is registered), 1 if some was not, 2 on a usage error.
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--registry", type=Path, default=REPO / "tests" / "fault_switches.toml")
    parser.add_argument("--root", type=Path, default=REPO, help="pytest's working folder (node ids are relative)")
    parser.add_argument("--only", action="append", default=[], metavar="NAME", help="run only this switch (repeat)")
    parser.add_argument("--list", action="store_true", help="list the registered switches and exit")
    parser.add_argument("--timeout-s", type=float, default=300.0, help="time limit of each test")
    parser.add_argument("--python", default=sys.executable, help="interpreter that runs pytest")
    args = parser.parse_args(argv)

    try:
        entries = load_registry(args.registry)
    except RegistryError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for name in args.only:
        if not any(entry.name == name for entry in entries):
            print(f"error: --only {name!r}: no such switch in {args.registry}", file=sys.stderr)
            return 2
    selected = [entry for entry in entries if not args.only or entry.name in args.only]

    if args.list:
        if entries:
            print(_table([("switch", "test", "promise"), *((e.name, e.test, e.promise) for e in entries)]))
        else:
            print(f"no fault switches registered yet in {args.registry}")
        untested = sorted(set(KNOWN_FAULTS) - {entry.name for entry in entries})
        if untested:
            print(f"known switches without a test yet: {', '.join(untested)}")
        return 0
    if not selected:
        print(f"no fault switches registered yet in {args.registry}: nothing to run")
        return 0

    outcomes = []
    for entry in selected:
        print(f"running {entry.name}: {entry.test} (expects [PROMISE {entry.promise}])", flush=True)
        outcomes.append(run_entry(entry, root=args.root, python=args.python, timeout_s=args.timeout_s))
    rows = [("switch", "test", "result", "why", "duration")]
    for o in outcomes:
        verdict = "caught" if o.caught else "NOT CAUGHT"
        rows.append((o.entry.name, o.entry.test, verdict, o.reason, f"{o.duration_s:.1f} s"))
    for o in outcomes:
        if not o.caught:
            tail = "\n".join(o.output.splitlines()[-_TAIL_LINES:])
            print(f"\n--- {o.entry.name}: last {_TAIL_LINES} lines of pytest output ---\n{tail}")
    print()
    print(_table(rows))
    missed = [o.entry.name for o in outcomes if not o.caught]
    print(
        f"\n{len(outcomes) - len(missed)}/{len(outcomes)} switches caught"
        + (f"; missed: {', '.join(missed)}" if missed else "")
    )
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
