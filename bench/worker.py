"""Benchmark: admission and settlement through a real worker against a bare Kafka round trip (issue 5).

    python bench/worker.py [--submissions N] [--clients 1,10,100] [--bootstrap HOST:PORT] [--profile]
                           [--what-if-prompt-poll] [--keep]

In a fresh namespace (3 partitions, deleted at the end) it starts, as child processes (so clients and workers never
share a GIL):

* **settled**: ``python -m settled.services worker --app settled.testing.echo:app`` — the echo agent, no delay;
* **bare**: the minimal "admission" without settled: a consumer group member reading a request topic and, per poll
  batch, a transactional ``begin → produce the replies to another topic → flush → send_offsets_to_transaction →
  commit`` (one transactional producer, KIP-447 group metadata), picking records up as soon as they arrive
  (``poll(t)`` for the first, ``consume(n, 0)`` for what is already fetched);
* **bare, settled's polls**: the same loop with settled's poll shape: ``consume(500, 0.05)`` in the worker (like
  ``Worker.turn``) and ``consume(500, 0.1)`` in the reply reader (like the client's receipts reader). librdkafka's
  batch consume returns only when ``num_messages`` records arrived or the timeout passed, so this isolates what the
  poll shape alone costs.

For each client count it runs ``--submissions`` requests per side from that many threads sharing one client (settled:
one ``settled.client.Client``, as the API intends; bare: one idempotent producer plus one reply reader), sides in a
rotating order. Per side: submit → receipt (reply) latency p50/p99, admissions/s (requests ÷ time from the first
submit to the last receipt), CPU per request of the worker and of the client process. For settled also: the latency
split at the worker's ``decided_at`` (submit → decided, decided → receipt returned), settlements/s (requests ÷ time
from the first submit to the last settlement read from ``settled.settlements``), receipt → settlement latency, the
worker-clock admission → settlement time (``decided_at`` → ``settled_at``), and how much later the same settlements
reach ``Client.settlements()``. A probe measures the batch-consume wait itself. It prints ratios, the durability
class, versions and the machine load.

``--profile`` runs the settled worker under pyinstrument (only while the settled side is measured) and prints where
its main loop's time goes. ``--what-if-prompt-poll`` patches, in this run only, settled's ``consume(n, t)`` calls (the
worker loop, the receipts reader, the settlements readers) to ``poll(t)`` + ``consume(n - 1, 0)``: what the suggested
change would give (product code is not changed). Exit status 0 unless the measurement itself broke (a failed request,
a missing or non-completed settlement): the ratios are figures, not gates.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout: python bench/worker.py
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (
    BrokerInfo,
    client_versions,
    delete_namespace,
    describe_broker,
    fresh_namespace,
    load_average,
    percentile,
    resolve_bootstrap,
    table,
    use_dev_timeouts,
)

from settled._settings import Settings
from settled.client import Client
from settled.producers import (
    admin_config,
    consumer_config,
    partition_for_key,
    producer_config,
    provision_topics,
    reader_config,
    topic_configs,
)
from settled.schemas import Codec, Receipt, ReceiptOutcome, SettlementOutcome, SettlementRecord
from settled.testing import ECHO_APP, WorkerProcess

ROOT = Path(__file__).resolve().parent.parent
PARTITIONS = 3
SETTLED = "settled"
BARE = "bare"
BARE_POLLS = "bare, settled's polls"
SIDES = (SETTLED, BARE, BARE_POLLS)
#: The poll shapes of settled's loops that the probe and the "settled's polls" baseline reproduce.
WORKER_POLL_S = 0.05  # WorkerConfig.poll_timeout_s, consume(500, 0.05)
RECEIPTS_POLL_S = 0.1  # ReceiptsReader poll_timeout_s, consume(500, 0.1)
SETTLEMENTS_POLL_S = 0.2  # SettlementStream / read_settlement, consume(500, 0.2)
PROFILE_START = signal.SIGUSR1
PROFILE_STOP = signal.SIGUSR2


class BenchmarkError(RuntimeError):
    """The measurement went wrong (a failed request, a missing settlement): its numbers would be meaningless."""


# ------------------------------------------------------------------------------------------ prompt polling


def prompt_consume(consumer: Consumer, num_messages: int, timeout_s: float) -> list[Message]:
    """Return what the consumer has, waiting at most ``timeout_s`` for the *first* record (not for a full batch).

    ``Consumer.consume(n, t)`` returns only when ``n`` records arrived or ``t`` passed (librdkafka's batch consume;
    the probe measures it). ``poll(t)`` returns at the first record; ``consume(n - 1, 0)`` then takes what is already
    fetched without waiting.

    Args:
        consumer: Any consumer.
        num_messages: The most records returned.
        timeout_s: The most to wait for the first record, in seconds.

    Returns:
        Up to ``num_messages`` messages (error events included, as ``consume`` returns them).
    """
    first = consumer.poll(timeout_s)
    if first is None:
        return []
    if num_messages <= 1:
        return [first]
    return [first, *consumer.consume(num_messages - 1, 0)]


class PromptConsumer(Consumer):
    """A consumer whose ``consume`` is `prompt_consume` (the ``--what-if-prompt-poll`` patch)."""

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Message]:
        return prompt_consume(super(), num_messages, timeout)  # type: ignore[arg-type]


def patch_prompt_poll() -> None:
    """Make settled's worker loop and client readers poll promptly, in this process only (no file is changed)."""
    import settled.client._receipts as receipts
    import settled.client._settlements as settlements
    import settled.processors._worker as worker

    for module in (worker, receipts, settlements):
        module.Consumer = PromptConsumer  # type: ignore[attr-defined]


