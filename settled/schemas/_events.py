"""Pydantic mirrors of settled's Avro records (docs/design.md §2, §3, §4, §5, §7; issue 4 item 1).

Every model here corresponds one to one with a named Avro type in ``settled/schemas/avsc/`` (namespace
``dev.settled.v1``): same field names in the same order, ``T | None = None`` for an Avro ``["null", T]`` union with
a ``null`` default, ``tuple[...]`` for an Avro array, `enum.StrEnum` for an Avro enum, `datetime.datetime` (aware,
UTC, millisecond precision) for ``timestamp-millis``, `bytes` for ``bytes``. A unit test checks the correspondence.

Conventions:
    * Ids are opaque strings.
    * JSON values are RFC 8785 canonical JSON text in fields named ``*_json`` (checked canonical on construction),
      each with a ``*_digest`` (`settled.schemas.json_digest`) where the record carries one.
    * A decision record that answers an inbox record carries ``input_ref`` = the inbox record's topic, partition and
      offset (docs/design.md §3: every consumed inbox record yields exactly one log record carrying its offset).
    * Times are converted to UTC and truncated to whole milliseconds on construction, which is what the wire holds.

Models are frozen and reject unknown fields. The codec (`settled.schemas`'s ``encode``/``decode``) converts them to
and from Avro; ``to_avro()`` / ``from_avro()`` are the dict forms it uses.
"""

from __future__ import annotations

import enum
from datetime import UTC, datetime
from typing import Annotated, Any, ClassVar, Self

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, model_validator

from settled.schemas._canonical import canonical_json, canonicalize_json_text, json_digest

__all__ = [
    "AVRO_NAMESPACE",
    "COMMAND_TYPES",
    "INBOX_TYPES",
    "LOG_EVENT_TYPES",
    "RESULT_TOO_LARGE",
    "SCHEMA_VERSION",
    "TOPIC_RECORD_TYPES",
    "AbortRecorded",
    "AbortRequested",
    "AccessGranted",
    "AccessLevel",
    "AccessRevoked",
    "ApprovalDecided",
    "AttemptInterrupted",
    "AttemptStarted",
    "AvroRecord",
    "CanonicalJson",
    "CommandKind",
    "CommandRejectReason",
    "CommandRejected",
    "DecideApproval",
    "DeclaredToolCall",
    "DeltaKind",
    "Digest",
    "EffectKind",
    "EffectRecorded",
    "Genesis",
    "GrantAccess",
    "InboxRecord",
    "InputApplied",
    "InputQuarantined",
    "InputRef",
    "LanePolicy",
    "LaneSet",
    "LifecycleEvent",
    "LogEvent",
    "ModelResponseCompleted",
    "ModelResponseDelta",
    "ModelResponseInterrupted",
    "OwnershipClaimed",
    "QuarantineReason",
    "QuarantineRecord",
    "Receipt",
    "ReceiptOutcome",
    "RecoveryDecision",
    "RecoveryDecisionKind",
    "RequestKind",
    "ResolutionKind",
    "ResolveUnknown",
    "RetrySubmission",
    "RevokeAccess",
    "SendSignal",
    "SetLane",
    "Settlement",
    "SettlementOutcome",
    "SettlementRecord",
    "SignalReceived",
    "SteerRun",
    "SteeringDelivered",
    "SteeringReceived",
    "StepRecorded",
    "StepRetryScheduled",
    "SubmissionAdmitted",
    "SubmissionDuplicate",
    "SubmissionPayload",
    "SubmissionProposed",
    "SubmissionReady",
    "SubmissionRejectReason",
    "SubmissionRejected",
    "SubmissionRetryScheduled",
    "SubmissionsJoined",
    "ToolCallPrepared",
    "ToolCallRefused",
    "ToolCallSettled",
    "ToolCallUnknown",
    "ToolError",
    "UnknownResolved",
    "Usage",
    "UtcMillis",
    "WaitKind",
    "WaitOutcome",
    "WaitRequested",
    "WaitResolved",
    "payload_digest",
]

AVRO_NAMESPACE = "dev.settled.v1"
"""Namespace of every settled Avro type."""

SCHEMA_VERSION = 2
"""Version of the schemas in ``settled/schemas/avsc/``; earlier versions live in ``avsc/history/v<N>/``."""

RESULT_TOO_LARGE = "result_too_large"
"""`ToolError.type` of a tool result over the size limit; the settlement then carries only the result's digest."""


def _utc_millis(value: datetime) -> datetime:
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"datetime must be timezone-aware (timestamp-millis is UTC), got naive {value.isoformat()}")
    value = value.astimezone(UTC)
    return value.replace(microsecond=value.microsecond - value.microsecond % 1000)


def _canonical(text: str) -> str:
    canonical = canonicalize_json_text(text)
    if canonical != text:
        raise ValueError(f"JSON text is not RFC 8785 canonical: {text[:80]!r} (canonical form: {canonical[:80]!r})")
    return text


UtcMillis = Annotated[datetime, AfterValidator(_utc_millis)]
"""A timezone-aware time, converted to UTC and truncated to milliseconds (Avro ``timestamp-millis``)."""

CanonicalJson = Annotated[str, AfterValidator(_canonical)]
"""RFC 8785 canonical JSON text (`settled.schemas.canonical_json`)."""

Digest = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
"""Lowercase hex SHA-256 of canonical JSON text (`settled.schemas.json_digest`)."""

Int32 = Annotated[int, Field(ge=-(2**31), le=2**31 - 1)]
Int64 = Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]
NonNegInt32 = Annotated[int, Field(ge=0, le=2**31 - 1)]
NonNegInt64 = Annotated[int, Field(ge=0, le=2**63 - 1)]


def _check_digest(json_text: str | None, digest: str | None, json_field: str, digest_field: str) -> None:
    if json_text is not None and digest != json_digest(json_text):
        raise ValueError(f"{digest_field}={digest!r} is not the digest of {json_field} ({json_digest(json_text)})")


# --------------------------------------------------------------------------------------------------------- enums


class ResolutionKind(enum.StrEnum):
    """How an authorized `ResolveUnknown` settles an Unknown tool call (docs/design.md §5, docs/semantics.md §3)."""

    OUTCOME_FOR_SUBMISSION = "outcome_for_submission"
    """The resolver decides the submission's outcome: Unknown → Terminalizing."""
    CALL_OUTCOME = "call_outcome"
    """The resolver supplies the call's result: Unknown → Ready, the next attempt continues with it."""
    SAFE_TO_RETRY = "safe_to_retry"
    """The resolver declares the call never took effect: Unknown → Ready, the call is prepared again."""


class SettlementOutcome(enum.StrEnum):
    """A submission's terminal outcome (DUR-012)."""

    COMPLETED = "completed"
    FAILED = "failed"
    ABORTED = "aborted"


class RecoveryDecisionKind(enum.StrEnum):
    """The recovery classifier's decision (DUR-013)."""

    RESUME = "resume"
    SAFE_RETRY = "safe_retry"
    RECONCILE = "reconcile"
    TERMINALIZE = "terminalize"
    UNKNOWN = "unknown"


class RequestKind(enum.StrEnum):
    """What a receipt answers."""

    SUBMISSION = "submission"
    COMMAND = "command"


class ReceiptOutcome(enum.StrEnum):
    """A receipt's outcome (docs/design.md §2, §4)."""

    ADMITTED = "admitted"
    DUPLICATE = "duplicate"
    REJECTED = "rejected"
    APPLIED = "applied"


