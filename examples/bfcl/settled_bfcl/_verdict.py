"""The verdict on a BFCL run: each conversation judged against an independent execution of its ground truth.

Issue 8, Build item 5; research doc §3-§4. For each conversation the judge runs the entry's ground truth on a fresh
in-memory world (:func:`~settled_bfcl.run_oracle`) and checks, naming the call id or turn of each failure:

* **state** -- BFCL's own ``state_checker`` on the tool server's final world against the oracle's;
* **ledger** -- the tool server's execution ledger holds exactly one backend execution per ground-truth call id,
  with the ground truth's method and arguments (type-strict: ``15.0`` is not ``15``) and the oracle's output, in
  ground-truth order, and no execution of anything else (a refused call must never run);
* **tool results** -- the results recorded in settled's canonical log, ``(call_id, result_json)`` in log order,
  equal the oracle's outputs exactly and in order (each result may be the raw output string or its canonical JSON
  text; see :func:`result_matches`);
* **replies** -- exactly one final reply per turn, in turn order (and, by default, the replay model's text);
* **settlements** -- exactly one settlement per submission, in order, each ``completed``;
* **refusals** -- the refused calls are exactly the adversarial mode's calls of not-offered tools;
* **approvals** (a run with ``--approvals``, judged with its seed) -- every call of a state-changing method got
  exactly one decision and it is the operator's seeded rule's (`settled_bfcl._approvals`), no read-only call was
  gated; the reference run is then the ground truth with the denied calls skipped, so the checks above require each
  approved call to have run once and each denied call never, and the turn's reply must name its denied calls (the
  replay model read the structured denial).

End state alone misses a duplicate in about 36% of base conversations (research §3); the ledger and the tool results
close that gap. Reading the canonical log is the caller's job (:class:`ConversationLog`); the judge reads worlds and
ledgers from the tool server's SQLite file. :func:`judge_in_fresh_process` runs the judge in a new interpreter, so no
module-level state of the live run (mpmath precision, BFCL's shared long-context globals) can leak into the oracle.

:func:`simulate_conversation` drives a conversation end to end *without Kafka* (the replay model, a real tool server,
an in-test "runtime" loop) with injectable faults, to show the judge passes a correct run and fails broken ones.
"""

from __future__ import annotations

import enum
import json
import subprocess
import sys
import tempfile
from collections import Counter, defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter
from rich.table import Table

from settled.runtime import denial_result
from settled.schemas import CanonicalJsonError, SettlementOutcome, canonical_json
from settled_bfcl._approvals import (
    APPROVER_KEY_ID,
    approval_granted,
    approval_reason,
    expected_decisions,
    needs_approval,
)
from settled_bfcl._backends import JsonValue, World
from settled_bfcl._client import ToolServerClient
from settled_bfcl._corpus import CATEGORIES, Corpus, Entry, GroundTruthCall, load_corpus
from settled_bfcl._errors import BfclError
from settled_bfcl._oracle import OracleRun, check_final_state, run_oracle
from settled_bfcl._replay import (
    Message,
    ModelToolCall,
    ReplayError,
    ReplayModel,
    ToolResultMessage,
    UserMessage,
    adversarial_call,
    final_reply_text,
)
from settled_bfcl._store import ToolServerStore
from settled_bfcl._wire import ExecutionRecord, LedgerRecord

__all__ = [
    "ConversationLog",
    "ConversationVerdict",
    "FaultKind",
    "SimulationFault",
    "VerdictCheck",
    "VerdictError",
    "VerdictReason",
    "VerdictSummary",
    "judge_conversation",
    "judge_in_fresh_process",
    "judge_store",
    "render_failures",
    "render_summary",
    "result_matches",
    "simulate_conversation",
]

_COMPLETED = SettlementOutcome.COMPLETED.value
_SHOW_CHARS = 160


class VerdictError(BfclError):
    """The judge could not run (bad input, or the fresh judging process failed); never a failed conversation."""


class VerdictCheck(enum.StrEnum):
    """The check a failure belongs to."""

    WORLD = "world"
    """The tool server holds no world for the conversation."""
    STATE = "state"
    """BFCL's state checker on the final worlds."""
    LEDGER = "ledger"
    """One execution per ground-truth call id, nothing else, in order."""
    TOOL_RESULTS = "tool_results"
    """The tool results in the canonical log equal the oracle's outputs, in order."""
    REPLIES = "replies"
    """Exactly one final reply per turn, in order."""
    SETTLEMENTS = "settlements"
    """Exactly one settlement per submission, completed."""
    REFUSALS = "refusals"
    """Refused calls are exactly the expected adversarial ones."""
    APPROVALS = "approvals"
    """Every gated call decided once, as the operator's seeded rule says; no read-only call gated."""


@dataclass(frozen=True, slots=True)
class VerdictReason:
    """Why a conversation failed one check.

    Attributes:
        check: The check.
        message: What was found (names the call id or turn).
        call_id: The call it is about, if any.
        turn_index: The turn it is about, if any.
    """

    check: VerdictCheck
    message: str
    call_id: str | None = None
    turn_index: int | None = None

    def __str__(self) -> str:
        """Return ``[check] message``."""
        return f"[{self.check.value}] {self.message}"


