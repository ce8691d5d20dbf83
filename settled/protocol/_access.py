"""Who may see and act on a conversation, for inbox records the HTTP API signed (issue 20 item 3).

The HTTP API publishes every record with the principal of the caller's token and signs it (Kafka headers, see
`API_HEADERS`) with its Ed25519 key over `api_signing_bytes`: the record's value and the caller's access (``owner``:
the conversations the principal opened or was granted; ``all``: an ``admin`` token). The partition owner verifies
the signature and then checks access against the conversation's canonical state: a conversation is **opened** by the
principal of its first admitted submission (``submission_seq`` 1, in the log for good). Its opener (or an admin)
grants other principals access with a `GrantAccess` (``read``: see it; ``act``: see it, submit turns and send
commands) and ends it with a `RevokeAccess`; the owner decides them (`grant_access`, `revoke_access`) into canonical
`AccessGranted` / `AccessRevoked` events, which `ConversationState.access` folds. A signed record of a principal
that may not see the conversation is decided as if the conversation held nothing it could name (`hidden`): a command
gets the same ``unknown_target`` rejection a missing target gets. A principal that may see it but not act (a
``read`` grant, or a grantee granting) gets ``unauthorized``. Records without the API's headers (the Python client,
raw producers: trusted inbox writers) are decided as before, whatever principal they carry: an unsigned grant is
applied whoever it names as its principal.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Final

from settled.protocol._contract import check_command, excerpt
from settled.protocol._decide import (
    Decision,
    check_input_undecided,
    recorded_command,
    reject_command,
    reject_invalid,
)
from settled.protocol._fold import ConversationState, lane_command_target
from settled.schemas import (
    AccessGranted,
    AccessLevel,
    AccessRevoked,
    CommandRejectReason,
    GrantAccess,
    InputRef,
    LaneSet,
    RevokeAccess,
    SetLane,
)

__all__ = [
    "ACCESS_ALL",
    "ACCESS_OWNER",
    "API_HEADERS",
    "ApiSignature",
    "api_signature_of",
    "api_signing_bytes",
    "conversation_opener",
    "grant_access",
    "hidden",
    "may_access",
    "may_grant",
    "revoke_access",
    "set_lane",
]

ACCESS_OWNER: Final = "owner"
"""A signed record's access: conversations its principal opened (and new ones, which it opens) or was granted."""
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


def conversation_opener(conv: ConversationState) -> str | None:
    """The principal that opened a conversation: the one of its first admitted submission.

    Args:
        conv: The conversation's state.

    Returns:
        That principal, or None for a conversation with no admitted submission.
    """
    first = min(conv.submissions.values(), key=lambda s: s.submission_seq, default=None)
    return None if first is None else first.principal


def may_access(conv: ConversationState, principal: str, access: str, *, acting: bool = True) -> bool:
    """Whether a record the API signed for ``principal`` may name this conversation.

    Args:
        conv: The conversation's state.
        principal: The record's principal (the caller's token's).
        access: The signed access, ``owner`` or ``all``.
        acting: True to ask whether it may act (submit, send a command); False whether it may see it.

    Returns:
        True for ``all``, for a conversation with no submission yet (the record opens it), for its opener, for a
        principal granted ``act``, and (when not ``acting``) for one granted ``read``.
    """
    if access == ACCESS_ALL:
        return True
    opener = conversation_opener(conv)
    if opener is None or opener == principal:
        return True
    granted = conv.access.get(principal)
    return granted is AccessLevel.ACT or (granted is AccessLevel.READ and not acting)


def may_grant(conv: ConversationState, principal: str, access: str) -> bool:
    """Whether a signed `GrantAccess` or `RevokeAccess` of ``principal`` may change this conversation's access.

    Args:
        conv: The conversation's state.
        principal: The record's principal.
        access: The signed access, ``owner`` or ``all``.

    Returns:
        True for ``all``, for the conversation's opener, and for a conversation nobody opened (whose access
        commands `grant_access` rejects ``unknown_target``); a grantee, even with ``act``, may not.
    """
    opener = conversation_opener(conv)
    return access == ACCESS_ALL or opener is None or opener == principal


