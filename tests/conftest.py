"""Shared fixtures: a real Kafka broker and a real PostgreSQL for every integration test (docs/design.md §8).

Where the services come from, in order: ``SETTLED_KAFKA_BOOTSTRAP`` / ``SETTLED_POSTGRES_DSN`` when set; a
testcontainers container when a Docker engine answers; otherwise the local dev stack (``settled dev up``), started
here if it is not running. The tests run with the dev stack's short Kafka timeouts (`settled._settings.DEV_TIMEOUTS`,
not `Settings`' production defaults): `pytest_configure` puts them in this process's environment, so every `Settings`
a test builds and every worker or CLI process it spawns (they inherit the environment) takes them; a test or a
developer's shell that sets one explicitly keeps its value. Each test gets its own namespace (topic prefix, consumer
group and ``transactional.id`` prefix) and its own database schema, both removed at teardown, so one small broker
holds a whole run. The ``private_broker`` and ``private_postgres`` factories start instances a test may stop, kill
and restart.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import psycopg
import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from settled._settings import DEV_TIMEOUTS, Settings
from settled.producers import admin_config
from settled.producers._topics import provision_topics
from settled.schemas import Codec
from settled.services._devstack import (
    DevStack,
    KafkaBroker,
    PostgresServer,
    free_port,
    resolve_kafka_jars,
)

_ADMIN_TIMEOUT_S = 30.0


def pytest_configure(config: pytest.Config) -> None:
    from hypothesis import settings as hsettings

    hsettings.register_profile("ci", deadline=None, max_examples=60, derandomize=False, print_blob=True)
    hsettings.register_profile("dev", deadline=None, max_examples=30)
    hsettings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))
    for name, value in DEV_TIMEOUTS.items():  # the short test timeouts, for this process and every child
        os.environ.setdefault(f"SETTLED_{name.upper()}", str(value))


def _docker_engine_answers() -> bool:
    if os.environ.get("SETTLED_TESTCONTAINERS", "1") == "0":
        return False
    try:
        import docker

        docker.from_env(timeout=2).ping()
    except Exception:  # noqa: BLE001 - any failure means "no engine": we fall back to the local stack
        return False
    return True


@pytest.fixture(scope="session")
def _services() -> Iterator[tuple[str, str]]:
    bootstrap = os.environ.get("SETTLED_KAFKA_BOOTSTRAP", "")
    dsn = os.environ.get("SETTLED_POSTGRES_DSN", "")
    if bootstrap and dsn:
        yield bootstrap, dsn
        return
    if _docker_engine_answers():
        from testcontainers.kafka import KafkaContainer
        from testcontainers.postgres import PostgresContainer

        with (
            KafkaContainer("apache/kafka:4.1.1").with_kraft() as kafka,
            PostgresContainer("postgres:16", driver=None) as pg,
        ):
            yield (bootstrap or kafka.get_bootstrap_server()), (dsn or pg.get_connection_url())
        return
    from settled.services._cli_dev import stack_from_settings

    stack: DevStack = stack_from_settings(Settings())
    got_bootstrap, got_dsn = stack.up()
    yield (bootstrap or got_bootstrap), (dsn or got_dsn)


@pytest.fixture(scope="session")
def kafka_bootstrap(_services: tuple[str, str]) -> str:
    """``bootstrap.servers`` of the session's broker."""
    return _services[0]


@pytest.fixture(scope="session")
def postgres_dsn(_services: tuple[str, str]) -> str:
    """Connection string of the session's PostgreSQL."""
    return _services[1]


@pytest.fixture(scope="session")
def kafka_admin(kafka_bootstrap: str) -> AdminClient:
    return AdminClient(admin_config(Settings(kafka_bootstrap=kafka_bootstrap)))


@pytest.fixture
def namespace(kafka_admin: AdminClient) -> Iterator[str]:
    """A fresh namespace; every topic under it is deleted at teardown."""
    ns = f"t{uuid.uuid4().hex[:10]}"
    yield ns
    topics = [t for t in kafka_admin.list_topics(timeout=_ADMIN_TIMEOUT_S).topics if t.startswith(f"{ns}.")]
    if topics:
        for fut in kafka_admin.delete_topics(topics, operation_timeout=_ADMIN_TIMEOUT_S).values():
            fut.result()