@dataclass(frozen=True, slots=True)
class ConversationLog:
    """What settled's canonical log says about one conversation (gathered by the caller).

    Attributes:
        conversation_id: The conversation (also its world's id on the tool server).
        entry_id: The BFCL entry it replays.
        tool_results: ``(call_id, result_json)`` of every settled tool call, in log order; ``result_json`` is the
            canonical JSON text of the result or the raw output string (:func:`result_matches`).
        replies: ``(turn_index, reply)`` of every final reply, in log order (reply as text or canonical JSON).
        settlements: ``(turn_index, outcome)`` of every settlement, in log order (outcome as in
            :class:`~settled.schemas.SettlementOutcome`, e.g. ``"completed"``).
        refused_calls: Call ids the runtime refused (``ToolCallRefused``), in log order.
        approvals: ``(call_id, approved)`` of every decided approval of a call (``WaitResolved`` of an approval
            wait), in log order.
    """

    conversation_id: str
    entry_id: str
    tool_results: Sequence[tuple[str, str]] = ()
    replies: Sequence[tuple[int, str]] = ()
    settlements: Sequence[tuple[int, str]] = ()
    refused_calls: Sequence[str] = ()
    approvals: Sequence[tuple[str, bool]] = ()

    def __post_init__(self) -> None:
        """Freeze the sequences into tuples (lists are accepted)."""
        object.__setattr__(self, "tool_results", tuple((str(c), str(r)) for c, r in self.tool_results))
        object.__setattr__(self, "replies", tuple((int(t), str(r)) for t, r in self.replies))
        object.__setattr__(self, "settlements", tuple((int(t), str(o)) for t, o in self.settlements))
        object.__setattr__(self, "refused_calls", tuple(str(c) for c in self.refused_calls))
        object.__setattr__(self, "approvals", tuple((str(c), bool(a)) for c, a in self.approvals))


@dataclass(frozen=True, slots=True)
class ConversationVerdict:
    """The verdict on one conversation.

    Attributes:
        conversation_id: The conversation.
        entry_id: Its BFCL entry.
        reasons: Every failure found (empty when it passed).
        submissions: Submissions (turns) the conversation has.
        settlements: Settlements recorded.
        tool_calls: Ground-truth tool calls the conversation should execute.
        executions: Backend executions the ledger holds for the conversation.
        duplicate_executions: Executions beyond the first of a ground-truth call id.
        unexpected_executions: Executions of anything that is not a ground-truth call id.
        refused_calls: Calls the runtime refused.
        approvals: Gated calls approved (as the log records the decisions).
        denials: Gated calls denied.
    """

    conversation_id: str
    entry_id: str
    reasons: tuple[VerdictReason, ...] = ()
    submissions: int = 0
    settlements: int = 0
    tool_calls: int = 0
    executions: int = 0
    duplicate_executions: int = 0
    unexpected_executions: int = 0
    refused_calls: int = 0
    approvals: int = 0
    denials: int = 0

    @property
    def passed(self) -> bool:
        """True when no check failed."""
        return not self.reasons

    def reasons_for(self, check: VerdictCheck) -> tuple[VerdictReason, ...]:
        """Return the failures of one check.

        Args:
            check: The check.

        Returns:
            Its reasons, in the order found.
        """
        return tuple(reason for reason in self.reasons if reason.check is check)


def _show(value: object) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=repr)
    return repr(text) if len(text) <= _SHOW_CHARS else repr(text[: _SHOW_CHARS - 3] + "...")


def result_matches(recorded: str, output: str) -> bool:
    """Tell whether a result recorded in the log is the oracle's output.

    Accepted forms: the raw output string; its canonical JSON text (a JSON string: the output in double quotes,
    escaped); or, when the runtime recorded the output parsed as JSON, the canonical JSON text of that value
    (compared as RFC 8785 text, which writes ``15.0`` as ``15`` -- the one lossy form; the ledger check stays
    type-strict).

    Args:
        recorded: The result as recorded.
        output: The oracle's output string.

    Returns:
        True when they match.
    """
    if recorded == output:
        return True
    try:
        decoded = json.loads(recorded)
    except ValueError:
        return False
    if isinstance(decoded, str):
        return decoded == output
    try:
        return canonical_json(json.loads(output)) == canonical_json(decoded)
    except (ValueError, CanonicalJsonError):
        return False


def _json_identical(left: object, right: object) -> bool:
    """JSON equality that keeps types apart: ``15`` != ``15.0`` and ``True`` != ``1``."""
    if type(left) is not type(right):
        return False
    if isinstance(left, list) and isinstance(right, list):
        return len(left) == len(right) and all(_json_identical(a, b) for a, b in zip(left, right, strict=True))
    if isinstance(left, dict) and isinstance(right, dict):
        return left.keys() == right.keys() and all(_json_identical(left[k], right[k]) for k in left)
    return left == right


def _call_text(method: str, arguments: Mapping[str, Any]) -> str:
    return f"{method}({json.dumps(dict(arguments), sort_keys=True, default=repr)})"


# --- the checks --------------------------------------------------------------------------------------------------


def _check_state(world: World, oracle: OracleRun) -> list[VerdictReason]:
    try:
        state = check_final_state(world, oracle.world)
    except BfclError as exc:
        return [VerdictReason(VerdictCheck.STATE, f"final worlds cannot be compared: {exc}")]
    if state.valid:
        return []
    differences = ", ".join(sorted(state.differences)) or "?"
    return [
        VerdictReason(
            VerdictCheck.STATE,
            f"BFCL state_checker: {state.class_name or '?'} differs from the oracle in {differences}: "
            f"{_show(state.message)}",
        )
    ]


