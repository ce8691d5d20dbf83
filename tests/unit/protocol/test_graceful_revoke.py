"""A graceful revoke is an ownership change the log explains, not a death (docs/design.md §3, §5; issue 6)."""

from __future__ import annotations

from settled.protocol import (
    GRACEFUL_REVOKE,
    ConversationState,
    RecoveryAction,
    RecoverySnapshot,
    StartAttempt,
    Submission,
    SubmissionState,
    admit,
    classify,
    interrupt,
    schedule,
    start_attempt,
)
from settled.schemas import RecoveryDecisionKind

from ._sim import T0, Log, proposal


def _log() -> Log:
    log = Log()
    log.claim()
    log.commit("c1", admit(log.state.conversation("c1"), proposal("s1", "k1"), log.ref(), T0))
    return log


def _conv(log: Log) -> ConversationState:
    return log.state.conversation("c1")


def _sub(log: Log) -> Submission:
    sub = _conv(log).submission("s1")
    assert sub is not None
    return sub


def test_a_graceful_revoke_takes_the_attempt_back_to_ready_uncharged() -> None:
    log = _log()
    log.commit("c1", start_attempt(_conv(log), "s1", "a1", log.epoch))
    log.commit("c1", interrupt(_conv(log), "s1", GRACEFUL_REVOKE))
    sub = _sub(log)
    assert sub.state is SubmissionState.READY
    assert (sub.attempt_count, sub.revoked_count, sub.charged_attempts) == (1, 1, 0)
    assert schedule(_conv(log)) == StartAttempt("s1", 2)


def test_an_interruption_for_another_reason_is_charged() -> None:
    log = _log()
    log.commit("c1", start_attempt(_conv(log), "s1", "a1", log.epoch))
    log.commit("c1", interrupt(_conv(log), "s1", "attempt 1 raised ValueError"))
    assert (_sub(log).revoked_count, _sub(log).charged_attempts) == (0, 1)


def test_revoked_attempts_do_not_spend_the_recovery_budget() -> None:
    log = _log()
    for n in range(1, 4):
        log.commit("c1", start_attempt(_conv(log), "s1", f"a{n}", log.epoch))
        log.commit("c1", interrupt(_conv(log), "s1", GRACEFUL_REVOKE))
    log.commit("c1", start_attempt(_conv(log), "s1", "a4", log.epoch))
    log.claim("w2")  # the next owner's claim: the running attempt 4 died (Recovery)
    sub = _sub(log)
    assert sub.state is SubmissionState.RECOVERY and sub.attempt_count == 4
    recovery = classify(RecoverySnapshot.of("s1", sub, [], max_attempts=3))
    assert recovery.action is RecoveryAction.DECIDE
    assert recovery.kind is RecoveryDecisionKind.RESUME, recovery.reason
    # Without the revokes the same four attempts would have spent the budget.
    log2 = _log()
    for n in range(1, 4):
        log2.commit("c1", start_attempt(_conv(log2), "s1", f"a{n}", log2.epoch))
        log2.commit("c1", interrupt(_conv(log2), "s1", "attempt raised"))
    log2.commit("c1", start_attempt(_conv(log2), "s1", "a4", log2.epoch))
    log2.claim("w2")
    spent = classify(RecoverySnapshot.of("s1", _sub(log2), [], max_attempts=3))
    assert spent.kind is RecoveryDecisionKind.TERMINALIZE, spent.reason
