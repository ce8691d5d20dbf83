"""Private services from the factories survive a stop and a restart with their committed data (issue 3)."""

from __future__ import annotations

import psycopg
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

pytestmark = pytest.mark.integration


def test_committed_record_survives_a_broker_restart(private_broker) -> None:
    broker = private_broker()
    broker.start()
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic("durable", 1, 1)])["durable"].result()
    p = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": "restart-test", "linger.ms": 1})
    p.init_transactions(30)
    p.begin_transaction()
    p.produce("durable", key=b"k", value=b"survives")
    p.commit_transaction(30)
    del p

    broker.kill()  # a crash, not a graceful stop: the commit must already be in the log
    assert not broker.is_running()
    broker.start()

    c = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": "restart-reader",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    c.assign([TopicPartition("durable", 0, 0)])
    msg = None
    for _ in range(30):
        msg = c.poll(1.0)
        if msg is not None:
            break
    c.close()
    assert msg is not None and not msg.error()
    assert (msg.key(), msg.value()) == (b"k", b"survives")


def test_committed_row_survives_a_postgres_restart(private_postgres) -> None:
    server = private_postgres()
    server.start()
    with psycopg.connect(server.dsn) as conn:
        conn.execute("CREATE TABLE t (v text)")
        conn.execute("INSERT INTO t VALUES ('committed')")
    open_txn = psycopg.connect(server.dsn)
    open_txn.execute("INSERT INTO t VALUES ('uncommitted')")
    server.stop("immediate")  # crash-stop with a transaction still open
    open_txn.close()
    assert not server.is_running()
    server.start()
    with psycopg.connect(server.dsn) as conn:
        rows = conn.execute("SELECT v FROM t").fetchall()
    assert rows == [("committed",)]
