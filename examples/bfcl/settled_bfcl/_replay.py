"""The replay model provider: a stateless "model" that emits an entry's ground-truth calls (issue 8, Build item 2).

Each submission is one user turn: conversation ``c`` maps to a corpus entry (by default ``c`` *is* the entry id) and
submission ``k`` to turn ``k``. For a turn, :meth:`ReplayModel.respond` answers the history the runtime gives it
with the turn's ground-truth calls as model tool calls, carrying deterministic call ids ``<entry>/t<k>/c<j>``
(:func:`~settled_bfcl.call_id_for`), in order, chunked per :class:`ReplayMode`; after the last call it
answers with a final text (:func:`final_reply_text`).

The model keeps no state between calls: it derives its position from the history alone, by counting the tool
results present after the turn's user message. So a runtime that re-asks the model after a crash, a takeover or a
replay gets the same response for the same history, and a response for a history the model has never "seen" (a new
owner) is still the right next step. The history is checked against the plan: a tool call or tool result with an
unexpected call id, a user message that is not the turn's, or a final text already given raise
:class:`ReplayHistoryError` naming the message.

A structured denial (`settled.runtime.denial_result`, given as the result when an operator denies a gated call)
counts as that call's answer: the model goes on with the plan, and the turn's final text names the denied calls
(:func:`final_reply_text`).

Arguments reach the caller as the corpus's JSON values (an int stays an int and a float a float: ``15.0`` is not
``15`` for BFCL's backends), in a fresh dict each time.

Adversarial mode (``adversarial=True``, combinable with any chunking mode): in the turn right before a miss_func
holdout turn (the turn whose ground truth is empty because a function is missing), the model first calls the
missing function, which that turn does not offer, with call id ``<entry>/t<k>/x0`` and the arguments the holdout
turn later uses. The runtime must refuse it as a tool error the model sees and execute nothing (docs/design.md §5:
``ToolCallRefused``); the model then gives its final text.

One shipped entry cannot be replayed: ``multi_turn_miss_func_49/t1/c1`` calls ``tail`` two turns before it is
offered (:attr:`~settled_bfcl.Entry.unoffered_calls`). :meth:`ReplayModel.respond` refuses every turn of
such an entry (:class:`UnreplayableEntryError`); :func:`replayable_entries` leaves them out.
"""

from __future__ import annotations

import copy
import enum
import itertools
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple, TypeAlias

from settled_bfcl._approvals import parse_denial
from settled_bfcl._backends import JsonValue
from settled_bfcl._corpus import Corpus, Entry, GroundTruthCall, ToolDoc, Turn
from settled_bfcl._errors import BfclError

__all__ = [
    "AssistantText",
    "AssistantToolCalls",
    "Message",
    "ModelResponse",
    "ModelToolCall",
    "ReplayError",
    "ReplayHistoryError",
    "ReplayMode",
    "ReplayModel",
    "ToolResultMessage",
    "TurnScript",
    "UnreplayableEntryError",
    "UserMessage",
    "adversarial_call",
    "adversarial_call_id",
    "final_reply_text",
    "replayable",
    "replayable_entries",
]


class ReplayError(BfclError):
    """The replay model cannot answer: unknown conversation, turn out of range, bad mode or seed."""


class ReplayHistoryError(ReplayError):
    """The history given to the replay model does not fit the turn's plan (names the message and the call id)."""


class UnreplayableEntryError(ReplayError):
    """The entry's ground truth calls a tool its turn does not offer, so a runtime that refuses it cannot replay it.

    Attributes:
        entry_id: The entry.
        call_ids: The unoffered calls.
    """

    def __init__(self, entry_id: str, call_ids: Sequence[str]) -> None:
        super().__init__(
            f"entry {entry_id!r} cannot be replayed: ground-truth call(s) {', '.join(call_ids)} use a tool their "
            "turn does not offer (see Entry.unoffered_calls); leave the entry out (replayable_entries)"
        )
        self.entry_id = entry_id
        self.call_ids = tuple(call_ids)


# --- messages ----------------------------------------------------------------------------------------------------


