"""Benchmark: a durable wait's delivery → resumed run → settlement, and a worker's memory per suspended run (issue 16).

    .venv/bin/python bench/waits.py [--rounds 40] [--suspended 10000] [--submitters 16] [--smoke]
                                    [--bootstrap HOST:PORT] [--keep]

One fresh namespace (one partition per topic), one ``settled worker`` child running ``bench/waits_app.py``. Measured
in the same run:

* **latency** (``--rounds`` each, interleaved): the baseline is a plain turn, ``Client.submit`` → its settlement
  read from ``settled.settlements``; the measured path is a turn suspended in ``ctx.signal("go")`` (its
  ``WaitRequested`` read from the log first), ``Client.signal`` → its settlement: the delivery decided and made
  canonical by the owner, the run resumed (a new attempt replaying up to its wait) and settled. p50/p99 of each and
  the ratio wait / plain.
* **memory**: the worker child's resident set (``VmRSS`` of ``/proc/<pid>/status``) before and after ``--suspended``
  more turns, each in a conversation of its own, are all suspended at once (every ``WaitRequested`` read from the
  log); the difference per suspended run, against the goal of at most 4 KiB (docs/architecture.md, "Waits"). The
  baseline, measured first: as many plain turns, each in a new conversation, all settled; the difference per
  conversation is what the worker keeps for any conversation (its folded state), waiting or not.

Every figure is printed with its durability class (what a committed record survives on this broker; the memory
figure makes no durability claim). ``--smoke`` is a short run (5 rounds, 200 suspended runs) for CI
(``tests/bench/test_waits.py``); it prints the same table. The last line is the figures as JSON (``json: {...}``).
Exit 0 unless the measurement broke (a run not suspended or not settled in time, the worker exiting): the ratios are
figures, not gates.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout: python bench/waits.py
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import BenchmarkError, WorkerBench, percentile, table, worker_bench
from confluent_kafka import Consumer, TopicPartition

from settled._settings import Settings
from settled.client import Client
from settled.producers import consume_promptly, consumer_config
from settled.schemas import Codec, LogBatch, SettlementRecord, WaitRequested

APP = "bench.waits_app:app"
SIGNAL_NAME = "go"
GOAL_BYTES = 4096
"""The goal per suspended run (issue 16): at most 4 KiB of the worker's memory."""


class _Tail:
    """One reader of a topic's partition 0 from its start, keeping what ``keep`` extracts from each record."""

    def __init__(self, settings: Settings, short: str, group: str, *, from_end: bool) -> None:
        self._codec = Codec()
        self._consumer = Consumer(consumer_config(settings, f"{settings.namespace}.bench-{group}"))
        topic = settings.topic(short)
        _low, high = self._consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)
        self._consumer.assign([TopicPartition(topic, 0, high if from_end else 0)])
        self.seen: dict[str, float] = {}
        self.settled: dict[str, SettlementRecord] = {}
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, name=f"bench-{group}", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            for m in consume_promptly(self._consumer, 1000, 0.05):
                value = m.value()
                if m.error() is not None or value is None:
                    continue
                record = self._codec.decode(value)
                now = time.perf_counter()
                with self._cond:
                    if isinstance(record, SettlementRecord):
                        self.settled[record.submission_id] = record
                    elif isinstance(record, LogBatch):
                        for event in record.events:
                            if isinstance(event, WaitRequested):
                                self.seen.setdefault(event.submission_id, now)
                    self._cond.notify_all()

    def wait(self, what: str, ids: list[str], timeout_s: float) -> None:
        """Wait until every id is in ``seen`` (``what="waiting"``) or ``settled``; BenchmarkError after the timeout."""
        found = self.seen if what == "waiting" else self.settled
        with self._cond:
            if not self._cond.wait_for(lambda: all(i in found for i in ids), timeout_s):
                missing = [i for i in ids if i not in found]
                raise BenchmarkError(f"{len(missing)} runs not {what} within {timeout_s} s, e.g. {missing[:3]}")

    def close(self) -> None:
        """Stop reading."""
        self._stop.set()
        self._thread.join(10)
        self._consumer.close()


