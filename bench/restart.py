"""Benchmark: a worker killed with -9, restarted in place or taken over by another worker (issue 24 item 4).

    .venv/bin/python bench/restart.py [--reps 5] [--bootstrap HOST:PORT] [--restore-records 0]

settled's crash case of ``bench/side_by_side.py`` (its ``crash: restart -> done beyond the re-run step`` row) alone,
on the broker named by ``--bootstrap``/``SETTLED_KAFKA_BOOTSTRAP`` (else the dev stack's), without the peers: a fresh
namespace (12 partitions), one worker process, a turn of K = 5 steps whose step 3 sleeps 5 s; the worker is killed with
-9 one second into step 3 and a worker is started at once:

* ``in place``: the same worker slot again, with the same ``SETTLED_WORKER_INSTANCE_ID`` (static membership);
* ``takeover``: a worker with another instance id (the dead one is never restarted).

Each case records the time from that start to the settlement read by the client, minus the 5 s of the re-run step,
and checks steps 1-2 ran once and step 3 twice. ``--restore-records N`` first fills one partition with N turns, so the
restore's cost (read and fold of the whole partition) shows in the claim's log line (``restore_ms``, ``records``).
Figures are medians (min-max) of ``--reps``; dev (short) Kafka timeouts unless the environment sets others. Each
repetition also prints where the time went, from the new worker's log (wall clock, milliseconds): ``start`` (the
process started until its first log line, "worker started": interpreter, imports, settings, the worker built),
``join`` (until "assigned"), ``claims`` (until the last "partition claimed"), ``crash partition`` (until the crash
turn's partition was claimed) and ``settle`` (from that claim to the settlement read, less the re-run step), and the
largest ``fence_ms`` of the claims.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import load_average, resolve_bootstrap, use_dev_timeouts
from side_by_side import (
    CRASH_K,
    CRASH_STEP,
    KILL_INTO_STEP_S,
    PARTITIONS,
    STEP_SLEEP_S,
    BenchmarkError,
    SettledCase,
    _counter_executions,
    _wait_for_line,
)

from settled.producers import partition_for_key

IN_PLACE = "in place (same instance id)"
TAKEOVER = "takeover (another instance id)"


def _breakdown(lines: list[dict[str, object]], t_start_s: float, t_done_s: float, partition: int) -> dict[str, float]:
    """Where a restart's time went, in milliseconds, from the new worker's log lines (see the module docstring).

    Args:
        lines: The new worker's log lines (JSON objects), in order.
        t_start_s: The wall-clock time (``time.time()``) the new worker was started at, in seconds.
        t_done_s: The wall-clock time the settlement was read at, in seconds.
        partition: The crash turn's partition.

    Returns:
        The phases' durations in milliseconds (a phase whose line is missing is left out).
    """
    first = next((_written_at_s(line) for line in lines if line.get("message") == "worker started"), None)
    assigned = next((_written_at_s(line) for line in lines if line.get("message") == "assigned"), None)
    claims = [line for line in lines if line.get("message") == "partition claimed"]
    out: dict[str, float] = {}
    if first is None or assigned is None or not claims:
        return out
    crash = next((_written_at_s(line) for line in claims if line.get("partition") == partition), None)
    out["start"] = (first - t_start_s) * 1000
    out["join"] = (assigned - first) * 1000
    out["claims"] = (max(_written_at_s(line) for line in claims) - assigned) * 1000
    out["max fence"] = max(float(str(line.get("fence_ms", 0))) for line in claims)
    if crash is not None:
        out["crash partition"] = (crash - assigned) * 1000
        out["settle"] = (t_done_s - crash - STEP_SLEEP_S) * 1000
    return out


def crash_case(
    bootstrap: str, log_dir: Path, mode: str, restore_records: int
) -> tuple[float, list[dict[str, object]], dict[str, float]]:
    """One crash case; returns the seconds from the new worker's start to the settlement beyond the re-run step.

    Args:
        bootstrap: The broker.
        log_dir: Where the workers' logs go.
        mode: `IN_PLACE` or `TAKEOVER`.
        restore_records: Turns run on the crash turn's partition before the crash (0: none).

    Returns:
        The time beyond the re-run step, in seconds, the new worker's claim log lines of the crash turn's partition,
        and where the time went (`_breakdown`).

    Raises:
        BenchmarkError: The executions per step are not 1, 1, 2, 1, 1.
    """
    case = SettledCase(bootstrap, log_dir, f"restart-{uuid.uuid4().hex[:6]}")
    assert case.worker is not None
    counter = log_dir / f"restart-{uuid.uuid4().hex[:6]}.txt"
    conversation = f"c-{uuid.uuid4().hex}"
    try:
        case.warm_partitions()
        for _ in range(restore_records):
            case.turn({"k": 1}, conversation)
        body = {"k": CRASH_K, "counter": str(counter), "sleep_step": CRASH_STEP, "sleep_s": STEP_SLEEP_S}
        sid = case.submit(body, conversation)
        _wait_for_line(counter, f"step {CRASH_STEP}", 60)
        time.sleep(KILL_INTO_STEP_S)  # the workload: the kill comes 1 s into the step
        case.worker.kill_and_wait()
        t_restart = time.perf_counter()
        t_restart_wall_s = time.time()
        case.start_worker(slot=0 if mode == IN_PLACE else 1, log_level="INFO")
        case.settle([sid], timeout_s=120)
        t_done = case.tracker.read_at[sid]
        executions = _counter_executions(counter)
        expected = {i: (2 if i == CRASH_STEP else 1) for i in range(1, CRASH_K + 1)}
        if executions != expected:
            raise BenchmarkError(f"{mode}: executions per step {executions}, expected {expected}")
        partition = partition_for_key(conversation.encode(), PARTITIONS)
        lines = [line for line in case.worker.log_lines() if _after(line, t_restart_wall_s)]
        claims = [
            line for line in lines if line.get("message") == "partition claimed" and line.get("partition") == partition
        ]
        done_wall_s = t_restart_wall_s + (t_done - t_restart)
        return t_done - t_restart - STEP_SLEEP_S, claims, _breakdown(lines, t_restart_wall_s, done_wall_s, partition)
    finally:
        case.close()


def _written_at_s(line: dict[str, object]) -> float:
    """The wall-clock time a worker's log line was written at (its ``ts``), in seconds."""
    return datetime.fromisoformat(str(line["ts"])).timestamp()


