"""Admission under load and the admission scenarios (issue 5: DUR-001, 002, 004; scenarios 18, 19, 22).

Against the real broker: the load of `tests.integration.admission_load` through one in-process worker; a
submission produced by a plain confluent-kafka + fastavro producer (no settled import) admitted and settled, and a
misrouted one rejected; one key twice in one open transaction; scenarios 18, 19 and 22 with real worker processes
(``python -m settled.services worker``) killed or paused at failpoints.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

from settled import _failpoints
from settled._settings import Settings
from settled.client import Client, SubmissionOutcomeUnknownError
from settled.processors import Worker, WorkerConfig
from settled.producers import BATCH_ID_HEADER, partition_for_key, producer_config, provision_topics
from settled.projections import ProjectionNames, ProjectionReader, rebuild
from settled.protocol import PartitionState
from settled.runtime import App
from settled.schemas import (
    OwnershipClaimed,
    Receipt,
    ReceiptOutcome,
    SettlementOutcome,
    SubmissionAdmitted,
    SubmissionDuplicate,
    SubmissionProposed,
)
from settled.services._worker_service import build_worker
from settled.testing.echo import EchoAgent
from tests._promise import promise
from tests.integration.admission_load import (
    check_load,
    committed_input_offset,
    keys_admitted_once,
    log_batches,
    log_tail,
    make_load,
    make_proposal,
    produce_load,
    progress,
    receipts,
    settlements,
    spawn_worker,
    stop_worker,
)
from tests.integration.helpers import (
    CODEC,
    LiveProjector,
    check_clean,
    fresh_projection,
    produce_inbox,
    projecting,
    wait_projected,
)

pytestmark = pytest.mark.integration

PLAIN_PRODUCER = Path(__file__).with_name("plain_avro_producer.py")


def _topics(settings: Settings, partitions: int) -> Settings:
    s = settings.model_copy(update={"partitions": partitions})
    provision_topics(s, CODEC, datetime.now(UTC))
    return s


@pytest.fixture
def three(settings: Settings) -> Settings:
    """Topics of 3 partitions."""
    return _topics(settings, 3)


@pytest.fixture
def one(settings: Settings) -> Settings:
    """Topics of 1 partition."""
    return _topics(settings, 1)


@contextmanager
def in_process(worker: Worker[PartitionState]) -> Iterator[list[BaseException]]:
    """Run ``worker`` in a thread; yield the list its error lands in (checked by the caller after its promises).

    Unlike ``helpers.running`` this does not raise the worker's error at exit, so a test states its promises first
    and a fault switch is reported by the promise it breaks.
    """
    errors: list[BaseException] = []

    def target() -> None:
        try:
            worker.run()
        except BaseException as exc:  # noqa: BLE001 - handed to the test through `errors`
            errors.append(exc)

    t = threading.Thread(target=target, daemon=True)
    t.start()
    try:
        yield errors
    finally:
        worker.stop()
        t.join(60)


def wait_until(predicate: Callable[[], bool], timeout_s: float, errors: list[BaseException] | None = None) -> bool:
    """Poll ``predicate`` until true, ``timeout_s`` passes, or the worker failed; return the last value."""
    deadline = time.monotonic() + timeout_s
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline or errors:
            return False
        time.sleep(0.5)


def reached(got: tuple[int, ...], want: tuple[int, ...]) -> bool:
    """Whether every count in ``got`` is at least its counterpart in ``want``."""
    return all(g >= w for g, w in zip(got, want, strict=True))


# -- 1. load --------------------------------------------------------------------------------------------------------


def test_load_admits_every_key_once_and_settles_in_admitted_order(three: Settings) -> None:
    """1,000 proposals over 50 conversations: originals, duplicates (some in one poll batch), re-sends, conflicts."""
    s = three
    seed = int(os.environ.get("SETTLED_TEST_SEED", time.time_ns() % 1_000_000))
    print(f"load seed {seed} (SETTLED_TEST_SEED={seed} replays the load)")
    load = make_load(seed, conversations=50, total=1000, duplicates=120, resends=30, conflicts=80, adjacent=40)
    produce_load(s, load)  # all before the worker starts: its first polls carry originals and their duplicates
    originals = load.count["original"]
    worker = build_worker(s, App(agent=EchoAgent(delay_s=0.0)))
    with in_process(worker) as errors:
        done = wait_until(lambda: reached(progress(s), (len(load.items), originals)), 50, errors)
    print(f"done={done} progress={progress(s)} of {(len(load.items), originals)}")
    if errors:
        print(f"the worker failed (the promises below say what it broke): {errors[0]!r}")
    ok, detail = keys_admitted_once(s, load)
    promise("DUR-001.key-once", ok, detail)  # every distinct key admitted once: the fault switch's promise
    check_load(s, load)
    assert not errors, f"the worker failed: {errors[0]!r}"


# -- 3. a plain Avro producer; a misrouted record -------------------------------------------------------------------


def plain_argv(
    s: Settings, conversation: str, key: str, value: Any, *, wait_stdin: bool = False, **opts: str
) -> list[str]:
    """The command line of `plain_avro_producer.py` (options as keyword arguments, ``_`` for ``-``)."""
    argv = [sys.executable, str(PLAIN_PRODUCER), "--bootstrap", s.kafka_bootstrap, "--topic", s.topic("inbox")]
    argv += ["--conversation", conversation, "--key", key, "--input-json", json.dumps(value)]
    for name, v in opts.items():
        argv += [f"--{name.replace('_', '-')}", v]
    return [*argv, "--wait-stdin"] if wait_stdin else argv


def plain_produce(s: Settings, conversation: str, key: str, value: Any, **opts: str) -> dict[str, Any]:
    """Produce a proposal with `plain_avro_producer.py` in a fresh interpreter (no settled import); where it landed."""
    done = subprocess.run(plain_argv(s, conversation, key, value, **opts), capture_output=True, timeout=60, cwd="/")
    assert done.returncode == 0, f"plain producer exited {done.returncode}: {done.stderr.decode()[-2000:]}"
    landed: dict[str, Any] = json.loads(done.stdout.decode().strip().splitlines()[-1])
    return landed


def misplaced_conversation(partitions: int) -> tuple[str, int, int]:
    """A conversation id whose CRC32 (librdkafka's ``consistent_random``) and murmur2 partitions differ."""
    while True:
        conv = f"plain-{uuid.uuid4().hex[:8]}"
        crc, mm = zlib.crc32(conv.encode()) % partitions, partition_for_key(conv.encode(), partitions)
        if crc != mm:
            return conv, crc, mm


def test_a_plain_avro_producer_is_admitted_and_a_misrouted_record_is_rejected(three: Settings) -> None:
    s = three
    good_conv = f"plain-{uuid.uuid4().hex[:8]}"
    good = plain_produce(s, good_conv, "plain-k", {"hello": "from fastavro"})
    assert good["partition"] == partition_for_key(good_conv.encode(), 3)
    bad_conv, crc_partition, murmur_partition = misplaced_conversation(3)
    bad = plain_produce(s, bad_conv, "plain-k", {"hello": "misrouted"}, partitioner="consistent_random")
    assert bad["partition"] == crc_partition, f"consistent_random placed it on {bad['partition']}, not CRC32's"
    worker = build_worker(s, App(agent=EchoAgent(delay_s=0.0)))
    with in_process(worker) as errors:
        wait_until(lambda: reached(progress(s), (2, 1)), 30, errors)
    by_id = {r.request_id: r for r in receipts(s)}
    ok = by_id.get(good["submission_id"])
    promise("DUR-001.plain-avro", ok is not None and ok.outcome is ReceiptOutcome.ADMITTED, f"receipt {ok}")
    (settled,) = [r for r in settlements(s) if r.submission_id == good["submission_id"]]
    assert settled.outcome is SettlementOutcome.COMPLETED
    assert json.loads(settled.reply_json or "null")["echo"] == {"hello": "from fastavro"}
    rejected = by_id.get(bad["submission_id"])
    assert rejected is not None and rejected.outcome is ReceiptOutcome.REJECTED, f"receipt {rejected}"
    reason = rejected.reason or ""
    assert reason.startswith("misrouted"), reason
    assert f"partition {murmur_partition}" in reason and f"partition {crc_partition}" in reason, reason
    assert not [r for r in settlements(s) if r.submission_id == bad["submission_id"]]
    assert not errors, f"the worker failed: {errors[0]!r}"


# -- 4. one key twice in one open transaction ----------------------------------------------------------------------


def answers(s: Settings, request_ids: list[str]) -> dict[str, list[Receipt]]:
    """Committed receipts of ``request_ids``, each in offset order."""
    out: dict[str, list[Receipt]] = {r: [] for r in request_ids}
    for r in receipts(s):
        if r.request_id in out:
            out[r.request_id].append(r)
    return out


def wait_answered(
    s: Settings, request_ids: list[str], timeout_s: float, errors: list[BaseException] | None = None
) -> bool:
    """Wait until each request id has at least one committed receipt."""
    return wait_until(lambda: all(answers(s, request_ids).values()), timeout_s, errors)


def admissions_of(s: Settings, conversation: str) -> list[SubmissionAdmitted]:
    """The committed `SubmissionAdmitted` events of a conversation."""
    return [
        e
        for _, _, b in log_batches(s)
        if b.conversation_id == conversation
        for e in b.events
        if isinstance(e, SubmissionAdmitted)
    ]


def test_one_key_twice_in_one_open_transaction_is_admitted_once(one: Settings) -> None:
    """Both proposals in one poll batch: the second is answered from the pending overlay (docs/design.md §3)."""
    s = one
    a = make_proposal("conv-twice", "k", {"turn": 1})
    again = a.model_copy(update={"submission_id": str(uuid.uuid4())})
    produce_inbox(s, [(b"conv-twice", CODEC.encode(a)), (b"conv-twice", CODEC.encode(again))])
    worker = build_worker(s, App(agent=EchoAgent(delay_s=0.0)))
    with in_process(worker) as errors:
        wait_answered(s, [a.submission_id, again.submission_id], 30, errors)
    got = answers(s, [a.submission_id, again.submission_id])
    promise("DUR-001.one-txn", [r.outcome for r in got[a.submission_id]] == [ReceiptOutcome.ADMITTED], f"{got}")
    (dup,) = got[again.submission_id]
    promise(
        "DUR-001.one-txn",
        dup.outcome is ReceiptOutcome.DUPLICATE
        and dup.original_submission_id == a.submission_id
        and dup.submission_seq == 1,
        f"the second proposal's receipt: {dup}",
    )
    promise("DUR-001.one-txn", len(admissions_of(s, "conv-twice")) == 1, "admitted more than once")
    # Same transaction: the admission and the duplicate are adjacent log records (a commit marker would sit between
    # two transactions' records).
    placed = {
        type(e).__name__: offset
        for _, offset, b in log_batches(s)
        if b.conversation_id == "conv-twice"
        for e in b.events
        if isinstance(e, (SubmissionAdmitted, SubmissionDuplicate))
    }
    assert placed["SubmissionDuplicate"] == placed["SubmissionAdmitted"] + 1, f"not one transaction: {placed}"
    assert not errors, f"the worker failed: {errors[0]!r}"


# -- scenario 18 ---------------------------------------------------------------------------------------------------


@pytest.fixture
def projection(one: Settings) -> Iterator[tuple[ProjectionNames, LiveProjector]]:
    """A live projector of the test's log into a projection of its own, for the test's duration."""
    with fresh_projection(one.postgres_dsn) as names, projecting(one, names) as live:
        yield names, live


def test_scenario_18_retries_conflicts_and_key_scope(
    one: Settings, tmp_path: Path, projection: tuple[ProjectionNames, LiveProjector]
) -> None:
    """Retries at once, concurrently, after a full restart and after a projection rebuild get identical receipts;
    A' is a conflict naming k; A with k on another conversation, or from another principal, is admitted separately
    (scope principal + conversation, docs/design.md §4). The receipts read through the projection say the same
    (issue 7)."""
    s = one
    log = tmp_path / "worker.log"
    a = make_proposal("conv-18", "k-18", {"q": "A"})
    first = spawn_worker(s, log)
    try:
        produce_inbox(s, [(b"conv-18", CODEC.encode(a))])
        at_once = a.model_copy(update={"submission_id": str(uuid.uuid4())})
        produce_inbox(s, [(b"conv-18", CODEC.encode(at_once))])  # without waiting for A's receipt
        resent = a  # the very same record again (a producer retry)
        produce_inbox(s, [(b"conv-18", CODEC.encode(resent))])
        assert wait_answered(s, [a.submission_id, at_once.submission_id], 40), log_tail(log)
        concurrent = [a.model_copy(update={"submission_id": str(uuid.uuid4())}) for _ in range(2)]
        gate = threading.Barrier(len(concurrent))

        def send(p: SubmissionProposed) -> None:
            producer = Producer(producer_config(s))
            gate.wait(10)
            producer.produce(s.topic("inbox"), key=b"conv-18", value=CODEC.encode(p))
            assert producer.flush(30) == 0

        threads = [threading.Thread(target=send, args=(p,)) for p in concurrent]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert wait_answered(s, [p.submission_id for p in concurrent], 30), log_tail(log)
    finally:
        first.kill()  # a full restart: the next worker knows only the log
        first.wait(30)
    second = spawn_worker(s, log)
    try:
        after_restart = a.model_copy(update={"submission_id": str(uuid.uuid4())})
        conflict = make_proposal("conv-18", "k-18", {"q": "A-prime"})
        elsewhere = make_proposal("conv-18-other", "k-18", {"q": "A"})
        other_principal = make_proposal("conv-18", "k-18", {"q": "A"}, principal="someone-else")
        produce_inbox(
            s,
            [
                (p.conversation_id.encode(), CODEC.encode(p))
                for p in (after_restart, conflict, elsewhere, other_principal)
            ],
        )
        ids = [
            after_restart.submission_id,
            conflict.submission_id,
            elsewhere.submission_id,
            other_principal.submission_id,
        ]
        assert wait_answered(s, ids, 40), log_tail(log)
        # A projection rebuild (from offset 0, switched in while the projector runs), then A with k once more.
        names, live = projection
        wait_projected(s, names, 30, live)
        rebuilt = rebuild(s, names, timeout_s=60)
        assert rebuilt.generation == 2, rebuilt
        after_rebuild = a.model_copy(update={"submission_id": str(uuid.uuid4())})
        produce_inbox(s, [(b"conv-18", CODEC.encode(after_rebuild))])
        assert wait_answered(s, [after_rebuild.submission_id], 40), log_tail(log)
    finally:
        stop_worker(second)
    retries = [at_once, *concurrent, after_restart, after_rebuild]
    got = answers(s, [a.submission_id, *(p.submission_id for p in retries), *ids[1:]])
    original = got[a.submission_id][0]
    promise(
        "DUR-001.scenario-18",
        original.outcome is ReceiptOutcome.ADMITTED and original.submission_seq == 1,
        f"{original}",
    )
    promise(
        "DUR-001.scenario-18",
        [(r.outcome, r.original_submission_id, r.submission_seq) for r in got[a.submission_id][1:]]
        == [(ReceiptOutcome.DUPLICATE, a.submission_id, 1)],
        f"the re-sent record's receipt: {got[a.submission_id][1:]}",
    )
    for p in retries:
        shape = [
            (r.outcome, r.original_submission_id, r.submission_seq, r.conversation_id) for r in got[p.submission_id]
        ]
        promise(
            "DUR-001.scenario-18",
            shape == [(ReceiptOutcome.DUPLICATE, a.submission_id, 1, "conv-18")],
            f"retry {p.submission_id}: {shape}",
        )
    (rejected,) = got[conflict.submission_id]
    promise(
        "DUR-001.scenario-18",
        rejected.outcome is ReceiptOutcome.REJECTED
        and (rejected.reason or "").startswith("idempotency_conflict")
        and "'k-18'" in (rejected.reason or ""),
        f"A' with k: {rejected}",
    )
    (separately,) = got[elsewhere.submission_id]
    assert (separately.outcome, separately.submission_seq) == (ReceiptOutcome.ADMITTED, 1), separately
    (by_other,) = got[other_principal.submission_id]
    assert (by_other.outcome, by_other.submission_seq) == (ReceiptOutcome.ADMITTED, 2), by_other
    promise(
        "DUR-001.scenario-18",
        [e.submission_id for e in admissions_of(s, "conv-18")] == [a.submission_id, other_principal.submission_id],
        "conv-18's admissions",
    )

    # Read through the projection too (issue 7): the same answers, after the rebuild, and check is clean.
    wait_projected(s, names, 30, live)
    with ProjectionReader(s.postgres_dsn, names) as reader:
        projected = {
            p.submission_id: reader.receipt(p.submission_id, after=got[p.submission_id][0], timeout_s=30)
            for p in (a, *retries, conflict, elsewhere)
        }
        original_row = reader.submission(a.submission_id)
    shapes = {
        rid: None
        if row is None
        else (row["outcome"], row["submission_id"], row["submission_seq"], row["conversation_id"])
        for rid, row in projected.items()
    }
    promise(
        "DUR-001.scenario-18",
        shapes[a.submission_id] == ("admitted", a.submission_id, 1, "conv-18")
        and all(shapes[p.submission_id] == ("duplicate", a.submission_id, 1, "conv-18") for p in retries),
        f"projected receipts of A and its retries: {[shapes[p.submission_id] for p in (a, *retries)]}",
    )
    conflict_row = projected[conflict.submission_id]
    assert conflict_row is not None and conflict_row["outcome"] == "rejected", conflict_row
    assert "'k-18'" in (conflict_row["reason"] or ""), conflict_row
    assert shapes[elsewhere.submission_id] == ("admitted", elsewhere.submission_id, 1, "conv-18-other")
    assert original_row is not None and original_row["idempotency_key"] == "k-18", original_row
    check_clean(s, names, "DUR-015.scenario-18")


# -- scenario 19 ---------------------------------------------------------------------------------------------------


def set_topic_limit(s: Settings, short: str, max_message_bytes: int | None) -> None:
    """Set (or, with None, reset to the broker default) a topic's ``max.message.bytes``."""
    admin = AdminClient({"bootstrap.servers": s.kafka_bootstrap})
    op = AlterConfigOpType.SET if max_message_bytes is not None else AlterConfigOpType.DELETE
    entry = ConfigEntry("max.message.bytes", str(max_message_bytes or ""), incremental_operation=op)
    resource = ConfigResource(ConfigResource.Type.TOPIC, s.topic(short), incremental_configs=[entry])
    admin.incremental_alter_configs([resource])[resource].result(timeout=30)


def decisions_by_input(s: Settings) -> dict[int, list[str]]:
    """Inbox offset → the names of the canonical events that decided it (partition 0)."""
    out: dict[int, list[str]] = {}
    for _, _, b in log_batches(s):
        for e in b.events:
            ref = getattr(e, "input_ref", None)
            if ref is not None and ref.topic == s.topic("inbox"):
                out.setdefault(ref.offset, []).append(type(e).__name__)
    return out


@pytest.mark.parametrize("c2_fails", ["transiently", "for_good"])
def test_scenario_19_poison_neighbour_and_a_kill_before_its_retry_commits(
    one: Settings, tmp_path: Path, c2_fails: str
) -> None:
    """C1-C6 at inbox offsets 10-15 share a group-commit transaction; C2's admission is too large for the log (the
    limit is lowered after the worker read it, so the broker rejects it); the shared transaction aborts, each
    conversation is retried alone; the worker is SIGKILLed right after C1's transaction commits, before C2's retry.
    The committed input offset stops at 11; after a restart C2 is decided exactly once: admitted when the limit is
    back ("transiently"), rejected by the size check when it is not ("for_good")."""
    s = one
    log = tmp_path / "worker.log"
    control = _failpoints.FailpointControl(tmp_path / "fp")
    first = spawn_worker(s, log, failpoint_env=control.env())
    try:
        fillers = [make_proposal("conv-19-fill", f"f{i}", {"fill": i}) for i in range(10)]
        produce_inbox(s, [(b"conv-19-fill", CODEC.encode(p)) for p in fillers])  # inbox offsets 0-9
        assert wait_until(lambda: len(settlements(s)) >= 10, 40), log_tail(log)
        # The worker read the limits at start; from now on the broker refuses a log record over 64 KiB.
        set_topic_limit(s, "log", 65_536)
        time.sleep(1.0)  # nothing pending: the next commit is the C1-C6 group's
        control.arm("appender.after_commit", "1*kill")
        cs = [make_proposal(f"conv-19-c{i}", "k", {"c": i}) for i in range(1, 7)]
        cs[1] = make_proposal("conv-19-c2", "k", {"c": 2, "pad": "x" * 200_000})
        producer = Producer(producer_config(s, **{"linger.ms": 200, "message.max.bytes": 2_000_000}))
        for p in cs:  # one produce request, one fetch, one poll: one group-commit transaction
            producer.produce(s.topic("inbox"), key=p.conversation_id.encode(), value=CODEC.encode(p), partition=0)
        assert producer.flush(30) == 0
        assert first.wait(40) == -9, f"the worker was not killed after C1's commit:\n{log_tail(log)}"
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(30)
    assert "transaction aborted" in log.read_text(), "the shared transaction did not abort"
    decided = decisions_by_input(s)
    assert decided.get(10) == ["SubmissionAdmitted"], f"C1 (offset 10) not committed alone before the kill: {decided}"
    assert not any(o in decided for o in range(11, 16)), f"decided past C1 before the kill: {decided}"
    committed = committed_input_offset(s, 0)
    promise("DUR-002.input-offset", committed == 11, f"committed input offset {committed} while C2 (11) is undecided")

    if c2_fails == "transiently":
        set_topic_limit(s, "log", None)
    second = spawn_worker(s, log)
    try:
        ids = [p.submission_id for p in cs]
        assert wait_answered(s, ids, 40), log_tail(log)
        want_settled = 6 if c2_fails == "transiently" else 5
        assert wait_until(lambda: len(settlements(s)) >= 10 + want_settled, 40), log_tail(log)
    finally:
        stop_worker(second)
    decided = decisions_by_input(s)
    c2_event = "SubmissionAdmitted" if c2_fails == "transiently" else "SubmissionRejected"
    want = {10: ["SubmissionAdmitted"], 11: [c2_event], **{o: ["SubmissionAdmitted"] for o in range(12, 16)}}
    promise(
        "DUR-002.no-lost-input",
        {o: decided.get(o) for o in range(10, 16)} == want,
        f"C1-C6 not decided exactly once each: {[(o, decided.get(o)) for o in range(10, 16)]}",
    )
    got = answers(s, [p.submission_id for p in cs])
    assert all(len(rs) == 1 for rs in got.values()), f"not one receipt each: {got}"
    c2 = got[cs[1].submission_id][0]
    if c2_fails == "transiently":
        assert c2.outcome is ReceiptOutcome.ADMITTED, c2
    else:
        assert c2.outcome is ReceiptOutcome.REJECTED and "exceeds the limit" in (c2.reason or ""), c2
    assert committed_input_offset(s, 0) == 16


# -- scenario 22 ---------------------------------------------------------------------------------------------------


def uncommitted_log_batch_ids(s: Settings) -> list[str]:
    """Batch ids of every record on ``settled.log[0]``, committed or not (read_uncommitted)."""
    c = Consumer({"bootstrap.servers": s.kafka_bootstrap, "group.id": "x", "isolation.level": "read_uncommitted"})
    try:
        tp = TopicPartition(s.topic("log"), 0)
        end = c.get_watermark_offsets(tp, timeout=10)[1]
        c.assign([TopicPartition(s.topic("log"), 0, 0)])
        ids: list[str] = []
        seen = 0
        while seen < end:
            m = c.poll(2.0)
            if m is None:
                break
            seen = (m.offset() or 0) + 1
            ids += [v.decode() for k, v in (m.headers() or []) if k == BATCH_ID_HEADER and v is not None]
        return ids
    finally:
        c.close()


def claims(s: Settings) -> int:
    """How many committed `OwnershipClaimed` the log holds."""
    return sum(isinstance(e, OwnershipClaimed) for _, _, b in log_batches(s) for e in b.events)


def check_one_admission(s: Settings, a: SubmissionProposed, copies: list[str]) -> None:
    """Scenario 22's expectations: one ``SubmissionAdmitted`` for A's key; every copy answered ``duplicate`` pointing
    at A and its sequence; no duplicate receipt committed before the admission's."""
    admitted = [e for e in admissions_of(s, a.conversation_id) if e.idempotency_key == a.idempotency_key]
    promise("DUR-001.scenario-22", [e.submission_id for e in admitted] == [a.submission_id], f"admitted {admitted}")
    got = answers(s, [a.submission_id, *copies])
    promise(
        "DUR-001.scenario-22",
        [(r.outcome, r.submission_seq) for r in got[a.submission_id]] == [(ReceiptOutcome.ADMITTED, 1)],
        f"A's receipts {got[a.submission_id]}",
    )
    for c in copies:
        shape = [(r.outcome, r.original_submission_id, r.submission_seq) for r in got[c]]
        promise(
            "DUR-001.scenario-22",
            shape == [(ReceiptOutcome.DUPLICATE, a.submission_id, 1)],
            f"copy {c} answered {shape}",
        )
    order = [r.request_id for r in receipts(s) if r.conversation_id == a.conversation_id]
    first_dup = min(order.index(c) for c in copies)
    promise(
        "DUR-001.scenario-22",
        order.index(a.submission_id) < first_dup,
        f"a duplicate receipt was committed before the admission's: {order}",
    )


def inbox_end(s: Settings) -> int:
    """The inbox partition 0's high watermark."""
    c = Consumer({"bootstrap.servers": s.kafka_bootstrap, "group.id": "x"})
    try:
        return int(c.get_watermark_offsets(TopicPartition(s.topic("inbox"), 0), timeout=10)[1])
    finally:
        c.close()


def delayed_commit_case(s: Settings, tmp_path: Path, hold_s: float, answer_timeout_s: float = 20.0) -> None:
    """Scenario 22, first run: A's admission transaction is held open at ``appender.before_commit`` past
    ``Client.submit()``'s timeout (it raises `SubmissionOutcomeUnknownError` naming the key); meanwhile A is retried at
    the same moment by the same client, by a second producer, and as raw Avro from another process. The commit is
    released ``hold_s`` after the copies are on the broker."""
    log = tmp_path / "worker.log"
    control = _failpoints.FailpointControl(tmp_path / "fp")
    worker = spawn_worker(s, log, failpoint_env=control.env())
    client = Client(s, principal="tester-22")
    # Everything that takes time to start is started first, so the transaction stays open for a short while only.
    raw_proc = subprocess.Popen(
        plain_argv(s, "conv-22", "k-22", {"q": "A"}, principal="tester-22", wait_stdin=True),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd="/",
    )
    try:
        assert raw_proc.stdout is not None and raw_proc.stdin is not None
        assert raw_proc.stdout.readline().strip() == b"ready", raw_proc.stderr.read() if raw_proc.stderr else ""
        other = Producer(producer_config(s))
        other.list_topics(s.topic("inbox"), timeout=30)
        warm = client.submit("conv-22-warm-up", {"warm": True}, timeout_s=30)  # the client's reader is running
        client.wait(warm, 30)
        time.sleep(0.3)  # idle: the next commit is A's
        control.arm("appender.before_commit", "1*pause(30s)")
        with pytest.raises(SubmissionOutcomeUnknownError) as timed_out:
            client.submit("conv-22", {"q": "A"}, idempotency_key="k-22", timeout_s=0.8)
        assert "'k-22'" in str(timed_out.value) and timed_out.value.idempotency_key == "k-22"
        a_id = timed_out.value.submission_id
        control.wait_reached("appender.before_commit", 30)
        held_at = time.monotonic()
        assert "conv-22:1" in uncommitted_log_batch_ids(s), "A's admission is not in the open transaction"
        assert not answers(s, [a_id])[a_id], "A answered while its transaction is open"
        a = make_proposal("conv-22", "k-22", {"q": "A"}, principal="tester-22")
        second = a.model_copy(update={"submission_id": str(uuid.uuid4())})
        before = inbox_end(s)
        retried: list[Receipt | Exception] = []

        def retry_from_the_same_client() -> None:
            try:
                retried.append(
                    client.submit("conv-22", {"q": "A"}, idempotency_key="k-22", timeout_s=hold_s + answer_timeout_s)
                )
            except Exception as exc:  # noqa: BLE001 - reported by the test thread below
                retried.append(exc)

        # The three copies at the same moment: the same client (blocks until its receipt), a second producer, and
        # raw Avro from another process.
        same_client = threading.Thread(target=retry_from_the_same_client)
        same_client.start()
        raw_proc.stdin.write(b"go\n")
        raw_proc.stdin.flush()
        other.produce(s.topic("inbox"), key=b"conv-22", value=CODEC.encode(second))
        assert other.flush(30) == 0
        out, err = raw_proc.communicate(timeout=30)
        assert raw_proc.returncode == 0, err.decode()[-2000:]
        raw = json.loads(out.decode().strip().splitlines()[-1])
        assert wait_until(lambda: inbox_end(s) >= before + 3, 10), "the copies are not all on the broker"
        assert not answers(s, [a_id])[a_id], "answered while the transaction is open"
        time.sleep(hold_s)
        held_s = time.monotonic() - held_at
        assert control.release("appender.before_commit") == 1
        print(f"A's admission transaction held open for {held_s:.2f} s at appender.before_commit")
        same_client.join(answer_timeout_s + 5)
        (receipt,) = retried
        assert isinstance(receipt, Receipt), f"the same client's retry: {receipt!r} (held {held_s:.2f} s)"
        copies = [receipt.request_id, second.submission_id, raw["submission_id"]]
        assert wait_answered(s, [a_id, *copies], answer_timeout_s), f"held {held_s:.2f} s\n{log_tail(log)}"
    finally:
        if raw_proc.poll() is None:
            raw_proc.kill()
            raw_proc.wait(10)
        client.close()
        stop_worker(worker)
    promise(
        "DUR-001.scenario-22",
        (receipt.outcome, receipt.original_submission_id, receipt.submission_seq)
        == (ReceiptOutcome.DUPLICATE, a_id, 1),
        f"the same client's retry returned {receipt}",
    )
    check_one_admission(s, a.model_copy(update={"submission_id": a_id}), copies)


def test_scenario_22_copies_sent_while_the_admission_commit_is_delayed(one: Settings, tmp_path: Path) -> None:
    """Held within ``transaction.timeout.ms``: the copies are answered as duplicates of the one admission."""
    delayed_commit_case(one, tmp_path, hold_s=0.0)


def test_scenario_22_admission_commit_held_past_the_transaction_timeout(one: Settings, tmp_path: Path) -> None:
    """Held past ``transaction.timeout.ms`` (2.5 s in tests): the coordinator aborts A's transaction; the worker
    must decide A and its copies again (one admission, duplicates) instead of dropping the partition for good."""
    delayed_commit_case(one, tmp_path, hold_s=one.transaction_timeout_ms / 1000 + 2.0, answer_timeout_s=10.0)


@pytest.mark.parametrize("how", ["neighbour_rejected_by_the_broker", "worker_killed_before_commit"])
def test_scenario_22_the_admission_transaction_aborts_once(
    one: Settings, tmp_path: Path, how: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A and its copies are decided in one poll batch (the copies answered from the pending overlay); the
    transaction holding them aborts once — a neighbour's record is refused by the broker (each conversation is then
    retried alone), or the worker is SIGKILLed before the commit. The copies' answers are redone with the admission."""
    s = one
    a = make_proposal("conv-22", "k-22", {"q": "A"})
    dup = a.model_copy(update={"submission_id": str(uuid.uuid4())})
    records = [(b"conv-22", CODEC.encode(a)), (b"conv-22", CODEC.encode(dup))]
    neighbour = make_proposal("conv-22-neighbour", "n", {"pad": "x" * 200_000})
    if how == "neighbour_rejected_by_the_broker":
        set_topic_limit(s, "log", 65_536)
        records.append((b"conv-22-neighbour", CODEC.encode(neighbour)))
    produce_inbox(s, records, **{"message.max.bytes": 2_000_000})
    raw = plain_produce(s, "conv-22", "k-22", {"q": "A"}, principal=a.principal)
    copies = [dup.submission_id, raw["submission_id"]]
    if how == "neighbour_rejected_by_the_broker":
        # The worker's record limit is set above the topic's, so the neighbour's admission reaches the broker.
        config = WorkerConfig(max_record_bytes=5_000_000)
        worker = build_worker(s, App(agent=EchoAgent(delay_s=0.0)), config=config)
        with caplog.at_level("INFO"), in_process(worker) as errors:
            wait_answered(s, [a.submission_id, *copies, neighbour.submission_id], 40, errors)
        assert not errors, f"the worker failed: {errors[0]!r}"
        assert "transaction aborted" in caplog.text and "batches replaced" in caplog.text
        (refused,) = answers(s, [neighbour.submission_id])[neighbour.submission_id]
        assert refused.outcome is ReceiptOutcome.REJECTED and "failed alone twice" in (refused.reason or ""), refused
    else:
        log = tmp_path / "worker.log"
        control = _failpoints.FailpointControl(tmp_path / "fp")
        # The 1st commit is the ownership claim; the 2nd holds A's admission and the copies' duplicates.
        first = spawn_worker(s, log, failpoint_env=control.env("appender.before_commit=2*kill"))
        assert first.wait(40) == -9, log_tail(log)
        assert "conv-22:1" in uncommitted_log_batch_ids(s), "A's admission was not in the killed transaction"
        assert receipts(s) == [] and admissions_of(s, "conv-22") == []
        second = spawn_worker(s, log)
        try:
            assert wait_answered(s, [a.submission_id, *copies], 40), log_tail(log)
        finally:
            stop_worker(second)
    check_one_admission(s, a, copies)
