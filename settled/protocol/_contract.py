"""The input contract: what the inbox accepts, checked in one place (issue 25 item 1; docs/architecture.md).

Every id an inbox record carries — conversation, submission, idempotency key, principal, command, call and resolver
key ids, and each offered tool name — is 1 to `MAX_ID_CHARS` characters, not only whitespace, with no NUL, no lone
surrogate (U+D800–U+DFFF) and no other control character (Unicode category Cc: U+0000–U+001F, U+007F–U+009F). Every
other Unicode character is allowed. A conversation id must not start with a prefix settled uses for its own
pseudo-conversations (`RESERVED_CONVERSATION_PREFIXES`). Offered tool names do not repeat and number at most
`MAX_TOOLS_OFFERED`. Free text (an abort's reason) is at most `MAX_TEXT_CHARS` characters with no NUL and no lone
surrogate. The size of a whole record is bounded by the worker's ``max_input_bytes`` (larger ones are quarantined
before decoding) and by the client's ``max_payload_bytes``.

The admission decisions (`settled.protocol.admit`, `abort`, `resolve`) reject a decodable record that breaks the
contract, naming the field, the rule and an `excerpt` of the value; `settled.client.Client` checks the same contract
before sending. Whatever an input held, what settled writes about it is bounded: ids copied into a rejection are kept
only when they keep the contract (`bounded_id`), details are cut to `MAX_DETAIL_CHARS` (`bounded_text`), and a
decision about an input that names no valid conversation is filed under ``~quarantine/<partition>``
(`filing_conversation`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from settled.protocol._workflows import PAUSE_SIGNAL, RESUME_SIGNAL
from settled.schemas import (
    AbortRequested,
    DecideApproval,
    GrantAccess,
    ResolveUnknown,
    RetrySubmission,
    RevokeAccess,
    SendSignal,
    SetLane,
    SteerRun,
    SubmissionProposed,
)

__all__ = [
    "EXCERPT_CHARS",
    "MAX_DETAIL_CHARS",
    "MAX_ID_CHARS",
    "MAX_TEXT_CHARS",
    "MAX_TOOLS_OFFERED",
    "RESERVED_CONVERSATION_PREFIXES",
    "RESERVED_SIGNAL_PREFIX",
    "Violation",
    "bounded_id",
    "bounded_text",
    "check_command",
    "check_id",
    "check_input",
    "check_proposal",
    "check_tools",
    "conversation_for_key",
    "excerpt",
    "filing_conversation",
    "quarantine_conversation",
]

MAX_ID_CHARS = 256
"""Longest id, in characters (code points)."""
MAX_TEXT_CHARS = 4096
"""Longest free-text field (an abort's reason), in characters."""
MAX_TOOLS_OFFERED = 256
"""Most tool names one submission offers."""
EXCERPT_CHARS = 64
"""How many characters of an offending value a rejection quotes."""
MAX_DETAIL_CHARS = 1024
"""Longest detail settled writes about an input (rejection and quarantine details), in characters."""
RESERVED_CONVERSATION_PREFIXES = ("~partition/", "~quarantine/")
"""Conversation-id prefixes of settled's own pseudo-conversations (docs/architecture.md, "Partition ownership")."""
RESERVED_SIGNAL_PREFIX = "settled."
"""Signal-name prefix of settled's own waits (a submission's retry backoff, ``settled.retry#<n>``): no signal a
client sends, and no ``ctx.signal`` wait, may use it, so nothing outside the owner can end such a wait."""

CONTROL_SIGNALS = (PAUSE_SIGNAL, RESUME_SIGNAL)
"""The reserved-prefix signals a client may send: a workflow run's pause and resume (issue 17 item 2), which the
owner decides by `settled.protocol.run_control_problem` (refused for anything but a workflow run)."""

#: A NUL, a lone surrogate or another control character (category Cc).
_FORBIDDEN_IN_ID = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
#: Longest quote in an `excerpt`, in characters (a repr escapes each character in at most 10).
_QUOTE_CHARS = 200
#: A NUL or a lone surrogate (free text may hold newlines and tabs).
_FORBIDDEN_IN_TEXT = re.compile("[\x00\ud800-\udfff]")


@dataclass(frozen=True, slots=True)
class Violation:
    """A field of an input that breaks the contract.

    Attributes:
        field: The field, e.g. ``"conversation_id"`` or ``"payload.tools_offered[2]"``.
        rule: The rule it breaks, e.g. ``"contains a NUL character at index 3"``.
        excerpt: A bounded, printable excerpt of the value (`excerpt`).
    """

    field: str
    rule: str
    excerpt: str

    @property
    def detail(self) -> str:
        """``"<field> <rule>: <excerpt>"``, at most a few hundred characters."""
        return f"{self.field} {self.rule}: {self.excerpt}"


def _escape(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def excerpt(value: str | bytes) -> str:
    r"""A bounded, printable quote of a value: the `repr` of its first `EXCERPT_CHARS` characters.

    Args:
        value: The value (bytes are decoded as UTF-8, undecodable bytes replaced).

    Returns:
        ``'<start>'``, or ``'<start>'… (N characters)`` (``N bytes`` for bytes) when cut. NUL, control characters and
        lone surrogates appear as escapes (``\x00``, ``\ud800``), so the excerpt keeps the id contract and is at most
        `_QUOTE_CHARS` characters plus the size.
    """
    if isinstance(value, bytes):
        unit, size = "bytes", len(value)
        text = value[: EXCERPT_CHARS * 4].decode("utf-8", "replace")
        cut = size > EXCERPT_CHARS * 4 or len(text) > EXCERPT_CHARS
    else:
        unit, size, text = "characters", len(value), value
        cut = size > EXCERPT_CHARS
    quoted = repr(text[:EXCERPT_CHARS])
    if len(quoted) > _QUOTE_CHARS:
        quoted, cut = quoted[:_QUOTE_CHARS], True
    return f"{quoted}… ({size} {unit})" if cut else quoted


def check_id(field: str, value: str) -> Violation | None:
    """Check one id against the contract.

    Args:
        field: The field's name, for the violation.
        value: The id.

    Returns:
        The violation, or ``None`` when the id keeps the contract.
    """
    rule = _id_rule(value)
    return None if rule is None else Violation(field, rule, excerpt(value))


def _id_rule(value: str) -> str | None:
    if not value:
        return "is empty"
    if len(value) > MAX_ID_CHARS:
        return f"is longer than {MAX_ID_CHARS} characters ({len(value)} characters)"
    found = _FORBIDDEN_IN_ID.search(value)
    if found is not None:
        index, code = found.start(), ord(found.group())
        if code == 0:
            return f"contains a NUL character at index {index}"
        if 0xD800 <= code <= 0xDFFF:
            return f"contains a lone surrogate U+{code:04X} at index {index}"
        return f"contains the control character U+{code:04X} at index {index}"
    if not value.strip():
        return "is only whitespace"
    return None


def _check_text(field: str, value: str | None) -> Violation | None:
    if value is None:
        return None
    if len(value) > MAX_TEXT_CHARS:
        return Violation(field, f"is longer than {MAX_TEXT_CHARS} characters ({len(value)} characters)", excerpt(value))
    found = _FORBIDDEN_IN_TEXT.search(value)
    if found is not None:
        code = ord(found.group())
        what = "a NUL character" if code == 0 else f"a lone surrogate U+{code:04X}"
        return Violation(field, f"contains {what} at index {found.start()}", excerpt(value))
    return None


def _check_conversation(value: str) -> Violation | None:
    violation = check_id("conversation_id", value)
    if violation is not None:
        return violation
    for prefix in RESERVED_CONVERSATION_PREFIXES:
        if value.startswith(prefix):
            return Violation("conversation_id", f"starts with the reserved prefix {prefix!r}", excerpt(value))
    return None


def check_tools(field: str, tools: tuple[str, ...] | list[str]) -> Violation | None:
    """Check offered tool names: at most `MAX_TOOLS_OFFERED`, each an id, none repeated.

    Args:
        field: The field's name (``"payload.tools_offered"``); a violation's rule names the offending name's index.
        tools: The names.

    Returns:
        The first violation, or ``None``.
    """
    if len(tools) > MAX_TOOLS_OFFERED:
        return Violation(field, f"holds more than {MAX_TOOLS_OFFERED} names ({len(tools)})", excerpt(",".join(tools)))
    seen: set[str] = set()
    for index, tool in enumerate(tools):
        rule = _id_rule(tool)
        if rule is not None:
            return Violation(field, f"name {index} {rule}", excerpt(tool))
        if tool in seen:
            return Violation(field, f"name {index} repeats an earlier name", excerpt(tool))
        seen.add(tool)
    return None


def check_proposal(proposal: SubmissionProposed) -> Violation | None:
    """Check a submission against the contract (conversation id first, then the other ids, then the tools).

    Args:
        proposal: The decoded proposal.

    Returns:
        The first violation, or ``None``.
    """
    found = _check_conversation(proposal.conversation_id)
    for name in ("submission_id", "idempotency_key", "principal"):
        found = found or check_id(name, getattr(proposal, name))
    return found or check_tools("payload.tools_offered", proposal.payload.tools_offered)


def check_command(
    command: AbortRequested
    | ResolveUnknown
    | SendSignal
    | DecideApproval
    | GrantAccess
    | RevokeAccess
    | RetrySubmission
    | SteerRun
    | SetLane,
) -> Violation | None:
    """Check a command against the contract.

    A resolution's empty ``key_id`` is not a contract violation: the worker rejects it as ``unsigned``.

    Args:
        command: The decoded command.

    Returns:
        The first violation, or ``None``.
    """
    found = _check_conversation(command.conversation_id)
    if isinstance(command, GrantAccess | RevokeAccess):  # access commands name a principal, not a submission
        for name in ("command_id", "principal", "grantee"):
            found = found or check_id(name, getattr(command, name))
        return found
    if isinstance(command, SetLane):  # a conversation's setting: no submission named (its lane is an enum)
        for name in ("command_id", "principal"):
            found = found or check_id(name, getattr(command, name))
        return found
    for name in ("command_id", "submission_id", "principal"):
        found = found or check_id(name, getattr(command, name))
    if isinstance(command, AbortRequested):
        return found or _check_text("reason", command.reason)
    if isinstance(command, SteerRun):  # a steering message is free text the model reads: never empty
        if found is None and not command.text.strip():
            return Violation("text", "is empty or only whitespace", excerpt(command.text))
        return found or _check_text("text", command.text)
    if isinstance(command, SendSignal):
        found = found or check_id("name", command.name)
        if found is None and command.name.startswith(RESERVED_SIGNAL_PREFIX) and command.name not in CONTROL_SIGNALS:
            return Violation(
                "name", f"starts with the reserved prefix {RESERVED_SIGNAL_PREFIX!r}", excerpt(command.name)
            )
        return found
    if isinstance(command, DecideApproval):
        found = found or check_id("approval_id", command.approval_id) or _check_text("reason", command.reason)
        return found or (check_id("key_id", command.key_id) if command.key_id else None)
    if isinstance(command, RetrySubmission):
        found = found or check_id("new_submission_id", command.new_submission_id)
        return found or (check_id("key_id", command.key_id) if command.key_id else None)
    found = found or check_id("call_id", command.call_id)
    return found or (check_id("key_id", command.key_id) if command.key_id else None)


def check_input(
    record: SubmissionProposed
    | AbortRequested
    | ResolveUnknown
    | SendSignal
    | DecideApproval
    | GrantAccess
    | RevokeAccess
    | RetrySubmission
    | SteerRun
    | SetLane,
) -> Violation | None:
    """Check any inbox record against the contract (`check_proposal` or `check_command`).

    Args:
        record: The decoded record.

    Returns:
        The first violation, or ``None``.
    """
    return check_proposal(record) if isinstance(record, SubmissionProposed) else check_command(record)


def quarantine_conversation(partition: int) -> str:
    """The pseudo-conversation that files decisions about inputs naming no valid conversation: ``~quarantine/<p>``.

    Args:
        partition: The inbox partition the input came from.

    Returns:
        ``~quarantine/<partition>``.
    """
    return f"~quarantine/{partition}"


def filing_conversation(conversation_id: str, partition: int) -> str:
    """The conversation whose log records the decision about an input.

    Args:
        conversation_id: The conversation the input names.
        partition: The inbox partition it came from.

    Returns:
        ``conversation_id`` when it keeps the contract, else `quarantine_conversation` (so an oversized or NUL-holding
        id never becomes a log key, a batch id or a projection row).
    """
    return conversation_id if _check_conversation(conversation_id) is None else quarantine_conversation(partition)


def conversation_for_key(key: bytes | None, partition: int) -> str:
    """The conversation that files the quarantine of an undecodable record, from its key.

    Args:
        key: The record's key (meant to be the conversation id, UTF-8), if any.
        partition: The inbox partition.

    Returns:
        The key as a conversation id when it is UTF-8 and keeps the contract, else `quarantine_conversation`.
    """
    if not key or len(key) > MAX_ID_CHARS * 4:
        return quarantine_conversation(partition)
    try:
        text = key.decode("utf-8")
    except UnicodeDecodeError:
        return quarantine_conversation(partition)
    return filing_conversation(text, partition)


def bounded_id(value: str) -> str:
    """An id to copy into a record about an input: the id itself when it keeps the contract, else its `excerpt`.

    Args:
        value: The id as the input held it.

    Returns:
        A value of at most about 240 characters with no NUL, control character or lone surrogate.
    """
    return value if _id_rule(value) is None else excerpt(value)


def bounded_text(value: str) -> str:
    """A detail to write about an input: cut to `MAX_DETAIL_CHARS`, NULs and lone surrogates escaped.

    Args:
        value: The detail (e.g. a decode error's message).

    Returns:
        The bounded detail.
    """
    text = value if len(value) <= MAX_DETAIL_CHARS else value[: MAX_DETAIL_CHARS - 40] + f"… ({len(value)} characters)"
    return _FORBIDDEN_IN_TEXT.sub(_escape, text)[: MAX_DETAIL_CHARS + 200]
