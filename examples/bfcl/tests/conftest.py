"""Fixtures of the BFCL tests: the shipped corpora (loaded once) and tool-server processes on private SQLite files.

The CI slice's broker and PostgreSQL come from settled's own test fixtures (``tests/conftest.py``: the environment's
services, testcontainers or the local stack); run these tests from the repository's root, as
``scripts/run_suites.py`` does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from settled_bfcl import Corpus, ToolServerProcess, load_corpus
from tests.conftest import _services, kafka_admin, kafka_bootstrap, namespace, postgres_dsn, settings

# settled's fixtures the slice uses (its services, a namespace and its settings):
__all__ = ["_services", "kafka_admin", "kafka_bootstrap", "namespace", "postgres_dsn", "settings"]


@pytest.fixture(scope="session")
def base_corpus() -> Corpus:
    return load_corpus("base")


@pytest.fixture(scope="session")
def miss_func_corpus() -> Corpus:
    return load_corpus("miss_func")


ToolServerFactory = Callable[..., ToolServerProcess]


@pytest.fixture
def toolserver(tmp_path: Path) -> Iterator[ToolServerFactory]:
    """Start tool servers (each on its own SQLite file unless ``db_path`` is given); all are stopped at teardown."""
    started: list[ToolServerProcess] = []

    def make(*, db_path: Path | None = None, **kwargs: Any) -> ToolServerProcess:
        path = db_path if db_path is not None else tmp_path / f"toolserver-{len(started)}.sqlite"
        server = ToolServerProcess(path, **kwargs)
        started.append(server)
        return server.start()

    yield make
    for server in started:
        server.stop()