# ---------------------------------------------------------------------------------------------- children


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a live process (all its threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _self_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@dataclass
class Child:
    """A child process of the benchmark and the file its stderr goes to."""

    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path

    def cpu_s(self) -> float:
        """Its CPU seconds so far."""
        self.check()
        return _cpu_s(self.proc.pid)

    def check(self) -> None:
        """Raise if it has exited."""
        code = self.proc.poll()
        if code is not None:
            raise BenchmarkError(f"{self.name} exited with {code}; its log ends:\n{self.tail()}")

    def tail(self, lines: int = 30) -> str:
        """The end of its log."""
        text = self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM (a graceful stop), then SIGKILL if it has not exited within ``timeout_s``."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout_s)


def _child_env(settings: Settings, extra_env: dict[str, str] | None = None) -> dict[str, str]:
    """A child's environment: this one without ``SETTLED_*``, then the settings' namespace, broker and partitions."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SETTLED_")}
    env.update(
        {
            "SETTLED_NAMESPACE": settings.namespace,
            "SETTLED_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
            "SETTLED_PARTITIONS": str(settings.partitions),
            **settings.timeouts_env(),
            "PYTHONPATH": str(ROOT),
            **(extra_env or {}),
        }
    )
    return env


def spawn(
    name: str, argv: list[str], settings: Settings, log_dir: Path, extra_env: dict[str, str] | None = None
) -> Child:
    """Start a child on ``settings``' namespace and broker; its stderr goes to ``<log_dir>/<name>.log``."""
    log_path = log_dir / f"{name}.log"
    with log_path.open("wb") as log_file:
        proc = subprocess.Popen(
            argv, cwd=ROOT, env=_child_env(settings, extra_env), stdout=subprocess.DEVNULL, stderr=log_file
        )
    return Child(name, proc, log_path)


def spawn_settled_worker(settings: Settings, log_dir: Path) -> Child:
    """Start ``settled worker`` with the echo app, no delay (`settled.testing.WorkerProcess`), as ``settled-worker``.

    Its log (level WARNING) goes to ``<log_dir>/settled-worker.log``; its worker id is ``bench``.
    """
    worker = WorkerProcess.start(
        settings,
        app=ECHO_APP,
        log_path=log_dir / "settled-worker.log",
        worker_id="bench",
        log_level="WARNING",
        base_env=_child_env(settings, {"SETTLED_ECHO_DELAY_S": "0"}),
        cwd=ROOT,
        append_log=False,
    )
    return Child("settled-worker", worker.proc, worker.log_path)


def settled_worker_main(profile_path: str | None, prompt: bool) -> int:
    """The ``--child settled`` entry: ``settled worker --app settled.testing.echo:app``, profiled and/or patched.

    Does what ``settled.services._worker_service.worker_command`` does; with ``profile_path`` a pyinstrument profiler
    runs on the loop's thread between SIGUSR1 and SIGUSR2 (the parent sends them around the settled side's
    measurements) and its report is written there at exit.
    """
    from settled.runtime import load_app
    from settled.services._worker_service import JsonFormatter, build_worker

    if prompt:
        patch_prompt_poll()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    logging.basicConfig(level=logging.WARNING, handlers=[handler], force=True)
    worker = build_worker(Settings(), load_app(ECHO_APP), worker_id="bench")
    worker.install_signal_handlers()
    profiler: Any = None
    if profile_path:
        from pyinstrument import Profiler

        profiler = Profiler(interval=0.0005)
        signal.signal(PROFILE_START, lambda _s, _f: profiler.start() if not profiler.is_running else None)
        signal.signal(PROFILE_STOP, lambda _s, _f: profiler.stop() if profiler.is_running else None)
    try:
        worker.run()
    finally:
        if profiler is not None and profile_path:
            if profiler.is_running:
                profiler.stop()
            if profiler.last_session is not None:
                Path(profile_path).write_text(profiler.output_text(unicode=False, color=False, show_all=False))
    return 0


def bare_worker_main(in_topic: str, out_topic: str, group: str, batch_polls: bool) -> int:
    """The ``--child bare`` entry: the minimal transactional consume → produce → send_offsets → commit loop.

    One consumer group member reads ``in_topic``; per poll batch one transaction produces each request's value as
    its reply to ``out_topic`` (same key), flushes, sends the consumed offsets with the group metadata, and commits.
    With ``batch_polls`` it polls like settled's worker loop (``consume(500, 0.05)``), else promptly.
    """
    settings = Settings()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda _s, _f: stop.set())
    signal.signal(signal.SIGINT, lambda _s, _f: stop.set())
    timeout_s = settings.kafka_call_timeout_s
    consumer = Consumer(consumer_config(settings, group))
    consumer.subscribe([in_topic])
    producer = Producer(producer_config(settings, transactional_id=f"{group}.{out_topic}"))
    producer.init_transactions(timeout_s)
    try:
        while not stop.is_set():
            if batch_polls:
                msgs = consumer.consume(500, WORKER_POLL_S)
            else:
                msgs = prompt_consume(consumer, 500, WORKER_POLL_S)
            offsets: dict[int, int] = {}
            replies: list[Message] = []
            for msg in msgs:
                err = msg.error()
                if err is not None:
                    print(f"bare worker: consumer error {err}", file=sys.stderr, flush=True)
                    continue
                replies.append(msg)
                offsets[msg.partition() or 0] = (msg.offset() or 0) + 1
            if not replies:
                continue
            producer.begin_transaction()
            for msg in replies:
                producer.produce(out_topic, key=msg.key(), value=msg.value())
            producer.flush(timeout_s)
            producer.send_offsets_to_transaction(
                [TopicPartition(in_topic, p, o) for p, o in offsets.items()],
                consumer.consumer_group_metadata(),
                timeout_s,
            )
            producer.commit_transaction(timeout_s)
    finally:
        consumer.close()
    return 0