def _check_ledger(
    entry: Entry, oracle: OracleRun, ledger: Sequence[LedgerRecord], denied: Collection[str] = frozenset()
) -> tuple[list[VerdictReason], int, int, int]:
    """Return (reasons, executions, duplicate executions, unexpected executions).

    The expected calls are the reference run's (``oracle``: the ground truth less the ``denied`` calls).
    """
    reasons: list[VerdictReason] = []
    runs: list[tuple[ExecutionRecord, str]] = []
    for record in ledger:
        if len(record.executions) != record.execution_count:
            reasons.append(
                VerdictReason(
                    VerdictCheck.LEDGER,
                    f"ledger key {record.idempotency_key!r} counts {record.execution_count} executions but lists "
                    f"{len(record.executions)}",
                    call_id=record.call_id,
                )
            )
        runs += [(execution, record.idempotency_key) for execution in record.executions]
    runs.sort(key=lambda run: run[0].seq)
    reference = tuple(c.call for c in oracle.calls)
    expected = {call.call_id: call for call in reference}
    outputs = oracle.outputs
    by_call: dict[str, list[tuple[ExecutionRecord, str]]] = defaultdict(list)
    unexpected = 0
    for execution, key in runs:
        if execution.call_id in expected:
            by_call[execution.call_id].append((execution, key))
            continue
        unexpected += 1
        why = "a call the operator denied" if execution.call_id in denied else f"not a ground-truth call of {entry.id}"
        reasons.append(
            VerdictReason(
                VerdictCheck.LEDGER,
                f"unexpected execution #{execution.seq} of {_call_text(execution.method, execution.arguments)} "
                f"under key {key!r} with call id {execution.call_id!r}: {why}",
                call_id=execution.call_id,
            )
        )
    duplicates = 0
    for call in reference:
        executed = by_call.get(call.call_id, [])
        if not executed:
            reasons.append(
                VerdictReason(
                    VerdictCheck.LEDGER,
                    f"{call.call_id} ({call.source}) was never executed",
                    call_id=call.call_id,
                    turn_index=call.turn_index,
                )
            )
            continue
        if len(executed) > 1:
            duplicates += len(executed) - 1
            keys = sorted({key for _, key in executed})
            reasons.append(
                VerdictReason(
                    VerdictCheck.LEDGER,
                    f"{call.call_id} ({call.source}) was executed {len(executed)} times "
                    f"(executions {[e.seq for e, _ in executed]}, keys {keys})",
                    call_id=call.call_id,
                    turn_index=call.turn_index,
                )
            )
        first, _ = executed[0]
        if first.method != call.method or not _json_identical(first.arguments, dict(call.arguments)):
            reasons.append(
                VerdictReason(
                    VerdictCheck.LEDGER,
                    f"{call.call_id} ran as {_call_text(first.method, first.arguments)}, the ground truth is "
                    f"{_call_text(call.method, call.arguments)} (argument types count: 15.0 is not 15)",
                    call_id=call.call_id,
                    turn_index=call.turn_index,
                )
            )
        elif first.output != outputs[call.call_id]:
            reasons.append(
                VerdictReason(
                    VerdictCheck.LEDGER,
                    f"{call.call_id} returned {_show(first.output)} on the tool server, the oracle "
                    f"{_show(outputs[call.call_id])}",
                    call_id=call.call_id,
                    turn_index=call.turn_index,
                )
            )
    order = list(dict.fromkeys(e.call_id for e, _ in runs if e.call_id in expected))
    due = [call.call_id for call in reference if call.call_id in by_call]
    for got, want in zip(order, due, strict=True):
        if got != want:
            reasons.append(
                VerdictReason(
                    VerdictCheck.LEDGER,
                    f"executed out of order: {got} ran where {want} was due",
                    call_id=want,
                    turn_index=expected[want].turn_index,
                )
            )
            break
    return reasons, len(runs), duplicates, unexpected


def _check_tool_results(
    entry: Entry, oracle: OracleRun, recorded: Sequence[tuple[str, str]], denied: Collection[str] = frozenset()
) -> list[VerdictReason]:
    reasons: list[VerdictReason] = []
    reference = tuple(c.call for c in oracle.calls)
    expected = {call.call_id: call for call in reference}
    outputs = oracle.outputs
    counts = Counter(call_id for call_id, _ in recorded)
    first: dict[str, str] = {}
    for call_id, result in recorded:
        first.setdefault(call_id, result)
    for call_id, count in counts.items():
        if call_id not in expected:
            what = "a call the operator denied" if call_id in denied else f"not a ground-truth call of {entry.id}"
            reasons.append(
                VerdictReason(
                    VerdictCheck.TOOL_RESULTS,
                    f"the log records a result for {call_id}, which is {what}",
                    call_id=call_id,
                )
            )
        elif count > 1:
            reasons.append(
                VerdictReason(
                    VerdictCheck.TOOL_RESULTS,
                    f"the log records {count} results for {call_id}",
                    call_id=call_id,
                    turn_index=expected[call_id].turn_index,
                )
            )
    for call in reference:
        if call.call_id not in first:
            reasons.append(
                VerdictReason(
                    VerdictCheck.TOOL_RESULTS,
                    f"the log records no result for {call.call_id} ({call.source})",
                    call_id=call.call_id,
                    turn_index=call.turn_index,
                )
            )
        elif not result_matches(first[call.call_id], outputs[call.call_id]):
            reasons.append(
                VerdictReason(
                    VerdictCheck.TOOL_RESULTS,
                    f"the log's result for {call.call_id} is {_show(first[call.call_id])}, the oracle's "
                    f"{_show(outputs[call.call_id])}",
                    call_id=call.call_id,
                    turn_index=call.turn_index,
                )
            )
    order = [call_id for call_id in first if call_id in expected]
    due = [call.call_id for call in reference if call.call_id in first]
    for got, want in zip(order, due, strict=True):
        if got != want:
            reasons.append(
                VerdictReason(
                    VerdictCheck.TOOL_RESULTS,
                    f"results out of order: the log has {got} where {want} was due",
                    call_id=want,
                    turn_index=expected[want].turn_index,
                )
            )
            break
    return reasons