def rss_bytes(pid: int) -> int:
    """A process's resident set size (``VmRSS``), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text(encoding="utf-8").splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise BenchmarkError(f"no VmRSS for process {pid}")


def plain_turn(client: Client, settlements: _Tail, timeout_s: float) -> float:
    """One plain turn: submit → settlement read, in seconds."""
    t0 = time.perf_counter()
    receipt = client.submit(f"plain-{uuid.uuid4().hex[:12]}", {"wait": False})
    settlements.wait("settled", [receipt.request_id], timeout_s)
    return time.perf_counter() - t0


def waiting_turn(client: Client, log: _Tail, settlements: _Tail, timeout_s: float) -> float:
    """One suspended turn: once its wait is canonical, signal → settlement read, in seconds."""
    conversation = f"wait-{uuid.uuid4().hex[:12]}"
    receipt = client.submit(conversation, {"wait": True})
    log.wait("waiting", [receipt.request_id], timeout_s)
    t0 = time.perf_counter()
    client.signal(conversation, receipt.request_id, SIGNAL_NAME, {"n": 1})
    settlements.wait("settled", [receipt.request_id], timeout_s)
    elapsed = time.perf_counter() - t0
    outcome = settlements.settled[receipt.request_id].outcome.value
    if outcome != "completed":
        raise BenchmarkError(f"the resumed run {receipt.request_id} settled {outcome}")
    return elapsed


def many_turns(
    client: Client, tail: _Tail, count: int, submitters: int, timeout_s: float, *, wait: bool
) -> tuple[list[str], float]:
    """Submit ``count`` turns (a conversation each) from ``submitters`` threads; wait until all are suspended
    (``wait``: read from the log ``tail``) or settled (read from the settlements ``tail``).

    Returns:
        Their submission ids and the seconds it took.
    """
    t0 = time.perf_counter()
    prefix = f"{'held' if wait else 'done'}-{uuid.uuid4().hex[:8]}"

    def one(i: int) -> str:
        return client.submit(f"{prefix}-{i}", {"wait": wait}).request_id

    with ThreadPoolExecutor(max_workers=submitters) as pool:
        ids = list(pool.map(one, range(count)))
    tail.wait("waiting" if wait else "settled", ids, timeout_s)
    return ids, time.perf_counter() - t0


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=40, help="plain and waiting turns each, for the latency figures")
    ap.add_argument("--suspended", type=int, default=10_000, help="runs suspended at once for the memory figure")
    ap.add_argument("--submitters", type=int, default=16, help="threads submitting the suspended runs")
    ap.add_argument("--smoke", action="store_true", help="a short run for CI: 5 rounds, 200 suspended runs")
    ap.add_argument("--bootstrap", default=None)
    ap.add_argument("--keep", action="store_true", help="keep the namespace's topics")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its tables; return the exit status."""
    args = _parse(argv)
    if args.smoke:
        args.rounds, args.suspended = 5, 200
    with worker_bench("bench-waits", APP, args.bootstrap, keep=args.keep) as bench:
        log = _Tail(bench.settings, "log", "log", from_end=False)
        settlements = _Tail(bench.settings, "settlements", "settlements", from_end=True)
        client = Client(bench.settings, default_timeout_s=60)
        try:
            _measure(bench, client, log, settlements, args)
        except BenchmarkError as exc:
            print(f"bench/waits.py: {exc}", file=sys.stderr)
            return 1
        finally:
            client.close()
            log.close()
            settlements.close()
    return 0