# ------------------------------------------------------------------------------------------------ clients


def _end_assignment(consumer: Consumer, topic: str, timeout_s: float) -> list[TopicPartition]:
    meta = consumer.list_topics(topic, timeout=timeout_s).topics[topic]
    return [
        TopicPartition(topic, p, consumer.get_watermark_offsets(TopicPartition(topic, p), timeout_s, cached=False)[1])
        for p in sorted(meta.partitions)
    ]


def _assign_only(settings: Settings, topic: str) -> Consumer:
    """A read_committed, assign-only consumer at the topic's current end offsets (no group is joined)."""
    consumer = Consumer(reader_config(settings, f"{settings.namespace}.bench-readers"))
    consumer.assign(_end_assignment(consumer, topic, settings.kafka_call_timeout_s))
    return consumer


class BareClient:
    """The bare side's client: one idempotent producer and one reply reader shared by every thread.

    The same structure as ``settled.client.Client`` (a delivery-report thread, a background reader handing each reply
    to the waiting request), with none of its decoding or checks. The request value is the request id, padded.
    """

    def __init__(self, settings: Settings, in_topic: str, out_topic: str, batch_polls: bool, pad_bytes: int) -> None:
        self._in_topic = in_topic
        self._pad = b" " * pad_bytes
        self._producer = Producer({**producer_config(settings), "message.timeout.ms": 120_000})
        self._reader = _assign_only(settings, out_topic)
        self._batch_polls = batch_polls
        self._lock = threading.Lock()
        self._waiters: dict[bytes, threading.Event] = {}
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._serve_producer, daemon=True, name="bare-delivery"),
            threading.Thread(target=self._serve_reader, daemon=True, name="bare-reader"),
        ]
        for t in self._threads:
            t.start()

    def submit(self, conversation_id: str, timeout_s: float) -> str:
        """Send one request and return its id once its reply is read.

        Raises:
            TimeoutError: No reply within ``timeout_s``.
        """
        rid = uuid.uuid4().hex
        key = rid.encode()
        event = threading.Event()
        with self._lock:
            self._waiters[key] = event
        try:
            self._producer.produce(self._in_topic, key=conversation_id.encode(), value=key + self._pad)
            if not event.wait(timeout_s):
                raise TimeoutError(f"bare request {rid} got no reply within {timeout_s} s")
        finally:
            with self._lock:
                self._waiters.pop(key, None)
        return rid

    def close(self) -> None:
        """Stop the threads, flush the producer, close the reader."""
        self._stop.set()
        for t in self._threads:
            t.join(5)
        self._producer.flush(10)
        self._reader.close()

    def _serve_producer(self) -> None:
        while not self._stop.is_set():
            self._producer.poll(0.05)

    def _serve_reader(self) -> None:
        while not self._stop.is_set():
            if self._batch_polls:
                msgs = self._reader.consume(500, RECEIPTS_POLL_S)
            else:
                msgs = prompt_consume(self._reader, 500, RECEIPTS_POLL_S)
            for msg in msgs:
                value = msg.value()
                if msg.error() is not None or not isinstance(value, bytes):
                    continue
                with self._lock:
                    event = self._waiters.get(value[:32])
                if event is not None:
                    event.set()


