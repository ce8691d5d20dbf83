"""Scenario 20 (ADM): 1,000 ``submit()`` calls through one client's shared idempotent producer across a broker restart.

One process — one `settled.client.Client`, so one shared idempotent inbox producer and one shared receipts reader —
makes 1,000 ``submit()`` calls from 20 threads over 50 conversations while the test stops the (private) broker and
starts it again. A real ``settled worker`` child process (the ledger decider and the echo agent) runs against that
broker throughout. The scenario's expectations (issue 5; ``docs/semantics.md`` scenario 20; docs/design.md §4):

* every call ends — within its deadline, none hangs — with a receipt or a `SubmissionOutcomeUnknownError` naming its
  idempotency key;
* submitting each timed-out key again with the same payload returns a receipt: ``duplicate`` pointing at the timed-out
  proposal when that proposal reached the inbox, ``admitted`` when it never did;
* in the end exactly 1,000 admissions, one per key, and each conversation's submission sequence is 1..n without gaps
  (``settled.log`` read read_committed).

The client's records outlive a short outage in librdkafka's queue only for ``DELIVERY_TIMEOUT_S``: proposals made
early in the outage expire there and never land (their keys are admitted by the second submit), proposals made late
in it land after the restart (their keys come back as duplicates), so both answers are exercised.

A clean stop/start did not make librdkafka 2.16's idempotent producer fail fatally against Kafka 4.1 in any of our runs
(it fails the timed-out records, drains and bumps its epoch; it raises a fatal error only for a sequence
desynchronisation, e.g. a broker that lost acknowledged records), and librdkafka documents that "there is no practical
way to trigger real fatal errors in the idempotent producer" — so the second case raises one with its hook for that,
``rd_kafka_test_fatal_error``, while the broker is down, with ``OUT_OF_ORDER_SEQUENCE_NUMBER``. The shared producer
must then be replaced (`Client.producer_replacements`) instead of failing every later call; the records the failed
producer still held fail, and their calls produce them again on the new producer or time out naming their keys.

The worker is watched by a supervisor (`_Supervisor`): a worker that exits, or that owes decisions — inbox records
past the workers' committed offset — and commits none for ``WEDGED_S`` with the broker up, is started again and the
incident is reported (a pytest warning and the printed summary). Surviving the restart is the worker's own promise
(scenario 4). Under CPU load its first checkpoint after the restart often had its offsets refused (the group
coordinator still loading), and the next ``send_offsets_to_transaction`` on that producer then blocked for good
(librdkafka#5456, #5511); the appender now replaces such a producer (`settled.producers`, step 6), and this test —
about the client — still keeps the system running the way a process supervisor would, and still demands exactly-once
admission.

The supervisor judges the worker by the worker's own progress, not by the client's receipts: a client that gets no
answer while the worker is idle with nothing owed is the client's failure, reported by the test's promises, and
restarting a healthy worker every ``WEDGED_S`` would only hide where it stopped. When calls made after the restart get
no receipt, the failure says where their proposals stopped (never reached the inbox, reached it undecided, or decided
with a receipt the client did not read) and the client producer's idempotence state (librdkafka statistics).
"""

from __future__ import annotations

import ctypes
import glob
import json
import os
import signal
import struct
import subprocess
import sys
import threading
import time
import warnings
from collections import Counter, defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import confluent_kafka
import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from settled._settings import Settings
from settled.client import Client, SubmissionOutcomeUnknownError
from settled.producers import provision_topics
from settled.schemas import Receipt, ReceiptOutcome, SubmissionAdmitted, SubmissionProposed
from settled.services._devstack import KafkaBroker, StackError
from settled.testing import WorkerProcess
from tests._promise import promise
from tests.integration.admission_load import log_batches, spawn_worker, stop_worker
from tests.integration.helpers import CODEC, read_topic

pytestmark = [pytest.mark.chaos, pytest.mark.integration]

