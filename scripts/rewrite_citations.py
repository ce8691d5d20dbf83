"""Rewrite citations of documents outside the repository into citations of ``docs/`` (issue 15 item 4), re-runnably.

settled's code, tests and docs used to cite the design brief (``DESIGN.md §N``), the durability specification
(``spec §N``, a seed file) and the failure-scenario list (a ``scenarios.md`` file by absolute path), none of which is
in the repository. Their content now lives in ``docs/``: ``docs/design.md`` keeps the brief's section numbers,
``docs/semantics.md`` keeps the specification's section numbers (DUR-NNN in its §17) and states every numbered
failure scenario. This script rewrites, in the tracked ``.py``, ``.md``, ``.toml``, ``.sql`` and ``.avsc`` files of
``settled/``, ``tests/``, ``examples/``, ``bench/``, ``scripts/``, ``docs/`` and ``README.md``, and in
``pyproject.toml``, per `REWRITES`:

- ``DESIGN.md §N`` -> ``docs/design.md §N`` (also a bare ``DESIGN.md``, ``DESIGN.md 1b``, ``shared/DESIGN.md``);
- ``spec §N``, ``the spec's §N``, ``spec's §N`` -> ``docs/semantics.md §N``;
- a ``scenarios.md`` path (``/work/shared/scenarios.md``, ``shared/scenarios.md``) -> ``docs/semantics.md``.

A rewritten citation no longer matches any pattern, so running it again, or on a branch merged later, only rewrites
what still cites outside the repository. In a ``.py`` file a docstring or comment line that a longer citation pushes
past 120 characters is re-wrapped: the words past the limit move to the start of the paragraph's next line (which may
overflow in turn), or onto a new line with the same indentation when the paragraph ends there. A longer line anywhere
else (a docstring's summary line, code, a string literal) is listed and left for a hand edit; ``ruff check`` then
reports it as E501.

``--check`` rewrites nothing: it lists every line that still cites outside the repository (the patterns above, the
seed file names, ``research/*.md`` files and absolute paths of the machine the project was written on:
``/work/``, ``/farm/``, ``/root/``, and in ``.py`` files ``/tmp/``, not ``/var/tmp/``) and exits 1 if there is any.

Afterwards it runs ``ruff format`` on the ``.py`` files it changed (unless ``--no-ruff``), which splits a code line a
longer string pushed past the limit; what is still too long is listed (exit 1).

Usage: ``.venv/bin/python scripts/rewrite_citations.py [--root DIR] [--check] [--no-ruff]``.
"""

from __future__ import annotations

import argparse
import ast
import io
import re
import subprocess
import sys
import tokenize
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

#: Folders and files whose tracked files are rewritten and checked.
SCOPE: tuple[str, ...] = ("settled", "tests", "examples", "bench", "scripts", "docs", "README.md", "pyproject.toml")

#: File suffixes rewritten and checked.
SUFFIXES: frozenset[str] = frozenset({".py", ".md", ".toml", ".sql", ".avsc"})

#: Files never rewritten nor checked: this script names every pattern it looks for.
EXEMPT: frozenset[str] = frozenset({"scripts/rewrite_citations.py"})

#: Ruff's line length (``pyproject.toml``, ``[tool.ruff] line-length``).
MAX_LINE_CHARS = 120

_DESIGN = "DESIGN" + ".md"  # split so that a grep of this file for the name finds only the patterns
_SPEC_SECTION = r"§(\d+[a-z]?)"

#: (pattern, replacement), applied in order to every line in scope.
REWRITES: tuple[tuple[re.Pattern[str], str], ...] = (
    # the brief: a path to it, then the bare name
    (re.compile(r"(?:/work/)?shared/" + re.escape(_DESIGN)), "docs/design.md"),
    (re.compile(re.escape(_DESIGN) + r" (1b|\d+)\b"), r"docs/design.md §\1"),
    (re.compile(r"(?<![\w/.])" + re.escape(_DESIGN)), "docs/design.md"),
    # the specification's sections (the spec's numbering is kept by docs/semantics.md)
    (re.compile(r"\b(?:[Tt]he spec's|[Tt]he spec|spec's|spec) " + _SPEC_SECTION), r"docs/semantics.md §\1"),
    # the failure scenarios
    (re.compile(r"(?:/work/)?(?:shared/)?scenarios\.md"), "docs/semantics.md"),
)

