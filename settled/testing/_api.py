"""`ApiProcess`: a ``settled api`` child process for tests and benchmarks (issue 20)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from settled._settings import Settings

__all__ = ["ApiProcess", "free_port"]


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (the kernel's choice for port 0).

    Returns:
        The port.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class ApiProcess:
    """A running ``settled api`` child.

    Attributes:
        proc: The child process.
        port: The port it listens on (127.0.0.1).
        log_path: Its stderr file.
    """

    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        """The base URL, ``http://127.0.0.1:<port>``."""
        return f"http://127.0.0.1:{self.port}"

    @classmethod
    def start(
        cls,
        settings: Settings,
        *,
        schema: str,
        log_path: Path,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        port: int | None = None,
        ready_timeout_s: float = 30.0,
    ) -> ApiProcess:
        """Start ``settled api`` on ``settings``' namespace, broker and PostgreSQL and wait until it answers.

        Args:
            settings: Namespace, bootstrap servers and PostgreSQL DSN passed on to the child.
            schema: The projection schema (``--schema``).
            log_path: The child's stderr file (appended to).
            args: Further ``settled api`` arguments (``--approver-key``, ``--submit-timeout-s``, ...).
            env: Further environment variables.
            port: The port (default: a free one).
            ready_timeout_s: Longest wait for its first answer, in seconds.

        Returns:
            The running child, answering HTTP.

        Raises:
            RuntimeError: It ended, or did not answer within ``ready_timeout_s`` (its log's tail is in the message).
        """
        chosen = port if port is not None else free_port()
        argv = [sys.executable, "-m", "settled.services", "api", "--port", str(chosen), "--schema", schema, *args]
        child_env = {k: v for k, v in os.environ.items() if not k.startswith("SETTLED_FAILPOINT")}
        child_env.update(
            {
                "SETTLED_NAMESPACE": settings.namespace,
                "SETTLED_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
                "SETTLED_POSTGRES_DSN": settings.postgres_dsn,
            }
        )
        child_env.update(env or {})
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("ab") as log_file:
            proc = subprocess.Popen(argv, env=child_env, stdout=subprocess.DEVNULL, stderr=log_file)
        api = cls(proc, chosen, log_path)
        api.wait_ready(ready_timeout_s)
        return api

    def wait_ready(self, timeout_s: float) -> None:
        """Wait until ``GET /openapi.json`` answers 200.

        Args:
            timeout_s: Longest wait, in seconds.

        Raises:
            RuntimeError: The child ended, or did not answer in time.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"settled api exited {self.proc.returncode}: {self._tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/openapi.json", timeout=2) as answer:
                    if answer.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass  # not listening yet
            if time.monotonic() >= deadline:
                raise RuntimeError(f"settled api did not answer within {timeout_s} s: {self._tail()}")
            time.sleep(0.1)

    def _tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-2000:]
        except OSError as exc:
            return f"(log unreadable: {exc})"

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM the child (uvicorn shuts down gracefully), SIGKILL it if it has not ended in ``timeout_s``.

        Args:
            timeout_s: Seconds to wait for each step.

        Returns:
            Its exit code.
        """
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait(timeout_s)