class ModelToolCall(NamedTuple):
    """One tool call the model makes: ``(call_id, tool_name, arguments)``.

    Attributes:
        call_id: The deterministic call id (``<entry>/t<k>/c<j>``, or ``<entry>/t<k>/x0`` for an adversarial call).
        tool_name: The bare backend method name.
        arguments: Named JSON arguments (ints stay ints, floats stay floats).
    """

    call_id: str
    tool_name: str
    arguments: dict[str, JsonValue]


@dataclass(frozen=True, slots=True)
class UserMessage:
    """The user's message that opens a turn (the submission's input).

    Attributes:
        text: The text (:attr:`~settled_bfcl.Turn.user_text`).
    """

    text: str


@dataclass(frozen=True, slots=True)
class AssistantToolCalls:
    """A model response that called tools (as the runtime puts it back into the history).

    Attributes:
        calls: The calls, in the order the model made them.
    """

    calls: tuple[ModelToolCall, ...]


@dataclass(frozen=True, slots=True)
class ToolResultMessage:
    """The result of one tool call, as the model sees it.

    Attributes:
        call_id: The call it answers.
        content: The tool's output (BFCL's output string), or the runtime's refusal text.
        is_error: True when the runtime refused the call or the tool failed at the boundary.
    """

    call_id: str
    content: str
    is_error: bool = False


@dataclass(frozen=True, slots=True)
class AssistantText:
    """A model response that is a text reply (ends the turn).

    Attributes:
        text: The reply.
    """

    text: str


#: One message of the history the runtime gives the model.
Message: TypeAlias = UserMessage | AssistantToolCalls | ToolResultMessage | AssistantText


@dataclass(frozen=True, slots=True)
class ModelResponse:
    """What the model answers: either tool calls or a final text, never both.

    Attributes:
        tool_calls: The tool calls (empty for a final text).
        text: The final text (None when the model called tools).
    """

    tool_calls: tuple[ModelToolCall, ...] = ()
    text: str | None = None

    def __post_init__(self) -> None:
        """Check that exactly one of ``tool_calls`` and ``text`` is given.

        Raises:
            ValueError: Both or neither are given.
        """
        if bool(self.tool_calls) == (self.text is not None):
            raise ValueError(
                f"ModelResponse needs exactly one of tool_calls ({len(self.tool_calls)} given) and text "
                f"({'given' if self.text is not None else 'None'})"
            )

    @property
    def is_final(self) -> bool:
        """True when the response is the turn's final text."""
        return self.text is not None

    def as_message(self) -> AssistantToolCalls | AssistantText:
        """Return the response as the history message that records it.

        Returns:
            :class:`AssistantToolCalls` or :class:`AssistantText`.
        """
        if self.text is not None:
            return AssistantText(self.text)
        return AssistantToolCalls(self.tool_calls)


# --- the plan ------------------------------------------------------------------------------------------------------


class ReplayMode(enum.StrEnum):
    """How the replay model groups a turn's calls into responses (issue 8, Build item 2)."""

    ONE_CALL = "one_call"
    """One tool call per response."""
    BATCH = "batch"
    """All of a turn's calls in one response (the runtime must run them in order: later calls depend on earlier)."""
    RANDOM_CHUNKS = "random_chunks"
    """Seeded random runs of consecutive calls (the seed, the entry and the turn decide the cuts)."""


@dataclass(frozen=True, slots=True)
class TurnScript:
    """The replay model's plan for one turn: tool-call responses in order, then the final text.

    Attributes:
        entry_id: The entry.
        turn_index: The turn.
        chunks: The tool-call responses, in order (empty when the turn only answers in text).
        final_text: The final reply.
    """

    entry_id: str
    turn_index: int
    chunks: tuple[tuple[ModelToolCall, ...], ...]
    final_text: str

    @property
    def calls(self) -> tuple[ModelToolCall, ...]:
        """Every call of the turn in order (an adversarial call first, then the ground truth)."""
        return tuple(call for chunk in self.chunks for call in chunk)

    @property
    def responses(self) -> tuple[ModelResponse, ...]:
        """The responses the model gives when every call gets a result: the chunks, then the final text."""
        return (*(ModelResponse(tool_calls=chunk) for chunk in self.chunks), ModelResponse(text=self.final_text))