#: Patterns ``--check`` reports: what still cites outside the repository.
OUTSIDE: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("the design brief", re.compile(re.escape(_DESIGN))),
    ("a section of the specification", re.compile(r"\b(?:[Tt]he spec's|spec's|spec) §\d")),
    ("the scenarios file", re.compile(r"(?<!docs/)\bscenarios\.md")),
    ("a seed file", re.compile(r"000_be872e48803fb00e|002_d055e8818c484c17|004_3b70bd7dc037fc41|\bseeds/")),
    ("a research note", re.compile(r"\bresearch/[\w-]+\.md")),
    ("an absolute path of this machine", re.compile(r"(?<![\w./-])/(?:work|farm|root)/")),
)

#: Reported in ``.py`` files only: a README may suggest ``/tmp/...`` to its reader; a docstring names this machine.
OUTSIDE_PY: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("an absolute path of this machine", re.compile(r"(?<![\w./-])/tmp/")),
)


@dataclass(frozen=True)
class Finding:
    """One line that cites outside the repository, or one line a rewrite left too long.

    Attributes:
        path: The file, relative to the root.
        line: Its 1-based line number.
        what: What is cited, or ``"line too long"``.
        text: The line, stripped.
    """

    path: str
    line: int
    what: str
    text: str

    def __str__(self) -> str:
        """Return ``path:line: what: text``."""
        return f"{self.path}:{self.line}: {self.what}: {self.text}"


def tracked_files(root: Path) -> list[Path]:
    """Return the tracked files in `SCOPE` with a suffix in `SUFFIXES`, except `EXEMPT`.

    Args:
        root: The repository's root.

    Returns:
        The files' paths relative to ``root``, sorted.

    Raises:
        subprocess.CalledProcessError: If ``git ls-files`` fails (``root`` is not a git work tree).
    """
    out = subprocess.run(
        ["git", "ls-files", "-z", "--", *SCOPE], cwd=root, check=True, capture_output=True, text=True
    ).stdout
    paths = [Path(p) for p in out.split("\0") if p]
    return sorted(p for p in paths if (p.suffix in SUFFIXES or p.name == "pyproject.toml") and str(p) not in EXEMPT)


def rewrite_line(line: str) -> str:
    """Apply `REWRITES` to one line.

    Args:
        line: The line.

    Returns:
        The line with every citation outside the repository rewritten (unchanged when it has none).
    """
    for pattern, replacement in REWRITES:
        line = pattern.sub(replacement, line)
    return line


def prose_lines(source: str) -> set[int]:
    """Return the 1-based numbers of the lines of a Python module that are docstring or comment text.

    Args:
        source: The module's text.

    Returns:
        The lines of a docstring (module, class or function) after its summary line, and the lines that hold only a
        comment. Empty when the module does not parse.
    """
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
                and first.end_lineno is not None
            ):
                # the summary line stays one line (D205): it is never re-wrapped
                lines.update(range(first.lineno + 1, first.end_lineno + 1))
    try:
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type == tokenize.COMMENT and token.line.strip().startswith("#"):
                lines.add(token.start[0])
    except (tokenize.TokenError, SyntaxError):
        return set()
    return lines


_NO_BREAK = "\u2060"  # word joiner: keeps a path and its section together while a line is split
_BULLET_RE = re.compile(r"^(\s*)(?:[-*] |\d+\. |[A-Za-z_][\w.]*(?: \([^)]*\))?: |Args:|Returns:|Raises:|Yields:)")
_PREFIX_RE = re.compile(r"^(\s*(?:# ?)?)")
_RULE_RE = re.compile(r" ([-=#*~])\1{5,}$")


def _prefix(line: str) -> str:
    match = _PREFIX_RE.match(line)
    return match.group(1) if match else ""


_SECTION_RE = re.compile(r"(?:Args|Arguments|Attributes|Returns|Raises|Yields|Note|Example|Examples):")
_FIELD_RE = re.compile(r"[A-Za-z_*][\w.*]*(?: \([^)]*\))?: ")


def _in_field_section(lines: list[str], index: int) -> bool:
    """Tell whether ``lines[index]`` is an entry of a Google-style section (``Args:``, ``Raises:``, ...)."""
    indent = len(lines[index]) - len(lines[index].lstrip())
    for line in reversed(lines[:index]):
        if not line.strip():
            return False
        line_indent = len(line) - len(line.lstrip())
        if line_indent < indent:
            return _SECTION_RE.fullmatch(line.strip()) is not None
    return False


