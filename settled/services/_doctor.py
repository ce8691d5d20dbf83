"""``settled doctor``'s checks: one function per named check, each returning a `CheckResult` (issue 21 item 3).

Every check catches only the failures it diagnoses (a Kafka or PostgreSQL error, a refused setting) and turns them
into a failed `CheckResult` naming what it saw; anything else propagates, so a defect in the doctor itself is not
reported as an unhealthy deployment. `run_checks` runs them in `CHECK_NAMES` order; a check that needs an earlier one
(the topics need the broker) is skipped, not failed twice, when that one failed.

The clock check writes one record to a scratch topic of the doctor's own, ``<namespace>.doctor`` (one partition,
``LogAppendTime``, one hour's retention), created on first use; none of settled's topics is written.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import psycopg
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic  # type: ignore[attr-defined]
from psycopg import sql

from settled._settings import Settings
from settled.producers import admin_config, describe_topics, producer_config, read_genesis
from settled.projections import LAYOUT_VERSION, ProjectionLayoutError, check_layout, default_schema, schema_exists
from settled.runtime import App, UnsafeToolsError
from settled.schemas import Codec

__all__ = [
    "CHECK_NAMES",
    "LIBRDKAFKA_DEFAULT_RETRY_BACKOFF_MS",
    "CheckResult",
    "CheckStatus",
    "DoctorOptions",
    "run_checks",
]

#: librdkafka's default ``retry.backoff.ms``: with it every back-to-back transaction costs about 100 ms
#: (docs/design.md §3), so the doctor flags a transactional configuration that keeps it (or anything above).
LIBRDKAFKA_DEFAULT_RETRY_BACKOFF_MS = 100


class CheckStatus(StrEnum):
    """A check's verdict."""

    OK = "ok"
    FAILED = "failed"
    SKIPPED = "skipped"


@dataclass(frozen=True)
class CheckResult:
    """One named check's verdict.

    Attributes:
        name: One of `CHECK_NAMES`.
        status: ok, failed or skipped.
        detail: What was seen (the failure's cause, or the figures behind an ok).
    """

    name: str
    status: CheckStatus
    detail: str


@dataclass(frozen=True)
class DoctorOptions:
    """What the doctor checks against.

    Attributes:
        timeout_s: Bound on each Kafka or PostgreSQL call, in seconds.
        max_clock_skew_s: The largest accepted difference between this process's clock (with
            ``SETTLED_CLOCK_OFFSET_S``) and the broker's, in seconds.
        app: The app the workers run (``--app``), for the resolver-key check; None skips it.
        postgres: Check the projection schema (a deployment with a projector); False skips it.
        projection_schema: The projection schema to check; None means the namespace's default.
        overdue_after_s: Per obligation kind (``unknown``, ``approval``, ``submission``), the age past which it is
            overdue, in seconds (issue 22 item 5).
    """

    timeout_s: float = 10.0
    max_clock_skew_s: float = 1.0
    app: App | None = None
    postgres: bool = True
    projection_schema: str | None = None
    overdue_after_s: Mapping[str, float] = field(
        default_factory=lambda: {"unknown": 900.0, "approval": 86_400.0, "submission": 3_600.0}
    )


def _ok(name: str, detail: str) -> CheckResult:
    return CheckResult(name, CheckStatus.OK, detail)


def _failed(name: str, detail: str) -> CheckResult:
    return CheckResult(name, CheckStatus.FAILED, detail)


def check_broker(settings: Settings, options: DoctorOptions) -> CheckResult:
    """The broker answers a metadata request.

    Args:
        settings: The Kafka connection.
        options: The call timeout.

    Returns:
        ok with the broker count, or failed with the client's error.
    """
    admin = AdminClient(admin_config(settings))
    try:
        metadata = admin.list_topics(timeout=options.timeout_s)
    except KafkaException as exc:
        return _failed("broker", f"{settings.kafka_bootstrap}: no answer within {options.timeout_s:g} s ({exc})")
    return _ok("broker", f"{settings.kafka_bootstrap}: {len(metadata.brokers)} broker(s)")


