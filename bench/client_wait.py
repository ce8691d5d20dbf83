"""Benchmark: `Client.wait` per submission against one shared reader of the settlements (issue 24 item 5).

    .venv/bin/python bench/client_wait.py [--submissions 200] [--conversations 50] [--partitions 4] [--rounds 3]
                                          [--bootstrap HOST:PORT] [--keep]

One fresh namespace; an in-process `settled` worker (`build_worker`, the echo agent) settles ``--submissions``
submissions over ``--conversations`` conversations. Then, per round, the cost of learning every settlement is timed
three ways, all after the settlements are committed (so the worker's speed is not in the figures), in one process:

* **one shared reader** (the baseline): one `SettlementStream` from the first receipt's ``decided_at`` less the
  client's look-back, read until it has seen every submission.
* **Client.wait**: a fresh `Client` waits for each receipt in turn (its shared `SettlementsReader`; what a caller of
  ``wait`` per submission pays now).
* **a reader per wait**: `read_settlement` for each receipt in turn (what ``Client.wait`` did before: a consumer, an
  ``offsets_for_times`` lookup and a read per call).

Printed: ms per submission (median of the rounds, min–max beside it) and each way's ratio to the baseline; the issue's
target is Client.wait ≤ 1.2× the shared reader. Durability class: reads only (``read_committed`` consumers); nothing
measured here writes. Exit 0 unless the measurement broke.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout: python bench/client_wait.py
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (
    client_versions,
    delete_namespace,
    fresh_namespace,
    load_average,
    resolve_bootstrap,
    table,
    use_dev_timeouts,
)

from settled._settings import Settings
from settled.client import Client
from settled.client._settlements import SettlementStream, read_settlement
from settled.producers import provision_topics
from settled.runtime import App
from settled.schemas import Codec, Receipt
from settled.services._worker_service import build_worker
from settled.testing.echo import EchoAgent

#: The client's default look-back before a receipt's ``decided_at``, in seconds (`Client(settlement_lookback_s=)`).
LOOKBACK_S = 60.0
TIMEOUT_S = 60.0


def shared_reader_s(settings: Settings, receipts: list[Receipt]) -> float:
    """Seconds for one stream to see every receipt's settlement."""
    wanted = {(r.conversation_id, r.request_id) for r in receipts}
    since = min(r.decided_at for r in receipts) - timedelta(seconds=LOOKBACK_S)
    started = time.perf_counter()  # its consumer, metadata and position lookups timed, as Client.wait's first call's
    with SettlementStream(settings, Codec(), since=since, idle_timeout_s=TIMEOUT_S) as stream:
        for record in stream:
            wanted.discard((record.conversation_id, record.submission_id))
            if not wanted:
                break
        elapsed_s = time.perf_counter() - started
    if wanted:
        raise RuntimeError(f"{len(wanted)} settlements not seen by the shared reader")
    return elapsed_s


def client_wait_s(settings: Settings, receipts: list[Receipt]) -> float:
    """Seconds for a fresh client to `Client.wait` for every receipt in turn.

    The client's construction (its inbox producer) and close are not timed; its settlements reader's start (consumer,
    metadata, position lookups) is, inside the first wait, as the shared reader's is.
    """
    with Client(settings, default_timeout_s=TIMEOUT_S, settlement_lookback_s=LOOKBACK_S) as client:
        started = time.perf_counter()
        for receipt in receipts:
            client.wait(receipt)
        return time.perf_counter() - started


def reader_per_wait_s(settings: Settings, receipts: list[Receipt]) -> float:
    """Seconds for `read_settlement` (a consumer per call) to find every receipt's settlement in turn."""
    codec = Codec()
    started = time.perf_counter()
    for receipt in receipts:
        since = receipt.decided_at - timedelta(seconds=LOOKBACK_S)
        read_settlement(settings, codec, receipt.conversation_id, receipt.request_id, since, TIMEOUT_S)
    return time.perf_counter() - started


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--submissions", type=int, default=200)
    ap.add_argument("--conversations", type=int, default=50)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--bootstrap", default=None, help="Kafka bootstrap servers (default: SETTLED_KAFKA_BOOTSTRAP).")
    ap.add_argument("--keep", action="store_true", help="Keep the namespace's topics.")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its table; return the exit status."""
    args = _parse(argv)
    timeouts = use_dev_timeouts()
    bootstrap, where = resolve_bootstrap(args.bootstrap)
    settings = Settings(namespace=fresh_namespace("bench-wait"), kafka_bootstrap=bootstrap, partitions=args.partitions)
    provision_topics(settings, Codec(), datetime.now(UTC))
    worker = build_worker(settings, App(agent=EchoAgent(delay_s=0.0)))
    stop = threading.Event()
    thread = threading.Thread(target=worker.run, kwargs={"until": stop.is_set}, daemon=True)
    thread.start()
    try:
        with Client(settings, default_timeout_s=TIMEOUT_S) as client:
            receipts = [client.submit(f"conv-{i % args.conversations}", {"n": i}) for i in range(args.submissions)]
            for receipt in receipts:  # every settlement committed before anything is timed
                client.wait(receipt)
        ways = {
            "one shared reader": shared_reader_s,
            "Client.wait": client_wait_s,
            "a reader per wait": reader_per_wait_s,
        }
        times: dict[str, list[float]] = {name: [] for name in ways}
        for _ in range(args.rounds):
            for name, way in ways.items():  # interleaved, so load drifts affect every way alike
                times[name].append(way(settings, receipts) / len(receipts))
        base = statistics.median(times["one shared reader"])
        rows = []
        for name, per in times.items():
            median = statistics.median(per)
            rows.append(
                [name, f"{median * 1e3:.3f}", f"{min(per) * 1e3:.3f}–{max(per) * 1e3:.3f}", f"{median / base:.2f}×"]
            )
        print(
            f"broker {bootstrap} ({where}); {client_versions()}; {timeouts}; load {load_average()}; "
            f"{args.submissions} submissions, {args.conversations} conversations, {args.partitions} partitions, "
            f"{args.rounds} rounds; durability class: reads only (read_committed), nothing measured writes"
        )
        print(table(["way", "ms per submission (median)", "min–max", "vs one shared reader"], rows))
        ratio = statistics.median(times["Client.wait"]) / base
        print(f"target Client.wait ≤ 1.2× one shared reader: {ratio:.2f}× ({'met' if ratio <= 1.2 else 'not met'})")
    finally:
        stop.set()
        thread.join(30)
        if not args.keep:
            delete_namespace(settings, [worker.group_id])
    return 0


if __name__ == "__main__":
    sys.exit(main())
