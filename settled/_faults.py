"""Fault switches: deliberate breakages, one per durability promise, that prove the tests catch them (issue 3).

Each switch breaks exactly one promise when its name is listed in ``SETTLED_FAULT`` (comma separated). Product
code asks ``fault_enabled("offsets_in_separate_transaction")`` at the one place the promise is kept and, when it
is on, does the wrong thing. ``scripts/fault_switches.py`` runs each switch's named test with the switch on and
counts the switch as caught only when that test fails with the promise's assertion id
(``[PROMISE <id>]``, see ``tests/_promise.py``).

The registry is closed: an unknown name in ``SETTLED_FAULT`` or in a ``fault_enabled`` call raises
:class:`UnknownFaultError`. ``SETTLED_FAULT`` is read once, at the first call (no import-time side effects).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from types import MappingProxyType

from settled._errors import ErrorCategory, SettledError

__all__ = ["FAULT_ENV_VAR", "KNOWN_FAULTS", "UnknownFaultError", "enabled_faults", "fault_enabled", "reload_faults"]

FAULT_ENV_VAR = "SETTLED_FAULT"

KNOWN_FAULTS: Mapping[str, str] = MappingProxyType(
    {
        "random_transactional_id": (
            "the appender takes a random transactional.id instead of the partition's stable one, so a restarted "
            "owner never fences its zombie (DUR-006, docs/design.md §3)"
        ),
        "offsets_in_separate_transaction": (
            "the worker commits its consumed offsets outside the transaction holding its output, so a crash "
            "between the two loses or repeats a batch (DUR-007)"
        ),
        "tool_before_prepared_commit": (
            "a tool is invoked before its Prepared record is committed, so a crash leaves an invocation with no "
            "durable trace to classify (DUR-009, DUR-010)"
        ),
        "classifier_prepared_as_settled": (
            "the recovery classifier treats a Prepared step without a result as Settled instead of Unknown "
            "(DUR-009, DUR-013)"
        ),
        "step_not_awaited": (
            "a plain ctx.step's StepRecorded is posted instead of awaited, so the next step body runs before the "
            "step's result is durable (DUR-010, issue 24 item 2)"
        ),
        "admission_without_key_index": (
            "admission ignores the idempotency-key index, so a resubmitted request is admitted twice (DUR-001)"
        ),
        "id_contract_unchecked": (
            "admission does not check the input contract, so an id with a NUL, a control character or 400 KB is "
            "admitted (DUR-001, issue 25)"
        ),
        "claim_without_rewind": (
            "a claim resumes the inbox partition at the consumer's position instead of rewinding it to the last "
            "committed input offset (or the partition's start), so inputs read before a drop and re-claim are "
            "skipped (DUR-002)"
        ),
        "sdk_retries_on": (
            "OpenAIChat leaves the openai SDK's own retries on, so one allowed attempt of a model call sends several "
            "requests behind settled's retry budget (DUR-008, docs/semantics.md §9)"
        ),
        "projection_offsets_separate_transaction": (
            "the projector commits its consumed offsets in a different Postgres transaction than the rows they "
            "produced (DUR-015)"
        ),
        "flow_drift_unchecked": (
            "a turn of a flow run does not compare the run's pinned digest with the deployed flow's, so a parked run "
            "resumes against a changed graph, its recorded results replayed into other nodes (DUR-010, issue 18)"
        ),
        "workflow_retry_unrecorded": (
            "a failed workflow step is retried in the same attempt after its backoff, with no canonical "
            "StepRetryScheduled and no timed wait, so the retry leaves no trace in the log (DUR-010, issue 17 item 3)"
        ),
        "workflow_denial_replayed": (
            "a workflow run resumed after a denied step approval reads that denial again as its answer and pauses "
            "again, instead of asking anew under the next approval id, so no approval can ever let the step run "
            "(issue 17 item 2; DUR-008's rule for deliveries: a run acts only on the canonical answer to the request "
            "it made)"
        ),
        "signal_honoured_before_canonical": (
            "ctx.signal returns a signal found in the run's journal at once, with no canonical wait request and "
            "delivery, so nothing records which wait consumed it and a later wait takes it again (issue 16; "
            "DUR-008's rule for deliveries: canonical before anything acts on it)"
        ),
        "approval_digest_unchecked": (
            "an approval decision whose argument digest differs from the approval's is accepted, so a person's "
            "approval of one call's arguments approves other arguments (issue 16 item 4; as with DUR-009's signed "
            "resolutions, a signed command authorizes only what it names)"
        ),
        "tool_runs_before_approval": (
            "a call of a tool that needs approval is prepared and its tool runs before the approval is canonical (the "
            "approval is asked for afterwards), so an unapproved or denied call has run (issue 16 item 5; "
            "DUR-008's rule for deliveries: canonical before anything acts on it)"
        ),
        "api_access_unchecked": (
            "the partition owner skips the access check on records the HTTP API signed, so a token of one "
            "principal aborts, signals, approves or resolves on a conversation another principal opened (issue 20 "
            "item 3; as with DUR-009's signed resolutions, a signed record authorizes only what its signer may do)"
        ),
        "attempt_count_after_start": (
            "an attempt runs before its AttemptStarted (the attempt count) is appended, so a submission that kills "
            "its worker at once is never charged and crash-loops its workers instead of settling failed after its "
            "budget (DUR-014, issue 22 item 4)"
        ),
        "lane_policy_ignored": (
            "admission ignores the conversation's lane policy, so under reject, interrupt or keep_newest a new "
            "submission queues behind a busy lane: admitted while one holds it, the earlier ones never aborted "
            "(DUR-005, DUR-012, issue 22 item 1)"
        ),
        "joined_settled_separately": (
            "a host run's joined submissions are settled in a later commit than the host instead of in its batch; "
            "the fold refuses a joined settlement apart from its host's, so they stay joined, never settled, behind "
            "a settled host (DUR-016, issue 22 item 2: each joined submission settles with its host, exactly once)"
        ),
        "collateral_condemned": (
            "the appender's group policy takes the delivery errors of a shared transaction as the culprits and "
            "replaces every conversation with a failed record at once, so a healthy neighbour whose records failed "
            "only as collateral of one rejected record fails with it (DUR-014: a poison submission never fails its "
            "neighbours; settled/producers/_policy.py)"
        ),
        "lifecycle_outside_transaction": (
            "the partition owner publishes a batch's durable.* lifecycle events with a separate idempotent producer "
            "after the transaction that appends the batch commits, so a crash between the commit and that produce "
            "loses them (issue 17 item 5; DUR-007's rule: what a transaction makes canonical is produced in it)"
        ),
        "ui_csrf_unchecked": (
            "the operator page (/ui) skips its CSRF check, so a page elsewhere makes a logged-in operator's browser "
            "approve, deny or resolve (issue 21 item 1; as with DUR-009's signed resolutions, a command acts only "
            "when its author meant it)"
        ),
        "projection_data_error_retried": (
            "the projector takes a row PostgreSQL refuses (SQLSTATE 22, 23, 54, a NUL byte) for a lost connection: "
            "it reconnects and sends the same row again forever instead of quarantining it (DUR-015, issue 25)"
        ),
    }
)
"""Every known switch name and the promise it breaks."""


class UnknownFaultError(SettledError, ValueError):
    """A fault-switch name that is not in :data:`KNOWN_FAULTS`.

    Attributes:
        name: The unknown name.
        source: Where it came from (``SETTLED_FAULT`` or a ``fault_enabled`` call).
    """

    category = ErrorCategory.BAD_INPUT

    def __init__(self, name: str, source: str) -> None:
        known = ", ".join(sorted(KNOWN_FAULTS))
        super().__init__(f"unknown fault switch {name!r} in {source}; known switches: {known}")
        self.name = name
        self.source = source


_enabled: frozenset[str] | None = None
_lock = threading.Lock()


def _parse(value: str) -> frozenset[str]:
    names = frozenset(part.strip() for part in value.split(",") if part.strip())
    for name in sorted(names):
        if name not in KNOWN_FAULTS:
            raise UnknownFaultError(name, f"{FAULT_ENV_VAR}={value!r}")
    return names


def reload_faults() -> frozenset[str]:
    """Read ``SETTLED_FAULT`` again (for tests that change it within one process).

    Returns:
        The switches now on.

    Raises:
        UnknownFaultError: If ``SETTLED_FAULT`` names an unknown switch.
    """
    global _enabled
    with _lock:
        _enabled = _parse(os.environ.get(FAULT_ENV_VAR, ""))
        return _enabled


def enabled_faults() -> frozenset[str]:
    """Return the switches that are on, reading ``SETTLED_FAULT`` at the first call.

    Returns:
        The names listed in ``SETTLED_FAULT`` (empty when unset).

    Raises:
        UnknownFaultError: If ``SETTLED_FAULT`` names an unknown switch.
    """
    enabled = _enabled
    return enabled if enabled is not None else reload_faults()


def fault_enabled(name: str) -> bool:
    """Tell whether the fault switch ``name`` is on.

    Args:
        name: A name from :data:`KNOWN_FAULTS`.

    Returns:
        True when ``SETTLED_FAULT`` lists ``name``.

    Raises:
        UnknownFaultError: If ``name`` (or any name in ``SETTLED_FAULT``) is not a known switch.
    """
    if name not in KNOWN_FAULTS:
        raise UnknownFaultError(name, "a fault_enabled() call")
    return name in enabled_faults()
