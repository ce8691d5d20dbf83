"""Quarantine of bad inbox input through the real worker loop (issue 4 item 6; scenario 15 POISON).

One inbox partition interleaves healthy submissions with a corrupt record, an unknown single-object fingerprint, a
record over settled's payload limit and a zstd batch that decompresses past the consumer's
``receive.message.max.bytes``. Each is quarantined once with its offset and reason (``QuarantineRecord`` on
``settled.quarantine`` and ``InputQuarantined`` on the log, in the transaction that moves the group's inbox offset
past it); the healthy records around them are admitted; the worker keeps running. A worker killed while a bad
record is pending, or right after its quarantine committed, restarts and quarantines it exactly once; a crash exits
non-zero instead of looping.

Run as a child worker: ``python -m tests.integration.test_quarantine --namespace NS`` (environment:
SETTLED_KAFKA_BOOTSTRAP, failpoints through SETTLED_FAILPOINTS).
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource  # type: ignore[attr-defined]
from typer.testing import CliRunner

from settled._settings import Settings
from settled.processors import Worker, WorkerConfig
from settled.processors._batch_probe import failing_batch_last_offset, probe_consumer_config
from settled.producers import producer_config
from settled.schemas import (
    SINGLE_OBJECT_MAGIC,
    InputQuarantined,
    InputRef,
    LogBatch,
    QuarantineReason,
    QuarantineRecord,
    Receipt,
    ReceiptOutcome,
    SubmissionAdmitted,
    SubmissionProposed,
)
from settled.services.cli import app
from tests.harness.factories import proposal
from tests.integration.helpers import CODEC, produce_inbox, read_topic, running, wait_for
from tests.integration.txproc import QUARANTINE_RAW_BYTES, TxDecider, TxState

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]

#: The inbox accepts records up to 4 MB (raised from the broker's 1 MiB default) ...
INBOX_MAX_MESSAGE_BYTES = 4_000_000
#: ... settled's payload limit is far below it ...
MAX_INPUT_BYTES = 256 * 1024
#: ... and the consumer reads fetch responses (and decompressed batches) up to 6 MB.
FETCH_MAX_BYTES = 3_000_000
RECEIVE_MESSAGE_MAX_BYTES = 6_000_000
WORKER_CONFIG = WorkerConfig(
    max_input_bytes=MAX_INPUT_BYTES,
    fetch_max_bytes=FETCH_MAX_BYTES,
    receive_message_max_bytes=RECEIVE_MESSAGE_MAX_BYTES,
)
#: A zstd batch of 48 x 256 KiB zeros: ~13 MB decompressed, a few KB on the wire.
BOMB_RECORDS = 48
BOMB_RECORD_BYTES = 256 * 1024


# -- setup and producing ---------------------------------------------------------------------------------------


@pytest.fixture
def topics(topics: Settings) -> Settings:
    """The conftest's one-partition topics, the inbox's ``max.message.bytes`` lowered to the quarantine's bound."""
    s = topics
    admin = AdminClient({"bootstrap.servers": s.kafka_bootstrap})
    resource = ConfigResource(
        ConfigResource.Type.TOPIC,
        s.topic("inbox"),
        incremental_configs=[
            ConfigEntry("max.message.bytes", str(INBOX_MAX_MESSAGE_BYTES), incremental_operation=AlterConfigOpType.SET)
        ],
    )
    admin.incremental_alter_configs([resource])[resource].result(timeout=30)
    return s


def _healthy(s: Settings, conversation: str) -> SubmissionProposed:
    p = proposal(conversation)
    produce_inbox(s, [(conversation.encode(), CODEC.encode(p))], partition=0)
    return p


def _corrupt(s: Settings, rng: random.Random) -> bytes:
    raw = b"\x7f" + rng.randbytes(63)  # neither single-object (C3 01) nor Confluent (00) framing
    produce_inbox(s, [(b"corrupt", raw)], partition=0)
    return raw


def _unknown_fingerprint(s: Settings, rng: random.Random) -> bytes:
    body = CODEC.encode(proposal("fp"))[10:]  # a real submission's Avro body ...
    raw = SINGLE_OBJECT_MAGIC + rng.randbytes(8) + body  # ... under a fingerprint of no settled schema
    produce_inbox(s, [(b"fp", raw)], partition=0)
    return raw


