"""Benchmark: the K=0 turn's latency hop by hop, and what its slowest turns spend their time on (issue 24).

    .venv/bin/python bench/k0_tail.py [--turns 500] [--warmup 20] [--slowest-pct 2] [--json OUT] [--bootstrap B]

The latency case of ``bench/side_by_side.py`` for settled alone, at K=0, on the broker ``SETTLED_KAFKA_BOOTSTRAP``
(or ``--bootstrap``) rather than the side-by-side's private ones: its `SettledCase` (a fresh namespace of 12
partitions, one worker process, settlements read by one shared reader), its worker's app with hop stamps
(``bench/k0_tail_app.py``), sequential turns each on a fresh conversation. The client and the worker stamp
``time.monotonic_ns()`` (one clock for the host's processes): per turn, the call to ``Client.submit``, the worker's
poll that got its record, the worker's first transaction (admission with the attempt's start) from its
``begin_transaction`` to its commit, the conductor's launch of the run, the run body, the conductor's staging of the
run's end, the second transaction (the settlement), the receipt read (``submit`` returned) and the settlement read by
the shared reader. Each cyclic garbage collection of either process (``gc.callbacks``) is stamped too.

It prints the turn's p50/p90/p99/max, each hop's median over all turns and over the slowest ``--slowest-pct`` %, the
slowest turns one by one, and the GC pauses inside turns. ``--json`` writes the percentiles and each hop's median
(``bench/before_after.py --suite k0`` compares them in alternating pairs).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout: python bench/k0_tail.py
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import load_average, percentile, resolve_bootstrap, use_dev_timeouts
from side_by_side import SettledCase, bare_commits

APP = "bench.k0_tail_app:app"
#: The hops of one turn, in order (ms); ``total`` is the turn.
HOPS = (
    "submit -> worker's poll returned",
    "poll -> txn1 begin (decide, stage)",
    "txn1 (admission + start)",
    "txn1 commit -> launch",
    "launch -> run begins",
    "txn1 commit -> receipt read",
    "run body",
    "run end -> finish (staging begins)",
    "finish -> txn2 begin",
    "txn2 (settlement)",
    "txn2 commit -> settlement read",
    "settlement read -> turn returns",
    "total",
)


class StampedCase(SettledCase):
    """`SettledCase` whose worker runs the stamped app and writes its stamps to ``stamps``."""

    app = APP

    def __init__(
        self, bootstrap: str, log_dir: Path, stamps: Path, eos_debug: bool = False, min_gap_ms: float = 0.0
    ) -> None:
        self.stamps = stamps
        self.eos_debug = eos_debug
        self.min_gap_ms = min_gap_ms
        super().__init__(bootstrap, log_dir, "k0tail")

    def worker_env(self) -> dict[str, str]:
        """`SettledCase.worker_env` plus the stamps' file, the metrics' observer and the experiments' switches."""
        return {
            **super().worker_env(),
            "SETTLED_BENCH_STAMPS": str(self.stamps),
            "SETTLED_METRICS_PORT": "0",  # the transaction stamps come from the metrics' observer
            "SETTLED_BENCH_EOS_DEBUG": "1" if self.eos_debug else "0",
            "SETTLED_BENCH_MIN_GAP_MS": str(self.min_gap_ms),
        }


@dataclass
class Turn:
    """One turn's client stamps (ns) and, once matched, its worker stamps (ns)."""

    tag: str
    sid: str
    submit_ns: int
    receipt_ns: int
    read_ns: int
    done_ns: int
    run: tuple[int, int] | None = None
    txn1: Txn | None = None
    txn2: Txn | None = None
    poll_ns: int = 0
    launch_ns: int = 0
    finish_ns: int = 0

    def hops_ms(self) -> dict[str, float] | None:
        """The turn's hops in ms (None when a worker stamp is missing)."""
        if self.run is None or self.txn1 is None or self.txn2 is None:
            return None
        if not (self.poll_ns and self.launch_ns and self.finish_ns):
            return None
        ms = 1e-6
        return {
            "submit -> worker's poll returned": (self.poll_ns - self.submit_ns) * ms,
            "poll -> txn1 begin (decide, stage)": (self.txn1[0] - self.poll_ns) * ms,
            "txn1 (admission + start)": (self.txn1[1] - self.txn1[0]) * ms,
            "txn1 commit -> launch": (self.launch_ns - self.txn1[1]) * ms,
            "launch -> run begins": (self.run[0] - self.launch_ns) * ms,
            "txn1 commit -> receipt read": (self.receipt_ns - self.txn1[1]) * ms,
            "run body": (self.run[1] - self.run[0]) * ms,
            "run end -> finish (staging begins)": (self.finish_ns - self.run[1]) * ms,
            "finish -> txn2 begin": (self.txn2[0] - self.finish_ns) * ms,
            "txn2 (settlement)": (self.txn2[1] - self.txn2[0]) * ms,
            "txn2 commit -> settlement read": (self.read_ns - self.txn2[1]) * ms,
            "settlement read -> turn returns": (self.done_ns - self.read_ns) * ms,
            "total": (self.done_ns - self.submit_ns) * ms,
        }


