"""Citations resolve inside the repository (issue 15 item 4).

settled/ and tests/ never cite the design brief, the seed documents or paths of the machine the project was written
on; every ``docs/design.md §N``, ``docs/semantics.md §N``, DUR-NNN and scenario number cited anywhere in the
repository names a section, requirement or scenario that ``docs/`` holds. ``scripts/rewrite_citations.py`` rewrites
old citations; this test keeps them out.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# Built from parts, so that this file does not match its own patterns.
_OUTSIDE: dict[str, re.Pattern[str]] = {
    "the design brief": re.compile("DESIGN" + r"\.md"),
    "a seed file": re.compile(
        "|".join(("000_" + "be872e48803fb00e", "002_" + "d055e8818c484c17", "004_" + "3b70bd7dc037fc41"))
    ),
    "the scenarios file": re.compile(r"(?<!docs/)\b" + "scenarios" + r"\.md"),
    "an absolute path of this machine": re.compile(r"(?<![\w./-])/(?:" + "work|farm|root" + r")/"),
}
#: A temporary folder's absolute path in Python source names this machine; the dev stack's PostgreSQL folder under
#: ``/var`` is behaviour, not a citation.
_TMP = re.compile(r"(?<![\w./-])/" + "tmp/")


def _tracked(*pathspecs: str) -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files", "-z", "--", *pathspecs], cwd=REPO, check=True, capture_output=True, text=True
    ).stdout
    return [Path(p) for p in out.split("\0") if p and (REPO / p).is_file()]


def _lines(path: Path) -> list[str]:
    try:
        return (REPO / path).read_text(encoding="utf-8").split("\n")
    except UnicodeDecodeError:
        return []  # a binary file cites nothing


def test_settled_and_tests_cite_nothing_outside_the_repository() -> None:
    found = []
    for path in _tracked("settled", "tests"):
        for number, line in enumerate(_lines(path), start=1):
            for what, pattern in _OUTSIDE.items():
                if pattern.search(line):
                    found.append(f"{path}:{number}: {what}: {line.strip()}")
            if path.suffix == ".py" and _TMP.search(line):
                found.append(f"{path}:{number}: an absolute path of this machine: {line.strip()}")
    assert not found, "cite docs/ instead (scripts/rewrite_citations.py rewrites most):\n" + "\n".join(found)


def _headings(doc: str) -> set[str]:
    text = (REPO / "docs" / doc).read_text(encoding="utf-8")
    return {m.group(1) for m in re.finditer(r"^##+ (§\d+[a-z]?|DUR-\d{3})\b", text, re.MULTILINE)}


def _scenarios() -> set[int]:
    text = (REPO / "docs" / "semantics.md").read_text(encoding="utf-8")
    section = text.split("## Failure scenarios", 1)[1]
    return {int(m.group(1)) for m in re.finditer(r"^(\d+)\. \*\*", section, re.MULTILINE)}


_SECTION_LIST = r"§\d+[a-z]?(?:(?:, | and |-)§\d+[a-z]?)*"
_DOC_CITATION = re.compile(r"docs/(design|semantics)\.md (" + _SECTION_LIST + ")")
_SCENARIO = re.compile(r"\b[Ss]cenarios? (\d+(?:(?:, | and )\d+)*)\b")
_CITING = ("settled", "tests", "examples", "bench", "scripts", "docs", "README.md", "pyproject.toml")


@pytest.mark.parametrize("kind", ["design", "semantics"])
def test_every_cited_section_exists(kind: str) -> None:
    sections = _headings(f"{kind}.md")
    missing = []
    for path in _tracked(*_CITING):
        for number, line in enumerate(_lines(path), start=1):
            for match in _DOC_CITATION.finditer(line):
                if match.group(1) != kind:
                    continue
                for section in re.findall(r"§\d+[a-z]?", match.group(2)):
                    if section not in sections:
                        missing.append(f"{path}:{number}: docs/{kind}.md {section}")
    assert not missing, f"docs/{kind}.md has no such section:\n" + "\n".join(missing)


def test_every_cited_requirement_and_scenario_is_stated() -> None:
    requirements = _headings("semantics.md")
    scenarios = _scenarios()
    assert scenarios == set(range(1, 23)), scenarios
    missing = []
    for path in _tracked(*_CITING):
        for number, line in enumerate(_lines(path), start=1):
            for dur in re.findall(r"\bDUR-\d{3}\b", line):
                if dur not in requirements:
                    missing.append(f"{path}:{number}: {dur}")
            for match in _SCENARIO.finditer(line):
                for n in re.findall(r"\d+", match.group(1)):
                    if int(n) not in scenarios:
                        missing.append(f"{path}:{number}: scenario {n}")
    assert not missing, "docs/semantics.md states no such requirement or scenario:\n" + "\n".join(missing)
