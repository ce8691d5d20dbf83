r"""Failpoints: named hooks in product code that tests arm per hit to crash, stall or pause a process (issue 3).

Product code (producers, processors, projections, runtime; never ``settled.protocol``, which does no I/O —
docs/design.md §1b) marks a point with ``failpoint("appender.after_produce")``. Disarmed — neither
``SETTLED_FAILPOINTS`` nor ``SETTLED_FAILPOINT_DIR`` set — a call costs one module-global lookup: the
environment is read once, at the first call, and never touched again (no import-time side effects).

Spawn-time arming (``SETTLED_FAILPOINTS``, read once at the first hit)::

    spec    := entry (";" entry)*                 empty entries and blanks around tokens are ignored
    entry   := name "=" [trigger "*"] action      no trigger: every hit
    name    := [a-z0-9_]+ ("." [a-z0-9_]+)*       e.g. appender.after_produce
    trigger := N                                  the Nth hit only (N >= 1)
             | N "+"                              the Nth hit and every later one
    action  := "kill"                             SIGKILL itself (returncode -9)
             | "stop"                             SIGSTOP itself (the test sends SIGCONT)
             | "raise"                            raise FailpointError
             | "exit(" code ")"                   os._exit(code): no cleanup, like a crash with a code
             | "delay(" dur ["," jitter] ")"      sleep dur plus a seeded uniform jitter in [0, jitter)
             | "pause" ["(" timeout ")"]          barrier: wait for the test's release (default 30 s)
    dur     := number ("ms" | "s")                e.g. 50ms, 1.5s

Example: ``appender.after_produce=3*kill;worker.before_settle=1*delay(50ms)``. Hits are counted per process
and per name; an entry counts the hits of its name from the moment it takes effect (process start for spawn-time
entries). Several entries may name the same point; all that trigger on a hit act in order. The jitter of
``delay`` comes from ``random.Random(f"{seed}/{name}")`` with ``seed`` from ``SETTLED_FAILPOINT_SEED`` (default
0), so a run is replayable from its seed.

Run-time arming and observation through the control folder ``SETTLED_FAILPOINT_DIR`` (see
:class:`FailpointControl`, the test-side API)::

    arm/<name>@<seq>        an arming (content: "[trigger*]action"), renamed in atomically by the test;
                            present = in effect, removed = disarmed. Its trigger counts hits from pickup.
    hits/<pid>.log          the hit log: one line "<name>\t<n>\t<actions or ->" per hit, written before acting
    reached/<name>@<pid>@<n>   the process waits at a barrier (written by the process)
    release/<name>@<pid>@<n>   the test releases that barrier; the process removes both files and goes on
    tmp/                    scratch for the test's atomic writes

Pickup is deterministic: every hit first ``stat``s ``arm/`` and re-lists it only when its mtime changed or is
too recent to trust (a later write in the same coarse timestamp tick would not move it), so an arming whose
rename completed before a hit begins is in effect at that hit, and its ``1*`` is that hit.
"""

from __future__ import annotations

import logging
import os
import random
import re
import signal
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from settled._errors import ErrorCategory, SettledError

__all__ = [
    "FAILPOINTS_ENV_VAR",
    "FAILPOINT_DIR_ENV_VAR",
    "FAILPOINT_SEED_ENV_VAR",
    "BarrierHit",
    "FailpointControl",
    "FailpointError",
    "FailpointSpecError",
    "HitRecord",
    "ScheduledKill",
    "choose_schedule",
    "configure",
    "failpoint",
    "hit_counts",
    "parse_spec",
    "reset",
]

FAILPOINTS_ENV_VAR = "SETTLED_FAILPOINTS"
FAILPOINT_DIR_ENV_VAR = "SETTLED_FAILPOINT_DIR"
FAILPOINT_SEED_ENV_VAR = "SETTLED_FAILPOINT_SEED"

_log = logging.getLogger(__name__)

_NAME_RE = re.compile(r"[a-z0-9_]+(?:\.[a-z0-9_]+)*")
_TRIGGER_RE = re.compile(r"(?P<n>[0-9]+)(?P<onwards>\+?)")
_ACTION_RE = re.compile(r"(?P<kind>[a-z]+)(?:\((?P<args>[^()]*)\))?")
_DURATION_RE = re.compile(r"(?P<value>[0-9]+(?:\.[0-9]+)?)(?P<unit>ms|s)")
_DEFAULT_PAUSE_TIMEOUT_S = 30.0
_BARRIER_POLL_S = 0.005
# A listing of arm/ is trusted only if taken when the folder's mtime was at least this old: file timestamps come
# from a coarse clock (one jiffy, <= 10 ms), so a write within the same tick would leave the mtime unchanged.
_RACY_MTIME_NS = 100_000_000