def _check_per_turn(
    entry: Entry, check: VerdictCheck, noun: str, plural: str, records: Sequence[tuple[int, str]]
) -> list[VerdictReason]:
    """Exactly one record per turn, in turn order."""
    reasons: list[VerdictReason] = []
    turns = len(entry.turns)
    counts = Counter(turn for turn, _ in records)
    for turn, count in sorted(counts.items()):
        if not 0 <= turn < turns:
            reasons.append(
                VerdictReason(check, f"a {noun} for turn {turn}, which {entry.id} does not have", turn_index=turn)
            )
        elif count > 1:
            reasons.append(VerdictReason(check, f"{count} {plural} for turn {turn}", turn_index=turn))
    for turn in range(turns):
        if turn not in counts:
            reasons.append(VerdictReason(check, f"no {noun} for turn {turn}", turn_index=turn))
    order = list(dict.fromkeys(turn for turn, _ in records))
    for position, (got, want) in enumerate(zip(order, sorted(order), strict=True)):
        if got != want:
            reasons.append(
                VerdictReason(check, f"{plural} out of order: turn {got} came at position {position}", turn_index=got)
            )
            break
    return reasons


def _check_replies(
    entry: Entry, replies: Sequence[tuple[int, str]], check_text: bool, denied: Collection[str] = frozenset()
) -> list[VerdictReason]:
    reasons = _check_per_turn(entry, VerdictCheck.REPLIES, "final reply", "final replies", replies)
    if check_text:
        seen: set[int] = set()
        for turn, reply in replies:
            if turn in seen or not 0 <= turn < len(entry.turns):
                continue
            seen.add(turn)
            want = final_reply_text(entry, turn, [c.call_id for c in entry.turns[turn].calls if c.call_id in denied])
            if not result_matches(reply, want):
                reasons.append(
                    VerdictReason(
                        VerdictCheck.REPLIES,
                        f"turn {turn}'s final reply is {_show(reply)}, expected {_show(want)}",
                        turn_index=turn,
                    )
                )
    return reasons


def _check_settlements(entry: Entry, settlements: Sequence[tuple[int, str]]) -> list[VerdictReason]:
    reasons = _check_per_turn(entry, VerdictCheck.SETTLEMENTS, "settlement", "settlements", settlements)
    for turn, outcome in settlements:
        if outcome != _COMPLETED:
            reasons.append(
                VerdictReason(
                    VerdictCheck.SETTLEMENTS, f"turn {turn} settled {outcome!r}, not {_COMPLETED!r}", turn_index=turn
                )
            )
    return reasons


def _check_refusals(entry: Entry, refused: Sequence[str], adversarial: bool) -> list[VerdictReason]:
    expected: list[str] = []
    if adversarial:
        for turn in entry.turns:
            bad = adversarial_call(entry, turn.index)
            if bad is not None:
                expected.append(bad.call_id)
    reasons: list[VerdictReason] = []
    for call_id in refused:
        if call_id not in expected:
            reasons.append(
                VerdictReason(VerdictCheck.REFUSALS, f"{call_id} was refused but should not have been", call_id=call_id)
            )
    counts = Counter(refused)
    for call_id in expected:
        if counts[call_id] == 0:
            reasons.append(
                VerdictReason(
                    VerdictCheck.REFUSALS,
                    f"{call_id} names a tool its turn does not offer but was not refused",
                    call_id=call_id,
                )
            )
        elif counts[call_id] > 1:
            reasons.append(
                VerdictReason(VerdictCheck.REFUSALS, f"{call_id} was refused {counts[call_id]} times", call_id=call_id)
            )
    return reasons


def _check_approvals(
    entry: Entry, decisions: Sequence[tuple[str, bool]], expected: Mapping[str, bool]
) -> list[VerdictReason]:
    """Each gated call decided exactly once, as the rule says; nothing else gated."""
    reasons: list[VerdictReason] = []
    counts = Counter(call_id for call_id, _ in decisions)
    given: dict[str, bool] = {}
    for call_id, approved in decisions:
        given.setdefault(call_id, approved)
    for call_id, count in counts.items():
        if call_id not in expected:
            reasons.append(
                VerdictReason(
                    VerdictCheck.APPROVALS,
                    f"{call_id} was gated, but it is not a ground-truth call of a state-changing method of {entry.id}",
                    call_id=call_id,
                )
            )
        elif count > 1:
            reasons.append(
                VerdictReason(VerdictCheck.APPROVALS, f"{call_id} was decided {count} times", call_id=call_id)
            )
    for call_id, approved in expected.items():
        word = "approve" if approved else "deny"
        if call_id not in given:
            reasons.append(
                VerdictReason(
                    VerdictCheck.APPROVALS,
                    f"{call_id} ({entry.call(call_id).method}) has no decision; the rule says {word}",
                    call_id=call_id,
                )
            )
        elif given[call_id] != approved:
            reasons.append(
                VerdictReason(
                    VerdictCheck.APPROVALS,
                    f"{call_id} was {'approved' if given[call_id] else 'denied'}; the rule says {word}",
                    call_id=call_id,
                )
            )
    return reasons