def _precheck_access(
    state: ConversationState, command: GrantAccess | RevokeAccess, input_ref: InputRef, now: datetime, check: bool
) -> Decision | None:
    """The checks both access commands share: the contract, a reused command id, an unopened conversation."""
    violation = check_command(command) if check else None
    if violation is not None:
        return reject_invalid(state, command, input_ref, now, violation)
    check_input_undecided(state, command.conversation_id, input_ref)
    previous_target = state.applied_commands.get(command.command_id)
    if previous_target is not None and previous_target != command.grantee:
        return reject_command(
            state,
            command,
            input_ref,
            now,
            reason=CommandRejectReason.INVALID,
            detail=f"command_id {command.command_id!r} was already applied to {previous_target!r}",
        )
    opener = conversation_opener(state)
    if opener is None:
        return reject_command(
            state,
            command,
            input_ref,
            now,
            reason=CommandRejectReason.UNKNOWN_TARGET,
            detail=f"conversation {excerpt(state.conversation_id)} is not found",
        )
    if previous_target is None and command.grantee == opener:
        return reject_command(
            state,
            command,
            input_ref,
            now,
            reason=CommandRejectReason.INVALID,
            detail=f"grantee {command.grantee!r} opened conversation {excerpt(state.conversation_id)}: "
            "its access cannot be granted or revoked",
        )
    return None


def grant_access(
    state: ConversationState, command: GrantAccess, input_ref: InputRef, now: datetime, *, check_contract: bool = True
) -> Decision:
    """Decide a `GrantAccess` (issue 20): `AccessGranted` + applied receipt, replacing any earlier grant.

    * the contract broken → ``invalid`` naming the field; a command id applied to another grantee → ``invalid``;
    * a conversation with no admitted submission (nobody opened it) → ``unknown_target``;
    * the grantee is the opener → ``invalid`` (its access comes from opening the conversation);
    * the same command id again → the same `AccessGranted` with the new ``input_ref`` and a duplicate receipt.

    Who may send it (the opener or an admin, for records the API signed) is the worker's check (`may_grant`).

    Args:
        state: The conversation's scratch state.
        command: The decoded command.
        input_ref: Where it was read.
        now: The decision time.
        check_contract: Whether to check the input contract first (`check_command`).

    Returns:
        The decision.

    Raises:
        WrongConversationError: If ``state`` is not the conversation that files this command.
        InputAlreadyDecidedError: If ``input_ref`` is already decided.
    """
    refused = _precheck_access(state, command, input_ref, now, check_contract)
    if refused is not None:
        return refused
    event = AccessGranted(
        command_id=command.command_id,
        grantee=command.grantee,
        access=command.access,
        principal=command.principal,
        input_ref=input_ref,
    )
    return recorded_command(state, command.command_id, event, now)


def revoke_access(
    state: ConversationState, command: RevokeAccess, input_ref: InputRef, now: datetime, *, check_contract: bool = True
) -> Decision:
    """Decide a `RevokeAccess` (issue 20): `AccessRevoked` + applied receipt for a principal that holds a grant.

    Rejected as `grant_access` is, and ``unknown_target`` when the grantee holds no granted access; the same command
    id again is a duplicate.

    Args:
        state: The conversation's scratch state.
        command: The decoded command.
        input_ref: Where it was read.
        now: The decision time.
        check_contract: Whether to check the input contract first (`check_command`).

    Returns:
        The decision.

    Raises:
        WrongConversationError: If ``state`` is not the conversation that files this command.
        InputAlreadyDecidedError: If ``input_ref`` is already decided.
    """
    refused = _precheck_access(state, command, input_ref, now, check_contract)
    if refused is not None:
        return refused
    repeated = command.command_id in state.applied_commands
    if not repeated and command.grantee not in state.access:
        return reject_command(
            state,
            command,
            input_ref,
            now,
            reason=CommandRejectReason.UNKNOWN_TARGET,
            detail=f"principal {command.grantee!r} holds no granted access to conversation "
            f"{excerpt(state.conversation_id)}",
        )
    event = AccessRevoked(
        command_id=command.command_id, grantee=command.grantee, principal=command.principal, input_ref=input_ref
    )
    return recorded_command(state, command.command_id, event, now)


