"""Rename settled's error classes so that every name ends in ``Error`` (issue 14 item 4), re-runnably.

Rewrites whole-word identifiers (``\\bOld\\b`` -> ``New``) in the ``.py``, ``.md`` and ``.toml`` files of
``settled/``, ``tests/``, ``bench/``, ``examples/``, ``scripts/``, ``docs/`` and ``README.md``, per `RENAMES`. A
name already renamed is left alone (``\\bOutcomeUnknown\\b`` does not match ``OutcomeUnknownError``), so running it
again, or on a branch merged later, only rewrites what still uses an old name. No alias of an old name is kept.

One old name needs context: the client error ``SubmissionRejected`` (`settled.client`) shares its name with the log
event ``SubmissionRejected`` (`settled.schemas`, a versioned Avro record that keeps its name). Only the client error
becomes ``SubmissionRejectedError``:

- qualified uses (``client.SubmissionRejected``, ``_errors.SubmissionRejected``) are rewritten in every file;
- in a ``.py`` file, bare uses are rewritten when the bare name means the client error there: the file defines
  ``class SubmissionRejected(ClientError)`` or imports the name from ``settled.client`` without an alias. An import
  of the name from ``settled.client`` under an alias is rewritten in place; an import of the event is never touched;
- bare uses in ``.md`` and ``.toml`` files mean the event and are left alone.

Afterwards it runs ``ruff check --fix --select I001,RUF022`` (import and ``__all__`` order) and ``ruff format`` on
the ``.py`` files it changed, unless ``--no-ruff``; a docstring or comment line a longer name pushed past 120
characters is left to re-wrap by hand (``ruff check`` lists it as E501). ``--check`` only lists what still uses an old
name (exit 1 if anything does).

Usage: ``.venv/bin/python scripts/rename_errors.py [--root DIR] [--check] [--no-ruff]``.
"""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

#: Old class name -> new class name; every entry is a subclass of `settled.SettledError`.
RENAMES: dict[str, str] = {
    # settled/client/_errors.py
    "AbortOutcomeUnknown": "AbortOutcomeUnknownError",
    "AbortRejected": "AbortRejectedError",
    "BrokerUnavailable": "BrokerUnavailableError",
    "CommandOutcomeUnknown": "CommandOutcomeUnknownError",
    "CommandRejection": "CommandRejectedError",
    "IdempotencyConflict": "IdempotencyConflictError",
    "OutcomeUnknown": "OutcomeUnknownError",
    "PayloadTooLarge": "PayloadTooLargeError",
    "ResolveOutcomeUnknown": "ResolveOutcomeUnknownError",
    "ResolveRejected": "ResolveRejectedError",
    "SettlementTimeout": "SettlementTimeoutError",
    "SubmissionOutcomeUnknown": "SubmissionOutcomeUnknownError",
    "UnexpectedReceipt": "UnexpectedReceiptError",
    # settled/processors/_conductor.py
    "AttemptSuperseded": "AttemptSupersededError",
    "RunFailed": "RunFailedError",
    # settled/protocol/_errors.py
    "IllegalTransition": "IllegalTransitionError",
    "InputAlreadyDecided": "InputAlreadyDecidedError",
    "LogInconsistency": "LogInconsistencyError",
    "TerminalOutcomeConflict": "TerminalOutcomeConflictError",
    "UnknownSubmission": "UnknownSubmissionError",
    "WrongConversation": "WrongConversationError",
    # settled/projections
    "OffsetConflict": "OffsetConflictError",
    "ReadYourWritesTimeout": "ReadYourWritesTimeoutError",
    "RebuildInProgress": "RebuildInProgressError",
    "UnsupportedSchema": "UnsupportedSchemaError",
    # settled/runtime/_errors.py
    "ReplayDivergence": "ReplayDivergenceError",
    "RunCancelled": "RunCancelledError",
    "ToolRefused": "ToolRefusedError",
    "ToolUnavailable": "ToolUnavailableError",
    "UnsafeReplay": "UnsafeReplayError",
}

#: The client error that shares its name with a log event (see the module docstring).
SHARED_OLD = "SubmissionRejected"
SHARED_NEW = "SubmissionRejectedError"

ROOTS = ("settled", "tests", "bench", "examples", "scripts", "docs")
TOP_FILES = ("README.md",)
SUFFIXES = (".py", ".md", ".toml")
SKIP_PARTS = frozenset({".venv", ".state", ".git", "__pycache__", "node_modules"})

_PLAIN_RE = re.compile(r"\b(" + "|".join(sorted(RENAMES, key=len, reverse=True)) + r")\b")
_SHARED_RE = re.compile(r"\b" + SHARED_OLD + r"\b")
_QUALIFIED_SHARED_RE = re.compile(r"(?<=\bclient\.)" + SHARED_OLD + r"\b|(?<=\b_errors\.)" + SHARED_OLD + r"\b")


