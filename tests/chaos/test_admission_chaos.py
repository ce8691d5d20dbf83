"""The admission load with the worker SIGKILLed at failpoints chosen by a logged seed (issue 5 acceptance).

The load of `tests.integration.admission_load` (originals, duplicates — some in one poll batch with their original —
exact re-sends and conflicts over many conversations on 3 partitions) is produced up front. Real worker processes
(``python -m settled.services worker --app settled.testing.echo:app``) then run one after another, each armed to
SIGKILL itself at the next scheduled failpoint hit (`settled._failpoints.choose_schedule`); a last one runs
unarmed until everything is answered and settled. The same promises as the in-process load test must hold.

Replay a failure with ``SETTLED_CHAOS_SEED=<seed>`` (the seed is printed and logged).
"""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from settled._failpoints import FailpointControl, choose_schedule
from settled._settings import Settings
from settled.producers import provision_topics
from tests.integration.admission_load import (
    check_load,
    log_tail,
    make_load,
    produce_load,
    progress,
    spawn_worker,
    stop_worker,
)
from tests.integration.helpers import CODEC

pytestmark = [pytest.mark.chaos, pytest.mark.integration]

FAILPOINTS = ("appender.after_produce", "appender.before_commit", "appender.after_commit", "worker.before_checkpoint")
KILLS = 8
#: Hits 1-3 of the appender's points are the three partitions' ownership claims; later ones carry the load.
MAX_HIT = 12
INCARNATION_TIMEOUT_S = 40.0


def test_admission_load_survives_sigkills_at_seeded_failpoints(settings: Settings, tmp_path: Path) -> None:
    s = settings.model_copy(update={"partitions": 3})
    provision_topics(s, CODEC, datetime.now(UTC))
    seed = int(os.environ.get("SETTLED_CHAOS_SEED", time.time_ns() % 1_000_000))
    schedule = choose_schedule(seed, FAILPOINTS, KILLS, max_hit=MAX_HIT)
    print(f"chaos seed {seed} (SETTLED_CHAOS_SEED={seed} replays it): {'; '.join(k.spec for k in schedule)}")
    load = make_load(seed, conversations=20, total=300, duplicates=40, resends=10, conflicts=25, adjacent=10)
    produce_load(s, load)
    want = (len(load.items), load.count["original"])

    def complete() -> bool:
        got = progress(s)
        return got[0] >= want[0] and got[1] >= want[1]

    control = FailpointControl(tmp_path / "fp")
    log = tmp_path / "worker.log"
    killed: list[str] = []
    for n, kill in enumerate(schedule):
        proc = spawn_worker(s, log, failpoint_env=control.env(kill.spec, seed=seed), worker_id=f"chaos-{n}")
        deadline = time.monotonic() + INCARNATION_TIMEOUT_S
        try:
            while proc.poll() is None and not complete():
                assert time.monotonic() < deadline, (
                    f"seed {seed}: incarnation {n} ({kill.spec}) neither died nor finished the load in "
                    f"{INCARNATION_TIMEOUT_S:g} s, progress {progress(s)} of {want}\n{log_tail(log)}"
                )
                time.sleep(0.2)
        finally:
            code = proc.poll()
            if code is None:
                stop_worker(proc)
        if code is None:
            print(f"incarnation {n}: the load completed before {kill.spec} fired")
            break
        assert code == -9, f"seed {seed}: incarnation {n} exited {code}, not by its SIGKILL\n{log_tail(log)}"
        killed.append(kill.spec)
        print(f"incarnation {n}: killed at {kill.spec}; progress {progress(s)} of {want}")
    last = spawn_worker(s, log, worker_id="chaos-last")
    try:
        deadline = time.monotonic() + 60.0
        while not complete() and time.monotonic() < deadline and last.poll() is None:
            time.sleep(0.3)
    finally:
        code = stop_worker(last)
    print(f"seed {seed}: {len(killed)} kills ({'; '.join(killed)}); final progress {progress(s)} of {want}")
    fired = [(r.name, r.hit) for r in control.hit_log() if "kill" in r.actions]
    assert len(fired) == len(killed), f"kills logged by the failpoints {fired}, by the test {killed}"
    check_load(s, load, allow_failed=True)
    assert code == 0, f"seed {seed}: the last worker exited {code} after SIGTERM\n{log_tail(log)}"
