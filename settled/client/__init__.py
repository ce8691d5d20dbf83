"""settled.client: submit turns, abort them, wait for and stream their settlements (docs/design.md §4; issue 5 item 8).

``Client(settings)`` holds one idempotent inbox producer and one receipts reader shared by all its threads;
``submit()`` returns only after reading the owner's receipt and raises `SubmissionOutcomeUnknownError` — naming the
idempotency key to submit again with — when none comes in time, never a false success.
``resolve_unknown()`` sends a signed resolution of an Unknown tool call (DUR-009); `load_signing_key` reads the
resolver's Ed25519 key.
"""

from settled.client._async import AsyncClient, AsyncLifecycleStream
from settled.client._client import DEFAULT_MAX_PAYLOAD_BYTES, DEFAULT_PRINCIPAL, NO_RESULT, Client
from settled.client._errors import (
    AbortOutcomeUnknownError,
    AbortRejectedError,
    AccessOutcomeUnknownError,
    AccessRejectedError,
    ApprovalOutcomeUnknownError,
    ApprovalRejectedError,
    BrokerUnavailableError,
    ClientError,
    CommandOutcomeUnknownError,
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
    SettlementTimeoutError,
    SignalOutcomeUnknownError,
    SignalRejectedError,
    SigningKeyError,
    SteerOutcomeUnknownError,
    SteerRejectedError,
    SubmissionOutcomeUnknownError,
    SubmissionRejectedError,
    UnexpectedReceiptError,
    reason_parts,
)
from settled.client._keys import load_signing_key, public_key_b64, write_signing_key
from settled.client._lifecycle import LifecycleStream
from settled.client._runs import IncompleteRun
from settled.client._settlements import SettlementStream
from settled.client._stream import Part, RunStream, StreamItem, Superseded
from settled.producers._partitioner import murmur2, partition_for_key

__all__ = [
    "DEFAULT_MAX_PAYLOAD_BYTES",
    "DEFAULT_PRINCIPAL",
    "NO_RESULT",
    "AbortOutcomeUnknownError",
    "AbortRejectedError",
    "AccessOutcomeUnknownError",
    "AccessRejectedError",
    "ApprovalOutcomeUnknownError",
    "ApprovalRejectedError",
    "AsyncClient",
    "AsyncLifecycleStream",
    "BrokerUnavailableError",
    "Client",
    "ClientError",
    "CommandOutcomeUnknownError",
    "CommandRejectedError",
    "IdempotencyConflictError",
    "InboxProduceError",
    "IncompleteRun",
    "LaneOutcomeUnknownError",
    "LaneRejectedError",
    "LifecycleStream",
    "OutcomeUnknownError",
    "Part",
    "PayloadTooLargeError",
    "ResolveOutcomeUnknownError",
    "ResolveRejectedError",
    "RetryOutcomeUnknownError",
    "RetryRejectedError",
    "RunStream",
    "SettlementStream",
    "SettlementTimeoutError",
    "SignalOutcomeUnknownError",
    "SignalRejectedError",
    "SigningKeyError",
    "SteerOutcomeUnknownError",
    "SteerRejectedError",
    "StreamItem",
    "SubmissionOutcomeUnknownError",
    "SubmissionRejectedError",
    "Superseded",
    "UnexpectedReceiptError",
    "load_signing_key",
    "murmur2",
    "partition_for_key",
    "public_key_b64",
    "reason_parts",
    "write_signing_key",
]
