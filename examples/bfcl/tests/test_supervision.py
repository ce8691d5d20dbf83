"""How the demo's supervisor names a worker's exit 75 (issue 24 item 4): a lost static membership or a stalled turn.

Both end the worker with exit 75 to be restarted; the demo reports them in two rows, told apart by the worker's last
log lines (the lines `settled worker` writes just before it exits).
"""

from __future__ import annotations

import json
from pathlib import Path

from settled_bfcl._demo import _lost_membership_logged


def _log(path: Path, *messages: str) -> Path:
    filler = [{"level": "INFO", "message": "turn settled", "n": i} for i in range(200)]  # more than the tail it reads
    lines = [*filler, *({"level": "ERROR", "message": m} for m in messages)]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_a_log_ending_with_a_lost_membership_is_told_from_a_watchdog_stop(tmp_path: Path) -> None:
    lost = _log(
        tmp_path / "lost.log",
        "fenced as a static member: waiting for the join that holds the instance id to expire",
        "worker's static membership lost, no other worker holds its instance id: exiting to be restarted",
    )
    stalled = _log(tmp_path / "stalled.log", "turn watchdog: phase 'checkpoint of partition 3' ran past its bound")
    assert _lost_membership_logged(lost)
    assert not _lost_membership_logged(stalled)


def test_an_earlier_lost_membership_does_not_name_a_later_exit(tmp_path: Path) -> None:
    path = tmp_path / "worker.log"
    _log(path, "worker's static membership lost, no other worker holds its instance id: exiting to be restarted")
    with path.open("a") as log:  # the restarted worker appends to the same log, then stalls
        for i in range(200):
            log.write(json.dumps({"level": "INFO", "message": "turn settled", "n": i}) + "\n")
    assert not _lost_membership_logged(path)
