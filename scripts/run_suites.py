"""Run settled's CI suites in order, each within its time cap, and print one summary line.

Usage: ``python scripts/run_suites.py [--suite NAME ...] [--list]``. ``scripts/dev test`` calls it after starting
the services; ``.ci/run`` calls ``scripts/dev test``. A suite fails when its command fails, or when it runs past
its cap (it is killed at the cap). pytest's exit 5 ("no tests collected") counts as an empty suite, not a failure.
The last line is ``N passed, N failed, N skipped`` over every pytest suite; the fault-switch suite reports
switches caught instead (its tests are expected to fail).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
REPORTS = ROOT / ".state" / "reports"


@dataclass(frozen=True)
class Suite:
    name: str
    cap_s: int
    argv: tuple[tuple[str, ...], ...]
    junit: bool = False


def _pytest(path: str, *extra: str) -> tuple[str, ...]:
    return (PY, "-m", "pytest", path, "-q", "-p", "no:cacheprovider", *extra)


SUITES = [
    Suite(
        "static",
        180,
        (
            (PY, "-m", "ruff", "check", "settled", "tests", "scripts", "bench", "examples"),
            (PY, "-m", "mypy"),
            (str(Path(PY).parent / "lint-imports"),),
        ),
    ),
    # +5 s for issue 22 item 2's joining (tests/unit/protocol/test_joining.py, tests/unit/runtime/test_joining.py, a
    # projection row test: ~3.5 s here).
    # +5 s for issue 24 item 4's command line (tests/unit/services/test_cli_imports.py: a worker entry subprocess and
    # every command's help built alone and whole; ~3.7 s here).
    Suite("unit", 130, (_pytest("tests/unit"),), junit=True),
    # 720 s, +180 s for issue 25's hostile-input tests (contract, fuzz run, projection quarantine, re-claim rewind,
    # oversized records, tool results across a broker outage: ~140 s here on a quiet machine).
    # +30 s for `settled doctor` (tests/integration/test_doctor.py, ~25 s here, a private broker included).
    # +150 s for issue 20's HTTP API tests (tests/integration/api: real worker and API processes, a private broker
    # stopped and started; ~115 s here at load 7 on 2 cores, less on a quiet machine).
    # +60 s for the shared settlements reader and AsyncClient (test_client_waits.py, test_async_client.py; ~45 s here).
    # +40 s for the operator page's session, CSRF and decision tests (issue 21,
    # tests/integration/api/test_ui_session.py; ~34 s here).
    # +40 s for issue 20's access grants and revocations, API and CLI (tests/integration/api/test_api_access_grants.py;
    # ~35 s here).
    # +10 s for the async lifecycle subscriber (issue 17 item 5, tests/integration/test_async_lifecycle.py; ~5 s here).
    # +20 s for issue 18's refund-flow example (tests/integration/test_refund_flow_example.py, ~12 s here).
    # +70 s for a worker started while its broker is down (tests/integration/test_worker_broker_wait.py: a private
    # broker stopped and started again, two workers waiting on it; ~63 s here).
    # +55 s for steering and retries over HTTP and through AsyncClient (tests/integration/api/test_api_steer_retry.py,
    # the steer/retry test of tests/integration/test_async_client.py; ~50 s here).
    # +10 s for issue 24 item 3's checkpoints side by side (tests/integration/test_worker_parallel_checkpoints.py,
    # ~6.5 s here).
    Suite("integration", 1385, (_pytest("tests/integration", "--ignore=tests/integration/engine"),), junit=True),
    # The execution engine's kill tests (issue 6): real worker processes killed at the crash-matrix boundaries.
    # +50 s for issue 16's signal and deadline tests (tests/integration/engine/test_engine_signals.py, ~42 s here);
    # +15 s for its approval tests (tests/integration/engine/test_engine_approvals.py, ~11 s here);
    # +45 s for its tools that need approval (tests/integration/engine/test_engine_tool_approvals.py, ~38 s here);
    # +15 s for the metrics test (tests/integration/engine/test_engine_metrics.py, ~6 s here);
    # +45 s for what runs wait for in the projection and the CLI (test_engine_wait_views.py, ~40 s here under load);
    # +80 s for issue 16's wait acceptance tests and scenarios 1, 3, 9, 16
    # (tests/integration/engine/test_engine_waits.py: 79 s measured alone here, 103-111 s on a loaded machine);
    # +20 s for issue 19's stream across a kill (tests/integration/engine/test_engine_stream.py, ~12 s here);
    # +80 s for issue 17's workflows (tests/integration/engine/test_engine_workflows.py: the invoice killed in each of
    # its 4 steps, retries, a kill after a retry, exhaustion, a step timeout, the task id as idempotency key; 50-70 s
    # here under load);
    # +50 s for issue 17's lifecycle events (tests/integration/engine/test_engine_lifecycle.py: a workflow and an
    # agent run across two kills each, a kill right after a commit; ~35 s here);
    # +45 s for issue 22 item 4's retry budget (tests/integration/engine/test_engine_retry_budget.py: scenario 14's
    # three deaths, the error path's backoffs, a model call past its own budget; ~48 s here);
    # +30 s for issue 24's restart in place (tests/integration/engine/test_engine_restart.py: 19 s here under load);
    # +40 s for issue 18's flow turns (tests/integration/engine/test_engine_flows.py: the refund flow killed in each
    # of its 3 nodes, a collect asking; ~27 s here);
    # +70 s for issue 18's flow runs (tests/integration/engine/test_engine_flow_runs.py: the refund flow with its
    # approval over two turns killed in each of 4 nodes, fail-closed addressing; ~58 s here under load);
    # +40 s for issue 18's digest pin (tests/integration/engine/test_engine_flow_drift.py: four redeploys, drift,
    # abandon and restart through the CLI and the client; ~32 s here);
    # +75 s for issue 17 item 2's approvals and pause/resume
    # (tests/integration/engine/test_engine_workflow_approvals.py: on_approval_needed True/False/None, a denial
    # paused then resumed, scenarios 2 and 9, a pause at a step boundary; ~63 s here under load);
    # +20 s for issue 17 item 4's incomplete runs (tests/integration/engine/test_engine_workflow_runs.py, ~11 s here);
    # +40 s for issue 17 item 6's two examples run by their README commands under a kill
    # (tests/integration/engine/test_engine_examples.py, ~31 s here);
    # +15 s for settled retry after scenario 14's dead letter (the retry runs, a duplicate, the projection's retry_of
    # checked and rebuilt; scenario 14 took 20 s in all here);
    # +15 s for issue 22 item 3's steering across a kill (tests/integration/engine/test_engine_steering.py, ~8 s here);
    # +40 s for issue 24 item 1's merged commit boundaries killed before and after their commit
    # (tests/integration/engine/test_engine_turn_commits.py: four kills, 33-35 s here under load);
    # +20 s for issue 24 item 2's pure steps across a kill (tests/integration/engine/test_engine_pure_steps.py, 16 s
    # here);
    # +65 s for issue 22 item 1's lane policies (tests/integration/engine/test_engine_lanes.py: a burst of 20 and a
    # kill for each of four lanes, 43 s here: 8-10 s each; settled lane set and Client.set_lane, 10 s);
    # +55 s for issue 22 item 2's joining (tests/integration/engine/test_engine_joining.py: one run and two kills
    # around the join record, 25-37 s here; the join case of test_engine_lanes.py's burst of 20, ~8 s).
    Suite("engine", 1450, (_pytest("tests/integration/engine"),), junit=True),
    # The operator's page (issue 21 item 1) in Debian's chromium through Playwright, real worker and API processes
    # behind it; screenshots in .ci/artifacts/ui/ (~30 s here under load).
    Suite("browser", 100, (_pytest("tests/browser", "-s"),), junit=True),
    Suite("chaos", 360, (_pytest("tests/chaos"),), junit=True),
    # BFCL's offline parts (corpus, oracle, tool server, replay model, verdict), then the slice through the real stack
    # (the settled-bfcl example, examples/bfcl).
    Suite(
        "bfcl-offline",
        120,
        (_pytest("examples/bfcl/tests", "--ignore=examples/bfcl/tests/test_demo_slice.py"),),
        junit=True,
    ),
    Suite("bfcl", 240, (_pytest("examples/bfcl/tests/test_demo_slice.py"),), junit=True),
    # The side-by-side benchmark (issue 23): its launcher guard and report checks, then the smoke run against the
    # peers that .ci/run installs with bench/peers/install.sh (fails when a peer does not install or start, a row
    # lacks a class or a baseline, or a ratio pairs classes without saying which side is weaker).
    # +20 s for bench/waits.py's smoke run (issue 16; ~15 s measured here under load).
    # +15 s for bench/workflows.py's smoke run (issue 17; ~5 s measured here under load).
    # +15 s for bench/flows.py's smoke run (issue 18; ~8 s measured here under load).
    # +15 s for bench/records_per_txn.py's small run of both parts (issue 24 item 3; ~9 s measured here).
    # +15 s for bench/k0_tail.py's 20 stamped K=0 turns (issue 24, the K=0 tail; ~14 s measured here under load).
    Suite("bench", 140, (_pytest("tests/bench"),), junit=True),
    # + bench/client_wait.py on 40 submissions, one round (issue 24 item 5; ~10 s here, within the cap).
    Suite(
        "bench-smoke",
        240,
        (
            (PY, "bench/side_by_side.py", "--smoke"),
            (PY, "bench/client_wait.py", "--submissions", "40", "--conversations", "10", "--rounds", "1"),
        ),
    ),
    # 190 s, +110 s for the switches of issues 25 and 16 (claim rewind, id contract, projection data errors, signals);
    # +10 s for issue 20's api_access_unchecked (a unit test, ~6 s with the runner's start-up);
    # +5 s for issue 17's workflow_retry_unrecorded (a unit test, ~4 s with the runner's start-up);
    # +15 s for issue 21's ui_csrf_unchecked (an integration test, ~6 s with the runner's start-up);
    # +20 s for issue 22's attempt_count_after_start (an integration test, ~13 s with the runner's start-up);
    # +10 s for issue 18's flow_drift_unchecked (a unit test, ~8 s with the runner's start-up);
    # +10 s for issue 17 item 2's workflow_denial_replayed (a unit test, ~7 s with the runner's start-up);
    # +45 s for issue 22 item 1's lane_policy_ignored (the four lanes' engine test, 39 s with the runner's start-up).
    Suite("fault-switches", 415, ((PY, "scripts/fault_switches.py", "--timeout-s", "150"),)),
]


def _run(argv: tuple[str, ...], deadline: float, env: dict[str, str]) -> tuple[int, bool]:
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, start_new_session=True)
    try:
        return proc.wait(timeout=max(deadline - time.monotonic(), 1)), False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return -9, True


def _has_tests(path: str) -> bool:
    target = ROOT / path
    return target.is_file() or any(True for _ in target.glob("**/test_*.py"))


def _junit_counts(path: Path) -> tuple[int, int, int]:
    if not path.exists():
        return 0, 0, 0
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root)
    tests = failed = skipped = 0
    for s in suites:
        tests += int(s.get("tests", 0))
        failed += int(s.get("failures", 0)) + int(s.get("errors", 0))
        skipped += int(s.get("skipped", 0))
    return tests - failed - skipped, failed, skipped


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", action="append", help="run only this suite (repeatable)")
    parser.add_argument("--list", action="store_true", help="list the suites and their caps")
    args = parser.parse_args()
    if args.list:
        for s in SUITES:
            print(f"{s.name:15} cap {s.cap_s:4d} s")
        return 0
    chosen = [s for s in SUITES if not args.suite or s.name in args.suite]
    unknown = set(args.suite or []) - {s.name for s in SUITES}
    if unknown:
        parser.error(f"unknown suite(s): {', '.join(sorted(unknown))}")
    REPORTS.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    rows: list[tuple[str, str, float, int]] = []
    passed = failed = skipped = 0
    ok = True
    for suite in chosen:
        print(f"\n=== suite {suite.name} (cap {suite.cap_s} s) ===", flush=True)
        started = time.monotonic()
        deadline = started + suite.cap_s
        status = "ok"
        for argv in suite.argv:
            junit = REPORTS / f"{suite.name}.xml"
            full = (*argv, f"--junitxml={junit}") if suite.junit else argv
            if suite.junit:
                junit.unlink(missing_ok=True)
            code, timed_out = _run(full, deadline, env)
            if suite.junit:
                p, f, s = _junit_counts(junit)
                passed, failed, skipped = passed + p, failed + f, skipped + s
            if timed_out:
                status = f"FAILED: killed at its cap of {suite.cap_s} s"
            elif suite.junit and code in (4, 5) and not _has_tests(argv[3]):
                status = "ok (no tests yet)"
            elif code != 0:
                status = f"FAILED: {Path(argv[2] if argv[1] == '-m' else argv[0]).name} exited {code}"
            if status.startswith("FAILED"):
                break
        took_s = time.monotonic() - started
        if not status.startswith("FAILED") and took_s > suite.cap_s:
            status = f"FAILED: took {took_s:.0f} s, over its cap of {suite.cap_s} s"
        ok = ok and not status.startswith("FAILED")
        rows.append((suite.name, status, took_s, suite.cap_s))
    print("\n=== suite durations ===")
    for name, status, took_s, cap_s in rows:
        print(f"{name:15} {took_s:7.1f} s / cap {cap_s:4d} s   {status}")
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
