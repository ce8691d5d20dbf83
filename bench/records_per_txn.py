"""Benchmark: records per transaction under load, and what a transaction costs by its record count (issue 24 item 3).

    .venv/bin/python bench/records_per_txn.py [--part cost,worker] [--transactions 200] [--window-s 20]
                                              [--warmup-s 3] [--in-flight 50] [--k 5] [--bootstrap HOST:PORT] [--keep]

Both parts run against a **private broker** this script starts on free ports (the dev-stack launcher,
`settled.services._devstack.KafkaBroker`, jars from the Maven cache), so the broker's CPU is this benchmark's alone;
``--bootstrap`` uses a running broker instead (then the broker CPU column is left empty: other clients share it).

* ``cost``: a bare confluent-kafka transactional producer (settled's client settings,
  `settled.producers.producer_config`) commits transactions of 1, 5, 20 and 100 records (600 bytes each), spread over
  1 or 12 partitions of one topic (at most one partition per record), each with ``send_offsets_to_transaction`` of
  one consumer offset per partition it wrote (a consumer group member holding the 12 input partitions gives the
  metadata), in the appender's call order
  (produce, flush, send offsets, commit). The cells are interleaved in blocks of 10 transactions, rotating, so machine
  noise hits all of them. Per cell: p50/p99 latency, this process's CPU (librdkafka's threads included) and the
  broker's CPU per transaction and per record. It tells what merging transactions would gain before anything is
  built: 12 one-record transactions on 12 partitions cost 12 rows of "1 record, 1 partition"; merged, one row of
  "12 records, 12 partitions" (interpolate 5 and 20).
* ``worker``: settled's throughput case of ``bench/side_by_side.py`` (12 partitions or ``--partitions``, one worker,
  ``bench.side_by_side_app:app``, a closed loop of ``--in-flight`` turns of K ``ctx.step`` calls, fresh conversation per
  turn, one shared settlements reader), with the worker's Prometheus endpoint on (``SETTLED_METRICS_PORT``): over the
  window, turns/s and steps/s, transactions/s and records per transaction (mean; p50 and p99 from the histogram
  ``settled_transaction_records``, whose buckets are one record wide up to 10), the worker's and the broker's CPU
  per turn (the broker's also without its JIT compiler threads), and the share of the window the worker's loop thread
  spent in the transactions' Kafka calls
  (``settled_transaction_call_seconds_total`` by call) and in checkpoints (``settled_commit_duration_seconds``).

**A fresh broker's JIT.** The private broker starts cold: its JIT compiler threads use 300-400 ms of CPU per second
during the first minute of load and about 15 ms per second after 90 s (2026-12-05), so over the default 20 s window
about half the broker's CPU is compiling. Both parts give the broker's CPU also without the compiler threads; for a
warm broker (its interpreted and C1-compiled code also costs more before C2 is done) use ``--warmup-s 90``.

Prints Markdown tables; exit 0 unless the measurement broke. Results and their reading: docs/architecture.md,
"Records per transaction (issue 24 item 3)".
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout: python bench/records_per_txn.py
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (
    BenchmarkError,
    client_versions,
    delete_namespace,
    fresh_namespace,
    jit_cpu_s,
    load_average,
    percentile,
    table,
    use_dev_timeouts,
)

from settled._settings import Settings

ROOT = Path(__file__).resolve().parent.parent
PARTITIONS = 12
RECORD_BYTES = 600
BLOCK = 10
#: How long the idle broker's CPU is measured before the parts run, in seconds.
IDLE_S = 5.0


def _proc_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a process used so far, from ``/proc/<pid>/stat``."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _self_cpu_s() -> float:
    """This process's CPU seconds, every thread (librdkafka's native threads included)."""
    return time.process_time()


# ------------------------------------------------------------------------------------------ part 1: cost


def cost(
    bootstrap: str,
    broker_pid: int | None,
    idle_ms_per_s: float,
    transactions: int,
    sizes: Sequence[int],
    spreads: Sequence[int],
) -> str:
    """Bare transactions by record count and partition spread; returns the Markdown table.

    The broker's CPU per transaction is given less its idle CPU (``idle_ms_per_s`` over the transactions' time).

    Raises:
        BenchmarkError: The consumer group never got its partitions.
    """
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    from settled.producers import producer_config

    settings = Settings(namespace=fresh_namespace("bench-rpt-cost"), kafka_bootstrap=bootstrap)
    topic_in, topic_out = settings.topic("in"), settings.topic("out")
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for fut in admin.create_topics([NewTopic(t, PARTITIONS, 1) for t in (topic_in, topic_out)]).values():
        fut.result(30)
    group = f"{settings.namespace}.group"
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    consumer.subscribe([topic_in])
    deadline = time.monotonic() + 30
    while len(consumer.assignment()) < PARTITIONS:
        consumer.poll(0.1)
        if time.monotonic() > deadline:
            raise BenchmarkError(f"group {group} got {len(consumer.assignment())} of {PARTITIONS} partitions in 30 s")
    meta = consumer.consumer_group_metadata()
    producer = Producer(producer_config(settings, transactional_id=f"{settings.namespace}.tx"))
    producer.init_transactions(30)
    payload = b"x" * RECORD_BYTES
    cells = list(dict.fromkeys((n, min(spread, n)) for n in sizes for spread in spreads))
    latency: dict[tuple[int, int], list[float]] = {c: [] for c in cells}
    client_cpu: dict[tuple[int, int], float] = dict.fromkeys(cells, 0.0)
    broker_cpu: dict[tuple[int, int], float] = dict.fromkeys(cells, 0.0)
    broker_jit: dict[tuple[int, int], float] = dict.fromkeys(cells, 0.0)
    elapsed: dict[tuple[int, int], float] = dict.fromkeys(cells, 0.0)
    next_offset = [0] * PARTITIONS

    def one(n: int, spread: int) -> float:
        t0 = time.perf_counter()
        producer.begin_transaction()
        for i in range(n):
            producer.produce(topic_out, payload, key=f"k{i}".encode(), partition=i % spread)
        if producer.flush(30):
            raise BenchmarkError("records not delivered within 30 s")
        offsets = []
        for p in range(spread):
            next_offset[p] += 1
            offsets.append(TopicPartition(topic_in, p, next_offset[p]))
        producer.send_offsets_to_transaction(offsets, meta, 30)
        producer.commit_transaction(30)
        return (time.perf_counter() - t0) * 1000

    for cell in cells:  # warm-up: every cell's partitions joined a transaction once
        for _ in range(5):
            one(*cell)
    rounds = max(1, transactions // BLOCK)
    for r in range(rounds):
        order = cells[r % len(cells) :] + cells[: r % len(cells)]
        for cell in order:
            c0, t0 = _self_cpu_s(), time.monotonic()
            b0 = _proc_cpu_s(broker_pid) if broker_pid else 0.0
            j0 = jit_cpu_s(broker_pid)
            latency[cell].extend(one(*cell) for _ in range(BLOCK))
            client_cpu[cell] += _self_cpu_s() - c0
            elapsed[cell] += time.monotonic() - t0
            broker_cpu[cell] += (_proc_cpu_s(broker_pid) - b0) if broker_pid else 0.0
            broker_jit[cell] += jit_cpu_s(broker_pid) - j0
    consumer.close()
    admin.delete_topics([topic_in, topic_out])
    rows = []
    for n, spread in cells:
        lat = latency[(n, spread)]
        count = len(lat)
        c_ms = client_cpu[(n, spread)] * 1000 / count
        b_ms = (broker_cpu[(n, spread)] * 1000 - idle_ms_per_s * elapsed[(n, spread)]) / count
        jit_ms = broker_jit[(n, spread)] * 1000 / count
        rows.append(
            [
                str(n),
                str(spread),
                f"{percentile(lat, 50):.2f}",
                f"{percentile(lat, 99):.2f}",
                f"{count * 1000 / sum(lat):,.0f}",
                f"{c_ms:.2f}",
                f"{b_ms:.2f}" if broker_pid else "-",
                f"{b_ms - jit_ms:.2f}" if broker_pid else "-",
                f"{(c_ms + b_ms - jit_ms) / n:.3f}" if broker_pid else "-",
            ]
        )
    return table(
        [
            "records",
            "partitions",
            "p50 ms",
            "p99 ms",
            "txn/s back to back",
            "client CPU ms/txn",
            "broker CPU ms/txn less idle",
            "of it without JIT",
            "client+broker CPU ms/record without JIT",
        ],
        rows,
    )


# ------------------------------------------------------------------------------------------ part 2: worker


def _scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The worker's ``/metrics`` samples by (name, labels)."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def _bucket_percentile(delta: dict[float, float], q: float) -> float:
    """The smallest bucket bound holding ``q`` % of the observations (cumulative ``le`` counts)."""
    total = delta.get(float("inf"), 0.0)
    for bound in sorted(delta):
        if total and delta[bound] >= total * q / 100:
            return bound
    return float("nan")


def worker(
    bootstrap: str,
    broker_pid: int | None,
    idle_ms_per_s: float,
    log_dir: Path,
    warmup_s: float,
    window_s: float,
    in_flight: int,
    k: int,
    partitions: int = PARTITIONS,
) -> tuple[str, dict[str, Any]]:
    """The throughput case with the worker's metrics on; returns the Markdown table and the figures.

    The broker's CPU per turn is given less its idle CPU (``idle_ms_per_s`` over the window).

    Raises:
        BenchmarkError: A load thread failed or a turn did not settle as expected.
    """
    import side_by_side
    from side_by_side import SettledCase

    side_by_side.PARTITIONS = partitions  # the case's namespace and its warm-up turns

    from settled.services._devstack import free_port

    port = free_port()

    class Case(SettledCase):
        def start_worker(self, slot: int = 0, log_level: str = "WARNING") -> None:
            from settled.testing import WorkerProcess

            self.worker = WorkerProcess.start(
                settings=self.settings,
                app="bench.side_by_side_app:app",
                log_path=self.log_dir / f"worker-{self.label}.log",
                worker_id=f"bench-{uuid.uuid4().hex[:6]}",
                log_level=log_level,
                instance_id=f"bench-{self.label}-{slot}",
                env={"SETTLED_PARTITIONS": str(partitions), "SETTLED_METRICS_PORT": str(port)},
                cwd=ROOT,
            )

    case = Case(bootstrap, log_dir, "rpt")
    assert case.worker is not None
    errors: list[BaseException] = []
    state = {"counting": False, "stop": False, "turns": 0}
    lock = threading.Lock()

    def loop() -> None:
        try:
            while not state["stop"]:
                sid = case.submit({"k": k})
                case.settle([sid])
                with lock:
                    if state["counting"] and not state["stop"]:
                        state["turns"] += 1
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread, which fails the run with it
            errors.append(exc)

    try:
        case.warm_partitions()
        threads = [threading.Thread(target=loop, daemon=True) for _ in range(in_flight)]
        for t in threads:
            t.start()
        time.sleep(warmup_s)  # the workload's warm-up, by definition a duration
        wpid = case.worker.pid
        m0, w0, b0 = _scrape(port), _proc_cpu_s(wpid), _proc_cpu_s(broker_pid) if broker_pid else 0.0
        j0 = jit_cpu_s(broker_pid)
        t0 = time.monotonic()
        with lock:
            state["counting"] = True
        time.sleep(window_s)  # the workload's window, by definition a duration
        with lock:
            state["stop"] = True
            turns = state["turns"]
        m1, w1, b1 = _scrape(port), _proc_cpu_s(wpid), _proc_cpu_s(broker_pid) if broker_pid else 0.0
        j1 = jit_cpu_s(broker_pid)
        elapsed_s = time.monotonic() - t0
        for t in threads:
            t.join(120)
        if errors:
            raise BenchmarkError(f"a load thread failed: {errors[0]!r}") from errors[0]
    finally:
        case.close()
        delete_namespace(case.settings)  # its topics; on a given broker they would stay behind

    def delta(name: str, labels: tuple[tuple[str, str], ...] = ()) -> float:
        return m1.get((name, labels), 0.0) - m0.get((name, labels), 0.0)

    txns = delta("settled_transaction_records_count")
    records = delta("settled_transaction_records_sum")
    buckets = {
        float(dict(labels)["le"]): m1[(name, labels)] - m0.get((name, labels), 0.0)
        for name, labels in m1
        if name == "settled_transaction_records_bucket"
    }
    calls = {
        dict(labels)["call"]: m1[(name, labels)] - m0.get((name, labels), 0.0)
        for name, labels in m1
        if name == "settled_transaction_call_seconds_total"
    }
    figures: dict[str, Any] = {
        "turns/s": turns / elapsed_s,
        "steps/s": turns * k / elapsed_s,
        "transactions/s": txns / elapsed_s,
        "records/txn mean": records / txns if txns else float("nan"),
        "records/txn p50": _bucket_percentile(buckets, 50),
        "records/txn p99": _bucket_percentile(buckets, 99),
        "offset-only txn share": buckets.get(0.0, 0.0) / txns if txns else float("nan"),
        "transactions/turn": txns / turns if turns else float("nan"),
        "worker CPU ms/turn": (w1 - w0) * 1000 / max(turns, 1),
        "broker CPU ms/turn less idle": ((b1 - b0) * 1000 - idle_ms_per_s * elapsed_s) / max(turns, 1)
        if broker_pid
        else float("nan"),
        "broker JIT CPU ms/turn": (j1 - j0) * 1000 / max(turns, 1) if broker_pid else float("nan"),
        "broker CPU ms/turn less idle and JIT": ((b1 - b0 - (j1 - j0)) * 1000 - idle_ms_per_s * elapsed_s)
        / max(turns, 1)
        if broker_pid
        else float("nan"),
        "Kafka calls share of window": sum(calls.values()) / elapsed_s,
        "checkpoint share of window": delta("settled_commit_duration_seconds_sum") / elapsed_s,
        "call share": {c: s / elapsed_s for c, s in sorted(calls.items())},
    }
    rows = [[name, f"{v:,.3f}" if isinstance(v, float) else json.dumps(v)] for name, v in figures.items()]
    rows[-1][1] = ", ".join(f"{c} {s:.1%}" for c, s in figures["call share"].items())
    return table(["figure", "value"], rows), figures


# ------------------------------------------------------------------------------------------ main


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the chosen parts and print their tables; return the exit status."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", default="cost,worker", help="cost, worker or both (default)")
    ap.add_argument("--transactions", type=int, default=200, help="cost: transactions per cell")
    ap.add_argument("--sizes", default="1,5,20,100", help="cost: records per transaction")
    ap.add_argument("--spreads", default="1,12", help="cost: partitions per transaction")
    ap.add_argument("--warmup-s", type=float, default=3.0)
    ap.add_argument("--window-s", type=float, default=20.0)
    ap.add_argument("--in-flight", type=int, default=50)
    ap.add_argument("--k", type=int, default=5, help="worker: ctx.step calls per turn")
    ap.add_argument("--partitions", type=int, default=PARTITIONS, help="worker: partitions of the namespace")
    ap.add_argument("--bootstrap", default=None, help="a running broker (default: a private one)")
    ap.add_argument("--json", type=Path, default=None, help="also write the worker figures here")
    ap.add_argument("--keep", action="store_true", help="keep the private broker's folder")
    args = ap.parse_args(argv)
    parts = set(args.part.split(","))
    timeouts = use_dev_timeouts()
    tmp = Path(tempfile.mkdtemp(prefix="settled-rpt-"))
    broker = None
    broker_pid: int | None = None
    try:
        if args.bootstrap:
            bootstrap = args.bootstrap
        else:
            from settled.services._devstack import KafkaBroker, free_port

            base = Settings()
            lib = base.jar_cache_dir / f"kafka-{base.kafka_version}" / "lib"
            broker = KafkaBroker(tmp / "kafka", lib, free_port(), free_port())
            broker.start()
            bootstrap = broker.bootstrap
            broker_pid = int((tmp / "kafka" / "kafka.pid").read_text().split()[0])
        os.environ["SETTLED_KAFKA_BOOTSTRAP"] = bootstrap
        print(f"# records per transaction, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC")
        print(f"broker {bootstrap} ({'private' if broker else 'given'}); {client_versions()}; {timeouts}")
        idle_ms_per_s = 0.0
        if broker_pid:
            idle0, t0 = _proc_cpu_s(broker_pid), time.monotonic()
            time.sleep(IDLE_S)  # the idle broker's own CPU, by definition over a duration
            idle_ms_per_s = (_proc_cpu_s(broker_pid) - idle0) * 1000 / (time.monotonic() - t0)
        print(f"before: {load_average()}; the idle broker used {idle_ms_per_s:.1f} ms of CPU per s\n", flush=True)
        if "cost" in parts:
            print("## a bare transaction by record count and partition spread (600-byte records)\n")
            print(cost(bootstrap, broker_pid, idle_ms_per_s, args.transactions, _ints(args.sizes), _ints(args.spreads)))
            print(f"\nafter cost: {load_average()}\n", flush=True)
        if "worker" in parts:
            print(f"## one worker, {args.partitions} partitions, {args.in_flight} turns in flight, K={args.k}\n")
            text, figures = worker(
                bootstrap,
                broker_pid,
                idle_ms_per_s,
                tmp,
                args.warmup_s,
                args.window_s,
                args.in_flight,
                args.k,
                args.partitions,
            )
            print(text)
            print(f"\nafter worker: {load_average()}", flush=True)
            if args.json:
                args.json.write_text(json.dumps(figures, indent=2))
    finally:
        if broker is not None:
            broker.kill()
        if not args.keep:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"kept {tmp}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