@pytest.fixture
def settings(namespace: str, kafka_bootstrap: str, postgres_dsn: str) -> Settings:
    """Settings bound to this test's namespace and the session's services, with the dev stack's short timeouts."""
    s = Settings(namespace=namespace, kafka_bootstrap=kafka_bootstrap, postgres_dsn=postgres_dsn)
    assert s.timeouts_env() == {k: os.environ[k] for k in s.timeouts_env()}, "children would run other timeouts"
    return s


#: ``provisioned(partitions)`` → the test's settings with that many partitions, every settled topic provisioned.
Provisioned = Callable[[int], Settings]


@pytest.fixture
def provisioned(settings: Settings) -> Provisioned:
    """Factory: ``provisioned(2)`` provisions every settled topic of the test's namespace with 2 partitions and
    returns the test's settings with ``partitions=2`` (the ``topics`` fixture calls it with the test's marker)."""

    def make(partitions: int) -> Settings:
        s = settings.model_copy(update={"partitions": partitions})
        provision_topics(s, Codec(), datetime.now(UTC))
        return s

    return make


def marked_partitions(node: pytest.Item) -> int:
    """The partition count a test asks for with ``@pytest.mark.partitions(n)`` (on it, its class or its module's
    ``pytestmark``); 1 without the marker.

    Args:
        node: The test item.

    Returns:
        The number of partitions of every settled topic of the test's namespace.

    Raises:
        pytest.UsageError: The marker does not hold exactly one positive int.
    """
    marker = node.get_closest_marker("partitions")
    if marker is None:
        return 1
    args = (*marker.args, *marker.kwargs.values())
    if len(args) != 1 or not isinstance(args[0], int) or isinstance(args[0], bool) or args[0] < 1:
        raise pytest.UsageError(
            f"{node.nodeid}: @pytest.mark.partitions takes one positive int (partitions), got {marker.args!r} "
            f"{marker.kwargs!r}"
        )
    return args[0]


@pytest.fixture
def topics(request: pytest.FixtureRequest, provisioned: Provisioned) -> Settings:
    """The test's namespace with every settled topic provisioned, with ``@pytest.mark.partitions(n)`` partitions
    (1 without the marker); the test's settings carry that count."""
    return provisioned(marked_partitions(request.node))


TopicFactory = Callable[..., str]


@pytest.fixture
def make_topic(namespace: str, kafka_admin: AdminClient) -> TopicFactory:
    """Factory: ``make_topic("inbox", partitions=3, config={...})`` creates ``<namespace>.inbox``; returns the name."""

    def make(name: str, partitions: int = 1, config: dict[str, str] | None = None) -> str:
        topic = f"{namespace}.{name}"
        fut = kafka_admin.create_topics(
            [NewTopic(topic, num_partitions=partitions, replication_factor=1, config=config or {})],
            operation_timeout=_ADMIN_TIMEOUT_S,
        )[topic]
        fut.result()
        return topic

    return make


@pytest.fixture
def pg_schema(postgres_dsn: str) -> Iterator[str]:
    """A fresh database schema, dropped at teardown."""
    schema = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    yield schema
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


@pytest.fixture(scope="session")
def kafka_lib_dir() -> Path:
    """The Maven-resolved broker jars, shared by every private broker."""
    s = Settings()
    return resolve_kafka_jars(s.jar_cache_dir, s.kafka_version, s.log4j2_version)


@pytest.fixture
def private_broker(tmp_path: Path, kafka_lib_dir: Path) -> Iterator[Callable[..., KafkaBroker]]:
    """Factory of private brokers on free ports; each is killed at teardown. Call ``.start()`` yourself."""
    made: list[KafkaBroker] = []

    def make(overrides: dict[str, str] | None = None) -> KafkaBroker:
        broker = KafkaBroker(
            home=tmp_path / f"kafka{len(made)}",
            lib_dir=kafka_lib_dir,
            port=free_port(),
            controller_port=free_port(),
            heap_mb=384,
            overrides=overrides or {},
        )
        made.append(broker)
        return broker

    yield make
    for broker in made:
        broker.kill()


@pytest.fixture
def private_postgres(tmp_path: Path) -> Iterator[Callable[[], PostgresServer]]:
    """Factory of private PostgreSQL servers on free ports; each is destroyed at teardown. Call ``.start()``."""
    made: list[PostgresServer] = []

    def make() -> PostgresServer:
        server = PostgresServer(home=tmp_path / f"pg{len(made)}-{uuid.uuid4().hex[:6]}", port=free_port())
        made.append(server)
        return server

    yield make
    for server in made:
        server.destroy()
