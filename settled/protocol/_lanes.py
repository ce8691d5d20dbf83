"""Lane policies (issue 22 item 1): what a new submission does to a busy conversation.

A conversation's lane is chosen once, by the submission that opens it: the proposal's ``lane``, else the app's
default (``App(lane=...)``, handed to `settled.protocol.admit` as ``default_lane``). That choice is recorded on the
opening `SubmissionAdmitted` (``lane``), so the fold (``ConversationState.lane``) and every later decision read it
from the log and never from the app's configuration: replay with another default gives the same state. A
conversation opened before lanes existed folds to `LanePolicy.QUEUE`. See docs/architecture.md "Lane policies".
"""

from __future__ import annotations

from settled.protocol._fold import ConversationState
from settled.schemas import LanePolicy

__all__ = ["DEFAULT_LANE", "LanePolicy", "opening_lane"]

DEFAULT_LANE = LanePolicy.QUEUE
"""The lane of an app that names none, and of a conversation whose opening admission recorded none."""


def opening_lane(state: ConversationState, asked: LanePolicy | None, default_lane: LanePolicy) -> LanePolicy | None:
    """Return the lane an admission records: the effective lane when it opens the conversation, else None.

    Args:
        state: The conversation's state before the admission.
        asked: The proposal's ``lane`` (None: it asked for none).
        default_lane: The app's default lane (``App(lane=...)``).

    Returns:
        ``asked`` or else ``default_lane`` for the conversation's first submission; None for every later one (the
        conversation's lane is already recorded; a ``SetLane`` changes it).
    """
    if state.last_submission_seq != 0:
        return None
    return asked if asked is not None else default_lane