class FailpointError(SettledError):
    """Raised by a failpoint armed with ``raise``, or by a barrier nobody released in time.

    Product code must let it propagate (never catch it broadly and carry on), so a test sees the failure.

    Attributes:
        name: The failpoint's name.
        hit: The process's hit count of that failpoint when it fired.
    """

    category = ErrorCategory.UNAVAILABLE

    def __init__(self, name: str, hit: int, reason: str) -> None:
        super().__init__(f"failpoint {name!r} hit {hit}: {reason}")
        self.name = name
        self.hit = hit


class FailpointSpecError(SettledError, ValueError):
    """A failpoint spec (``SETTLED_FAILPOINTS``, an arm file, or ``arm()``) does not follow the grammar.

    Attributes:
        spec: The offending text.
    """

    category = ErrorCategory.BAD_INPUT

    def __init__(self, spec: str, problem: str) -> None:
        super().__init__(
            f"bad failpoint spec {spec!r}: {problem} (grammar: name=[N|N+*]action; see settled._failpoints)"
        )
        self.spec = spec


@dataclass(frozen=True)
class _Action:
    kind: str  # kill | stop | raise | exit | delay | pause
    code: int = 0
    duration_s: float = 0.0
    jitter_s: float = 0.0

    def __str__(self) -> str:
        if self.kind == "exit":
            return f"exit({self.code})"
        if self.kind == "delay":
            jitter = f",{self.jitter_s * 1000:g}ms" if self.jitter_s else ""
            return f"delay({self.duration_s * 1000:g}ms{jitter})"
        if self.kind == "pause":
            return f"pause({self.duration_s:g}s)"
        return self.kind


@dataclass(frozen=True)
class _Rule:
    """One parsed entry: which hits of ``name`` (counted from when it takes effect) trigger ``action``."""

    name: str
    nth: int | None  # None: every hit
    onwards: bool
    action: _Action

    def __str__(self) -> str:
        trigger = "" if self.nth is None else f"{self.nth}{'+' if self.onwards else ''}*"
        return f"{self.name}={trigger}{self.action}"

    def fires(self, count: int) -> bool:
        if self.nth is None:
            return True
        return count >= self.nth if self.onwards else count == self.nth


def _parse_duration_s(text: str, spec: str) -> float:
    match = _DURATION_RE.fullmatch(text.strip())
    if match is None:
        raise FailpointSpecError(spec, f"duration {text!r} is not a number followed by 'ms' or 's'")
    value = float(match["value"])
    return value / 1000.0 if match["unit"] == "ms" else value


def _parse_action(text: str, spec: str) -> _Action:
    match = _ACTION_RE.fullmatch(text.strip())
    if match is None:
        raise FailpointSpecError(
            spec, f"action {text!r} is not kill, stop, raise, exit(code), delay(d[,j]), pause[(t)]"
        )
    kind, args = match["kind"], match["args"]
    parts = [] if args is None else [part.strip() for part in args.split(",")]
    if kind in ("kill", "stop", "raise"):
        if args is not None:
            raise FailpointSpecError(spec, f"action {kind!r} takes no arguments")
        return _Action(kind)
    if kind == "exit":
        if len(parts) != 1 or not re.fullmatch(r"[0-9]{1,3}", parts[0]) or int(parts[0]) > 255:
            raise FailpointSpecError(spec, f"exit needs one code 0..255, got {args!r}")
        return _Action("exit", code=int(parts[0]))
    if kind == "delay":
        if len(parts) not in (1, 2):
            raise FailpointSpecError(spec, f"delay takes a duration and an optional jitter, got {args!r}")
        jitter_s = _parse_duration_s(parts[1], spec) if len(parts) == 2 else 0.0
        return _Action("delay", duration_s=_parse_duration_s(parts[0], spec), jitter_s=jitter_s)
    if kind == "pause":
        if args is None:
            return _Action("pause", duration_s=_DEFAULT_PAUSE_TIMEOUT_S)
        if len(parts) != 1:
            raise FailpointSpecError(spec, f"pause takes one timeout, got {args!r}")
        return _Action("pause", duration_s=_parse_duration_s(parts[0], spec))
    raise FailpointSpecError(spec, f"unknown action {kind!r}")


