"""Scenario 20 (ADM): 1,000 ``submit()`` calls through one client's shared idempotent producer across a broker restart.

One process — one `settled.client.Client`, so one shared idempotent inbox producer and one shared receipts reader —
makes 1,000 ``submit()`` calls from 20 threads over 50 conversations while the test stops the (private) broker and
starts it again. A real ``settled worker`` child process (the ledger decider and the echo agent) runs against that
broker throughout. The scenario's expectations (issue 5; ``/work/shared/scenarios.md`` scenario 20; DESIGN.md §4):

* every call ends — within its deadline, none hangs — with a receipt or a `SubmissionOutcomeUnknown` naming its
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

The worker is watched by a supervisor (`_Supervisor`): a worker that exits, or answers nothing for ``WEDGED_S`` with
the broker up, is started again and the incident is reported (a pytest warning and the printed summary). Surviving the
restart is the worker's own promise (scenario 4); at the time of writing a ~20 s outage can make it exit 1
(``init_transactions`` timing out in the appender's outcome-unknown path) or stop answering, so this test — about the
client — keeps the system running the way a process supervisor would and still demands exactly-once admission.
"""

from __future__ import annotations

import ctypes
import glob
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
from confluent_kafka import KafkaError, KafkaException

from settled._settings import Settings
from settled.client import Client, SubmissionOutcomeUnknown
from settled.producers import provision_topics
from settled.schemas import Receipt, ReceiptOutcome, SubmissionAdmitted, SubmissionProposed
from settled.services._devstack import KafkaBroker, StackError
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
WEDGED_S = 15.0  # a worker that answers nothing this long with the broker up is killed and started again
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
    """The last lines of a worker's log, without librdkafka's own ``%N|...`` lines."""
    text = log.read_text(encoding="utf-8", errors="replace").splitlines() if log.exists() else []
    return "\n".join([line for line in text if not line.startswith("%")][-lines:])


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


class _Supervisor:
    """Keeps one ``settled worker`` child running, as a process supervisor would, and records every intervention.

    The worker must survive a broker restart (scenario 4, DESIGN.md §3), and this test is about the client, so a worker
    that exits is started again at once, and one that is alive but has answered nothing for ``WEDGED_S`` while the
    broker is up is killed and started again. Each intervention is recorded with the worker's log tail and reported
    by the test (a warning and its printed summary), never hidden.
    """

    def __init__(self, s: Settings, log: Path) -> None:
        self._settings = s
        self._log = log
        self.proc = self._spawn()
        self.incidents: list[str] = []
        self._spawned_at = time.monotonic()
        self._last_answer = time.monotonic()
        self._broker_up_since: float | None = time.monotonic()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="s20-supervisor", daemon=True)
        self._thread.start()

    def _spawn(self) -> subprocess.Popen[bytes]:
        return spawn_worker(
            self._settings, self._log, failpoint_env={"PYTHONFAULTHANDLER": "1"}, worker_id="s20-worker"
        )

    def answered(self) -> None:
        """A receipt came: the worker is alive and deciding."""
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
        self.incidents.append(f"{what}; started it again. Its log ends:\n{_tail(self._log, 60)}")
        self.proc = self._spawn()
        with self._lock:
            self._spawned_at = time.monotonic()

    def _watch(self) -> None:
        while not self._stop.wait(0.5):
            code = self.proc.poll()
            if code is not None:
                self._respawn(f"the worker exited with {code}")
                continue
            with self._lock:
                since = self._broker_up_since
                quiet_s = time.monotonic() - max(self._last_answer, self._spawned_at, since or 0.0)
            if since is not None and quiet_s > WEDGED_S:
                # SIGABRT first: the worker runs with PYTHONFAULTHANDLER=1, so its threads' stacks go to its log.
                self.proc.send_signal(signal.SIGABRT)
                try:
                    self.proc.wait(10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(10)
                self._respawn(
                    f"the worker answered nothing for {quiet_s:.0f} s with the broker up (SIGABRT: its stacks follow)"
                )

    def stop(self) -> int:
        """Stop watching, then stop the worker (SIGTERM, SIGKILL after 30 s); return its exit code."""
        self._stop.set()
        self._thread.join(10)
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

    try:
        with Client(
            s, principal=PRINCIPAL, delivery_timeout_s=DELIVERY_TIMEOUT_S, producer_overrides={"client.id": client_id}
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
                (c.key, repr(c.error)) for c in calls if c.error and not isinstance(c.error, SubmissionOutcomeUnknown)
            ]
            promise(PROMISE, not other, f"calls ended with neither a receipt nor SubmissionOutcomeUnknown: {other[:5]}")
            timed_out = {c.key: c for c in calls if isinstance(c.error, SubmissionOutcomeUnknown)}
            unnamed = [
                c.key
                for c in timed_out.values()
                if not isinstance(c.error, SubmissionOutcomeUnknown)
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
            promise(
                PROMISE,
                any(c.receipt is not None for c in after),
                f"none of the {len(after)} calls made after the broker came back got a receipt (producer "
                f"replacements {replacements_after_load}; worker incidents {supervisor.incidents})",
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
        assert isinstance(receipt, Receipt) and isinstance(call.error, SubmissionOutcomeUnknown)
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
