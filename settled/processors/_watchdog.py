"""A watchdog on the worker loop's turns: exit the process when one phase of a turn does not finish in time.

librdkafka 2.16's ``send_offsets_to_transaction`` can block past its timeout when the group coordinator goes away
(confluentinc/librdkafka#5456; docs/architecture.md "Known limit: a worker can stall across a broker restart"). A
blocked C call cannot be interrupted from Python, so the worker loop marks what it is doing in a `PhaseStamp`
(``"checkpoint of partition 3"``, started at a monotonic time, with a bound), and a `TurnWatchdog` thread checks the
stamp. When a phase runs past its bound the watchdog logs CRITICAL naming the phase, dumps every thread's stack to
stderr and ends the process with `WATCHDOG_EXIT_CODE` through ``os._exit``, so a supervisor starts a fresh worker:
its producers, with the same ``transactional.id``, fence the stuck one, and the claim's recovery takes it from there
(nothing the stuck owner staged ever commits; docs/design.md §3).

Only time the process was running counts: `StallMeter` credits each check with the time since the previous one, at
most `MAX_CREDIT_INTERVALS` check intervals, so a process that was stopped (SIGSTOP, a suspended VM) is not ended for
the pause the moment it resumes; a stuck C call leaves the watchdog thread running, and its time counts in full.

Phases nest: a phase entered while another is open (a checkpoint inside a graceful release, a release inside a poll's
revoke callback) replaces it; when the inner one ends the outer one is stamped again with a fresh start, so every
stretch of work between two phase boundaries is bounded by the bound of the phase it belongs to.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import NamedTuple

from settled._settings import Settings

__all__ = [
    "MAX_CREDIT_INTERVALS",
    "WATCHDOG_EXIT_CODE",
    "Phase",
    "PhaseStamp",
    "StallMeter",
    "TurnWatchdog",
    "default_turn_watchdog_s",
    "turn_watchdog_s",
]

_log = logging.getLogger(__name__)

#: The exit code of a worker the watchdog ended (``EX_TEMPFAIL`` of sysexits.h: "temporary failure, retry"). Distinct
#: from ``settled worker``'s other codes: 0 a graceful stop, 1 an unhandled error, 2 an app that does not load.
WATCHDOG_EXIT_CODE = 75

#: Blocking Kafka calls one partition's checkpoint may make in a normal transaction and its abort path, each bounded
#: by ``Settings.kafka_call_timeout_s``: the new producer's init_transactions when the last transaction's offsets were
#: refused (appender step 6), flush, send_offsets_to_transaction, commit_transaction, abort_transaction, and after an
#: abort the end-offset read of the LSO wait and the retry's flush (`settled.producers`' appender).
_CHECKPOINT_CALLS = 7

#: A check credits the phase with at most this many check intervals, however long ago the previous check was.
MAX_CREDIT_INTERVALS = 3.0

#: The smallest derived bound, in seconds: a busy 2-core host must never trip the watchdog on a healthy turn.
_MIN_DERIVED_S = 60.0


def default_turn_watchdog_s(settings: Settings) -> float:
    """The derived bound of one phase of a worker turn, in seconds (used when none is configured).

    One phase is at most one partition's checkpoint: its transaction's blocking calls are each bounded by
    ``kafka_call_timeout_s`` (`_CHECKPOINT_CALLS` of them on the abort path), and the coordinator aborts a transaction
    older than ``transaction_timeout_ms``. The bound is their sum, and at least 60 s (100 s with the default 10 s
    call timeout and 30 s transaction timeout, 72.5 s with the dev stack's 2.5 s): well above anything a healthy turn
    waits for, so a firing means a call ignored its own timeout. Claims and graceful releases get more (see
    `settled.processors.Worker`).

    Args:
        settings: The Kafka timeouts.

    Returns:
        The bound, in seconds.
    """
    derived = _CHECKPOINT_CALLS * settings.kafka_call_timeout_s + settings.transaction_timeout_ms / 1000
    return max(_MIN_DERIVED_S, derived)


def turn_watchdog_s(configured_s: float | None, settings: Settings) -> float:
    """The bound of one phase of a worker turn, in seconds; 0 disables the watchdog.

    Args:
        configured_s: ``WorkerConfig.turn_watchdog_s``; ``None`` takes ``Settings.worker_turn_watchdog_s``, and when
            that is unset too, `default_turn_watchdog_s`.
        settings: The settings.

    Returns:
        The bound (0.0: no watchdog).

    Raises:
        ValueError: The configured bound is negative or not finite.
    """
    value = configured_s if configured_s is not None else settings.worker_turn_watchdog_s
    if value is None:
        return default_turn_watchdog_s(settings)
    if not value >= 0.0 or value == float("inf"):
        raise ValueError(f"turn_watchdog_s must be a finite number of seconds >= 0 (0 disables it), got {value!r}")
    return float(value)


class Phase(NamedTuple):
    """What the worker loop is doing now (a tuple: built on every phase of every turn, a frozen dataclass costs more).

    Attributes:
        name: What the loop does, e.g. ``"checkpoint of partition 3"``.
        started_at_s: When it started, on the monotonic clock, in seconds.
        bound_s: How long it may take, in seconds.
    """

    name: str
    started_at_s: float
    bound_s: float


@dataclass
class PhaseStamp:
    """The worker loop's current phase, written by the loop thread and read by the watchdog thread.

    Only the loop thread enters and leaves phases; the watchdog reads `current`, one attribute holding an immutable
    `Phase` (a single reference assignment, atomic for the reader).

    Attributes:
        clock: The monotonic clock, in seconds (a test passes a fake one).
    """

    clock: Callable[[], float] = time.monotonic
    _current: Phase | None = field(default=None, init=False)
    _open: list[tuple[str, float]] = field(default_factory=list, init=False)

    @property
    def current(self) -> Phase | None:
        """The phase in progress, or ``None`` when the loop is in none."""
        return self._current

    @contextmanager
    def phase(self, name: str, bound_s: float) -> Iterator[None]:
        """Stamp ``name`` as the phase in progress for the block; when it ends, stamp the enclosing one afresh.

        Args:
            name: What the loop does, naming the partition when there is one (shown when the watchdog fires).
            bound_s: How long the block may take, in seconds.

        Yields:
            Nothing.

        Raises:
            ValueError: ``bound_s`` is not a positive number.
        """
        if not bound_s > 0.0:
            raise ValueError(f"phase {name!r}: bound_s must be > 0, got {bound_s!r}")
        self._open.append((name, bound_s))
        self._current = Phase(name, self.clock(), bound_s)
        try:
            yield
        finally:
            self._open.pop()
            if self._open:
                outer, outer_bound_s = self._open[-1]
                self._current = Phase(outer, self.clock(), outer_bound_s)
            else:
                self._current = None


@dataclass
class StallMeter:
    """How long the current phase has been running while the process ran, checked at regular ticks (pure logic).

    Each `check` credits the phase seen with the time since the previous check, at most ``max_credit_s`` (so a
    stopped process's pause counts as one short tick). A phase first seen is credited with the time since it
    started, within the same cap.

    Attributes:
        started_at_s: The monotonic time of the first check's predecessor (the watchdog's start), in seconds.
        max_credit_s: The most one check credits, in seconds.
    """

    started_at_s: float
    max_credit_s: float
    _last_s: float | None = field(default=None, init=False)
    _watched: Phase | None = field(default=None, init=False)
    _running_s: float = field(default=0.0, init=False)

    def check(self, phase: Phase | None, now_s: float) -> tuple[Phase, float] | None:
        """Credit ``phase`` (the stamp's current phase at ``now_s``) and say whether it ran past its bound.

        Args:
            phase: The phase in progress (``None``: the loop is between phases).
            now_s: The monotonic time of the check, in seconds.

        Returns:
            The overdue phase and the seconds it has run, or ``None``.
        """
        last_s = self.started_at_s if self._last_s is None else self._last_s
        credit_s = min(max(0.0, now_s - last_s), self.max_credit_s)
        self._last_s = now_s
        if phase is None:
            self._watched = None
            return None
        if phase is not self._watched:
            self._watched = phase
            self._running_s = min(max(0.0, now_s - phase.started_at_s), credit_s)
        else:
            self._running_s += credit_s
        if self._running_s > phase.bound_s:
            return phase, self._running_s
        return None


def _die(phase: Phase, elapsed_s: float) -> None:
    """Log the stall, dump every thread's stack to stderr and end the process with `WATCHDOG_EXIT_CODE`."""
    _log.critical(
        "worker turn stalled: %s has not finished after %.1f s (bound %.1f s); exiting %d so a supervisor restarts "
        "the worker (a fresh owner fences the stuck producer; docs/architecture.md, librdkafka#5456)",
        phase.name,
        elapsed_s,
        phase.bound_s,
        WATCHDOG_EXIT_CODE,
        extra={"phase": phase.name, "elapsed_s": round(elapsed_s, 3), "bound_s": phase.bound_s},
    )
    for handler in logging.getLogger().handlers:
        handler.flush()
    try:
        sys.stderr.flush()
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # stderr replaced by one without a descriptor (a test's capture)
        fd = 2
    faulthandler.dump_traceback(file=fd, all_threads=True)
    os._exit(WATCHDOG_EXIT_CODE)  # a thread stuck in a C call cannot be interrupted: end the process without cleanup


@dataclass
class TurnWatchdog:
    """A daemon thread that ends the process when the worker loop's current phase runs past its bound.

    Attributes:
        stamp: The loop's phase stamp.
        check_interval_s: How often the stamp is checked, in seconds (a firing comes at most this late).
        on_expiry: Called once with the overdue phase and the seconds it ran; the default logs CRITICAL, dumps every
            thread's stack to stderr and calls ``os._exit(WATCHDOG_EXIT_CODE)``. A test passes a recorder.
    """

    stamp: PhaseStamp
    check_interval_s: float = 1.0
    on_expiry: Callable[[Phase, float], None] = _die
    _stopped: threading.Event = field(default_factory=threading.Event, init=False)
    _thread: threading.Thread | None = field(default=None, init=False)

    @staticmethod
    def interval_for(bound_s: float) -> float:
        """A check interval for ``bound_s``: a tenth of it, between 50 ms and 1 s.

        Args:
            bound_s: The smallest phase bound watched, in seconds.

        Returns:
            The interval, in seconds.
        """
        return min(1.0, max(0.05, bound_s / 10))

    def start(self) -> None:
        """Start the watchdog thread (a daemon: it never keeps the process alive).

        Raises:
            RuntimeError: It was started already.
        """
        if self._thread is not None:
            raise RuntimeError("TurnWatchdog.start: already started")
        self._thread = threading.Thread(target=self._watch, name="settled-turn-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop watching and wait for the thread to end."""
        self._stopped.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _watch(self) -> None:
        meter = StallMeter(self.stamp.clock(), MAX_CREDIT_INTERVALS * self.check_interval_s)
        while not self._stopped.wait(self.check_interval_s):
            overdue = meter.check(self.stamp.current, self.stamp.clock())
            if overdue is not None:
                self.on_expiry(*overdue)
                return