def hidden(conv: ConversationState) -> ConversationState:
    """The conversation as a caller without access sees it: its chain, and nothing a command could name.

    Deciding a command against it gives exactly the rejection a missing target gets (``unknown_target``), appended to
    the conversation's own chain.

    Args:
        conv: The conversation's state.

    Returns:
        A copy without submissions, queue, active submission, applied commands, access or flow runs.
    """
    return dataclasses.replace(
        conv, submissions={}, queue=(), active_submission_id=None, applied_commands={}, access={}, flow_runs={}
    )


def set_lane(
    state: ConversationState,
    command: SetLane,
    input_ref: InputRef,
    now: datetime,
    *,
    access: str = ACCESS_OWNER,
    check_contract: bool = True,
) -> Decision:
    """Decide a `SetLane` (issue 22 item 1): `LaneSet` + applied receipt; later submissions follow the new lane.

    * the contract broken → ``invalid`` naming the field;
    * a conversation with no admitted submission (nobody opened it) → ``unknown_target`` (its opening submission
      chooses its first lane: ``lane=`` on the proposal);
    * a principal that is neither the conversation's opener nor granted ``act`` (nor an admin: ``access`` ``all``)
      → ``unauthorized``, whether the HTTP API signed the record or a trusted writer sent it;
    * the same command id again, for the same lane → the same `LaneSet` with the new ``input_ref`` and a duplicate
      receipt; for another lane, or a command id applied to something else → ``invalid`` naming ``command_id``.

    Submissions already admitted keep what their admission decided; the lane changes what the next proposals do.

    Args:
        state: The conversation's scratch state.
        command: The decoded command.
        input_ref: Where it was read.
        now: The decision time.
        access: For a record the HTTP API signed, its signed access (``owner`` or ``all``); ``owner`` otherwise.
        check_contract: Whether to check the input contract first (`check_command`).

    Returns:
        The decision.

    Raises:
        WrongConversationError: If ``state`` is not the conversation that files this command.
        InputAlreadyDecidedError: If ``input_ref`` is already decided.
    """
    violation = check_command(command) if check_contract else None
    if violation is not None:
        return reject_invalid(state, command, input_ref, now, violation)
    check_input_undecided(state, command.conversation_id, input_ref)
    target = lane_command_target(command.lane)
    previous_target = state.applied_commands.get(command.command_id)
    if previous_target is not None and previous_target != target:
        return reject_command(
            state,
            command,
            input_ref,
            now,
            reason=CommandRejectReason.INVALID,
            detail=f"command_id {command.command_id!r} was already applied to {previous_target!r}",
        )
    if conversation_opener(state) is None:
        return reject_command(
            state,
            command,
            input_ref,
            now,
            reason=CommandRejectReason.UNKNOWN_TARGET,
            detail=f"conversation {excerpt(state.conversation_id)} is not found",
        )
    if not may_access(state, command.principal, access):
        return reject_command(
            state,
            command,
            input_ref,
            now,
            reason=CommandRejectReason.UNAUTHORIZED,
            detail=f"principal {command.principal!r} may not set the lane of conversation "
            f"{excerpt(state.conversation_id)}: only its opener or a principal granted act may",
        )
    event = LaneSet(command_id=command.command_id, principal=command.principal, lane=command.lane, input_ref=input_ref)
    return recorded_command(state, command.command_id, event, now)