def _parse_rule(name: str, rhs: str, spec: str) -> _Rule:
    if _NAME_RE.fullmatch(name) is None:
        raise FailpointSpecError(spec, f"name {name!r} is not lower-case dotted words ([a-z0-9_] and '.')")
    trigger, star, action_text = rhs.partition("*")
    if not star:
        return _Rule(name, None, False, _parse_action(rhs, spec))
    match = _TRIGGER_RE.fullmatch(trigger.strip())
    if match is None or int(match["n"]) < 1:
        raise FailpointSpecError(spec, f"trigger {trigger.strip()!r} is not N or N+ with N >= 1")
    return _Rule(name, int(match["n"]), bool(match["onwards"]), _parse_action(action_text, spec))


def parse_spec(spec: str) -> list[str]:
    """Validate a ``SETTLED_FAILPOINTS`` value (grammar in the module docstring) and return it canonical.

    Args:
        spec: E.g. ``"appender.after_produce = 3*kill; worker.before_settle=1+*delay(5ms, 2ms)"``.

    Returns:
        Each entry in canonical form, in order, e.g. ``["appender.after_produce=3*kill",
        "worker.before_settle=1+*delay(5ms,2ms)"]``.

    Raises:
        FailpointSpecError: If an entry does not follow the grammar; the message names the entry and the part.
    """
    return [str(rule) for rule in _parse_rules(spec)]


def _parse_rules(spec: str) -> list[_Rule]:
    rules = []
    for entry in spec.split(";"):
        if not entry.strip():
            continue
        name, eq, rhs = entry.partition("=")
        if not eq:
            raise FailpointSpecError(entry, "entry has no '=' between the name and the action")
        rules.append(_parse_rule(name.strip(), rhs.strip(), entry))
    return rules


@dataclass
class _Arming:
    rule: _Rule
    rng: random.Random
    count: int = 0  # hits of rule.name since this arming took effect


@dataclass
class _Runtime:
    """The armed state of one process; every access holds ``lock`` (hits may come from several threads)."""

    seed: int
    control_dir: Path | None
    static: list[_Arming]
    lock: threading.Lock = field(default_factory=threading.Lock)
    counts: dict[str, int] = field(default_factory=dict)
    dynamic: dict[str, _Arming] = field(default_factory=dict)  # arm file name -> arming
    clean_mtime_ns: int | None = None
    log_fd: int | None = None

    def arming(self, rule: _Rule) -> _Arming:
        return _Arming(rule, random.Random(f"{self.seed}/{rule.name}"))

    def refresh(self, control_dir: Path) -> None:
        """Pick up arm files added or removed since the last hit (cheap: one stat when nothing changed)."""
        arm_dir = control_dir / "arm"
        mtime_ns = os.stat(arm_dir).st_mtime_ns
        if mtime_ns == self.clean_mtime_ns:
            return
        now_ns = time.time_ns()
        present = set(os.listdir(arm_dir))
        for gone in set(self.dynamic) - present:
            del self.dynamic[gone]
        for new in sorted(present - set(self.dynamic), key=_arm_file_seq):
            name, _, _ = new.partition("@")
            try:
                rhs = (arm_dir / new).read_text(encoding="utf-8").strip()
            except FileNotFoundError:  # disarmed between the listing and the read: its unlink moved the mtime
                continue
            self.dynamic[new] = self.arming(_parse_rule(name, rhs, f"{name}={rhs}"))
        self.clean_mtime_ns = mtime_ns if now_ns - mtime_ns >= _RACY_MTIME_NS else None

    def hit(self, name: str) -> None:
        with self.lock:
            if self.control_dir is not None:
                self.refresh(self.control_dir)
            count = self.counts.get(name, 0) + 1
            self.counts[name] = count
            fired: list[tuple[_Action, float]] = []
            for arming in [*self.static, *self.dynamic.values()]:
                if arming.rule.name != name:
                    continue
                arming.count += 1
                if arming.rule.fires(arming.count):
                    action = arming.rule.action
                    jitter_s = arming.rng.uniform(0.0, action.jitter_s) if action.kind == "delay" else 0.0
                    fired.append((action, jitter_s))
            if self.log_fd is not None:
                actions = ";".join(str(action) for action, _ in fired) or "-"
                os.write(self.log_fd, f"{name}\t{count}\t{actions}\n".encode())
        for action, jitter_s in fired:  # outside the lock: a paused thread must not block other threads' hits
            self.act(name, count, action, jitter_s)

    def act(self, name: str, count: int, action: _Action, jitter_s: float) -> None:
        if action.kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif action.kind == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
        elif action.kind == "exit":
            os._exit(action.code)
        elif action.kind == "raise":
            raise FailpointError(name, count, "armed to raise")
        elif action.kind == "delay":
            time.sleep(action.duration_s + jitter_s)
        elif action.kind == "pause":
            self.barrier(name, count, action.duration_s)

    def barrier(self, name: str, count: int, timeout_s: float) -> None:
        if self.control_dir is None:
            raise FailpointError(name, count, f"pause needs the control folder {FAILPOINT_DIR_ENV_VAR}")
        token = f"{name}@{os.getpid()}@{count}"
        reached = self.control_dir / "reached" / token
        release = self.control_dir / "release" / token
        reached.write_text(f"{time.time():.6f}\n", encoding="utf-8")
        deadline = time.monotonic() + timeout_s
        while not release.exists():
            if time.monotonic() >= deadline:
                reached.unlink()
                raise FailpointError(name, count, f"barrier not released within {timeout_s:g} s")
            time.sleep(_BARRIER_POLL_S)
        reached.unlink()
        release.unlink()


