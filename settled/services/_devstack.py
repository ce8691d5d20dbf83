"""Real Kafka and PostgreSQL without Docker (docs/design.md §8).

``KafkaBroker`` runs a single-node Apache Kafka 4.x broker in KRaft mode from jars that Maven resolves from Maven
Central into a cache folder reused across runs. ``PostgresServer`` runs the machine's PostgreSQL server binaries
(``initdb``, ``pg_ctl``) on a private data folder and port, as an unprivileged user when we are root (``initdb``
and ``postgres`` refuse root). ``DevStack`` is the pair that ``settled dev up|down|status`` manages; the test
fixtures use the two classes directly for private, restartable instances.

Processes are started in their own session (they outlive the command that started them) and tracked by pid files
whose pid is checked against ``/proc/<pid>/cmdline``, so a reused pid is never mistaken for ours.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from settled._errors import ErrorCategory, SettledError

__all__ = [
    "DevStack",
    "KafkaBroker",
    "PostgresServer",
    "StackError",
    "broker_ready_timeout_s",
    "free_port",
    "resolve_kafka_jars",
]

_PG_USER = "settled"
_READY_TIMEOUT_S = 90.0
#: What each partition folder adds to the broker's start-up bound, in seconds. A broker loads every partition's log
#: before it answers; measured on the 2-core development machine (2026-12-05): 16,221 folders took 240 s (15 ms
#: each), so twice that leaves room for a loaded machine.
_READY_S_PER_PARTITION_FOLDER = 0.030
#: A partition folder's name: ``<topic>-<partition>`` (a deleted one carries a ``.<id>-delete`` suffix).
_PARTITION_FOLDER = re.compile(r".+-\d+(\.[0-9a-f]+-delete)?$")


class StackError(SettledError, RuntimeError):
    """A dev-stack service could not be installed, started or stopped; the message says why and what to run."""

    category = ErrorCategory.UNAVAILABLE


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago.

    Returns:
        A port number chosen by the kernel.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


#: Where root's tools live; a minimal environment's PATH may lack them.
_SYSTEM_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/local/sbin", "/usr/sbin", "/sbin"])


def _require(command: str, install_hint: str) -> str:
    path = shutil.which(command, path=_SYSTEM_PATH)
    if path is None:
        raise StackError(f"{command!r} was not found on PATH; install it with: {install_hint}")
    return path


def _pid_alive(pid: int, marker: str) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    # A zombie child has an empty cmdline: it is not running.
    return marker.encode() in cmdline


def _read_pid(pid_file: Path) -> int | None:
    try:
        return int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return None


def _stop_pid(pid: int, marker: str, timeout_s: float, sig: int = signal.SIGTERM) -> None:
    if not _pid_alive(pid, marker):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        if not _pid_alive(pid, marker):
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline and _pid_alive(pid, marker):
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        time.sleep(0.05)
    if _pid_alive(pid, marker):
        raise StackError(f"process {pid} ({marker}) survived SIGKILL for 10 s")


def broker_ready_timeout_s(partition_folders: int) -> float:
    """Return how long a starting broker may take before it answers: 90 s plus 30 ms per partition folder.

    Args:
        partition_folders: Partition folders in the broker's data folder (`KafkaBroker.partition_folders`).

    Returns:
        The bound on the wait for readiness, in seconds.
    """
    return _READY_TIMEOUT_S + _READY_S_PER_PARTITION_FOLDER * partition_folders


def _port_answers(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def resolve_kafka_jars(cache_dir: Path, kafka_version: str, log4j2_version: str, timeout_s: float = 600.0) -> Path:
    """Resolve the broker's jars from Maven Central into ``cache_dir`` once, and reuse them afterwards.

    Args:
        cache_dir: Folder of the jar cache; the jars land in ``cache_dir/kafka-<version>/lib``.
        kafka_version: The ``org.apache.kafka:kafka_2.13`` version, e.g. ``"4.1.1"``.
        log4j2_version: The log4j2 version shipped with that Kafka release (for ``log4j-slf4j-impl``).
        timeout_s: Bound on the Maven run, in seconds.

    Returns:
        The ``lib`` folder holding every jar of the broker's runtime classpath.

    Raises:
        StackError: Java or Maven is missing, or Maven failed (its output is included).
    """
    _require("java", "apt-get install -y openjdk-17-jre-headless")
    mvn = _require("mvn", "apt-get install -y maven")
    home = cache_dir / f"kafka-{kafka_version}"
    lib = home / "lib"
    done = lib / ".complete"
    if done.exists():
        return lib
    home.mkdir(parents=True, exist_ok=True)
    pom = home / "pom.xml"
    pom.write_text(resources.files("settled.services").joinpath("stack/pom.xml").read_text())
    tmp_lib = home / f"lib.{uuid.uuid4().hex}"
    cmd = [
        mvn,
        "-q",
        "-B",
        "-f",
        str(pom),
        "package",
        f"-Dkafka.version={kafka_version}",
        f"-Dlog4j2.version={log4j2_version}",
        f"-Dlib.dir={tmp_lib}",
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as exc:
        raise StackError(f"Maven did not resolve Kafka {kafka_version} within {timeout_s} s: {cmd}") from exc
    if proc.returncode != 0:
        raise StackError(
            f"Maven failed to resolve Kafka {kafka_version} (exit {proc.returncode}); is Maven Central reachable?\n"
            f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    jars = list(tmp_lib.glob("*.jar"))
    if not any(j.name.startswith("kafka_2.13-") for j in jars):
        raise StackError(f"Maven ran but {tmp_lib} holds no kafka_2.13 jar")
    (tmp_lib / ".complete").write_text(f"{len(jars)} jars\n")
    if lib.exists():
        shutil.rmtree(lib)
    tmp_lib.rename(lib)
    return lib


@dataclass
class KafkaBroker:
    """A single-node Apache Kafka broker in KRaft mode, run from Maven-resolved jars.

    Attributes:
        home: Folder holding this broker's ``server.properties``, data, pid file and ``kafka.log``.
        lib_dir: Folder of the broker's jars (see ``resolve_kafka_jars``).
        port: Client listener port on 127.0.0.1.
        controller_port: KRaft controller listener port on 127.0.0.1.
        heap_mb: JVM heap, in MiB.
        overrides: Extra ``server.properties`` entries, e.g. ``{"message.max.bytes": "2000000"}``.
    """

    home: Path
    lib_dir: Path
    port: int
    controller_port: int
    heap_mb: int = 512
    overrides: dict[str, str] = field(default_factory=dict)

    _MARKER = "kafka.Kafka"
    _proc: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def bootstrap(self) -> str:
        """The ``bootstrap.servers`` string, ``127.0.0.1:<port>``."""
        return f"127.0.0.1:{self.port}"

    @property
    def log_file(self) -> Path:
        """The broker's console log."""
        return self.home / "kafka.log"

    @property
    def _pid_file(self) -> Path:
        return self.home / "kafka.pid"

    def properties(self) -> dict[str, str]:
        """Return the broker configuration: single-node overrides and the short test timeouts (docs/design.md §3).

        Returns:
            ``server.properties`` entries, ``overrides`` applied last.
        """
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.bootstrap.servers": f"127.0.0.1:{self.controller_port}",
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": str(self.home / "data"),
            "num.partitions": "1",
            "default.replication.factor": "1",
            "min.insync.replicas": "1",
            "auto.create.topics.enable": "false",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            "group.min.session.timeout.ms": "1000",
            "transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000",
            "log.cleaner.dedupe.buffer.size": "8388608",
            "num.network.threads": "2",
            "num.io.threads": "2",
            "num.recovery.threads.per.data.dir": "1",
        }
        props.update(self.overrides)
        return props

    def partition_folders(self) -> int:
        """Return the number of partition folders in the data folder: what the broker loads before it answers."""
        try:
            return sum(1 for p in (self.home / "data").iterdir() if _PARTITION_FOLDER.match(p.name))
        except FileNotFoundError:
            return 0

    def is_running(self) -> bool:
        """Return whether this broker's process is alive (it may not be ready yet)."""
        if self._proc is not None and self._proc.poll() is None:
            # Started by this process: ask the child itself (right after fork its cmdline is still ours).
            return True
        pid = _read_pid(self._pid_file)
        return pid is not None and _pid_alive(pid, self._MARKER)

    def start(self, ready_timeout_s: float | None = None) -> None:
        """Format storage on first use, start the broker detached, and wait until it answers metadata calls.

        A no-op when the broker is already running and ready.

        Args:
            ready_timeout_s: Bound on the wait for readiness, in seconds. Unset: `broker_ready_timeout_s` of the
                data folder's partition folders (a broker holding many topics loads each before it answers).

        Raises:
            StackError: Java is missing, a port is taken by another process, formatting failed, or the broker died
                or never became ready (the log tail is included).
        """
        if ready_timeout_s is None:
            ready_timeout_s = broker_ready_timeout_s(self.partition_folders())
        if self.is_running():
            self.wait_ready(ready_timeout_s)
            return
        for name, port in (("client", self.port), ("controller", self.controller_port)):
            if _port_answers(port):
                raise StackError(
                    f"the broker's {name} port 127.0.0.1:{port} is taken by another process (another stack? "
                    f"its state folder is not {self.home}); stop it, or pick another port "
                    "(SETTLED_KAFKA_PORT, SETTLED_KAFKA_CONTROLLER_PORT)"
                )
        java = _require("java", "apt-get install -y openjdk-17-jre-headless")
        self.home.mkdir(parents=True, exist_ok=True)
        conf = self.home / "server.properties"
        conf.write_text("".join(f"{k}={v}\n" for k, v in self.properties().items()))
        log4j = self.home / "log4j2.properties"
        log4j.write_text(resources.files("settled.services").joinpath("stack/log4j2.properties").read_text())
        jvm = [
            "-Xms128m",
            f"-Xmx{self.heap_mb}m",
            "-XX:+UseSerialGC",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={log4j}",
        ]
        classpath = f"{self.lib_dir}/*"
        if not (self.home / "data" / "meta.properties").exists():
            cluster_id = _kraft_cluster_id()
            fmt = subprocess.run(
                [
                    java,
                    *jvm,
                    "-cp",
                    classpath,
                    "kafka.tools.StorageTool",
                    "format",
                    f"--cluster-id={cluster_id}",
                    "-c",
                    str(conf),
                    "--standalone",
                    "--ignore-formatted",
                ],
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            if fmt.returncode != 0:
                raise StackError(f"kafka StorageTool format failed (exit {fmt.returncode}):\n{fmt.stdout}{fmt.stderr}")
        with self.log_file.open("ab") as log:
            proc = subprocess.Popen(
                [java, *jvm, "-cp", classpath, "kafka.Kafka", str(conf)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self._pid_file.write_text(f"{proc.pid}\n")
        self._proc = proc
        self.wait_ready(ready_timeout_s)

    def wait_ready(self, timeout_s: float = _READY_TIMEOUT_S) -> None:
        """Wait until an AdminClient metadata call succeeds.

        Args:
            timeout_s: Bound on the wait, in seconds.

        Raises:
            StackError: The process died, or it did not answer within ``timeout_s``.
        """
        from confluent_kafka.admin import AdminClient

        from settled._connection import KafkaConnection

        deadline = time.monotonic() + timeout_s
        admin = AdminClient(KafkaConnection(bootstrap_servers=self.bootstrap).client_config(log_level=0))
        last: Exception | None = None
        while time.monotonic() < deadline:
            if not self.is_running():
                raise StackError(f"the Kafka broker exited during start-up; log tail:\n{_tail(self.log_file)}")
            try:
                md = admin.list_topics(timeout=2)
                if md.brokers:
                    return
            except Exception as exc:  # noqa: BLE001 - any client error means "not ready yet"; kept for the report
                last = exc
            time.sleep(0.2)
        raise StackError(
            f"the Kafka broker at {self.bootstrap} was not ready within {timeout_s} s ({last}); "
            f"log tail:\n{_tail(self.log_file)}"
        )

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop the broker gracefully (SIGTERM), escalating to SIGKILL after ``timeout_s`` seconds."""
        self._end(signal.SIGTERM, timeout_s)

    def destroy(self) -> None:
        """Stop the broker and delete its data folder (every topic, group and transaction), log and pid file."""
        self.stop()
        shutil.rmtree(self.home / "data", ignore_errors=True)
        self.log_file.unlink(missing_ok=True)

    def kill(self) -> None:
        """Kill the broker at once (SIGKILL), as a machine crash would leave it."""
        self._end(signal.SIGKILL, 10.0)

    def _end(self, sig: int, timeout_s: float) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            # Our own child: signal it and reap it, so is_running() is false as soon as this returns.
            proc.send_signal(sig)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10.0)
        pid = _read_pid(self._pid_file)
        if pid is not None:
            _stop_pid(pid, self._MARKER, timeout_s, sig=sig)
            self._pid_file.unlink(missing_ok=True)


def _kraft_cluster_id() -> str:
    import base64

    # Like Kafka's own Uuid.randomUuid: never starting with "-", which a command line would read as an option.
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


def _pg_bindir() -> Path:
    initdb = shutil.which("initdb")
    if initdb:
        return Path(initdb).resolve().parent
    candidates = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), reverse=True)
    if candidates:
        return candidates[0].parent
    raise StackError(
        "PostgreSQL server binaries (initdb, pg_ctl) were not found; install them with: "
        "apt-get install -y postgresql  (or set SETTLED_POSTGRES_DSN to an existing server)"
    )


def _ensure_pg_user() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(_PG_USER)
    except KeyError:
        subprocess.run(
            [
                _require("useradd", "apt-get install -y passwd"),
                "--system",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                _PG_USER,
            ],
            check=True,
            capture_output=True,
        )
        return pwd.getpwnam(_PG_USER)


@dataclass
class PostgresServer:
    """A private PostgreSQL server from the machine's binaries.

    When run as root, the data folder lives under ``/var/tmp/settled-postgres/`` (a folder the unprivileged
    ``settled`` user can reach; ``/root`` is not) and the server runs as that user.

    Attributes:
        home: Folder that names this instance; its data folder is derived from it.
        port: Port on 127.0.0.1.
    """

    home: Path
    port: int

    @property
    def data_dir(self) -> Path:
        """The cluster's data folder (``PGDATA``)."""
        if os.geteuid() == 0:
            digest = hashlib.sha256(str(self.home.resolve()).encode()).hexdigest()[:16]
            return Path("/var/tmp/settled-postgres") / digest / "data"
        return self.home / "pgdata"

    @property
    def log_file(self) -> Path:
        """The server's log."""
        return self.data_dir.parent / "postgres.log"

    @property
    def dsn(self) -> str:
        """A libpq connection string for the superuser ``postgres`` over TCP."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, argv: list[str], timeout_s: float = 120.0) -> subprocess.CompletedProcess[str]:
        if os.geteuid() == 0:
            argv = [_require("runuser", "apt-get install -y util-linux"), "-u", _PG_USER, "--", *argv]
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False, cwd="/")

    def is_running(self) -> bool:
        """Return whether the server answers ``pg_ctl status``."""
        if not (self.data_dir / "PG_VERSION").exists():
            return False
        return self._run([str(_pg_bindir() / "pg_ctl"), "status", "-D", str(self.data_dir)]).returncode == 0

    def start(self, ready_timeout_s: float = 60.0) -> None:
        """Create the cluster on first use and start the server; a no-op when it is running.

        Args:
            ready_timeout_s: Bound on ``pg_ctl start -w``, in seconds.

        Raises:
            StackError: The binaries are missing, or ``initdb``/``pg_ctl`` failed (their output is included).
        """
        bindir = _pg_bindir()
        root = self.data_dir.parent
        root.mkdir(parents=True, exist_ok=True)
        self.home.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            user = _ensure_pg_user()
            Path("/var/tmp/settled-postgres").chmod(0o755)
            os.chown(root, user.pw_uid, user.pw_gid)
        if self.is_running():
            return
        if not (self.data_dir / "PG_VERSION").exists():
            res = self._run(
                [
                    str(bindir / "initdb"),
                    "-D",
                    str(self.data_dir),
                    "-U",
                    "postgres",
                    "-A",
                    "trust",
                    "-E",
                    "UTF8",
                    "--no-sync",
                ]
            )
            if res.returncode != 0:
                raise StackError(f"initdb failed (exit {res.returncode}):\n{res.stdout}{res.stderr}")
        opts = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={root} "
            "-c max_connections=300 -c shared_buffers=64MB"
        )
        res = self._run(
            [
                str(bindir / "pg_ctl"),
                "start",
                "-w",
                "-t",
                str(int(ready_timeout_s)),
                "-D",
                str(self.data_dir),
                "-l",
                str(self.log_file),
                "-o",
                opts,
            ],
            timeout_s=ready_timeout_s + 10,
        )
        if res.returncode != 0:
            raise StackError(
                f"pg_ctl start failed (exit {res.returncode}):\n{res.stdout}{res.stderr}\n{_tail(self.log_file)}"
            )

    def stop(self, mode: str = "fast") -> None:
        """Stop the server with ``pg_ctl stop -m <mode>`` (``smart``, ``fast`` or ``immediate``).

        Raises:
            StackError: ``pg_ctl stop`` failed while the server was running.
        """
        if not self.is_running():
            return
        res = self._run([str(_pg_bindir() / "pg_ctl"), "stop", "-w", "-m", mode, "-D", str(self.data_dir)])
        if res.returncode != 0:
            raise StackError(f"pg_ctl stop failed (exit {res.returncode}):\n{res.stdout}{res.stderr}")

    def destroy(self) -> None:
        """Stop the server and delete its data folder."""
        self.stop("immediate")
        shutil.rmtree(self.data_dir.parent, ignore_errors=True)


@dataclass
class DevStack:
    """The local Kafka + PostgreSQL pair behind ``settled dev up|down|status``.

    Attributes:
        state_dir: Root folder: ``kafka/`` and ``postgres/`` live below it.
        jar_cache_dir: Folder of the Maven-resolved jar cache.
        kafka_version: Kafka version of the broker.
        log4j2_version: log4j2 version that goes with it.
        kafka_port: Client port of the broker.
        kafka_controller_port: Controller port of the broker.
        postgres_port: Port of PostgreSQL.
        kafka_heap_mb: Broker heap, in MiB.
    """

    state_dir: Path
    jar_cache_dir: Path
    kafka_version: str
    log4j2_version: str
    kafka_port: int
    kafka_controller_port: int
    postgres_port: int
    kafka_heap_mb: int = 512

    def broker(self) -> KafkaBroker:
        """The stack's broker (not started)."""
        lib = self.jar_cache_dir / f"kafka-{self.kafka_version}" / "lib"
        return KafkaBroker(
            self.state_dir / "kafka", lib, self.kafka_port, self.kafka_controller_port, self.kafka_heap_mb
        )

    def postgres(self) -> PostgresServer:
        """The stack's PostgreSQL server (not started)."""
        return PostgresServer(self.state_dir / "postgres", self.postgres_port)

    def up(self, broker_ready_timeout_s: float | None = None) -> tuple[str, str]:
        """Start whatever is not running; idempotent.

        Args:
            broker_ready_timeout_s: Bound on the broker's readiness, in seconds (unset: `KafkaBroker.start`'s).

        Returns:
            ``(bootstrap servers, postgres DSN)``.

        Raises:
            StackError: A service could not be installed or started.
        """
        resolve_kafka_jars(self.jar_cache_dir, self.kafka_version, self.log4j2_version)
        broker = self.broker()
        broker.start(broker_ready_timeout_s)
        pg = self.postgres()
        pg.start()
        return broker.bootstrap, pg.dsn

    def down(self) -> None:
        """Stop both services; leaves their data for the next ``up``."""
        self.broker().stop()
        self.postgres().stop()

    def wipe(self) -> None:
        """Stop both services and delete their data: the next ``up`` starts an empty broker and database."""
        self.broker().destroy()
        self.postgres().destroy()

    def status(self) -> dict[str, bool]:
        """Return ``{"kafka": running, "postgres": running}``."""
        return {"kafka": self.broker().is_running(), "postgres": self.postgres().is_running()}