def judge_conversation(
    entry: Entry,
    log: ConversationLog,
    *,
    world: World | None,
    ledger: Sequence[LedgerRecord],
    oracle: OracleRun | None = None,
    adversarial: bool = False,
    check_reply_text: bool = True,
    approvals_seed: int | None = None,
) -> ConversationVerdict:
    """Judge one conversation (the checks in the module docstring).

    Args:
        entry: The BFCL entry the conversation replays.
        log: What the canonical log records for it.
        world: The tool server's final world for it (None when the server holds none: a failure).
        ledger: The tool server's ledger for it (:meth:`ToolServerStore.ledger`).
        oracle: The reference run of the entry (`run_oracle`, with the denied calls skipped under approvals); run
            here when None.
        adversarial: The run used the replay model's adversarial mode (its not-offered calls must be refused).
        check_reply_text: Also require each final reply to be the replay model's text (:func:`final_reply_text`).
        approvals_seed: The seed of a run with ``--approvals``: its state-changing calls were gated and decided by
            the operator's rule with this seed (`settled_bfcl._approvals.expected_decisions`); None: no approvals.

    Returns:
        The verdict.

    Raises:
        VerdictError: The log is for another entry, or the given oracle run is for another entry or another set
            of denied calls.
    """
    if log.entry_id != entry.id:
        raise VerdictError(
            f"conversation {log.conversation_id!r}: log.entry_id {log.entry_id!r} is not the entry {entry.id!r}"
        )
    expected = expected_decisions(entry, approvals_seed) if approvals_seed is not None else {}
    denied = frozenset(call_id for call_id, approved in expected.items() if not approved)
    if oracle is None:
        oracle = run_oracle(entry, skip=denied)
    elif oracle.entry_id != entry.id:
        raise VerdictError(f"oracle run of {oracle.entry_id!r} given for entry {entry.id!r}")
    elif {c.call.call_id for c in oracle.calls} != {c.call_id for c in entry.calls} - denied:
        raise VerdictError(f"the oracle run given for {entry.id!r} does not skip exactly the denied calls")
    reasons: list[VerdictReason] = []
    if world is None:
        reasons.append(VerdictReason(VerdictCheck.WORLD, f"the tool server holds no world for {log.conversation_id!r}"))
    else:
        reasons += _check_state(world, oracle)
    ledger_reasons, executions, duplicates, unexpected = _check_ledger(entry, oracle, ledger, denied)
    reasons += ledger_reasons
    reasons += _check_tool_results(entry, oracle, log.tool_results, denied)
    reasons += _check_replies(entry, log.replies, check_reply_text, denied)
    reasons += _check_settlements(entry, log.settlements)
    reasons += _check_refusals(entry, log.refused_calls, adversarial)
    if approvals_seed is not None:
        reasons += _check_approvals(entry, log.approvals, expected)
    elif log.approvals:
        reasons.append(
            VerdictReason(
                VerdictCheck.APPROVALS,
                f"{len(log.approvals)} calls were gated in a run without approvals",
                call_id=log.approvals[0][0],
            )
        )
    return ConversationVerdict(
        conversation_id=log.conversation_id,
        entry_id=entry.id,
        reasons=tuple(reasons),
        submissions=len(entry.turns),
        settlements=len(log.settlements),
        tool_calls=len(oracle.calls),
        executions=executions,
        duplicate_executions=duplicates,
        unexpected_executions=unexpected,
        refused_calls=len(log.refused_calls),
        approvals=sum(1 for _, approved in log.approvals if approved),
        denials=sum(1 for _, approved in log.approvals if not approved),
    )


def judge_store(
    entries: Corpus | Iterable[Entry],
    store_path: Path,
    logs: Iterable[ConversationLog],
    *,
    adversarial: bool = False,
    check_reply_text: bool = True,
    approvals_seed: int | None = None,
) -> tuple[ConversationVerdict, ...]:
    """Judge conversations against the worlds and ledger in a tool server's SQLite file, in this process.

    Prefer :func:`judge_in_fresh_process` for a live run's verdict; this is its body.

    Args:
        entries: The entries the logs name (any categories).
        store_path: The tool server's SQLite file (opened read-only; the server may still run).
        logs: One log per conversation.
        adversarial: See :func:`judge_conversation`.
        check_reply_text: See :func:`judge_conversation`.
        approvals_seed: See :func:`judge_conversation`.

    Returns:
        One verdict per log, in order.

    Raises:
        VerdictError: A log names an entry that is not given.
        StoreError: The file is missing or of another schema version.
    """
    by_id = {entry.id: entry for entry in entries}
    store = ToolServerStore.open_readonly(store_path)
    try:
        verdicts: list[ConversationVerdict] = []
        for log in logs:
            entry = by_id.get(log.entry_id)
            if entry is None:
                raise VerdictError(f"conversation {log.conversation_id!r}: entry {log.entry_id!r} was not given")
            held = store.conversation(log.conversation_id) is not None
            world = store.load_world(log.conversation_id) if held else None
            ledger = store.ledger(log.conversation_id) if held else []
            verdicts.append(
                judge_conversation(
                    entry,
                    log,
                    world=world,
                    ledger=ledger,
                    adversarial=adversarial,
                    check_reply_text=check_reply_text,
                    approvals_seed=approvals_seed,
                )
            )
        return tuple(verdicts)
    finally:
        store.close()


