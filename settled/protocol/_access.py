"""Who may see a conversation, for inbox records the HTTP API signed (issue 20 item 3).

The HTTP API publishes every record with the principal of the caller's token and signs it (Kafka headers, see
`API_HEADERS`) with its Ed25519 key over `api_signing_bytes`: the record's value and the caller's access (``owner``:
only conversations the principal opened; ``all``: an ``admin`` token). The partition owner verifies the signature and
then checks access against the conversation's canonical state: a conversation is **opened** by the principal of its
first admitted submission (``submission_seq`` 1, in the log for good), and a signed record of another principal is
decided as if the conversation held nothing it could name (`hidden`): a command gets the same ``unknown_target``
rejection a missing target gets. Records without the API's headers (the Python client, raw producers: trusted inbox
writers) are decided as before, whatever principal they carry.

Not done yet: access granted to and revoked from other principals (records of their own).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from settled.protocol._fold import ConversationState

__all__ = [
    "ACCESS_ALL",
    "ACCESS_OWNER",
    "API_HEADERS",
    "ApiSignature",
    "api_signature_of",
    "api_signing_bytes",
    "conversation_owner",
    "hidden",
    "may_access",
]

ACCESS_OWNER: Final = "owner"
"""A signed record's access: only conversations its principal opened (and new ones, which it opens)."""
ACCESS_ALL: Final = "all"
"""A signed record's access: every conversation (an ``admin`` token)."""

#: The Kafka headers of a record the API signed: its key id, its signature, its access.
API_HEADERS: Final = ("settled.api.key_id", "settled.api.signature", "settled.api.access")

_CONTEXT: Final = b"settled-api-record-v1\x00"


@dataclass(frozen=True)
class ApiSignature:
    """The API's signature on one inbox record, as its headers carry it.

    Attributes:
        key_id: The signing key's id (in the workers' ``App.api_keys``).
        signature: The Ed25519 signature over `api_signing_bytes`.
        access: ``owner`` or ``all`` (any other value is refused by the verifier).
    """

    key_id: str
    signature: bytes
    access: str


def api_signing_bytes(value: bytes, access: str) -> bytes:
    """What the API signs for one record: a context string, the access, and the record's value bytes.

    Args:
        value: The record's value (its Avro single-object encoding, which holds the principal).
        access: ``owner`` or ``all``.

    Returns:
        The bytes to sign and verify.
    """
    return _CONTEXT + access.encode() + b"\x00" + value


def api_signature_of(headers: Mapping[str, bytes] | Sequence[tuple[str, bytes]]) -> ApiSignature | None:
    """The API's signature a record's headers carry, if they carry any of its headers.

    Args:
        headers: The record's headers (a later header of one name wins).

    Returns:
        None when none of `API_HEADERS` is present (an unsigned record); otherwise the signature, with empty
        fields for headers that are missing (the verifier refuses it).
    """
    found = dict(headers.items() if isinstance(headers, Mapping) else headers)
    if not any(name in found for name in API_HEADERS):
        return None
    key_id, signature, access = (found.get(name, b"") for name in API_HEADERS)
    return ApiSignature(
        key_id=key_id.decode("utf-8", "replace"), signature=signature, access=access.decode("utf-8", "replace")
    )


def conversation_owner(conv: ConversationState) -> str | None:
    """The principal that opened a conversation: the one of its first admitted submission.

    Args:
        conv: The conversation's state.

    Returns:
        That principal, or None for a conversation with no admitted submission.
    """
    first = min(conv.submissions.values(), key=lambda s: s.submission_seq, default=None)
    return None if first is None else first.principal


def may_access(conv: ConversationState, principal: str, access: str) -> bool:
    """Whether a record the API signed for ``principal`` may name this conversation.

    Args:
        conv: The conversation's state.
        principal: The record's principal (the caller's token's).
        access: The signed access, ``owner`` or ``all``.

    Returns:
        True for ``all``, for a conversation with no submission yet (the record opens it), and for its opener.
    """
    if access == ACCESS_ALL:
        return True
    owner = conversation_owner(conv)
    return owner is None or owner == principal


def hidden(conv: ConversationState) -> ConversationState:
    """The conversation as a caller without access sees it: its chain, and nothing a command could name.

    Deciding a command against it gives exactly the rejection a missing target gets (``unknown_target``), appended to
    the conversation's own chain.

    Args:
        conv: The conversation's state.

    Returns:
        A copy without submissions, queue, active submission or applied commands.
    """
    return dataclasses.replace(conv, submissions={}, queue=(), active_submission_id=None, applied_commands={})