def _measure(bench: WorkerBench, client: Client, log: _Tail, settlements: _Tail, args: argparse.Namespace) -> None:
    """Measure the latencies, then the memory; print the tables and the JSON line."""
    timeout_s = 120.0
    for _ in range(3):  # warm-up: the worker holds its partition, both paths ran once
        plain_turn(client, settlements, timeout_s)
        waiting_turn(client, log, settlements, timeout_s)
    plain: list[float] = []
    waited: list[float] = []
    for _ in range(args.rounds):
        bench.check()
        plain.append(plain_turn(client, settlements, timeout_s))
        waited.append(waiting_turn(client, log, settlements, timeout_s))
    bench.check()
    bulk_timeout_s = max(timeout_s, args.suspended / 20)
    rss_start = rss_bytes(bench.worker.pid)
    done, done_s = many_turns(client, settlements, args.suspended, args.submitters, bulk_timeout_s, wait=False)
    bench.check()
    rss_before = rss_bytes(bench.worker.pid)
    per_conversation = (rss_before - rss_start) / len(done)
    held, held_s = many_turns(client, log, args.suspended, args.submitters, bulk_timeout_s, wait=True)
    time.sleep(1.0)  # let the worker finish the attempts that handed their waits over (not a correctness wait)
    bench.check()
    rss_after = rss_bytes(bench.worker.pid)
    per_run = (rss_after - rss_before) / len(held)
    durable = bench.print_header("the latency figures")
    p50_plain, p99_plain = percentile(plain, 50), percentile(plain, 99)
    p50_wait, p99_wait = percentile(waited, 50), percentile(waited, 99)
    print(
        table(
            ["figure", "p50 ms", "p99 ms", "n", "class"],
            [
                ["plain turn: submit -> settlement (baseline)", f"{p50_plain * 1e3:.1f}",
                 f"{p99_plain * 1e3:.1f}", str(len(plain)), "committed (above)"],
                ["signal -> resumed run -> settlement", f"{p50_wait * 1e3:.1f}", f"{p99_wait * 1e3:.1f}",
                 str(len(waited)), "committed (above)"],
            ],
        )
    )  # fmt: skip
    print(
        table(
            ["ratio", "value", "class"],
            [
                ["wait p50 / plain p50", f"{p50_wait / p50_plain:.2f}", "committed (above), both sides"],
                ["wait p99 / plain p99", f"{p99_wait / p99_plain:.2f}", "committed (above), both sides"],
            ],
        )
    )
    met = "yes" if per_run <= GOAL_BYTES else "no"
    print(
        table(
            ["memory", "value", "goal", "met", "class"],
            [
                ["worker RSS at the start", f"{rss_start / 2**20:.1f} MiB", "", "",
                 "process memory (no durability)"],
                [f"after {len(done):,} settled conversations (baseline)", f"{rss_before / 2**20:.1f} MiB", "", "",
                 "process memory (no durability)"],
                ["per settled conversation (baseline)", f"{per_conversation:,.0f} B", "", "",
                 "process memory (no durability)"],
                [f"worker RSS with {len(held):,} runs suspended", f"{rss_after / 2**20:.1f} MiB", "", "",
                 "process memory (no durability)"],
                ["per suspended run", f"{per_run:,.0f} B", f"<= {GOAL_BYTES} B", met,
                 "process memory (no durability)"],
                ["per suspended run / per settled conversation", f"{per_run / per_conversation:.2f}", "", "",
                 "process memory (no durability)"],
            ],
        )
    )  # fmt: skip
    print(f"{len(done):,} plain turns settled in {done_s:.1f} s, {len(held):,} runs suspended in {held_s:.1f} s; "
          f"wall time {time.monotonic() - bench.started_s:.0f} s")  # fmt: skip
    figures: dict[str, Any] = {
        "durability_class": durable,
        "plain_p50_ms": p50_plain * 1e3,
        "plain_p99_ms": p99_plain * 1e3,
        "wait_p50_ms": p50_wait * 1e3,
        "wait_p99_ms": p99_wait * 1e3,
        "ratio_p50": p50_wait / p50_plain,
        "ratio_p99": p99_wait / p99_plain,
        "suspended": len(held),
        "rss_start_bytes": rss_start,
        "rss_before_bytes": rss_before,
        "bytes_per_settled_conversation": per_conversation,
        "rss_after_bytes": rss_after,
        "bytes_per_suspended_run": per_run,
        "goal_bytes": GOAL_BYTES,
    }
    print("json: " + json.dumps(figures, sort_keys=True))


if __name__ == "__main__":
    sys.exit(main())