# --- the fresh judging process -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _JudgeRequest:
    store_path: str
    logs: tuple[ConversationLog, ...]
    adversarial: bool
    check_reply_text: bool
    approvals_seed: int | None = None


_REQUEST = TypeAdapter(_JudgeRequest)
_VERDICTS = TypeAdapter(tuple[ConversationVerdict, ...])
_CHILD_CODE = "import sys; from settled_bfcl._verdict import _judge_child; _judge_child(sys.argv[1], sys.argv[2])"


def _category_of(entry_id: str) -> str:
    prefix = entry_id.rsplit("_", 1)[0]
    short = prefix.removeprefix("multi_turn_")
    if short not in CATEGORIES:
        raise VerdictError(f"entry id {entry_id!r}: category {prefix!r} is not a multi-turn category")
    return short


def _judge_child(request_path: str, result_path: str) -> None:
    """Body of the fresh judging process: read the request, load the corpora, judge, write the verdicts."""
    request = _REQUEST.validate_json(Path(request_path).read_bytes())
    entries: list[Entry] = []
    for category in sorted({_category_of(log.entry_id) for log in request.logs}):
        entries += load_corpus(category).entries
    verdicts = judge_store(
        entries,
        Path(request.store_path),
        request.logs,
        adversarial=request.adversarial,
        check_reply_text=request.check_reply_text,
        approvals_seed=request.approvals_seed,
    )
    Path(result_path).write_bytes(_VERDICTS.dump_json(verdicts))


