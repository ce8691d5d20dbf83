"""The WRONG way to publish lifecycle events, kept for the fault switch ``lifecycle_outside_transaction`` only.

The partition owner puts a batch's ``durable.*`` events (`settled.protocol.lifecycle_events`) into the appender's
transaction with the batch (docs/architecture.md, "Lifecycle events"). With the switch on it instead hands them,
after the commit, to `OutsideTransactionPublisher`: a separate idempotent producer, so a kill between the commit
and this produce loses them, and a re-run after an abort could add events for records that never became canonical.
Nothing else uses this module (tests/unit/test_produce_paths.py lists it for that reason).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from confluent_kafka import Producer

from settled._settings import Settings
from settled.producers._batches import OutRecord
from settled.producers._kafka import producer_config

__all__ = ["OutsideTransactionPublisher"]


@dataclass
class OutsideTransactionPublisher:
    """A plain idempotent producer of lifecycle records after the commit (the fault switch's broken path).

    Attributes:
        settings: Kafka connection and producer tuning.
        partition: The owned partition the records go to.
        flush_timeout_s: Bound on the flush after each publish, in seconds.
    """

    settings: Settings
    partition: int
    flush_timeout_s: float = 30.0
    _producer: Producer | None = field(default=None, init=False)

    def publish(self, records: Sequence[OutRecord]) -> None:
        """Produce ``records`` to the owned partition outside any transaction and flush.

        Args:
            records: Encoded lifecycle records.

        Raises:
            RuntimeError: Records were still undelivered after ``flush_timeout_s``.
        """
        if not records:
            return
        if self._producer is None:
            self._producer = Producer(producer_config(self.settings))
        for r in records:
            self._producer.produce(r.topic, r.value, r.key, partition=self.partition, headers=list(r.headers))
        left = self._producer.flush(self.flush_timeout_s)
        if left:
            raise RuntimeError(f"{left} lifecycle records undelivered after {self.flush_timeout_s} s")