Txn = tuple[int, int, tuple[float, ...]]  # (begin ns, commit returned ns, seconds per Kafka call, in CALLS order)
#: The Kafka calls of a transaction, as the stamps list them (`bench/k0_tail_app.py`).
CALLS = ("begin", "produce", "flush", "offsets", "commit")


@dataclass
class WorkerStamps:
    """The worker's stamps (``bench/k0_tail_app.py``), in ns."""

    runs: dict[str, tuple[int, int]]  # tag -> (begin, end)
    txns: list[Txn]
    gcs: list[tuple[int, int]]  # (begin, end)
    polls: list[int]  # the loop got inbox records
    launches: dict[str, int]  # submission id -> the conductor began to launch its run
    finishes: dict[str, int]  # submission id -> the conductor began to stage its end


def _worker_stamps(path: Path) -> WorkerStamps:
    """Parse the worker's stamps."""
    runs: dict[str, tuple[int, int]] = {}
    txns: list[Txn] = []
    gcs: list[tuple[int, int]] = []
    polls: list[int] = []
    launches: dict[str, int] = {}
    finishes: dict[str, int] = {}
    for line in path.read_text().splitlines():
        kind, *rest = line.split()
        if kind == "poll":
            polls.append(int(rest[0]))
        elif kind == "launch":
            launches.setdefault(rest[0], int(rest[1]))
        elif kind == "finish":
            finishes.setdefault(rest[0], int(rest[1]))
        elif kind == "run":
            runs[rest[0]] = (int(rest[1]), int(rest[2]))
        elif kind == "txn":
            end = int(rest[0])
            calls_s = tuple(float(x) for x in rest[2:])
            txns.append((end - int(sum(calls_s) * 1e9), end, calls_s))
        elif kind == "gc":
            gcs.append((int(rest[0]), int(rest[1])))
    txns.sort(key=lambda t: t[1])
    return WorkerStamps(runs, txns, gcs, sorted(polls), launches, finishes)


def _match(turns: list[Turn], stamps: WorkerStamps) -> None:
    """Give each turn its worker stamps: its run, its two transactions (the last commit before the run, the first
    after it), the first poll after its submit, its launch and its finish."""
    txns = stamps.txns
    for t in turns:
        t.run = stamps.runs.get(t.tag)
        t.launch_ns = stamps.launches.get(t.sid, 0)
        t.finish_ns = stamps.finishes.get(t.sid, 0)
        t.poll_ns = next((p for p in stamps.polls if p >= t.submit_ns), 0)
        if t.run is None:
            continue
        before = [x for x in txns if t.submit_ns <= x[1] <= t.run[0]]
        after = [x for x in txns if t.run[1] <= x[1]]  # its return may be stamped after the reader saw it
        if before and after:
            t.txn1, t.txn2 = before[-1], after[0]


def _overlap_ms(pauses: list[tuple[int, int]], begin_ns: int, end_ns: int) -> float:
    return sum(max(0, min(e, end_ns) - max(b, begin_ns)) for b, e in pauses) / 1e6