def judge_in_fresh_process(
    store_path: Path,
    logs: Sequence[ConversationLog],
    *,
    adversarial: bool = False,
    check_reply_text: bool = True,
    approvals_seed: int | None = None,
    timeout_s: float = 600.0,
) -> tuple[ConversationVerdict, ...]:
    """Judge conversations in a new Python interpreter (issue 8: "computed in a fresh process").

    The child loads the corpora the logs' entry ids name from the pinned ``bfcl-eval``, runs each oracle in
    memory, and reads worlds and ledgers from the tool server's file read-only.

    Args:
        store_path: The tool server's SQLite file.
        logs: One log per conversation.
        adversarial: See :func:`judge_conversation`.
        check_reply_text: See :func:`judge_conversation`.
        approvals_seed: See :func:`judge_conversation`.
        timeout_s: How long the child may take.

    Returns:
        One verdict per log, in order.

    Raises:
        VerdictError: An entry id names no multi-turn category, or the child failed or timed out (the message
            carries its stderr).
    """
    for log in logs:
        _category_of(log.entry_id)
    request = _JudgeRequest(str(Path(store_path).resolve()), tuple(logs), adversarial, check_reply_text, approvals_seed)
    with tempfile.TemporaryDirectory(prefix="settled-bfcl-verdict-") as folder:
        request_path = Path(folder) / "request.json"
        result_path = Path(folder) / "verdicts.json"
        request_path.write_bytes(_REQUEST.dump_json(request))
        try:
            child = subprocess.run(
                [sys.executable, "-c", _CHILD_CODE, str(request_path), str(result_path)],
                capture_output=True,
                timeout=timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise VerdictError(f"the judging process did not finish within {timeout_s} s") from exc
        if child.returncode != 0:
            stderr = child.stderr.decode(errors="replace")[-3000:]
            raise VerdictError(f"the judging process exited with code {child.returncode}:\n{stderr}")
        return _VERDICTS.validate_json(result_path.read_bytes())


# --- the summary -------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class VerdictSummary:
    """A run's verdicts with the run's own counters, for the summary table.

    Attributes:
        verdicts: One per conversation.
        seed: The run's seed (chaos schedule, chunking), if any.
        elapsed_s: The run's wall time.
        unknowns_raised: Tool calls that went Unknown (counted by the caller from the log).
        unknowns_resolved: Unknowns resolved by the operator step.
        title: The table's title.
        extra: More rows for the table (measure to value), e.g. the mode or the kill count.
    """

    verdicts: tuple[ConversationVerdict, ...]
    seed: int | None = None
    elapsed_s: float = 0.0
    unknowns_raised: int = 0
    unknowns_resolved: int = 0
    title: str = "BFCL verdict"
    extra: Mapping[str, str] = field(default_factory=dict)

    @property
    def passed(self) -> int:
        """Conversations that passed."""
        return sum(1 for v in self.verdicts if v.passed)

    @property
    def failed(self) -> int:
        """Conversations that failed."""
        return len(self.verdicts) - self.passed

    @property
    def all_passed(self) -> bool:
        """True when there is at least one conversation and every one passed."""
        return bool(self.verdicts) and self.failed == 0


def render_summary(summary: VerdictSummary) -> Table:
    """Render the verdict table (issue 8, Build item 4).

    Rows: conversations passed/failed, submissions settled, tool calls, duplicate executions, approvals
    approved/denied (when the run gated calls), Unknowns raised/resolved, elapsed time and seed.

    Args:
        summary: The run's verdicts and counters.

    Returns:
        A rich table (print it with ``rich.console.Console().print``).
    """
    verdicts = summary.verdicts
    table = Table(title=summary.title, show_header=True)
    table.add_column("measure")
    table.add_column("value", justify="right")
    status = "PASS" if summary.all_passed else "FAIL"
    table.add_row("verdict", f"[green]{status}[/green]" if summary.all_passed else f"[red]{status}[/red]")
    table.add_row("conversations passed", f"{summary.passed}/{len(verdicts)}")
    table.add_row("conversations failed", str(summary.failed))
    table.add_row(
        "submissions settled", f"{sum(v.settlements for v in verdicts)}/{sum(v.submissions for v in verdicts)}"
    )
    table.add_row(
        "tool calls executed", f"{sum(v.executions for v in verdicts)} (expected {sum(v.tool_calls for v in verdicts)})"
    )
    table.add_row("duplicate executions", str(sum(v.duplicate_executions for v in verdicts)))
    table.add_row("unexpected executions", str(sum(v.unexpected_executions for v in verdicts)))
    table.add_row("refused calls", str(sum(v.refused_calls for v in verdicts)))
    if any(v.approvals or v.denials for v in verdicts):
        table.add_row(
            "approvals: approved / denied",
            f"{sum(v.approvals for v in verdicts)} / {sum(v.denials for v in verdicts)}",
        )
    table.add_row("Unknowns raised / resolved", f"{summary.unknowns_raised} / {summary.unknowns_resolved}")
    table.add_row("elapsed", f"{summary.elapsed_s:.1f} s")
    table.add_row("seed", "-" if summary.seed is None else str(summary.seed))
    for name, value in summary.extra.items():
        table.add_row(name, value)
    return table


def render_failures(verdicts: Iterable[ConversationVerdict], *, limit: int = 20) -> Table:
    """Render the failed conversations with their first reasons.

    Args:
        verdicts: The verdicts.
        limit: At most this many conversations (and three reasons each) are listed.

    Returns:
        A rich table (empty when every conversation passed).
    """
    table = Table(title="failed conversations", show_header=True)
    table.add_column("conversation")
    table.add_column("reasons")
    failed = [v for v in verdicts if not v.passed]
    for verdict in failed[:limit]:
        shown = [str(reason) for reason in verdict.reasons[:3]]
        if len(verdict.reasons) > 3:
            shown.append(f"... and {len(verdict.reasons) - 3} more")
        table.add_row(verdict.conversation_id, "\n".join(shown))
    if len(failed) > limit:
        table.add_row(f"... {len(failed) - limit} more", "")
    return table


# --- simulation without Kafka ------------------------------------------------------------------------------------


class FaultKind(enum.StrEnum):
    """A fault :func:`simulate_conversation` injects at one call."""

    DUPLICATE_SAME_KEY = "duplicate_same_key"
    """The call is sent twice under the same idempotency key (a retry after a lost reply); the log records the
    second answer. With dedup on the tool server replays the stored result; with dedup off it executes twice."""
    DUPLICATE_NEW_KEY = "duplicate_new_key"
    """The call is sent twice under two keys (a retry that lost its key): it executes twice even with dedup on."""
    MISSING = "missing"
    """The call is lost: never executed and never recorded (the model is told it ran)."""
    REORDER = "reorder"
    """The call and the next call of its turn run, and are recorded, in swapped order."""
    DENIED_RUNS = "denied_runs"
    """(Approvals) The call is denied, the model is given the denial, but the call runs anyway (recorded)."""
    DENIAL_HIDDEN = "denial_hidden"
    """(Approvals) The call is denied and never runs, but the model is given a plain result instead of the denial."""


@dataclass(frozen=True, slots=True)
class SimulationFault:
    """A fault injected at one ground-truth call.

    Attributes:
        kind: What goes wrong.
        call_id: The ground-truth call it hits.
    """

    kind: FaultKind
    call_id: str


def _faults_by_call(entry: Entry, faults: Iterable[SimulationFault]) -> dict[str, FaultKind]:
    out: dict[str, FaultKind] = {}
    for fault in faults:
        try:
            call = entry.call(fault.call_id)
        except KeyError:
            raise VerdictError(
                f"fault {fault.kind.value}: call_id {fault.call_id!r} is not a call of {entry.id}"
            ) from None
        if fault.call_id in out:
            raise VerdictError(f"faults: call_id {fault.call_id!r} is given two faults")
        if fault.kind is FaultKind.REORDER and call.call_index + 1 >= len(entry.turns[call.turn_index].calls):
            raise VerdictError(f"fault reorder: {fault.call_id!r} is the last call of its turn; nothing to swap with")
        out[fault.call_id] = FaultKind(fault.kind)
    return out


def simulate_conversation(
    entry: Entry,
    client: ToolServerClient,
    model: ReplayModel,
    *,
    conversation_id: str | None = None,
    owner_epoch: int = 1,
    faults: Iterable[SimulationFault] = (),
    raw_results: bool = False,
    approvals_seed: int | None = None,
) -> ConversationLog:
    """Run one conversation end to end without Kafka: a minimal in-process "runtime" loop.

    Per turn: the history starts with the user message; the replay model is asked for a response; each tool call
    it makes runs on the tool server with idempotency key ``<conversation>:<call_id>`` and the owner epoch (a call
    of a tool the turn does not offer is refused and answered with an error, nothing runs); results go back into
    the history until the model answers in text, which ends the turn with a ``completed`` settlement. With
    ``approvals_seed``, each call of a state-changing method is first decided by the operator's rule: a denied one
    never runs and the model is given `settled_bfcl._approvals.denial_result`.

    Args:
        entry: The entry to run.
        client: A client of a running tool server.
        model: The replay model (it must map ``conversation_id`` to ``entry``).
        conversation_id: The conversation id (the entry id when None).
        owner_epoch: The epoch every call carries.
        faults: Faults to inject (at most one per call).
        raw_results: Record raw output strings in the log instead of their canonical JSON text.
        approvals_seed: Gate the state-changing calls and decide them by the operator's rule with this seed.

    Returns:
        The log the run would leave, for :func:`judge_store`.

    Raises:
        VerdictError: A fault names no call of the entry (or an approvals fault a call that is not denied), or a
            turn does not end.
        ReplayError: The model maps the conversation to another entry.
    """
    cid = entry.id if conversation_id is None else conversation_id
    if model.entry(cid).id != entry.id:
        raise ReplayError(f"the replay model maps conversation {cid!r} to {model.entry(cid).id!r}, not {entry.id!r}")
    by_call = _faults_by_call(entry, faults)
    denied = (
        {c for c, approved in expected_decisions(entry, approvals_seed).items() if not approved}
        if approvals_seed is not None
        else set()
    )
    for call_id, kind in by_call.items():
        if kind in (FaultKind.DENIED_RUNS, FaultKind.DENIAL_HIDDEN) and call_id not in denied:
            raise VerdictError(f"fault {kind.value}: {call_id!r} is not denied with approvals_seed {approvals_seed}")
    approvals: list[tuple[str, bool]] = []
    client.create_conversation_for_entry(cid, entry)
    results: list[tuple[str, str]] = []
    replies: list[tuple[int, str]] = []
    settlements: list[tuple[int, str]] = []
    refused: list[str] = []
    ran_early: dict[str, str] = {}

    def record(call_id: str, output: str) -> None:
        results.append((call_id, output if raw_results else canonical_json(output)))

    def execute(method: str, arguments: Mapping[str, JsonValue], call_id: str, key_suffix: str = "") -> str:
        response = client.call(
            cid,
            method,
            arguments,
            idempotency_key=f"{cid}:{call_id}{key_suffix}",
            owner_epoch=owner_epoch,
            call_id=call_id,
        )
        return response.output

    def run(call: ModelToolCall, turn_calls: Sequence[GroundTruthCall]) -> str:
        if call.call_id in ran_early:
            return ran_early.pop(call.call_id)
        kind = by_call.get(call.call_id)
        if kind is FaultKind.MISSING:
            return "(lost)"
        if kind is FaultKind.REORDER:
            index = next(i for i, gt in enumerate(turn_calls) if gt.call_id == call.call_id)
            successor = turn_calls[index + 1]
            early = execute(successor.method, successor.arguments, successor.call_id)
            record(successor.call_id, early)
            ran_early[successor.call_id] = early
        output = execute(call.tool_name, call.arguments, call.call_id)
        if kind is FaultKind.DUPLICATE_SAME_KEY:
            output = execute(call.tool_name, call.arguments, call.call_id)
        elif kind is FaultKind.DUPLICATE_NEW_KEY:
            output = execute(call.tool_name, call.arguments, call.call_id, "#retry")
        record(call.call_id, output)
        return output

    for turn in entry.turns:
        history: list[Message] = [UserMessage(turn.user_text)]
        offered = set(turn.tools)
        for _ in range(len(turn.calls) + 3):
            response = model.respond(cid, turn.index, history)
            if response.text is not None:
                replies.append((turn.index, response.text))
                settlements.append((turn.index, _COMPLETED))
                break
            history.append(response.as_message())
            for call in response.tool_calls:
                if call.tool_name not in offered:
                    refused.append(call.call_id)
                    text = f"tool {call.tool_name!r} is not offered in this turn; nothing was executed"
                    history.append(ToolResultMessage(call.call_id, text, is_error=True))
                    continue
                if approvals_seed is not None and needs_approval(call.tool_name):
                    approved = approval_granted(approvals_seed, call.call_id)
                    approvals.append((call.call_id, approved))
                    if not approved:
                        fault = by_call.get(call.call_id)
                        if fault is FaultKind.DENIED_RUNS:
                            run(call, turn.calls)
                        if fault is FaultKind.DENIAL_HIDDEN:
                            history.append(ToolResultMessage(call.call_id, "(denied, not told)"))
                        else:
                            reason = approval_reason(approvals_seed, approved=False)
                            text = canonical_json(denial_result(call.tool_name, APPROVER_KEY_ID, reason))
                            history.append(ToolResultMessage(call.call_id, text))
                        continue
                history.append(ToolResultMessage(call.call_id, run(call, turn.calls)))
        else:
            raise VerdictError(f"{cid} turn {turn.index}: the model did not end the turn")
    return ConversationLog(
        cid, entry.id, tuple(results), tuple(replies), tuple(settlements), tuple(refused), tuple(approvals)
    )
