"""`Client`: submit turns, abort them, wait for and stream their settlements (DESIGN.md §4; issue 5 item 8).

One client holds one idempotent inbox producer and one receipts reader, both shared by every thread that calls it
(DESIGN.md §4: one shared receipts reader per process — use one client per process). ``submit()`` returns only after
reading its receipt; when none comes within its deadline it raises `SubmissionOutcomeUnknown` naming the idempotency
key, never a false success: submitting again with the same key and payload returns the original receipt.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime, timedelta
from types import TracebackType
from typing import Any, Self

from confluent_kafka import KafkaError, KafkaException, Message

from settled._settings import Settings
from settled.client._errors import (
    AbortOutcomeUnknown,
    AbortRejected,
    BrokerUnavailable,
    ClientError,
    IdempotencyConflict,
    InboxProduceError,
    OutcomeUnknown,
    PayloadTooLarge,
    SubmissionOutcomeUnknown,
    SubmissionRejected,
    UnexpectedReceipt,
    reason_parts,
)
from settled.client._inbox import InboxProducer
from settled.client._receipts import ReceiptsReader, ReceiptWaiter
from settled.client._settlements import SettlementStream, read_settlement
from settled.schemas import (
    AbortRequested,
    CanonicalJsonError,
    Codec,
    Receipt,
    ReceiptOutcome,
    RequestKind,
    SettlementRecord,
    SubmissionPayload,
    SubmissionProposed,
    canonical_json,
    payload_digest,
)

__all__ = ["DEFAULT_MAX_PAYLOAD_BYTES", "DEFAULT_PRINCIPAL", "Client"]

_log = logging.getLogger(__name__)

DEFAULT_MAX_PAYLOAD_BYTES = 1_000_000
"""settled's hard size limit for one inbox record value, in bytes: the worker's default ``max_input_bytes``
(`settled.processors.WorkerConfig`), over which it quarantines a record (DESIGN.md §4)."""

DEFAULT_PRINCIPAL = "default"
"""The principal of a client built without one (the idempotency scope is principal + conversation, DESIGN.md §4)."""

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


def _utcnow() -> datetime:
    return datetime.now(UTC)


class Client:
    """A settled client: ``submit``, ``wait``, ``abort``, ``settlements`` (DESIGN.md §4).

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
    ) -> None:
        """Build a client; nothing connects until the first request.

        Args:
            settings: Namespace and Kafka settings.
            principal: Default principal of submissions and commands.
            codec: The record codec (default: single-object encoding of the shipped schemas).
            default_timeout_s: Deadline of a request that names none, in seconds.
            max_payload_bytes: Largest encoded proposal sent, in bytes; keep it equal to the workers'
                ``max_input_bytes`` (a larger record would be quarantined, DESIGN.md §4).
            delivery_timeout_s: How long the producer keeps trying to deliver a record, in seconds (librdkafka's
                ``message.timeout.ms``). A record may land after ``submit()``'s deadline; that is safe.
            settlement_lookback_s: `wait` starts reading this many seconds before the receipt's ``decided_at``, a
                margin for clock skew between the deciding worker and the broker's record timestamps.
            producer_overrides: Further librdkafka properties of the inbox producer (``enable.idempotence`` must
                stay true and no ``transactional.id`` may be set).
            clock: Returns "now" (aware UTC), for ``proposed_at`` and ``requested_at``.

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
        self._closed = False

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
    ) -> Receipt:
        """Propose one turn and return its receipt (DUR-001, DESIGN.md §4).

        The input is canonicalised (RFC 8785) and digested; the `SubmissionProposed` record is produced keyed by the
        conversation id, and the call returns only once the owner's receipt is read.

        Args:
            conversation_id: The conversation.
            input: The turn's input, a JSON-compatible value.
            idempotency_key: The client key (scope: principal + conversation); a new UUID when ``None``.
            principal: Who submits (default: the client's).
            tools_offered: Names of the tools offered for this turn (DESIGN.md §5).
            timeout_s: Deadline, in seconds (default: the client's).

        Returns:
            The receipt: outcome ``admitted``, or ``duplicate`` pointing at the original submission
            (``original_submission_id``, ``submission_seq``) — both are success.

        Raises:
            ValueError: If an argument is invalid (the field is named); nothing was sent.
            PayloadTooLarge: If the encoded proposal exceeds ``max_payload_bytes``; nothing was sent.
            IdempotencyConflict: The key was admitted earlier with another payload.
            SubmissionRejected: Any other rejection (reason code, detail and field where known).
            SubmissionOutcomeUnknown: No receipt within the deadline; names the key to submit again with.
            BrokerUnavailable: Kafka could not be reached before anything was sent.
            InboxProduceError: The broker refused the record permanently.
        """
        timeout = self._timeout(timeout_s)
        deadline = time.monotonic() + timeout
        if not conversation_id.strip():
            raise ValueError(f"conversation_id must not be empty, got {conversation_id!r}")
        key = idempotency_key if idempotency_key is not None else str(uuid.uuid4())
        if not key.strip():
            raise ValueError(f"idempotency_key must not be empty, got {key!r}")
        who = self._principal(principal)
        try:
            input_json = canonical_json(input)
        except CanonicalJsonError as exc:
            raise ValueError(f"input is not JSON-compatible: {exc.reason}") from exc
        payload = SubmissionPayload(input_json=input_json, tools_offered=tuple(tools_offered))
        proposal = SubmissionProposed(
            submission_id=str(uuid.uuid4()),
            principal=who,
            conversation_id=conversation_id,
            idempotency_key=key,
            payload=payload,
            payload_digest=payload_digest(payload),
            proposed_at=self._clock(),
        )
        value = self._codec.encode(proposal)
        if len(value) > self._max_payload_bytes:
            raise PayloadTooLarge(conversation_id, len(value), self._max_payload_bytes)
        receipt = self._request(
            conversation_id,
            proposal.submission_id,
            value,
            deadline,
            lambda: SubmissionOutcomeUnknown(key, conversation_id, proposal.submission_id, timeout),
        )
        if receipt.request_kind is not RequestKind.SUBMISSION:
            raise UnexpectedReceipt(receipt)
        if receipt.outcome in (ReceiptOutcome.ADMITTED, ReceiptOutcome.DUPLICATE):
            return receipt
        if receipt.outcome is ReceiptOutcome.REJECTED:
            if reason_parts(receipt.reason)[0] == "idempotency_conflict":
                raise IdempotencyConflict(receipt)
            raise SubmissionRejected(receipt)
        raise UnexpectedReceipt(receipt)

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
        """Ask the owner to abort a submission and return its reply (DUR-012, spec §13).

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
            ValueError: If an argument is empty (named); nothing was sent.
            AbortRejected: The owner rejected it (e.g. ``unknown_target``; ``already_terminal`` names the outcome
                that won the race).
            AbortOutcomeUnknown: No reply within the deadline; names the command id to send again.
            BrokerUnavailable: Kafka could not be reached before anything was sent.
            InboxProduceError: The broker refused the record permanently.
        """
        timeout = self._timeout(timeout_s)
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
        encoded = self._codec.encode(command)
        receipt = self._request(
            conversation_id,
            cid,
            encoded,
            deadline,
            lambda: AbortOutcomeUnknown(cid, conversation_id, submission_id, timeout),
        )
        if receipt.request_kind is not RequestKind.COMMAND:
            raise UnexpectedReceipt(receipt)
        if receipt.outcome in (ReceiptOutcome.APPLIED, ReceiptOutcome.DUPLICATE):
            return receipt
        if receipt.outcome is ReceiptOutcome.REJECTED:
            raise AbortRejected(receipt)
        raise UnexpectedReceipt(receipt)

    # ------------------------------------------------------------------------------------------ settlements

    def wait(self, receipt: Receipt, timeout_s: float | None = None) -> SettlementRecord:
        """Return the settlement of the submission a receipt admitted (DESIGN.md §4).

        Reads the conversation's partition of ``settled.settlements`` from the receipt's ``decided_at`` (less
        ``settlement_lookback_s``), found with ``offsets_for_times``, until the submission's settlement.

        Args:
            receipt: An ``admitted`` or ``duplicate`` submission receipt (for a duplicate, the original submission's
                settlement is returned).
            timeout_s: Deadline, in seconds (default: the client's).

        Returns:
            The settlement record: outcome, reply (or its digest and reference), error type and reason, attempts.

        Raises:
            ValueError: If the receipt is not an admitted or duplicate submission receipt.
            SettlementTimeout: None within the deadline; names the submission.
            BrokerUnavailable: The settlements topic does not exist, or Kafka did not answer.
        """
        if receipt.request_kind is not RequestKind.SUBMISSION:
            raise ValueError(f"receipt.request_kind is {receipt.request_kind.value!r}: only submissions settle")
        if receipt.outcome not in (ReceiptOutcome.ADMITTED, ReceiptOutcome.DUPLICATE):
            raise ValueError(
                f"receipt.outcome is {receipt.outcome.value!r} for submission {receipt.request_id}: only an admitted "
                "(or duplicate) submission settles"
            )
        submission_id = receipt.original_submission_id or receipt.request_id
        return read_settlement(
            self.settings,
            self._codec,
            receipt.conversation_id,
            submission_id,
            receipt.decided_at - self._lookback,
            self._timeout(timeout_s),
        )

    def settlements(
        self,
        *,
        from_beginning: bool = False,
        since: datetime | None = None,
        idle_timeout_s: float | None = None,
    ) -> SettlementStream:
        """Iterate over ``settled.settlements`` for downstream consumers (read_committed; DESIGN.md §2).

        Args:
            from_beginning: Start at the first record of each partition.
            since: Start at the first record at or after this time (aware); ignored with ``from_beginning``.
                Neither: start at the end (only settlements committed from now on).
            idle_timeout_s: Stop after this long without a record, in seconds; ``None``: never stop.

        Returns:
            An iterator of settlement records, each conversation's in log order, positioned at once (close it, or
            use it in a ``with`` block, to release its consumer).

        Raises:
            BrokerUnavailable: The topic does not exist, or Kafka did not answer the position lookups.
        """
        return SettlementStream(
            self.settings,
            self._codec,
            from_beginning=from_beginning,
            since=since,
            idle_timeout_s=idle_timeout_s,
            timeout_s=self._default_timeout_s,
        )

    # ------------------------------------------------------------------------------------------- internals

    def _timeout(self, timeout_s: float | None) -> float:
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

    def _request(
        self,
        conversation_id: str,
        request_id: str,
        value: bytes,
        deadline: float,
        unknown: Callable[[], OutcomeUnknown],
    ) -> Receipt:
        """Produce one inbox record and return the receipt read for ``request_id``.

        The reader is started (capturing the receipts' end offsets) and the waiter registered before the record is
        produced. A failed delivery produces the same record again (a repeat is answered as a duplicate of the
        original, DESIGN.md §4) until the deadline.
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
                except (BrokerUnavailable, InboxProduceError) as exc:
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

        try:
            self._producer.send(self._inbox_topic, key, value, on_delivery, deadline)
        except KafkaException as exc:
            raise InboxProduceError(waiter.request_id, key.decode(), str(exc.args[0]), 1) from exc
