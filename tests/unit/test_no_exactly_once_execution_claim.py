"""Documentation never claims exactly-once execution (DUR-003; issue 6 item 5).

settled records exactly one outcome per accepted submission; it executes attempts, tools and steps at least once.
Any sentence of the README, ``docs/`` or a module docstring that says "exactly once" (or "exactly-once") about
execution — running, executing, invoking, effects, tool calls — must also say that it is *not* so.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_EXACTLY_ONCE = re.compile(r"exactly[- ]once", re.IGNORECASE)
_EXECUTION = re.compile(r"\b(execut\w*|run\w*|invok\w*|invocation\w*|side[- ]effects?|effects?|tool calls?)\b", re.I)
_NEGATION = re.compile(r"\b(not|never|no|nor|without|neither|cannot|isn't|doesn't|don't)\b", re.IGNORECASE)


def claims(text: str) -> list[str]:
    """Return the sentences of ``text`` that claim exactly-once execution (no negation in the sentence)."""
    flat = re.sub(r"\s+", " ", text)
    sentences = re.split(r"(?<=[.!?;:])\s+|\n\n", flat)
    return [
        s.strip() for s in sentences if _EXACTLY_ONCE.search(s) and _EXECUTION.search(s) and not _NEGATION.search(s)
    ]


def _documents() -> list[tuple[str, str]]:
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    out = [(str(p.relative_to(ROOT)), p.read_text(encoding="utf-8")) for p in docs if p.exists()]
    for path in sorted((ROOT / "settled").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc:
                    out.append((f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 1)}", doc))
    return out


def test_the_checker_finds_a_claim_and_accepts_a_denial() -> None:
    assert claims("settled executes every tool exactly once. It is fast.") == [
        "settled executes every tool exactly once."
    ]
    assert claims("Exactly-once tool calls, guaranteed!") != []
    assert claims("settled never claims exactly-once execution of a tool.") == []
    assert claims("The appender is the exactly-once path to Kafka.") == []  # recording, not execution


def test_no_document_claims_exactly_once_execution() -> None:
    documents = _documents()
    assert any(where == "README.md" for where, _ in documents)
    found = [(where, claim) for where, text in documents for claim in claims(text)]
    assert not found, f"exactly-once execution claimed (DUR-003): {found}"
