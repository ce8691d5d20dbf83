"""`Client`: submit turns, abort them, wait for and stream their settlements (docs/design.md §4; issue 5 item 8).

One client holds one idempotent inbox producer and one receipts reader, both shared by every thread that calls it
(docs/design.md §4: one shared receipts reader per process — use one client per process). ``submit()`` returns only
after reading its receipt; when none comes within its deadline it raises `SubmissionOutcomeUnknownError` naming the
idempotency key, never a false success: submitting again with the same key and payload returns the original receipt.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime, timedelta
from types import TracebackType
from typing import Any, Literal, Self, TypeVar

from confluent_kafka import KafkaError, KafkaException, Message
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from pydantic import ValidationError

from settled import protocol
from settled._settings import Settings
from settled.client._errors import (
    AbortOutcomeUnknownError,
    AbortRejectedError,
    AccessOutcomeUnknownError,
    AccessRejectedError,
    ApprovalOutcomeUnknownError,
    ApprovalRejectedError,
    BrokerUnavailableError,
    ClientError,
    CommandRejectedError,
    IdempotencyConflictError,
    InboxProduceError,
    LaneOutcomeUnknownError,
    LaneRejectedError,
    OutcomeUnknownError,
    PayloadTooLargeError,
    ResolveOutcomeUnknownError,
    ResolveRejectedError,
    RetryOutcomeUnknownError,
    RetryRejectedError,
    SignalOutcomeUnknownError,
    SignalRejectedError,
    SteerOutcomeUnknownError,
    SteerRejectedError,
    SubmissionOutcomeUnknownError,
    SubmissionRejectedError,
    UnexpectedReceiptError,
    reason_parts,
)
from settled.client._inbox import InboxProducer
from settled.client._lifecycle import LifecycleStream
from settled.client._receipts import ReceiptsReader, ReceiptWaiter
from settled.client._runs import IncompleteRun
from settled.client._settlements import SettlementStream
from settled.client._stream import RunStream
from settled.client._waits import SettlementsReader
from settled.projections import ProjectionNames, ProjectionReader, default_schema
from settled.schemas import (
    AbortRequested,
    AccessLevel,
    CanonicalJsonError,
    Codec,
    DecideApproval,
    GrantAccess,
    LanePolicy,
    Receipt,
    ReceiptOutcome,
    RequestKind,
    ResolutionKind,
    ResolveUnknown,
    RetrySubmission,
    RevokeAccess,
    SendSignal,
    SetLane,
    SettlementOutcome,
    SettlementRecord,
    SteerRun,
    SubmissionPayload,
    SubmissionProposed,
    canonical_json,
    payload_digest,
)

__all__ = ["DEFAULT_MAX_PAYLOAD_BYTES", "DEFAULT_PRINCIPAL", "NO_RESULT", "Client"]

_log = logging.getLogger(__name__)

DEFAULT_MAX_PAYLOAD_BYTES = 1_000_000
"""settled's hard size limit for one inbox record value, in bytes: the worker's default ``max_input_bytes``
(`settled.processors.WorkerConfig`), over which it quarantines a record (docs/design.md §4)."""

DEFAULT_PRINCIPAL = "default"
"""The principal of a client built without one (keys are scoped by principal + conversation, docs/design.md §4)."""

#: Delivery errors after which producing the record again cannot succeed: after `_MAX_PERMANENT_TRIES` of them the
#: request fails with `InboxProduceError` instead of waiting out its deadline.
_PERMANENT = frozenset(
    {
        KafkaError.MSG_SIZE_TOO_LARGE,
        KafkaError.RECORD_LIST_TOO_LARGE,
        KafkaError.INVALID_MSG,
        KafkaError.INVALID_RECORD,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.CLUSTER_AUTHORIZATION_FAILED,
        KafkaError.INVALID_MSG_SIZE,
    }
)
_MAX_PERMANENT_TRIES = 3


class _NoResult:
    """The type of `NO_RESULT`."""

    def __repr__(self) -> str:
        return "NO_RESULT"


NO_RESULT: Any = _NoResult()
"""``Client.resolve_unknown``'s default ``result``: none given (``None`` is the JSON null result)."""


def _utcnow() -> datetime:
    return datetime.now(UTC)


_E = TypeVar("_E", ResolutionKind, SettlementOutcome, AccessLevel, LanePolicy)


def _enum_value(enum_type: type[_E], value: _E | str, name: str) -> _E:
    """``value`` as a member of ``enum_type``; a clear ``ValueError`` naming the field and the choices otherwise."""
    try:
        return enum_type(value)
    except ValueError:
        choices = ", ".join(m.value for m in enum_type)
        raise ValueError(f"{name} must be one of {choices}, got {value!r}") from None


def _keep_contract(violation: protocol.Violation | None) -> None:
    """Raise a ``ValueError`` naming the field, the rule and an excerpt when a record breaks the input contract."""
    if violation is not None:
        raise ValueError(f"{violation.detail} (settled's input contract: docs/architecture.md)")


def _json_field(value: Any, name: str) -> str:
    """``value`` as canonical JSON (RFC 8785); a ``ValueError`` naming the field when it is not JSON-compatible."""
    try:
        return canonical_json(value)
    except CanonicalJsonError as exc:
        raise ValueError(f"{name} is not JSON-compatible: {exc.reason}") from exc


#: The inbox commands `Client._command` sends.
_Command = (
    AbortRequested
    | DecideApproval
    | GrantAccess
    | ResolveUnknown
    | RetrySubmission
    | RevokeAccess
    | SendSignal
    | SetLane
    | SteerRun
)


def _require_ed25519(signing_key: object) -> None:
    """Raise a ``TypeError`` naming the type when ``signing_key`` is not an ``Ed25519PrivateKey``; nothing is sent."""
    if not isinstance(signing_key, Ed25519PrivateKey):
        raise TypeError(
            f"signing_key must be an Ed25519PrivateKey (see settled.client.load_signing_key), got "
            f"{type(signing_key).__name__}"
        )


def _signing_bytes(command: _Command) -> bytes:
    """What an approval's, a resolution's or a retry's signature covers; TypeError for an unsigned kind."""
    if isinstance(command, DecideApproval | ResolveUnknown | RetrySubmission):
        return command.signing_bytes()
    raise TypeError(f"a {type(command).__name__} is not signed")