def check_topics(settings: Settings, options: DoctorOptions) -> CheckResult:
    """The topics exist with the configured partition count; every log partition starts with a matching genesis.

    Args:
        settings: Namespace, partition count and Kafka connection.
        options: The call timeout.

    Returns:
        ok, or failed naming each missing topic, wrong partition count and partition without a (matching) genesis.
    """
    problems: list[str] = []
    try:
        infos = describe_topics(settings, options.timeout_s)
        for info in infos:
            if not info.partitions:
                problems.append(f"{info.name} is missing")
            elif info.partitions != settings.partitions:
                problems.append(
                    f"{info.name} has {info.partitions} partitions, SETTLED_PARTITIONS is {settings.partitions}"
                )
        log = next(i for i in infos if i.name == settings.topic("log"))
        codec = Codec()
        for partition in range(log.partitions):
            genesis = read_genesis(settings, codec, partition, options.timeout_s)
            if genesis is None:
                problems.append(f"{log.name}[{partition}] has no genesis record")
            elif genesis.partition_count != settings.partitions:
                problems.append(f"{log.name}[{partition}]'s genesis fixes {genesis.partition_count} partitions")
    except KafkaException as exc:
        problems.append(f"describing the topics failed: {exc}")
    if problems:
        return _failed("topics", "; ".join(problems) + " (`settled topics create` creates what is missing)")
    return _ok("topics", f"{len(infos)} topics of {settings.partitions} partitions, genesis on every log partition")


def _projection_schema(name: str, settings: Settings, options: DoctorOptions) -> str | CheckResult:
    """Return the projection schema a PostgreSQL check reads, or the check's result when it cannot read one.

    Args:
        name: The check.
        settings: The PostgreSQL DSN and the namespace.
        options: Whether PostgreSQL is checked, and the schema name.

    Returns:
        The schema's name; or the check skipped (``--no-postgres``) or failed (no PostgreSQL configured).
    """
    if not options.postgres:
        return CheckResult(name, CheckStatus.SKIPPED, "--no-postgres")
    if not settings.postgres_dsn:
        return _failed(name, "no PostgreSQL configured: set SETTLED_POSTGRES_DSN or pass --no-postgres")
    return options.projection_schema or default_schema(settings.namespace)


def check_projection_schema(settings: Settings, options: DoctorOptions) -> CheckResult:
    """The projection schema exists at this release's layout.

    Args:
        settings: The PostgreSQL DSN and the namespace.
        options: The schema name and the connect timeout.

    Returns:
        ok with the layout, failed with the reason, or skipped when PostgreSQL is not checked.
    """
    schema = _projection_schema("projection-schema", settings, options)
    if isinstance(schema, CheckResult):
        return schema
    try:
        with psycopg.connect(settings.postgres_dsn, connect_timeout=max(1, round(options.timeout_s))) as conn:
            if not schema_exists(conn, schema):
                return _failed(
                    "projection-schema",
                    f"schema {schema!r} does not exist: start the projector, `settled projections run`",
                )
            check_layout(conn, schema)
    except psycopg.Error as exc:
        return _failed("projection-schema", f"PostgreSQL: {exc}".strip())
    except ProjectionLayoutError as exc:
        return _failed("projection-schema", str(exc))
    return _ok("projection-schema", f"schema {schema!r} at layout {LAYOUT_VERSION}")


def check_transactional_settings(settings: Settings, options: DoctorOptions) -> CheckResult:
    """The transactional producer's configuration is fit for back-to-back transactions and for fencing.

    No librdkafka default ``retry.backoff.ms`` (or above), and a transaction timeout the broker accepts and that ends
    before a dead owner's session.

    Args:
        settings: The producer tuning and the group timeouts.
        options: The call timeout (for reading the broker's ``transaction.max.timeout.ms``).

    Returns:
        ok, or failed naming each offending property and its value.
    """
    conf = producer_config(settings, transactional_id="settled-doctor")
    problems: list[str] = []
    backoff_ms = int(conf["retry.backoff.ms"])
    if backoff_ms >= LIBRDKAFKA_DEFAULT_RETRY_BACKOFF_MS:
        problems.append(
            f"retry.backoff.ms={backoff_ms} (SETTLED_RETRY_BACKOFF_MS): at librdkafka's default of "
            f"{LIBRDKAFKA_DEFAULT_RETRY_BACKOFF_MS} ms or above, each back-to-back transaction waits it out; use 5"
        )
    timeout_ms = int(conf["transaction.timeout.ms"])
    if timeout_ms >= settings.session_timeout_ms:
        problems.append(
            f"transaction.timeout.ms={timeout_ms} is not below session.timeout.ms={settings.session_timeout_ms}"
        )
    broker_max_ms = _broker_transaction_max_timeout_ms(settings, options)
    if broker_max_ms is not None and timeout_ms > broker_max_ms:
        problems.append(
            f"transaction.timeout.ms={timeout_ms} exceeds the broker's transaction.max.timeout.ms={broker_max_ms}"
        )
    if problems:
        return _failed("transactional-settings", "; ".join(problems))
    return _ok(
        "transactional-settings",
        f"retry.backoff.ms={backoff_ms}, linger.ms={conf['linger.ms']}, transaction.timeout.ms={timeout_ms}",
    )