def _oversized(s: Settings) -> bytes:
    raw = CODEC.encode(proposal("big", value="x" * 1_500_000))  # decodable; only its size is wrong
    assert MAX_INPUT_BYTES < len(raw) < INBOX_MAX_MESSAGE_BYTES
    produce_inbox(s, [(b"big", raw)], partition=0, **{"message.max.bytes": INBOX_MAX_MESSAGE_BYTES})
    return raw


def _zstd_bomb(s: Settings) -> None:
    items = [(b"bomb", bytes(BOMB_RECORD_BYTES)) for _ in range(BOMB_RECORDS)]
    assert BOMB_RECORDS * BOMB_RECORD_BYTES > RECEIVE_MESSAGE_MAX_BYTES
    produce_inbox(s, items, partition=0, **{"compression.type": "zstd", "linger.ms": 1000,
                  "batch.size": 100_000_000, "message.max.bytes": 100_000_000})  # fmt: skip


# -- reading back ----------------------------------------------------------------------------------------------


def _receipts(s: Settings) -> list[Receipt]:
    out = []
    for r in read_topic(s, "receipts"):
        rec = CODEC.decode(r.value, topic=s.topic("receipts"))
        assert isinstance(rec, Receipt)
        out.append(rec)
    return out


def _quarantined(s: Settings) -> list[QuarantineRecord]:
    out = []
    for r in read_topic(s, "quarantine"):
        rec = CODEC.decode(r.value, topic=s.topic("quarantine"))
        assert isinstance(rec, QuarantineRecord)
        out.append(rec)
    return out


def _log(s: Settings) -> list[LogBatch]:
    return [CODEC.decode_batch(r.value, offset=r.offset).batch for r in read_topic(s, "log")]


def _decided_offsets(s: Settings) -> list[int]:
    """The inbox offset of every decision on the log (one per decided input; group commit orders by conversation)."""
    refs = [getattr(e, "input_ref", None) for b in _log(s) for e in b.events]
    return [ref.offset for ref in refs if isinstance(ref, InputRef)]


def _log_quarantines(s: Settings) -> list[InputQuarantined]:
    return [e for b in _log(s) for e in b.events if isinstance(e, InputQuarantined)]


def _committed_offset(s: Settings) -> int:
    c = Consumer({"bootstrap.servers": s.kafka_bootstrap, "group.id": f"{s.namespace}.{s.app_id}.workers"})
    try:
        return int(c.committed([TopicPartition(s.topic("inbox"), 0)], timeout=10)[0].offset)
    finally:
        c.close()


def _inbox_end(s: Settings) -> int:
    c = Consumer({"bootstrap.servers": s.kafka_bootstrap, "group.id": f"{s.namespace}.end"})
    try:
        return int(c.get_watermark_offsets(TopicPartition(s.topic("inbox"), 0), timeout=10, cached=False)[1])
    finally:
        c.close()


def _cli(s: Settings, *args: str) -> str:
    env = {"SETTLED_NAMESPACE": s.namespace, "SETTLED_KAFKA_BOOTSTRAP": s.kafka_bootstrap, "COLUMNS": "400"}
    result = CliRunner().invoke(app, list(args), env=env)
    assert result.exit_code == 0, (result.stdout, result.stderr, result.exception)
    return result.stdout


# -- the acceptance test ---------------------------------------------------------------------------------------