def _arm_file_seq(file_name: str) -> int:
    _, _, seq = file_name.partition("@")
    return int(seq) if seq.isdigit() else 0


# The disarmed fast path reads only ``_off``. It starts False ("not loaded yet"): the first hit loads the
# configuration from the environment and either sets ``_off`` or installs ``_runtime``.
_off = False
_runtime: _Runtime | None = None
_load_lock = threading.Lock()
_fork_hook_registered = False


def failpoint(name: str) -> None:
    """Mark a failpoint; act if a test armed this hit of it.

    Disarmed this is one global lookup. Armed, the hit is counted, written to the hit log (before acting, so a
    kill still leaves its record) and the armed actions run in order.

    Args:
        name: Lower-case dotted name, e.g. ``"appender.after_produce"``; a constant at every call site.

    Raises:
        FailpointError: If armed with ``raise``, or a ``pause`` barrier timed out.
        FailpointSpecError: If the environment or an arm file holds a malformed spec (read at the first hit).
    """
    if _off:
        return
    _slow_hit(name)


def _slow_hit(name: str) -> None:
    runtime = _runtime
    if runtime is None:
        with _load_lock:
            if _runtime is None and not _off:
                _load_from_env()
        runtime = _runtime
        if runtime is None:
            return
    runtime.hit(name)


def _load_from_env() -> None:
    spec = os.environ.get(FAILPOINTS_ENV_VAR, "")
    folder = os.environ.get(FAILPOINT_DIR_ENV_VAR, "")
    seed_text = os.environ.get(FAILPOINT_SEED_ENV_VAR, "0")
    if not re.fullmatch(r"-?[0-9]+", seed_text.strip()):
        raise FailpointSpecError(seed_text, f"{FAILPOINT_SEED_ENV_VAR} must be an integer")
    _install(spec, Path(folder) if folder else None, int(seed_text))


def _install(spec: str, control_dir: Path | None, seed: int) -> None:
    global _off, _runtime, _fork_hook_registered
    rules = _parse_rules(spec)
    if not rules and control_dir is None:
        _off, _runtime = True, None
        return
    runtime = _Runtime(seed=seed, control_dir=control_dir, static=[])
    runtime.static = [runtime.arming(rule) for rule in rules]
    if control_dir is not None:
        for sub in ("arm", "hits", "reached", "release", "tmp"):
            (control_dir / sub).mkdir(parents=True, exist_ok=True)
        log_path = control_dir / "hits" / f"{os.getpid()}.log"
        runtime.log_fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    _off, _runtime = False, runtime
    if not _fork_hook_registered:
        os.register_at_fork(after_in_child=_after_fork)
        _fork_hook_registered = True


def configure(spec: str = "", *, control_dir: Path | None = None, seed: int = 0) -> None:
    """Arm this process explicitly, replacing any earlier configuration (the environment is then not read).

    Meant for in-process tests and for programs that take the spec from somewhere else than the environment.

    Args:
        spec: Entries in the ``SETTLED_FAILPOINTS`` grammar; empty arms nothing.
        control_dir: Control folder for run-time arming, the hit log and barriers; None for none.
        seed: Seed of the ``delay`` jitter.

    Raises:
        FailpointSpecError: If ``spec`` does not follow the grammar.
    """
    _parse_rules(spec)  # validate before touching the current state
    with _load_lock:
        _close_log()
        _install(spec, control_dir, seed)


