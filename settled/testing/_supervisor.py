"""`Supervisor`: keeps one worker position running, as systemd ``Restart=always`` or a Deployment would.

README, "Operating": workers belong under a supervisor that restarts one that exits (a crash, a failpoint's kill, the
turn watchdog's 75). The supervisor here is polled — the caller decides when to look (its own loop) and what an
exit means to it (`exit_code` before `restart`, or `check` for both); it starts no thread of its own.
"""

from __future__ import annotations

from collections.abc import Callable

from settled.testing._process import WorkerProcess

__all__ = ["Supervisor"]


class Supervisor:
    """One worker position: its current `WorkerProcess` and every exit code seen so far.

    Args:
        start: Starts incarnation ``n`` (0 for the first, 1 after the first restart, ...) and returns it.
    """

    def __init__(self, start: Callable[[int], WorkerProcess]) -> None:
        self._start = start
        self._worker: WorkerProcess | None = None
        #: Exit codes of the incarnations that ended, in order.
        self.exits: list[int] = []
        #: Incarnations started so far.
        self.incarnations = 0

    @property
    def worker(self) -> WorkerProcess:
        """The current incarnation.

        Raises:
            RuntimeError: Nothing was started yet.
        """
        if self._worker is None:
            raise RuntimeError("the supervisor has not started a worker yet: call start()")
        return self._worker

    @property
    def restarts(self) -> int:
        """Restarts done (incarnations after the first)."""
        return max(self.incarnations - 1, 0)

    def start(self) -> WorkerProcess:
        """Start the first incarnation (or a new one after `stop`) and return it."""
        self._worker = self._start(self.incarnations)
        self.incarnations += 1
        return self._worker

    def exit_code(self) -> int | None:
        """The current incarnation's exit code once it has ended (None: it runs, or nothing was started)."""
        return None if self._worker is None else self._worker.poll()

    def restart(self) -> WorkerProcess:
        """Record the current incarnation's exit code and start the next one.

        Returns:
            The new incarnation.

        Raises:
            RuntimeError: The current incarnation still runs (stop or kill it first).
        """
        code = self.exit_code()
        if self._worker is not None:
            if code is None:
                raise RuntimeError(f"restart: worker {self._worker.name or self._worker.pid} still runs")
            self.exits.append(code)
        return self.start()

    def check(self) -> int | None:
        """Restart the worker if it has exited.

        Returns:
            The ended incarnation's exit code when it was restarted, None when it still runs.
        """
        code = self.exit_code()
        if code is None:
            return None
        self.restart()
        return code

    def stop(self, timeout_s: float = 15.0) -> int | None:
        """Stop the current incarnation gracefully (`WorkerProcess.stop`); no restart follows.

        Args:
            timeout_s: Seconds for the graceful stop, and again for the SIGKILL after it.

        Returns:
            Its exit code (None: nothing was started).
        """
        if self._worker is None:
            return None
        return self._worker.stop(timeout_s)
