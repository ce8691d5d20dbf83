"""One frozen settings object for every settled process (DESIGN.md §11).

Every field is read from a ``SETTLED_<FIELD>`` environment variable (upper case) or from the optional file named
by ``SETTLED_SETTINGS_FILE`` (dotenv syntax). Units are part of the field names.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


def _default_state_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", str(Path.home() / ".cache"))) / "settled"


class Settings(BaseSettings):
    """settled's configuration, frozen once built.

    Attributes:
        namespace: Prefix of every topic, consumer group and ``transactional.id`` (DESIGN.md §2), so that
            deployments and parallel test runs never share them.
        app_id: Application id; the partition owner's ``transactional.id`` is
            ``<namespace>.<app_id>.<log topic>.<partition>`` (DESIGN.md §3).
        kafka_bootstrap: Kafka ``bootstrap.servers``; empty means "start or use the local dev stack".
        postgres_dsn: PostgreSQL connection string; empty means "start or use the local dev stack".
        partitions: Partition count of every co-partitioned topic (DESIGN.md §2).
        state_dir: Folder holding the dev stack's data and logs.
        jar_cache_dir: Folder of the Maven-resolved jar cache (Kafka broker, Avro oracle), shared by every stack.
        kafka_version: Apache Kafka version whose broker jars the dev stack resolves from Maven Central.
        log4j2_version: log4j2 version shipped with that Kafka release (for the SLF4J binding).
        kafka_port: Dev-stack broker port on 127.0.0.1.
        kafka_controller_port: Dev-stack KRaft controller port on 127.0.0.1.
        postgres_port: Dev-stack PostgreSQL port on 127.0.0.1.
        kafka_heap_mb: Broker JVM heap, in MiB.
        session_timeout_ms: Consumer group ``session.timeout.ms``.
        heartbeat_interval_ms: Consumer group ``heartbeat.interval.ms``.
        transaction_timeout_ms: Producer ``transaction.timeout.ms``; kept below the session timeout (DESIGN.md §3).
        retry_backoff_ms: Producer ``retry.backoff.ms``; librdkafka's default of 100 ms makes every back-to-back
            transaction cost ~100 ms (DESIGN.md §3), so settled lowers it.
        retry_backoff_max_ms: Producer ``retry.backoff.max.ms``, bounding the exponential growth.
        linger_ms: Producer ``linger.ms``.
        kafka_call_timeout_s: Timeout of every blocking transactional call (init, commit, abort, send offsets).
        revoke_grace_s: On a graceful revoke (SIGTERM, a rebalance), how long a partition's running attempts may
            take to finish and commit their settlements before the rest are recorded as ``AttemptInterrupted``
            (DESIGN.md §3).
        worker_turn_watchdog_s: Bound on one phase of a worker turn (one partition's checkpoint, a poll), in
            seconds; a worker whose phase runs past it logs CRITICAL, dumps its threads' stacks and exits 75 so a
            supervisor restarts it (librdkafka#5456, docs/architecture.md). Unset: derived from the Kafka timeouts
            (``settled.processors.default_turn_watchdog_s``, 72.5 s by default); claims and graceful releases get
            their restore and revoke bounds on top. 0 disables the watchdog.
    """

    model_config = SettingsConfigDict(
        env_prefix="SETTLED_", env_file=os.environ.get("SETTLED_SETTINGS_FILE"), frozen=True, extra="ignore"
    )

    namespace: str = "settled"
    app_id: str = "settled"
    kafka_bootstrap: str = ""
    postgres_dsn: str = ""
    partitions: int = Field(default=12, ge=1)
    state_dir: Path = Field(default_factory=_default_state_dir)
    jar_cache_dir: Path = Field(default_factory=lambda: _default_state_dir() / "jars")
    kafka_version: str = "4.1.1"
    log4j2_version: str = "2.24.3"
    kafka_port: int = 19092
    kafka_controller_port: int = 19093
    postgres_port: int = 15432
    kafka_heap_mb: int = 512
    session_timeout_ms: int = 3000
    heartbeat_interval_ms: int = 500
    transaction_timeout_ms: int = 2500
    retry_backoff_ms: int = 5
    retry_backoff_max_ms: int = 100
    linger_ms: int = 1
    kafka_call_timeout_s: float = 10.0
    revoke_grace_s: float = Field(default=5.0, ge=0.0)
    worker_turn_watchdog_s: float | None = Field(default=None, ge=0.0, allow_inf_nan=False)

    def topic(self, name: str) -> str:
        """Return the namespaced topic name.

        Args:
            name: The short topic name, e.g. ``"inbox"``, ``"log"``, ``"receipts"``.

        Returns:
            ``"<namespace>.<name>"``, e.g. ``"settled.inbox"`` in the default namespace.
        """
        return f"{self.namespace}.{name}"