def _continuation_prefix(lines: list[str], index: int) -> str:
    """Return the indentation of a line that continues ``lines[index]``'s paragraph.

    A bullet's text hangs under the bullet's text; an entry of a Google-style section (``name: text`` under
    ``Args:``) hangs four spaces deeper than the entry.
    """
    line = lines[index]
    prefix = _prefix(line)
    body = line[len(prefix) :]
    bullet = re.match(r"[-*] |\d+\. ", body)
    if bullet:
        return prefix + " " * len(bullet.group(0))
    if not prefix.strip() and _FIELD_RE.match(body) and _in_field_section(lines, index):
        return prefix + "    "
    return prefix


def _continues(line: str, prefix: str) -> bool:
    """Tell whether ``line`` continues a paragraph whose continuation lines start with ``prefix``."""
    if not line.startswith(prefix) or not line[len(prefix) :].strip():
        return False
    rest = line[len(prefix) :]
    if rest[0].isspace() or rest.lstrip().startswith(('"""', "'''", "```", ">>>")):
        return False
    return _BULLET_RE.match(rest) is None and (prefix.strip() == "#") == line.lstrip().startswith("#")


def _split(line: str) -> tuple[str, str] | None:
    """Split ``line`` at its last space that leaves at most `MAX_LINE_CHARS` characters; None if there is none."""
    # keep a path and its section, and a word and the number after it ("issue 7"), on one line when possible
    protected = re.sub(r"(\.md) (§)", "\\1" + _NO_BREAK + "\\2", line)
    joined = re.sub(r"(?<=\w) (?=[\d§])", _NO_BREAK, protected)
    parts = _split_at_space(joined) or _split_at_space(protected)
    if parts is None:
        return None
    head, tail = parts
    return head.replace(_NO_BREAK, " "), tail.replace(_NO_BREAK, " ")


def _split_at_space(protected: str) -> tuple[str, str] | None:
    """Split at the last space that leaves at most `MAX_LINE_CHARS` characters; None if there is none."""
    start = len(_prefix(protected))
    cut = protected.rfind(" ", start + 1, MAX_LINE_CHARS + 1)
    while cut > start and protected[cut - 1] == " ":
        cut -= 1
    if cut <= start:
        return None
    return protected[:cut].rstrip(), protected[cut:].strip()


def rewrap(lines: list[str], index: int, prose: set[int]) -> bool:
    """Re-wrap the docstring or comment line ``lines[index]`` to `MAX_LINE_CHARS`, in place.

    Args:
        lines: The file's lines, without line ends.
        index: The 0-based index of the line to re-wrap.
        prose: The 1-based numbers of the docstring and comment lines (`prose_lines`); a line added here is prose.

    Returns:
        True when every line it touched fits; False when a line could not be split (one word past the limit).
    """
    while len(lines[index]) > MAX_LINE_CHARS:
        rule = _RULE_RE.search(lines[index])
        if rule is not None and rule.start() < MAX_LINE_CHARS - 3:
            # a comment's decorative rule (``# -- title ------``) is shortened, not wrapped
            lines[index] = lines[index][:MAX_LINE_CHARS]
            continue
        parts = _split(lines[index])
        if parts is None:
            return False
        head, tail = parts
        following = index + 1
        prefix = _continuation_prefix(lines, index)
        if following < len(lines) and (following + 1) in prose:
            hanging = _prefix(lines[following])
            if len(hanging) > len(prefix) and hanging.startswith(prefix) and _continues(lines[following], hanging):
                prefix = hanging  # e.g. the hanging indent of an Args entry
        lines[index] = head
        if following < len(lines) and (following + 1) in prose and _continues(lines[following], prefix):
            lines[following] = prefix + tail + " " + lines[following][len(prefix) :]
        else:
            lines.insert(following, prefix + tail)
            for number in sorted((n for n in prose if n > following), reverse=True):
                prose.discard(number)
                prose.add(number + 1)
            prose.add(following + 1)
        index = following
    return True