def test_bad_inbox_records_are_quarantined_once_and_healthy_ones_flow(topics: Settings) -> None:
    s = topics
    rng = random.Random(15)
    healthy = [_healthy(s, "h0")]  # offset 0
    corrupt = _corrupt(s, rng)  # 1
    healthy.append(_healthy(s, "h1"))  # 2
    unknown = _unknown_fingerprint(s, rng)  # 3
    healthy.append(_healthy(s, "h2"))  # 4
    big = _oversized(s)  # 5
    healthy.append(_healthy(s, "h0"))  # 6
    _zstd_bomb(s)  # 7 .. 7 + BOMB_RECORDS - 1
    bomb_last = 7 + BOMB_RECORDS - 1
    healthy += [_healthy(s, "h1"), _healthy(s, "h3")]  # bomb_last + 1, bomb_last + 2
    assert _inbox_end(s) == bomb_last + 3  # one record per offset, the bomb one batch of BOMB_RECORDS

    worker: Worker[TxState] = Worker(settings=s, decider_factory=lambda _p: TxDecider(), config=WORKER_CONFIG)
    with running(worker) as thread:
        wait_for(lambda: len(_receipts(s)) >= len(healthy) and len(_quarantined(s)) >= 4, 30, "receipts, quarantine")
        wait_for(lambda: _committed_offset(s) == bomb_last + 3, 10, "the group offset to pass every input")
        # Still running, and still deciding: a submission after the bad records is admitted too.
        late = _healthy(s, "h4")
        wait_for(lambda: len(_receipts(s)) == len(healthy) + 1, 20, "the late submission's receipt")
        assert thread.is_alive()
    healthy.append(late)

    receipts = _receipts(s)
    assert sorted(r.request_id for r in receipts) == sorted(p.submission_id for p in healthy)
    assert all(r.outcome == ReceiptOutcome.ADMITTED for r in receipts)

    quarantined = {q.offset: q for q in _quarantined(s)}
    assert len(_quarantined(s)) == 4 == len(quarantined)  # once each
    assert {o: q.reason for o, q in quarantined.items()} == {
        1: QuarantineReason.UNDECODABLE,
        3: QuarantineReason.UNKNOWN_FINGERPRINT,
        5: QuarantineReason.OVERSIZED,
        7: QuarantineReason.CONSUMER_ERROR,
    }
    assert all(q.topic == s.topic("inbox") and q.partition == 0 for q in quarantined.values())
    assert (quarantined[1].raw, quarantined[1].key) == (corrupt, b"corrupt")
    assert quarantined[1].raw_size_bytes == len(corrupt)
    assert (quarantined[3].raw, quarantined[3].raw_size_bytes) == (unknown, len(unknown))
    assert "is no settled schema" in quarantined[3].detail
    assert quarantined[5].raw == big[:QUARANTINE_RAW_BYTES] and quarantined[5].raw_size_bytes == len(big)
    assert f"exceeds settled's limit of {MAX_INPUT_BYTES}" in quarantined[5].detail
    assert f"offsets 7..{bomb_last} ({BOMB_RECORDS} records)" in quarantined[7].detail
    assert "Decompression" in quarantined[7].detail  # librdkafka's _BAD_COMPRESSION, named

    on_log = {e.input_ref.offset: e for e in _log_quarantines(s) if e.input_ref is not None}
    assert len(_log_quarantines(s)) == 4
    assert {o: (e.reason, e.detail) for o, e in on_log.items()} == {
        o: (q.reason, q.detail) for o, q in quarantined.items()
    }
    # Every input decided exactly once; the bomb's records are one input (its base offset).
    decided = sorted(_decided_offsets(s))
    assert decided == [0, 1, 2, 3, 4, 5, 6, 7, bomb_last + 1, bomb_last + 2, bomb_last + 3]
    assert _committed_offset(s) == bomb_last + 4
    admitted = {e.submission_id: e.input_ref.offset for b in _log(s) for e in b.events
                if isinstance(e, SubmissionAdmitted) and e.input_ref is not None}  # fmt: skip
    assert [admitted[p.submission_id] for p in healthy] == [0, 2, 4, 6, bomb_last + 1, bomb_last + 2, bomb_last + 3]

    # `settled quarantine list` shows them: topic, partition, offset, reason, detail, size.
    out = _cli(s, "quarantine", "list")
    assert "4 of 4 records" in out
    rows = {int(line.split("│")[3]): line for line in out.splitlines() if s.topic("inbox") in line}
    assert sorted(rows) == [1, 3, 5, 7]
    for offset, q in quarantined.items():
        cells = [c.strip() for c in rows[offset].split("│")[1:-1]]
        assert cells[:4] == [s.topic("inbox"), "0", str(offset), q.reason.value]
        assert cells[5] == str(q.raw_size_bytes)
    out = _cli(s, "quarantine", "list", "--limit", "2")
    assert "2 of 4 records" in out
    assert sorted(int(line.split("│")[3]) for line in out.splitlines() if s.topic("inbox") in line) == [5, 7]