def _broker_transaction_max_timeout_ms(settings: Settings, options: DoctorOptions) -> int | None:
    admin = AdminClient(admin_config(settings))
    try:
        metadata = admin.list_topics(timeout=options.timeout_s)
        broker_id = str(min(metadata.brokers))
        resource = ConfigResource(ConfigResource.Type.BROKER, broker_id)
        entries = admin.describe_configs([resource], request_timeout=options.timeout_s)[resource].result(
            timeout=options.timeout_s
        )
    except (KafkaException, ValueError):  # no broker answered: the broker check already says so
        return None
    entry = entries.get("transaction.max.timeout.ms")
    return None if entry is None or entry.value is None else int(entry.value)


def check_resolver_key(settings: Settings, options: DoctorOptions) -> CheckResult:
    """An app with tools that are neither idempotent nor reconcilable has a resolver key.

    An interrupted call of such a tool becomes an Unknown that only a person (a resolver key's holder) can resolve.

    Args:
        settings: Unused (the app carries its keys).
        options: The app (``--app``); None skips the check.

    Returns:
        ok, failed naming the unsafe tools, or skipped without an app.
    """
    del settings
    if options.app is None:
        return CheckResult("resolver-key", CheckStatus.SKIPPED, "no --app given")
    try:
        options.app.check()
    except UnsafeToolsError as exc:
        return _failed("resolver-key", str(exc))
    unsafe = sorted(t.name for t in options.app.tools if not t.idempotent and t.reconcile is None)
    if not unsafe:
        return _ok("resolver-key", "every tool is idempotent or reconcilable")
    return _ok("resolver-key", f"unsafe tools {unsafe}; resolver keys {sorted(options.app.resolver_keys)}")


def check_clock_skew(settings: Settings, options: DoctorOptions) -> CheckResult:
    """This process's clock (with ``SETTLED_CLOCK_OFFSET_S``, as a worker's) is within bounds of the broker's.

    Probe records are written to the doctor's scratch topic, whose ``LogAppendTime`` the broker stamps; the skew is
    that stamp minus the midpoint of the local send and acknowledgement times (error bound: half the round trip).

    Args:
        settings: The Kafka connection, the namespace and the clock offset.
        options: The call timeout and the largest accepted skew.

    Returns:
        ok with the skew in ms, or failed when it exceeds ``max_clock_skew_s`` or no stamp came back.
    """
    topic = settings.topic("doctor")
    try:
        _ensure_scratch_topic(settings, topic, options.timeout_s)
    except KafkaException as exc:
        return _failed("clock-skew", f"cannot create the scratch topic {topic}: {exc}")
    producer = Producer(producer_config(settings))
    probes: list[tuple[float, float, int]] = []  # (sent, acknowledged, broker stamp): seconds, seconds, ms
    for _ in range(_CLOCK_PROBES):  # the first pays for the connection; the tightest round trip is kept
        probe = _clock_probe(producer, topic, settings.clock_offset_s, options.timeout_s)
        if isinstance(probe, str):
            return _failed("clock-skew", probe)
        probes.append(probe)
    sent_s, acked_s, broker_ms = min(probes, key=lambda p: p[1] - p[0])
    skew_s = broker_ms / 1000 - (sent_s + acked_s) / 2
    bound_s = (acked_s - sent_s) / 2
    detail = f"broker - local = {skew_s * 1000:+.0f} ms (± {bound_s * 1000:.0f} ms)"
    if settings.clock_offset_s:
        detail += f", SETTLED_CLOCK_OFFSET_S={settings.clock_offset_s:g} included"
    if abs(skew_s) - bound_s > options.max_clock_skew_s:
        return _failed("clock-skew", f"{detail} exceeds {options.max_clock_skew_s:g} s: wait deadlines fire off time")
    return _ok("clock-skew", detail)


#: Probe records per clock check.
_CLOCK_PROBES = 3


def _clock_probe(producer: Producer, topic: str, offset_s: float, timeout_s: float) -> tuple[float, float, int] | str:
    stamps: list[tuple[int, int]] = []
    errors: list[KafkaError] = []

    def delivered(err: KafkaError | None, msg: Any) -> None:
        if err is not None:
            errors.append(err)
        else:
            stamps.append(msg.timestamp())

    sent_s = time.time() + offset_s
    producer.produce(topic, value=b"settled doctor clock probe", on_delivery=delivered)
    producer.flush(timeout_s)
    acked_s = time.time() + offset_s
    if errors or not stamps:
        return f"the probe record was not acknowledged: {errors[0] if errors else f'no answer in {timeout_s:g} s'}"
    kind, broker_ms = stamps[0]
    if broker_ms <= 0:
        return f"the broker returned no LogAppendTime for {topic} (timestamp type {kind})"
    return sent_s, acked_s, broker_ms


