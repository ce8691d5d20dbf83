"""The dev stack's broker before it starts: its start-up bound, a taken port, and ``destroy`` (no broker is started).

A broker loads every partition's log before it answers, so its start-up bound grows with the partition folders it
holds (a dev broker left with 16,221 of them took 240 s to answer, past the former fixed 90 s).
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from settled.services._devstack import KafkaBroker, StackError, broker_ready_timeout_s, free_port


def _broker(home: Path, port: int | None = None) -> KafkaBroker:
    return KafkaBroker(home=home, lib_dir=home / "lib", port=port or free_port(), controller_port=free_port())


def test_the_start_up_bound_grows_with_the_partition_folders() -> None:
    assert broker_ready_timeout_s(0) == 90.0
    assert broker_ready_timeout_s(16_221) == pytest.approx(90.0 + 0.030 * 16_221)
    assert broker_ready_timeout_s(16_221) > 240.0  # what that many folders took to load on the 2-core machine


def test_partition_folders_counts_topic_partitions_only(tmp_path: Path) -> None:
    data = tmp_path / "data"
    for name in ("ns.log-0", "ns.log-11", "__consumer_offsets-0", "__cluster_metadata-0", "ns.inbox-2.3fa9c0-delete"):
        (data / name).mkdir(parents=True)
    for name in ("meta.properties", "bootstrap.checkpoint", ".lock", "recovery-point-offset-checkpoint"):
        (data / name).write_text("")
    assert _broker(tmp_path).partition_folders() == 5
    assert _broker(tmp_path / "never-started").partition_folders() == 0


def test_a_taken_port_is_refused_at_once_naming_it(tmp_path: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        broker = _broker(tmp_path, port)
        with pytest.raises(StackError, match=rf"client port 127\.0\.0\.1:{port} is taken by another process"):
            broker.start(ready_timeout_s=1.0)
    assert not (tmp_path / "kafka.pid").exists()  # nothing was started
    assert not (tmp_path / "server.properties").exists()


def test_destroy_deletes_the_data_and_the_log(tmp_path: Path) -> None:
    (tmp_path / "data" / "ns.log-0").mkdir(parents=True)
    (tmp_path / "kafka.log").write_text("old log\n")
    (tmp_path / "server.properties").write_text("node.id=1\n")
    _broker(tmp_path).destroy()
    assert not (tmp_path / "data").exists()
    assert not (tmp_path / "kafka.log").exists()
    assert (tmp_path / "server.properties").exists()  # rewritten at every start anyway; only the data goes
