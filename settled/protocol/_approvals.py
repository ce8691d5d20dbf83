"""Approvals (issue 16 item 4): a kind of the generic wait, decided by a signed `DecideApproval`. Pure.

An approval is a `WaitRequested` of kind ``approval`` whose wait id is the approval id (`approval_id_for`: derived
from the run and the callsite ordinal of ``ctx.approve``, or from the tool call that needs approval), and whose
details (`approval_details`) carry the digest of the canonical arguments the approver is shown. A decision is bound
to that approval id and that digest; `approval_problem` says why one is refused (another run's approval, no such
approval, one no longer open, other arguments), and `approval_payload` is what the run reads once it is accepted:
approved or not, by whom (the signing key id, which the worker verifies against ``App.approver_keys``) and why.
"""

from __future__ import annotations

from datetime import datetime

from settled.protocol._decide import Decision, check_input_undecided, command_receipt, reject_command
from settled.protocol._fold import ConversationState
from settled.protocol._waits import wait_id_for
from settled.schemas import (
    ApprovalDecided,
    CommandRejectReason,
    DecideApproval,
    InputRef,
    ReceiptOutcome,
    WaitKind,
    WaitOutcome,
    WaitResolved,
    canonical_json,
    canonicalize_json_text,
    json_digest,
)

__all__ = [
    "approval_details",
    "approval_id_for",
    "approval_payload",
    "approval_problem",
    "arguments_digest",
    "decide_approval",
]


def approval_id_for(run_id: str, *, ordinal: int | None = None, call_id: str | None = None) -> str:
    """Return an approval's id: the same on every attempt, and naming its run.

    Args:
        run_id: The run id (the submission id for agent runs).
        ordinal: The callsite ordinal of ``ctx.approve`` (the approval is that wait: `wait_id_for`).
        call_id: The tool call that needs approval.

    Returns:
        ``<run_id>#w<ordinal>`` for a ``ctx.approve``, ``<run_id>#a<call_id>`` for a tool call.

    Raises:
        ValueError: Neither or both of ``ordinal`` and ``call_id`` are given.
    """
    if (ordinal is None) == (call_id is None):
        raise ValueError(f"give exactly one of ordinal and call_id, got ordinal={ordinal!r} call_id={call_id!r}")
    if ordinal is not None:
        return wait_id_for(run_id, ordinal)
    return f"{run_id}#a{call_id}"


def arguments_digest(args_json: str) -> str:
    """Return the digest an approval is bound to: `json_digest` of the arguments' canonical JSON (RFC 8785).

    Args:
        args_json: The arguments as JSON text (any spacing or key order).

    Returns:
        The digest (64 lowercase hex).

    Raises:
        CanonicalJsonError: ``args_json`` is not JSON.
    """
    return json_digest(canonicalize_json_text(args_json))


def approval_details(title: str, description: str, args_json: str, *, tool: str | None = None) -> str:
    """Return an approval request's ``details_json``: what the approver is shown, and the digest it is bound to.

    Args:
        title: The approval's title (also the request's name).
        description: What is asked, for a person.
        args_json: The arguments (a tool call's, or ``ctx.approve``'s title and description) as JSON text.
        tool: The tool whose call needs approval, or None for ``ctx.approve``.

    Returns:
        Canonical JSON: ``title``, ``description``, ``tool``, ``args_json`` (canonical) and ``args_digest``.

    Raises:
        CanonicalJsonError: ``args_json`` is not JSON.
    """
    args = canonicalize_json_text(args_json)
    return canonical_json(
        {
            "args_digest": json_digest(args),
            "args_json": args,
            "description": description,
            "title": title,
            "tool": tool,
        }
    )


