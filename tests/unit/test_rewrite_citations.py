"""scripts/rewrite_citations.py: the rewrite of citations outside the repository, in a temporary git repository."""

from __future__ import annotations

import functools
import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "rewrite_citations.py"
# Built from parts: tests/unit/test_citations.py keeps these names and paths out of tests/.
BRIEF = "DESIGN" + ".md"
SCENARIOS_PATH = "/" + "work/shared/" + "scenarios" + ".md"
TEMP_PATH = "/" + "tmp/x"
SPEC = "sp" + "ec"  # and the script would rewrite a literal "spec §N" here


@functools.cache
def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("_settled_rewrite_citations_script", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (f"(DUR-006, {BRIEF} §3)", "(DUR-006, docs/design.md §3)"),
        (f"({BRIEF} §2, §4; issue 5)", "(docs/design.md §2, §4; issue 5)"),
        (f"layers ({BRIEF} 1b)", "layers (docs/design.md §1b)"),
        (f"the brief (`shared/{BRIEF}`)", "the brief (`docs/design.md`)"),
        (f"({SPEC} §13, DUR-012)", "(docs/semantics.md §13, DUR-012)"),
        (f"the {SPEC}'s §15 rows", "docs/semantics.md §15 rows"),
        (f"issue 6 ({SPEC} §8-§11, §14)", "issue 6 (docs/semantics.md §8-§11, §14)"),
        (f"(issue 6, {SCENARIOS_PATH})", "(issue 6, docs/semantics.md)"),
        ("the spec says so", "the spec says so"),
        ("spec = method_index()", "spec = method_index()"),
    ],
)
def test_rewrite_line_rewrites_each_form_once(line: str, expected: str) -> None:
    rewrite_line = _script().rewrite_line
    assert rewrite_line(line) == expected
    assert rewrite_line(expected) == expected  # idempotent: a rewritten citation matches no pattern


def _repo(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    subprocess.run(["git", "-C", str(tmp_path), "add", "-A"], check=True)
    return tmp_path


_PARAGRAPH = (
    '"""Summary line.\n'
    "\n"
    f"A paragraph whose first line is exactly long enough to overflow once the citation grows ({BRIEF} §3) and\n"
    "whose second line takes the overflow.\n"
    '"""\n'
    "\n"
    "X = 1  # a comment\n"
)


def test_a_docstring_line_pushed_past_the_limit_is_rewrapped_and_a_second_run_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _repo(tmp_path, {"settled/mod.py": _PARAGRAPH})
    script = _script()
    assert script.main(["--root", str(root), "--no-ruff"]) == 0
    text = (root / "settled/mod.py").read_text(encoding="utf-8")
    assert BRIEF not in text
    assert all(len(line) <= script.MAX_LINE_CHARS for line in text.split("\n")), text
    words = " ".join(_PARAGRAPH.replace(f"{BRIEF} §3", "docs/design.md §3").split())
    assert " ".join(text.split()) == words  # only whitespace moved
    assert "docs/design.md §3" in text  # a path and its section stay on one line
    assert script.main(["--root", str(root), "--no-ruff"]) == 0
    assert (root / "settled/mod.py").read_text(encoding="utf-8") == text
    assert script.main(["--root", str(root), "--check"]) == 0
    capsys.readouterr()


def test_check_lists_what_cites_outside_and_a_code_line_left_too_long_fails_the_rewrite(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    long_string = "x" * 95
    root = _repo(
        tmp_path,
        {
            "settled/mod.py": f'REASON = "{long_string} ({SPEC} §12)"\n',
            "tests/test_x.py": f'"""Scenario 4 (issue 7, {SCENARIOS_PATH})."""\n',
            "README.md": f"see {TEMP_PATH} for an example\n",
        },
    )
    script = _script()
    assert script.main(["--root", str(root), "--check"]) == 1
    out = capsys.readouterr().out
    assert "settled/mod.py:1: a section of the specification" in out
    assert "tests/test_x.py:1: the scenarios file" in out
    assert "README.md" not in out  # a README may suggest a temporary folder; only Python source names this machine
    assert script.main(["--root", str(root), "--no-ruff"]) == 1  # the string cannot be re-wrapped
    assert "settled/mod.py:1: line too long" in capsys.readouterr().out
    assert (root / "settled/mod.py").read_text(
        encoding="utf-8"
    ) == f'REASON = "{long_string} (docs/semantics.md §12)"\n'
    assert script.main(["--root", str(root), "--check"]) == 0


_ORIGIN = "Where the edge comes from, one of a few citations that each grow longer"
_RESERVED = "True when no event takes the edge yet: the joining edges, a long enough entry to wrap"
_ARGS = (
    "def f(origin: str, reserved: bool) -> None:\n"
    '    """Summary line.\n'
    "\n"
    "    Args:\n"
    f"        origin: {_ORIGIN}: ``{BRIEF} §3``, ``{BRIEF} §5``.\n"
    f"        reserved: {_RESERVED} ({BRIEF} §5, issue 7).\n"
    '    """\n'
)


def test_an_args_entry_wraps_under_a_hanging_indent_and_a_number_stays_with_its_word(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _repo(tmp_path, {"settled/mod.py": _ARGS})
    script = _script()
    assert script.main(["--root", str(root), "--no-ruff"]) == 0
    lines = (root / "settled/mod.py").read_text(encoding="utf-8").split("\n")
    assert all(len(line) <= script.MAX_LINE_CHARS for line in lines), lines
    assert lines[4].startswith("        origin: "), lines
    assert lines[5].startswith("            ``docs/design.md §"), lines  # four spaces deeper than the entry
    assert lines[6].startswith("        reserved: "), lines
    assert lines[7].startswith("            "), lines
    assert "issue 7" in lines[7], lines  # not "issue" at a line's end and "7" on the next
    capsys.readouterr()