class SettlementTracker:
    """Reads ``settled.settlements`` promptly (`prompt_consume`) from its end and notes when each settlement arrived.

    The benchmark's own clock for "settlement read"; ``Client.settlements()`` is measured beside it.
    """

    def __init__(self, settings: Settings, codec: Codec) -> None:
        self._topic = settings.topic("settlements")
        self._codec = codec
        self._consumer = _assign_only(settings, self._topic)
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self.read_at: dict[str, float] = {}
        self.records: dict[str, SettlementRecord] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="bench-settlements")
        self._thread.start()

    def wait_for(self, submission_ids: Sequence[str], timeout_s: float) -> bool:
        """Wait until every id's settlement was read; return whether they all were."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while not all(s in self.read_at for s in submission_ids):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(left)
        return True

    def close(self) -> None:
        """Stop reading."""
        self._stop.set()
        self._thread.join(5)
        self._consumer.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            msgs = prompt_consume(self._consumer, 500, 0.05)
            now = time.perf_counter()
            for msg in msgs:
                value = msg.value()
                if msg.error() is not None or not isinstance(value, bytes):
                    continue
                record = self._codec.decode(value, expected=(SettlementRecord,))
                assert isinstance(record, SettlementRecord)
                with self._changed:
                    self.read_at.setdefault(record.submission_id, now)
                    self.records.setdefault(record.submission_id, record)
                    self._changed.notify_all()


def stream_reader(client: Client, count: int, out: dict[str, float], idle_s: float) -> threading.Thread:
    """Read ``client.settlements()`` from now in a thread, noting when each settlement arrives, until ``count`` arrived.

    The stream starts at the current end offsets (neither ``from_beginning`` nor ``since``): built before a cell's
    first request, it sees exactly that cell's settlements (the previous cell's all settled before). It ends early
    after ``idle_s`` without a record.
    """
    stream = client.settlements(idle_timeout_s=idle_s)

    def run() -> None:
        with stream:
            for record in stream:
                out.setdefault(record.submission_id, time.perf_counter())
                if len(out) >= count:
                    return

    thread = threading.Thread(target=run, daemon=True, name="bench-stream")
    thread.start()
    return thread


# ---------------------------------------------------------------------------------------------- measuring


@dataclass
class Sample:
    """One request: when it started and returned (perf counter), its start as wall time, the worker's decision."""

    request_id: str
    start_s: float
    end_s: float
    start_wall_s: float
    decided_wall_s: float | None


@dataclass
class Cell:
    """One side at one client count."""

    side: str
    clients: int
    samples: list[Sample] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    worker_cpu_s: float = 0.0
    client_cpu_s: float = 0.0
    settle_read_s: dict[str, float] = field(default_factory=dict)  # prompt reader
    stream_read_s: dict[str, float] = field(default_factory=dict)  # Client.settlements()
    settled_wall_s: dict[str, float] = field(default_factory=dict)  # the record's settled_at

    @property
    def n(self) -> int:
        return len(self.samples)

    def admissions_per_s(self) -> float:
        span = max(s.end_s for s in self.samples) - min(s.start_s for s in self.samples)
        return self.n / span

    def latency_ms(self, q: float) -> float:
        return percentile([s.end_s - s.start_s for s in self.samples], q) * 1000

    def split_ms(self, q: float) -> tuple[float, float]:
        """Percentiles of submit → decided and decided → returned (wall clock; the worker's ``decided_at``)."""
        to_decided = [s.decided_wall_s - s.start_wall_s for s in self.samples if s.decided_wall_s is not None]
        after = [
            (s.start_wall_s + (s.end_s - s.start_s)) - s.decided_wall_s
            for s in self.samples
            if s.decided_wall_s is not None
        ]
        return percentile(to_decided, q) * 1000, percentile(after, q) * 1000

    def settlements_per_s(self) -> float:
        return self.n / (max(self.settle_read_s.values()) - min(s.start_s for s in self.samples))

    def submit_to_settlement_ms(self, q: float) -> float:
        return percentile([self.settle_read_s[s.request_id] - s.start_s for s in self.samples], q) * 1000

    def admit_to_settle_ms(self, q: float) -> float:
        values = [
            self.settled_wall_s[s.request_id] - s.decided_wall_s for s in self.samples if s.decided_wall_s is not None
        ]
        return percentile(values, q) * 1000

    def stream_lag_ms(self, q: float) -> float:
        lags = [self.stream_read_s[k] - v for k, v in self.settle_read_s.items() if k in self.stream_read_s]
        return percentile(lags, q) * 1000 if lags else float("nan")


def drive(submit: Callable[[int], tuple[str, float | None]], total: int, clients: int, offset: int) -> Cell:
    """Run ``total`` requests from ``clients`` threads, each taking the next request number until none is left."""
    cell = Cell("", clients)
    counter = itertools.count(offset)
    lock = threading.Lock()
    start = threading.Barrier(clients + 1)

    def loop() -> None:
        start.wait()
        while True:
            with lock:
                i = next(counter)
            if i >= offset + total:
                return
            wall, t0 = time.time(), time.perf_counter()
            try:
                rid, decided = submit(i)
            except Exception as exc:  # noqa: BLE001 - counted and reported; the run then fails
                cell.failures.append(f"{type(exc).__name__}: {exc}")
                continue
            cell.samples.append(Sample(rid, t0, time.perf_counter(), wall, decided))

    threads = [threading.Thread(target=loop, name=f"bench-client-{k}") for k in range(clients)]
    for t in threads:
        t.start()
    start.wait()
    for t in threads:
        t.join()
    return cell