def final_reply_text(entry: Entry, turn_index: int, denied: Sequence[str] = ()) -> str:
    """Return the replay model's final text for a turn (deterministic; names the entry and the turn).

    Args:
        entry: The entry.
        turn_index: Zero-based turn index.
        denied: The turn's calls whose result was a structured denial (`settled_bfcl._approvals.parse_denial`), in
            call order: the text names them, so the reply shows the model read each denial.

    Returns:
        E.g. ``"multi_turn_base_0 turn 1: done (2 tool calls)."``, or with denials
        ``"multi_turn_base_0 turn 1: done (2 tool calls; denied: multi_turn_base_0/t1/c0)."``.

    Raises:
        ReplayError: The turn index is out of range.
    """
    turn = _turn(entry, turn_index)
    if turn.calls:
        count = len(turn.calls)
        refused = f"; denied: {', '.join(denied)}" if denied else ""
        return f"{entry.id} turn {turn_index}: done ({count} tool call{'s' if count != 1 else ''}{refused})."
    if turn.held_out:
        return f"{entry.id} turn {turn_index}: none of the offered tools can do this."
    return f"{entry.id} turn {turn_index}: nothing to call; please tell me more."


def adversarial_call_id(entry_id: str, turn_index: int) -> str:
    """Return the call id of the adversarial call in a turn (``<entry>/t<k>/x0``; never a ground-truth id).

    Args:
        entry_id: The entry.
        turn_index: Zero-based turn index.

    Returns:
        The call id.
    """
    return f"{entry_id}/t{turn_index}/x0"


def adversarial_call(entry: Entry, turn_index: int) -> ModelToolCall | None:
    """Return the adversarial mode's call of a not-offered tool in a turn, or None when the turn has none.

    A turn gets one when the next turn is a miss_func holdout turn: the call names the first restored function
    the holdout turn's ground truth uses, with those arguments (the first restored function with no arguments when
    the ground truth uses none). That function is held out of this turn, so the call names a tool not offered.

    Args:
        entry: The entry.
        turn_index: Zero-based turn index.

    Returns:
        The call, or None.

    Raises:
        ReplayError: The turn index is out of range.
    """
    turn = _turn(entry, turn_index)
    if turn_index + 1 >= len(entry.turns):
        return None
    holdout = entry.turns[turn_index + 1]
    missing = [name for name in holdout.restored if name not in turn.tools]
    if not holdout.is_holdout or not missing:
        return None
    used = next((call for call in holdout.calls if call.method in missing), None)
    if used is None:
        return ModelToolCall(adversarial_call_id(entry.id, turn_index), missing[0], {})
    return ModelToolCall(adversarial_call_id(entry.id, turn_index), used.method, _arguments(used))


def replayable(entry: Entry) -> bool:
    """Tell whether every ground-truth call of an entry uses a tool its turn offers.

    Args:
        entry: The entry.

    Returns:
        False for ``multi_turn_miss_func_49`` (and any entry with :attr:`~settled_bfcl.Entry.unoffered_calls`).
    """
    return not entry.unoffered_calls


def replayable_entries(entries: Iterable[Entry]) -> tuple[Entry, ...]:
    """Return the entries the replay model can replay, in order.

    Args:
        entries: A corpus or any entries.

    Returns:
        The replayable ones.
    """
    return tuple(entry for entry in entries if replayable(entry))


def _turn(entry: Entry, turn_index: int) -> Turn:
    if isinstance(turn_index, bool) or not isinstance(turn_index, int) or not 0 <= turn_index < len(entry.turns):
        raise ReplayError(
            f"turn_index {turn_index!r} is out of range for entry {entry.id!r} (turns 0..{len(entry.turns) - 1})"
        )
    return entry.turns[turn_index]


def _arguments(call: GroundTruthCall) -> dict[str, JsonValue]:
    return copy.deepcopy(dict(call.arguments))


def _model_call(call: GroundTruthCall) -> ModelToolCall:
    return ModelToolCall(call.call_id, call.method, _arguments(call))


def _cuts(mode: ReplayMode, seed: int, entry_id: str, turn_index: int, count: int) -> list[int]:
    """Return the chunk boundaries of ``count`` ground-truth calls: ``[0, ..., count]``."""
    if count == 0:
        return [0]
    if mode is ReplayMode.ONE_CALL:
        return list(range(count + 1))
    if mode is ReplayMode.BATCH:
        return [0, count]
    # A string seed is hashed with SHA-512 by random.seed (version 2): the same in every process.
    rng = random.Random(f"settled-bfcl-replay:{seed}:{entry_id}:{turn_index}")
    return [0, *(i for i in range(1, count) if rng.random() < 0.5), count]


