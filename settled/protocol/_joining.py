"""Joining (issue 22 item 2, DUR-016): which queued submissions an active run may take in at a model boundary.

With the ``join`` lane an active run claims, before a model call it makes live, the contiguous ready prefix of the
submissions queued behind it: the owner decides it (`settled.protocol.join`) into a canonical `SubmissionsJoined`,
committed before their inputs reach the model. The fold checks the same prefix (`joinable_prefix`), so a record
that names anything else is refused. A joined submission settles with its host, in the host's batch, with its
outcome (`settled.protocol.terminalize`). See docs/architecture.md "Joining".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from settled.protocol._states import SubmissionState
from settled.schemas import AttemptStarted, LogEvent, Settlement, SubmissionAdmitted, SubmissionsJoined

if TYPE_CHECKING:
    from settled.protocol._fold import ConversationState, Submission

__all__ = ["aborted_in_group", "check_joining", "joinable_prefix", "joined_submissions"]


def aborted_in_group(state: ConversationState, sub: Submission) -> Submission | None:
    """Return the first submission of ``sub``'s group whose abort is recorded: itself, then those it joined.

    A joined submission runs and settles with its host, so an abort of it is an abort of the host's run: the run is
    stopped and the whole group settles aborted with that abort's reason (`settled.protocol.terminalize`).

    Args:
        state: The conversation's state.
        sub: A submission (a host, or one that joined nothing).

    Returns:
        The aborted member, or None.
    """
    if sub.abort_requested:
        return sub
    for joined_id in sub.joined:
        joined = state.submissions[joined_id]
        if joined.abort_requested:
            return joined
    return None


def joinable_prefix(queue: Iterable[str], submissions: Mapping[str, Submission], host_id: str) -> list[str]:
    """Return the submissions the host run may join now: the contiguous ready prefix queued behind it.

    Walks the conversation's queue (nonterminal submissions in sequence order; settled ones, aborted ones included,
    are not in it and so never break the prefix). The host and the submissions it already joined are passed over;
    so is a queued submission with a recorded abort (it settles aborted without running, docs/semantics.md §13).
    The prefix ends at the first other submission that is not Ready without an attempt (admitted but not ready,
    or anything else).

    Args:
        queue: The conversation's queue (`ConversationState.queue`), in submission-sequence order.
        submissions: The conversation's submissions by id.
        host_id: The active run's submission.

    Returns:
        The ids, in submission-sequence order (empty when nothing can be joined).
    """
    found: list[str] = []
    for submission_id in queue:
        sub = submissions[submission_id]
        if submission_id == host_id or sub.joined_to == host_id:
            continue
        if sub.abort_requested and sub.state in (SubmissionState.ADMITTED, SubmissionState.READY):
            continue
        if sub.state is not SubmissionState.READY or sub.attempt_count != 0 or sub.joined_to is not None:
            break
        found.append(submission_id)
    return found


def joined_submissions(journal: Iterable[object], submission_id: str) -> list[str]:
    """Return the submissions a run joined, in join order, read from its records (never from what is queued now).

    Args:
        journal: The run's committed records in log order (only `SubmissionsJoined` is read).
        submission_id: The host run.

    Returns:
        The joined ids, each once.
    """
    ids: list[str] = []
    for e in journal:
        if isinstance(e, SubmissionsJoined) and e.submission_id == submission_id:
            ids.extend(i for i in e.joined_ids if i not in ids)
    return ids


def check_joining(events: Iterable[LogEvent]) -> list[str]:
    """Check a conversation's canonical events against joining's promises; return the violations (none: they hold).

    Each `SubmissionsJoined` is made while its host's attempt runs (started, not settled) and names submissions
    admitted before it, in sequence order; each joined submission is joined once, never starts an attempt of its
    own, and settles exactly once, right after its host's settlement (only settlements of the same group between),
    naming its host and with the host's outcome. The conversation's other promises (none lost or doubled, one
    active, its lane's order) are checked elsewhere (the lane checker).

    Args:
        events: The conversation's events, every batch's, in log order.

    Returns:
        Human-readable violations, empty when joining kept its promises.
    """
    log = list(events)
    admitted_at: dict[str, int] = {}
    attempts: dict[str, tuple[str, int]] = {}  # attempt id -> (submission, position)
    started: set[str] = set()
    settled: dict[str, list[int]] = {}
    for i, e in enumerate(log):
        if isinstance(e, SubmissionAdmitted):
            admitted_at.setdefault(e.submission_id, i)
        elif isinstance(e, AttemptStarted):
            attempts[e.attempt_id] = (e.submission_id, i)
            started.add(e.submission_id)
        elif isinstance(e, Settlement):
            settled.setdefault(e.submission_id, []).append(i)
    out: list[str] = []
    host_of: dict[str, str] = {}
    for i, e in enumerate(log):
        if not isinstance(e, SubmissionsJoined):
            continue
        attempt = attempts.get(e.attempt_id)
        host_settled = settled.get(e.submission_id, [])
        if attempt is None or attempt[0] != e.submission_id or attempt[1] > i or any(p < i for p in host_settled):
            out.append(f"join at event {i}: host {e.submission_id} attempt {e.attempt_id} was not running")
        if sorted(e.joined_ids, key=lambda s: admitted_at.get(s, -1)) != list(e.joined_ids):
            out.append(f"join at event {i}: {list(e.joined_ids)} not in sequence order")
        for sid in e.joined_ids:
            if sid in host_of:
                out.append(f"{sid}: joined twice (into {host_of[sid]} and {e.submission_id})")
            host_of[sid] = e.submission_id
            if admitted_at.get(sid, i) >= i:
                out.append(f"{sid}: joined at event {i} before it was admitted")
    for sid, host in host_of.items():
        if sid in started:
            out.append(f"{sid}: joined into {host} and started as its own attempt")
        positions = settled.get(sid, [])
        if len(positions) != 1:
            out.append(f"{sid}: joined into {host}, settled {len(positions)} times")
            continue
        at = positions[0]
        mine = log[at]
        assert isinstance(mine, Settlement)
        host_at = settled.get(host, [])
        if not host_at or host_at[0] > at:
            out.append(f"{sid}: settled before its host {host}")
            continue
        host_settlement = log[host_at[0]]
        assert isinstance(host_settlement, Settlement)
        between = log[host_at[0] + 1 : at]
        if mine.joined_to != host or mine.outcome is not host_settlement.outcome:
            out.append(
                f"{sid}: settled {mine.outcome.value} naming {mine.joined_to}, its host {host} settled "
                f"{host_settlement.outcome.value}"
            )
        if not all(isinstance(b, Settlement) and b.joined_to == host for b in between):
            out.append(f"{sid}: not settled with its host {host}: other records between their settlements")
    return out