def conversation(i: int, conversations: int) -> str:
    return f"bench-c{i % conversations:04d}"


def _conversation_on(partition: int) -> str:
    """A conversation id that murmur2 places on ``partition``."""
    return next(
        f"warm-{k}" for k in itertools.count() if partition_for_key(f"warm-{k}".encode(), PARTITIONS) == partition
    )


def _bare_submitter(
    bare: BareClient, conversations: int, timeout_s: float
) -> Callable[[int], tuple[str, float | None]]:
    def submit(i: int) -> tuple[str, float | None]:
        return bare.submit(conversation(i, conversations), timeout_s), None

    return submit


def probe_wait(client: Client, receipts: Sequence[Receipt], timeout_s: float) -> list[str]:
    """Time ``Client.wait`` on receipts whose settlements are already committed (the last cell's)."""
    took = []
    for receipt in receipts:
        t0 = time.perf_counter()
        client.wait(receipt, timeout_s)
        took.append(time.perf_counter() - t0)
    return [
        "Client.wait(receipt), settlement already there",
        f"{percentile(took, 50) * 1000:.1f}",
        f"{max(took) * 1000:.1f}",
        f"{SETTLEMENTS_POLL_S * 1000:.0f}",
    ]


def probe_consume_wait(settings: Settings, repeats: int) -> list[list[str]]:
    """Measure how long ``consume(500, t)`` and ``poll(t)`` take to return when one record is already there."""
    topic = settings.topic("probe")
    admin = AdminClient(admin_config(settings))
    for fut in admin.create_topics([NewTopic(topic, 1, -1)], operation_timeout=30).values():
        fut.result()
    producer = Producer(producer_config(settings))
    consumer = _assign_only(settings, topic)
    rows = []
    try:
        for label, timeout_s, call in (
            ("worker loop: consume(500, 0.05)", WORKER_POLL_S, lambda c, t: c.consume(500, t)),
            ("receipts reader: consume(500, 0.1)", RECEIPTS_POLL_S, lambda c, t: c.consume(500, t)),
            ("settlements readers: consume(500, 0.2)", SETTLEMENTS_POLL_S, lambda c, t: c.consume(500, t)),
            ("poll(0.2) + consume(499, 0)", SETTLEMENTS_POLL_S, lambda c, t: prompt_consume(c, 500, t)),
        ):
            took = []
            for _ in range(repeats):
                producer.produce(topic, key=b"k", value=b"v")
                producer.flush(10)
                time.sleep(0.005)  # let the consumer's fetcher bring it in
                t0 = time.perf_counter()
                got = call(consumer, timeout_s)
                took.append(time.perf_counter() - t0)
                if len(got) != 1:
                    raise BenchmarkError(f"probe: {label} returned {len(got)} records, expected 1")
            rows.append(
                [label, f"{percentile(took, 50) * 1000:.1f}", f"{max(took) * 1000:.1f}", f"{timeout_s * 1000:.0f}"]
            )
    finally:
        consumer.close()
    return rows


