"""Fixtures of the HTTP API tests: topics, a live projection, `settled worker` and `settled api` children, tokens."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

from settled import _failpoints
from settled._settings import Settings
from settled.api import Scope, TokenStore, default_tokens_schema
from settled.projections._schema import ProjectionNames
from settled.testing import ApiProcess, WorkerProcess
from tests.conftest import Provisioned
from tests.integration.api.api_app import API_KEY_ID
from tests.integration.engine.engine_app import APPROVER_KEY_ID, RESOLVER_KEY_ID, RESOLVER_PRIVATE_KEY, WORLD_ENV
from tests.integration.helpers import fresh_projection, projecting

ROOT = Path(__file__).resolve().parents[3]
API_APP = "tests.integration.api.api_app:app"


@pytest.fixture
def topics(provisioned: Provisioned) -> Settings:
    """The test's namespace with its topics provisioned, one partition."""
    return provisioned(1)


@pytest.fixture
def names(topics: Settings, postgres_dsn: str) -> Iterator[ProjectionNames]:
    """A projection of the test's log, kept live by a projector thread for the whole test."""
    with fresh_projection(postgres_dsn) as projection, projecting(topics, projection):
        yield projection


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    """The engine app's approver/resolver key as a PEM file (the API signs with it)."""
    path = tmp_path / "api-key.pem"
    path.write_bytes(RESOLVER_PRIVATE_KEY.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()))
    return path


StartApi = Callable[..., ApiProcess]


@pytest.fixture
def start_api(topics: Settings, names: ProjectionNames, key_file: Path, tmp_path: Path) -> Iterator[StartApi]:
    """Factory: start a ``settled api`` child on the test's namespace and projection (stopped at teardown)."""
    children: list[ApiProcess] = []

    def start(*args: str, port: int | None = None) -> ApiProcess:
        api = ApiProcess.start(
            topics,
            schema=names.base,
            log_path=tmp_path / "api.log",
            port=port,
            args=(
                "--approver-key",
                str(key_file),
                "--approver-key-id",
                APPROVER_KEY_ID,
                "--resolver-key",
                str(key_file),
                "--resolver-key-id",
                RESOLVER_KEY_ID,
                "--signing-key",
                str(key_file),
                "--signing-key-id",
                API_KEY_ID,
                *args,
            ),
        )
        children.append(api)
        return api

    yield start
    for api in children:
        api.stop()


@pytest.fixture
def tokens(topics: Settings, names: ProjectionNames) -> TokenStore:
    """The API's tokens table."""
    store = TokenStore(topics.postgres_dsn, default_tokens_schema(names.base))
    store.ensure()
    return store


TokenFactory = Callable[..., str]


@pytest.fixture
def token(tokens: TokenStore) -> TokenFactory:
    """Factory: ``token("alice", "submit", "read")`` → a bearer token of that principal and scopes."""

    def make(principal: str, *scopes: str) -> str:
        return tokens.create(principal, frozenset(Scope(s) for s in scopes))[1]

    return make


def http(api: ApiProcess, bearer: str, timeout_s: float = 60.0) -> httpx.Client:
    """An HTTP client of ``api`` sending ``bearer``."""
    return httpx.Client(base_url=api.url, headers={"Authorization": f"Bearer {bearer}"}, timeout=timeout_s)


SpawnWorker = Callable[..., WorkerProcess]


@pytest.fixture
def spawn_worker(topics: Settings, tmp_path: Path) -> Iterator[SpawnWorker]:
    """Factory: a ``settled worker`` child running the engine test app (killed at teardown if still running)."""
    children: list[WorkerProcess] = []
    control = _failpoints.FailpointControl(tmp_path / "fp")

    def spawn(name: str, *, failpoints: str = "") -> WorkerProcess:
        proc = WorkerProcess.start(
            topics,
            app=API_APP,
            log_path=tmp_path / f"{name}.log",
            worker_id=name,
            control=control,
            failpoints=failpoints,
            env={WORLD_ENV: str(tmp_path / "world.sqlite")},
            cwd=ROOT,
            append_log=False,
        )
        children.append(proc)
        return proc

    yield spawn
    for proc in children:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
