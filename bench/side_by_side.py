"""Benchmark: settled, Restate and DBOS side by side on one turn workload, every figure with its durability class.

    bench/peers/install.sh                      # once: the peers, pinned, under the bench cache
    .venv/bin/python bench/side_by_side.py [--reps 3] [--smoke] [--out DIR] [--keep]

Issue 23. The script re-executes itself under ``unshare --net`` (root, or a user namespace) with only loopback up:
restate-server opens an outbound connection at every start and no setting stops it, so `RestateServer.start` refuses
to run while any interface besides ``lo`` exists (`require_loopback_only`). Inside that namespace it starts every
service itself, on private ports and a private state folder under the bench cache (``SETTLED_BENCH_CACHE_DIR``, else
``~/.cache/settled/bench``), ignoring ``SETTLED_KAFKA_BOOTSTRAP``/``SETTLED_POSTGRES_DSN``:

* two Kafka brokers through the dev-stack launcher (`settled.services._devstack.KafkaBroker`): one with the broker
  defaults (page cache), one with ``log.flush.interval.messages=1`` (an fsync per appended batch);
* PostgreSQL through the same launcher (`PostgresServer`), fsync on (checked), for DBOS;
* restate-server and the Restate Python SDK endpoint (``bench/peers/restate_app.py``) under hypercorn.

The workload (one for all three): a turn is one workflow (Restate, DBOS) or one submission (settled) of K durable
steps, each an instant identity function on ``"hello"``, under a fresh id per turn (settled: a fresh conversation per
turn, a fresh namespace per case, 12 partitions, one worker process, settlements read by one shared reader).

* latency: K = 0, 1, 10; 20 warm-up then 200 sequential turns: p50, p99, p50/K and the marginal step cost
  (p50[K=10] - p50[K=0]) / 10;
* throughput: a closed loop of 50 in flight, K = 5, 3 s warm-up, a 20 s window counting the turns whose result the
  client read; CPU seconds of the system's processes (load generator included) from ``/proc`` over the window;
* crash: K = 5, step 3 sleeps 5 s, kill -9 of the process running the turn 1 s into step 3, restart at once; each
  step execution appends a line to an fsynced counter file: kill -> done, restart -> done minus the re-run 5 s,
  executions per step.

Drivers: Restate by a Node.js keep-alive HTTP client (``bench/peers/restate_load.mjs``), DBOS by in-process calls
(``bench/peers/dbos_driver.py``), settled by `settled.client.Client` in this process. settled rows for ``ctx.step``,
``ctx.step(pure=True)`` (posted, its own weaker class), ``ctx.tool`` (prepared + settled) and ``ctx.step`` on the
fsync-per-message broker, plus `Client.wait` per
submission beside the shared reader. Baselines in the same run: a bare confluent-kafka transactional commit (1 record
+ consumer offsets, settled's client settings) and a no-durability loop.

Honesty checks fail the run (exit 1): every crash case shows steps 1-2 once and step 3 twice; throughput counts only
turns whose result the client read; after settled's throughput window a kill -9 and restart of the worker loses no
acknowledged (admitted) turn; every row carries a durability class and every ratio pairs equal classes or names the
weaker side; every baseline was measured. Figures are the median of ``--reps`` repetitions with min-max; ``--smoke``
is one repetition, small N, no crash case (CI). Output: Markdown on stdout and ``side_by_side.md`` /
``side_by_side.json`` in ``--out``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout: python bench/side_by_side.py
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (
    client_versions,
    delete_namespace,
    describe_broker,
    fresh_namespace,
    jit_cpu_s,
    load_average,
    percentile,
    use_dev_timeouts,
)

from settled._settings import Settings
from settled.services._devstack import StackError
from settled.testing import WorkerProcess

ROOT = Path(__file__).resolve().parent.parent
PEERS_DIR = Path(__file__).resolve().parent / "peers"
#: The detail line splitting settled's turn latency at the receipt.
SPLITS = "settled p50 split, ms (submit until the receipt was read + then until the settlement was read)"
#: The detail line splitting the CPU per turn by process name.
CPU_SPLIT = "CPU per turn by process, ms"
#: settled's CPU per turn at 50 in flight without the broker's JIT compiler threads (a detail row).
CPU_LESS_JIT = "CPU per turn at 50 in flight, less the broker's JIT compiler (ms)"
#: Set in the re-executed child: it already runs inside its own network namespace.
NETNS_ENV = "SETTLED_BENCH_NETNS"
PARTITIONS = 12
SETTLED_APP = "bench.side_by_side_app:app"
STEP_SLEEP_S = 5.0
KILL_INTO_STEP_S = 1.0
CRASH_K = 5
CRASH_STEP = 3
THROUGHPUT_K = 5
IN_FLIGHT = 50

# Systems (columns) and their durability classes.
DBOS = "DBOS"
RESTATE = "Restate"
SETTLED_STEP = "settled ctx.step"
SETTLED_TOOL = "settled ctx.tool"
SETTLED_PURE = "settled ctx.step(pure=True)"
SETTLED_FSYNC = "settled ctx.step, flush=1"
BARE = "bare Kafka txn"
NO_DURABILITY = "no durability"
SYSTEMS = (DBOS, RESTATE, SETTLED_STEP, SETTLED_PURE, SETTLED_TOOL, SETTLED_FSYNC, BARE, NO_DURABILITY)

PAGE_CACHE = "page cache"
PURE_POSTED = "page cache, pure steps posted (weaker than the peers)"
FSYNC_PER_MESSAGE = "Kafka fsync per message"
PG_FSYNC = "Postgres fsync"
RESTATE_DEFAULT = "Restate default"
NONE = "none"
#: What survives what, weakest first: a ratio between two classes of different strength names the weaker side.
#: A posted pure step is below page cache: a process crash (not only the machine's loss) may lose its record.
CLASS_STRENGTH = {NONE: 0, PURE_POSTED: 1, PAGE_CACHE: 2, FSYNC_PER_MESSAGE: 3, PG_FSYNC: 3, RESTATE_DEFAULT: 3}
SYSTEM_CLASS = {
    DBOS: PG_FSYNC,
    RESTATE: RESTATE_DEFAULT,
    SETTLED_STEP: PAGE_CACHE,
    SETTLED_PURE: PURE_POSTED,
    SETTLED_TOOL: PAGE_CACHE,
    SETTLED_FSYNC: FSYNC_PER_MESSAGE,
    BARE: PAGE_CACHE,
    NO_DURABILITY: NONE,
}


class BenchmarkError(RuntimeError):
    """The measurement went wrong or an honesty check failed: the run's figures must not be used."""


class LauncherRefused(BenchmarkError):
    """A service was not started because its environment is unsafe for it; the message says why."""


# ------------------------------------------------------------------------------------------ network namespace


def other_interfaces() -> list[str]:
    """Return the network interfaces of this process's network namespace other than loopback.

    Asks the kernel (``if_nameindex``), not ``/sys/class/net``: sysfs shows the interfaces of the namespace that
    mounted it, which inside ``unshare --net`` is still the host's.

    Returns:
        Their names, sorted (empty inside a fresh ``unshare --net`` namespace).
    """
    return sorted(name for _index, name in socket.if_nameindex() if name != "lo")


