"""``App(lane=...)``: the app's default lane policy (issue 22 item 1), checked when the app is built."""

from __future__ import annotations

import pytest

from settled.protocol import LanePolicy
from settled.runtime import App


async def _echo(ctx: object) -> None:
    return None


def test_the_default_lane_is_queue_and_a_name_is_accepted() -> None:
    assert App(_echo).lane is LanePolicy.QUEUE
    assert App(_echo, lane="keep_newest").lane is LanePolicy.KEEP_NEWEST  # type: ignore[arg-type]


def test_an_unknown_lane_names_the_field_and_the_value() -> None:
    with pytest.raises(
        ValueError, match=r"^App.lane must be one of queue, join, reject, interrupt, keep_newest, got 'x'"
    ):
        App(_echo, lane="x")  # type: ignore[arg-type]