class SubmissionRejectReason(enum.StrEnum):
    """Why a decodable submission was rejected (docs/design.md §4). Readers map unknown future symbols to ``other``."""

    IDEMPOTENCY_CONFLICT = "idempotency_conflict"
    """Same (principal, conversation, key) admitted earlier with another payload digest."""
    INVALID = "invalid"
    """A field is invalid (named in ``field``)."""
    DIGEST_MISMATCH = "digest_mismatch"
    """``payload_digest`` is not the digest of the canonical payload."""
    MISROUTED = "misrouted"
    """The record's key does not hash to the partition it arrived on (docs/design.md §2)."""
    UNAUTHORIZED = "unauthorized"
    OTHER = "other"
    UNKNOWN_TARGET = "unknown_target"
    BUSY = "busy"
    """The conversation's lane policy is ``reject`` and its lane is held (an active or a queued submission)."""
    """The turn names a flow run the conversation does not hold (issue 18; invented, or another conversation's)."""


class CommandKind(enum.StrEnum):
    """Which inbox command a `CommandRejected` answers."""

    ABORT = "abort"
    RESOLVE_UNKNOWN = "resolve_unknown"
    OTHER = "other"
    SIGNAL = "signal"
    APPROVAL = "approval"
    ACCESS = "access"
    RETRY = "retry"
    STEER = "steer"
    LANE = "lane"


class AccessLevel(enum.StrEnum):
    """What a principal granted access to a conversation may do (issue 20)."""

    READ = "read"
    """See the conversation and everything in it (reads); its commands and submissions are refused as if the
    conversation did not exist."""
    ACT = "act"
    """See it and act on it: submit turns, signal, approve or deny, abort, resolve (within its token's scopes)."""


class LanePolicy(enum.StrEnum):
    """What a new submission does to a busy conversation (issue 22 item 1; docs/architecture.md, Lane policies).

    A conversation's lane is chosen by the submission that opens it (``SubmissionProposed.lane``, else the app's
    default ``App(lane=...)``), recorded on that admission, and changed by a signed ``SetLane``.
    """

    QUEUE = "queue"
    """Wait behind the earlier submissions and run in sequence order (the default)."""
    JOIN = "join"
    """Be claimed by the active run at its next model boundary (issue 22 item 2)."""
    REJECT = "reject"
    """Be rejected with reason ``busy`` while the lane is held (an active or a queued submission)."""
    INTERRUPT = "interrupt"
    """Abort the running (and queued) submissions canonically, then run."""
    KEEP_NEWEST = "keep_newest"
    """Supersede the queued, not started submissions (each settles aborted ``superseded``); a running one finishes."""


class CommandRejectReason(enum.StrEnum):
    """Why a command was rejected. Readers map unknown future symbols to ``other``."""

    UNKNOWN_TARGET = "unknown_target"
    """No such submission (or call) in the conversation."""
    ALREADY_TERMINAL = "already_terminal"
    """The submission settled first; ``winning_outcome`` names the outcome that won the race (DUR-012)."""
    NOT_UNKNOWN = "not_unknown"
    """A resolution names a call that is not Unknown."""
    UNSIGNED = "unsigned"
    BAD_SIGNATURE = "bad_signature"
    UNKNOWN_KEY = "unknown_key"
    INVALID = "invalid"
    MISROUTED = "misrouted"
    UNAUTHORIZED = "unauthorized"
    OTHER = "other"
    OTHER_RUN = "other_run"
    """An approval decision names an approval id that another run derived (issue 16)."""
    STALE = "stale"
    """An approval decision for a wait that is no longer open (decided, or expired at its deadline)."""
    DIGEST_MISMATCH = "digest_mismatch"
    """An approval decision bound to other arguments than the call's (its argument digest differs)."""
    NOT_DEAD_LETTERED = "not_dead_lettered"
    """A retry names a submission that is not a dead letter (unsettled, completed, aborted or failed otherwise)."""


class QuarantineReason(enum.StrEnum):
    """Why an inbox record was quarantined (issue 4 item 6). Readers map unknown future symbols to ``other``."""

    UNDECODABLE = "undecodable"
    UNKNOWN_FINGERPRINT = "unknown_fingerprint"
    TRUNCATED = "truncated"
    OVERSIZED = "oversized"
    CONSUMER_ERROR = "consumer_error"
    OTHER = "other"


class DeltaKind(enum.StrEnum):
    """What a `ModelResponseDelta` carries (DUR-008: tool-argument deltas are never canonical)."""

    TEXT = "text"
    REASONING = "reasoning"


class EffectKind(enum.StrEnum):
    """A recorded nondeterministic effect (docs/design.md §3: ``ctx.now()`` / ``ctx.uuid()``)."""

    NOW = "now"
    UUID = "uuid"


class WaitKind(enum.StrEnum):
    """What a run waits for (issue 16): an outside event by name, a person's decision, or a call in doubt."""

    SIGNAL = "signal"
    APPROVAL = "approval"
    UNKNOWN = "unknown"
    """A call in doubt waiting for a signed resolution (DUR-009). Never written in a `WaitRequested`: its request is
    `ToolCallUnknown` + `RecoveryDecision` ``unknown``, its delivery `UnknownResolved` (docs/architecture.md, waits)."""


class WaitOutcome(enum.StrEnum):
    """How a wait was decided (issue 16)."""

    DELIVERED = "delivered"
    EXPIRED = "expired"


# ---------------------------------------------------------------------------------------------------- base


