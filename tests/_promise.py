"""Promise assertions: a durability test's failure names the promise that broke (issue 3).

``promise("DUR-006", condition, "...")`` raises an ``AssertionError`` whose text starts with ``[PROMISE DUR-006]``.
``scripts/fault_switches.py`` looks for exactly that marker to decide that a fault switch was caught, so keep
:data:`PROMISE_MARKER` and the runner's copy of it in step (the runner's own tests check they agree).
"""

from __future__ import annotations

import re

__all__ = ["PROMISE_MARKER", "promise", "promise_marker"]

PROMISE_MARKER = "[PROMISE {assertion_id}]"
_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]*")


def promise_marker(assertion_id: str) -> str:
    """Return the marker that starts a broken promise's message.

    Args:
        assertion_id: The promise's assertion id, e.g. ``"DUR-006"`` or ``"DUR-006.zombie-fenced"``.

    Returns:
        E.g. ``"[PROMISE DUR-006]"``.

    Raises:
        ValueError: If ``assertion_id`` is empty or holds characters other than letters, digits and ``_.:-``.
    """
    if _ID_RE.fullmatch(assertion_id) is None:
        raise ValueError(f"assertion_id {assertion_id!r} must be letters, digits and _.:- (e.g. 'DUR-006')")
    return PROMISE_MARKER.format(assertion_id=assertion_id)


def promise(assertion_id: str, condition: bool, message: str) -> None:
    """Assert that a durability promise holds.

    Args:
        assertion_id: The promise's assertion id, e.g. ``"DUR-006"``.
        condition: What must be true.
        message: What was observed, for the failure report.

    Raises:
        AssertionError: If ``condition`` is false; its text is ``"[PROMISE <assertion_id>] <message>"``.
        ValueError: If ``assertion_id`` is malformed (checked even when the condition holds).
    """
    marker = promise_marker(assertion_id)
    if not condition:
        raise AssertionError(f"{marker} {message}")
