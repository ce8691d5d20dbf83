"""The tests' one worker spawner: a ``settled worker`` child (`settled.testing.WorkerProcess`) run from the
repository root, so that the test apps under ``tests/`` load in it."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from settled._failpoints import FailpointControl
from settled._settings import Settings
from settled.testing import ECHO_APP, WorkerProcess

#: The repository root: the children's working folder (on their ``sys.path``).
ROOT = Path(__file__).resolve().parents[2]


def start_worker(
    s: Settings,
    log_path: Path,
    *,
    name: str = "",
    instance_id: str = "",
    app: str = ECHO_APP,
    control: FailpointControl | None = None,
    failpoints: str = "",
    env: Mapping[str, str] | None = None,
    log_level: str = "",
    append_log: bool = True,
) -> WorkerProcess:
    """Start a ``settled worker`` child on ``s``'s namespace and broker; the caller kills what it started.

    Args:
        s: The test's settings (namespace and bootstrap servers are passed on).
        log_path: The child's log file (stderr; a file, never a pipe: a full pipe would block the worker).
        name: The worker id (``--worker-id``; empty: a random one).
        instance_id: The worker slot's static membership id (``SETTLED_WORKER_INSTANCE_ID``; empty: dynamic).
        app: The app (``module:attribute``); the echo app by default.
        control: A failpoint control folder to connect the child to (hit log, barriers, run-time arming).
        failpoints: Spawn-time failpoint entries (``SETTLED_FAILPOINTS``).
        env: Further environment variables (``SETTLED_FAILPOINT*`` of the test process are never inherited).
        log_level: The child's log level (empty: the worker's default, INFO).
        append_log: Append to ``log_path`` (False: truncate it first).

    Returns:
        The running child.
    """
    return WorkerProcess.start(
        s,
        app=app,
        log_path=log_path,
        worker_id=name,
        instance_id=instance_id,
        log_level=log_level,
        control=control,
        failpoints=failpoints,
        env=env,
        cwd=ROOT,
        append_log=append_log,
    )