# --------------------------------------------------------------------------------------------------- main


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--submissions", type=int, default=200, help="measured requests per side per client count")
    parser.add_argument("--warmup", type=int, default=30, help="unmeasured requests per side before the first cell")
    parser.add_argument("--clients", default="1,10,100", help="comma-separated client thread counts")
    parser.add_argument("--conversations", type=int, default=100, help="conversations the requests cycle over")
    parser.add_argument("--timeout", type=float, default=30.0, help="per-request and per-wait deadline, seconds")
    parser.add_argument("--bootstrap", default=None, help="Kafka bootstrap servers (default: the dev stack)")
    parser.add_argument("--profile", action="store_true", help="profile the settled worker (pyinstrument)")
    parser.add_argument(
        "--what-if-prompt-poll",
        action="store_true",
        help="patch settled's consume(n, t) calls to poll(t) + consume(n-1, 0) in this run (no file changes)",
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep the namespace's topics and groups, and the child logs"
    )
    parser.add_argument("--child", choices=("settled", "bare"), help=argparse.SUPPRESS)
    parser.add_argument("--child-profile", default="", help=argparse.SUPPRESS)
    parser.add_argument("--child-in", default="", help=argparse.SUPPRESS)
    parser.add_argument("--child-out", default="", help=argparse.SUPPRESS)
    parser.add_argument("--child-group", default="", help=argparse.SUPPRESS)
    parser.add_argument("--child-batch-polls", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.client_list = [int(c) for c in args.clients.split(",") if c.strip()]
    if not args.client_list or min(args.client_list) < 1:
        parser.error(f"--clients must list positive counts, got {args.clients!r}")
    if args.submissions < 1 or args.warmup < 0 or args.conversations < 1:
        parser.error("--submissions and --conversations must be positive, --warmup not negative")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    use_dev_timeouts()  # the parent's choice, passed to its children by `spawn`
    if args.child == "settled":
        return settled_worker_main(args.child_profile or None, args.what_if_prompt_poll)
    if args.child == "bare":
        return bare_worker_main(args.child_in, args.child_out, args.child_group, args.child_batch_polls)
    return run(args)


def run(args: argparse.Namespace) -> int:
    wall_start = time.monotonic()
    load_before = load_average()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    bootstrap, source = resolve_bootstrap(args.bootstrap)
    namespace = fresh_namespace("bench-worker")
    settings = Settings(namespace=namespace, kafka_bootstrap=bootstrap, partitions=PARTITIONS)
    codec = Codec()
    print(f"broker {bootstrap} ({source}); namespace {namespace}; {load_before}", file=sys.stderr, flush=True)
    if args.what_if_prompt_poll:
        patch_prompt_poll()

    log_dir = Path(tempfile.mkdtemp(prefix="bench-worker-"))
    profile_path = log_dir / "settled-worker.profile.txt"
    bare_topics = {BARE: ("bare-in", "bare-out"), BARE_POLLS: ("bare2-in", "bare2-out")}
    groups = [f"{namespace}.{settings.app_id}.workers"] + [f"{namespace}.{key}.workers" for key in ("bare", "bare2")]
    children: dict[str, Child] = {}
    client: Client | None = None
    tracker: SettlementTracker | None = None
    bare_clients: dict[str, BareClient] = {}
    cells: list[Cell] = []
    probe_rows: list[list[str]] = []
    info: BrokerInfo | None = None
    idle = [0.0, 0.0]  # the settled worker's CPU seconds and the wall seconds while the bare sides ran
    try:
        provision_topics(settings, codec, datetime.now(UTC))
        configs = topic_configs(settings)
        admin = AdminClient(admin_config(settings))
        new = [
            NewTopic(settings.topic(name), PARTITIONS, -1, config=configs[settings.topic(like)])
            for pair in bare_topics.values()
            for name, like in zip(pair, ("inbox", "receipts"), strict=True)
        ]
        for fut in admin.create_topics(new, operation_timeout=30).values():
            fut.result()
        info = describe_broker(bootstrap, settings.topic("log"))

        if args.profile or args.what_if_prompt_poll:
            argv = [sys.executable, str(Path(__file__).resolve()), "--child", "settled"]
            argv += ["--child-profile", str(profile_path)] if args.profile else []
            argv += ["--what-if-prompt-poll"] if args.what_if_prompt_poll else []
            children[SETTLED] = spawn("settled-worker", argv, settings, log_dir, {"SETTLED_ECHO_DELAY_S": "0"})
        else:
            children[SETTLED] = spawn_settled_worker(settings, log_dir)
        for side, key in ((BARE, "bare"), (BARE_POLLS, "bare2")):
            in_topic, out_topic = (settings.topic(t) for t in bare_topics[side])
            argv = [sys.executable, str(Path(__file__).resolve()), "--child", "bare", "--child-in", in_topic]
            argv += ["--child-out", out_topic, "--child-group", f"{namespace}.{key}.workers"]
            argv += ["--child-batch-polls"] if side == BARE_POLLS else []
            children[side] = spawn(f"{key}-worker", argv, settings, log_dir)

        client = Client(settings, default_timeout_s=args.timeout)
        tracker = SettlementTracker(settings, codec)
        pad = _proposal_size(codec) - 32
        for side, (in_name, out_name) in bare_topics.items():
            bare_clients[side] = BareClient(
                settings, settings.topic(in_name), settings.topic(out_name), side == BARE_POLLS, pad
            )

        settled_client, settlement_tracker = client, tracker

        receipts: list[Receipt] = []

        def submit_settled(i: int) -> tuple[str, float | None]:
            receipt = settled_client.submit(conversation(i, args.conversations), {"i": i})
            if receipt.outcome is not ReceiptOutcome.ADMITTED:
                raise BenchmarkError(f"request {i}: receipt {receipt.outcome.value}, expected admitted")
            receipts.append(receipt)
            return receipt.request_id, receipt.decided_at.timestamp()

        submitters: dict[str, Callable[[int], tuple[str, float | None]]] = {SETTLED: submit_settled}
        for side, bare in bare_clients.items():
            submitters[side] = _bare_submitter(bare, args.conversations, args.timeout)

        # Warm-up: one request per partition first (the workers hold their partitions once these come back), then
        # a concurrent burst; every settled warm-up settles before the first measurement.
        first = [_conversation_on(p) for p in range(PARTITIONS)]
        warm_ids: list[str] = []
        for side in SIDES:
            for conv in first:
                if side == SETTLED:
                    warm_ids.append(client.submit(conv, {"warm": True}, timeout_s=120).request_id)
                else:
                    bare_clients[side].submit(conv, 120)
            cell = drive(submitters[side], args.warmup, min(10, max(args.client_list)), 10**6)
            if cell.failures:
                raise BenchmarkError(f"warm-up of {side}: {cell.failures[:3]}")
            if side == SETTLED:
                warm_ids += [s.request_id for s in cell.samples]
        if not tracker.wait_for(warm_ids, args.timeout):
            raise BenchmarkError("the warm-up submissions did not all settle")
        print(f"  warm ({time.monotonic() - wall_start:.0f} s)", file=sys.stderr, flush=True)

        offset = 0
        for k, clients in enumerate(args.client_list):
            order = SIDES[k % 3 :] + SIDES[: k % 3]
            for side in order:
                for child in children.values():
                    child.check()
                worker_cpu, client_cpu = children[side].cpu_s(), _self_cpu_s()
                idle_cpu, idle_start = children[SETTLED].cpu_s(), time.perf_counter()
                stream_out: dict[str, float] = {}
                stream_thread = None
                if side == SETTLED:
                    stream_thread = stream_reader(settled_client, args.submissions, stream_out, args.timeout)
                    if args.profile:
                        os.kill(children[SETTLED].proc.pid, PROFILE_START)
                cell = drive(submitters[side], args.submissions, clients, offset)
                offset += args.submissions
                cell.side = side
                if side == SETTLED:
                    ids = [s.request_id for s in cell.samples]
                    if not settlement_tracker.wait_for(ids, args.timeout):
                        missing = sum(1 for i in ids if i not in settlement_tracker.read_at)
                        cell.failures.append(f"{missing} settlements not read within {args.timeout} s")
                    if args.profile:
                        os.kill(children[SETTLED].proc.pid, PROFILE_STOP)
                    cell.worker_cpu_s = children[side].cpu_s() - worker_cpu
                    cell.client_cpu_s = _self_cpu_s() - client_cpu
                    assert stream_thread is not None
                    stream_thread.join(args.timeout + 1)
                    for i in ids:
                        record = settlement_tracker.records.get(i)
                        if record is None:
                            continue
                        if record.outcome is not SettlementOutcome.COMPLETED:
                            cell.failures.append(f"{i} settled {record.outcome.value}")
                        cell.settle_read_s[i] = settlement_tracker.read_at[i]
                        cell.settled_wall_s[i] = record.settled_at.timestamp()
                        if i in stream_out:
                            cell.stream_read_s[i] = stream_out[i]
                else:
                    cell.worker_cpu_s = children[side].cpu_s() - worker_cpu
                    cell.client_cpu_s = _self_cpu_s() - client_cpu
                    idle[0] += children[SETTLED].cpu_s() - idle_cpu
                    idle[1] += time.perf_counter() - idle_start
                if cell.failures:
                    raise BenchmarkError(
                        f"{side} at {clients} clients: {len(cell.failures)} failures: {cell.failures[:3]}"
                    )
                cells.append(cell)
                print(
                    f"  {clients:>3} clients  {side:<22} {cell.admissions_per_s():>7,.0f} adm/s  "
                    f"p50 {cell.latency_ms(50):6.1f} ms  p99 {cell.latency_ms(99):6.1f} ms"
                    + (f"  {cell.settlements_per_s():>6,.0f} settle/s" if side == SETTLED else ""),
                    file=sys.stderr,
                    flush=True,
                )
        probe_rows = probe_consume_wait(settings, 10)
        probe_rows.append(probe_wait(settled_client, receipts[-10:], args.timeout))
    finally:
        for bare in bare_clients.values():
            bare.close()
        if tracker is not None:
            tracker.close()
        if client is not None:
            client.close()
        for child in children.values():
            child.stop()
        if not args.keep:
            try:
                delete_namespace(settings, groups)
            except Exception as exc:  # noqa: BLE001 - reported; the numbers measured stay valid
                print(f"warning: could not delete namespace {namespace}: {exc!r}", file=sys.stderr)
        if sys.exc_info()[0] is not None:
            print(f"child logs kept: {log_dir}", file=sys.stderr)

    assert info is not None
    _report(args, cells, probe_rows, info, settings, load_before, wall_start, idle[0] / max(idle[1], 1e-9))
    if args.profile:
        if profile_path.exists():
            print("\n--- pyinstrument: the settled worker's main thread while the settled side was measured ---")
            print(profile_path.read_text())
        else:
            print(f"\nno profile written; the worker's log ends:\n{children[SETTLED].tail()}")
    if args.keep:
        print(f"\nchild logs: {log_dir}", file=sys.stderr)
    else:
        shutil.rmtree(log_dir, ignore_errors=True)  # a failed run raises before this and keeps them
    return 0


def _proposal_size(codec: Codec) -> int:
    """Bytes of a typical encoded settled proposal (the bare requests are padded to it)."""
    from settled.schemas import SubmissionPayload, SubmissionProposed, canonical_json, payload_digest

    payload = SubmissionPayload(input_json=canonical_json({"i": 12345}), tools_offered=())
    proposal = SubmissionProposed(
        submission_id=str(uuid.uuid4()),
        principal="default",
        conversation_id=conversation(12345, 10_000),
        idempotency_key=str(uuid.uuid4()),
        payload=payload,
        payload_digest=payload_digest(payload),
        proposed_at=datetime.now(UTC),
    )
    return len(codec.encode(proposal))


def _report(
    args: argparse.Namespace,
    cells: list[Cell],
    probe_rows: list[list[str]],
    info: BrokerInfo,
    settings: Settings,
    load_before: str,
    wall_start: float,
    idle_cpu_share: float,
) -> None:
    by = {(c.clients, c.side): c for c in cells}
    rows = []
    for clients in args.client_list:
        bare = by[(clients, BARE)]
        for side in SIDES:
            cell = by[(clients, side)]
            split = [f"{v:.1f}" for v in cell.split_ms(50)] if side == SETTLED else ["-", "-"]
            rows.append(
                [
                    str(clients),
                    side,
                    f"{cell.admissions_per_s():,.0f}",
                    f"{cell.latency_ms(50):.1f}",
                    f"{cell.latency_ms(99):.1f}",
                    f"{cell.admissions_per_s() / bare.admissions_per_s():.2f}",
                    f"{cell.latency_ms(50) / bare.latency_ms(50):.1f}x",
                    *split,
                    f"{cell.worker_cpu_s / cell.n * 1000:.2f}",
                    f"{cell.client_cpu_s / cell.n * 1000:.2f}",
                ]
            )
    title = "settled*" if args.what_if_prompt_poll else SETTLED
    print(
        f"\nAdmission: {args.submissions} requests per side per row from N client threads sharing one client, "
        f"cycling over {args.conversations} conversations on {PARTITIONS} partitions; sides run one after another, "
        "in a rotating order. latency = submit() call → receipt returned (bare: produce → reply read)."
        + (
            "\n* --what-if-prompt-poll: settled's consume(n, t) calls patched to poll(t) + consume(n-1, 0) in this "
            "run (worker loop, receipts reader, settlements readers); product code unchanged."
            if args.what_if_prompt_poll
            else ""
        )
        + "\n"
    )
    headers = [
        "clients",
        "side",
        "adm/s",
        "p50 ms",
        "p99 ms",
        "adm/s ÷ bare",
        "p50 vs bare",
        "→decided p50",
        "decided→rcpt p50",
        "worker CPU ms/req",
        "client CPU ms/req",
    ]
    print(table(headers, [[r[0], title if r[1] == SETTLED else r[1], *r[2:]] for r in rows]))
    srows = []
    for clients in args.client_list:
        cell, bare = by[(clients, SETTLED)], by[(clients, BARE)]
        srows.append(
            [
                str(clients),
                f"{cell.settlements_per_s():,.0f}",
                f"{cell.settlements_per_s() / bare.admissions_per_s():.2f}",
                f"{cell.submit_to_settlement_ms(50):.1f}",
                f"{cell.submit_to_settlement_ms(99):.1f}",
                f"{cell.admit_to_settle_ms(50):.0f}",
                f"{cell.admit_to_settle_ms(99):.0f}",
                f"{cell.stream_lag_ms(50):.1f}",
                f"{cell.stream_lag_ms(99):.1f}",
            ]
        )
    print(
        f"\nSettlement ({title}, echo agent, no delay): settle/s = requests ÷ (last settlement read from "
        f"{settings.topic('settlements')} − first submit); read by a prompt read_committed reader. admit→settle = the "
        "worker's own clock, receipt decided_at → settlement settled_at. stream lag = when Client.settlements() "
        "yielded the same settlement, after the prompt reader.\n"
    )
    print(
        table(
            [
                "clients",
                "settle/s",
                "÷ bare adm/s",
                "submit→settlement p50 ms",
                "p99 ms",
                "admit→settle p50 ms",
                "p99 ms",
                "stream lag p50 ms",
                "p99 ms",
            ],
            srows,
        )
    )
    if probe_rows:
        print(
            "\nBatch-consume wait (one record already fetched, or one settlement already committed; 10 tries each):\n"
        )
        print(table(["call", "returns after p50 ms", "max ms", "timeout ms"], probe_rows))
    print(
        f"\nsettled worker while idle (the bare sides running): {idle_cpu_share:.1%} of a core "
        "(its loop turns every poll timeout even with nothing to do)"
    )
    print(f"durability class: {info.durability_class()}")
    print(f"client: {client_versions()}; broker: {info.version}; python {sys.version.split()[0]}")
    print(f"Kafka timeouts: {Settings().timeouts_label()}")
    conf = producer_config(settings, transactional_id="x")
    keys = ("linger.ms", "retry.backoff.ms", "retry.backoff.max.ms", "acks", "enable.idempotence",
            "transaction.timeout.ms", "partitioner")  # fmt: skip
    print(
        "client settings (every producer, settled's and bare: settled.producers.producer_config): "
        + ", ".join(f"{k}={conf[k]}" for k in keys)
    )
    print(f"machine: {load_before} before, {load_average()} after; wall time {time.monotonic() - wall_start:.0f} s")


if __name__ == "__main__":
    sys.exit(main())