class AvroRecord(BaseModel):
    """Base of every settled record: frozen, unknown fields rejected, mirrored by a named Avro record.

    Attributes:
        AVRO_NAME: The record's Avro full name, e.g. ``"dev.settled.v1.Receipt"``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    AVRO_NAME: ClassVar[str] = ""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.AVRO_NAME = f"{AVRO_NAMESPACE}.{cls.__name__}"

    def to_avro(self) -> dict[str, Any]:
        """Return the record as the dict fastavro writes (tuples become lists, nested records dicts).

        Returns:
            A dict in Avro field order.
        """
        values = self.__dict__  # a frozen model's field values (what getattr would return, without its lookup)
        out: dict[str, Any] = {}
        for name in type(self).model_fields:
            value = values[name]
            out[name] = value if type(value) in _AS_IS else _to_avro_value(value)
        return out

    @classmethod
    def from_avro(cls, datum: dict[str, Any]) -> Self:
        """Build the model from the dict fastavro reads.

        Args:
            datum: A decoded Avro record of this type.

        Returns:
            The validated model.

        Raises:
            pydantic.ValidationError: If the dict does not satisfy the model's checks.
        """
        return cls.model_validate(datum)


_AS_IS: frozenset[type] = frozenset({str, int, bool, float, bytes, datetime, type(None)})
"""Value types `AvroRecord.to_avro` hands to fastavro unchanged without asking `_to_avro_value` (the common case)."""


def _to_avro_value(value: Any) -> Any:
    if isinstance(value, AvroRecord):
        return value.to_avro()
    if isinstance(value, tuple | list):
        return [_to_avro_value(item) for item in value]
    return value


# ---------------------------------------------------------------------------------------------- shared parts


class InputRef(AvroRecord):
    """Where a decision's inbox record was read (docs/design.md §3).

    Attributes:
        topic: The inbox topic name (namespaced).
        partition: Its partition.
        offset: The record's offset.
    """

    topic: str
    partition: NonNegInt32
    offset: NonNegInt64


class SubmissionPayload(AvroRecord):
    """The digested part of a submission (docs/design.md §4).

    The digest (`payload_digest`) is taken over the canonical JSON object
    ``{"input": <input value>, "tools_offered": [<names>]}``.

    Attributes:
        input_json: The turn's input, canonical JSON.
        tools_offered: Names of the tools offered for this turn; a call to another tool is refused (docs/design.md §5).
    """

    input_json: CanonicalJson
    tools_offered: tuple[str, ...]


def payload_digest(payload: SubmissionPayload) -> str:
    """Return the digest of a submission payload (docs/design.md §4).

    Args:
        payload: The payload.

    Returns:
        `json_digest` of the canonical JSON ``{"input": <input>, "tools_offered": [...]}``.
    """
    text = '{"input":' + payload.input_json + ',"tools_offered":' + canonical_json(list(payload.tools_offered)) + "}"
    return json_digest(text)


class ToolError(AvroRecord):
    """A tool's typed error, recorded and replayed (docs/design.md §5).

    Attributes:
        type: Error type, e.g. the exception class or ``"result_too_large"``.
        message: Human-readable message.
        non_retryable: True when the agent must not retry the call.
    """

    type: str
    message: str
    non_retryable: bool


class Usage(AvroRecord):
    """Token usage reported by a model provider.

    Attributes:
        input_tokens: Prompt tokens.
        output_tokens: Completion tokens (reasoning tokens included).
        cached_input_tokens: Prompt tokens served from the provider's cache (part of ``input_tokens``), when given
            (schema v2).
        reasoning_tokens: Completion tokens spent reasoning (part of ``output_tokens``), when given (schema v2).
    """

    input_tokens: NonNegInt64
    output_tokens: NonNegInt64
    cached_input_tokens: NonNegInt64 | None = None
    reasoning_tokens: NonNegInt64 | None = None


class DeclaredToolCall(AvroRecord):
    """A tool call declared by a complete model response (DUR-008).

    Attributes:
        call_id: The call's id.
        tool: The tool's name.
        args_json: Arguments, canonical JSON.
        args_digest: `json_digest` of ``args_json``.
    """

    call_id: str
    tool: str
    args_json: CanonicalJson
    args_digest: Digest

    @model_validator(mode="after")
    def _digest_matches(self) -> Self:
        _check_digest(self.args_json, self.args_digest, "args_json", "args_digest")
        return self


# ------------------------------------------------------------------------------------------------------- inbox


class SubmissionProposed(AvroRecord):
    """A client's proposal of one turn (topic ``settled.inbox``; docs/design.md §4).

    Attributes:
        schema_version: Schema version the writer used.
        submission_id: Client-made id (a UUID) of this proposal.
        principal: Who submits.
        conversation_id: The conversation (the record key).
        idempotency_key: Client idempotency key; scope (principal, conversation).
        payload: The digested payload.
        payload_digest: `payload_digest` of ``payload`` (recomputed by the owner).
        proposed_at: When the client proposed it.
        lane: The lane policy asked for the conversation this submission opens (issue 22 item 1); None: the app's
            default. Ignored on a conversation already opened (a ``SetLane`` changes it).
    """

    schema_version: NonNegInt32 = SCHEMA_VERSION
    submission_id: str
    principal: str
    conversation_id: str
    idempotency_key: str
    payload: SubmissionPayload
    payload_digest: Digest
    proposed_at: UtcMillis
    lane: LanePolicy | None = None


class AbortRequested(AvroRecord):
    """A request to abort a submission (topic ``settled.inbox``; DUR-012).

    Attributes:
        schema_version: Schema version the writer used.
        command_id: Client-made id of this command.
        principal: Who asks.
        conversation_id: The conversation (the record key).
        submission_id: The submission to abort.
        reason: Free text.
        requested_at: When it was requested.
    """

    schema_version: NonNegInt32 = SCHEMA_VERSION
    command_id: str
    principal: str
    conversation_id: str
    submission_id: str
    reason: str | None = None
    requested_at: UtcMillis


class SendSignal(AvroRecord):
    """A signal for a run (topic ``settled.inbox``; issue 16): consumed by the run's next ``ctx.signal(name)``.

    Attributes:
        schema_version: Schema version the writer used.
        command_id: The signal's id, made by the client: a repeat is answered as a duplicate (deduped by it).
        principal: Who sends it.
        conversation_id: The conversation (the record key).
        submission_id: The run (an agent run's id is its submission id).
        name: The signal's name.
        payload_json: The payload, canonical JSON.
        sent_at: When it was sent.
    """

    schema_version: NonNegInt32 = SCHEMA_VERSION
    command_id: str
    principal: str
    conversation_id: str
    submission_id: str
    name: str
    payload_json: CanonicalJson
    sent_at: UtcMillis


class SteerRun(AvroRecord):
    """A steering message for an active run (topic ``settled.inbox``; issue 22 item 3): its model sees it next.

    Attributes:
        schema_version: Schema version the writer used.
        command_id: The message's id, made by the client: a repeat is answered as a duplicate (deduped by it).
        principal: Who sends it.
        conversation_id: The conversation (the record key).
        submission_id: The run (an agent run's id is its submission id).
        text: The message, shown to the run's model as a user message at its next model call.
        sent_at: When it was sent.
    """

    schema_version: NonNegInt32 = SCHEMA_VERSION
    command_id: str
    principal: str
    conversation_id: str
    submission_id: str
    text: str
    sent_at: UtcMillis


class SetLane(AvroRecord):
    """A request to change a conversation's lane policy from now on (topic ``settled.inbox``; issue 22 item 1).

    Attributes:
        schema_version: Schema version the writer used.
        command_id: Client-made id of this command: a repeat is answered as a duplicate.
        principal: Who asks: the conversation's opener or a principal granted ``act``.
        conversation_id: The conversation (the record key).
        lane: The lane policy from now on.
        requested_at: When it was requested.
    """

    schema_version: NonNegInt32 = SCHEMA_VERSION
    command_id: str
    principal: str
    conversation_id: str
    lane: LanePolicy
    requested_at: UtcMillis


class ResolveUnknown(AvroRecord):
    """An authorized, Ed25519-signed resolution of an Unknown tool call (on ``settled.inbox``; docs/design.md §4, §5).

    Attributes:
        schema_version: Schema version the writer used.
        command_id: Client-made id of this command.
        principal: Who resolves.
        conversation_id: The conversation (the record key).
        submission_id: The submission whose call is Unknown.
        call_id: The Unknown call.
        kind: How it is resolved.
        outcome: For ``outcome_for_submission``: the submission's outcome.
        result_json: For ``call_outcome``: the call's result, canonical JSON; for ``outcome_for_submission``: the
            reply, optional.
        key_id: Id of the signing key (workers hold the public keys).
        signature: Ed25519 signature over `signing_bytes`.
        requested_at: When it was requested.
    """

    schema_version: NonNegInt32 = SCHEMA_VERSION
    command_id: str
    principal: str
    conversation_id: str
    submission_id: str
    call_id: str
    kind: ResolutionKind
    outcome: SettlementOutcome | None = None
    result_json: CanonicalJson | None = None
    key_id: str
    signature: bytes
    requested_at: UtcMillis

    @model_validator(mode="after")
    def _kind_fields(self) -> Self:
        if self.kind is ResolutionKind.OUTCOME_FOR_SUBMISSION and self.outcome is None:
            raise ValueError("outcome is required when kind is outcome_for_submission")
        if self.kind is ResolutionKind.CALL_OUTCOME and self.result_json is None:
            raise ValueError("result_json is required when kind is call_outcome")
        if self.kind is not ResolutionKind.OUTCOME_FOR_SUBMISSION and self.outcome is not None:
            raise ValueError(f"outcome must be absent when kind is {self.kind.value}, got {self.outcome.value}")
        return self

    def signing_bytes(self) -> bytes:
        """Return the bytes that the signature covers: every field but ``schema_version`` and ``signature``.

        The message is the UTF-8 canonical JSON object of those fields, ``requested_at`` as integer epoch
        milliseconds and absent optionals as ``null``.

        Returns:
            The message to sign or verify.
        """
        return self.signing_message(
            command_id=self.command_id,
            principal=self.principal,
            conversation_id=self.conversation_id,
            submission_id=self.submission_id,
            call_id=self.call_id,
            kind=self.kind,
            outcome=self.outcome,
            result_json=self.result_json,
            key_id=self.key_id,
            requested_at=self.requested_at,
        )

    @staticmethod
    def signing_message(
        *,
        command_id: str,
        principal: str,
        conversation_id: str,
        submission_id: str,
        call_id: str,
        kind: ResolutionKind,
        outcome: SettlementOutcome | None,
        result_json: str | None,
        key_id: str,
        requested_at: datetime,
    ) -> bytes:
        """Build the message a resolver signs before the record exists (see `signing_bytes`).

        Args:
            command_id: As in the record.
            principal: As in the record.
            conversation_id: As in the record.
            submission_id: As in the record.
            call_id: As in the record.
            kind: As in the record.
            outcome: As in the record.
            result_json: As in the record.
            key_id: As in the record.
            requested_at: As in the record (aware; truncated to milliseconds).

        Returns:
            The UTF-8 canonical JSON message.
        """
        millis = _utc_millis(requested_at)
        return canonical_json(
            {
                "call_id": call_id,
                "command_id": command_id,
                "conversation_id": conversation_id,
                "key_id": key_id,
                "kind": kind.value,
                "outcome": None if outcome is None else outcome.value,
                "principal": principal,
                "requested_at": _epoch_ms(millis),
                "result_json": result_json,
                "submission_id": submission_id,
            }
        ).encode("utf-8")


class DecideApproval(AvroRecord):
    """An Ed25519-signed approval or denial of a run's approval wait (for ``settled.inbox``; issue 16 item 4).

    Bound to one approval (`settled.protocol.approval_id_for`) and to the digest of the arguments the approver saw;
    "by" is the signing key id, verified by the worker against ``App.approver_keys``.

    Attributes:
        schema_version: Schema version the writer used.
        command_id: Client-made id of this decision: a repeat is answered as a duplicate.
        principal: Who decides.
        conversation_id: The conversation (the record key).
        submission_id: The run (an agent run's id is its submission id).
        approval_id: The approval decided (derived from the run and the ordinal or tool call).
        args_digest: `json_digest` of the canonical arguments the approver saw.
        approved: True to approve, False to deny.
        reason: Why, as the approver says, or None.
        key_id: Id of the signing key (workers hold the public keys in ``App.approver_keys``).
        signature: Ed25519 signature over `signing_bytes`.
        requested_at: When it was requested.
    """

    schema_version: NonNegInt32 = SCHEMA_VERSION
    command_id: str
    principal: str
    conversation_id: str
    submission_id: str
    approval_id: str
    args_digest: Digest
    approved: bool
    reason: str | None = None
    key_id: str
    signature: bytes
    requested_at: UtcMillis

    def signing_bytes(self) -> bytes:
        """Return the bytes that the signature covers: every field but ``schema_version`` and ``signature``.

        The message is the UTF-8 canonical JSON object of those fields, ``requested_at`` as integer epoch
        milliseconds and an absent reason as ``null``.

        Returns:
            The message to sign or verify.
        """
        return canonical_json(
            {
                "approval_id": self.approval_id,
                "approved": self.approved,
                "args_digest": self.args_digest,
                "command_id": self.command_id,
                "conversation_id": self.conversation_id,
                "key_id": self.key_id,
                "principal": self.principal,
                "reason": self.reason,
                "requested_at": _epoch_ms(self.requested_at),
                "submission_id": self.submission_id,
            }
        ).encode("utf-8")


class RetrySubmission(AvroRecord):
    """An Ed25519-signed request to admit a dead letter's payload again as a new submission (``settled.inbox``).

    Issue 22 item 4: the owner admits the dead-lettered submission's input and offered tools once more as the
    submission ``new_submission_id`` (the conversation's next sequence, ``retry_of`` naming the original, whose
    failed settlement stands). Verified by the worker against ``App.resolver_keys``, like `ResolveUnknown`.

    Attributes:
        schema_version: Schema version the writer used.
        command_id: Client-made id of this command; also the new submission's idempotency key.
        principal: Who retries.
        conversation_id: The conversation (the record key).
        submission_id: The dead-lettered submission to retry.
        new_submission_id: Client-made id of the submission it admits.
        key_id: Id of the signing key (workers hold the public keys).
        signature: Ed25519 signature over `signing_bytes`.
        requested_at: When it was requested.
    """

    schema_version: NonNegInt32 = SCHEMA_VERSION
    command_id: str
    principal: str
    conversation_id: str
    submission_id: str
    new_submission_id: str
    key_id: str
    signature: bytes
    requested_at: UtcMillis

    def signing_bytes(self) -> bytes:
        """Return the bytes that the signature covers: every field but ``schema_version`` and ``signature``.

        Returns:
            The message to sign or verify (`signing_message`).
        """
        return self.signing_message(
            command_id=self.command_id,
            principal=self.principal,
            conversation_id=self.conversation_id,
            submission_id=self.submission_id,
            new_submission_id=self.new_submission_id,
            key_id=self.key_id,
            requested_at=self.requested_at,
        )

    @staticmethod
    def signing_message(
        *,
        command_id: str,
        principal: str,
        conversation_id: str,
        submission_id: str,
        new_submission_id: str,
        key_id: str,
        requested_at: datetime,
    ) -> bytes:
        """Build the message a resolver signs before the record exists (see `signing_bytes`).

        The UTF-8 canonical JSON object of the fields, ``requested_at`` as integer epoch milliseconds, and
        ``"command": "retry_submission"`` (so no other signed command's message is ever the same).

        Args:
            command_id: As in the record.
            principal: As in the record.
            conversation_id: As in the record.
            submission_id: As in the record.
            new_submission_id: As in the record.
            key_id: As in the record.
            requested_at: As in the record (aware; truncated to milliseconds).

        Returns:
            The UTF-8 canonical JSON message.
        """
        millis = _utc_millis(requested_at)
        return canonical_json(
            {
                "command": "retry_submission",
                "command_id": command_id,
                "conversation_id": conversation_id,
                "key_id": key_id,
                "new_submission_id": new_submission_id,
                "principal": principal,
                "requested_at": _epoch_ms(millis),
                "submission_id": submission_id,
            }
        ).encode("utf-8")


class GrantAccess(AvroRecord):
    """A request to grant another principal access to a conversation (topic ``settled.inbox``; issue 20).

    Attributes:
        schema_version: Schema version the writer used.
        command_id: Client-made id of this command: a repeat is answered as a duplicate.
        principal: Who grants (the conversation's opener, or an admin).
        conversation_id: The conversation (the record key).
        grantee: The principal granted access.
        access: What the grantee may do: read, or act (read, submit and send commands).
        requested_at: When it was requested.
    """

    schema_version: NonNegInt32 = SCHEMA_VERSION
    command_id: str
    principal: str
    conversation_id: str
    grantee: str
    access: AccessLevel
    requested_at: UtcMillis


class RevokeAccess(AvroRecord):
    """A request to revoke a principal's granted access to a conversation (topic ``settled.inbox``; issue 20).

    Attributes:
        schema_version: Schema version the writer used.
        command_id: Client-made id of this command: a repeat is answered as a duplicate.
        principal: Who revokes (the conversation's opener, or an admin).
        conversation_id: The conversation (the record key).
        grantee: The principal whose access ends.
        requested_at: When it was requested.
    """

    schema_version: NonNegInt32 = SCHEMA_VERSION
    command_id: str
    principal: str
    conversation_id: str
    grantee: str
    requested_at: UtcMillis


def _epoch_ms(value: datetime) -> int:
    delta = value - datetime(1970, 1, 1, tzinfo=UTC)
    return delta.days * 86_400_000 + delta.seconds * 1000 + delta.microseconds // 1000


# ------------------------------------------------------------------------------------------------- log events


class Genesis(AvroRecord):
    """The record that fixes the partition count (docs/design.md §2).

    Attributes:
        namespace: The deployment namespace.
        partition_count: Partition count of every co-partitioned topic.
        created_at: When the topics were provisioned.
    """

    namespace: str
    partition_count: Annotated[int, Field(ge=1, le=2**31 - 1)]
    created_at: UtcMillis


class OwnershipClaimed(AvroRecord):
    """A partition owner's claim, claim step 5 (docs/design.md §3).

    Attributes:
        partition: The claimed partition.
        owner_epoch: Logical owner epoch (previous + 1); a batch below the latest claim is rejected by the fold.
        worker_id: The claiming worker.
        claimed_at: When.
    """

    partition: NonNegInt32
    owner_epoch: NonNegInt64
    worker_id: str
    claimed_at: UtcMillis


class SubmissionAdmitted(AvroRecord):
    """A submission admitted to the conversation's queue (DUR-001, docs/design.md §4).

    Attributes:
        submission_id: The proposal's id.
        conversation_id: The conversation.
        principal: Who submitted.
        idempotency_key: The client key.
        payload_digest: Digest of the canonical payload, recomputed by the owner.
        submission_seq: Conversation-local submission sequence (1, 2, ...).
        tools_offered: Tool names offered for the turn.
        input_json: The turn's input, canonical JSON.
        input_ref: The inbox record this decides.
        flow_run_id: The flow run of this turn (issue 18): minted by the owner for a turn that opens one, the
            addressed run for a turn that resumes one.
        retry_of: For a submission admitted by a `RetrySubmission` (issue 22 item 4): the dead letter it retries.
        lane: On the admission that opens the conversation (issue 22 item 1): its lane policy, the proposal's else
            the app's default; None on every later admission.
    """

    submission_id: str
    conversation_id: str
    principal: str
    idempotency_key: str
    payload_digest: Digest
    submission_seq: NonNegInt64
    tools_offered: tuple[str, ...]
    input_json: CanonicalJson
    input_ref: InputRef | None = None
    flow_run_id: str | None = None
    retry_of: str | None = None
    lane: LanePolicy | None = None


class SubmissionReady(AvroRecord):
    """An admitted submission is materialized and ready to run (DUR-001).

    Attributes:
        submission_id: The submission.
        submission_seq: Its submission sequence.
    """

    submission_id: str
    submission_seq: NonNegInt64


class SubmissionRejected(AvroRecord):
    """A decodable submission rejected with a reason (docs/design.md §4).

    Attributes:
        submission_id: The proposal's id.
        idempotency_key: The client key.
        reason: Reason code.
        field: The offending field, when one is.
        detail: Human-readable detail.
        input_ref: The inbox record this decides.
    """

    submission_id: str
    idempotency_key: str
    reason: SubmissionRejectReason
    field: str | None = None
    detail: str
    input_ref: InputRef | None = None


class SubmissionDuplicate(AvroRecord):
    """A proposal whose key and digest match an admitted submission (docs/design.md §4).

    Attributes:
        submission_id: The duplicate proposal's id.
        original_submission_id: The admitted submission it repeats.
        idempotency_key: The client key.
        input_ref: The inbox record this decides.
    """

    submission_id: str
    original_submission_id: str
    idempotency_key: str
    input_ref: InputRef | None = None


class InputQuarantined(AvroRecord):
    """An inbox record set aside to ``settled.quarantine`` (issue 4 item 6).

    Attributes:
        reason: Reason code.
        detail: Human-readable detail (e.g. the decode error).
        raw_size_bytes: Size of the record's value.
        input_ref: The inbox record this decides.
    """

    reason: QuarantineReason
    detail: str
    raw_size_bytes: NonNegInt64
    input_ref: InputRef | None = None


class AbortRecorded(AvroRecord):
    """An abort accepted for a nonterminal submission (DUR-012).

    Attributes:
        command_id: The `AbortRequested` command's id.
        submission_id: The submission to abort.
        principal: Who asked.
        reason: Free text from the request.
        input_ref: The inbox record this decides.
    """

    command_id: str
    submission_id: str
    principal: str
    reason: str | None = None
    input_ref: InputRef | None = None


class SignalReceived(AvroRecord):
    """A signal accepted for an unsettled run (issue 16): canonical, it waits for the run's wait with its name.

    Attributes:
        command_id: The signal's id (`SendSignal.command_id`).
        submission_id: The run.
        name: The signal's name.
        payload_json: The payload, canonical JSON.
        principal: Who sent it.
        input_ref: The inbox record this decides.
    """

    command_id: str
    submission_id: str
    name: str
    payload_json: CanonicalJson
    principal: str
    input_ref: InputRef | None = None


class SteeringReceived(AvroRecord):
    """A steering message accepted for an unsettled run (issue 22 item 3): canonical before the run sees it.

    The run's steering stream is these records in log order; its next model call sees the ones no earlier call saw
    (`SteeringDelivered`).

    Attributes:
        command_id: The message's id (`SteerRun.command_id`).
        submission_id: The run.
        text: The message.
        principal: Who sent it.
        input_ref: The inbox record this decides.
    """

    command_id: str
    submission_id: str
    text: str
    principal: str
    input_ref: InputRef | None = None


class LaneSet(AvroRecord):
    """A conversation's lane policy changed by a `SetLane` (issue 22 item 1): submissions decided after it follow it.

    Attributes:
        command_id: The `SetLane` command's id.
        principal: Who asked.
        lane: The lane policy from now on.
        input_ref: The inbox record this decides.
    """

    command_id: str
    principal: str
    lane: LanePolicy
    input_ref: InputRef | None = None


class SteeringDelivered(AvroRecord):
    """Which steering messages a model call was the first to see (issue 22 item 3); rides with its response.

    Appended in the same commit as the call's `ModelResponseCompleted`: replay shows a recorded call the same
    messages, and a call made again after a crash before its response was canonical sees them again.

    Attributes:
        submission_id: The submission.
        attempt_id: The attempt that made the call.
        response_ordinal: The model call's ordinal (its `ModelResponseCompleted.response_ordinal`).
        command_ids: The steering messages (`SteeringReceived.command_id`) first shown to it, in log order.
    """

    submission_id: str
    attempt_id: str
    response_ordinal: NonNegInt64
    command_ids: tuple[str, ...]


class SubmissionsJoined(AvroRecord):
    """Queued submissions an active run took in at a model boundary (issue 22 item 2, DUR-016).

    Decided by the owner (`settled.protocol.join`) when the run asks before a model call it makes live, and committed
    before that call is made: the joined submissions' inputs reach the model only once this is canonical, and a
    later attempt of the run reads which ones it holds from the log, never from what is queued then. Each joined
    submission then settles with its host, in the host's batch (`Settlement.joined_to`).

    Attributes:
        submission_id: The host: the running submission that takes them in.
        attempt_id: The host's attempt at whose model boundary they were joined.
        response_ordinal: The ordinal of the model call they reach first.
        joined_ids: The joined submissions, in submission-sequence order.
    """

    submission_id: str
    attempt_id: str
    response_ordinal: NonNegInt64
    joined_ids: tuple[str, ...]


class CommandRejected(AvroRecord):
    """A command rejected with a reason (docs/design.md §2, §4).

    Attributes:
        command_id: The command's id.
        command_kind: Which command.
        submission_id: Its target submission, when it names one.
        reason: Reason code.
        detail: Human-readable detail.
        winning_outcome: For ``already_terminal``: the terminal outcome that won the race (DUR-012).
        input_ref: The inbox record this decides.
    """

    command_id: str
    command_kind: CommandKind
    submission_id: str | None = None
    reason: CommandRejectReason
    detail: str
    winning_outcome: SettlementOutcome | None = None
    input_ref: InputRef | None = None


class AttemptStarted(AvroRecord):
    """An attempt of a submission starts (docs/design.md §5).

    Attributes:
        submission_id: The submission.
        attempt: Attempt number (1, 2, ...).
        attempt_id: The attempt's id.
        owner_epoch: Logical owner epoch of the worker running it.
    """

    submission_id: str
    attempt: Annotated[int, Field(ge=1, le=2**31 - 1)]
    attempt_id: str
    owner_epoch: NonNegInt64


class AttemptInterrupted(AvroRecord):
    """An attempt stopped by an ownership change the log explains, e.g. a graceful revoke (docs/design.md §5).

    Attributes:
        submission_id: The submission.
        attempt_id: The attempt.
        reason: Why, e.g. ``"graceful_revoke"``.
    """

    submission_id: str
    attempt_id: str
    reason: str


class InputApplied(AvroRecord):
    """A submission's input entered the conversation history for an attempt.

    Attributes:
        submission_id: The submission.
        attempt_id: The attempt.
        input_digest: `json_digest` of the submission's ``input_json``.
    """

    submission_id: str
    attempt_id: str
    input_digest: Digest


class ModelResponseDelta(AvroRecord):
    """A streamed piece of a model response (DUR-008: text and reasoning only, never tool arguments).

    Attributes:
        submission_id: The submission.
        attempt_id: The attempt.
        response_ordinal: Ordinal of the model call within the attempt.
        delta_index: Position of this delta within the response.
        kind: Text or reasoning.
        text: The delta's text.
    """

    submission_id: str
    attempt_id: str
    response_ordinal: NonNegInt32
    delta_index: NonNegInt32
    kind: DeltaKind
    text: str


class ModelResponseCompleted(AvroRecord):
    """A complete model response, canonical before any tool it declares is prepared (docs/design.md §5).

    Attributes:
        submission_id: The submission.
        attempt_id: The attempt.
        response_ordinal: Ordinal of the model call within the attempt.
        provider: Provider name.
        model: Model name.
        request_id: Provider's request id, when given.
        usage: Token usage, when given.
        text: The response's text.
        tool_calls: Tool calls it declares.
        operation_id: The call's operation id, sent to the provider (stable per run, attempt and model-call
            ordinal; docs/semantics.md §9); None in records written before schema v2.
    """

    submission_id: str
    attempt_id: str
    response_ordinal: NonNegInt32
    provider: str
    model: str
    request_id: str | None = None
    usage: Usage | None = None
    text: str
    tool_calls: tuple[DeclaredToolCall, ...]
    operation_id: str | None = None


class ModelResponseInterrupted(AvroRecord):
    """A model call's try that failed after its stream began (a stream cut mid-way; issue 19).

    Recorded whatever follows (a retry of the same call, or the run's failure), so the cost of the cut try is
    visible as far as it is known. A provider reports usage in its stream's last chunk, so a cut try usually has
    none: ``usage`` is then None, meaning unknown (never zero), and ``output_chars`` says how much output arrived.

    Attributes:
        submission_id: The submission.
        attempt_id: The attempt.
        response_ordinal: Ordinal of the model call within the attempt.
        provider: Provider name.
        model: Model name asked for.
        operation_id: The call's operation id, sent to the provider.
        first_delta_index: ``delta_index`` of this try's first recorded `ModelResponseDelta`; the next try of the
            same call continues after its last, so (attempt, ordinal, delta_index) names one delta.
        delta_count: How many `ModelResponseDelta` records this try left.
        output_chars: Characters of text, reasoning and tool arguments received before the failure.
        usage: Token usage the provider reported before the failure, or None when it reported none (unknown).
        error: The failure, as raised.
    """

    submission_id: str
    attempt_id: str
    response_ordinal: NonNegInt32
    provider: str
    model: str
    operation_id: str
    first_delta_index: NonNegInt32
    delta_count: NonNegInt32
    output_chars: NonNegInt64
    usage: Usage | None = None
    error: str


class ToolCallPrepared(AvroRecord):
    """A tool call committed before it runs (docs/design.md §5).

    Attributes:
        submission_id: The submission.
        run_id: Logical run id (stable across attempts; part of the idempotency key).
        attempt_id: The attempt preparing it.
        call_id: The call's id.
        ordinal: Callsite ordinal within the run.
        tool: The tool's name.
        args_json: Arguments, canonical JSON.
        args_digest: `json_digest` of ``args_json``.
        idempotency_key: Passed to the tool so the outside world can dedupe.
        owner_epoch: Fencing token passed to the tool (docs/design.md §3).
    """

    submission_id: str
    run_id: str
    attempt_id: str
    call_id: str
    ordinal: NonNegInt32
    tool: str
    args_json: CanonicalJson
    args_digest: Digest
    idempotency_key: str
    owner_epoch: NonNegInt64

    @model_validator(mode="after")
    def _digest_matches(self) -> Self:
        _check_digest(self.args_json, self.args_digest, "args_json", "args_digest")
        return self


class ToolCallSettled(AvroRecord):
    """A tool call's recorded result or typed error (docs/design.md §5).

    Exactly one of ``result_json`` and ``error`` is present. With a result, ``result_digest`` is its digest. An
    oversized result is recorded as ``error.type == "result_too_large"`` with ``result_digest`` set and no
    ``result_json`` (issue 4 item 5).

    Attributes:
        submission_id: The submission.
        attempt_id: The attempt that ran it.
        call_id: The call.
        result_json: The result, canonical JSON.
        result_digest: `json_digest` of the result.
        error: The tool's typed error.
    """

    submission_id: str
    attempt_id: str
    call_id: str
    result_json: CanonicalJson | None = None
    result_digest: Digest | None = None
    error: ToolError | None = None

    @model_validator(mode="after")
    def _result_xor_error(self) -> Self:
        if (self.result_json is None) == (self.error is None):
            raise ValueError("exactly one of result_json and error must be present")
        if self.result_json is not None:
            _check_digest(self.result_json, self.result_digest, "result_json", "result_digest")
        elif self.error is not None and self.error.type == RESULT_TOO_LARGE and self.result_digest is None:
            raise ValueError("result_digest is required when error.type is result_too_large")
        return self


class ToolCallRefused(AvroRecord):
    """A model call to a tool not offered for the turn; nothing ran (docs/design.md §5).

    Attributes:
        submission_id: The submission.
        attempt_id: The attempt.
        call_id: The call.
        tool: The requested tool name.
        args_digest: Digest of the requested arguments.
        reason: Why, e.g. ``"not_offered"``.
    """

    submission_id: str
    attempt_id: str
    call_id: str
    tool: str
    args_digest: Digest
    reason: str


class ToolCallUnknown(AvroRecord):
    """A prepared call whose outcome cannot be known; it waits for an authorized resolution (DUR-009).

    Attributes:
        submission_id: The submission.
        call_id: The call.
        reason: Why, e.g. ``"timeout"``.
    """

    submission_id: str
    call_id: str
    reason: str


class UnknownResolved(AvroRecord):
    """A verified `ResolveUnknown` applied (docs/design.md §5).

    Attributes:
        command_id: The command's id.
        submission_id: The submission.
        call_id: The call.
        kind: How it was resolved.
        outcome: For ``outcome_for_submission``.
        result_json: The call's result (``call_outcome``) or the reply, canonical JSON.
        result_digest: `json_digest` of ``result_json``.
        principal: The resolver.
        key_id: The verified signing key.
        input_ref: The inbox record this decides.
    """

    command_id: str
    submission_id: str
    call_id: str
    kind: ResolutionKind
    outcome: SettlementOutcome | None = None
    result_json: CanonicalJson | None = None
    result_digest: Digest | None = None
    principal: str
    key_id: str
    input_ref: InputRef | None = None

    @model_validator(mode="after")
    def _digest_matches(self) -> Self:
        _check_digest(self.result_json, self.result_digest, "result_json", "result_digest")
        return self


class StepRecorded(AvroRecord):
    """A durable step's one recorded success (DUR-010).

    Attributes:
        submission_id: The submission.
        attempt_id: The attempt that recorded it.
        name: Step name.
        version: Step version.
        step_id: The step's id.
        ordinal: Callsite ordinal within the run.
        result_json: The step's result, canonical JSON.
        result_digest: `json_digest` of ``result_json``.
    """

    submission_id: str
    attempt_id: str
    name: str
    version: NonNegInt32
    step_id: str
    ordinal: NonNegInt32
    result_json: CanonicalJson
    result_digest: Digest

    @model_validator(mode="after")
    def _digest_matches(self) -> Self:
        _check_digest(self.result_json, self.result_digest, "result_json", "result_digest")
        return self


class EffectRecorded(AvroRecord):
    """A recorded ``ctx.now()`` or ``ctx.uuid()`` value (docs/design.md §3).

    Attributes:
        submission_id: The submission.
        attempt_id: The attempt.
        kind: ``now`` or ``uuid``.
        ordinal: Callsite ordinal within the run.
        value: ``now``: ISO 8601 text of an aware UTC datetime (``datetime.isoformat()``, microseconds kept);
            ``uuid``: the canonical hyphenated text.
    """

    submission_id: str
    attempt_id: str
    kind: EffectKind
    ordinal: NonNegInt32
    value: str


class Settlement(AvroRecord):
    """A submission's canonical terminal outcome (DUR-012, docs/design.md §4).

    The reply is inline (``reply_json`` + ``reply_digest``) up to the inline limit, else only ``reply_digest`` and
    ``reply_ref`` (resolved by the services).

    Attributes:
        submission_id: The submission.
        outcome: Completed, failed or aborted.
        reply_json: Final reply or return value, canonical JSON.
        reply_digest: `json_digest` of the reply.
        reply_ref: Where an over-limit reply is found.
        error_type: For failed: the error type.
        error_reason: For failed or aborted: the reason.
        attempt_count: Attempts made.
        settled_at: When.
        joined_to: For a submission joined into another run (issue 22 item 2): its host, whose outcome it shares;
            it settles in the host's batch, right after the host.
    """

    submission_id: str
    outcome: SettlementOutcome
    reply_json: CanonicalJson | None = None
    reply_digest: Digest | None = None
    reply_ref: str | None = None
    error_type: str | None = None
    error_reason: str | None = None
    attempt_count: NonNegInt32
    settled_at: UtcMillis
    joined_to: str | None = None

    @model_validator(mode="after")
    def _digest_matches(self) -> Self:
        _check_digest(self.reply_json, self.reply_digest, "reply_json", "reply_digest")
        if self.reply_ref is not None and self.reply_digest is None:
            raise ValueError("reply_digest is required with reply_ref")
        return self


class RecoveryDecision(AvroRecord):
    """The recovery classifier's recorded decision (DUR-013).

    Attributes:
        submission_id: The submission.
        attempt_id: The interrupted attempt, when one is.
        decision: The decision.
        reason: Why.
        call_ids: The calls the decision is about.
    """

    submission_id: str
    attempt_id: str | None = None
    decision: RecoveryDecisionKind
    reason: str
    call_ids: tuple[str, ...]


class StepRetryScheduled(AvroRecord):
    """A workflow step failed and will run again at ``wake_at`` (issue 17 item 3): a retry is due, never a result.

    Appended with the timed wait (`WaitRequested`, ``wait_id``) the run holds until ``wake_at``; replay never
    re-raises the error, it only counts the retries already scheduled.

    Attributes:
        submission_id: The submission.
        attempt_id: The attempt whose execution of the step failed.
        step: The workflow step's name.
        retry: Which retry this schedules (1, 2, ...; at most the workflow's ``max_retries``).
        ordinal: The record's ordinal within the run.
        error_type: The failed execution's error type (``StepTimeout`` for a timeout).
        error_message: Its message, bounded.
        wake_at: When the step runs again: absolute, backoff and jitter included, never recomputed.
        wait_id: The timed wait the run holds until ``wake_at``.
    """

    submission_id: str
    attempt_id: str
    step: str
    retry: NonNegInt32
    ordinal: NonNegInt64
    error_type: str
    error_message: str
    wake_at: UtcMillis
    wait_id: str


class SubmissionRetryScheduled(AvroRecord):
    """A charged attempt ended within the submission's budget: the next one starts at ``wake_at`` (issue 22 item 4).

    Appended by the owner with the timed wait (`WaitRequested`, ``wait_id``) the submission holds until ``wake_at``
    (Ready → Waiting; no worker slot, not charged as a death); the sweeper's expiry makes it Ready again.

    Attributes:
        submission_id: The submission.
        attempt_id: The attempt that ended.
        retry: Which retry this schedules (1, 2, ...).
        cause: Why the attempt ended (error type and message, or the worker's death), bounded.
        backoff_ms: The backoff drawn for this retry, jitter included, in milliseconds.
        wake_at: When the next attempt may start: absolute, never recomputed.
        wait_id: The timed wait the submission holds until ``wake_at``.
    """

    submission_id: str
    attempt_id: str
    retry: Annotated[int, Field(ge=1, le=2**31 - 1)]
    cause: str
    backoff_ms: NonNegInt64
    wake_at: UtcMillis
    wait_id: str


class WaitRequested(AvroRecord):
    """A run asks to wait (issue 16): canonical, it suspends the run (Running → Waiting) until every wait is decided.

    Attributes:
        submission_id: The submission.
        attempt_id: The attempt that asked.
        wait_id: The wait's id, derived from the run id and the callsite ordinal (stable across attempts).
        kind: Signal or approval.
        name: The signal's name, or the approval's title.
        ordinal: The callsite ordinal of the wait in its run.
        deadline: When the wait expires (an absolute instant, stored here and never recomputed), or None.
        details_json: What the wait shows a person (an approval's description, the call and its arguments' digest),
            canonical JSON, or None.
    """

    submission_id: str
    attempt_id: str
    wait_id: str
    kind: WaitKind
    name: str
    ordinal: int
    deadline: UtcMillis | None = None
    details_json: CanonicalJson | None = None


class WaitResolved(AvroRecord):
    """A wait decided (issue 16): delivered, or expired at its deadline. Canonical before the run resumes.

    Attributes:
        submission_id: The submission.
        wait_id: The wait.
        outcome: Delivered or expired.
        source_id: What delivered it (a signal id, an approval command id), or None for an expiry.
        payload_json: The delivered payload, canonical JSON, or None.
        decided_at: When the owner decided it (for an expiry: a clock reading at or after the deadline).
    """

    submission_id: str
    wait_id: str
    outcome: WaitOutcome
    source_id: str | None = None
    payload_json: CanonicalJson | None = None
    decided_at: UtcMillis


class ApprovalDecided(AvroRecord):
    """A verified `DecideApproval` accepted (issue 16 item 4): decides its input; the same batch resolves the wait.

    Attributes:
        command_id: The decision's id.
        submission_id: The run.
        approval_id: The approval (its wait id).
        approved: True if approved, False if denied.
        args_digest: The argument digest the decision is bound to.
        principal: Who decided.
        key_id: The verified signing key ("by").
        reason: Why, as the approver says, or None.
        input_ref: The inbox record this decides.
    """

    command_id: str
    submission_id: str
    approval_id: str
    approved: bool
    args_digest: Digest
    principal: str
    key_id: str
    reason: str | None = None
    input_ref: InputRef | None = None


class AccessGranted(AvroRecord):
    """A `GrantAccess` accepted (issue 20): the grantee holds this access from here on (a later grant replaces it).

    Attributes:
        command_id: The command's id.
        grantee: The principal granted access.
        access: What it may do.
        principal: Who granted it.
        input_ref: The inbox record this decides.
    """

    command_id: str
    grantee: str
    access: AccessLevel
    principal: str
    input_ref: InputRef | None = None


class AccessRevoked(AvroRecord):
    """A `RevokeAccess` accepted (issue 20): the grantee's access ends here.

    Attributes:
        command_id: The command's id.
        grantee: The principal whose access ends.
        principal: Who revoked it.
        input_ref: The inbox record this decides.
    """

    command_id: str
    grantee: str
    principal: str
    input_ref: InputRef | None = None


# -------------------------------------------------------------------------------------------- other topics


class Receipt(AvroRecord):
    """A payload-free reply on ``settled.receipts`` (docs/design.md §2, §4).

    Attributes:
        schema_version: Schema version the writer used.
        request_kind: Submission or command.
        request_id: The submission id or command id answered.
        outcome: Admitted, duplicate, rejected or applied.
        reason: The reason code (and, for a lost abort race, the winning outcome), when rejected.
        original_submission_id: For a duplicate: the admitted submission; for a retry of a dead letter
            (`RetrySubmission`): the submission it admitted, or for a duplicate retry the first retry.
        submission_seq: For an admitted or duplicate submission: its submission sequence.
        conversation_id: The conversation (the record key).
        decided_at: When the owner decided.
        run_id: For an admitted or duplicate submission of a flow run: the run's id (issue 18).
    """

    schema_version: NonNegInt32 = SCHEMA_VERSION
    request_kind: RequestKind
    request_id: str
    outcome: ReceiptOutcome
    reason: str | None = None
    original_submission_id: str | None = None
    submission_seq: NonNegInt64 | None = None
    conversation_id: str
    decided_at: UtcMillis
    run_id: str | None = None


class SettlementRecord(AvroRecord):
    """One terminal outcome per accepted submission on ``settled.settlements`` (docs/design.md §2, §4).

    Attributes:
        schema_version: Schema version the writer used.
        conversation_id: The conversation (the record key).
        submission_id: The submission.
        submission_seq: Its submission sequence.
        outcome: Completed, failed or aborted.
        reply_json: Final reply, canonical JSON, up to the inline limit.
        reply_digest: `json_digest` of the reply.
        reply_ref: Where an over-limit reply is found.
        error_type: For failed: the error type.
        error_reason: For failed or aborted: the reason.
        attempt_count: Attempts made.
        settled_at: When.
        joined_to: For a submission joined into another run (issue 22 item 2): its host, whose outcome it shares.
    """

    schema_version: NonNegInt32 = SCHEMA_VERSION
    conversation_id: str
    submission_id: str
    submission_seq: NonNegInt64
    outcome: SettlementOutcome
    reply_json: CanonicalJson | None = None
    reply_digest: Digest | None = None
    reply_ref: str | None = None
    error_type: str | None = None
    error_reason: str | None = None
    attempt_count: NonNegInt32
    settled_at: UtcMillis
    joined_to: str | None = None

    @model_validator(mode="after")
    def _digest_matches(self) -> Self:
        _check_digest(self.reply_json, self.reply_digest, "reply_json", "reply_digest")
        if self.reply_ref is not None and self.reply_digest is None:
            raise ValueError("reply_digest is required with reply_ref")
        return self


class QuarantineRecord(AvroRecord):
    """An inbox record set aside, on ``settled.quarantine`` (issue 4 item 6).

    Attributes:
        schema_version: Schema version the writer used.
        topic: Source topic.
        partition: Source partition.
        offset: Source offset.
        reason: Reason code.
        detail: Human-readable detail.
        key: The record's key, when it had one (truncated like ``raw``).
        raw: The record's value, truncated to the quarantine limit.
        raw_size_bytes: The value's full size.
        quarantined_at: When.
    """

    schema_version: NonNegInt32 = SCHEMA_VERSION
    topic: str
    partition: NonNegInt32
    offset: NonNegInt64
    reason: QuarantineReason
    detail: str
    key: bytes | None = None
    raw: bytes
    raw_size_bytes: NonNegInt64
    quarantined_at: UtcMillis


class LifecycleEvent(AvroRecord):
    """A ``durable.*`` lifecycle event on ``settled.lifecycle`` (issue 17 item 5; docs/architecture.md).

    Derived from exactly one canonical log event by `settled.protocol.lifecycle_events` and produced by the partition
    owner in the transaction that appends that event, keyed by the conversation id like the log.

    Attributes:
        schema_version: Schema version the writer used.
        event_id: ``<batch_id>#<index>``: the causing batch and the causing event's index in it (a consumer
            dedupes on it).
        type: The event type, e.g. ``durable.started``.
        conversation_id: The conversation (the record key).
        submission_id: The run (its submission).
        batch_id: The causing canonical batch.
        index: The causing event's index within that batch (0-based).
        data_json: What the event tells (attempt, step, retry, error...), canonical JSON.
        occurred_at: The causing batch's ``recorded_at``.
    """

    schema_version: NonNegInt32 = SCHEMA_VERSION
    event_id: str
    type: str
    conversation_id: str
    submission_id: str
    batch_id: str
    index: NonNegInt32
    data_json: CanonicalJson
    occurred_at: UtcMillis


InboxRecord = (
    SubmissionProposed
    | AbortRequested
    | ResolveUnknown
    | SendSignal
    | DecideApproval
    | GrantAccess
    | RevokeAccess
    | RetrySubmission
    | SteerRun
    | SetLane
)
"""What ``settled.inbox`` carries."""

LogEvent = (
    Genesis
    | OwnershipClaimed
    | SubmissionAdmitted
    | SubmissionReady
    | SubmissionRejected
    | SubmissionDuplicate
    | InputQuarantined
    | AbortRecorded
    | CommandRejected
    | AttemptStarted
    | AttemptInterrupted
    | InputApplied
    | ModelResponseDelta
    | ModelResponseCompleted
    | ToolCallPrepared
    | ToolCallSettled
    | ToolCallRefused
    | ToolCallUnknown
    | UnknownResolved
    | StepRecorded
    | EffectRecorded
    | Settlement
    | RecoveryDecision
    | WaitRequested
    | WaitResolved
    | SignalReceived
    | ApprovalDecided
    | ModelResponseInterrupted
    | StepRetryScheduled
    | AccessGranted
    | AccessRevoked
    | SubmissionRetryScheduled
    | SteeringReceived
    | SteeringDelivered
    | LaneSet
    | SubmissionsJoined
)
"""An event inside a canonical batch on ``settled.log`` (the Avro union, in this order)."""

INBOX_TYPES: tuple[type[AvroRecord], ...] = (
    SubmissionProposed,
    AbortRequested,
    ResolveUnknown,
    SendSignal,
    DecideApproval,
    GrantAccess,
    RevokeAccess,
    RetrySubmission,
    SteerRun,
    SetLane,
)
"""Record types of ``settled.inbox``."""

COMMAND_TYPES: tuple[type[AvroRecord], ...] = (
    AbortRequested,
    ResolveUnknown,
    SendSignal,
    DecideApproval,
    GrantAccess,
    RevokeAccess,
    RetrySubmission,
    SteerRun,
    SetLane,
)
"""The inbox's commands."""

LOG_EVENT_TYPES: tuple[type[AvroRecord], ...] = (
    Genesis,
    OwnershipClaimed,
    SubmissionAdmitted,
    SubmissionReady,
    SubmissionRejected,
    SubmissionDuplicate,
    InputQuarantined,
    AbortRecorded,
    CommandRejected,
    AttemptStarted,
    AttemptInterrupted,
    InputApplied,
    ModelResponseDelta,
    ModelResponseCompleted,
    ToolCallPrepared,
    ToolCallSettled,
    ToolCallRefused,
    ToolCallUnknown,
    UnknownResolved,
    StepRecorded,
    EffectRecorded,
    Settlement,
    RecoveryDecision,
    WaitRequested,
    WaitResolved,
    SignalReceived,
    ApprovalDecided,
    ModelResponseInterrupted,
    StepRetryScheduled,
    AccessGranted,
    AccessRevoked,
    SubmissionRetryScheduled,
    SteeringReceived,
    SteeringDelivered,
    LaneSet,
    SubmissionsJoined,
)
"""Branches of the log-event union, in Avro union order."""

TOPIC_RECORD_TYPES: tuple[type[AvroRecord], ...] = (
    *INBOX_TYPES,
    Receipt,
    SettlementRecord,
    QuarantineRecord,
    LifecycleEvent,
)
"""Top-level records of the inbox, receipts, settlements, quarantine and lifecycle topics (the log's is the batch
envelope)."""
