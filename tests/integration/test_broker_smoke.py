"""Environment smoke tests: the broker behaves as settled's design relies on (issue 3).

These prove the environment, not settled: (a) read_committed hides aborted records, (b) a second producer with the
same ``transactional.id`` fences the first, (c) offsets sent with a transaction are all-or-nothing with its records.
"""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

pytestmark = pytest.mark.integration

_T_S = 15.0


def _producer(bootstrap: str, txn_id: str) -> Producer:
    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": txn_id,
            "transaction.timeout.ms": 10000,
            "linger.ms": 1,
            "retry.backoff.ms": 5,
        }
    )
    p.init_transactions(_T_S)
    return p


def _read_all(bootstrap: str, topic: str, partitions: int = 1, isolation: str = "read_committed") -> list[bytes]:
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "isolation.level": isolation,
            "auto.offset.reset": "earliest",
        }
    )
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    # Read up to the end offset of each partition (for read_committed that is the LSO).
    ends = {tp.partition: c.get_watermark_offsets(tp, timeout=_T_S)[1] for tp in tps}
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    out: list[bytes] = []
    done = {p for p, end in ends.items() if end == 0}
    while len(done) < partitions:
        msg = c.poll(1.0)
        if msg is None:
            # Positions may stop short of the high watermark (markers, aborted records): check positions.
            for tp in c.position([TopicPartition(topic, p) for p in range(partitions)]):
                if tp.offset >= ends[tp.partition]:
                    done.add(tp.partition)
            continue
        if msg.error():
            raise KafkaException(msg.error())
        out.append(msg.value())
        if msg.offset() + 1 >= ends[msg.partition()]:
            done.add(msg.partition())
    c.close()
    return out


def test_read_committed_sees_committed_not_aborted(kafka_bootstrap: str, make_topic, namespace: str) -> None:
    topic = make_topic("smoke")
    p = _producer(kafka_bootstrap, f"{namespace}.smoke")
    p.begin_transaction()
    p.produce(topic, b"committed")
    p.commit_transaction(_T_S)
    p.begin_transaction()
    p.produce(topic, b"aborted")
    p.flush(_T_S)
    p.abort_transaction(_T_S)
    p.begin_transaction()
    p.produce(topic, b"after")
    p.commit_transaction(_T_S)
    assert _read_all(kafka_bootstrap, topic) == [b"committed", b"after"]
    assert b"aborted" in _read_all(kafka_bootstrap, topic, isolation="read_uncommitted")


def test_same_transactional_id_fences_the_first_producer(kafka_bootstrap: str, make_topic, namespace: str) -> None:
    topic = make_topic("fence")
    txn_id = f"{namespace}.fence"
    first = _producer(kafka_bootstrap, txn_id)
    first.begin_transaction()
    first.produce(topic, b"zombie-open")
    first.flush(_T_S)

    second = _producer(kafka_bootstrap, txn_id)  # bumps the epoch, aborts first's open transaction
    second.begin_transaction()
    second.produce(topic, b"owner")
    second.commit_transaction(_T_S)

    with pytest.raises(KafkaException) as info:  # noqa: PT012 - the produce may be accepted locally; commit fails
        first.produce(topic, b"zombie-late")
        first.commit_transaction(_T_S)
    err: KafkaError = info.value.args[0]
    assert err.code() == KafkaError._FENCED, err
    assert err.fatal(), err
    assert _read_all(kafka_bootstrap, topic) == [b"owner"]


def test_offsets_are_all_or_nothing_with_the_records(kafka_bootstrap: str, make_topic, namespace: str) -> None:
    src = make_topic("src")
    dst = make_topic("dst")
    group = f"{namespace}.g"
    seed = Producer({"bootstrap.servers": kafka_bootstrap})
    for i in range(4):
        seed.produce(src, f"in{i}".encode())
    seed.flush(_T_S)

    consumer = Consumer(
        {
            "bootstrap.servers": kafka_bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([src])
    p = _producer(kafka_bootstrap, f"{namespace}.eos")

    def process_two() -> None:
        got = 0
        while got < 2:
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            assert not msg.error(), msg.error()
            p.produce(dst, b"out-" + msg.value())
            got += 1

    def committed() -> int:
        return consumer.committed([TopicPartition(src, 0)], timeout=_T_S)[0].offset

    # Transaction 1: records + offsets, aborted: neither becomes visible.
    p.begin_transaction()
    process_two()
    p.send_offsets_to_transaction(consumer.position(consumer.assignment()), consumer.consumer_group_metadata(), _T_S)
    p.abort_transaction(_T_S)
    assert committed() < 0  # no committed offset (OFFSET_INVALID)
    assert _read_all(kafka_bootstrap, dst) == []

    # Rewind to the committed position, then transaction 2 commits records and offsets together.
    consumer.seek(TopicPartition(src, 0, 0))
    p.begin_transaction()
    process_two()
    p.send_offsets_to_transaction(consumer.position(consumer.assignment()), consumer.consumer_group_metadata(), _T_S)
    p.commit_transaction(_T_S)
    assert committed() == 2
    assert _read_all(kafka_bootstrap, dst) == [b"out-in0", b"out-in1"]
    consumer.close()