def _after(line: dict[str, object], t_s: float) -> bool:
    """Whether a log line was written at or after the wall-clock time ``t_s`` (seconds)."""
    return "ts" in line and _written_at_s(line) >= t_s


def main(argv: Sequence[str] | None = None) -> int:
    """Run the cases and print their medians."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=5, help="repetitions of each case (default 5)")
    parser.add_argument("--bootstrap", default=None, help="the broker (default: SETTLED_KAFKA_BOOTSTRAP, or dev)")
    parser.add_argument("--restore-records", type=int, default=0, help="turns on the crash partition first")
    parser.add_argument("--cases", default="in-place,takeover", help="comma-separated: in-place, takeover")
    parser.add_argument("--log-dir", type=Path, default=Path("/tmp") / f"settled-restart-{uuid.uuid4().hex[:6]}")
    args = parser.parse_args(argv)
    timeouts = use_dev_timeouts()
    bootstrap, where = resolve_bootstrap(args.bootstrap)
    modes = {"in-place": IN_PLACE, "takeover": TAKEOVER}
    print(f"broker {bootstrap} ({where}); {timeouts}; load average before {load_average()}")
    for name in args.cases.split(","):
        mode = modes[name]
        figures: list[float] = []
        for rep in range(args.reps):
            beyond_s, claims, phases = crash_case(bootstrap, args.log_dir, mode, args.restore_records)
            figures.append(beyond_s)
            restore = [(c.get("records"), c.get("restore_ms")) for c in claims]
            where = ", ".join(f"{name} {ms:.0f}" for name, ms in phases.items())
            print(
                f"{mode} rep {rep + 1}: {beyond_s:.3f} s beyond the re-run step; claim (records, ms) {restore}; "
                f"ms: {where}"
            )
        print(
            f"{mode}: median {statistics.median(figures):.3f} s (min {min(figures):.3f}, max {max(figures):.3f}) "
            f"over {len(figures)}"
        )
    print(f"load average after {load_average()}; worker logs in {args.log_dir}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