class Client:
    """A settled client: ``submit``, ``wait``, ``abort``, ``settlements`` (docs/design.md §4).

    Thread-safe; a context manager (``with Client(settings) as client: ...``) that closes its producer and reader.

    Attributes:
        settings: Namespace and Kafka settings.
        principal: The default principal of submissions and commands.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        principal: str = DEFAULT_PRINCIPAL,
        codec: Codec | None = None,
        default_timeout_s: float = 30.0,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        delivery_timeout_s: float = 120.0,
        settlement_lookback_s: float = 60.0,
        producer_overrides: Mapping[str, Any] | None = None,
        clock: Callable[[], datetime] = _utcnow,
        api_signer: tuple[str, Ed25519PrivateKey, str] | None = None,
        projection_dsn: str | None = None,
        projection_schema: str | None = None,
    ) -> None:
        """Build a client; nothing connects until the first request.

        Args:
            settings: Namespace and Kafka settings.
            principal: Default principal of submissions and commands.
            codec: The record codec (default: single-object encoding of the shipped schemas).
            default_timeout_s: Deadline of a request that names none, in seconds.
            max_payload_bytes: Largest encoded proposal sent, in bytes; keep it equal to the workers'
                ``max_input_bytes`` (a larger record would be quarantined, docs/design.md §4).
            delivery_timeout_s: How long the producer keeps trying to deliver a record, in seconds (librdkafka's
                ``message.timeout.ms``). A record may land after ``submit()``'s deadline; that is safe.
            settlement_lookback_s: `wait` starts reading this many seconds before the receipt's ``decided_at``, a
                margin for clock skew between the deciding worker and the broker's record timestamps.
            producer_overrides: Further librdkafka properties of the inbox producer (``enable.idempotence`` must
                stay true and no ``transactional.id`` may be set).
            clock: Returns "now" (aware UTC), for ``proposed_at`` and ``requested_at``.
            api_signer: For the HTTP API only (issue 20): ``(key id, Ed25519 key, access)`` signing every record it
                produces in the headers of `settled.protocol.API_HEADERS`, so that the partition owner trusts its
                principal and checks the conversation's access (``owner`` or ``all``). None: unsigned records, decided
                as from any trusted inbox writer.
            projection_dsn: The PostgreSQL holding the projection, for the reads that use it (`incomplete_runs`);
                None: ``settings.postgres_dsn`` (``SETTLED_POSTGRES_DSN``). Nothing connects until such a read.
            projection_schema: The projection's schema (None: the namespace's default, as ``settled runs``).

        Raises:
            ValueError: If an argument is out of range (named).
        """
        if not principal.strip():
            raise ValueError(f"principal must not be empty, got {principal!r}")
        for name, value in (("default_timeout_s", default_timeout_s), ("delivery_timeout_s", delivery_timeout_s)):
            if value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")
        if max_payload_bytes < 1:
            raise ValueError(f"max_payload_bytes must be positive, got {max_payload_bytes}")
        self.settings = settings
        self.principal = principal
        self._codec = codec if codec is not None else Codec()
        self._default_timeout_s = default_timeout_s
        self._max_payload_bytes = max_payload_bytes
        self._lookback = timedelta(seconds=settlement_lookback_s)
        self._clock = clock
        self._inbox_topic = settings.topic("inbox")
        self._producer = InboxProducer(settings, delivery_timeout_s=delivery_timeout_s, overrides=producer_overrides)
        self._reader = ReceiptsReader(settings, self._codec)
        self._reader_lock = threading.Lock()
        self._settlements = SettlementsReader(settings, self._codec)
        self._closed = False
        if api_signer is not None and api_signer[2] not in (protocol.ACCESS_OWNER, protocol.ACCESS_ALL):
            raise ValueError(f"api_signer's access must be owner or all, got {api_signer[2]!r}")
        self._api_signer = api_signer
        self._projection_dsn = projection_dsn if projection_dsn is not None else settings.postgres_dsn
        self._projection_schema = projection_schema
        self._projection: ProjectionReader | None = None
        self._projection_lock = threading.Lock()

    # ------------------------------------------------------------------------------------------ lifecycle

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self, timeout_s: float = 10.0) -> None:
        """Deliver what the producer still holds (within ``timeout_s``), then stop the producer and the reader.

        Args:
            timeout_s: Bound on the producer's final flush and on stopping the reader, in seconds.
        """
        if self._closed:
            return
        self._closed = True
        left = self._producer.close(timeout_s)
        if left:
            _log.warning("inbox records undelivered at close", extra={"records": left})
        self._reader.close(timeout_s)
        self._settlements.close(timeout_s)
        with self._projection_lock:
            if self._projection is not None:
                self._projection.close()

    @property
    def producer_replacements(self) -> int:
        """How many times a fatal producer error replaced the shared inbox producer (scenario 20)."""
        return self._producer.replacements

    @property
    def receipts_reader(self) -> ReceiptsReader:
        """The shared receipts reader (started on the first request)."""
        return self._reader

    # ---------------------------------------------------------------------------------------------- submit

    def submit(
        self,
        conversation_id: str,
        input: Any,
        *,
        idempotency_key: str | None = None,
        principal: str | None = None,
        tools_offered: Iterable[str] = (),
        timeout_s: float | None = None,
        kind: Literal["conversation", "flow"] = "conversation",
        flow_name: str | None = None,
        run_id: str | None = None,
        lane: LanePolicy | str | None = None,
    ) -> Receipt:
        """Propose one turn and return its receipt (DUR-001, docs/design.md §4).

        The input is canonicalised (RFC 8785) and digested; the `SubmissionProposed` record is produced keyed by the
        conversation id, and the call returns only once the owner's receipt is read.

        Args:
            conversation_id: The conversation.
            input: The turn's input, a JSON-compatible value.
            idempotency_key: The client key (scope: principal + conversation); a new UUID when ``None``.
            principal: Who submits (default: the client's).
            tools_offered: Names of the tools offered for this turn (docs/design.md §5).
            timeout_s: Deadline, in seconds (default: the client's).
            kind: ``"flow"`` opens a run of the flow ``flow_name`` (issue 18): the owner mints its run id and the
                receipt carries it (``receipt.run_id``); ``"conversation"`` (the default) is a plain turn.
            flow_name: The flow a ``kind="flow"`` turn opens a run of.
            run_id: Resume this flow run (a receipt's ``run_id``): it outranks ``kind`` and ``flow_name`` (a turn
                naming a run only resumes it); a run the conversation does not hold is rejected ``unknown_target``.
            lane: The lane policy of the conversation this turn opens (issue 22 item 1: ``queue``, ``join``,
                ``reject``, ``interrupt``, ``keep_newest``); None: the app's default. Ignored when the conversation
                is already open (`set_lane` changes its lane).

        Returns:
            The receipt: outcome ``admitted``, or ``duplicate`` pointing at the original submission
            (``original_submission_id``, ``submission_seq``) — both are success. A flow turn's carries its run id.

        Raises:
            ValueError: If an argument is invalid: an id or tool name that breaks the input contract
                (`settled.protocol.check_proposal`: empty, over 256 characters, a NUL, lone surrogate or other
                control character, a repeated tool name), or input that is not JSON; the field is named; nothing was
                sent.
            PayloadTooLargeError: If the encoded proposal exceeds ``max_payload_bytes``; nothing was sent.
            IdempotencyConflictError: The key was admitted earlier with another payload.
            SubmissionRejectedError: Any other rejection (reason code, detail and field where known).
            SubmissionOutcomeUnknownError: No receipt within the deadline; names the key to submit again with.
            BrokerUnavailableError: Kafka could not be reached before anything was sent.
            InboxProduceError: The broker refused the record permanently.
        """
        timeout = self.timeout_s(timeout_s)
        deadline = time.monotonic() + timeout
        if not conversation_id.strip():
            raise ValueError(f"conversation_id must not be empty, got {conversation_id!r}")
        key = idempotency_key if idempotency_key is not None else str(uuid.uuid4())
        if not key.strip():
            raise ValueError(f"idempotency_key must not be empty, got {key!r}")
        who = self._principal(principal)
        if run_id is not None:
            input = protocol.flow_resume_input(run_id, input)  # resume only: kind and flow_name are ignored
        elif kind == "flow":
            if flow_name is None:
                raise ValueError("flow_name is required with kind='flow', got None")
            input = protocol.flow_input(flow_name, input)
        elif kind != "conversation":
            raise ValueError(f"kind must be 'conversation' or 'flow', got {kind!r}")
        try:
            input_json = canonical_json(input)
        except CanonicalJsonError as exc:
            raise ValueError(f"input is not JSON-compatible: {exc.reason}") from exc
        lane_policy = None if lane is None else _enum_value(LanePolicy, lane, "lane")
        payload = SubmissionPayload(input_json=input_json, tools_offered=tuple(tools_offered))
        proposal = SubmissionProposed(
            submission_id=str(uuid.uuid4()),
            principal=who,
            conversation_id=conversation_id,
            idempotency_key=key,
            payload=payload,
            payload_digest=payload_digest(payload),
            proposed_at=self._clock(),
            lane=lane_policy,
        )
        _keep_contract(protocol.check_proposal(proposal))
        value = self._codec.encode(proposal)
        if len(value) > self._max_payload_bytes:
            raise PayloadTooLargeError(conversation_id, len(value), self._max_payload_bytes)
        receipt = self._request(
            conversation_id,
            proposal.submission_id,
            value,
            deadline,
            lambda: SubmissionOutcomeUnknownError(key, conversation_id, proposal.submission_id, timeout),
        )
        if receipt.request_kind is not RequestKind.SUBMISSION:
            raise UnexpectedReceiptError(receipt)
        if receipt.outcome in (ReceiptOutcome.ADMITTED, ReceiptOutcome.DUPLICATE):
            return receipt
        if receipt.outcome is ReceiptOutcome.REJECTED:
            if reason_parts(receipt.reason)[0] == "idempotency_conflict":
                raise IdempotencyConflictError(receipt)
            raise SubmissionRejectedError(receipt)
        raise UnexpectedReceiptError(receipt)

    def abandon_flow_run(
        self,
        conversation_id: str,
        run_id: str,
        *,
        command_id: str | None = None,
        principal: str | None = None,
        timeout_s: float | None = None,
    ) -> Receipt:
        """End flow run ``run_id`` without running a node (issue 18 item 3; e.g. after a `FlowDriftError`).

        An operator's turn (`settled.protocol.flow_operator_input`) whose idempotency key is ``command_id``: the same
        id again is a duplicate. Later turns naming the run fail ``flow_run_ended``.

        Args:
            conversation_id: The run's conversation.
            run_id: The run.
            command_id: The command's id, its idempotency key (default: a new UUID).
            principal: Who asks (default: the client's).
            timeout_s: Deadline, in seconds (default: the client's).

        Returns:
            The receipt (admitted, or duplicate of the first abandon under the same id).

        Raises:
            ValueError: ``run_id`` is blank.
            SubmissionRejectedError: ``unknown_target``: the conversation holds no such run.
        """
        envelope = protocol.flow_operator_input(run_id, "abandon")
        return self.submit(
            conversation_id, envelope, idempotency_key=command_id, principal=principal, timeout_s=timeout_s
        )

    def restart_flow_run(
        self,
        conversation_id: str,
        run_id: str,
        *,
        command_id: str | None = None,
        principal: str | None = None,
        timeout_s: float | None = None,
    ) -> Receipt:
        """End flow run ``run_id`` and open a new run of the deployed flow with its opening input (issue 18 item 3).

        As `abandon_flow_run`; the receipt's ``run_id`` is the new run's, and the turn's reply is the new run's first
        turn (with ``restarted_from``).

        Args:
            conversation_id: The run's conversation.
            run_id: The run.
            command_id: The command's id, its idempotency key (default: a new UUID).
            principal: Who asks (default: the client's).
            timeout_s: Deadline, in seconds (default: the client's).

        Returns:
            The receipt (admitted, or duplicate of the first restart under the same id).

        Raises:
            ValueError: ``run_id`` is blank.
            SubmissionRejectedError: ``unknown_target``: the conversation holds no such run.
        """
        envelope = protocol.flow_operator_input(run_id, "restart")
        return self.submit(
            conversation_id, envelope, idempotency_key=command_id, principal=principal, timeout_s=timeout_s
        )

    def run_workflow(
        self,
        name: str,
        input: Any,
        *,
        task_id: str,
        conversation_id: str | None = None,
        principal: str | None = None,
        timeout_s: float | None = None,
    ) -> Receipt:
        """Start a run of the workflow ``name`` registered on the worker's app (issue 17); return its receipt.

        The run is one submission (`settled.protocol.workflow_input`) in ``conversation_id``, by default
        ``wf:<name>:<task_id>`` (so runs of different tasks spread over the partitions), whose idempotency key is
        ``task_id``: the same task id and input again returns the original run's receipt (outcome ``duplicate``).
        The worker resumes an interrupted run by itself; `wait` reads its settlement, whose reply is the dict of
        step results by name.

        Args:
            name: The workflow's name.
            input: The run's input, a JSON-compatible value (``StepContext.input``).
            task_id: The run's task id, its idempotency key.
            conversation_id: The conversation (default ``wf:<name>:<task_id>``).
            principal: Who starts it (default: the client's).
            timeout_s: Deadline, in seconds (default: the client's).

        Returns:
            The receipt: ``admitted``, or ``duplicate`` pointing at the original run.

        Raises:
            ValueError: ``name`` or ``task_id`` is empty, or an argument breaks the input contract (as `submit`).
            IdempotencyConflictError: The task id started a run with another input (the message names the id).
            SubmissionRejectedError: Any other rejection.
            SubmissionOutcomeUnknownError: No receipt within the deadline; run it again with the same task id.
        """
        envelope = protocol.workflow_input(name, task_id, input)
        conversation = (
            conversation_id if conversation_id is not None else protocol.workflow_conversation_id(name, task_id)
        )
        return self.submit(conversation, envelope, idempotency_key=task_id, principal=principal, timeout_s=timeout_s)

    # ---------------------------------------------------------------------------------------------- signal

    def signal(
        self,
        conversation_id: str,
        run_id: str,
        name: str,
        payload: Any = None,
        *,
        signal_id: str | None = None,
        principal: str | None = None,
        timeout_s: float | None = None,
    ) -> Receipt:
        """Send a signal to a run and return the owner's reply (issue 16).

        The signal is accepted while the run is unsettled, whatever it waits for at that moment, appended
        canonically, and consumed by the run's first ``ctx.signal(name)`` that has not taken one (later ones by later
        waits, in log order). Sent while no worker runs, it waits in the inbox and is decided when an owner reads it.

        Args:
            conversation_id: The conversation.
            run_id: The run (an agent run's id is its submission id).
            name: The signal's name.
            payload: Its payload, a JSON value.
            signal_id: The signal's id, deduplicating it; a new UUID when ``None`` (pass the id of an earlier
                signal whose outcome is unknown to send it again: it is answered as a duplicate if accepted).
            principal: Who sends it (default: the client's).
            timeout_s: Deadline, in seconds (default: the client's).

        Returns:
            The reply (request kind ``command``): outcome ``applied``, or ``duplicate`` for a repeated signal id.

        Raises:
            ValueError: An argument breaks the input contract (the field is named); nothing was sent.
            CanonicalJsonError: ``payload`` is not representable as canonical JSON; nothing was sent.
            SignalRejectedError: The owner rejected it (``unknown_target``, ``already_terminal``).
            SignalOutcomeUnknownError: No reply within the deadline; names the signal id to send again.
            BrokerUnavailableError: Kafka could not be reached before anything was sent.
            InboxProduceError: The broker refused the record permanently.
        """
        timeout = self.timeout_s(timeout_s)
        deadline = time.monotonic() + timeout
        sid = signal_id if signal_id is not None else str(uuid.uuid4())
        command = SendSignal(
            command_id=sid,
            principal=self._principal(principal),
            conversation_id=conversation_id,
            submission_id=run_id,
            name=name,
            payload_json=canonical_json(payload),
            sent_at=self._clock(),
        )
        return self._command(
            command,
            deadline,
            lambda: SignalOutcomeUnknownError(sid, conversation_id, run_id, timeout),
            SignalRejectedError,
        )

    def steer(
        self,
        conversation_id: str,
        run_id: str,
        text: str,
        *,
        command_id: str | None = None,
        principal: str | None = None,
        timeout_s: float | None = None,
    ) -> Receipt:
        """Send a steering message to an active run and return the owner's reply (issue 22 item 3).

        Accepted while the run is unsettled and appended canonically to its steering stream (in log order); the run's
        next model call shows it to the model as a user message, after the prompt the agent built, and every later
        call of the run shows it there too. Sent while no worker runs, it waits in the inbox until an owner decides
        it. One sent after the run settled is rejected ``already_terminal``.

        Args:
            conversation_id: The conversation.
            run_id: The run (an agent run's id is its submission id).
            text: The message (non-empty, at most `settled.protocol.MAX_TEXT_CHARS` characters).
            command_id: The message's id, deduplicating it; a new UUID when ``None`` (pass the id of an earlier one
                whose outcome is unknown to send it again: it is answered as a duplicate if accepted).
            principal: Who sends it (default: the client's).
            timeout_s: Deadline, in seconds (default: the client's).

        Returns:
            The reply (request kind ``command``): outcome ``applied``, or ``duplicate`` for a repeated command id.

        Raises:
            ValueError: An argument breaks the input contract (the field is named); nothing was sent.
            SteerRejectedError: The owner rejected it (``unknown_target``, ``already_terminal``, ``invalid``).
            SteerOutcomeUnknownError: No reply within the deadline; names the command id to send again.
            BrokerUnavailableError: Kafka could not be reached before anything was sent.
            InboxProduceError: The broker refused the record permanently.
        """
        timeout = self.timeout_s(timeout_s)
        deadline = time.monotonic() + timeout
        cid = command_id if command_id is not None else str(uuid.uuid4())
        command = SteerRun(
            command_id=cid,
            principal=self._principal(principal),
            conversation_id=conversation_id,
            submission_id=run_id,
            text=text,
            sent_at=self._clock(),
        )
        return self._command(
            command,
            deadline,
            lambda: SteerOutcomeUnknownError(cid, conversation_id, run_id, timeout),
            SteerRejectedError,
        )

    def pause_run(
        self,
        conversation_id: str,
        run_id: str,
        *,
        reason: str | None = None,
        command_id: str | None = None,
        principal: str | None = None,
        timeout_s: float | None = None,
    ) -> Receipt:
        """Pause a workflow run at its next step boundary and return the owner's reply (issue 17 item 2).

        The pause is the signal ``settled.pause`` (`settled.protocol.PAUSE_SIGNAL`), canonical once applied; the run
        honours it before its next step (its approval and body) and then waits, holding its conversation's lane and
        no worker slot, until `resume_run`. A run in its last step settles before it would pause.

        Args:
            conversation_id: The run's conversation (``wf:<name>:<task_id>`` by default).
            run_id: The run (its submission id).
            reason: Why, recorded with the pause (default: ``paused by <principal>``).
            command_id: The command's id, deduplicating it; a new UUID when ``None`` (pass the id of an earlier
                pause whose outcome is unknown: it is answered as a duplicate if applied).
            principal: Who pauses it (default: the client's).
            timeout_s: Deadline, in seconds (default: the client's).

        Returns:
            The reply: ``applied``, or ``duplicate`` for a repeated command id.

        Raises:
            SignalRejectedError: The owner refused it: ``unknown_target``, ``already_terminal``, ``invalid`` (not a
                workflow run), ``stale`` (already paused).
            SignalOutcomeUnknownError: No reply within the deadline; names the command id to send again.
            ValueError: An argument breaks the input contract (the field is named); nothing was sent.
        """
        return self.signal(
            conversation_id,
            run_id,
            protocol.PAUSE_SIGNAL,
            {"reason": reason},
            signal_id=command_id,
            principal=principal,
            timeout_s=timeout_s,
        )

    def resume_run(
        self,
        conversation_id: str,
        run_id: str,
        *,
        command_id: str | None = None,
        principal: str | None = None,
        timeout_s: float | None = None,
    ) -> Receipt:
        """Resume a paused workflow run and return the owner's reply (issue 17 item 2).

        The resume is the signal ``settled.resume`` (`settled.protocol.RESUME_SIGNAL`): it delivers the run's pause
        wait, and the run goes on from the step boundary where it paused; a run paused by a denied approval asks
        again under a new approval id (the earlier denial is never its answer).

        Args:
            conversation_id: The run's conversation.
            run_id: The run (its submission id).
            command_id: The command's id, deduplicating it; a new UUID when ``None``.
            principal: Who resumes it (default: the client's).
            timeout_s: Deadline, in seconds (default: the client's).

        Returns:
            The reply: ``applied``, or ``duplicate`` for a repeated command id.

        Raises:
            SignalRejectedError: The owner refused it: ``unknown_target``, ``already_terminal``, ``invalid`` (not a
                workflow run), ``stale`` (the run is not paused).
            SignalOutcomeUnknownError: No reply within the deadline; names the command id to send again.
            ValueError: An argument breaks the input contract (the field is named); nothing was sent.
        """
        return self.signal(
            conversation_id,
            run_id,
            protocol.RESUME_SIGNAL,
            None,
            signal_id=command_id,
            principal=principal,
            timeout_s=timeout_s,
        )

    # ------------------------------------------------------------------------------------------- workflow runs

    def incomplete_runs(
        self,
        *,
        after: Receipt | None = None,
        workflow: str | None = None,
        limit: int = 100,
        timeout_s: float | None = None,
    ) -> list[IncompleteRun]:
        """List the workflow runs not settled yet, oldest first, from the projection (issue 17 item 4).

        The seed's ``getIncompleteTasks()``: no need to run them again by hand (a worker resumes an interrupted run
        by itself), but where each is and what it waits for. Read from the projection, so it lags the log by the
        projector's delay; ``after`` waits until the projection holds a receipt's request (read-your-writes).

        Args:
            after: A receipt (e.g. ``run_workflow``'s, or a ``pause_run``'s) the projection must hold first.
            workflow: Only this workflow's runs.
            limit: Most runs returned.
            timeout_s: Bound on the wait for ``after``, in seconds (default: the client's).

        Returns:
            The runs.

        Raises:
            ValueError: No projection is configured (``projection_dsn`` / ``SETTLED_POSTGRES_DSN`` empty), or
                ``limit`` is not positive.
            ReadYourWritesTimeoutError: ``after`` was not projected in time.
        """
        rows = self._projection_reader().workflow_runs(
            incomplete=True, workflow=workflow, limit=limit, after=after, timeout_s=self.timeout_s(timeout_s)
        )
        return [IncompleteRun.of(row) for row in rows]

    def get_run(
        self,
        run_id: str,
        *,
        conversation_id: str,
        after: Receipt | None = None,
        timeout_s: float | None = None,
    ) -> protocol.FlowRunView | None:
        """Return where a flow run is: status, flow, node, what it waits for (issue 18 item 2; the seed's ``getRun``).

        Read from the projection (`ProjectionReader.flow_run`), so it lags the log by the projector's delay; ``after``
        waits until the projection holds a receipt's request (read-your-writes).

        Args:
            run_id: The run (a flow submission's receipt ``run_id``).
            conversation_id: Its conversation (a run id names a run of one conversation, as every command does).
            after: A receipt (e.g. the turn's) the projection must hold first.
            timeout_s: Bound on the wait for ``after``, in seconds (default: the client's).

        Returns:
            The view, or None when the conversation holds no such run (or is not projected yet).

        Raises:
            ValueError: No projection is configured (``projection_dsn`` / ``SETTLED_POSTGRES_DSN`` empty).
            ReadYourWritesTimeoutError: ``after`` was not projected in time.
        """
        return self._projection_reader("get_run").flow_run(
            run_id, conversation_id=conversation_id, after=after, timeout_s=self.timeout_s(timeout_s)
        )

    def _projection_reader(self, method: str = "incomplete_runs") -> ProjectionReader:
        if not self._projection_dsn:
            raise ValueError(
                f"Client.{method} reads the projection: pass Client(projection_dsn=...) or set "
                f"SETTLED_POSTGRES_DSN (projection_dsn is {self._projection_dsn!r})"
            )
        with self._projection_lock:
            if self._projection is None:
                schema = self._projection_schema or default_schema(self.settings.namespace)
                self._projection = ProjectionReader(self._projection_dsn, ProjectionNames(schema))
            return self._projection

    # ------------------------------------------------------------------------------------------- approvals

    def approve(
        self,
        conversation_id: str,
        run_id: str,
        approval_id: str,
        *,
        args_digest: str,
        signing_key: Ed25519PrivateKey,
        key_id: str,
        reason: str | None = None,
        principal: str | None = None,
        command_id: str | None = None,
        timeout_s: float | None = None,
    ) -> Receipt:
        """Approve a run's approval with a signed `DecideApproval` and return the owner's reply (issue 16 item 4).

        See `decide_approval` for the arguments, the reply and the errors.
        """
        return self.decide_approval(
            conversation_id,
            run_id,
            approval_id,
            approved=True,
            args_digest=args_digest,
            signing_key=signing_key,
            key_id=key_id,
            reason=reason,
            principal=principal,
            command_id=command_id,
            timeout_s=timeout_s,
        )

    def deny(
        self,
        conversation_id: str,
        run_id: str,
        approval_id: str,
        *,
        args_digest: str,
        signing_key: Ed25519PrivateKey,
        key_id: str,
        reason: str | None = None,
        principal: str | None = None,
        command_id: str | None = None,
        timeout_s: float | None = None,
    ) -> Receipt:
        """Deny a run's approval with a signed `DecideApproval` and return the owner's reply (issue 16 item 4).

        See `decide_approval` for the arguments, the reply and the errors.
        """
        return self.decide_approval(
            conversation_id,
            run_id,
            approval_id,
            approved=False,
            args_digest=args_digest,
            signing_key=signing_key,
            key_id=key_id,
            reason=reason,
            principal=principal,
            command_id=command_id,
            timeout_s=timeout_s,
        )

    def decide_approval(
        self,
        conversation_id: str,
        run_id: str,
        approval_id: str,
        *,
        approved: bool,
        args_digest: str,
        signing_key: Ed25519PrivateKey,
        key_id: str,
        reason: str | None = None,
        principal: str | None = None,
        command_id: str | None = None,
        timeout_s: float | None = None,
    ) -> Receipt:
        """Approve or deny a run's approval and return the owner's reply (issue 16 item 4).

        The decision is signed with ``signing_key`` (Ed25519 over `DecideApproval.signing_bytes`); the owner verifies
        it against the workers' ``App.approver_keys[key_id]`` and accepts it only for an open approval of ``run_id``
        whose argument digest is ``args_digest`` (what the approver was shown). The run reads
        ``ApprovalDecision(approved, by=key_id, reason)``.

        Args:
            conversation_id: The conversation.
            run_id: The run (an agent run's id is its submission id).
            approval_id: The approval (its wait id, e.g. ``<run>#w<ordinal>``).
            approved: True to approve, False to deny.
            args_digest: The digest of the canonical arguments the approver saw (the request's ``args_digest``).
            signing_key: The approver's Ed25519 private key (see `load_signing_key`).
            key_id: The id the workers know the matching public key by ("by").
            reason: Why, recorded and shown to the run.
            principal: Who decides (default: the client's); recorded, and part of what is signed.
            command_id: The command's id; a new UUID when ``None`` (pass the id of an earlier decision whose
                outcome is unknown to send it again: it is answered as a duplicate if it was applied).
            timeout_s: Deadline, in seconds (default: the client's).

        Returns:
            The reply (request kind ``command``): outcome ``applied``, or ``duplicate`` for a repeated command.

        Raises:
            ValueError: An argument is invalid or breaks the input contract (the field is named); nothing was sent.
            TypeError: ``signing_key`` is not an ``Ed25519PrivateKey``; nothing was sent.
            ApprovalRejectedError: The owner rejected it (its reason; the wait stays open).
            ApprovalOutcomeUnknownError: No reply within the deadline; names the command id to send again.
            BrokerUnavailableError: Kafka could not be reached before anything was sent.
            InboxProduceError: The broker refused the record permanently.
        """
        timeout = self.timeout_s(timeout_s)
        deadline = time.monotonic() + timeout
        for name, text in (
            ("conversation_id", conversation_id),
            ("run_id", run_id),
            ("approval_id", approval_id),
            ("key_id", key_id),
        ):
            if not text.strip():
                raise ValueError(f"{name} must not be empty, got {text!r}")
        cid = command_id if command_id is not None else str(uuid.uuid4())
        _require_ed25519(signing_key)
        try:
            unsigned = DecideApproval(
                command_id=cid,
                principal=self._principal(principal),
                conversation_id=conversation_id,
                submission_id=run_id,
                approval_id=approval_id,
                args_digest=args_digest,
                approved=approved,
                reason=reason,
                key_id=key_id,
                signature=b"",
                requested_at=self._clock(),
            )
        except ValidationError as exc:
            raise ValueError(f"args_digest must be 64 lowercase hex digits, got {args_digest!r}") from exc
        return self._command(
            unsigned,
            deadline,
            lambda: ApprovalOutcomeUnknownError(cid, conversation_id, run_id, timeout),
            ApprovalRejectedError,
            signing_key=signing_key,
        )

    # ---------------------------------------------------------------------------------------------- access

    def grant_access(
        self,
        conversation_id: str,
        grantee: str,
        access: AccessLevel | str = AccessLevel.READ,
        *,
        principal: str | None = None,
        command_id: str | None = None,
        timeout_s: float | None = None,
    ) -> Receipt:
        """Grant another principal access to a conversation and return the owner's reply (issue 20).

        ``read`` lets the grantee see the conversation through the HTTP API; ``act`` also lets it submit turns and
        send commands. A later grant replaces an earlier one. The owner checks who grants only for records the HTTP
        API signed (its opener or an admin); this client is a trusted inbox writer (docs/architecture.md).

        Args:
            conversation_id: The conversation (opened: it has an admitted submission).
            grantee: The principal granted access.
            access: ``read`` or ``act``.
            principal: Who grants (default: the client's).
            command_id: The command's id; a new UUID when ``None`` (pass the id of an earlier grant whose outcome is
                unknown to send it again: it is answered as a duplicate if it was applied).
            timeout_s: Deadline, in seconds (default: the client's).

        Returns:
            The reply (request kind ``command``): outcome ``applied``, or ``duplicate`` for a repeated command.

        Raises:
            ValueError: An argument breaks the input contract (the field is named) or ``access`` is not read or act;
                nothing was sent.
            AccessRejectedError: The owner rejected it (``unknown_target``, ``invalid``, ``unauthorized``).
            AccessOutcomeUnknownError: No reply within the deadline; names the command id to send again.
            BrokerUnavailableError: Kafka could not be reached before anything was sent.
            InboxProduceError: The broker refused the record permanently.
        """
        cid = command_id if command_id is not None else str(uuid.uuid4())
        command = GrantAccess(
            command_id=cid,
            principal=self._principal(principal),
            conversation_id=conversation_id,
            grantee=grantee,
            access=_enum_value(AccessLevel, access, "access"),
            requested_at=self._clock(),
        )
        return self._access_command(command, timeout_s)

    def revoke_access(
        self,
        conversation_id: str,
        grantee: str,
        *,
        principal: str | None = None,
        command_id: str | None = None,
        timeout_s: float | None = None,
    ) -> Receipt:
        """Revoke a principal's granted access to a conversation and return the owner's reply (issue 20).

        Args:
            conversation_id: The conversation.
            grantee: The principal whose access ends (it must hold a grant).
            principal: Who revokes (default: the client's).
            command_id: The command's id; a new UUID when ``None`` (pass the id of an earlier revocation whose
                outcome is unknown to send it again).
            timeout_s: Deadline, in seconds (default: the client's).

        Returns:
            The reply (request kind ``command``): outcome ``applied``, or ``duplicate`` for a repeated command.

        Raises:
            ValueError: An argument breaks the input contract (the field is named); nothing was sent.
            AccessRejectedError: The owner rejected it (``unknown_target``: no grant to revoke, or no such
                conversation; ``invalid``; ``unauthorized``).
            AccessOutcomeUnknownError: No reply within the deadline; names the command id to send again.
            BrokerUnavailableError: Kafka could not be reached before anything was sent.
            InboxProduceError: The broker refused the record permanently.
        """
        cid = command_id if command_id is not None else str(uuid.uuid4())
        command = RevokeAccess(
            command_id=cid,
            principal=self._principal(principal),
            conversation_id=conversation_id,
            grantee=grantee,
            requested_at=self._clock(),
        )
        return self._access_command(command, timeout_s)

    def set_lane(
        self,
        conversation_id: str,
        lane: LanePolicy | str,
        *,
        principal: str | None = None,
        command_id: str | None = None,
        timeout_s: float | None = None,
    ) -> Receipt:
        """Change a conversation's lane policy from now on and return the owner's reply (issue 22 item 1).

        The change is canonical (a `LaneSet` in the conversation's log) before any later submission is decided under
        it; submissions already admitted keep what their admission decided.

        Args:
            conversation_id: The conversation (opened: its first submission chose its first lane).
            lane: ``queue``, ``join``, ``reject``, ``interrupt`` or ``keep_newest``.
            principal: Who asks: the conversation's opener or a principal granted ``act`` (default: the client's).
            command_id: The command's id; a new UUID when ``None`` (pass the id of an earlier one whose outcome is
                unknown to send it again).
            timeout_s: Deadline, in seconds (default: the client's).

        Returns:
            The reply (request kind ``command``): outcome ``applied``, or ``duplicate`` for a repeated command.

        Raises:
            ValueError: ``lane`` is not a lane policy, or an argument breaks the input contract (the field is named);
                nothing was sent.
            LaneRejectedError: The owner rejected it (``unknown_target``, ``unauthorized``, ``invalid``).
            LaneOutcomeUnknownError: No reply within the deadline; names the command id to send again.
            BrokerUnavailableError: Kafka could not be reached before anything was sent.
            InboxProduceError: The broker refused the record permanently.
        """
        timeout = self.timeout_s(timeout_s)
        deadline = time.monotonic() + timeout
        cid = command_id if command_id is not None else str(uuid.uuid4())
        command = SetLane(
            command_id=cid,
            principal=self._principal(principal),
            conversation_id=conversation_id,
            lane=_enum_value(LanePolicy, lane, "lane"),
            requested_at=self._clock(),
        )
        return self._command(
            command,
            deadline,
            lambda: LaneOutcomeUnknownError(cid, conversation_id, timeout),
            LaneRejectedError,
        )

    def _access_command(self, command: GrantAccess | RevokeAccess, timeout_s: float | None) -> Receipt:
        timeout = self.timeout_s(timeout_s)
        return self._command(
            command,
            time.monotonic() + timeout,
            lambda: AccessOutcomeUnknownError(command.command_id, command.conversation_id, command.grantee, timeout),
            AccessRejectedError,
        )

    # ----------------------------------------------------------------------------------------------- abort

    def abort(
        self,
        conversation_id: str,
        submission_id: str,
        *,
        reason: str | None = None,
        principal: str | None = None,
        command_id: str | None = None,
        timeout_s: float | None = None,
    ) -> Receipt:
        """Ask the owner to abort a submission and return its reply (DUR-012, docs/semantics.md §13).

        Args:
            conversation_id: The conversation.
            submission_id: The submission to abort.
            reason: Free text recorded with the abort.
            principal: Who asks (default: the client's).
            command_id: The command's id; a new UUID when ``None`` (pass the id of an earlier abort whose outcome
                is unknown to send it again: it is answered as a duplicate if it was applied).
            timeout_s: Deadline, in seconds (default: the client's).

        Returns:
            The reply (request kind ``command``): outcome ``applied``, or ``duplicate`` for a repeated command.

        Raises:
            ValueError: If an argument is empty or breaks the input contract (`settled.protocol.check_command`; the
                field is named); nothing was sent.
            AbortRejectedError: The owner rejected it (e.g. ``unknown_target``; ``already_terminal`` names the outcome
                that won the race).
            AbortOutcomeUnknownError: No reply within the deadline; names the command id to send again.
            BrokerUnavailableError: Kafka could not be reached before anything was sent.
            InboxProduceError: The broker refused the record permanently.
        """
        timeout = self.timeout_s(timeout_s)
        deadline = time.monotonic() + timeout
        for name, text in (("conversation_id", conversation_id), ("submission_id", submission_id)):
            if not text.strip():
                raise ValueError(f"{name} must not be empty, got {text!r}")
        cid = command_id if command_id is not None else str(uuid.uuid4())
        if not cid.strip():
            raise ValueError(f"command_id must not be empty, got {cid!r}")
        command = AbortRequested(
            command_id=cid,
            principal=self._principal(principal),
            conversation_id=conversation_id,
            submission_id=submission_id,
            reason=reason,
            requested_at=self._clock(),
        )
        return self._command(
            command,
            deadline,
            lambda: AbortOutcomeUnknownError(cid, conversation_id, submission_id, timeout),
            AbortRejectedError,
        )

    # ------------------------------------------------------------------------------------------- resolve

    def resolve_unknown(
        self,
        conversation_id: str,
        submission_id: str,
        call_id: str,
        *,
        kind: ResolutionKind | str,
        signing_key: Ed25519PrivateKey,
        key_id: str,
        result: Any = NO_RESULT,
        outcome: SettlementOutcome | str | None = None,
        reply: Any = None,
        principal: str | None = None,
        command_id: str | None = None,
        timeout_s: float | None = None,
    ) -> Receipt:
        """Resolve an Unknown tool call with a signed `ResolveUnknown` and return the owner's reply (DUR-009).

        A call interrupted between ``ToolCallPrepared`` and ``ToolCallSettled`` whose tool is neither idempotent nor
        reconcilable is Unknown: its run stops and its conversation waits until an authorized resolution decides it
        (docs/design.md §5). The command is signed with ``signing_key`` (Ed25519 over `ResolveUnknown.signing_bytes`);
        the owner verifies it against the workers' ``App.resolver_keys[key_id]`` before deciding anything.

        Args:
            conversation_id: The conversation.
            submission_id: The submission whose call is Unknown.
            call_id: The Unknown call (``settled unknown list`` shows it).
            kind: ``call_outcome`` (``result`` is the call's result: the run continues with it),
                ``safe_to_retry`` (the call never took effect: it is prepared again under its key and runs), or
                ``outcome_for_submission`` (``outcome`` settles the submission; ``reply`` is its reply when
                completed).
            signing_key: The resolver's Ed25519 private key (see `load_signing_key`).
            key_id: The id the workers know the matching public key by.
            result: For ``call_outcome`` only, and required there: the call's result, a JSON-compatible value
                (``None`` is the JSON null result).
            outcome: For ``outcome_for_submission`` only, and required there: ``completed``, ``failed`` or
                ``aborted`` (an abort already recorded for the submission settles it aborted whatever this says).
            reply: For ``outcome_for_submission`` with outcome ``completed`` only: the submission's reply, a
                JSON-compatible value (``None``: no reply).
            principal: Who resolves (default: the client's); recorded, and part of what is signed.
            command_id: The command's id; a new UUID when ``None`` (pass the id of an earlier resolution whose
                outcome is unknown to send it again: it is answered as a duplicate if it was applied).
            timeout_s: Deadline, in seconds (default: the client's).

        Returns:
            The reply (request kind ``command``): outcome ``applied``, or ``duplicate`` for a repeated command.

        Raises:
            ValueError: If an argument is invalid or a field does not fit ``kind`` (the field is named); nothing was
                sent.
            TypeError: If ``signing_key`` is not an ``Ed25519PrivateKey``; nothing was sent.
            PayloadTooLargeError: If the encoded command exceeds ``max_payload_bytes``; nothing was sent.
            ResolveRejectedError: The owner rejected it (``unsigned``, ``unknown_key``, ``bad_signature``;
                ``not_unknown``; ``unknown_target``; ``already_terminal``; ``invalid``).
            ResolveOutcomeUnknownError: No reply within the deadline; names the command id to send again.
            BrokerUnavailableError: Kafka could not be reached before anything was sent.
            InboxProduceError: The broker refused the record permanently.
        """
        timeout = self.timeout_s(timeout_s)
        deadline = time.monotonic() + timeout
        for name, text in (
            ("conversation_id", conversation_id),
            ("submission_id", submission_id),
            ("call_id", call_id),
            ("key_id", key_id),
        ):
            if not text.strip():
                raise ValueError(f"{name} must not be empty, got {text!r}")
        cid = command_id if command_id is not None else str(uuid.uuid4())
        if not cid.strip():
            raise ValueError(f"command_id must not be empty, got {cid!r}")
        _require_ed25519(signing_key)
        resolution_kind = _enum_value(ResolutionKind, kind, "kind")
        settles = None if outcome is None else _enum_value(SettlementOutcome, outcome, "outcome")
        result_json = self._resolution_json(resolution_kind, settles, result, reply)
        fields: dict[str, Any] = {
            "command_id": cid,
            "principal": self._principal(principal),
            "conversation_id": conversation_id,
            "submission_id": submission_id,
            "call_id": call_id,
            "kind": resolution_kind,
            "outcome": settles,
            "result_json": result_json,
            "key_id": key_id,
            "requested_at": self._clock(),
        }
        return self._command(
            ResolveUnknown(**fields, signature=b""),
            deadline,
            lambda: ResolveOutcomeUnknownError(cid, conversation_id, submission_id, call_id, timeout),
            ResolveRejectedError,
            signing_key=signing_key,
            size_checked="resolution",
        )

    def retry_submission(
        self,
        conversation_id: str,
        submission_id: str,
        *,
        signing_key: Ed25519PrivateKey,
        key_id: str,
        new_submission_id: str | None = None,
        principal: str | None = None,
        command_id: str | None = None,
        timeout_s: float | None = None,
    ) -> Receipt:
        """Admit a dead letter's payload again as a new submission with a signed `RetrySubmission` (issue 22 item 4).

        A dead letter is a submission that settled failed with error type ``retry_budget_exhausted``. Its failed
        settlement stands; the owner admits its input and offered tools once more as ``new_submission_id``, the
        conversation's next submission (``retry_of`` names the original). A second retry of the same original is a
        duplicate whose receipt points at the first retry. Signed like `resolve_unknown`: Ed25519 over
        `RetrySubmission.signing_bytes`, verified by the owner against the workers' ``App.resolver_keys[key_id]``.

        Args:
            conversation_id: The conversation.
            submission_id: The dead letter.
            signing_key: The resolver's Ed25519 private key (see `load_signing_key`).
            key_id: The id the workers know the matching public key by.
            new_submission_id: The id of the submission it admits (default: a new UUID).
            principal: Who retries (default: the client's); part of what is signed.
            command_id: The command's id, also the new submission's idempotency key; a new UUID when ``None`` (pass
                the id of an earlier retry whose outcome is unknown to send it again).
            timeout_s: Deadline, in seconds (default: the client's).

        Returns:
            The reply (request kind ``command``): outcome ``applied`` naming the new submission
            (``original_submission_id``) and its ``submission_seq``, or ``duplicate`` naming the first retry and its
            sequence. `wait` on it waits for that submission's settlement.

        Raises:
            ValueError: If an argument is empty or breaks the input contract (the field is named); nothing was sent.
            TypeError: If ``signing_key`` is not an ``Ed25519PrivateKey``; nothing was sent.
            PayloadTooLargeError: If the encoded command exceeds ``max_payload_bytes``; nothing was sent.
            RetryRejectedError: The owner rejected it (``unsigned``, ``unknown_key``, ``bad_signature``;
                ``unknown_target``; ``not_dead_lettered``; ``invalid``).
            RetryOutcomeUnknownError: No reply within the deadline; names the command id to send again.
            BrokerUnavailableError: Kafka could not be reached before anything was sent.
            InboxProduceError: The broker refused the record permanently.
        """
        timeout = self.timeout_s(timeout_s)
        deadline = time.monotonic() + timeout
        for name, text in (("conversation_id", conversation_id), ("submission_id", submission_id), ("key_id", key_id)):
            if not text.strip():
                raise ValueError(f"{name} must not be empty, got {text!r}")
        cid = command_id if command_id is not None else str(uuid.uuid4())
        if not cid.strip():
            raise ValueError(f"command_id must not be empty, got {cid!r}")
        _require_ed25519(signing_key)
        fields: dict[str, Any] = {
            "command_id": cid,
            "principal": self._principal(principal),
            "conversation_id": conversation_id,
            "submission_id": submission_id,
            "new_submission_id": new_submission_id if new_submission_id is not None else str(uuid.uuid4()),
            "key_id": key_id,
            "requested_at": self._clock(),
        }
        return self._command(
            RetrySubmission(**fields, signature=b""),
            deadline,
            lambda: RetryOutcomeUnknownError(cid, conversation_id, submission_id, timeout),
            RetryRejectedError,
            signing_key=signing_key,
            size_checked="retry",
        )

    @staticmethod
    def _resolution_json(
        kind: ResolutionKind, outcome: SettlementOutcome | None, result: Any, reply: Any
    ) -> str | None:
        """Check the kind-specific fields of a resolution and return its ``result_json`` (docs/design.md §5)."""
        if kind is ResolutionKind.OUTCOME_FOR_SUBMISSION:
            if outcome is None:
                raise ValueError("outcome is required when kind is outcome_for_submission (completed, failed, aborted)")
            if result is not NO_RESULT:
                raise ValueError("result is only for kind call_outcome; outcome_for_submission takes reply")
            if reply is not None and outcome is not SettlementOutcome.COMPLETED:
                raise ValueError(f"reply is only recorded with outcome completed, got outcome {outcome.value}")
            return None if reply is None else _json_field(reply, "reply")
        if outcome is not None:
            raise ValueError(f"outcome is only for kind outcome_for_submission, got kind {kind.value}")
        if reply is not None:
            raise ValueError(f"reply is only for kind outcome_for_submission, got kind {kind.value}")
        if kind is ResolutionKind.CALL_OUTCOME:
            if result is NO_RESULT:
                raise ValueError("result is required when kind is call_outcome (the call's result)")
            return _json_field(result, "result")
        if result is not NO_RESULT:
            raise ValueError("result is only for kind call_outcome; safe_to_retry carries no result")
        return None

    # ------------------------------------------------------------------------------------------ settlements

    def wait(self, receipt: Receipt, timeout_s: float | None = None) -> SettlementRecord:
        """Return the settlement of the submission a receipt admitted (docs/design.md §4).

        Every wait of a client is served by one shared background reader of ``settled.settlements``
        (`settled.client._waits`), which reads the conversation's partition from the receipt's ``decided_at`` (less
        ``settlement_lookback_s``) at the latest; a settlement read before the wait began is kept for it.

        Args:
            receipt: An ``admitted`` or ``duplicate`` submission receipt (for a duplicate, the original submission's
                settlement is returned).
            timeout_s: Deadline, in seconds (default: the client's).

        Returns:
            The settlement record: outcome, reply (or its digest and reference), error type and reason, attempts.

        Raises:
            ValueError: If the receipt is not an admitted or duplicate submission receipt.
            SettlementTimeoutError: None within the deadline; names the submission.
            BrokerUnavailableError: The settlements topic does not exist, or Kafka did not answer.
        """
        conversation_id, submission_id, since = self.settlement_target(receipt)
        if self._closed:
            raise ClientError("the client is closed")
        return self._settlements.wait(conversation_id, submission_id, since, self.timeout_s(timeout_s))

    def settlement_target(self, receipt: Receipt) -> tuple[str, str, datetime]:
        """Return what a wait for ``receipt``'s settlement reads: conversation, submission and the time to read from.

        Args:
            receipt: An ``admitted`` or ``duplicate`` submission receipt (a duplicate names the original submission),
                or a retry's receipt (`retry_submission`: it names the submission it admitted, or the first retry).

        Returns:
            (conversation id, submission id, the receipt's ``decided_at`` less ``settlement_lookback_s``).

        Raises:
            ValueError: If the receipt is not an admitted or duplicate submission receipt.
        """
        if receipt.request_kind is RequestKind.COMMAND and receipt.original_submission_id is not None:
            # A retry's receipt (issue 22 item 4) names the submission it admitted, or the first retry.
            return receipt.conversation_id, receipt.original_submission_id, receipt.decided_at - self._lookback
        if receipt.request_kind is not RequestKind.SUBMISSION:
            raise ValueError(f"receipt.request_kind is {receipt.request_kind.value!r}: only submissions settle")
        if receipt.outcome not in (ReceiptOutcome.ADMITTED, ReceiptOutcome.DUPLICATE):
            raise ValueError(
                f"receipt.outcome is {receipt.outcome.value!r} for submission {receipt.request_id}: only an admitted "
                "(or duplicate) submission settles"
            )
        submission_id = receipt.original_submission_id or receipt.request_id
        return receipt.conversation_id, submission_id, receipt.decided_at - self._lookback

    @property
    def settlements_reader(self) -> SettlementsReader:
        """The shared settlements reader behind `wait` (started by the first wait)."""
        return self._settlements

    @property
    def closed(self) -> bool:
        """Whether `close` was called."""
        return self._closed

    def stream(self, receipt: Receipt, *, cursor: str | None = None, timeout_s: float | None = None) -> RunStream:
        """Follow a run's provisional stream until its settlement (issue 19; settled/client/_stream.py).

        Yields `Part` items (``ctx.emit`` values, model text deltas) as the run publishes them, before anything is
        committed, and a `Superseded` marker when a later attempt replaces an earlier one's parts. Each item has a
        cursor: a new ``stream(receipt, cursor=...)`` resumes right after it.

        Args:
            receipt: An ``admitted`` or ``duplicate`` submission receipt.
            cursor: Resume right after the item that carried it (default: from the run's admission).
            timeout_s: Bound on the whole follow, in seconds (default: the client's).

        Returns:
            The iterator (close it, or use it as a context manager); ``.settlement`` is set when it ends.

        Raises:
            ValueError: The receipt is not an admitted or duplicate submission receipt, or the cursor is malformed.
            BrokerUnavailableError: A topic does not exist, or Kafka did not answer.
        """
        if receipt.request_kind is not RequestKind.SUBMISSION or receipt.outcome not in (
            ReceiptOutcome.ADMITTED,
            ReceiptOutcome.DUPLICATE,
        ):
            raise ValueError(
                f"receipt of {receipt.request_kind.value} {receipt.request_id} is {receipt.outcome.value!r}: only an "
                "admitted (or duplicate) submission has a stream"
            )
        if self._closed:
            raise ClientError("the client is closed")
        return RunStream(
            self.settings,
            self._codec,
            receipt.conversation_id,
            receipt.original_submission_id or receipt.request_id,
            receipt.decided_at - self._lookback,
            cursor,
            self.timeout_s(timeout_s),
        )

    def settlements(
        self,
        *,
        from_beginning: bool = False,
        since: datetime | None = None,
        idle_timeout_s: float | None = None,
    ) -> SettlementStream:
        """Iterate over ``settled.settlements`` for downstream consumers (read_committed; docs/design.md §2).

        Args:
            from_beginning: Start at the first record of each partition.
            since: Start at the first record at or after this time (aware); ignored with ``from_beginning``.
                Neither: start at the end (only settlements committed from now on).
            idle_timeout_s: Stop after this long without a record, in seconds; ``None``: never stop.

        Returns:
            An iterator of settlement records, each conversation's in log order, positioned at once (close it, or
            use it in a ``with`` block, to release its consumer).

        Raises:
            BrokerUnavailableError: The topic does not exist, or Kafka did not answer the position lookups.
        """
        return SettlementStream(
            self.settings,
            self._codec,
            from_beginning=from_beginning,
            since=since,
            idle_timeout_s=idle_timeout_s,
            timeout_s=self._default_timeout_s,
        )

    def lifecycle_events(
        self,
        pattern: str = "durable.*",
        *,
        from_beginning: bool = False,
        since: datetime | None = None,
        idle_timeout_s: float | None = None,
    ) -> LifecycleStream:
        """Subscribe to the runs' ``durable.*`` lifecycle events on ``settled.lifecycle`` (read_committed; issue 17).

        Each event is produced in the transaction that makes its cause canonical (docs/architecture.md, "Lifecycle
        events"): it is seen once per occurrence, each run's events in order; ``event_id`` dedupes a re-read.

        Args:
            pattern: Which types to yield (``fnmatch``, case-sensitive): ``"durable.*"``, ``"durable.approval_*"``,
                or one type.
            from_beginning: Start at the first record of each partition.
            since: Start at the first record at or after this time (aware); ignored with ``from_beginning``.
                Neither: start at the end (only events committed from now on).
            idle_timeout_s: Stop after this long without a record, in seconds; ``None``: never stop.

        Returns:
            An iterator of `settled.schemas.LifecycleEvent`, positioned at once (close it, or use it in a ``with``
            block, to release its consumer).

        Raises:
            ValueError: ``pattern`` is empty.
            BrokerUnavailableError: The topic does not exist, or Kafka did not answer the position lookups.
        """
        return LifecycleStream(
            self.settings,
            self._codec,
            pattern,
            from_beginning=from_beginning,
            since=since,
            idle_timeout_s=idle_timeout_s,
            timeout_s=self._default_timeout_s,
        )

    # ------------------------------------------------------------------------------------------- internals

    def timeout_s(self, timeout_s: float | None) -> float:
        """Return a request's deadline: ``timeout_s``, or the client's default.

        Args:
            timeout_s: The deadline asked for, in seconds, or None.

        Returns:
            The deadline, in seconds.

        Raises:
            ValueError: It is not positive.
        """
        timeout = self._default_timeout_s if timeout_s is None else timeout_s
        if timeout <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout}")
        return timeout

    def _principal(self, principal: str | None) -> str:
        who = self.principal if principal is None else principal
        if not who.strip():
            raise ValueError(f"principal must not be empty, got {who!r}")
        return who

    def _ensure_reader(self, deadline: float) -> ReceiptsReader:
        if self._closed:
            raise ClientError("the client is closed")
        with self._reader_lock:
            if not self._reader.started:
                self._reader.start(max(deadline - time.monotonic(), 0.1))
        return self._reader

    def _command(
        self,
        command: _Command,
        deadline: float,
        unknown: Callable[[], OutcomeUnknownError],
        rejected: Callable[[Receipt], CommandRejectedError],
        *,
        signing_key: Ed25519PrivateKey | None = None,
        size_checked: str | None = None,
    ) -> Receipt:
        """Send one command and return its receipt when the owner applied it (or it is a duplicate).

        The command is checked against the input contract, signed when ``signing_key`` is given (its
        ``signing_bytes`` with an empty signature, which ``command`` must carry), encoded, and produced by `_request`.

        Args:
            command: The command (unsigned when ``signing_key`` is given).
            deadline: The request's deadline, on the monotonic clock, in seconds.
            unknown: Builds the error raised when no receipt comes in time.
            rejected: Builds the error raised for a rejection receipt.
            signing_key: The Ed25519 key signing the command (approvals, resolutions, retries), or None.
            size_checked: The request's name in `PayloadTooLargeError` when the encoded command must fit
                ``max_payload_bytes`` (None: not checked here).

        Returns:
            The receipt: ``applied``, or ``duplicate`` for a repeated command id.

        Raises:
            ValueError: The command breaks the input contract (the field is named); nothing was sent.
            PayloadTooLargeError: The encoded command exceeds ``max_payload_bytes``; nothing was sent.
            CommandRejectedError: What ``rejected`` builds, for a rejection.
            OutcomeUnknownError: What ``unknown`` builds, when no receipt came in time.
            UnexpectedReceiptError: The receipt is not a command's, or has another outcome.
        """
        _keep_contract(protocol.check_command(command))
        if signing_key is not None:
            command = command.model_copy(update={"signature": signing_key.sign(_signing_bytes(command))})
        encoded = self._codec.encode(command)
        if size_checked is not None and len(encoded) > self._max_payload_bytes:
            raise PayloadTooLargeError(
                command.conversation_id, len(encoded), self._max_payload_bytes, request=size_checked
            )
        receipt = self._request(command.conversation_id, command.command_id, encoded, deadline, unknown)
        if receipt.request_kind is not RequestKind.COMMAND:
            raise UnexpectedReceiptError(receipt)
        if receipt.outcome in (ReceiptOutcome.APPLIED, ReceiptOutcome.DUPLICATE):
            return receipt
        if receipt.outcome is ReceiptOutcome.REJECTED:
            raise rejected(receipt)
        raise UnexpectedReceiptError(receipt)

    def _request(
        self,
        conversation_id: str,
        request_id: str,
        value: bytes,
        deadline: float,
        unknown: Callable[[], OutcomeUnknownError],
    ) -> Receipt:
        """Produce one inbox record and return the receipt read for ``request_id``.

        The reader is started (capturing the receipts' end offsets) and the waiter registered before the record is
        produced. A failed delivery produces the same record again (a repeat is answered as a duplicate of the
        original, docs/design.md §4) until the deadline.
        """
        reader = self._ensure_reader(deadline)
        waiter = reader.expect(request_id)
        key = conversation_id.encode()
        try:
            self._send(key, value, waiter, deadline)  # raises only when nothing was queued
            permanent_failures = 0
            maybe_landed = False  # a copy whose delivery failed in a way that leaves it possibly written
            while True:
                got = waiter.wait(deadline - time.monotonic())
                if isinstance(got, Receipt):
                    return got
                if got is None:
                    raise unknown()
                _log.warning(
                    "inbox delivery failed; producing the record again",
                    extra={"request_id": request_id, "conversation_id": conversation_id, "error": str(got)},
                )
                if got.code() in _PERMANENT:
                    permanent_failures += 1
                    if permanent_failures >= _MAX_PERMANENT_TRIES:
                        if maybe_landed:
                            raise unknown()
                        raise InboxProduceError(request_id, conversation_id, got.str(), permanent_failures)
                else:
                    maybe_landed = True
                if time.monotonic() >= deadline:
                    raise unknown()
                try:
                    self._send(key, value, waiter, deadline)
                except (BrokerUnavailableError, InboxProduceError) as exc:
                    if maybe_landed:
                        raise unknown() from exc
                    raise
        finally:
            reader.forget(waiter)

    def _send(self, key: bytes, value: bytes, waiter: ReceiptWaiter, deadline: float) -> None:
        """Queue one copy of the record; raises only when it was not queued."""

        def on_delivery(err: KafkaError | None, _msg: Message) -> None:
            if err is not None:
                waiter.delivery_failed(err)

        headers: list[tuple[str, str | bytes | None]] | None = None
        if self._api_signer is not None:
            key_id, signing_key, access = self._api_signer
            signature = signing_key.sign(protocol.api_signing_bytes(value, access))
            headers = list(zip(protocol.API_HEADERS, (key_id.encode(), signature, access.encode()), strict=True))
        try:
            self._producer.send(self._inbox_topic, key, value, on_delivery, deadline, headers)
        except KafkaException as exc:
            raise InboxProduceError(waiter.request_id, key.decode(), str(exc.args[0]), 1) from exc