def reset() -> None:
    """Forget all arming and counts; the next hit reads the environment again (also run in a forked child)."""
    global _off, _runtime
    _close_log()
    _off, _runtime = False, None


def _after_fork() -> None:
    global _load_lock
    _load_lock = threading.Lock()  # another parent thread may have held it at the fork
    reset()


def _close_log() -> None:
    runtime = _runtime
    if runtime is not None and runtime.log_fd is not None:
        os.close(runtime.log_fd)
        runtime.log_fd = None


def hit_counts() -> dict[str, int]:
    """Return this process's hit count per failpoint name (empty while disarmed: disarmed hits are not counted).

    Returns:
        A copy of the counts.
    """
    runtime = _runtime
    if runtime is None:
        return {}
    with runtime.lock:
        return dict(runtime.counts)


@dataclass(frozen=True)
class HitRecord:
    """One line of a process's hit log.

    Attributes:
        pid: The process that hit the failpoint.
        name: The failpoint's name.
        hit: That process's count of hits of ``name`` so far (1 for the first).
        actions: The actions that fired at this hit (e.g. ``("kill",)``); empty when none did.
    """

    pid: int
    name: str
    hit: int
    actions: tuple[str, ...]


@dataclass(frozen=True)
class BarrierHit:
    """A process waiting at a ``pause`` barrier.

    Attributes:
        name: The failpoint's name.
        pid: The waiting process.
        hit: That process's hit count of ``name`` at the barrier.
    """

    name: str
    pid: int
    hit: int


