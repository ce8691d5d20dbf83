"""``settled submit|abort|signal|approve|deny|retry``, ``settled access|flows``, ``settled unknown resolve|keygen``.

The client as commands (issue 5 item 8; ``settled access``: issue 20; ``settled flows abandon|restart``: issue 18
item 3, an operator's turn of a flow run); ``unknown resolve`` sends a signed ``ResolveUnknown`` (DUR-009,
docs/design.md §5), ``retry`` a signed ``RetrySubmission`` with the same resolver key (issue 22 item 4).

Each prints what it reads as JSON lines on stdout (a receipt, then with ``--wait`` the settlement; settlements as they
come), and its errors on stderr with the exit code of their category (`settled.EXIT_CODES`): 1 rejected (the rejection
receipt is still printed on stdout), 2 no broker or bad input, 3 outcome unknown (the message names the idempotency
key or command id to send again with), 4 no settlement in time. Settings come from the environment
(``SETTLED_NAMESPACE``, ``SETTLED_KAFKA_BOOTSTRAP``, ...) through `settled.services._cli_root.resolve_settings`: without
``SETTLED_KAFKA_BOOTSTRAP`` the running dev stack's broker is used (never started here).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any, NoReturn

import typer
from pydantic import BaseModel

from settled._errors import BadInputError, SettledError
from settled.client import (
    NO_RESULT,
    Client,
    load_signing_key,
    public_key_b64,
    write_signing_key,
)
from settled.schemas import Receipt, ResolutionKind
from settled.services._cli_root import command, fail, resolve_settings

__all__ = [
    "abort",
    "access_app",
    "flows_app",
    "keygen",
    "lane_app",
    "pause_run",
    "resolve_unknown",
    "resume_run",
    "retry",
    "settlements_app",
    "signal",
    "steer",
    "submit",
]

settlements_app = typer.Typer(no_args_is_help=True, help="Read the settlements downstream consumers see.")
access_app = typer.Typer(
    no_args_is_help=True, help="Grant and revoke other principals' access to a conversation (issue 20)."
)
lane_app = typer.Typer(
    no_args_is_help=True,
    help="A conversation's lane policy: what a new turn does while it is busy (issue 22 item 1).",
)
flows_app = typer.Typer(
    no_args_is_help=True, help="End or restart a flow run, e.g. one refused with FlowDriftError (issue 18)."
)


def _print(record: BaseModel) -> None:
    sys.stdout.write(record.model_dump_json() + "\n")
    sys.stdout.flush()


def _bad_input(message: str) -> NoReturn:
    fail(BadInputError(message))


def _client_call(call: Callable[[], Any]) -> Any:
    """Run one client call; a plain ``ValueError`` (the client's checks of its arguments) is bad input (exit 2)."""
    try:
        return call()
    except ValueError as exc:
        if isinstance(exc, SettledError):
            raise
        _bad_input(str(exc))


@command
def submit(
    conversation: str = typer.Argument(..., metavar="CONVERSATION", help="The conversation id."),
    input_json: str = typer.Argument(..., metavar="INPUT_JSON", help="The turn's input, a JSON text."),
    key: str | None = typer.Option(None, "--key", help="Idempotency key (default: a new UUID, printed on timeout)."),
    principal: str | None = typer.Option(None, "--principal", help="Who submits (default: the client's)."),
    tool: list[str] = typer.Option([], "--tool", help="A tool offered for this turn (repeatable)."),  # noqa: B008
    wait: bool = typer.Option(False, "--wait", help="Also wait for the settlement and print it."),
    timeout_s: float = typer.Option(30.0, "--timeout-s", help="Deadline of the receipt, and of the settlement."),
    lane: str | None = typer.Option(
        None,
        "--lane",
        help="The lane policy of the conversation this turn opens: queue, join, reject, interrupt or keep_newest "
        "(default: the app's; ignored once the conversation is open: see settled lane set).",
    ),
) -> None:
    """Submit one turn to a conversation and print its receipt (and with --wait its settlement) as JSON lines."""
    try:
        value = json.loads(input_json)
    except json.JSONDecodeError as exc:
        _bad_input(f"INPUT_JSON is not JSON: {exc}")
    with Client(resolve_settings(), default_timeout_s=timeout_s) as client:
        receipt = _client_call(
            lambda: client.submit(
                conversation, value, idempotency_key=key, principal=principal, tools_offered=tuple(tool), lane=lane
            )
        )
        _print(receipt)
        if wait:
            _print(client.wait(receipt, timeout_s))


@command
def abort(
    conversation: str = typer.Argument(..., metavar="CONVERSATION", help="The conversation id."),
    submission: str = typer.Argument(..., metavar="SUBMISSION", help="The submission id to abort."),
    reason: str | None = typer.Option(None, "--reason", help="Why (recorded with the abort)."),
    principal: str | None = typer.Option(None, "--principal", help="Who asks (default: the client's)."),
    command_id: str | None = typer.Option(None, "--command-id", help="Send an earlier abort again (same id)."),
    timeout_s: float = typer.Option(30.0, "--timeout-s", help="Deadline of the reply, in seconds."),
) -> None:
    """Ask the owner to abort a submission and print its reply (a receipt of request kind command) as a JSON line."""
    _send_command(
        timeout_s,
        lambda client: client.abort(
            conversation, submission, reason=reason, principal=principal, command_id=command_id
        ),
    )


@command
def signal(
    conversation: str = typer.Argument(..., metavar="CONVERSATION", help="The conversation id."),
    run: str = typer.Argument(..., metavar="RUN_ID", help="The run (an agent run's id is its submission id)."),
    name: str = typer.Argument(..., metavar="NAME", help="The signal's name (`ctx.signal(name)`)."),
    payload: str = typer.Argument("null", metavar="PAYLOAD_JSON", help="The payload, a JSON text."),
    signal_id: str | None = typer.Option(None, "--signal-id", help="The signal's id (dedup; default: a new UUID)."),
    principal: str | None = typer.Option(None, "--principal", help="Who sends it (default: the client's)."),
    timeout_s: float = typer.Option(30.0, "--timeout-s", help="Deadline of the reply, in seconds."),
) -> None:
    """Send a signal to a run and print the owner's reply (a receipt of request kind command) as a JSON line."""
    value = _json_option("PAYLOAD_JSON", payload)
    _send_command(
        timeout_s,
        lambda client: client.signal(conversation, run, name, value, signal_id=signal_id, principal=principal),
    )


@command
def steer(
    run: str = typer.Argument(..., metavar="RUN_ID", help="The run (an agent run's id is its submission id)."),
    text: str = typer.Argument(..., metavar="TEXT", help="The message its model sees at its next model call."),
    conversation: str = typer.Option(..., "--conversation", help="The run's conversation."),
    command_id: str | None = typer.Option(None, "--command-id", help="The message's id (dedup; default: a UUID)."),
    principal: str | None = typer.Option(None, "--principal", help="Who sends it (default: the client's)."),
    timeout_s: float = typer.Option(30.0, "--timeout-s", help="Deadline of the reply, in seconds."),
) -> None:
    """Steer an active run; print the owner's reply (a receipt of request kind command) as a JSON line.

    Applied, duplicate (the same --command-id again) or rejected with its reason (the run settled first:
    already_terminal; no such run: unknown_target): a rejection exits 1 after printing its receipt.
    """
    _send_command(
        timeout_s,
        lambda client: client.steer(conversation, run, text, command_id=command_id, principal=principal),
    )


@command
def pause_run(
    run: str = typer.Argument(..., metavar="RUN_ID", help="The workflow run (its submission id)."),
    conversation: str = typer.Option(..., "--conversation", help="The run's conversation (wf:<name>:<task_id>)."),
    reason: str | None = typer.Option(None, "--reason", help="Why (recorded with the pause)."),
    command_id: str | None = typer.Option(None, "--command-id", help="The command's id (dedup; default: a UUID)."),
    principal: str | None = typer.Option(None, "--principal", help="Who pauses it (default: the client's)."),
    timeout_s: float = typer.Option(30.0, "--timeout-s", help="Deadline of the reply, in seconds."),
) -> None:
    """Pause a workflow run at its next step boundary; print the owner's reply (a receipt) as a JSON line.

    Applied, duplicate (the same --command-id again) or rejected with its reason (not a workflow run, already
    paused, settled, unknown): a rejection exits 1 after printing its receipt.
    """
    _send_command(
        timeout_s,
        lambda client: client.pause_run(conversation, run, reason=reason, command_id=command_id, principal=principal),
    )


@command
def resume_run(
    run: str = typer.Argument(..., metavar="RUN_ID", help="The paused workflow run (its submission id)."),
    conversation: str = typer.Option(..., "--conversation", help="The run's conversation (wf:<name>:<task_id>)."),
    command_id: str | None = typer.Option(None, "--command-id", help="The command's id (dedup; default: a UUID)."),
    principal: str | None = typer.Option(None, "--principal", help="Who resumes it (default: the client's)."),
    timeout_s: float = typer.Option(30.0, "--timeout-s", help="Deadline of the reply, in seconds."),
) -> None:
    """Resume a paused workflow run; print the owner's reply (a receipt) as a JSON line.

    A run paused by a denied approval asks again under a new approval id. A run not paused is rejected (stale).
    """
    _send_command(
        timeout_s,
        lambda client: client.resume_run(conversation, run, command_id=command_id, principal=principal),
    )


def _decide_approval(
    approved: bool,
    conversation: str,
    run: str,
    approval: str,
    args_digest: str,
    key_file: str,
    key_id: str,
    reason: str | None,
    principal: str | None,
    command_id: str | None,
    timeout_s: float,
) -> None:
    key = load_signing_key(key_file)
    _send_command(
        timeout_s,
        lambda client: client.decide_approval(
            conversation,
            run,
            approval,
            approved=approved,
            args_digest=args_digest,
            signing_key=key,
            key_id=key_id,
            reason=reason,
            principal=principal,
            command_id=command_id,
        ),
    )


_CONVERSATION = typer.Argument(..., metavar="CONVERSATION", help="The conversation id.")
_RUN = typer.Argument(..., metavar="RUN_ID", help="The run (an agent run's id is its submission id).")
_APPROVAL = typer.Argument(..., metavar="APPROVAL_ID", help="The approval (its wait id, e.g. <run>#w<ordinal>).")
_ARGS_DIGEST = typer.Option(
    ..., "--args-digest", help="The digest of the canonical arguments you approve or deny (the request shows it)."
)
_KEY_FILE = typer.Option(..., "--key-file", help="The approver's Ed25519 private key: PEM, or base64 of 32 bytes.")
_KEY_ID = typer.Option(..., "--key-id", help="The key's id in the workers' App.approver_keys (recorded as 'by').")
_REASON = typer.Option(None, "--reason", help="Why (recorded, and shown to the run).")
_PRINCIPAL = typer.Option(None, "--principal", help="Who decides (default: the client's).")
_COMMAND_ID = typer.Option(None, "--command-id", help="Send an earlier decision again (same id).")
_TIMEOUT_S = typer.Option(30.0, "--timeout-s", help="Deadline of the reply, in seconds.")


@command
def approve(
    conversation: str = _CONVERSATION,
    run: str = _RUN,
    approval: str = _APPROVAL,
    args_digest: str = _ARGS_DIGEST,
    key_file: str = _KEY_FILE,
    key_id: str = _KEY_ID,
    reason: str | None = _REASON,
    principal: str | None = _PRINCIPAL,
    command_id: str | None = _COMMAND_ID,
    timeout_s: float = _TIMEOUT_S,
) -> None:
    """Approve a run's approval with a signed DecideApproval; print the reply (a command receipt) as a JSON line."""
    _decide_approval(
        True, conversation, run, approval, args_digest, key_file, key_id, reason, principal, command_id, timeout_s
    )


@command
def deny(
    conversation: str = _CONVERSATION,
    run: str = _RUN,
    approval: str = _APPROVAL,
    args_digest: str = _ARGS_DIGEST,
    key_file: str = _KEY_FILE,
    key_id: str = _KEY_ID,
    reason: str | None = _REASON,
    principal: str | None = _PRINCIPAL,
    command_id: str | None = _COMMAND_ID,
    timeout_s: float = _TIMEOUT_S,
) -> None:
    """Deny a run's approval with a signed DecideApproval; print the reply (a command receipt) as a JSON line."""
    _decide_approval(
        False, conversation, run, approval, args_digest, key_file, key_id, reason, principal, command_id, timeout_s
    )


def _send_command(timeout_s: float, send: Callable[[Client], Receipt]) -> None:
    """Send one command through a fresh client and print its reply as a JSON line.

    A rejection exits 1 (after printing the rejection receipt), no reply in time 3, bad input or no broker 2: the
    categories' exit codes (`settled.EXIT_CODES`), through `command`.
    """
    with Client(resolve_settings(), default_timeout_s=timeout_s) as client:
        _print(_client_call(lambda: send(client)))


#: ``--kind`` values: the resolution kinds, with ``outcome`` short for ``outcome_for_submission``.
_KINDS = {
    "safe_to_retry": ResolutionKind.SAFE_TO_RETRY,
    "call_outcome": ResolutionKind.CALL_OUTCOME,
    "outcome": ResolutionKind.OUTCOME_FOR_SUBMISSION,
    "outcome_for_submission": ResolutionKind.OUTCOME_FOR_SUBMISSION,
}


@access_app.command("grant")
@command
def access_grant(
    conversation: str = _CONVERSATION,
    grantee: str = typer.Argument(..., metavar="PRINCIPAL", help="The principal granted access."),
    access: str = typer.Option("read", "--access", help="read (see it) or act (see it, submit and send commands)."),
    principal: str | None = typer.Option(None, "--principal", help="Who grants (default: the client's)."),
    command_id: str | None = typer.Option(None, "--command-id", help="Send an earlier grant again (same id)."),
    timeout_s: float = _TIMEOUT_S,
) -> None:
    """Grant a principal access to a conversation; print the owner's reply (a command receipt) as a JSON line.

    Sent unsigned, as every command of this client: a trusted inbox writer's (the HTTP API's grants are checked).
    """
    _send_command(
        timeout_s,
        lambda client: client.grant_access(conversation, grantee, access, principal=principal, command_id=command_id),
    )


@access_app.command("revoke")
@command
def access_revoke(
    conversation: str = _CONVERSATION,
    grantee: str = typer.Argument(..., metavar="PRINCIPAL", help="The principal whose access ends."),
    principal: str | None = typer.Option(None, "--principal", help="Who revokes (default: the client's)."),
    command_id: str | None = typer.Option(None, "--command-id", help="Send an earlier revocation again (same id)."),
    timeout_s: float = _TIMEOUT_S,
) -> None:
    """Revoke a principal's granted access to a conversation; print the owner's reply as a JSON line."""
    _send_command(
        timeout_s,
        lambda client: client.revoke_access(conversation, grantee, principal=principal, command_id=command_id),
    )


@lane_app.command("set")
@command
def lane_set(
    conversation: str = _CONVERSATION,
    policy: str = typer.Argument(
        ..., metavar="POLICY", help="queue, join, reject, interrupt or keep_newest (docs/architecture.md)."
    ),
    principal: str | None = typer.Option(None, "--principal", help="Who asks: its opener or an act grantee."),
    command_id: str | None = typer.Option(None, "--command-id", help="Send an earlier change again (same id)."),
    timeout_s: float = _TIMEOUT_S,
) -> None:
    """Change a conversation's lane policy from now on; print the owner's reply (a command receipt) as a JSON line.

    Applied, duplicate (the same --command-id again) or rejected with its reason (no such conversation:
    unknown_target; not its opener nor granted act: unauthorized): a rejection exits 1 after printing its receipt.
    An unknown POLICY exits 2 naming it; nothing is sent.
    """
    _send_command(
        timeout_s,
        lambda client: client.set_lane(conversation, policy, principal=principal, command_id=command_id),
    )


def _json_option(name: str, text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        _bad_input(f"{name} is not JSON: {exc}")


@command
def resolve_unknown(
    submission: str = typer.Argument(..., metavar="SUBMISSION_ID", help="The submission whose call is Unknown."),
    call: str = typer.Argument(..., metavar="CALL_ID", help="The Unknown call (`settled unknown list`)."),
    conversation: str = typer.Option(..., "--conversation", help="The submission's conversation id."),
    kind: str = typer.Option(
        ...,
        "--kind",
        help="safe_to_retry (the call never took effect: run it again), call_outcome (--result is its result), "
        "or outcome (--outcome settles the submission).",
    ),
    result: str | None = typer.Option(None, "--result", metavar="JSON", help="call_outcome: the call's result."),
    outcome: str | None = typer.Option(
        None, "--outcome", help="outcome: completed, failed or aborted (an abort already recorded wins)."
    ),
    reply: str | None = typer.Option(None, "--reply", metavar="JSON", help="outcome completed: the reply."),
    key_file: str = typer.Option(
        ..., "--key-file", help="The resolver's Ed25519 private key: PEM, or base64 of the raw 32 bytes."
    ),
    key_id: str = typer.Option(..., "--key-id", help="The key's id in the workers' App.resolver_keys."),
    principal: str | None = typer.Option(None, "--principal", help="Who resolves (default: the client's)."),
    command_id: str | None = typer.Option(None, "--command-id", help="Send an earlier resolution again (same id)."),
    timeout_s: float = typer.Option(30.0, "--timeout-s", help="Deadline of the reply, in seconds."),
) -> None:
    """Resolve an Unknown tool call with a signed ResolveUnknown; print the reply (a command receipt) as a JSON line."""
    resolution = _KINDS.get(kind)
    if resolution is None:
        _bad_input(f"--kind must be one of safe_to_retry, call_outcome, outcome; got {kind!r}")
    result_value = NO_RESULT if result is None else _json_option("--result", result)
    reply_value = _json_option("--reply", reply)
    key = load_signing_key(key_file)
    _send_command(
        timeout_s,
        lambda client: client.resolve_unknown(
            conversation,
            submission,
            call,
            kind=resolution,
            signing_key=key,
            key_id=key_id,
            result=result_value,
            outcome=outcome,
            reply=reply_value,
            principal=principal,
            command_id=command_id,
        ),
    )


@command
def retry(
    submission: str = typer.Argument(..., metavar="SUBMISSION_ID", help="The dead letter to admit again."),
    conversation: str = typer.Option(..., "--conversation", help="The submission's conversation id."),
    key_file: str = typer.Option(
        ..., "--key-file", help="The resolver's Ed25519 private key: PEM, or base64 of the raw 32 bytes."
    ),
    key_id: str = typer.Option(..., "--key-id", help="The key's id in the workers' App.resolver_keys."),
    new_submission_id: str | None = typer.Option(
        None, "--new-submission-id", help="The id of the submission it admits (default: a new UUID)."
    ),
    principal: str | None = typer.Option(None, "--principal", help="Who retries (default: the client's)."),
    command_id: str | None = typer.Option(None, "--command-id", help="Send an earlier retry again (same id)."),
    wait: bool = typer.Option(False, "--wait", help="Also wait for the new submission's settlement and print it."),
    timeout_s: float = typer.Option(30.0, "--timeout-s", help="Deadline of the reply, and of the settlement."),
) -> None:
    """Admit a dead letter's payload again as a new submission with a signed RetrySubmission; print the reply.

    The reply is a command receipt (a JSON line) naming the new submission (``original_submission_id``) and its
    sequence; a second retry of the same dead letter is a duplicate naming the first retry.
    """
    key = load_signing_key(key_file)
    with Client(resolve_settings(), default_timeout_s=timeout_s) as client:
        receipt = _client_call(
            lambda: client.retry_submission(
                conversation,
                submission,
                signing_key=key,
                key_id=key_id,
                new_submission_id=new_submission_id,
                principal=principal,
                command_id=command_id,
            )
        )
        _print(receipt)
        if wait:
            _print(client.wait(receipt, timeout_s))


@command
def keygen(
    out: str = typer.Option(..., "--out", help="The private key file to create (PEM, mode 0600; never overwritten)."),
) -> None:
    """Create a resolver signing key; print its base64 public key, the value to put in App.resolver_keys."""
    key = write_signing_key(out)
    sys.stdout.write(public_key_b64(key) + "\n")
    sys.stdout.flush()
    sys.stderr.write(
        f"settled: wrote the private key to {out}; configure the public key above in the workers' "
        'App(resolver_keys={"<key id>": "<public key>"}) and resolve with --key-file and that --key-id\n'
    )


@settlements_app.command("tail")
@command
def tail(
    from_beginning: bool = typer.Option(False, "--from-beginning", help="Start at the first settlement."),
    idle_timeout_s: float | None = typer.Option(
        None, "--idle-timeout-s", help="Stop after this long without a settlement (default: never)."
    ),
) -> None:
    """Print settlements as JSON lines as they are committed (read_committed), from the end or the beginning."""
    with (
        Client(resolve_settings()) as client,
        client.settlements(from_beginning=from_beginning, idle_timeout_s=idle_timeout_s) as stream,
    ):
        for record in stream:
            _print(record)


_RUN = typer.Argument(..., metavar="RUN_ID", help="The flow run (a receipt's run_id).")


def _flow_operator(
    operator: str, run: str, conversation: str, command_id: str | None, principal: str | None, timeout_s: float
) -> None:
    """Send an operator's turn for a flow run and print its receipt (and the turn's settlement) as JSON lines."""
    with Client(resolve_settings(), default_timeout_s=timeout_s) as client:
        call = client.abandon_flow_run if operator == "abandon" else client.restart_flow_run
        receipt = _client_call(
            lambda: call(conversation, run, command_id=command_id, principal=principal, timeout_s=timeout_s)
        )
        _print(receipt)
        _print(client.wait(receipt, timeout_s))


@flows_app.command("abandon")
@command
def flows_abandon(
    run: str = _RUN,
    conversation: str = typer.Option(..., "--conversation", help="The run's conversation."),
    command_id: str | None = typer.Option(None, "--command-id", help="Send an earlier abandon again (same id)."),
    principal: str | None = typer.Option(None, "--principal", help="Who asks (default: the client's)."),
    timeout_s: float = typer.Option(30.0, "--timeout-s", help="Deadline of the receipt, and of the settlement."),
) -> None:
    """End a flow run (no node runs); print the receipt and the turn's settlement. A repeat is a duplicate."""
    _flow_operator("abandon", run, conversation, command_id, principal, timeout_s)


@flows_app.command("restart")
@command
def flows_restart(
    run: str = _RUN,
    conversation: str = typer.Option(..., "--conversation", help="The run's conversation."),
    command_id: str | None = typer.Option(None, "--command-id", help="Send an earlier restart again (same id)."),
    principal: str | None = typer.Option(None, "--principal", help="Who asks (default: the client's)."),
    timeout_s: float = typer.Option(30.0, "--timeout-s", help="Deadline of the receipt, and of the settlement."),
) -> None:
    """End a flow run and open a new run of the deployed flow with its opening input (the receipt's run_id)."""
    _flow_operator("restart", run, conversation, command_id, principal, timeout_s)