def rewrite_file(root: Path, path: Path) -> tuple[bool, list[Finding]]:
    """Rewrite one file's citations in place.

    Args:
        root: The repository's root.
        path: The file, relative to ``root``.

    Returns:
        Whether the file changed, and the lines a rewrite left longer than `MAX_LINE_CHARS` (``.py`` files only).
    """
    full = root / path
    text = full.read_text(encoding="utf-8")
    lines = text.split("\n")
    prose = prose_lines(text) if path.suffix == ".py" else set()
    changed: list[int] = []
    for index, line in enumerate(lines):
        new = rewrite_line(line)
        if new != line:
            lines[index] = new
            changed.append(index)
    if not changed:
        return False, []
    too_long: list[Finding] = []
    if path.suffix == ".py":
        # last line first, so an inserted line never shifts an index still to visit
        for index in sorted(changed, reverse=True):
            if len(lines[index]) <= MAX_LINE_CHARS:
                continue
            if (index + 1) not in prose or not rewrap(lines, index, prose):
                too_long.append(Finding(str(path), index + 1, "line too long", lines[index].strip()))
    full.write_text("\n".join(lines), encoding="utf-8")
    return True, too_long


def check(root: Path) -> list[Finding]:
    """List every line in scope that still cites outside the repository.

    Args:
        root: The repository's root.

    Returns:
        One finding per (line, kind of citation), in file and line order.
    """
    findings: list[Finding] = []
    for path in tracked_files(root):
        text = (root / path).read_text(encoding="utf-8")
        patterns = OUTSIDE + OUTSIDE_PY if path.suffix == ".py" else OUTSIDE
        for number, line in enumerate(text.split("\n"), start=1):
            for what, pattern in patterns:
                if pattern.search(line):
                    findings.append(Finding(str(path), number, what, line.strip()))
    return findings


def _ruff(root: Path) -> list[str]:
    """Return the command that runs ruff: the checkout's ``.venv`` one when there is one."""
    local = root / ".venv" / "bin" / "ruff"
    return [str(local)] if local.exists() else [sys.executable, "-m", "ruff"]


def _line_length(path: Path, near: int, text: str) -> int:
    """Return the length of the line of ``path`` holding ``text`` (stripped) nearest line ``near``; 0 if none does.

    ``ruff format`` may have moved the line; a line it split no longer holds the whole text.
    """
    lines = path.read_text(encoding="utf-8").split("\n")
    found = [i for i, line in enumerate(lines, start=1) if line.strip() == text]
    if not found:
        return 0
    return len(lines[min(found, key=lambda i: abs(i - near)) - 1])


def main(argv: Sequence[str] | None = None) -> int:
    """Rewrite (or ``--check``) the citations of the repository at ``--root``.

    Args:
        argv: The command line after the program name; ``sys.argv[1:]`` when None.

    Returns:
        0 when done (rewrite) or nothing cites outside the repository (check); 1 when ``--check`` found something
        or a rewritten line is left too long.
    """
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--root", type=Path, default=REPO, help="the repository's root (default: this checkout)")
    parser.add_argument("--check", action="store_true", help="only list what still cites outside the repository")
    parser.add_argument("--no-ruff", action="store_true", help="do not run ruff format on the rewritten .py files")
    args = parser.parse_args(argv)
    root: Path = args.root.resolve()
    if args.check:
        findings = check(root)
        for finding in findings:
            print(finding)
        print(f"{len(findings)} line(s) cite outside the repository", file=sys.stderr)
        return 1 if findings else 0
    rewritten: list[Path] = []
    too_long: list[Finding] = []
    for path in tracked_files(root):
        changed, long_lines = rewrite_file(root, path)
        if changed:
            rewritten.append(path)
        too_long.extend(long_lines)
    print(f"rewrote citations in {len(rewritten)} file(s)", file=sys.stderr)
    python_files = [str(p) for p in rewritten if p.suffix == ".py"]
    if python_files and not args.no_ruff:
        # ruff format splits a code line a longer string pushed past the limit (a call's arguments, one a line)
        subprocess.run([*_ruff(root), "format", "--quiet", *python_files], cwd=root, check=True)
        too_long = [f for f in too_long if _line_length(root / f.path, f.line, f.text) > MAX_LINE_CHARS]
    for finding in too_long:
        print(finding)
    if too_long:
        print(f"{len(too_long)} rewritten line(s) past {MAX_LINE_CHARS} characters: re-wrap by hand", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