def main() -> int:
    """Run the turns and print the tables; return the exit status."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--turns", type=int, default=500)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--slowest-pct", type=float, default=2.0, help="the tail examined, in percent of the turns")
    ap.add_argument("--json", type=Path, default=None, help="write the percentiles here")
    ap.add_argument("--bootstrap", default=None)
    ap.add_argument(
        "--eos-debug", action="store_true", help="count the AddPartitionsToTxn answered CONCURRENT_TRANSACTIONS"
    )
    ap.add_argument(
        "--min-gap-ms",
        type=float,
        default=0.0,
        help="experiment: an owner's transaction begins no sooner than this after its previous commit",
    )
    ap.add_argument("--bare", type=int, default=0, help="also time this many bare transactional commits (baseline)")
    args = ap.parse_args()
    timeouts = use_dev_timeouts()
    bootstrap, where = resolve_bootstrap(args.bootstrap)
    client_gc: list[tuple[int, int]] = []
    gc_begin = [0]

    def on_gc(phase: str, _info: dict[str, int]) -> None:
        if phase == "start":
            gc_begin[0] = time.monotonic_ns()
        else:
            client_gc.append((gc_begin[0], time.monotonic_ns()))

    with tempfile.TemporaryDirectory(prefix="settled-k0-tail-") as tmp:
        stamps = Path(tmp) / "stamps.txt"
        case = StampedCase(bootstrap, Path(tmp), stamps, args.eos_debug, args.min_gap_ms)
        turns: list[Turn] = []
        try:
            case.warm_partitions()
            for _ in range(args.warmup):
                case.turn({"k": 0})
            gc.callbacks.append(on_gc)
            load_before = load_average()
            for _ in range(args.turns):
                tag = uuid.uuid4().hex
                t0 = time.monotonic_ns()
                sid = case.submit({"k": 0, "tag": tag})
                t1 = time.monotonic_ns()
                case.settle([sid])
                t2 = time.monotonic_ns()
                read_ns = int(case.tracker.read_at[sid] * 1e9)  # perf_counter: CLOCK_MONOTONIC, as monotonic_ns
                turns.append(Turn(tag, sid, t0, t1, read_ns, t2))
            gc.callbacks.remove(on_gc)
        finally:
            case.close()
        worker = _worker_stamps(stamps)
        log = (Path(tmp) / f"worker-{case.label}.log").read_text(errors="replace")
        concurrent = sum(1 for line in log.splitlines() if "ADDPARTS" in line and "concurrent operation" in line)
    _match(turns, worker)
    worker_gc = worker.gcs
    if args.eos_debug:
        slow = sum(1 for t in turns for x in (t.txn1, t.txn2) if x is not None and x[2][2] > 0.015)
        print(f"AddPartitionsToTxn answered CONCURRENT_TRANSACTIONS: {concurrent}; flushes over 15 ms: {slow}")
    bare = bare_commits(bootstrap, args.bare, 10) if args.bare else []
    print(f"K=0 turns: {args.turns} after {args.warmup} warm-up; broker {bootstrap} ({where}); {timeouts}")
    print(f"{load_before} before, {load_average()} after")
    totals = [(t.done_ns - t.submit_ns) / 1e6 for t in turns]
    p = {q: percentile(totals, q) for q in (50, 90, 99)}
    print(
        f"turn ms: p50 {p[50]:.2f}  p90 {p[90]:.2f}  p99 {p[99]:.2f}  max {max(totals):.2f}  "
        f"p99/p50 {p[99] / p[50]:.2f}"
    )
    if bare:
        b = {q: percentile(bare, q) for q in (50, 90, 99)}
        print(f"bare transactional commit ms ({len(bare)}): p50 {b[50]:.2f}  p90 {b[90]:.2f}  p99 {b[99]:.2f}")
    hops = [(t, h) for t in turns if (h := t.hops_ms()) is not None]
    print(f"turns with every worker stamp: {len(hops)} of {len(turns)}")
    n_slow = max(1, round(len(hops) * args.slowest_pct / 100))
    slow = sorted(hops, key=lambda th: th[1]["total"])[-n_slow:]
    print(f"\n| hop (ms) | median, all | p99, all | median, slowest {n_slow} |")
    print("|---|---|---|---|")
    for name in HOPS:
        every = [h[name] for _, h in hops]
        print(
            f"| {name} | {statistics.median(every):.2f} | {percentile(every, 99):.2f} "
            f"| {statistics.median(h[name] for _, h in slow):.2f} |"
        )
    print("\n| a transaction's Kafka calls (ms) | " + " | ".join(CALLS) + " |")
    print("|---|" + "---|" * len(CALLS))
    for which in ("txn1", "txn2"):
        for label, group in (("median, all", hops), (f"median, slowest {n_slow}", slow)):
            calls = [getattr(t, which)[2] for t, _ in group]
            cells = " | ".join(f"{statistics.median(c[i] for c in calls) * 1000:.2f}" for i in range(len(CALLS)))
            print(f"| {which}, {label} | {cells} |")
    print(f"\nthe slowest {n_slow} turns (ms; txn calls {'/'.join(CALLS)}; GC: pause inside the turn):")
    print("| total | " + " | ".join(HOPS[:-1]) + " | txn1 calls | txn2 calls | GC client | GC worker |")
    print("|" + "---|" * (len(HOPS) + 4))
    for t, h in reversed(slow):
        cells = " | ".join(f"{h[name]:.2f}" for name in HOPS[:-1])
        assert t.txn1 is not None and t.txn2 is not None
        calls1 = "/".join(f"{c * 1000:.1f}" for c in t.txn1[2])
        calls2 = "/".join(f"{c * 1000:.1f}" for c in t.txn2[2])
        gc_ms = [_overlap_ms(pauses, t.submit_ns, t.done_ns) for pauses in (client_gc, worker_gc)]
        print(f"| {h['total']:.2f} | {cells} | {calls1} | {calls2} | {gc_ms[0]:.2f} | {gc_ms[1]:.2f} |")
    first, last = turns[0].submit_ns, turns[-1].done_ns
    for who, pauses in (("client", client_gc), ("worker", worker_gc)):
        inside = [(b, e) for b, e in pauses if first <= b <= last]
        ms = sorted((e - b) / 1e6 for b, e in inside)
        hit = sum(1 for t in turns if _overlap_ms(inside, t.submit_ns, t.done_ns) > 0)
        worst = f", longest {ms[-1]:.2f} ms, median {statistics.median(ms):.2f} ms" if ms else ""
        print(f"GC {who}: {len(ms)} collections during the turns{worst}; turns with a collection inside: {hit}")
    if args.json is not None:
        figures = {"turn p50 ms": p[50], "turn p90 ms": p[90], "turn p99 ms": p[99], "turn p99/p50": p[99] / p[50]}
        figures.update({f"hop median ms: {name}": statistics.median(h[name] for _, h in hops) for name in HOPS[:-1]})
        args.json.write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