PROMISE = "DUR-001.scenario-20"
PARTITIONS = 3
CONVERSATIONS = 50
THREADS = 20
CALLS_PER_THREAD = 50  # 20 x 50 = 1,000 calls, 20 keys per conversation
TIMEOUT_S = 4.0  # each call's deadline
DELIVERY_TIMEOUT_S = 6.0  # librdkafka's message.timeout.ms: shorter than the outage (see the module docstring)
PACE_S = 0.1  # between one thread's calls, so the load spans the restart
RESTART_AFTER_CALLS = 200
OUTAGE_S = 6.0  # the broker stays down this long after stop() returns (start() adds its own start-up time)
SLACK_S = 2.0  # how far a call may overrun its deadline on the shared 2-core machine
HANG_S = TIMEOUT_S + SLACK_S + 10.0  # a call still in submit() this long after it was made hangs
WEDGED_S = 15.0  # a worker that owes decisions and commits none this long with the broker up is started again
START_S = 60.0  # ... and one that has claimed no partition this long after it was started
PROBE_TIMEOUT_S = 2.0  # bound on each of the supervisor's offset queries
RESUBMIT_TIMEOUT_S = 60.0
PRINCIPAL = "scenario-20"


@dataclass(frozen=True)
class Call:
    """One ``submit()`` call and how it ended.

    Attributes:
        key: Its idempotency key.
        conversation: Its conversation.
        payload: Its input.
        started: ``time.monotonic()`` when it was made.
        elapsed_s: How long it took.
        receipt: The receipt, when one came.
        error: The exception, otherwise.
    """

    key: str
    conversation: str
    payload: dict[str, int]
    started: float
    elapsed_s: float
    receipt: Receipt | None
    error: Exception | None


def _tail(log: Path, lines: int) -> str:
    """The last lines of a worker's log, without librdkafka's own ``%N|...`` lines.

    A faulthandler dump (SIGABRT) is shortened to the innermost 10 frames of the dumped process's main thread
    ("Current thread"), so the log lines before it are not pushed out of the tail by the idle threads' stacks.
    """
    text = log.read_text(encoding="utf-8", errors="replace").splitlines() if log.exists() else []
    kept: list[str] = []
    in_dump = in_current = False
    frames = 0
    for line in text:
        if line.startswith("%"):
            continue
        if line.startswith("Fatal Python error"):
            in_dump, in_current = True, False
            kept.append(line)
            continue
        if in_dump:
            if line.startswith("Current thread"):
                in_current, frames = True, 0
            elif line.startswith(("Thread 0x", "Extension modules")) or not line.strip():
                in_current = False
                in_dump = not line.startswith("Extension modules")
                continue
            if in_current and frames <= 10:
                kept.append(line)
                frames += 1
            continue
        kept.append(line)
    return "\n".join(kept[-lines:])


def _provision(s: Settings) -> None:
    # Right after a topic is created librdkafka may not know its partitions yet (_UNKNOWN_PARTITION): try again.
    for attempt in range(5):
        try:
            provision_topics(s, CODEC, datetime.now(UTC))
            return
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError._UNKNOWN_PARTITION or attempt == 4:
                raise
            time.sleep(0.5)


def _start(broker: KafkaBroker) -> None:
    # On the shared machine a restarted broker JVM has been seen to exit right after "Kafka Server started" with
    # nothing in its log (tests/integration/test_client.py): the start is tried twice; this test is about the client.
    try:
        broker.start()
    except StackError:
        broker.start()