def require_loopback_only() -> None:
    """Refuse unless loopback is the only network interface (restate-server phones out at every start).

    Raises:
        LauncherRefused: Another interface exists; the message names it and the reason.
    """
    others = other_interfaces()
    if others:
        raise LauncherRefused(
            f"refusing to start restate-server: network interface(s) {', '.join(others)} exist besides lo; "
            "restate-server opens an outbound connection at every start and no setting stops it, so the benchmark "
            "runs it only in a network namespace with loopback alone (bench/side_by_side.py re-executes itself "
            "under `unshare --net`)"
        )


def reexec_in_namespace(argv: Sequence[str]) -> int:
    """Run this script again under ``unshare --net`` with loopback up, and return its exit status.

    Args:
        argv: The script's arguments.

    Returns:
        The child's exit status.

    Raises:
        BenchmarkError: ``unshare`` is missing.
    """
    unshare = shutil.which("unshare")
    if unshare is None:
        raise BenchmarkError("`unshare` (util-linux) is missing: install it with apt-get install -y util-linux")
    cmd = [unshare, "--net", "--", sys.executable, str(Path(__file__).resolve()), *argv]
    proc = subprocess.run(cmd, env={**os.environ, NETNS_ENV: "1"}, check=False)
    return proc.returncode


def loopback_up() -> None:
    """Bring ``lo`` up in this (fresh) namespace.

    Raises:
        BenchmarkError: ``ip`` failed.
    """
    ip = shutil.which("ip") or "/usr/sbin/ip"
    res = subprocess.run([ip, "link", "set", "lo", "up"], capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise BenchmarkError(f"`ip link set lo up` failed (exit {res.returncode}): {res.stderr.strip()}")


# ------------------------------------------------------------------------------------------ peers and paths


def bench_cache_dir() -> Path:
    """The bench cache: ``SETTLED_BENCH_CACHE_DIR``, else ``~/.cache/settled/bench`` (as ``install.sh``)."""
    return Path(os.environ.get("SETTLED_BENCH_CACHE_DIR") or Path.home() / ".cache" / "settled" / "bench")


@dataclass(frozen=True)
class Peers:
    """Where ``bench/peers/install.sh`` put the peers.

    Attributes:
        python: The peers' venv interpreter (dbos, restate-sdk, hypercorn).
        hypercorn: Its hypercorn script.
        restate_server: The restate-server binary from the npm platform package.
        node: The Node.js interpreter driving Restate.
    """

    python: Path
    hypercorn: Path
    restate_server: Path
    node: Path

    @classmethod
    def find(cls) -> Peers:
        """Locate the installed peers.

        Returns:
            Their paths.

        Raises:
            BenchmarkError: A peer is missing (names it and the command that installs it).
        """
        peers = bench_cache_dir() / "peers"
        arch = {"x86_64": "x64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
        server = peers / "node" / "node_modules" / "@restatedev" / f"restate-server-linux-{arch}" / "bin"
        node = shutil.which("node")
        found = cls(
            python=peers / "venv" / "bin" / "python",
            hypercorn=peers / "venv" / "bin" / "hypercorn",
            restate_server=server / "restate-server",
            node=Path(node) if node else Path("node"),
        )
        for name, path in (
            ("peers' Python venv", found.python),
            ("hypercorn", found.hypercorn),
            ("restate-server", found.restate_server),
        ):
            if not path.exists():
                raise BenchmarkError(f"{name} is missing at {path}: run bench/peers/install.sh first")
        if node is None:
            raise BenchmarkError("node is missing: install Node.js 18+ (it drives Restate's ingress)")
        return found

    def versions(self) -> dict[str, str]:
        """Versions of every peer component."""
        script = (
            "from importlib.metadata import version as v;print({n: v(n) for n in ('dbos', 'restate-sdk', 'hypercorn')})"
        )
        out = subprocess.run([str(self.python), "-c", script], capture_output=True, text=True, check=True).stdout
        found: dict[str, str] = json.loads(out.replace("'", '"'))
        server = subprocess.run([str(self.restate_server), "--version"], capture_output=True, text=True, check=True)
        found["restate-server"] = server.stdout.strip().split()[-1]
        found["node"] = subprocess.run([str(self.node), "--version"], capture_output=True, text=True).stdout.strip()
        return found


# ------------------------------------------------------------------------------------------ CPU accounting


def _netns() -> str:
    return os.readlink("/proc/self/ns/net")


def cpu_seconds(select: Callable[[int, str], bool]) -> dict[str, float]:
    """Return the CPU seconds (user + system) so far of this namespace's processes that ``select(pid, comm)`` accepts.

    Args:
        select: Which processes count.

    Returns:
        CPU seconds per process name (``comm``); the difference of two calls is the CPU used in between.
    """
    ticks = os.sysconf("SC_CLK_TCK")
    ns = _netns()
    total: Counter[str] = Counter()
    for pid_dir in Path("/proc").iterdir():
        if not pid_dir.name.isdigit():
            continue
        try:
            if os.readlink(pid_dir / "ns" / "net") != ns:
                continue
            stat = (pid_dir / "stat").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        if select(int(pid_dir.name), comm):
            total[comm] += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
    return {comm: n / ticks for comm, n in total.items()}


def cpu_per_turn(
    measured: Measured, system: str, before: dict[str, float], after: dict[str, float], turns: int
) -> float:
    """Record the CPU per turn over a window (all the system's processes) and its split per process name.

    Returns:
        The CPU seconds the system's processes used over the window.
    """
    used = {comm: after.get(comm, 0.0) - before.get(comm, 0.0) for comm in after}
    total_s = sum(used.values())
    measured.add("CPU per turn at 50 in flight (ms)", system, total_s * 1000 / max(turns, 1))
    split = {comm: round(sec * 1000 / max(turns, 1), 2) for comm, sec in sorted(used.items())}
    measured.detail.setdefault(CPU_SPLIT, {}).setdefault(system, []).append(split)
    return total_s


def process_with_arg(arg: str) -> int:
    """Return the pid of this namespace's process whose command line has ``arg`` (e.g. a broker's properties file).

    Raises:
        BenchmarkError: No such process.
    """
    ns = _netns()
    for pid_dir in Path("/proc").iterdir():
        if not pid_dir.name.isdigit():
            continue
        try:
            if os.readlink(pid_dir / "ns" / "net") == ns and arg.encode() in (pid_dir / "cmdline").read_bytes().split(
                b"\0"
            ):
                return int(pid_dir.name)
        except OSError:
            continue
    raise BenchmarkError(f"no process in this network namespace has {arg!r} on its command line")


def _pids(*pids: int) -> Callable[[int, str], bool]:
    wanted = set(pids)
    return lambda pid, _comm: pid in wanted


# ------------------------------------------------------------------------------------------ services


def _wait_http(url: str, timeout_s: float, proc: subprocess.Popen[bytes], log: Path) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise BenchmarkError(f"{proc.args} exited {proc.returncode} during start-up; log: {log}\n{_tail(log)}")
        try:
            with urllib.request.urlopen(url, timeout=1) as resp:
                if resp.status < 500:
                    return
        except OSError:
            time.sleep(0.05)
    raise BenchmarkError(f"{url} did not answer within {timeout_s} s; log: {log}\n{_tail(log)}")


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _kill9(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGKILL)
    proc.wait(30)


@dataclass
class RestateServer:
    """restate-server on its default ports (private to the namespace) and the SDK endpoint under hypercorn.

    Attributes:
        peers: The installed peers.
        home: Its state folder (``base-dir``, logs).
    """

    peers: Peers
    home: Path
    ingress: str = "http://127.0.0.1:8080"
    admin: str = "http://127.0.0.1:9070"
    endpoint_port: int = 9080
    server: subprocess.Popen[bytes] | None = None
    endpoint: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start restate-server and the endpoint, and register the endpoint's deployment.

        Raises:
            LauncherRefused: An interface besides loopback exists (see `require_loopback_only`).
            BenchmarkError: A process died or did not answer.
        """
        require_loopback_only()
        self.home.mkdir(parents=True, exist_ok=True)
        log = self.home / "restate-server.log"
        with log.open("ab") as out:
            self.server = subprocess.Popen(
                [str(self.peers.restate_server), "--base-dir", str(self.home / "data"), "--no-logo"],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, "RESTATE_LOG_FORMAT": "compact", "RESTATE_LOG_FILTER": "warn"},
            )
        _wait_http(f"{self.admin}/health", 60, self.server, log)
        self.start_endpoint()
        import urllib.request

        body = json.dumps({"uri": f"http://127.0.0.1:{self.endpoint_port}", "force": True}).encode()
        req = urllib.request.Request(
            f"{self.admin}/deployments", body, headers={"content-type": "application/json"}, method="POST"
        )
        with urllib.request.urlopen(req, timeout=30) as resp:
            if resp.status >= 300:
                raise BenchmarkError(f"registering the Restate deployment answered HTTP {resp.status}")
        _wait_http(f"{self.ingress}/restate/health", 30, self.server, log)

    def start_endpoint(self) -> None:
        """Start (or restart) the SDK endpoint process: hypercorn, one in-process worker.

        Raises:
            BenchmarkError: It died or did not answer.
        """
        log = self.home / "endpoint.log"
        with log.open("ab") as out:
            self.endpoint = subprocess.Popen(
                [
                    str(self.peers.hypercorn),
                    "--workers",
                    "0",
                    "--bind",
                    f"127.0.0.1:{self.endpoint_port}",
                    "restate_app:app",
                ],
                cwd=PEERS_DIR,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        _wait_http(f"http://127.0.0.1:{self.endpoint_port}/health", 30, self.endpoint, log)

    def owns(self, pid: int, _comm: str) -> bool:
        """Whether ``pid`` is restate-server or the current endpoint process (for the CPU figure)."""
        return any(p is not None and p.pid == pid for p in (self.server, self.endpoint))

    def durability(self) -> str:
        """Restate's durability settings as loaded (``--dump-config``), for the class line."""
        out = subprocess.run(
            [str(self.peers.restate_server), "--dump-config"], capture_output=True, text=True, check=True
        ).stdout
        keys = ("rocksdb-disable-wal", "rocksdb-disable-wal-fsync")
        found = sorted({line.strip() for line in out.splitlines() if line.strip().split(" ")[0] in keys})
        if "rocksdb-disable-wal-fsync = false" not in found:
            raise BenchmarkError(f"restate-server's WAL is not fsynced by default here: {found}")
        return f"single node, defaults ({'; '.join(found)})"

    def stop(self) -> None:
        """Stop both processes."""
        for proc in (self.endpoint, self.server):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    _kill9(proc)


# ------------------------------------------------------------------------------------------ measurements


@dataclass
class Measured:
    """Every figure of one run: ``values[(row, system)]`` holds one value per repetition."""

    values: dict[tuple[str, str], list[float]] = field(default_factory=dict)
    detail: dict[str, Any] = field(default_factory=dict)

    def add(self, row: str, system: str, value: float) -> None:
        """Record one repetition's value."""
        self.values.setdefault((row, system), []).append(value)


def latency_rows(measured: Measured, system: str, by_k_ms: dict[int, list[float]]) -> None:
    """Record p50/p99 per K, p50/K and the marginal step cost from per-turn latencies (ms)."""
    for k, lat in sorted(by_k_ms.items()):
        measured.add(f"turn p50, K={k} (ms)", system, percentile(lat, 50))
        measured.add(f"turn p99, K={k} (ms)", system, percentile(lat, 99))
        if k > 1:
            measured.add(f"turn p50 / K, K={k} (ms)", system, percentile(lat, 50) / k)
    if 0 in by_k_ms and 10 in by_k_ms:
        marginal = (percentile(by_k_ms[10], 50) - percentile(by_k_ms[0], 50)) / 10
        measured.add("marginal cost per durable step (ms)", system, marginal)


def _counter_executions(counter: Path) -> dict[int, int]:
    lines = counter.read_text().split() if counter.exists() else []
    return dict(Counter(int(x) for x in lines if x.isdigit()))


def _wait_for_line(counter: Path, line: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if counter.exists() and line in counter.read_text().splitlines():
            return
        time.sleep(0.005)
    raise BenchmarkError(f"{counter} did not get {line!r} within {timeout_s} s")


def crash_rows(measured: Measured, system: str, t_kill: float, t_restart: float, t_done: float, counter: Path) -> None:
    """Record the crash case's figures and check steps 1-2 ran once and step 3 twice.

    Raises:
        BenchmarkError: The executions per step are not 1, 1, 2, 1, 1.
    """
    executions = _counter_executions(counter)
    expected = {i: (2 if i == CRASH_STEP else 1) for i in range(1, CRASH_K + 1)}
    measured.detail.setdefault("crash executions", {})[system] = executions
    if executions != expected:
        raise BenchmarkError(f"{system} crash case: executions per step {executions}, expected {expected}")
    measured.add("crash: kill -> done (s)", system, t_done - t_kill)
    measured.add("crash: restart -> done beyond the re-run step (s)", system, t_done - t_restart - STEP_SLEEP_S)


# ------------------------------------------------------------------------------------------ no durability, bare


def no_durability(turns: int, ks: Sequence[int]) -> dict[int, list[float]]:
    """Per-turn times (ms) of K identity calls in a plain loop: what a turn costs with nothing recorded."""

    def identity(value: str) -> str:
        return value

    out: dict[int, list[float]] = {}
    for k in ks:
        lat = []
        for _ in range(turns):
            t0 = time.perf_counter()
            value = "hello"
            for _ in range(k):
                value = identity(value)
            lat.append((time.perf_counter() - t0) * 1000)
        out[k] = lat
    return out


def bare_commits(bootstrap: str, turns: int, warmup: int) -> list[float]:
    """Latencies (ms) of bare transactional commits: 1 record + the consumer's offsets, settled's client settings.

    Args:
        bootstrap: The broker.
        turns: Commits measured.
        warmup: Commits before them, not measured.

    Returns:
        One latency per commit, in milliseconds.

    Raises:
        BenchmarkError: The consumer group never got its partition.
    """
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    from settled.producers import producer_config

    settings = Settings(namespace=fresh_namespace("bench-sbs-bare"), kafka_bootstrap=bootstrap)
    topic_in, topic_out = settings.topic("bare-in"), settings.topic("bare-out")
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for fut in admin.create_topics([NewTopic(t, 1, 1) for t in (topic_in, topic_out)]).values():
        fut.result(30)
    group = f"{settings.namespace}.bare"
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    consumer.subscribe([topic_in])
    deadline = time.monotonic() + 30
    while not consumer.assignment():
        consumer.poll(0.1)
        if time.monotonic() > deadline:
            raise BenchmarkError(f"bare baseline: group {group} got no partition of {topic_in} within 30 s")
    producer = Producer(producer_config(settings, transactional_id=f"{settings.namespace}.bare"))
    producer.init_transactions(30)
    payload = b"x" * 300
    out = []
    for i in range(warmup + turns):
        t0 = time.perf_counter()
        producer.begin_transaction()
        producer.produce(topic_out, payload, key=f"bare-{i}".encode())
        producer.send_offsets_to_transaction(
            [TopicPartition(topic_in, 0, i + 1)], consumer.consumer_group_metadata(), 30
        )
        producer.commit_transaction(30)
        if i >= warmup:
            out.append((time.perf_counter() - t0) * 1000)
    consumer.close()
    delete_namespace(settings)
    return out


# ------------------------------------------------------------------------------------------ settled


class SettledCase:
    """One settled case: a fresh namespace (12 partitions) on a broker, one worker process, one `Client`.

    Settlements are read by one shared reader (`SettlementTracker` of ``bench/worker.py``).
    """

    #: The worker's app, ``module:attribute``.
    app = SETTLED_APP

    def __init__(self, bootstrap: str, log_dir: Path, label: str) -> None:
        from worker import SettlementTracker

        from settled.client import Client
        from settled.producers import provision_topics
        from settled.schemas import Codec

        self.settings = Settings(
            namespace=fresh_namespace(f"bench-sbs-{label}"), kafka_bootstrap=bootstrap, partitions=PARTITIONS
        )
        self.codec = Codec()
        provision_topics(self.settings, self.codec, datetime.now(UTC))
        self.log_dir = log_dir
        self.label = label
        self.worker: WorkerProcess | None = None
        self.splits: list[tuple[float, float]] = []
        self.start_worker()
        self.client = Client(self.settings, default_timeout_s=60)
        self.tracker = SettlementTracker(self.settings, self.codec)

    def start_worker(self, slot: int = 0, log_level: str = "WARNING") -> None:
        """Start (or restart) the worker process (`settled.testing.WorkerProcess`, the repository root as its cwd).

        Args:
            slot: The worker slot: its ``SETTLED_WORKER_INSTANCE_ID`` is ``bench-<label>-<slot>``, so a restart in the
                same slot rejoins the group as the same static member (issue 24 item 4).
            log_level: The worker's log level.
        """
        self.worker = WorkerProcess.start(
            settings=self.settings,
            app=self.app,
            log_path=self.log_dir / f"worker-{self.label}.log",
            worker_id=f"bench-{uuid.uuid4().hex[:6]}",
            log_level=log_level,
            instance_id=f"bench-{self.label}-{slot}",
            env=self.worker_env(),
            cwd=ROOT,
        )

    def worker_env(self) -> dict[str, str]:
        """The worker process's environment beyond the settings' (a subclass adds its own)."""
        return {"SETTLED_PARTITIONS": str(PARTITIONS)}

    def submit(self, body: dict[str, Any], conversation_id: str | None = None) -> str:
        """Submit one turn (under a fresh conversation unless one is given); return its id once admitted."""
        from settled.schemas import ReceiptOutcome

        receipt = self.client.submit(conversation_id or f"c-{uuid.uuid4().hex}", body)
        if receipt.outcome is not ReceiptOutcome.ADMITTED:
            raise BenchmarkError(f"{self.label}: submission not admitted: {receipt}")
        return receipt.request_id

    def settle(self, submission_ids: Sequence[str], timeout_s: float = 60.0) -> None:
        """Wait until the shared reader read every submission's settlement, and check each completed with "hello".

        Raises:
            BenchmarkError: A settlement is missing or not a completed ``{"out": "hello"}``.
        """
        from settled.schemas import SettlementOutcome

        if not self.tracker.wait_for(submission_ids, timeout_s):
            missing = [s for s in submission_ids if s not in self.tracker.read_at]
            raise BenchmarkError(f"{self.label}: {len(missing)} settlement(s) not read within {timeout_s} s")
        for sid in submission_ids:
            record = self.tracker.records[sid]
            if record.outcome is not SettlementOutcome.COMPLETED or json.loads(record.reply_json or "null") != {
                "out": "hello"
            }:
                raise BenchmarkError(f"{self.label}: submission {sid} settled {record.outcome}: {record.reply_json}")

    def turn(self, body: dict[str, Any], conversation_id: str | None = None) -> float:
        """Run one turn to its settlement; return its latency in milliseconds.

        The split (submit until the receipt was read, then until the settlement was read) is kept in ``splits``.
        """
        t0 = time.perf_counter()
        sid = self.submit(body, conversation_id)
        t1 = time.perf_counter()
        self.settle([sid])
        t2 = time.perf_counter()
        self.splits.append(((t1 - t0) * 1000, (t2 - t1) * 1000))
        return (t2 - t0) * 1000

    def warm_partitions(self) -> None:
        """Run one turn on each partition (a conversation id hashing to it), so every partition owner is warm."""
        from settled.producers import partition_for_key

        for partition in range(PARTITIONS):
            conversation = next(
                c
                for c in (f"warm-{uuid.uuid4().hex}" for _ in range(10_000))
                if partition_for_key(c.encode(), PARTITIONS) == partition
            )
            self.turn({"k": 1}, conversation)

    def close(self) -> None:
        """Stop the reader, the client and the worker, then delete the namespace's topics (a broker left holding
        every run's topics loads each of them at its next start). The worker group stays: a static member does not
        leave it on close, so the broker refuses its deletion until the session timeout."""
        self.tracker.close()
        self.client.close()
        if self.worker is not None and self.worker.poll() is None:
            self.worker.stop(30)
        delete_namespace(self.settings)


def settled_latency(
    bootstrap: str,
    log_dir: Path,
    label: str,
    kinds: dict[str, Sequence[int]],
    warmup: int,
    turns: int,
    splits: dict[str, tuple[float, float]],
) -> dict[str, dict[int, list[float]]]:
    """Sequential turns per kind (``step``/``tool``) and K on one fresh namespace; latencies in ms.

    The split of each case's p50 (submit until the receipt was read; then until the settlement was read) goes to
    ``splits``, keyed ``"<label> <kind> K=<k>"``.
    """
    case = SettledCase(bootstrap, log_dir, label)
    try:
        case.warm_partitions()
        out: dict[str, dict[int, list[float]]] = {}
        for kind, ks in kinds.items():
            for k in ks:
                for _ in range(warmup):
                    case.turn({"k": k, "kind": kind})
                case.splits.clear()
                out.setdefault(kind, {})[k] = [case.turn({"k": k, "kind": kind}) for _ in range(turns)]
                splits[f"{label} {kind} K={k}"] = (
                    percentile([a for a, _ in case.splits], 50),
                    percentile([b for _, b in case.splits], 50),
                )
        return out
    finally:
        case.close()


def settled_wait_vs_reader(bootstrap: str, log_dir: Path, turns: int) -> tuple[list[float], list[float]]:
    """Turns at K=1 read back by `Client.wait` per submission, then by the shared reader; latencies in ms."""
    case = SettledCase(bootstrap, log_dir, "wait")
    try:
        case.warm_partitions()
        waited = []
        for _ in range(turns):
            t0 = time.perf_counter()
            receipt = case.client.submit(f"c-{uuid.uuid4().hex}", {"k": 1})
            record = case.client.wait(receipt, timeout_s=60)
            if json.loads(record.reply_json or "null") != {"out": "hello"}:
                raise BenchmarkError(f"Client.wait returned {record}")
            waited.append((time.perf_counter() - t0) * 1000)
        shared = [case.turn({"k": 1}) for _ in range(turns)]
        return waited, shared
    finally:
        case.close()


def settled_throughput(
    bootstrap: str,
    broker_pid: int,
    log_dir: Path,
    warmup_s: float,
    window_s: float,
    measured: Measured,
    system: str,
) -> None:
    """50 turns in flight (K=5) for a window; then kill -9 the worker, restart it, and check no admitted turn is lost.

    Raises:
        BenchmarkError: A load thread failed, or an admitted turn never settled after the restart.
    """
    case = SettledCase(bootstrap, log_dir, "throughput")
    assert case.worker is not None
    errors: list[BaseException] = []
    admitted: list[str] = []
    state = {"counting": False, "stop": False, "turns": 0}
    lock = threading.Lock()

    def loop() -> None:
        try:
            while not state["stop"]:
                sid = case.submit({"k": THROUGHPUT_K})
                with lock:
                    admitted.append(sid)
                case.settle([sid])
                with lock:
                    if state["counting"] and not state["stop"]:
                        state["turns"] += 1
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread, which fails the run with it
            errors.append(exc)

    try:
        case.warm_partitions()
        threads = [threading.Thread(target=loop, daemon=True) for _ in range(IN_FLIGHT)]
        for t in threads:
            t.start()
        time.sleep(warmup_s)  # the workload's warm-up, by definition a duration
        worker_pid = case.worker.pid
        groups = {"load generator": _pids(os.getpid()), "worker": _pids(worker_pid), "broker": _pids(broker_pid)}
        cpu0 = {name: sum(cpu_seconds(select).values()) for name, select in groups.items()}
        jit0_s = jit_cpu_s(broker_pid)
        with lock:
            state["counting"] = True
        time.sleep(window_s)  # the workload's window, by definition a duration
        with lock:
            state["stop"] = True
            counted = state["turns"]
        cpu1 = {name: sum(cpu_seconds(select).values()) for name, select in groups.items()}
        jit_s = jit_cpu_s(broker_pid) - jit0_s
        for t in threads:
            t.join(120)
        if errors:
            raise BenchmarkError(f"settled throughput: a load thread failed: {errors[0]!r}") from errors[0]
        measured.add("steps/s, 50 in flight, K=5", system, counted * THROUGHPUT_K / window_s)
        total_s = cpu_per_turn(measured, system, cpu0, cpu1, counted)
        # A fresh JVM broker compiles its hot paths during its first minutes of load (bench/records_per_txn.py):
        # a one-time cost of the broker process, so the figure is also given without its JIT compiler threads.
        measured.add(CPU_LESS_JIT, system, (total_s - jit_s) * 1000 / max(counted, 1))
        # No acknowledged turn lost: admitted while the window ran, the worker killed and restarted at once.
        case.worker.kill_and_wait()
        case.start_worker()
        case.settle(list(admitted), timeout_s=120)
        measured.detail.setdefault("settled admitted turns checked after kill -9 of the worker", []).append(
            len(admitted)
        )
    finally:
        case.close()


def settled_crash(bootstrap: str, log_dir: Path, measured: Measured, system: str) -> None:
    """The crash case on a fresh namespace (its restore reads only its own records)."""
    case = SettledCase(bootstrap, log_dir, "crash")
    assert case.worker is not None
    counter = log_dir / f"settled-crash-{uuid.uuid4().hex[:6]}.txt"
    try:
        case.warm_partitions()
        body = {"k": CRASH_K, "counter": str(counter), "sleep_step": CRASH_STEP, "sleep_s": STEP_SLEEP_S}
        sid = case.submit(body)
        _wait_for_line(counter, f"step {CRASH_STEP}", 60)
        time.sleep(KILL_INTO_STEP_S)  # the workload: the kill comes 1 s into the step
        t_kill = time.perf_counter()
        case.worker.kill_and_wait()
        t_restart = time.perf_counter()
        case.start_worker()
        case.settle([sid], timeout_s=120)
        t_done = case.tracker.read_at[sid]
        crash_rows(measured, system, t_kill, t_restart, t_done, counter)
    finally:
        case.close()


# ------------------------------------------------------------------------------------------ Restate, DBOS


def _json_lines(proc: subprocess.Popen[str]) -> Iterator[dict[str, Any]]:
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.strip():
            yield json.loads(line)


def _finish(proc: subprocess.Popen[str], what: str, timeout_s: float = 120) -> None:
    """Wait for a driver to end; fail with the tail of its log (the last argument after ``--log``) unless it exits 0.

    Raises:
        BenchmarkError: It did not end within ``timeout_s`` seconds, or exited non-zero.
    """
    log = Path(str(proc.args[-1])) if isinstance(proc.args, list) else Path("/dev/null")
    try:
        code = proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise BenchmarkError(f"{what} did not end within {timeout_s} s; log {log}:\n{_tail(log)}") from None
    if code != 0:
        raise BenchmarkError(f"{what} exited {code}; log {log}:\n{_tail(log)}")


def _driver(argv: list[str], log: Path) -> subprocess.Popen[str]:
    """Start a driver process: JSON lines on its stdout (read by the caller), its stderr appended to ``log``."""
    with log.open("a") as err:
        return subprocess.Popen([*argv, "--log", str(log)], stdout=subprocess.PIPE, stderr=err, text=True)


def restate_load(peers: Peers, cfg: dict[str, Any], log: Path) -> subprocess.Popen[str]:
    """Start the Node.js load generator on Restate's ingress with this configuration (stderr to ``log``).

    Returns:
        The running process; its stdout carries JSON lines.
    """
    config = json.dumps({"ingress": "http://127.0.0.1:8080", **cfg})
    return _driver([str(peers.node), str(PEERS_DIR / "restate_load.mjs"), config], log)


def dbos_driver(peers: Peers, dsn: str, cfg: dict[str, Any], log: Path) -> subprocess.Popen[str]:
    """Start the DBOS driver process (in-process workflow calls) with this configuration (stderr to ``log``).

    Returns:
        The running process; its stdout carries JSON lines.
    """
    return _driver([str(peers.python), str(PEERS_DIR / "dbos_driver.py"), json.dumps({"dsn": dsn, **cfg})], log)


def peer_latency(
    start: Callable[[dict[str, Any]], subprocess.Popen[str]], what: str, ks: Sequence[int], warmup: int, turns: int
) -> dict[int, list[float]]:
    """Sequential turns per K through a peer's driver; latencies in ms."""
    out = {}
    for k in ks:
        proc = start({"mode": "latency", "k": k, "warmup": warmup, "turns": turns})
        events = list(_json_lines(proc))
        _finish(proc, f"{what} latency K={k}")
        out[k] = [float(x) for x in events[-1]["latencies_ms"]]
    return out


def peer_throughput(
    start: Callable[[dict[str, Any]], subprocess.Popen[str]],
    what: str,
    select: Callable[[int, str], bool],
    warmup_s: float,
    window_s: float,
    measured: Measured,
    system: str,
) -> None:
    """A closed loop of 50 in flight (K=5) through a peer's driver; CPU of ``select``'s processes over the window."""
    proc = start(
        {"mode": "throughput", "k": THROUGHPUT_K, "inflight": IN_FLIGHT, "warmup_s": warmup_s, "window_s": window_s}
    )
    cpu0: dict[str, float] = {}
    cpu1: dict[str, float] = {}
    counted = -1
    for event in _json_lines(proc):
        if event.get("event") == "window-start":
            cpu0 = cpu_seconds(lambda pid, comm: pid == proc.pid or select(pid, comm))
        elif event.get("event") == "window-end":
            cpu1 = cpu_seconds(lambda pid, comm: pid == proc.pid or select(pid, comm))
            counted = int(event["turns"])
    _finish(proc, f"{what} throughput")
    if counted < 0:
        raise BenchmarkError(f"{what} throughput: the driver reported no window")
    measured.add("steps/s, 50 in flight, K=5", system, counted * THROUGHPUT_K / window_s)
    cpu_per_turn(measured, system, cpu0, cpu1, counted)


def restate_crash(peers: Peers, restate: RestateServer, log_dir: Path, measured: Measured) -> None:
    """The crash case: kill -9 the SDK endpoint (the process running the turn) 1 s into step 3, restart it."""
    counter = log_dir / f"restate-crash-{uuid.uuid4().hex[:6]}.txt"
    body = {"k": CRASH_K, "counter": str(counter), "sleep_step": CRASH_STEP, "sleep_s": STEP_SLEEP_S}
    proc = restate_load(peers, {"mode": "one", "id": str(uuid.uuid4()), "body": body}, log_dir / "restate-load.log")
    _wait_for_line(counter, f"step {CRASH_STEP}", 60)
    time.sleep(KILL_INTO_STEP_S)  # the workload: the kill comes 1 s into the step
    assert restate.endpoint is not None
    t_kill = time.perf_counter()
    _kill9(restate.endpoint)
    t_restart = time.perf_counter()
    restate.start_endpoint()
    events = list(_json_lines(proc))
    t_done = time.perf_counter()
    _finish(proc, "Restate crash case")
    if not events or events[-1].get("result") != "hello":
        raise BenchmarkError(f"Restate crash case: no result read ({events})")
    crash_rows(measured, RESTATE, t_kill, t_restart, t_done, counter)


def dbos_crash(peers: Peers, dsn: str, log_dir: Path, measured: Measured) -> None:
    """The crash case: kill -9 the DBOS process 1 s into step 3, start a new one (DBOS recovers the workflow)."""
    counter = log_dir / f"dbos-crash-{uuid.uuid4().hex[:6]}.txt"
    wf = str(uuid.uuid4())
    cfg = {"id": wf, "k": CRASH_K, "counter": str(counter), "sleep_step": CRASH_STEP, "sleep_s": STEP_SLEEP_S}
    first = dbos_driver(peers, dsn, {"mode": "crash-start", **cfg}, log_dir / "dbos-driver.log")
    _wait_for_line(counter, f"step {CRASH_STEP}", 60)
    time.sleep(KILL_INTO_STEP_S)  # the workload: the kill comes 1 s into the step
    t_kill = time.perf_counter()
    first.kill()
    first.wait(30)
    t_restart = time.perf_counter()
    second = dbos_driver(peers, dsn, {"mode": "crash-recover", "id": wf}, log_dir / "dbos-driver.log")
    events = list(_json_lines(second))
    t_done = time.perf_counter()
    _finish(second, "DBOS crash recovery")
    if not events or events[-1].get("result") != "hello":
        raise BenchmarkError(f"DBOS crash case: no result read ({events})")
    crash_rows(measured, DBOS, t_kill, t_restart, t_done, counter)


# ------------------------------------------------------------------------------------------ report


def _fmt(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.2f}" if abs(value) >= 1 else f"{value:.3f}"


def summarize(values: Sequence[float]) -> str:
    """``median (min-max)`` of the repetitions, or the single value."""
    if len(values) == 1:
        return _fmt(values[0])
    return f"{_fmt(statistics.median(values))} ({_fmt(min(values))}–{_fmt(max(values))})"


def ratio_note(a: str, b: str) -> str:
    """How the durability classes of systems ``a`` and ``b`` compare: empty when equal, else which side is weaker."""
    ca, cb = SYSTEM_CLASS[a], SYSTEM_CLASS[b]
    if CLASS_STRENGTH[ca] == CLASS_STRENGTH[cb]:
        return "" if ca == cb else f"comparable classes ({ca} / {cb})"
    weaker = a if CLASS_STRENGTH[ca] < CLASS_STRENGTH[cb] else b
    return f"classes differ: {weaker} is weaker ({SYSTEM_CLASS[weaker]})"


#: The issue's rows: the headline table shows these, with ratios; every other row is in the detail table.
HEADLINE_ROWS = (
    "turn p50, K=0 (ms)",
    "marginal cost per durable step (ms)",
    "steps/s, 50 in flight, K=5",
    "CPU per turn at 50 in flight (ms)",
    "crash: restart -> done beyond the re-run step (s)",
    "Client.wait per submission, p50, K=1 (ms)",
    "one shared reader, p50, K=1 (ms)",
)
#: Baselines every run must have measured, per row.
BASELINE_ROWS = {"turn p50, K=0 (ms)": (BARE, NO_DURABILITY), "marginal cost per durable step (ms)": (NO_DURABILITY,)}


def build_report(measured: Measured, classes: dict[str, str], crash: bool) -> tuple[list[dict[str, Any]], list[str]]:
    """Turn the figures into rows and list every check failure.

    Each row holds: row, system, durability class, the repetitions' values and their summary, and for the headline
    rows the ratios ``other ÷ settled`` against settled's ``ctx.step`` on the page-cache broker and on the fsync
    broker (where measured), each with a note when the two classes differ that names the weaker side.

    Args:
        measured: The run's figures.
        classes: The description of each durability class that ran.
        crash: Whether the crash case ran (its rows are then required).

    Returns:
        ``(rows, failures)``; the run fails when ``failures`` is not empty.
    """
    rows: list[dict[str, Any]] = []
    failures: list[str] = []
    row_names = list(dict.fromkeys(r for r, _ in measured.values))
    for row in row_names:
        for system in SYSTEMS:
            values = measured.values.get((row, system))
            if values is None:
                continue
            cls = SYSTEM_CLASS.get(system)
            if not cls or cls not in classes:
                failures.append(f"row {row!r}, {system}: no durability class")
            entry: dict[str, Any] = {
                "row": row,
                "system": system,
                "class": cls,
                "values": values,
                "median": statistics.median(values),
                "text": summarize(values),
                "ratios": [],
            }
            for ref in (SETTLED_STEP, SETTLED_FSYNC):
                ref_values = measured.values.get((row, ref))
                if row not in HEADLINE_ROWS or ref_values is None or system in (SETTLED_STEP, SETTLED_FSYNC):
                    continue
                ref_median = statistics.median(ref_values)
                if ref_median == 0:
                    continue
                note = ratio_note(ref, system)
                if SYSTEM_CLASS[ref] != SYSTEM_CLASS[system] and not note:
                    failures.append(f"row {row!r}: {ref} vs {system} pairs different classes without saying so")
                entry["ratios"].append({"settled": ref, "ratio": statistics.median(values) / ref_median, "note": note})
            rows.append(entry)
    for row, baselines in BASELINE_ROWS.items():
        for baseline in baselines:
            if (row, baseline) not in measured.values:
                failures.append(f"baseline {baseline} missing from row {row!r}")
    required = ["turn p50, K=0 (ms)", "marginal cost per durable step (ms)", "steps/s, 50 in flight, K=5"]
    required += ["CPU per turn at 50 in flight (ms)"]
    required += ["crash: restart -> done beyond the re-run step (s)"] if crash else []
    for row in required:
        for system in (DBOS, RESTATE, SETTLED_STEP):
            if (row, system) not in measured.values:
                failures.append(f"{system} missing from row {row!r}")
    for system in (DBOS, RESTATE, SETTLED_STEP):
        if any(v <= 0 for v in measured.values.get(("steps/s, 50 in flight, K=5", system), [])):
            failures.append(f"{system}: a throughput window counted no turn whose result the client read")
    return rows, failures


def render(rows: list[dict[str, Any]], header: list[str], classes: dict[str, str]) -> str:
    """The Markdown report: header lines, the headline table (rows x systems), the ratios, every row, the classes."""
    by_key = {(r["row"], r["system"]): r for r in rows}
    systems = [s for s in SYSTEMS if any(r["system"] == s for r in rows)]
    lines = [*header, "", "| row | " + " | ".join(systems) + " |", "|---|" + "---|" * len(systems)]
    lines.append("| durability class | " + " | ".join(SYSTEM_CLASS[s] for s in systems) + " |")
    for row in HEADLINE_ROWS:
        cells = [by_key[(row, s)]["text"] if (row, s) in by_key else "–" for s in systems]
        if any(c != "–" for c in cells):
            lines.append(f"| {row} | " + " | ".join(cells) + " |")
    lines += ["", "Ratios (other ÷ settled, medians; a time below 1 or a rate above 1 favours the other side):", ""]
    lines += ["| row | system | vs settled | ratio | classes |", "|---|---|---|---|---|"]
    for r in rows:
        for x in r["ratios"]:
            lines.append(
                f"| {r['row']} | {r['system']} | {x['settled']} | {x['ratio']:.2f} | {x['note'] or 'same class'} |"
            )
    lines += ["", "Every figure:", "", "| row | system | durability class | value |", "|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['row']} | {r['system']} | {r['class']} | {r['text']} |")
    lines += ["", "Durability classes:", ""]
    for cls, text in classes.items():
        lines.append(f"- **{cls}**: {text}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------ main


@dataclass(frozen=True)
class Sizes:
    """How much of each workload a run does."""

    reps: int
    warmup: int
    turns: int
    warmup_s: float
    window_s: float
    crash: bool


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3, help="repetitions; each figure is their median (default 3)")
    parser.add_argument("--smoke", action="store_true", help="CI: one repetition, small N, no crash case")
    parser.add_argument("--out", type=Path, default=None, help="folder for side_by_side.md/.json (default: run dir)")
    parser.add_argument("--keep", action="store_true", help="keep the run's state folder (data and logs)")
    parser.add_argument(
        "--production-timeouts",
        action="store_true",
        help="run settled with the production Kafka timeouts (default: the dev stack's short ones)",
    )
    parser.add_argument("--turns", type=int, help="sequential turns per K (default 200; smoke 20)")
    parser.add_argument("--warmup", type=int, help="warm-up turns per K (default 20; smoke 5)")
    parser.add_argument("--window-s", type=float, help="throughput window, seconds (default 20; smoke 3)")
    parser.add_argument("--warmup-s", type=float, help="throughput warm-up, seconds (default 3; smoke 1)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Re-execute inside a network namespace, then run the benchmark there."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    args = _parse(args_list)
    try:
        if os.environ.get(NETNS_ENV) != "1":
            # Outside: everything that needs the network (the broker's jars from Maven Central) happens here.
            from settled.services._devstack import resolve_kafka_jars

            base = Settings()
            resolve_kafka_jars(base.jar_cache_dir, base.kafka_version, base.log4j2_version)
            Peers.find()
            return reexec_in_namespace(args_list)
        return run(args)
    except (BenchmarkError, StackError) as exc:
        print(f"side_by_side: FAILED: {exc}", file=sys.stderr)
        return 1


def run(args: argparse.Namespace) -> int:
    """Start the services, run every case ``reps`` times, check, report.

    Raises:
        BenchmarkError: A service failed, a measurement broke or an honesty check failed.
    """
    from settled.services._devstack import KafkaBroker, PostgresServer, free_port

    started = time.monotonic()
    settled_version = _git_describe()  # the code that runs, read before anything else
    loopback_up()
    sizes = (
        Sizes(reps=1, warmup=5, turns=20, warmup_s=1.0, window_s=3.0, crash=False)
        if args.smoke
        else Sizes(reps=args.reps, warmup=20, turns=200, warmup_s=3.0, window_s=20.0, crash=True)
    )
    sizes = Sizes(
        reps=sizes.reps,
        warmup=sizes.warmup if args.warmup is None else args.warmup,
        turns=sizes.turns if args.turns is None else args.turns,
        warmup_s=sizes.warmup_s if args.warmup_s is None else args.warmup_s,
        window_s=sizes.window_s if args.window_s is None else args.window_s,
        crash=sizes.crash,
    )
    peers = Peers.find()
    timeouts = Settings().timeouts_label() if args.production_timeouts else use_dev_timeouts()
    base = Settings()
    run_dir = bench_cache_dir() / "runs" / datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    run_dir.mkdir(parents=True, exist_ok=True)
    out_dir = args.out or run_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    lib = base.jar_cache_dir / f"kafka-{base.kafka_version}" / "lib"
    broker = KafkaBroker(run_dir / "kafka", lib, free_port(), free_port())
    broker_fsync = KafkaBroker(
        run_dir / "kafka-fsync", lib, free_port(), free_port(), overrides={"log.flush.interval.messages": "1"}
    )
    postgres = PostgresServer(run_dir / "postgres", free_port())
    restate = RestateServer(peers, run_dir / "restate")
    measured = Measured()
    load_before = load_average()
    print(f"[side_by_side] state {run_dir}; {load_before}", file=sys.stderr, flush=True)
    try:
        broker.start()
        broker_fsync.start()
        postgres.start()
        restate.start()
        import psycopg

        with psycopg.connect(postgres.dsn, autocommit=True) as conn:
            pg_settings = {
                name: str(conn.execute(f"SHOW {name}").fetchone()[0])  # type: ignore[index]
                for name in ("fsync", "synchronous_commit", "wal_sync_method", "server_version")
            }
        if pg_settings["fsync"] != "on" or pg_settings["synchronous_commit"] != "on":
            raise BenchmarkError(f"PostgreSQL for DBOS must fsync every commit, found {pg_settings}")
        probe = Settings(namespace=fresh_namespace("bench-sbs-probe"), kafka_bootstrap=broker.bootstrap)
        from settled.producers import provision_topics
        from settled.schemas import Codec

        provision_topics(probe, Codec(), datetime.now(UTC))
        broker_info = describe_broker(broker.bootstrap, probe.topic("log"))
        probe_fsync = Settings(namespace=probe.namespace, kafka_bootstrap=broker_fsync.bootstrap)
        provision_topics(probe_fsync, Codec(), datetime.now(UTC))
        fsync_info = describe_broker(broker_fsync.bootstrap, probe_fsync.topic("log"))
        if fsync_info.flush_interval_messages != "1":
            raise BenchmarkError(
                f"the fsync broker runs log.flush.interval.messages={fsync_info.flush_interval_messages}"
            )
        classes = {
            PAGE_CACHE: f"settled and the bare Kafka baseline: {broker_info.durability_class()}",
            PURE_POSTED: "settled ctx.step(pure=True) on the page-cache broker: a pure step's record is posted and "
            "commits with the run's next awaited record (here the settlement), so a crash of the worker process "
            "may lose it and run the step again (weaker than the peers, whose every step is durable before the next)",
            FSYNC_PER_MESSAGE: "settled on a broker with log.flush.interval.messages=1: "
            + fsync_info.durability_class(),
            PG_FSYNC: "DBOS: PostgreSQL "
            + ", ".join(f"{k}={v}" for k, v in pg_settings.items() if k != "server_version")
            + ": a committed step survives the loss of the machine (one fsync per commit)",
            RESTATE_DEFAULT: f"Restate: {restate.durability()}",
            NONE: "no durability: an in-process loop; nothing survives anything",
        }
        ks = (0, 1, 10)
        for rep in range(sizes.reps):
            print(f"[side_by_side] repetition {rep + 1}/{sizes.reps}", file=sys.stderr, flush=True)
            order = [DBOS, RESTATE, SETTLED_STEP]
            order = order[rep % 3 :] + order[: rep % 3]
            for system in order:
                t0 = time.monotonic()
                if system == DBOS:
                    start_dbos = lambda cfg: dbos_driver(peers, postgres.dsn, cfg, run_dir / "dbos-driver.log")  # noqa: E731
                    latency_rows(measured, DBOS, peer_latency(start_dbos, "DBOS", ks, sizes.warmup, sizes.turns))
                    peer_throughput(
                        start_dbos,
                        "DBOS",
                        lambda _pid, comm: comm == "postgres",
                        sizes.warmup_s,
                        sizes.window_s,
                        measured,
                        DBOS,
                    )
                    if sizes.crash:
                        dbos_crash(peers, postgres.dsn, run_dir, measured)
                elif system == RESTATE:
                    start_restate = lambda cfg: restate_load(peers, cfg, run_dir / "restate-load.log")  # noqa: E731
                    latency_rows(
                        measured, RESTATE, peer_latency(start_restate, "Restate", ks, sizes.warmup, sizes.turns)
                    )
                    assert restate.server is not None and restate.endpoint is not None
                    peer_throughput(
                        start_restate,
                        "Restate",
                        restate.owns,
                        sizes.warmup_s,
                        sizes.window_s,
                        measured,
                        RESTATE,
                    )
                    if sizes.crash:
                        restate_crash(peers, restate, run_dir, measured)
                else:
                    splits: dict[str, tuple[float, float]] = {}
                    lat = settled_latency(
                        broker.bootstrap,
                        run_dir,
                        "latency",
                        {"step": ks, "pure": ks, "tool": (1, 10)},
                        sizes.warmup,
                        sizes.turns,
                        splits,
                    )
                    latency_rows(measured, SETTLED_STEP, lat["step"])
                    # Its own K=0 turns, measured right before its K=1 and 10: the marginal step cost subtracts a
                    # K=0 taken under the same load (the step case's, minutes earlier, made it negative once).
                    latency_rows(measured, SETTLED_PURE, lat["pure"])
                    latency_rows(measured, SETTLED_TOOL, {0: lat["step"][0], **lat["tool"]})
                    lat_fsync = settled_latency(
                        broker_fsync.bootstrap, run_dir, "fsync", {"step": (0, 10)}, sizes.warmup, sizes.turns, splits
                    )
                    measured.detail.setdefault(SPLITS, []).append(
                        {case: f"{a:.1f} + {b:.1f}" for case, (a, b) in splits.items()}
                    )
                    latency_rows(measured, SETTLED_FSYNC, lat_fsync["step"])
                    settled_throughput(
                        broker.bootstrap,
                        process_with_arg(str(broker.home / "server.properties")),
                        run_dir,
                        sizes.warmup_s,
                        sizes.window_s,
                        measured,
                        SETTLED_STEP,
                    )
                    waited, shared = settled_wait_vs_reader(broker.bootstrap, run_dir, sizes.turns)
                    measured.add("Client.wait per submission, p50, K=1 (ms)", SETTLED_STEP, percentile(waited, 50))
                    measured.add("one shared reader, p50, K=1 (ms)", SETTLED_STEP, percentile(shared, 50))
                    if sizes.crash:
                        settled_crash(broker.bootstrap, run_dir, measured, SETTLED_STEP)
                print(f"[side_by_side]   {system}: {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
            bare = bare_commits(broker.bootstrap, sizes.turns, sizes.warmup)
            measured.add("turn p50, K=0 (ms)", BARE, percentile(bare, 50))
            measured.add("turn p99, K=0 (ms)", BARE, percentile(bare, 99))
            latency_rows(measured, NO_DURABILITY, no_durability(sizes.turns, ks))
        rows, failures = build_report(measured, classes, sizes.crash)
        versions = {
            "settled": settled_version,
            "python": platform.python_version(),
            "kafka client": client_versions(),
            "kafka broker": broker_info.version,
            "postgresql": pg_settings["server_version"],
            **peers.versions(),
        }
        header = [
            f"# side by side ({'smoke' if args.smoke else f'median of {sizes.reps}, min–max'}), "
            f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
            "",
            f"- command: `python bench/side_by_side.py {' '.join(sys.argv[1:])}`; wall time "
            f"{time.monotonic() - started:.0f} s; {load_before} before, {load_average()} after",
            f"- settled ran with Kafka timeouts {timeouts}"
            + (
                ""
                if args.production_timeouts
                else " (the dev stack's short set, as issue 23's table; "
                "--production-timeouts runs the production defaults)"
            ),
            "- versions: " + "; ".join(f"{k} {v}" for k, v in versions.items()),
            f"- workload: latency {sizes.warmup} warm-up + {sizes.turns} sequential turns per K; throughput "
            f"{IN_FLIGHT} in flight, K={THROUGHPUT_K}, {sizes.warmup_s:g} s warm-up, {sizes.window_s:g} s window; "
            + (f"crash K={CRASH_K}, step {CRASH_STEP} sleeps {STEP_SLEEP_S:g} s" if sizes.crash else "no crash case"),
            f"- crash executions per step: {measured.detail.get('crash executions', '–')}",
            f"- {SPLITS}: {measured.detail.get(SPLITS, '–')}",
            f"- {CPU_SPLIT}: {measured.detail.get(CPU_SPLIT, '–')}",
            f"- {BARE}: one transactional commit of 1 record + the consumer's offsets with settled's client settings "
            f"(one durable write, the floor under a turn); {NO_DURABILITY}: K identity calls in a plain loop",
            f"- settled admitted turns checked after kill -9 of the worker: "
            f"{measured.detail.get('settled admitted turns checked after kill -9 of the worker', '–')}",
        ]
        report = render(rows, header, classes)
        print(report)
        (out_dir / "side_by_side.md").write_text(report + "\n")
        (out_dir / "side_by_side.json").write_text(
            json.dumps(
                {
                    "smoke": args.smoke,
                    "reps": sizes.reps,
                    "timeouts": timeouts,
                    "versions": versions,
                    "classes": classes,
                    "rows": rows,
                    "detail": measured.detail,
                    "failures": failures,
                },
                indent=2,
            )
            + "\n"
        )
        print(f"[side_by_side] wrote {out_dir / 'side_by_side.md'} and .json", file=sys.stderr)
        if failures:
            raise BenchmarkError("checks failed:\n  " + "\n  ".join(failures))
        return 0
    finally:
        _cleanup(restate.stop, broker.stop, broker_fsync.stop, postgres.destroy)
        if not args.keep:
            for sub in ("kafka", "kafka-fsync", "restate"):
                shutil.rmtree(run_dir / sub, ignore_errors=True)


def _cleanup(*steps: Callable[[], None]) -> None:
    """Run every clean-up step; one that fails is reported on stderr and the others still run."""
    for step in steps:
        try:
            step()
        except Exception as exc:  # noqa: BLE001 - reported; the remaining services must still be stopped
            print(f"[side_by_side] clean-up {step.__qualname__} failed: {exc!r}", file=sys.stderr)


def _git_describe() -> str:
    res = subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"], capture_output=True, text=True)
    return res.stdout.strip() or "unknown"


if __name__ == "__main__":
    sys.exit(main())
