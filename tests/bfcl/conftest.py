"""Fixtures of the BFCL tests: the shipped corpora (loaded once) and tool-server processes on private SQLite files."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from settled.services.bfcl import Corpus, ToolServerProcess, load_corpus


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