class FailpointControl:
    """Test-side handle on a control folder: arm and disarm live processes, wait at barriers, read the hit log.

    Pass :meth:`env` to the processes a test spawns; each then logs its hits under ``hits/`` and picks up arm
    files at its next hit (the protocol is in the module docstring).

    Args:
        folder: The control folder (created if missing); usually a pytest ``tmp_path`` subfolder.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        for sub in ("arm", "hits", "reached", "release", "tmp"):
            (folder / sub).mkdir(parents=True, exist_ok=True)

    def env(self, spec: str = "", *, seed: int = 0) -> dict[str, str]:
        """Return the environment variables that arm a child process at spawn time and connect it to this folder.

        Args:
            spec: Spawn-time entries in the ``SETTLED_FAILPOINTS`` grammar.
            seed: ``SETTLED_FAILPOINT_SEED``, the seed of ``delay`` jitter.

        Returns:
            Variables to merge into the child's environment.

        Raises:
            FailpointSpecError: If ``spec`` does not follow the grammar.
        """
        parse_spec(spec)
        return {FAILPOINTS_ENV_VAR: spec, FAILPOINT_DIR_ENV_VAR: str(self.folder), FAILPOINT_SEED_ENV_VAR: str(seed)}

    def arm(self, name: str, spec: str) -> None:
        """Arm ``name`` in every live process using this folder, replacing an earlier run-time arming of it.

        The arming is in effect at every hit that begins after this returns; its trigger counts from there, so
        ``arm(name, "1*pause")`` pauses the very next hit.

        Args:
            name: The failpoint's name.
            spec: ``[trigger*]action`` in the ``SETTLED_FAILPOINTS`` grammar, e.g. ``"3*kill"``, ``"2+*delay(5ms)"``.

        Raises:
            FailpointSpecError: If ``name`` or ``spec`` does not follow the grammar.
        """
        _parse_rule(name, spec.strip(), f"{name}={spec}")
        self.disarm(name)
        tmp = self.folder / "tmp" / f"{name}@{time.time_ns()}"
        tmp.write_text(spec.strip() + "\n", encoding="utf-8")
        os.rename(tmp, self.folder / "arm" / tmp.name)

    def disarm(self, name: str) -> None:
        """Remove the run-time arming of ``name`` (spawn-time entries stay).

        Args:
            name: The failpoint's name.
        """
        for path in (self.folder / "arm").glob(f"{name}@*"):
            path.unlink()

    def waiting(self, name: str) -> list[BarrierHit]:
        """Return the processes now waiting at the barrier of ``name``.

        Args:
            name: The failpoint's name.

        Returns:
            One entry per waiting process and hit.
        """
        found = []
        for path in (self.folder / "reached").glob(f"{name}@*@*"):
            _, pid, hit = path.name.split("@")
            found.append(BarrierHit(name, int(pid), int(hit)))
        return sorted(found, key=lambda b: (b.pid, b.hit))

    def wait_reached(self, name: str, timeout_s: float) -> BarrierHit:
        """Wait until some process waits at the barrier of ``name``.

        Args:
            name: The failpoint's name.
            timeout_s: How long to wait.

        Returns:
            The first waiting process found.

        Raises:
            TimeoutError: If none reached it within ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            waiting = self.waiting(name)
            if waiting:
                return waiting[0]
            if time.monotonic() >= deadline:
                raise TimeoutError(f"no process reached failpoint barrier {name!r} within {timeout_s:g} s")
            time.sleep(_BARRIER_POLL_S)

    def release(self, name: str) -> int:
        """Release every process now waiting at the barrier of ``name``.

        Args:
            name: The failpoint's name.

        Returns:
            How many waiting processes were released.
        """
        waiting = self.waiting(name)
        for barrier in waiting:
            (self.folder / "release" / f"{name}@{barrier.pid}@{barrier.hit}").touch()
        return len(waiting)

    def hit_log(self) -> list[HitRecord]:
        """Read every process's hit log.

        Returns:
            The records, grouped by process id, each process's in hit order.
        """
        records = []
        for path in sorted((self.folder / "hits").glob("*.log")):
            pid = int(path.stem)
            for line in path.read_text(encoding="utf-8").splitlines():
                name, hit, actions = line.split("\t")
                records.append(HitRecord(pid, name, int(hit), () if actions == "-" else tuple(actions.split(";"))))
        return records

    def hits(self, name: str, pid: int | None = None) -> int:
        """Count the logged hits of ``name``.

        Args:
            name: The failpoint's name.
            pid: Only this process's hits; None sums over all processes.

        Returns:
            The number of hits.
        """
        return sum(1 for r in self.hit_log() if r.name == name and (pid is None or r.pid == pid))

    def wait_hits(self, name: str, count: int, timeout_s: float) -> None:
        """Wait until ``name`` has at least ``count`` logged hits (over all processes).

        Args:
            name: The failpoint's name.
            count: The number of hits to wait for.
            timeout_s: How long to wait.

        Raises:
            TimeoutError: If the count was not reached within ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        while (seen := self.hits(name)) < count:
            if time.monotonic() >= deadline:
                raise TimeoutError(f"failpoint {name!r} hit {seen} times, not {count}, within {timeout_s:g} s")
            time.sleep(_BARRIER_POLL_S)


@dataclass(frozen=True)
class ScheduledKill:
    """One kill chosen by :func:`choose_schedule`.

    Attributes:
        name: The failpoint to kill at.
        hit: Which hit of it (1-based, counted from the process's start).
    """

    name: str
    hit: int

    @property
    def spec(self) -> str:
        """The ``SETTLED_FAILPOINTS`` entry that arms this kill, e.g. ``"appender.after_produce=2*kill"``."""
        return f"{self.name}={self.hit}*kill"


def choose_schedule(seed: int, names: Sequence[str], kills: int, *, max_hit: int = 3) -> tuple[ScheduledKill, ...]:
    """Choose, from a seed, where a chaos test kills its successive worker incarnations.

    The seed is logged; a test should print it as well, so any failure replays from its seed.

    Args:
        seed: The seed; the same seed, names and counts give the same schedule.
        names: The candidate failpoints.
        kills: How many kills (one per incarnation, in order).
        max_hit: Each kill lands on a hit in ``1..max_hit`` of its failpoint.

    Returns:
        ``kills`` scheduled kills.

    Raises:
        ValueError: If ``names`` is empty or holds a malformed name, or ``kills`` < 0, or ``max_hit`` < 1.
    """
    if not names:
        raise ValueError("choose_schedule: names is empty")
    for name in names:
        if _NAME_RE.fullmatch(name) is None:
            raise ValueError(f"choose_schedule: name {name!r} is not lower-case dotted words")
    if kills < 0:
        raise ValueError(f"choose_schedule: kills must be >= 0, got {kills}")
    if max_hit < 1:
        raise ValueError(f"choose_schedule: max_hit must be >= 1, got {max_hit}")
    rng = random.Random(seed)
    ordered = sorted(names)
    schedule = tuple(ScheduledKill(rng.choice(ordered), rng.randint(1, max_hit)) for _ in range(kills))
    _log.info("failpoint schedule seed=%d: %s", seed, "; ".join(kill.spec for kill in schedule))
    return schedule
