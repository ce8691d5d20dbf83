"""One frozen settings object for every settled process (docs/design.md §11).

Every field is read from a ``SETTLED_<FIELD>`` environment variable (upper case) or from the optional file named
by ``SETTLED_SETTINGS_FILE`` (dotenv syntax). Units are part of the field names.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Final, Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from settled._connection import KafkaConnection, SaslMechanism, SecurityProtocol

__all__ = ["DEV_TIMEOUTS", "Settings"]

#: The dev stack's short Kafka timeouts (docs/architecture.md "Timeouts"): a dead worker's partitions move within
#: seconds on the dev broker (``group.min.session.timeout.ms=1000``). Tests, benchmarks and the demo run with them,
#: and ``settled dev up`` prints them among its exports; `Settings` defaults to production values instead.
DEV_TIMEOUTS: Final[Mapping[str, int]] = {
    "session_timeout_ms": 3000,
    "heartbeat_interval_ms": 500,
    "transaction_timeout_ms": 2500,
}


def _default_state_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", str(Path.home() / ".cache"))) / "settled"


class Settings(BaseSettings):
    """settled's configuration, frozen once built.

    Attributes:
        namespace: Prefix of every topic, consumer group and ``transactional.id`` (docs/design.md §2), so that
            deployments and parallel test runs never share them.
        app_id: Application id; the partition owner's ``transactional.id`` is
            ``<namespace>.<app_id>.<log topic>.<partition>`` (docs/design.md §3).
        kafka_bootstrap: Kafka ``bootstrap.servers``; empty means "start or use the local dev stack".
        kafka_security_protocol: Kafka ``security.protocol`` (``plaintext``, ``ssl``, ``sasl_plaintext``,
            ``sasl_ssl``); unset: librdkafka's default, plaintext.
        kafka_sasl_mechanism: Kafka ``sasl.mechanism`` (``PLAIN``, ``SCRAM-SHA-256``, ``SCRAM-SHA-512``, ...).
        kafka_sasl_username: Kafka ``sasl.username``.
        kafka_sasl_password: Kafka ``sasl.password`` (a secret: hidden in ``repr`` and logs).
        kafka_ssl_ca_location: Kafka ``ssl.ca.location``: CA certificate file (PEM) to check the broker against.
        kafka_ssl_certificate_location: Kafka ``ssl.certificate.location``: client certificate (PEM, mutual TLS).
        kafka_ssl_key_location: Kafka ``ssl.key.location``: client private key (PEM, mutual TLS).
        kafka_ssl_key_password: Kafka ``ssl.key.password``: the private key's passphrase (a secret).
        kafka_ssl_endpoint_identification_algorithm: Kafka ``ssl.endpoint.identification.algorithm``
            (``https``: check the broker's host name; ``none``: do not).
        postgres_dsn: PostgreSQL connection string; empty means "start or use the local dev stack".
        partitions: Partition count of every co-partitioned topic (docs/design.md §2).
        state_dir: Folder holding the dev stack's data and logs.
        jar_cache_dir: Folder of the Maven-resolved jar cache (Kafka broker, Avro oracle), shared by every stack.
        kafka_version: Apache Kafka version whose broker jars the dev stack resolves from Maven Central.
        log4j2_version: log4j2 version shipped with that Kafka release (for the SLF4J binding).
        kafka_port: Dev-stack broker port on 127.0.0.1.
        kafka_controller_port: Dev-stack KRaft controller port on 127.0.0.1.
        postgres_port: Dev-stack PostgreSQL port on 127.0.0.1.
        kafka_heap_mb: Broker JVM heap, in MiB.
        session_timeout_ms: Consumer group ``session.timeout.ms``: how long a silent worker keeps its partitions.
            Default: Kafka's own, 45 s, fit for a loaded machine; the dev stack's is `DEV_TIMEOUTS`.
        heartbeat_interval_ms: Consumer group ``heartbeat.interval.ms``. Default: Kafka's own, 3 s.
        transaction_timeout_ms: Producer ``transaction.timeout.ms``; must stay below the session timeout
            (docs/architecture.md). Default: 30 s.
        retry_backoff_ms: Producer ``retry.backoff.ms``; librdkafka's default of 100 ms makes every back-to-back
            transaction cost ~100 ms (docs/design.md §3), so settled lowers it.
        retry_backoff_max_ms: Producer ``retry.backoff.max.ms``, bounding the exponential growth.
        linger_ms: Producer ``linger.ms``.
        kafka_call_timeout_s: Timeout of every blocking transactional call (init, commit, abort, send offsets).
        revoke_grace_s: On a graceful revoke (SIGTERM, a rebalance), how long a partition's running attempts may
            take to finish and commit their settlements before the rest are recorded as ``AttemptInterrupted``
            (docs/design.md §3).
        worker_turn_watchdog_s: Bound on one phase of a worker turn (one partition's checkpoint, a poll), in
            seconds; a worker whose phase runs past it logs CRITICAL, dumps its threads' stacks and exits 75 so a
            supervisor restarts it (librdkafka#5456, docs/architecture.md). Unset: derived from the Kafka timeouts
            (``settled.processors.default_turn_watchdog_s``, 100 s by default, 72.5 s with `DEV_TIMEOUTS`); claims
            and graceful releases get their restore and revoke bounds on top. 0 disables the watchdog.
        clock_offset_s: Seconds added to a worker's clock (its decisions, wait deadlines and their sweeper,
            ``ctx.now()``), for tests of deadlines that must not sleep: every worker process reads it. Default 0.
        metrics_port: The port of the Prometheus ``/metrics`` endpoint of ``settled worker`` and ``settled projections
            run`` (docs/architecture.md, "Metrics"); unset: not served; 0: a port the OS chooses (logged).
        metrics_host: The address that endpoint binds. Default ``127.0.0.1`` (this host only).
        worker_instance_id: The worker's static group membership id (Kafka ``group.instance.id``, KIP-345): a worker
            restarted with the same id rejoins the group as the same member and gets its partitions back at once,
            without waiting out the dead member's session and a rebalance (docs/architecture.md, "Restart in
            place"). Give each worker slot (a systemd unit, a StatefulSet pod) its own stable id; two running workers
            with one id fence each other (the older exits with `INSTANCE_FENCED_EXIT_CODE`). Unset: dynamic
            membership. Kafka's rules: at most 249 characters of ``[A-Za-z0-9._-]``.
    """

    model_config = SettingsConfigDict(
        env_prefix="SETTLED_", env_file=os.environ.get("SETTLED_SETTINGS_FILE"), frozen=True, extra="ignore"
    )

    namespace: str = "settled"
    app_id: str = "settled"
    kafka_bootstrap: str = ""
    kafka_security_protocol: SecurityProtocol | None = None
    kafka_sasl_mechanism: SaslMechanism | None = None
    kafka_sasl_username: str | None = None
    kafka_sasl_password: SecretStr | None = None
    kafka_ssl_ca_location: str | None = None
    kafka_ssl_certificate_location: str | None = None
    kafka_ssl_key_location: str | None = None
    kafka_ssl_key_password: SecretStr | None = None
    kafka_ssl_endpoint_identification_algorithm: Literal["https", "none"] | None = None
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
    session_timeout_ms: int = Field(default=45_000, gt=0)
    heartbeat_interval_ms: int = Field(default=3_000, gt=0)
    transaction_timeout_ms: int = Field(default=30_000, gt=0)
    retry_backoff_ms: int = 5
    retry_backoff_max_ms: int = 100
    linger_ms: int = 1
    kafka_call_timeout_s: float = 10.0
    revoke_grace_s: float = Field(default=5.0, ge=0.0)
    worker_turn_watchdog_s: float | None = Field(default=None, ge=0.0, allow_inf_nan=False)
    clock_offset_s: float = Field(default=0.0, allow_inf_nan=False)
    metrics_port: int | None = Field(default=None, ge=0, le=65535)
    metrics_host: str = "127.0.0.1"
    worker_instance_id: str | None = Field(default=None, min_length=1, max_length=249, pattern=r"^[A-Za-z0-9._-]+$")

    @model_validator(mode="after")
    def _transactions_end_before_sessions(self) -> Settings:
        if self.transaction_timeout_ms >= self.session_timeout_ms:
            raise ValueError(
                f"transaction_timeout_ms ({self.transaction_timeout_ms}) must be below session_timeout_ms "
                f"({self.session_timeout_ms}): a dead owner's transaction must end before its partitions move "
                "(docs/architecture.md)"
            )
        if self.heartbeat_interval_ms >= self.session_timeout_ms:
            raise ValueError(
                f"heartbeat_interval_ms ({self.heartbeat_interval_ms}) must be below session_timeout_ms "
                f"({self.session_timeout_ms})"
            )
        return self

    @property
    def kafka(self) -> KafkaConnection:
        """The Kafka connection every client is configured from (`settled._connection`).

        Returns:
            ``kafka_bootstrap`` and the ``kafka_security_*``, ``kafka_sasl_*`` and ``kafka_ssl_*`` settings.

        Raises:
            ValueError: Only one of ``kafka_sasl_username`` and ``kafka_sasl_password`` is set.
        """
        return KafkaConnection(
            bootstrap_servers=self.kafka_bootstrap,
            security_protocol=self.kafka_security_protocol,
            sasl_mechanism=self.kafka_sasl_mechanism,
            sasl_username=self.kafka_sasl_username,
            sasl_password=self.kafka_sasl_password,
            ssl_ca_location=self.kafka_ssl_ca_location,
            ssl_certificate_location=self.kafka_ssl_certificate_location,
            ssl_key_location=self.kafka_ssl_key_location,
            ssl_key_password=self.kafka_ssl_key_password,
            ssl_endpoint_identification_algorithm=self.kafka_ssl_endpoint_identification_algorithm,
        )

    def with_dev_timeouts(self) -> Settings:
        """Return these settings with `DEV_TIMEOUTS` for every Kafka timeout not set explicitly.

        For the dev stack's users (tests, benchmarks, the demo): a timeout given as an argument or in the
        environment (``SETTLED_SESSION_TIMEOUT_MS``, ...) is kept.

        Returns:
            The settings (a copy).
        """
        update = {name: value for name, value in DEV_TIMEOUTS.items() if name not in self.model_fields_set}
        return self.model_copy(update=update) if update else self

    def timeouts_env(self) -> dict[str, str]:
        """Return the Kafka timeouts as the environment variables a child process reads them from.

        Returns:
            ``{"SETTLED_SESSION_TIMEOUT_MS": ..., "SETTLED_HEARTBEAT_INTERVAL_MS": ...,
            "SETTLED_TRANSACTION_TIMEOUT_MS": ...}``.
        """
        return {f"SETTLED_{name.upper()}": str(getattr(self, name)) for name in DEV_TIMEOUTS}

    def timeouts_label(self) -> str:
        """Name the set of Kafka timeouts these settings run with, for benchmarks' reports.

        Returns:
            ``"dev"`` (`DEV_TIMEOUTS`), ``"production"`` (the defaults) or ``"custom"``, followed by the three values,
            e.g. ``"dev (session 3000 ms, heartbeat 500 ms, transaction 2500 ms)"``.
        """
        values = {name: getattr(self, name) for name in DEV_TIMEOUTS}
        defaults = {name: type(self).model_fields[name].default for name in DEV_TIMEOUTS}
        kind = "dev" if values == dict(DEV_TIMEOUTS) else "production" if values == defaults else "custom"
        return (
            f"{kind} (session {self.session_timeout_ms} ms, heartbeat {self.heartbeat_interval_ms} ms, "
            f"transaction {self.transaction_timeout_ms} ms)"
        )

    def topic(self, name: str) -> str:
        """Return the namespaced topic name.

        Args:
            name: The short topic name, e.g. ``"inbox"``, ``"log"``, ``"receipts"``.

        Returns:
            ``"<namespace>.<name>"``, e.g. ``"settled.inbox"`` in the default namespace.
        """
        return f"{self.namespace}.{name}"