def _ensure_scratch_topic(settings: Settings, topic: str, timeout_s: float) -> None:
    admin = AdminClient(admin_config(settings))
    if topic in admin.list_topics(timeout=timeout_s).topics:
        return
    spec = NewTopic(
        topic,
        num_partitions=1,
        replication_factor=-1,
        config={"message.timestamp.type": "LogAppendTime", "retention.ms": str(3_600_000)},
    )
    future = admin.create_topics([spec], request_timeout=timeout_s)[topic]
    try:
        future.result(timeout=timeout_s)
    except KafkaException as exc:
        if exc.args and exc.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS:  # a concurrent doctor made it
            return
        raise


def check_overdue(settings: Settings, options: DoctorOptions) -> CheckResult:
    """No obligation is older than its kind's threshold: an open Unknown, a pending approval, an unsettled submission.

    Args:
        settings: The PostgreSQL DSN and the namespace.
        options: The thresholds (``overdue_after_s``), the schema and the connect timeout.

    Returns:
        ok with the open counts, failed naming each overdue kind with its count and the oldest one's age and id, or
        skipped when PostgreSQL is not checked.
    """
    schema = _projection_schema("overdue", settings, options)
    if isinstance(schema, CheckResult):
        return schema
    query = sql.SQL(
        "SELECT kind, conversation_id, item_id, extract(epoch FROM age) FROM {} ORDER BY since, kind, item_id"
    ).format(sql.Identifier(schema, "obligations"))
    try:
        with psycopg.connect(settings.postgres_dsn, connect_timeout=max(1, round(options.timeout_s))) as conn:
            rows = conn.execute(query).fetchall()
    except psycopg.Error as exc:
        return _failed("overdue", f"PostgreSQL: {exc}".strip())
    open_by_kind: dict[str, int] = {}
    late: dict[str, list[tuple[float, str, str]]] = {}
    for kind, conversation_id, item_id, age_s in rows:
        open_by_kind[kind] = open_by_kind.get(kind, 0) + 1
        if float(age_s) > options.overdue_after_s.get(kind, float("inf")):
            late.setdefault(kind, []).append((float(age_s), conversation_id, item_id))
    if late:
        parts = []
        for kind, items in sorted(late.items()):
            age_s, conversation_id, item_id = max(items)
            parts.append(
                f"{len(items)} {kind} obligation(s) older than {options.overdue_after_s[kind]:g} s, the oldest "
                f"{age_s:.0f} s old ({item_id} in conversation {conversation_id})"
            )
        return _failed("overdue", "; ".join(parts))
    counts = ", ".join(f"{n} open {kind}" for kind, n in sorted(open_by_kind.items())) or "nothing open"
    return _ok("overdue", f"none overdue ({counts})")


#: Each check and the earlier check it needs (skipped when that one failed).
_CHECKS: tuple[tuple[str, Callable[[Settings, DoctorOptions], CheckResult], str | None], ...] = (
    ("broker", check_broker, None),
    ("topics", check_topics, "broker"),
    ("projection-schema", check_projection_schema, None),
    ("transactional-settings", check_transactional_settings, None),
    ("resolver-key", check_resolver_key, None),
    ("clock-skew", check_clock_skew, "broker"),
    ("overdue", check_overdue, "projection-schema"),
)

#: The checks, in the order they run.
CHECK_NAMES: tuple[str, ...] = tuple(name for name, _check, _needs in _CHECKS)


def run_checks(settings: Settings, options: DoctorOptions, only: Sequence[str] = ()) -> list[CheckResult]:
    """Run the checks in `CHECK_NAMES` order.

    Args:
        settings: The deployment's settings.
        options: What the checks compare against.
        only: Check names to run (all when empty).

    Returns:
        One result per check run.

    Raises:
        ValueError: ``only`` names an unknown check.
    """
    unknown = sorted(set(only) - set(CHECK_NAMES))
    if unknown:
        raise ValueError(f"--only {unknown}: no such check; the checks are {list(CHECK_NAMES)}")
    results: dict[str, CheckResult] = {}
    for name, check, needs in _CHECKS:
        if only and name not in only:
            continue
        if needs is not None and needs in results and results[needs].status is CheckStatus.FAILED:
            results[name] = CheckResult(name, CheckStatus.SKIPPED, f"the {needs} check failed")
            continue
        results[name] = check(settings, options)
    return list(results.values())