def _raise_fatal_error(client: Client, client_id: str) -> None:
    """Make the client's current inbox producer fail fatally, as librdkafka does after a sequence desynchronisation.

    Calls librdkafka's ``rd_kafka_test_fatal_error`` ("trigger a fatal error for testing purposes") on the
    ``rd_kafka_t`` handle of the client's producer, read from the confluent-kafka ``Handle`` object (its first field
    after the object header). The handle is checked by its name (``<client.id>#producer-<n>``) before it is used.
    """
    assert struct.calcsize("P") == 8 and not hasattr(sys, "gettotalrefcount"), "needs a 64-bit release CPython"
    libs = glob.glob(os.path.join(os.path.dirname(confluent_kafka.__file__), os.pardir, "confluent_kafka.libs", "*"))
    rdkafka = [p for p in libs if os.path.basename(p).startswith("librdkafka")]
    assert len(rdkafka) == 1, f"the bundled librdkafka was not found: {libs}"
    lib = ctypes.CDLL(rdkafka[0])
    lib.rd_kafka_name.restype = ctypes.c_char_p
    lib.rd_kafka_name.argtypes = [ctypes.c_void_p]
    lib.rd_kafka_test_fatal_error.restype = ctypes.c_int
    lib.rd_kafka_test_fatal_error.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p]
    producer = client._producer._current()  # the shared confluent_kafka.Producer (a test reaching into the client)
    handle = ctypes.c_void_p.from_address(id(producer) + struct.calcsize("nP")).value
    name = lib.rd_kafka_name(handle).decode()
    assert name.startswith(f"{client_id}#producer-"), f"not the client's producer handle: {name!r}"
    err = lib.rd_kafka_test_fatal_error(
        handle, KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER, b"scenario 20: sequence desynchronised after the outage"
    )
    assert err == 0, f"rd_kafka_test_fatal_error returned {err}"