def _describe(message: object) -> str:
    text = repr(message)
    return text if len(text) <= 200 else text[:197] + "..."


class ReplayModel:
    """The replay model provider: pure and stateless (see the module docstring).

    Example::

        model = ReplayModel(load_corpus("base"), ReplayMode.RANDOM_CHUNKS, seed=7)
        history: list[Message] = [UserMessage(model.user_text("multi_turn_base_0", 0))]
        response = model.respond("multi_turn_base_0", 0, history)
    """

    def __init__(
        self,
        corpus: Corpus | Iterable[Entry],
        mode: ReplayMode | str = ReplayMode.ONE_CALL,
        *,
        seed: int = 0,
        adversarial: bool = False,
        entry_id_for: Callable[[str], str] | None = None,
    ) -> None:
        """Index the entries to replay.

        Args:
            corpus: A corpus, or entries of several categories.
            mode: How calls are grouped into responses (a :class:`ReplayMode` or its value).
            seed: The seed of :attr:`ReplayMode.RANDOM_CHUNKS` (ignored by the other modes).
            adversarial: Call the missing function in the turn before each miss_func holdout turn.
            entry_id_for: Maps a conversation id to its entry id; the conversation id *is* the entry id when None.

        Raises:
            ReplayError: ``mode`` is not a replay mode, ``seed`` is not an int, or two entries share an id.
        """
        try:
            self._mode = ReplayMode(mode)
        except ValueError:
            known = ", ".join(m.value for m in ReplayMode)
            raise ReplayError(f"mode {mode!r} is not a replay mode; known: {known}") from None
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ReplayError(f"seed {seed!r} must be an int")
        self._seed = seed
        self._adversarial = adversarial
        self._entry_id_for = entry_id_for
        entries: dict[str, Entry] = {}
        for entry in corpus:
            if entry.id in entries:
                raise ReplayError(f"corpus: entry id {entry.id!r} appears twice")
            entries[entry.id] = entry
        self._entries: Mapping[str, Entry] = entries

    @property
    def mode(self) -> ReplayMode:
        """How calls are grouped into responses."""
        return self._mode

    @property
    def seed(self) -> int:
        """The chunking seed."""
        return self._seed

    @property
    def adversarial(self) -> bool:
        """Whether the model calls not-offered tools in the turns before miss_func holdout turns."""
        return self._adversarial

    def entry(self, conversation_id: str) -> Entry:
        """Return the entry a conversation replays.

        Args:
            conversation_id: The conversation.

        Returns:
            The entry.

        Raises:
            ReplayError: No entry maps to the conversation.
        """
        entry_id = conversation_id if self._entry_id_for is None else self._entry_id_for(conversation_id)
        entry = self._entries.get(entry_id)
        if entry is None:
            raise ReplayError(
                f"conversation_id {conversation_id!r} maps to entry {entry_id!r}, which is not in the replay corpus"
            )
        return entry

    def user_text(self, conversation_id: str, turn_index: int) -> str:
        """Return the user text a submission carries (BFCL's substitute text in a holdout turn).

        Args:
            conversation_id: The conversation.
            turn_index: The submission's turn.

        Returns:
            The text.
        """
        return _turn(self.entry(conversation_id), turn_index).user_text

    def tools(self, conversation_id: str, turn_index: int) -> tuple[ToolDoc, ...]:
        """Return the tool docs a submission offers (a miss_func turn lacks its held-out functions).

        Args:
            conversation_id: The conversation.
            turn_index: The submission's turn.

        Returns:
            The docs, in BFCL's order.
        """
        entry = self.entry(conversation_id)
        _turn(entry, turn_index)
        return entry.tools_for_turn(turn_index)

    def script(self, conversation_id: str, turn_index: int) -> TurnScript:
        """Return the model's plan for a turn (the same for every call with the same mode, seed and turn).

        Args:
            conversation_id: The conversation.
            turn_index: The submission's turn.

        Returns:
            The plan.

        Raises:
            ReplayError: Unknown conversation or turn out of range.
            UnreplayableEntryError: The entry calls a tool its turn does not offer.
        """
        entry = self.entry(conversation_id)
        turn = _turn(entry, turn_index)
        if entry.unoffered_calls:
            raise UnreplayableEntryError(entry.id, [call.call_id for call in entry.unoffered_calls])
        cuts = _cuts(self._mode, self._seed, entry.id, turn_index, len(turn.calls))
        calls = [_model_call(call) for call in turn.calls]
        chunks = [tuple(calls[start:end]) for start, end in itertools.pairwise(cuts)]
        if self._adversarial:
            bad = adversarial_call(entry, turn_index)
            if bad is not None:
                chunks.insert(0, (bad,))
        return TurnScript(entry.id, turn_index, tuple(chunks), final_reply_text(entry, turn_index))

    def respond(self, conversation_id: str, turn_index: int, history: Sequence[Message]) -> ModelResponse:
        """Answer one model request of a submission.

        The position is the number of tool results after the last user message; the answer is the rest of the
        chunk that holds the call at that position, or the final text once every call has a result.

        Args:
            conversation_id: The conversation (maps to an entry).
            turn_index: The submission's turn (submission k = turn k).
            history: The messages the runtime gives the model: the turn's user message, then the assistant's tool
                calls and the tool results in order (earlier turns may precede the user message; they are ignored).

        Returns:
            The next tool calls, or the final text.

        Raises:
            ReplayError: Unknown conversation or turn out of range.
            UnreplayableEntryError: The entry calls a tool its turn does not offer.
            ReplayHistoryError: The history does not fit the turn (no or another user message, an unexpected call
                or result id, a result before its call, a final text already given).
        """
        script = self.script(conversation_id, turn_index)
        entry = self.entry(conversation_id)
        expected_text = entry.turns[turn_index].user_text
        start = next((i for i in range(len(history) - 1, -1, -1) if isinstance(history[i], UserMessage)), None)
        where = f"conversation {conversation_id!r} turn {turn_index}"
        if start is None:
            raise ReplayHistoryError(f"{where}: the history has no user message")
        opening = history[start]
        assert isinstance(opening, UserMessage)
        if opening.text != expected_text:
            raise ReplayHistoryError(
                f"{where}: history[{start}] is the user message {opening.text[:80]!r}, but entry {entry.id!r} turn "
                f"{turn_index} says {expected_text[:80]!r}"
            )
        planned = script.calls
        called = 0
        answered = 0
        denied: list[str] = []
        for index in range(start + 1, len(history)):
            message = history[index]
            if isinstance(message, AssistantToolCalls):
                for call in message.calls:
                    if called >= len(planned) or call.call_id != planned[called].call_id:
                        want = planned[called].call_id if called < len(planned) else "no further call"
                        raise ReplayHistoryError(
                            f"{where}: history[{index}] has tool call {call.call_id!r} where the plan has {want}"
                        )
                    if call.tool_name != planned[called].tool_name or call.arguments != planned[called].arguments:
                        raise ReplayHistoryError(
                            f"{where}: history[{index}] call {call.call_id!r} is {call.tool_name}({call.arguments!r}), "
                            f"the plan has {planned[called].tool_name}({planned[called].arguments!r})"
                        )
                    called += 1
            elif isinstance(message, ToolResultMessage):
                if answered >= called or message.call_id != planned[answered].call_id:
                    want = planned[answered].call_id if answered < called else "no result (no call is pending)"
                    raise ReplayHistoryError(
                        f"{where}: history[{index}] is a result for call {message.call_id!r}; expected {want}"
                    )
                if parse_denial(message.content) is not None:
                    denied.append(message.call_id)  # a denial is an answer: the plan goes on (_approvals docstring)
                answered += 1
            elif isinstance(message, AssistantText):
                raise ReplayHistoryError(
                    f"{where}: history[{index}] is a final text already given for this turn: {_describe(message)}"
                )
            else:
                raise ReplayHistoryError(f"{where}: history[{index}] is not a message: {_describe(message)}")
        if answered == len(planned):
            return ModelResponse(text=final_reply_text(entry, turn_index, denied) if denied else script.final_text)
        offset = 0
        for chunk in script.chunks:
            if offset + len(chunk) > answered:
                return ModelResponse(tool_calls=tuple(chunk[answered - offset :]))
            offset += len(chunk)
        raise AssertionError("unreachable: answered < len(planned)")  # pragma: no cover