def test_probe_finds_the_end_of_back_to_back_unreadable_batches(
    settings: Settings, make_topic: Callable[..., str]
) -> None:
    topic = make_topic("probe")
    s = settings
    limits = WORKER_CONFIG.consumer_limits
    conf = probe_consumer_config(s, limits)
    p = Producer(producer_config(s, **{"compression.type": "zstd", "linger.ms": 1000, "batch.size": 100_000_000,
                                       "message.max.bytes": 100_000_000}))  # fmt: skip
    for n in (BOMB_RECORDS, 30):  # two batches, one flush each: offsets 0..47 and 48..77, the second at the end
        for _ in range(n):
            p.produce(topic, key=b"bomb", value=bytes(BOMB_RECORD_BYTES), partition=0)
        assert p.flush(30) == 0
    c = Consumer({**conf, "group.id": f"{s.namespace}.probe-test"})
    c.assign([TopicPartition(topic, 0, 0)])
    msg = c.poll(10)
    c.close()
    assert msg is not None and msg.error() is not None and msg.error().code() == KafkaError._BAD_COMPRESSION
    assert msg.offset() == 0  # librdkafka names the batch's base offset
    assert failing_batch_last_offset(conf, topic, 0, 0, 10) == BOMB_RECORDS - 1
    assert failing_batch_last_offset(conf, topic, 0, BOMB_RECORDS, 10) == BOMB_RECORDS + 29


# -- scenario 15: crashes ------------------------------------------------------------------------------------------


def _spawn(s: Settings, failpoints: str = "") -> subprocess.Popen[bytes]:
    env = {**os.environ, "SETTLED_KAFKA_BOOTSTRAP": s.kafka_bootstrap, "SETTLED_PARTITIONS": "1"}
    env.pop("SETTLED_FAILPOINTS", None)
    if failpoints:
        env["SETTLED_FAILPOINTS"] = failpoints
    return subprocess.Popen(
        [sys.executable, "-m", "tests.integration.test_quarantine", "--namespace", s.namespace],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def _exit_code(proc: subprocess.Popen[bytes], timeout_s: float) -> int:
    try:
        return proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError(f"the worker neither crashed nor exited within {timeout_s} s (looping?)") from None


@pytest.mark.parametrize(
    ("failpoints", "crash_code", "committed_before_crash"),
    [
        ("appender.before_commit=2*kill", -signal.SIGKILL, False),  # killed while the quarantine is pending
        ("appender.after_commit=2*kill", -signal.SIGKILL, True),  # killed right after it committed
        ("appender.before_commit=2*raise", 1, False),  # an exception escapes the loop
    ],
    ids=["kill-pending", "kill-committed", "crash"],
)
def test_a_crashed_worker_quarantines_each_bad_record_exactly_once(
    topics: Settings, failpoints: str, crash_code: int, committed_before_crash: bool
) -> None:
    s = topics
    rng = random.Random(1515)
    _corrupt(s, rng)  # offset 0: the first input the worker decides (hit 1 of the failpoints is its claim)
    _zstd_bomb(s)  # 1 .. BOMB_RECORDS
    after = _healthy(s, "after")  # BOMB_RECORDS + 1
    end = BOMB_RECORDS + 2
    assert _inbox_end(s) == end

    crashed = _spawn(s, failpoints)
    assert _exit_code(crashed, 30) == crash_code  # the crash exits non-zero, once: no retry loop inside
    quarantined = _quarantined(s)
    if committed_before_crash:
        assert [q.offset for q in quarantined][:1] == [0]
        assert _committed_offset(s) > 0  # the offset moved in the quarantine's transaction ...
    else:
        assert quarantined == []
        assert _committed_offset(s) < 0  # ... and neither moved when it did not commit

    restarted = _spawn(s)
    try:
        wait_for(lambda: len(_receipts(s)) == 1 and _committed_offset(s) == end, 30, "the restarted worker")
    finally:
        restarted.send_signal(signal.SIGTERM)
        code = _exit_code(restarted, 30)
    assert code == 0, restarted.stderr.read().decode() if restarted.stderr else ""
    assert [r.request_id for r in _receipts(s)] == [after.submission_id]
    assert sorted((q.offset, q.reason) for q in _quarantined(s)) == [
        (0, QuarantineReason.UNDECODABLE),
        (1, QuarantineReason.CONSUMER_ERROR),
    ]
    assert sorted(e.input_ref.offset for e in _log_quarantines(s) if e.input_ref is not None) == [0, 1]
    assert sorted(_decided_offsets(s)) == [0, 1, end - 1]


def _child_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--namespace", required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(message)s")
    worker: Worker[TxState] = Worker(
        settings=Settings(namespace=args.namespace),
        decider_factory=lambda _p: TxDecider(),
        config=WORKER_CONFIG,
        worker_id=f"quarantine-{os.getpid()}",
    )
    worker.install_signal_handlers()
    started = time.monotonic()
    worker.run()
    logging.info("worker stopped after %.1f s", time.monotonic() - started)
    return 0


if __name__ == "__main__":
    sys.exit(_child_main())
