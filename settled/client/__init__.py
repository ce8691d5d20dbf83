"""settled.client: submit turns, abort them, wait for and stream their settlements (DESIGN.md §4; issue 5 item 8).

``Client(settings)`` holds one idempotent inbox producer and one receipts reader shared by all its threads;
``submit()`` returns only after reading the owner's receipt and raises `SubmissionOutcomeUnknown` — naming the
idempotency key to submit again with — when none comes in time, never a false success.
"""

from settled.client._client import DEFAULT_MAX_PAYLOAD_BYTES, DEFAULT_PRINCIPAL, Client
from settled.client._errors import (
    AbortOutcomeUnknown,
    AbortRejected,
    BrokerUnavailable,
    ClientError,
    IdempotencyConflict,
    InboxProduceError,
    OutcomeUnknown,
    PayloadTooLarge,
    SettlementTimeout,
    SubmissionOutcomeUnknown,
    SubmissionRejected,
    UnexpectedReceipt,
    reason_parts,
)
from settled.client._settlements import SettlementStream
from settled.producers._partitioner import murmur2, partition_for_key

__all__ = [
    "DEFAULT_MAX_PAYLOAD_BYTES",
    "DEFAULT_PRINCIPAL",
    "AbortOutcomeUnknown",
    "AbortRejected",
    "BrokerUnavailable",
    "Client",
    "ClientError",
    "IdempotencyConflict",
    "InboxProduceError",
    "OutcomeUnknown",
    "PayloadTooLarge",
    "SettlementStream",
    "SettlementTimeout",
    "SubmissionOutcomeUnknown",
    "SubmissionRejected",
    "UnexpectedReceipt",
    "murmur2",
    "partition_for_key",
    "reason_parts",
]
