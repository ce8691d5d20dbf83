"""Move each flat unit test file to the folder that mirrors the package it tests: ``tests/unit/<package>/``.

Usage: ``python scripts/mirror_tests.py [--dry-run]`` from anywhere in the repository. Idempotent: given the tree, it
``git mv``s every ``tests/unit/test_*.py`` whose package it knows to ``tests/unit/<package>/`` and rewrites what
named the old place, then does nothing more on a second run. What it rewrites, in every tracked text file: the old
path (``tests/unit/test_x.py``) and the old module (``tests.unit.test_x``); in the moved file itself, the
``Path(__file__).resolve().parents[N]`` that climbs to the repository root (one level deeper now: ``N + 1``). Then
it sorts the imports of the Python files it changed (``ruff check --select I --fix``) and lists each changed line
longer than the 120 characters ruff allows, to be wrapped by hand.

Which package a file tests: `PLACES` says so for the files known when this script was written; for a file it does
not name, the ``settled.<package>`` the file imports most often, when one package leads strictly. Files that test
``settled`` itself (its root modules ``_settings``, ``_errors``, ``_connection``) and checks of the whole repository
(citations, the wheel, the docs) stay in ``tests/unit/``. A file it cannot place is listed and left where it is.

Integration tests are not moved: ``tests/integration/engine/`` is the one group whose boundary is clear today.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
UNIT = Path("tests/unit")
#: The packages of ``settled`` a unit test folder may mirror.
PACKAGES = ("client", "processors", "producers", "projections", "protocol", "runtime", "schemas", "services", "testing")
#: Known flat files: their package, or None to keep them in tests/unit/ (settled's root modules, repository checks).
PLACES: dict[str, str | None] = {
    "test_admission_properties.py": "processors",
    "test_approvals_ledger.py": "processors",
    "test_held_settlements.py": "processors",
    "test_input_contract_ledger.py": "processors",
    "test_ledger_poison.py": "processors",
    "test_partition_stage.py": "processors",
    "test_resume_gate.py": "processors",
    "test_turn_watchdog.py": "processors",
    "test_cli_root.py": "services",
    "test_compose.py": "services",
    "test_demo_cli.py": "services",
    "test_settings_timeouts.py": None,  # settled/_settings.py
    "test_errors.py": None,  # settled/_errors.py
    "test_kafka_connection.py": None,  # settled/_connection.py
    "test_public_exports.py": None,  # every public package
    "test_citations.py": None,  # the repository's docs and docstrings
    "test_rewrite_citations.py": None,  # scripts/rewrite_citations.py
    "test_no_exactly_once_execution_claim.py": None,  # the repository's docs
    "test_produce_paths.py": None,  # every produce call in settled/
    "test_wheel_contents.py": None,  # the distribution
}
_IMPORT = re.compile(r"^(?:from|import) settled\.([a-z]+)\b", re.M)
_PARENTS = re.compile(r"(Path\(__file__\)\.resolve\(\)\.parents\[)(\d+)(\])")


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout


def place(path: Path) -> str | None:
    """The package folder ``path`` (a flat ``tests/unit/test_*.py``) belongs in; None to leave it where it is.

    Args:
        path: The test file, relative to the repository root.

    Returns:
        One of `PACKAGES`, or None.
    """
    if path.name in PLACES:
        return PLACES[path.name]
    counts = Counter(m for m in _IMPORT.findall((ROOT / path).read_text()) if m in PACKAGES)
    ranked = counts.most_common(2)
    if not ranked or (len(ranked) == 2 and ranked[0][1] == ranked[1][1]):
        return None
    return ranked[0][0]


def _module(path: Path) -> str:
    return ".".join(path.with_suffix("").parts)


def _rewrite_references(old: Path, new: Path, dry_run: bool) -> list[str]:
    """Replace the old path and module name in every tracked text file that names them; return the files."""
    changed = []
    pairs = ((old.as_posix(), new.as_posix()), (_module(old), _module(new)))
    for needle, _ in pairs:
        try:
            hits = _git("grep", "-l", "-F", needle).split()
        except subprocess.CalledProcessError:  # git grep exits 1 when nothing matches
            hits = []
        for name in hits:
            target = ROOT / name
            text = target.read_text()
            updated = text
            for a, b in pairs:
                updated = re.sub(re.escape(a) + r"(?![\w])", b, updated)
            if updated != text:
                if not dry_run:
                    target.write_text(updated)
                changed.append(name)
    return sorted(set(changed))


def _tidy(names: set[str]) -> None:
    """Sort the imports of the changed Python files; print each changed line over 120 characters."""
    python = sorted(n for n in names if n.endswith(".py"))
    if python:
        subprocess.run([sys.executable, "-m", "ruff", "check", "-q", "--select", "I", "--fix", *python], cwd=ROOT)
    for name in sorted(names):
        for number, line in enumerate((ROOT / name).read_text().splitlines(), 1):
            if len(line) > 120 and not name.endswith((".toml", ".md")):
                print(f"wrap by hand: {name}:{number} is {len(line)} characters long")


def main(argv: list[str] | None = None) -> int:
    """Move the flat unit tests to their mirrored folders.

    Args:
        argv: Command-line arguments (``--dry-run``).

    Returns:
        0, or 1 when a move would overwrite an existing file.
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="print the moves and rewrites; change nothing")
    args = parser.parse_args(argv)
    flat = sorted(Path(p) for p in _git("ls-files", str(UNIT / "test_*.py")).split() if Path(p).parent == UNIT)
    status = 0
    changed: set[str] = set()
    for old in flat:
        package = place(old)
        if package is None:
            if old.name not in PLACES:
                print(f"left {old}: no package leads its settled imports; add it to PLACES")
            continue
        new = UNIT / package / old.name
        if (ROOT / new).exists():
            print(f"refused {old} -> {new}: the destination exists", file=sys.stderr)
            status = 1
            continue
        print(f"{old} -> {new}")
        if args.dry_run:
            for name in _rewrite_references(old, new, dry_run=True):
                print(f"  would rewrite {name}")
            continue
        (ROOT / new.parent).mkdir(parents=True, exist_ok=True)
        _git("mv", str(old), str(new))
        moved = ROOT / new
        moved.write_text(_PARENTS.sub(lambda m: f"{m[1]}{int(m[2]) + 1}{m[3]}", moved.read_text()))
        changed.add(new.as_posix())
        for name in _rewrite_references(old, new, dry_run=False):
            print(f"  rewrote {name}")
            changed.add(name)
    _tidy({n for n in changed if (ROOT / n).exists()})
    return status


if __name__ == "__main__":
    sys.exit(main())