def approval_problem(state: ConversationState, command: DecideApproval) -> tuple[CommandRejectReason, str] | None:
    """Say why a (signature-verified) approval decision is refused, or None if it decides its approval.

    Checked in this order: the approval id was derived for another run than the one named (``other_run``); the run
    is unknown (``unknown_target``) or settled (``already_terminal``); the run never requested that approval
    (``unknown_target``); the approval is no longer open, decided or expired (``stale``); the decision's argument
    digest differs from the request's (``digest_mismatch``). A repeated command id is not a problem here:
    `decide_approval` answers it as a duplicate first.

    Args:
        state: The conversation's state.
        command: The decision, its signature already verified.

    Returns:
        (reason, detail) naming the field and value, or None.
    """
    if not command.approval_id.startswith(f"{command.submission_id}#"):
        return (
            CommandRejectReason.OTHER_RUN,
            f"approval_id {command.approval_id!r} is not an approval of run {command.submission_id!r}",
        )
    sub = state.submission(command.submission_id)
    if sub is None:
        return (
            CommandRejectReason.UNKNOWN_TARGET,
            f"conversation {state.conversation_id!r} has no run {command.submission_id!r}",
        )
    if sub.outcome is not None:
        return (
            CommandRejectReason.ALREADY_TERMINAL,
            f"run {sub.submission_id!r} settled {sub.outcome.value} first",
        )
    expected = sub.approval_digest(command.approval_id)
    if expected is None:
        return (
            CommandRejectReason.UNKNOWN_TARGET,
            f"run {command.submission_id!r} requested no approval {command.approval_id!r}",
        )
    if sub.suspended_on(command.approval_id) is not WaitKind.APPROVAL:
        return (
            CommandRejectReason.STALE,
            f"approval {command.approval_id!r} is no longer open (run {sub.submission_id!r} is {sub.state.value})",
        )
    if command.args_digest != expected:
        return (
            CommandRejectReason.DIGEST_MISMATCH,
            f"args_digest {command.args_digest!r} differs from approval {command.approval_id!r}'s {expected!r}",
        )
    return None


def decide_approval(
    state: ConversationState,
    command: DecideApproval,
    input_ref: InputRef,
    now: datetime,
    *,
    check_digest: bool = True,
) -> Decision:
    """Decide a `DecideApproval` whose Ed25519 signature the caller has verified (against ``App.approver_keys``).

    * the same command id again → the same `ApprovalDecided` again with the new ``input_ref`` (it changes nothing)
      and a duplicate receipt; the same id for another run → ``invalid``;
    * a problem (`approval_problem`) → `CommandRejected` with its reason and its receipt, nothing else: the wait
      stays open;
    * otherwise `ApprovalDecided` + the `WaitResolved` that delivers `approval_payload` to the run, in one batch,
      + an applied receipt.

    Args:
        state: The conversation's scratch state.
        command: The verified decision.
        input_ref: Where it was read.
        now: The decision time.
        check_digest: Whether a differing argument digest is refused; ``False`` only under the fault switch
            ``approval_digest_unchecked``.

    Returns:
        The decision.

    Raises:
        WrongConversationError: If ``state`` is not the conversation that files this command.
        InputAlreadyDecidedError: If ``input_ref`` is already decided.
    """
    check_input_undecided(state, command.conversation_id, input_ref)
    decided = ApprovalDecided(
        command_id=command.command_id,
        submission_id=command.submission_id,
        approval_id=command.approval_id,
        approved=command.approved,
        args_digest=command.args_digest,
        principal=command.principal,
        key_id=command.key_id,
        reason=command.reason,
        input_ref=input_ref,
    )
    previous_target = state.applied_commands.get(command.command_id)
    if previous_target == command.submission_id:
        return Decision(
            events=(decided,), receipt=command_receipt(state, command.command_id, ReceiptOutcome.DUPLICATE, now)
        )
    problem: tuple[CommandRejectReason, str] | None
    if previous_target is not None:
        problem = (
            CommandRejectReason.INVALID,
            f"command_id {command.command_id!r} was already applied to submission {previous_target!r}",
        )
    else:
        problem = approval_problem(state, command)
    if problem is not None and not (problem[0] is CommandRejectReason.DIGEST_MISMATCH and not check_digest):
        reason, detail = problem
        return reject_command(state, command, input_ref, now, reason=reason, detail=detail)
    resolved = WaitResolved(
        submission_id=command.submission_id,
        wait_id=command.approval_id,
        outcome=WaitOutcome.DELIVERED,
        source_id=command.command_id,
        payload_json=approval_payload(command),
        decided_at=now,
    )
    applied = command_receipt(state, command.command_id, ReceiptOutcome.APPLIED, now)
    return Decision(events=(decided, resolved), receipt=applied)


def approval_payload(command: DecideApproval) -> str:
    """Return what the run reads from an accepted decision (the `WaitResolved` payload).

    Args:
        command: The accepted decision.

    Returns:
        Canonical JSON: ``approved``, ``by`` (the signing key id), ``principal`` and ``reason``.
    """
    return canonical_json(
        {"approved": command.approved, "by": command.key_id, "principal": command.principal, "reason": command.reason}
    )