class _Pipeline:
    """Where the admission pipeline stands: the inbox's end offsets and the workers' committed inbox offsets.

    Its consumers are never subscribed: one reads end offsets, one reads the workers' group's committed offsets
    (read_uncommitted, so a transaction still open does not make the query wait: KIP-447's ``require_stable``).
    Thread-safe: the supervisor's thread and the test's thread both use it.
    """

    def __init__(self, s: Settings) -> None:
        self._settings = s
        self._lock = threading.RLock()
        self._ends, self._group = self._consumers()

    def _consumers(self) -> tuple[Consumer, Consumer]:
        s = self._settings
        ends = Consumer({"bootstrap.servers": s.kafka_bootstrap, "group.id": f"{s.namespace}.s20-probe"})
        group = Consumer(
            {
                "bootstrap.servers": s.kafka_bootstrap,
                "group.id": f"{s.namespace}.{s.app_id}.workers",
                "isolation.level": "read_uncommitted",
                "enable.auto.commit": False,
            }
        )
        return ends, group

    def renew(self) -> None:
        """Replace the consumers (after a failed query: a fresh client has no stale coordinator after a restart)."""
        with self._lock:
            self.close()
            self._ends, self._group = self._consumers()

    def ends(self, short: str) -> list[int]:
        """The end offsets (high watermarks) of a topic's partitions."""
        topic = self._settings.topic(short)
        with self._lock:
            return [
                self._ends.get_watermark_offsets(TopicPartition(topic, p), timeout=PROBE_TIMEOUT_S, cached=False)[1]
                for p in range(PARTITIONS)
            ]

    def committed(self) -> list[int]:
        """The workers' committed inbox offsets (0 where none is committed yet)."""
        topic = self._settings.topic("inbox")
        with self._lock:
            tps = self._group.committed([TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=PROBE_TIMEOUT_S)
        return [max(tp.offset, 0) for tp in tps]

    def describe(self) -> str:
        """The offsets, for a failure message (a query that fails is named, not raised)."""
        try:
            return f"inbox ends {self.ends('inbox')}, workers committed {self.committed()}, receipts ends " + str(
                self.ends("receipts")
            )
        except KafkaException as exc:
            return f"offsets unknown ({exc.args[0]})"

    def close(self) -> None:
        """Close the consumers."""
        with self._lock:
            self._ends.close()
            self._group.close()


class _ProducerStats:
    """The client producer's last librdkafka statistics (``stats_cb``): its idempotence state and queue, for reports."""

    def __init__(self) -> None:
        self.last = "none yet"

    def __call__(self, stats: str) -> None:
        d = json.loads(stats)
        eos = d.get("eos", {})
        brokers = {name: b.get("state") for name, b in d.get("brokers", {}).items()}
        self.last = (
            f"idempotence {eos.get('idemp_state')} for {eos.get('idemp_stateage', 0) / 1e6:.1f} s, producer id "
            f"{eos.get('producer_id')} epoch {eos.get('producer_epoch')}, {d.get('msg_cnt')} records queued, "
            f"brokers {brokers}"
        )


class _Supervisor:
    """Keeps one ``settled worker`` child running, as a process supervisor would, and records every intervention.

    The worker must survive a broker restart (scenario 4, docs/design.md §3), and this test is about the client, so a
    worker that exits is started again at once, and one that is alive but owes decisions (inbox records past the
    workers' committed offset) and has committed none for ``WEDGED_S`` while the broker is up is killed and started
    again.

    Progress is the worker's own: its committed offsets moving, or nothing owed. A claim is not progress (a worker that
    loses the group and claims again and again without committing is stuck too), and neither is the client's silence
    a wedge: a worker idle with nothing owed is never restarted (that would not help a client whose proposals do not
    land; the test's promises report such a client).

    The ``WEDGED_S`` clock of a started worker starts at its first claim. Starting a Python process, joining the group
    and claiming three partitions (``init_transactions`` each) took 8-10 s here under two CPU hogs, and more in the
    loaded CI run of 2026-11-30. There the old rule (no receipt for 15 s) killed each restarted worker 15 s after it
    was started; each had logged its three claims and nothing after them, and any backlog it left undecided went,
    grown, to the next: ten restarts and no receipt for 150 s. One that claims nothing within ``START_S`` is started
    again.

    Each intervention is recorded with the worker's log tail and the pipeline's offsets and reported by the test (a
    warning and its printed summary), never hidden.
    """

    def __init__(self, s: Settings, log: Path) -> None:
        self._settings = s
        self._log = log
        self.pipeline = _Pipeline(s)
        self._claimed_at: float | None = None  # the last claim the current worker logged
        self._log_pos = 0  # where the current worker's log lines start in the shared log file
        self._log_rest = b""  # a last log line not yet complete
        self.proc = self._spawn()
        self.incidents: list[str] = []
        self._spawned_at = time.monotonic()
        self._last_answer = time.monotonic()
        self._last_progress = time.monotonic()
        self._committed: list[int] | None = None
        self._broker_up_since: float | None = time.monotonic()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="s20-supervisor", daemon=True)
        self._thread.start()

    def _spawn(self) -> WorkerProcess:
        self._log_pos = self._log.stat().st_size if self._log.exists() else 0
        self._log_rest = b""
        self._claimed_at = None
        return spawn_worker(
            self._settings, self._log, failpoint_env={"PYTHONFAULTHANDLER": "1"}, worker_id="s20-worker"
        )

    def answered(self) -> None:
        """A receipt came: the worker is alive and deciding (progress, as a committed offset moving is)."""
        with self._lock:
            self._last_answer = time.monotonic()

    def broker_down(self) -> None:
        """The broker is being stopped: no answer is expected until `broker_up`."""
        with self._lock:
            self._broker_up_since = None

    def broker_up(self) -> None:
        """The broker answers again."""
        with self._lock:
            self._broker_up_since = time.monotonic()

    def _respawn(self, what: str) -> None:
        with self._lock:
            up = self._broker_up_since is not None
        offsets = self.pipeline.describe() if up else "broker down"
        self.incidents.append(f"{what}; started it again ({offsets}). Its log ends:\n{_tail(self._log, 40)}")
        self.proc = self._spawn()
        with self._lock:
            self._spawned_at = time.monotonic()

    def _note_claims(self) -> None:
        """Read the current worker's new log lines: its first ``partition claimed`` line starts its clock."""
        with self._log.open("rb") as log:
            log.seek(self._log_pos)
            chunk = log.read()
        self._log_pos += len(chunk)
        lines = (self._log_rest + chunk).split(b"\n")
        self._log_rest = lines.pop()
        if any(b'"message": "partition claimed"' in line for line in lines):
            with self._lock:
                if self._claimed_at is None:
                    self._claimed_at = time.monotonic()

    def _owes_decisions(self) -> bool | None:
        """Probe the offsets: whether the worker owes decisions, noting its progress (``None``: the probe failed)."""
        try:
            committed = self.pipeline.committed()
            ends = self.pipeline.ends("inbox")
        except KafkaException:
            self.pipeline.renew()
            return None  # unknown: no restart on a guess (the worker's own turn watchdog still ends a stuck turn)
        owes = any(c < e for c, e in zip(committed, ends, strict=True))
        with self._lock:
            if not owes or committed != self._committed:
                self._last_progress = time.monotonic()
            self._committed = committed
        return owes

    def _watch(self) -> None:
        while not self._stop.wait(0.5):
            code = self.proc.poll()
            if code is not None:
                self._respawn(f"the worker exited with {code}")
                continue
            self._note_claims()
            with self._lock:
                since = self._broker_up_since
            if since is None or not self._owes_decisions():
                continue
            with self._lock:
                now = time.monotonic()
                if self._claimed_at is None:  # still starting: joining the group, claiming
                    stalled_s, bound_s = now - max(self._spawned_at, since), START_S
                else:
                    started = max(self._last_progress, self._last_answer, self._claimed_at, since)
                    stalled_s, bound_s = now - started, WEDGED_S
            if stalled_s > bound_s:
                # SIGABRT first: the worker runs with PYTHONFAULTHANDLER=1, so its threads' stacks go to its log.
                self.proc.send_signal(signal.SIGABRT)
                try:
                    self.proc.wait(10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(10)
                doing = "claimed no partition" if bound_s == START_S else "owed inbox records and committed none"
                self._respawn(
                    f"the worker {doing} for {stalled_s:.0f} s with the broker up (SIGABRT: its main thread's stack "
                    "follows)"
                )

    def stop(self) -> int:
        """Stop watching, then stop the worker (SIGTERM, SIGKILL after 30 s); return its exit code."""
        self._stop.set()
        self._thread.join(10)
        self.pipeline.close()
        code = stop_worker(self.proc)
        if code != 0:
            self.incidents.append(f"the worker exited with {code} on SIGTERM. Its log ends:\n{_tail(self._log, 25)}")
        return code


class _Load:
    """The 1,000 calls from ``THREADS`` threads, and what each thread is waiting for now (for the hang check)."""

    def __init__(self, client: Client, conversations: list[str], supervisor: _Supervisor) -> None:
        self._client = client
        self._conversations = conversations
        self._supervisor = supervisor
        self._lock = threading.Lock()
        self.calls: list[Call] = []
        self.in_flight: dict[int, tuple[str, float]] = {}
        self.ended = threading.Event()

    def _work(self, t: int, on_call: Callable[[int], None]) -> None:
        for i in range(CALLS_PER_THREAD):
            conversation = self._conversations[(t + i) % CONVERSATIONS]
            key = f"s20-t{t:02d}-{i:02d}"
            payload = {"thread": t, "call": i}
            started = time.monotonic()
            with self._lock:
                self.in_flight[t] = (key, started)
            receipt: Receipt | None = None
            error: Exception | None = None
            try:
                receipt = self._client.submit(conversation, payload, idempotency_key=key, timeout_s=TIMEOUT_S)
                self._supervisor.answered()
            except Exception as exc:  # noqa: BLE001 - every ending is recorded and judged by the test
                error = exc
            call = Call(key, conversation, payload, started, time.monotonic() - started, receipt, error)
            with self._lock:
                del self.in_flight[t]
                self.calls.append(call)
                done = len(self.calls)
            on_call(done)
            time.sleep(PACE_S)

    def run(self, on_call: Callable[[int], None]) -> list[str]:
        """Make the calls; return the calls still in ``submit()`` well past their deadline (empty: none hangs).

        Each thread's total time is bounded by ``CALLS_PER_THREAD`` deadlines plus slack and pacing; a call still in
        ``submit()`` ``HANG_S`` after it was made ends the wait at once.
        """
        threads = [
            threading.Thread(target=self._work, args=(t, on_call), name=f"s20-load-{t}", daemon=True)
            for t in range(THREADS)
        ]
        bound = time.monotonic() + CALLS_PER_THREAD * (TIMEOUT_S + SLACK_S + PACE_S)
        for thread in threads:
            thread.start()
        while any(t.is_alive() for t in threads):
            now = time.monotonic()
            with self._lock:
                stuck = [f"{key} ({now - at:.0f} s)" for key, at in self.in_flight.values() if now - at > HANG_S]
            if stuck or now > bound:
                return stuck or [t.name for t in threads if t.is_alive()]
            time.sleep(0.25)
        return []


def _where_calls_stopped(s: Settings, calls: list[Call]) -> str:
    """For calls that got no receipt: how many proposals reached the inbox, and how many got a receipt written.

    Tells a client producer that delivered nothing, a worker that decided nothing and a receipts reader that read
    nothing apart (the receipt's ``request_id`` is the proposal's submission id).
    """
    ids = {c.error.submission_id for c in calls if isinstance(c.error, SubmissionOutcomeUnknownError)}
    try:
        landed = {
            rec.submission_id
            for rec in (CODEC.decode(r.value) for r in read_topic(s, "inbox", 30))
            if isinstance(rec, SubmissionProposed)
        }
        answered = {
            rec.request_id
            for rec in (CODEC.decode(r.value) for r in read_topic(s, "receipts", 30))
            if isinstance(rec, Receipt)
        }
    except KafkaException as exc:
        return f"the inbox and receipts could not be read ({exc.args[0]})"
    return (
        f"of their {len(ids)} timed-out proposals {len(ids & landed)} reached the inbox and {len(ids & answered)} "
        "got a receipt written"
    )


@pytest.mark.parametrize("fatal", [False, True], ids=["restart", "restart-with-fatal-producer-error"])
def test_submits_across_a_broker_restart_end_in_receipts_or_named_timeouts_and_admit_every_key_once(
    private_broker: Callable[..., KafkaBroker], namespace: str, tmp_path: Path, fatal: bool
) -> None:
    broker = private_broker()
    broker.start()
    s = Settings(namespace=namespace, kafka_bootstrap=broker.bootstrap, partitions=PARTITIONS)
    _provision(s)
    conversations = [f"s20-conv-{c:02d}" for c in range(CONVERSATIONS)]
    supervisor = _Supervisor(s, tmp_path / "worker.log")
    client_id = f"s20-{namespace}"
    restart: dict[str, float] = {}
    restart_trigger = threading.Event()

    def on_call(done: int) -> None:
        if done >= RESTART_AFTER_CALLS:
            restart_trigger.set()

    producer_stats = _ProducerStats()
    overrides = {"client.id": client_id, "statistics.interval.ms": 1000, "stats_cb": producer_stats}
    try:
        with Client(
            s, principal=PRINCIPAL, delivery_timeout_s=DELIVERY_TIMEOUT_S, producer_overrides=overrides
        ) as client:
            warm_up = client.submit("s20-warm-up", "warm-up", idempotency_key="warm-up", timeout_s=90)
            assert warm_up.outcome is ReceiptOutcome.ADMITTED

            restart_errors: list[BaseException] = []

            def restarter() -> None:
                try:
                    restart_trigger.wait(120)
                    supervisor.broker_down()
                    restart["stopping"] = time.monotonic()
                    broker.stop()
                    restart["down"] = time.monotonic()
                    time.sleep(OUTAGE_S)
                    if fatal:
                        _raise_fatal_error(client, client_id)
                        restart["fatal"] = time.monotonic()
                    _start(broker)
                    restart["up"] = time.monotonic()
                    supervisor.broker_up()
                except BaseException as exc:  # noqa: BLE001 - re-raised in the test thread
                    restart_errors.append(exc)

            restart_thread = threading.Thread(target=restarter, name="s20-restarter", daemon=True)
            restart_thread.start()
            load = _Load(client, conversations, supervisor)
            load_started = time.monotonic()
            hung = load.run(on_call)
            load_s = time.monotonic() - load_started
            calls = list(load.calls)
            restart_thread.join(120)
            assert not restart_thread.is_alive(), "the broker restart did not finish"
            if restart_errors:
                raise restart_errors[0]
            replacements_after_load = client.producer_replacements

            # ---- every call ended in time, with a receipt or a timeout naming its key
            promise(PROMISE, not hung, f"calls still in submit() {HANG_S:g} s after they were made: {hung}")
            promise(PROMISE, len(calls) == THREADS * CALLS_PER_THREAD, f"{len(calls)} calls ended, not 1,000")
            slow = [(c.key, round(c.elapsed_s, 2)) for c in calls if c.elapsed_s > TIMEOUT_S + SLACK_S]
            promise(PROMISE, not slow, f"calls overran their {TIMEOUT_S:g} s deadline by over {SLACK_S:g} s: {slow}")
            other = [
                (c.key, repr(c.error))
                for c in calls
                if c.error and not isinstance(c.error, SubmissionOutcomeUnknownError)
            ]
            promise(
                PROMISE, not other, f"calls ended with neither a receipt nor SubmissionOutcomeUnknownError: {other[:5]}"
            )
            timed_out = {c.key: c for c in calls if isinstance(c.error, SubmissionOutcomeUnknownError)}
            unnamed = [
                c.key
                for c in timed_out.values()
                if not isinstance(c.error, SubmissionOutcomeUnknownError)
                or c.error.idempotency_key != c.key
                or repr(c.key) not in str(c.error)
                or c.error.conversation_id != c.conversation
            ]
            promise(PROMISE, not unnamed, f"timeouts that do not name their key and conversation: {unnamed[:5]}")
            wrong = [
                (c.key, c.receipt.outcome.value)
                for c in calls
                if c.receipt is not None
                and c.receipt.outcome not in (ReceiptOutcome.ADMITTED, ReceiptOutcome.DUPLICATE)
            ]
            promise(PROMISE, not wrong, f"receipts neither admitted nor duplicate: {wrong[:5]}")
            # The outage really hit the load, and calls made after the broker came back got receipts again.
            assert timed_out, "no call timed out: the outage missed the load"
            after = [c for c in calls if c.started > restart["up"]]
            recovered = any(c.receipt is not None for c in after)
            # Where the calls stopped is read only when they did (it reads the whole inbox and receipts topics).
            stopped = "" if recovered else f"{_where_calls_stopped(s, after)}; {supervisor.pipeline.describe()}; "
            promise(
                PROMISE,
                recovered,
                f"none of the {len(after)} calls made after the broker came back got a receipt: {stopped}client "
                f"producer: {producer_stats.last}; producer replacements {replacements_after_load}; worker incidents "
                f"{supervisor.incidents}",
            )
            if fatal:
                # A fatal error replaces the shared producer; later calls do not all fail.
                promise(PROMISE, replacements_after_load >= 1, "the fatal error did not replace the shared producer")
                promise(
                    PROMISE,
                    any(c.receipt is not None for c in calls if c.started > restart["fatal"]),
                    "no call made after the fatal producer error got a receipt",
                )

            # ---- every timed-out key submitted again with the same payload returns a receipt
            def again(call: Call) -> tuple[Call, Receipt | Exception]:
                try:
                    receipt = client.submit(
                        call.conversation, call.payload, idempotency_key=call.key, timeout_s=RESUBMIT_TIMEOUT_S
                    )
                except Exception as exc:  # noqa: BLE001 - judged below
                    return call, exc
                supervisor.answered()
                return call, receipt

            with ThreadPoolExecutor(THREADS) as pool:
                resubmitted = list(pool.map(again, timed_out.values()))
            replacements = client.producer_replacements
    finally:
        supervisor.stop()

    failed = [(c.key, repr(r)) for c, r in resubmitted if not isinstance(r, Receipt)]
    promise(PROMISE, not failed, f"timed-out keys submitted again did not get a receipt: {failed[:5]}")
    inbox = [CODEC.decode(r.value) for r in read_topic(s, "inbox", 60)]
    landed = {rec.submission_id for rec in inbox if isinstance(rec, SubmissionProposed)}
    answers: Counter[str] = Counter()
    for call, receipt in resubmitted:
        assert isinstance(receipt, Receipt) and isinstance(call.error, SubmissionOutcomeUnknownError)
        first = call.error.submission_id
        if first in landed:
            answers["duplicate"] += 1
            ok = receipt.outcome is ReceiptOutcome.DUPLICATE and receipt.original_submission_id == first
        else:
            answers["admitted"] += 1
            ok = receipt.outcome is ReceiptOutcome.ADMITTED and receipt.request_id != first
        promise(
            PROMISE,
            ok,
            f"key {call.key}: its timed-out proposal {first} {'reached' if first in landed else 'never reached'} the "
            f"inbox, but submitting it again returned {receipt.outcome.value} (original "
            f"{receipt.original_submission_id})",
        )

    # The outage outlasts DELIVERY_TIMEOUT_S, so both answers occur (the module docstring).
    assert answers["duplicate"] and answers["admitted"], f"only one kind of answer to the second submits: {answers}"

    # ---- the log: 1,000 admissions, one per key, each conversation's sequence 1..n without gaps
    admitted = [
        e
        for _, _, batch in log_batches(s)
        for e in batch.events
        if isinstance(e, SubmissionAdmitted) and e.conversation_id in conversations
    ]
    per_key = Counter(e.idempotency_key for e in admitted)
    keys = {c.key for c in calls}
    promise(
        PROMISE,
        len(admitted) == THREADS * CALLS_PER_THREAD and set(per_key) == keys and set(per_key.values()) == {1},
        f"{len(admitted)} admissions for {len(keys)} keys; admitted twice "
        f"{sorted(k for k, n in per_key.items() if n > 1)[:5]}, never {sorted(keys - set(per_key))[:5]}",
    )
    seqs: dict[str, list[int]] = defaultdict(list)
    for e in admitted:
        seqs[e.conversation_id].append(e.submission_seq)
    gaps = {conv: sorted(got) for conv, got in seqs.items() if sorted(got) != list(range(1, len(got) + 1))}
    promise(PROMISE, not gaps, f"conversations whose submission sequence is not 1..n: {dict(list(gaps.items())[:3])}")
    promise(PROMISE, set(seqs) == set(conversations), f"conversations never admitted: {set(conversations) - set(seqs)}")
    # Every receipt the client returned names the admission the log holds for its key.
    by_key = {e.idempotency_key: e for e in admitted}
    final: dict[str, Receipt] = {c.key: c.receipt for c in calls if c.receipt is not None}
    final.update({c.key: r for c, r in resubmitted if isinstance(r, Receipt)})
    disagree = [
        k
        for k, r in final.items()
        if (r.original_submission_id or r.request_id, r.submission_seq)
        != (by_key[k].submission_id, by_key[k].submission_seq)
    ]
    promise(PROMISE, not disagree, f"receipts that disagree with the log's admission of their key: {disagree[:5]}")

    print(
        f"scenario 20 ({'with' if fatal else 'without'} an injected fatal error): load {load_s:.1f} s; broker down "
        f"{restart['up'] - restart['down']:.1f} s (stop took {restart['down'] - restart['stopping']:.1f} s); "
        f"{len(calls) - len(timed_out)} receipts, {len(timed_out)} timeouts (slowest call "
        f"{max(c.elapsed_s for c in calls):.2f} s); submitted again: {dict(answers)}; producer replacements "
        f"{replacements}; worker incidents {len(supervisor.incidents)}"
    )
    if supervisor.incidents:
        # The worker's own promise (scenario 4: it survives a broker restart) is not this test's; say what happened.
        warnings.warn(
            "scenario 20: the worker needed a supervisor across the broker restart:\n"
            + "\n".join(supervisor.incidents),
            stacklevel=1,
        )