def files(root: Path) -> Iterator[Path]:
    """Yield the files the rename covers, this script excluded (it holds the old names).

    Args:
        root: The repository's root directory.

    Yields:
        Each ``.py``, ``.md`` or ``.toml`` file under `ROOTS`, and each of `TOP_FILES` that exists.
    """
    me = Path(__file__).resolve()
    for name in TOP_FILES:
        if (root / name).is_file():
            yield root / name
    for top in ROOTS:
        base = root / top
        if not base.is_dir():
            continue
        for path in sorted(base.rglob("*")):
            rel_parts = path.relative_to(root).parts
            if (
                path.suffix in SUFFIXES
                and path.is_file()
                and not SKIP_PARTS.intersection(rel_parts)
                and not any(part.endswith(".egg-info") for part in rel_parts)
                and path.resolve() != me
            ):
                yield path


def _offsets(text: str) -> list[int]:
    """Return the offset of each line's first character (index 0 is line 1)."""
    starts = [0]
    for line in text.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    return starts


def _shared_spans(path: Path, text: str) -> set[int]:
    """Return the offsets of the bare ``SubmissionRejected`` words in a ``.py`` file that mean the client error.

    Args:
        path: The file, for the error message.
        text: Its text.

    Returns:
        The start offsets to rewrite.

    Raises:
        SyntaxError: The file does not parse (e.g. it holds merge conflict markers); fix it and run again.
    """
    try:
        tree = ast.parse(text, filename=str(path))
    except SyntaxError as exc:
        raise SyntaxError(f"{path}: cannot parse ({exc.msg}, line {exc.lineno}); resolve it and run again") from exc
    starts = _offsets(text)
    bare_is_client = False
    keep: set[int] = set()  # the event's import: never rewritten
    rewrite: set[int] = set()  # a client import under an alias: rewritten in place
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == SHARED_OLD:
            bases = {ast.unparse(b).rpartition(".")[2] for b in node.bases}
            bare_is_client = bare_is_client or "ClientError" in bases
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            from_client = module.startswith("settled.client") or (node.level > 0 and "/client/" in path.as_posix())
            for alias in node.names:
                if alias.name != SHARED_OLD:
                    continue
                offset = starts[alias.lineno - 1] + alias.col_offset
                if not from_client:
                    keep.add(offset)
                elif alias.asname is None or alias.asname == SHARED_OLD:
                    bare_is_client = True
                else:
                    rewrite.add(offset)
    if bare_is_client:
        return {m.start() for m in _SHARED_RE.finditer(text)} - keep
    return rewrite


def rewrite(path: Path, text: str) -> str:
    """Return ``text`` with the old error names replaced.

    Args:
        path: The file the text is from (its suffix decides how ``SubmissionRejected`` is read).
        text: The file's text.

    Returns:
        The rewritten text (``text`` itself when nothing uses an old name).
    """
    text = _PLAIN_RE.sub(lambda m: RENAMES[m.group(1)], text)
    spans = {m.start() for m in _QUALIFIED_SHARED_RE.finditer(text)}
    if path.suffix == ".py" and SHARED_OLD in text:
        spans |= _shared_spans(path, text)
    for start in sorted(spans, reverse=True):
        text = text[:start] + SHARED_NEW + text[start + len(SHARED_OLD) :]
    return text


def main(argv: Sequence[str] | None = None) -> int:
    """Run the rename (or, with ``--check``, only report what still needs it).

    Args:
        argv: The command line arguments (default: ``sys.argv[1:]``).

    Returns:
        The exit code: 0 done (or nothing left), 1 ``--check`` found old names, 2 a file did not parse.
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--root", type=Path, default=REPO, help="the repository root (default: this checkout)")
    parser.add_argument("--check", action="store_true", help="only list the files that still use an old name")
    parser.add_argument("--no-ruff", action="store_true", help="do not re-sort imports and __all__ nor format")
    args = parser.parse_args(argv)
    root: Path = args.root.resolve()
    changed: list[Path] = []
    for path in files(root):
        text = path.read_text(encoding="utf-8")
        try:
            new = rewrite(path, text)
        except SyntaxError as exc:
            print(exc, file=sys.stderr)
            return 2
        if new != text:
            changed.append(path)
            if not args.check:
                path.write_text(new, encoding="utf-8")
    for path in changed:
        print(f"{'uses an old name' if args.check else 'rewrote'}: {path.relative_to(root)}")
    if args.check:
        return 1 if changed else 0
    python_files = [str(p) for p in changed if p.suffix == ".py"]
    if python_files and not args.no_ruff:
        ruff = [sys.executable, "-m", "ruff"]
        subprocess.run([*ruff, "check", "--fix", "--select", "I001,RUF022", *python_files], cwd=root, check=False)
        subprocess.run([*ruff, "format", *python_files], cwd=root, check=False)
    print(f"{len(changed)} file(s) changed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
