"""Approvals in the BFCL job (issue 16 item 8): which calls are gated, the operator's seeded rule, the denial.

* **The gate.** With ``--approvals`` every call of a state-changing BFCL method (`STATE_CHANGING_METHODS`: it can
  change its backend's state, public or session, e.g. ``cd``, a login, ``place_order``) waits for a person's
  decision before it runs; read-only methods (every other one, e.g. ``ls``, ``get_stock_info``, all of ``MathAPI``)
  are never gated. ``examples/bfcl/tests/test_approvals.py`` checks the list against every ground-truth call of the
  corpus: no call of a read-only method changes anything BFCL's state checker compares.
* **The request** is settled's for a tool that needs approval (``needs_approval=True``, issue 16 item 5): its
  details name the tool and carry the call's canonical arguments, which the BFCL agent makes hold the model's call
  id (`settled_bfcl._app.BfclAgent`); `approval_subject` reads both back from a ``WaitRequested`` record.
* **The operator's rule** (`approval_granted`): a seeded, per-call coin that denies about `DENY_FRACTION` of the
  gated calls, a function of the run's seed and the model's call id only, so the operator (a separate actor that
  signs ``Client.approve`` / ``Client.deny``) and the verdict (`expected_decisions`) agree without talking.
* **The denial** is settled's structured denial (`settled.runtime.denial_result`: the tool, who denied, the reason,
  ``"retry": false``), given to the model as the call's result; `parse_denial` recognises its canonical JSON.

**What the replay model does after a denial.** It carries on with the turn's plan: the denied call counts as
answered, the next planned call comes next, and the turn's final text names the denied call ids
(`settled_bfcl.final_reply_text`), which is how the verdict sees that the model read the structured denial. So the
reference run of a conversation is its ground truth with the denied calls skipped (`settled_bfcl.run_oracle` with
``skip``): the same calls in the same order, minus the denied ones, on a fresh world.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

from settled_bfcl._corpus import Entry

__all__ = [
    "APPROVER_KEY_ID",
    "DENY_FRACTION",
    "STATE_CHANGING_METHODS",
    "Denial",
    "approval_granted",
    "approval_reason",
    "approval_subject",
    "denied_calls",
    "expected_decisions",
    "needs_approval",
    "parse_denial",
]

#: The key id the demo's operator signs ``DecideApproval`` with (``App.approver_keys``).
APPROVER_KEY_ID = "bfcl-approver"
#: The share of gated calls the operator's rule denies (about one in four).
DENY_FRACTION = 0.25

#: Every BFCL method that can change its backend's state (public attributes, or the session: login, working folder).
STATE_CHANGING_METHODS: frozenset[str] = frozenset(
    {
        # GorillaFileSystem
        "cd",
        "cp",
        "echo",  # writes a file when given file_name
        "mkdir",
        "mv",
        "rm",
        "rmdir",
        "touch",
        # MessageAPI
        "add_contact",
        "delete_message",
        "message_login",
        "send_message",
        # TicketAPI
        "close_ticket",
        "create_ticket",
        "edit_ticket",
        "logout",
        "resolve_ticket",
        "ticket_login",
        # TradingBot
        "add_to_watchlist",
        "cancel_order",
        "fund_account",
        "place_order",
        "remove_stock_from_watchlist",
        "trading_login",
        "trading_logout",
        "withdraw_funds",
        # TravelAPI
        "authenticate_travel",
        "book_flight",
        "cancel_booking",
        "purchase_insurance",
        "register_credit_card",
        "set_budget_limit",
        # TwitterAPI
        "authenticate_twitter",
        "comment",
        "follow_user",
        "mention",
        "post_tweet",
        "retweet",
        "unfollow_user",
        # VehicleControlAPI
        "activateParkingBrake",
        "adjustClimateControl",
        "fillFuelTank",
        "lockDoors",
        "pressBrakePedal",
        "releaseBrakePedal",
        "setCruiseControl",
        "setHeadlights",
        "set_navigation",
        "startEngine",
    }
)


def needs_approval(method: str) -> bool:
    """Tell whether a call of ``method`` waits for approval under ``--approvals``.

    Args:
        method: The BFCL method (the tool's name).

    Returns:
        True for a state-changing method.
    """
    return method in STATE_CHANGING_METHODS


def approval_granted(seed: int, call_id: str) -> bool:
    """The operator's rule: approve or deny one gated call, from the run's seed and the model's call id alone.

    Args:
        seed: The run's seed (logged by the demo).
        call_id: The model's call id (``<entry>/t<k>/c<j>``).

    Returns:
        True to approve; False (about `DENY_FRACTION` of calls) to deny.
    """
    # A string seed is hashed with SHA-512 by random.seed (version 2): the same in every process.
    return random.Random(f"settled-bfcl-approvals:{seed}:{call_id}").random() >= DENY_FRACTION


def approval_reason(seed: int, approved: bool) -> str:
    """Return the reason the operator gives with its decision.

    Args:
        seed: The run's seed.
        approved: The decision.

    Returns:
        E.g. ``"bfcl operator rule (seed 7): deny"``.
    """
    return f"bfcl operator rule (seed {seed}): {'approve' if approved else 'deny'}"


def expected_decisions(entry: Entry, seed: int) -> dict[str, bool]:
    """Return the decision the operator's rule gives each gated ground-truth call of an entry.

    Args:
        entry: The entry.
        seed: The run's seed.

    Returns:
        Model call id to approved, for every call of a state-changing method, in ground-truth order.
    """
    return {call.call_id: approval_granted(seed, call.call_id) for call in entry.calls if needs_approval(call.method)}


def denied_calls(entry: Entry, seed: int) -> frozenset[str]:
    """Return the ground-truth calls of an entry the operator's rule denies.

    Args:
        entry: The entry.
        seed: The run's seed.

    Returns:
        Their model call ids.
    """
    return frozenset(call_id for call_id, approved in expected_decisions(entry, seed).items() if not approved)


def approval_subject(details_json: str | None) -> tuple[str, str] | None:
    """Read the model's call id and the method back from a gated call's approval request (``WaitRequested``).

    Args:
        details_json: The request's ``details_json`` (`settled.protocol.approval_details`: ``tool`` and the call's
            canonical ``args_json``, which the BFCL agent gives a ``call_id``).

    Returns:
        ``(call_id, method)``, or None when the request is not a BFCL tool call's.
    """
    if details_json is None:
        return None
    try:
        details = json.loads(details_json)
        args = json.loads(details["args_json"]) if isinstance(details, dict) else None
    except (ValueError, KeyError, TypeError):
        return None
    method = details.get("tool") if isinstance(details, dict) else None
    call_id = args.get("call_id") if isinstance(args, dict) else None
    if not isinstance(call_id, str) or not isinstance(method, str):
        return None
    return call_id, method


@dataclass(frozen=True, slots=True)
class Denial:
    """A structured denial, as the model reads it.

    Attributes:
        tool: The tool whose call was denied.
        by: Who denied (the signing key id), or None for an expiry.
        reason: Why.
    """

    tool: str
    by: str | None
    reason: str | None


def parse_denial(text: str) -> Denial | None:
    """Recognise settled's structured denial (`settled.runtime.denial_result`) in a tool result.

    Args:
        text: A tool result as the model sees it (JSON text).

    Returns:
        The denial, or None when the text is not one.
    """
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if not isinstance(value, dict) or value.get("denied") is not True or value.get("retry") is not False:
        return None
    tool, by, reason = value.get("tool"), value.get("by"), value.get("reason")
    if not isinstance(tool, str):
        return None
    return Denial(tool, by if isinstance(by, str) else None, reason if isinstance(reason, str) else None)
