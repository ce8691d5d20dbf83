"""`WorkerProcess`: one ``settled worker`` child process, the only spawner of it in tests, bench and the example.

The child is ``python -m settled.services worker --app APP`` with ``SETTLED_NAMESPACE`` and
``SETTLED_KAFKA_BOOTSTRAP`` taken from the given settings; its stdout goes nowhere and its stderr (the worker's
JSON-lines log, tracebacks, stack dumps) to a file — a pipe nobody reads would fill up and block it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from settled._failpoints import FAILPOINT_DIR_ENV_VAR, FAILPOINTS_ENV_VAR, FailpointControl
from settled._settings import Settings

__all__ = ["KILLED_EXIT_CODE", "WorkerProcess"]

#: The exit code `subprocess.Popen` reports for a child ended by SIGKILL (a failpoint's ``kill``).
KILLED_EXIT_CODE = -signal.SIGKILL


def _child_env(
    settings: Settings,
    base_env: Mapping[str, str] | None,
    env: Mapping[str, str] | None,
    control: FailpointControl | None,
    failpoints: str,
) -> dict[str, str]:
    """The child's environment: ``base_env`` (default: this process's) without failpoint variables, then ours."""
    base = os.environ if base_env is None else base_env
    out = {k: v for k, v in base.items() if not k.startswith("SETTLED_FAILPOINT")}
    out.update({"SETTLED_NAMESPACE": settings.namespace, "SETTLED_KAFKA_BOOTSTRAP": settings.kafka_bootstrap})
    out.update(env or {})
    if control is not None:
        out.update(control.env(failpoints))
    elif failpoints:
        out[FAILPOINTS_ENV_VAR] = failpoints
    return out


@dataclass
class WorkerProcess:
    """A running (or ended) ``settled worker`` child, its log file and, when given, its failpoint control folder.

    Build one with `WorkerProcess.start`. The `subprocess.Popen` methods tests use (`poll`, `wait`, `kill`,
    `send_signal`, `pid`, `returncode`) are forwarded.

    Attributes:
        name: The worker id (``--worker-id``; empty: the worker draws one).
        proc: The child process.
        log_path: The file its stderr goes to.
        control: The failpoint control folder it is connected to (None: only spawn-time failpoints, if any).
    """

    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    control: FailpointControl | None = None

    @classmethod
    def start(
        cls,
        settings: Settings,
        *,
        app: str,
        log_path: Path,
        worker_id: str = "",
        instance_id: str = "",
        log_level: str = "",
        control: FailpointControl | None = None,
        failpoints: str = "",
        env: Mapping[str, str] | None = None,
        base_env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        append_log: bool = True,
    ) -> WorkerProcess:
        """Start ``settled worker --app APP`` on ``settings``' namespace and broker.

        Args:
            settings: Namespace and bootstrap servers passed on to the child.
            app: The app reference, ``package.module:attribute`` (e.g. `settled.testing.ECHO_APP`).
            log_path: The child's stderr file (its folder is created when missing).
            worker_id: ``--worker-id`` (empty: the worker draws a random id).
            instance_id: The worker slot's static group membership id (``SETTLED_WORKER_INSTANCE_ID``): a child
                started again with the same id gets its partitions back at once (empty: as ``env`` or this
                process's environment say; dynamic membership when neither sets it).
            log_level: ``--log-level`` (empty: the worker's default, INFO).
            control: A failpoint control folder to connect the child to (hit log, barriers, run-time arming).
            failpoints: Spawn-time failpoint entries (``SETTLED_FAILPOINTS`` grammar, ``settled/_failpoints.py``).
            env: Further environment variables for the child (applied after the namespace and bootstrap).
            base_env: The environment to start from (default: this process's); ``SETTLED_FAILPOINT*`` variables
                are never inherited.
            cwd: The child's working folder (it is on the child's ``sys.path``, so test apps there load).
            append_log: Append to ``log_path`` (False: truncate it first).

        Returns:
            The running child.

        Raises:
            FailpointSpecError: ``failpoints`` does not follow the grammar.
            OSError: The child could not be started.
        """
        argv = [sys.executable, "-m", "settled.services", "worker", "--app", app]
        if worker_id:
            argv += ["--worker-id", worker_id]
        if log_level:
            argv += ["--log-level", log_level]
        child_env = _child_env(settings, base_env, env, control, failpoints)
        if instance_id:
            child_env["SETTLED_WORKER_INSTANCE_ID"] = instance_id
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("ab" if append_log else "wb") as log_file:
            proc = subprocess.Popen(argv, cwd=cwd, env=child_env, stdout=subprocess.DEVNULL, stderr=log_file)
        return cls(worker_id, proc, log_path, control)

    # -- the process ------------------------------------------------------------------------------------------------

    @property
    def pid(self) -> int:
        """The child's process id."""
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        """The child's exit code (negative: the signal that ended it), None while it runs or is not yet reaped."""
        return self.proc.returncode

    def poll(self) -> int | None:
        """Return the child's exit code if it has ended, else None."""
        return self.proc.poll()

    def wait(self, timeout_s: float | None = None) -> int:
        """Wait for the child to end and return its exit code.

        Args:
            timeout_s: Seconds to wait at most (None: no bound).

        Returns:
            The exit code.

        Raises:
            subprocess.TimeoutExpired: It still runs after ``timeout_s``.
        """
        return self.proc.wait(timeout_s)

    def send_signal(self, sig: int) -> None:
        """Send ``sig`` to the child (SIGTERM/SIGINT: a graceful stop; SIGSTOP/SIGCONT: a pause)."""
        self.proc.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL the child."""
        self.proc.kill()

    def dump_stacks(self) -> None:
        """Ask the child to write every thread's stack to its log (SIGUSR1, ``faulthandler``)."""
        self.proc.send_signal(signal.SIGUSR1)

    def stop(self, timeout_s: float = 30.0) -> int:
        """Stop the child gracefully: SIGTERM (a graceful revoke), then SIGKILL if it has not ended in ``timeout_s``.

        Args:
            timeout_s: Seconds to wait for each of the two steps.

        Returns:
            Its exit code (0 after a graceful stop).

        Raises:
            subprocess.TimeoutExpired: It did not end even after SIGKILL.
        """
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait(timeout_s)

    def kill_and_wait(self, timeout_s: float = 30.0) -> int:
        """SIGCONT (in case it is stopped) then SIGKILL the child if it still runs; return its exit code.

        Args:
            timeout_s: Seconds to wait for it to be reaped.

        Returns:
            Its exit code (`KILLED_EXIT_CODE` when this call killed it).

        Raises:
            subprocess.TimeoutExpired: It was not reaped within ``timeout_s``.
        """
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
        return self.proc.wait(timeout_s)

    # -- failpoints -------------------------------------------------------------------------------------------------

    def kill_at(self, name: str, hit: int = 1) -> None:
        """Arm failpoint ``name`` to SIGKILL the child at its ``hit``-th hit from now (run-time arming).

        Every process sharing this child's control folder is armed alike (`FailpointControl.arm`).

        Args:
            name: The failpoint's name, e.g. ``"engine.after_prepared_commit"``.
            hit: Which hit from now kills (1: the next one).

        Raises:
            ValueError: The child was started without a failpoint control folder.
        """
        if self.control is None:
            raise ValueError(
                f"kill_at({name!r}): worker {self.name or self.pid} was started without a failpoint control folder "
                f"({FAILPOINT_DIR_ENV_VAR}); pass control= to WorkerProcess.start"
            )
        self.control.arm(name, f"{hit}*kill")

    # -- the log ----------------------------------------------------------------------------------------------------

    def log_lines(self) -> list[dict[str, Any]]:
        """The child's JSON log lines so far (non-JSON lines, e.g. a traceback, as ``{"raw": line}``)."""
        out: list[dict[str, Any]] = []
        for line in self.log_path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                out.append({"raw": line})
        return out

    def logged(self, message: str) -> list[dict[str, Any]]:
        """The log lines whose message is ``message``."""
        return [line for line in self.log_lines() if line.get("message") == message]

    def tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the child's log, for failure messages (``(no log)`` when there is none)."""
        if not self.log_path.exists():
            return "(no log)"
        text = self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()
        return "\n".join(text[-lines:])
