"""Helpers shared by settled's benchmarks (``bench/``): broker discovery, versions, durability class, tables.

Every benchmark prints the durability class it ran in, the Kafka timeouts it ran with (`use_dev_timeouts`) and the
client and broker versions next to its numbers (docs/design.md §3), and measures its bare-Kafka baseline in the same run
with the same client settings.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import confluent_kafka
from confluent_kafka.admin import AdminClient, ConfigResource  # type: ignore[attr-defined]

from settled._settings import DEV_TIMEOUTS, Settings
from settled.producers import admin_config, provision_topics
from settled.schemas import Codec

if TYPE_CHECKING:
    from settled.client import Client
    from settled.testing import WorkerProcess

__all__ = [
    "BenchmarkError",
    "BrokerInfo",
    "ThreeWay",
    "WorkerBench",
    "client_versions",
    "delete_namespace",
    "describe_broker",
    "fresh_namespace",
    "jit_cpu_s",
    "load_average",
    "percentile",
    "resolve_bootstrap",
    "table",
    "three_way_main",
    "use_dev_timeouts",
    "worker_bench",
]

# librdkafka / Kafka default for log.flush.interval.messages: never fsync on a message count (page cache only).
_NO_FLUSH = str(2**63 - 1)


def use_dev_timeouts() -> str:
    """Run this benchmark, and every process it spawns, with the dev stack's short Kafka timeouts.

    Sets ``SETTLED_SESSION_TIMEOUT_MS``, ``SETTLED_HEARTBEAT_INTERVAL_MS`` and ``SETTLED_TRANSACTION_TIMEOUT_MS`` to
    `settled._settings.DEV_TIMEOUTS` in this process's environment where they are not set already (a value from the
    shell wins), so every `Settings` built here and every child inheriting the environment takes them.

    Returns:
        The set the benchmark runs with, to print with its results (`Settings.timeouts_label`).
    """
    for name, value in DEV_TIMEOUTS.items():
        os.environ.setdefault(f"SETTLED_{name.upper()}", str(value))
    return Settings().timeouts_label()


def resolve_bootstrap(cli_value: str | None) -> tuple[str, str]:
    """Find the broker to benchmark against.

    Order: ``--bootstrap``; ``SETTLED_KAFKA_BOOTSTRAP`` (through `Settings`); the dev stack's broker (started with
    ``settled dev up``'s code when it is not running, docs/design.md §8).

    Args:
        cli_value: The ``--bootstrap`` argument, or ``None``.

    Returns:
        ``(bootstrap servers, where they came from)``.
    """
    if cli_value:
        return cli_value, "--bootstrap"
    settings = Settings()
    if settings.kafka_bootstrap:
        return settings.kafka_bootstrap, "SETTLED_KAFKA_BOOTSTRAP"
    from settled.services._cli_dev import stack_from_settings

    stack = stack_from_settings(settings)
    broker = stack.broker()
    if broker.is_running():
        return broker.bootstrap, "dev stack (already running)"
    bootstrap, _dsn = stack.up()
    return bootstrap, "dev stack (started by this benchmark)"


def fresh_namespace(prefix: str) -> str:
    """Return a namespace no other run uses: ``<prefix>-<12 hex digits>``.

    Args:
        prefix: Short lower-case prefix naming the benchmark.

    Returns:
        The namespace.
    """
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def delete_namespace(settings: Settings, groups: Iterable[str] = (), timeout_s: float = 30.0) -> list[str]:
    """Delete every topic under ``settings.namespace`` and the given consumer groups.

    Args:
        settings: Bootstrap servers and the namespace to remove.
        groups: Consumer groups to delete (their members must have left).
        timeout_s: Bound on each admin call, in seconds.

    Returns:
        The deleted topic names.

    Raises:
        confluent_kafka.KafkaException: A deletion failed.
    """
    admin = AdminClient(admin_config(settings))
    prefix = f"{settings.namespace}."
    topics = sorted(t for t in admin.list_topics(timeout=timeout_s).topics if t.startswith(prefix))
    if topics:
        for fut in admin.delete_topics(topics, operation_timeout=timeout_s, request_timeout=timeout_s).values():
            fut.result()
    group_list = list(groups)
    if group_list:
        for fut in admin.delete_consumer_groups(group_list, request_timeout=timeout_s).values():
            fut.result()
    return topics


def client_versions() -> str:
    """Return the confluent-kafka and librdkafka versions, e.g. ``confluent-kafka 2.16.1 / librdkafka 2.16.0``."""
    client = confluent_kafka.version()
    library = confluent_kafka.libversion()
    client_text = client if isinstance(client, str) else client[0]  # a str in 2.16, a (str, int) tuple before
    library_text = library if isinstance(library, str) else library[0]
    return f"confluent-kafka {client_text} / librdkafka {library_text}"


@dataclass(frozen=True)
class BrokerInfo:
    """What the benchmark knows about the broker it ran against.

    Attributes:
        version: The Apache Kafka release, or a sentence saying why it is unknown.
        brokers: Number of brokers in the cluster.
        replication_factor: Replicas of the benchmarked topic's partition 0.
        min_insync_replicas: The topic's ``min.insync.replicas``.
        flush_interval_messages: The broker's ``log.flush.interval.messages`` (fsync every N messages).
        flush_interval_ms: The broker's ``log.flush.interval.ms``, or ``"null"`` when unset.
    """

    version: str
    brokers: int
    replication_factor: int
    min_insync_replicas: str
    flush_interval_messages: str
    flush_interval_ms: str

    def durability_class(self) -> str:
        """Describe what a committed transaction survives here (docs/design.md §3: every benchmark prints it).

        Returns:
            One sentence.
        """
        fsync = self.flush_interval_messages != _NO_FLUSH or self.flush_interval_ms not in ("null", "None", "")
        where = (
            f"fsync policy log.flush.interval.messages={self.flush_interval_messages}, "
            f"log.flush.interval.ms={self.flush_interval_ms}"
        )
        if self.replication_factor <= 1 and not fsync:
            return (
                f"single broker, replication factor {self.replication_factor}, no fsync per append (broker defaults): "
                "a commit lives in the page cache; it survives kill -9 of any process, not the loss of the machine"
            )
        if self.replication_factor >= 3 and self.min_insync_replicas not in ("", "1"):
            return (
                f"replicated: {self.brokers} brokers, replication factor {self.replication_factor}, "
                f"min.insync.replicas={self.min_insync_replicas}, acks=all ({where})"
            )
        return (
            f"{self.brokers} broker(s), replication factor {self.replication_factor}, "
            f"min.insync.replicas={self.min_insync_replicas} ({where})"
        )


def describe_broker(bootstrap: str, topic: str, timeout_s: float = 30.0) -> BrokerInfo:
    """Describe the broker and one topic's replication, for the durability class and the version line.

    The Kafka protocol does not report a broker's release version, so it is read from the local broker process's
    classpath (the dev stack's ``kafka-<version>/lib`` or a ``kafka_2.13-<version>.jar``) when one listens on the
    bootstrap port; otherwise the version is reported as unknown.

    Args:
        bootstrap: Bootstrap servers.
        topic: A topic of the benchmark (its partition 0's replicas and ``min.insync.replicas`` are read).
        timeout_s: Bound on each admin call, in seconds.

    Returns:
        The description.
    """
    admin = AdminClient(admin_config(Settings(kafka_bootstrap=bootstrap)))
    metadata = admin.list_topics(timeout=timeout_s)
    broker_id = min(metadata.brokers)
    broker_res = ConfigResource(ConfigResource.Type.BROKER, str(broker_id))
    topic_res = ConfigResource(ConfigResource.Type.TOPIC, topic)
    futures = admin.describe_configs([broker_res, topic_res], request_timeout=timeout_s)
    broker_conf = futures[broker_res].result(timeout=timeout_s)
    topic_conf = futures[topic_res].result(timeout=timeout_s)
    replicas = len(metadata.topics[topic].partitions[0].replicas)

    def value(conf: dict[str, Any], key: str) -> str:
        entry = conf.get(key)
        return "" if entry is None else str(entry.value)

    return BrokerInfo(
        version=_local_broker_version(bootstrap),
        brokers=len(metadata.brokers),
        replication_factor=replicas,
        min_insync_replicas=value(topic_conf, "min.insync.replicas"),
        flush_interval_messages=value(broker_conf, "log.flush.interval.messages"),
        flush_interval_ms=value(broker_conf, "log.flush.interval.ms") or "null",
    )


def _local_broker_version(bootstrap: str) -> str:
    ports = {hp.rsplit(":", 1)[-1] for hp in bootstrap.split(",")}
    proc = Path("/proc")
    if not proc.is_dir():
        return "unknown (no /proc to find a local broker process)"
    for pid_dir in proc.iterdir():
        if not pid_dir.name.isdigit():
            continue
        try:
            argv = (pid_dir / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        args = [a.decode(errors="replace") for a in argv if a]
        if "kafka.Kafka" not in args:
            continue
        listens = False
        for arg in args:
            if arg.endswith(".properties") and Path(arg).is_file():
                text = Path(arg).read_text(errors="replace")
                listens = any(re.search(rf"^listeners=.*:{re.escape(p)}\b", text, re.M) for p in ports)
        joined = " ".join(args)
        match = re.search(r"kafka-(\d+\.\d+\.\d+)/lib", joined) or re.search(
            r"kafka_2\.1\d-(\d+\.\d+\.\d+)\.jar", joined
        )
        if listens and match:
            return f"Apache Kafka {match.group(1)} (local process {pid_dir.name})"
    return "unknown (the broker is not a local process; the Kafka protocol does not report its release)"


def percentile(values: Sequence[float], q: float) -> float:
    """Return the nearest-rank percentile of ``values``.

    Args:
        values: Samples (any order, at least one).
        q: Percentile in [0, 100].

    Returns:
        The smallest sample with at least ``q`` % of the samples at or below it.

    Raises:
        ValueError: If ``values`` is empty or ``q`` is outside [0, 100].
    """
    if not values:
        raise ValueError("percentile: values is empty")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile: q={q} is outside [0, 100]")
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def jit_cpu_s(pid: int | None) -> float:
    """CPU seconds the JIT compiler threads (``C1``/``C2 CompilerThread<n>``) of a JVM used so far; 0 without a pid.

    A fresh broker compiles its hot paths during the first minute or two of load (measured on this machine: 300-400
    ms of CPU per second at first, about 15 ms per second after 90 s): a one-time cost of the broker process, not of
    the turns it serves, so the broker's CPU per turn is also given without it.
    """
    if not pid:
        return 0.0
    total_ticks = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            if "CompilerThre" not in (task / "comm").read_text():
                continue
            stat = (task / "stat").read_text()
        except OSError:  # the thread ended meanwhile
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        total_ticks += int(fields[11]) + int(fields[12])
    return total_ticks / os.sysconf("SC_CLK_TCK")


def load_average() -> str:
    """Return the 1-minute load average and the core count, e.g. ``load 0.92 on 2 cores``."""
    try:
        one = os.getloadavg()[0]
    except OSError:
        return f"load unknown on {os.cpu_count()} cores"
    return f"load {one:.2f} on {os.cpu_count()} cores"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Format a plain-text table (Markdown pipe syntax, so it pastes into a README).

    Args:
        headers: Column titles.
        rows: Cells, already formatted.

    Returns:
        The table, one line per row.
    """
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    lines = ["| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)) + " |"]
    lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in rows:
        lines.append("| " + " | ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) + " |")
    return "\n".join(lines)


class BenchmarkError(RuntimeError):
    """The measurement broke (not a slow figure)."""


@dataclass
class WorkerBench:
    """A benchmark's fresh namespace and the ``settled worker`` child serving it (`worker_bench`).

    Attributes:
        settings: The namespace (one partition per topic), with the broker's bootstrap servers.
        bootstrap: The bootstrap servers.
        where: Where they came from (`resolve_bootstrap`).
        worker: The worker child.
        started_s: ``time.monotonic()`` when the topics were provisioned, for the wall time.
    """

    settings: Settings
    bootstrap: str
    where: str
    worker: WorkerProcess
    started_s: float

    def check(self) -> None:
        """Raise `BenchmarkError` with the end of the worker's log if the worker exited.

        Raises:
            BenchmarkError: The worker is not running.
        """
        code = self.worker.poll()
        if code is not None:
            tail = self.worker.log_path.read_text(encoding="utf-8", errors="replace")[-3000:]
            raise BenchmarkError(f"the worker exited with {code}; its log ends:\n{tail}")

    def print_header(self, figures: str) -> str:
        """Print the broker, the client and broker versions, the Kafka timeouts, the load and the durability class.

        Args:
            figures: What the durability class applies to, e.g. ``"the latency figures"``.

        Returns:
            The durability class: ``committed Kafka transaction: ...``.
        """
        info = describe_broker(self.bootstrap, self.settings.topic("log"))
        committed = f"committed Kafka transaction: {info.durability_class()}"
        print(f"broker {self.bootstrap} ({self.where}); {client_versions()}; Kafka {info.version}")
        print(f"Kafka timeouts: {Settings().timeouts_label()}; load {load_average()}")
        print(f"durability class of {figures}: {committed}")
        return committed


@contextmanager
def worker_bench(prefix: str, app: str, bootstrap: str | None, *, keep: bool) -> Iterator[WorkerBench]:
    """Run a benchmark against one ``settled worker`` child in a fresh namespace with one partition per topic.

    Sets the dev stack's Kafka timeouts (`use_dev_timeouts`; the worker inherits them), provisions the namespace's
    topics, starts the worker (its log in a new temporary folder) and, on exit, stops it and deletes the namespace's
    topics and the workers' consumer group unless ``keep``. Close the clients the benchmark made before the exit.

    Args:
        prefix: The namespace's prefix (`fresh_namespace`) and the log folder's.
        app: The worker's app, ``module:attribute`` importable from the repository's root.
        bootstrap: The ``--bootstrap`` argument, or None (`resolve_bootstrap`).
        keep: Keep the namespace's topics afterwards.

    Yields:
        The namespace and the worker.
    """
    from settled.testing import WorkerProcess

    root = Path(__file__).resolve().parent.parent
    use_dev_timeouts()  # printed with the results; the worker child inherits them
    servers, where = resolve_bootstrap(bootstrap)
    settings = Settings(namespace=fresh_namespace(prefix), kafka_bootstrap=servers, partitions=1)
    provision_topics(settings, Codec(), datetime.now(UTC))
    started_s = time.monotonic()
    log_dir = Path(tempfile.mkdtemp(prefix=f"{prefix}-"))
    worker = WorkerProcess.start(
        settings, app=app, log_path=log_dir / "worker.log", worker_id="bench", log_level="WARNING", cwd=root,
        env={"PYTHONPATH": str(root), **settings.timeouts_env()}, append_log=False,
    )  # fmt: skip
    try:
        yield WorkerBench(settings, servers, where, worker, started_s)
    finally:
        worker.stop()
        if not keep:
            delete_namespace(settings, [f"{settings.namespace}.{settings.app_id}.workers"])


@dataclass(frozen=True)
class ThreeWay:
    """A durable path measured beside a plain turn and the same code in-process (`three_way_main`).

    ``bench/workflows.py`` and ``bench/flows.py`` are two of these: each names its rows and its JSON keys here and
    gives the three paths; the loop, the tables and the JSON line are `three_way_main`'s.

    Attributes:
        script: The benchmark's path, for its error line, e.g. ``"bench/workflows.py"``.
        prefix: The namespace's prefix (`worker_bench`).
        app: The worker's app, ``module:attribute``.
        key: The durable path's JSON key stem and ratio name, e.g. ``"workflow"``.
        label: The durable path's name in the ratio rows, e.g. ``"workflow"``, ``"flow turn"``.
        in_process_row: The in-process row's name.
        plain_row: The plain turn's row name.
        durable_row: The durable path's row name.
        durable_class: The durable path's durability class.
        difference_row: The row of the durable minus the plain p50, in ms.
        difference_units: What the difference is divided by (the steps per run; 1 for the whole turn).
        run_in_process: The code called in-process with a value (no durability).
        durable: One durable run of a value: ``(client, value, timeout_s) -> seconds``; it checks the reply.
        warm_value: The warm-up value of round ``i``.
        value: The measured value of round ``i``.
    """

    script: str
    prefix: str
    app: str
    key: str
    label: str
    in_process_row: str
    plain_row: str
    durable_row: str
    durable_class: str
    difference_row: str
    difference_units: int
    run_in_process: Callable[[Any], Any]
    durable: Callable[[Client, Any, float], float]
    warm_value: Callable[[int], Any]
    value: Callable[[int], Any]


def plain_turn(client: Client, value: Any, timeout_s: float) -> float:
    """A plain turn with ``value`` as its input: submit → settlement, in seconds.

    Raises:
        BenchmarkError: It did not complete.
    """
    from settled.schemas import SettlementOutcome

    t0 = time.perf_counter()
    receipt = client.submit(f"plain-{uuid.uuid4().hex[:12]}", value)
    settlement = client.wait(receipt, timeout_s)
    took_s = time.perf_counter() - t0
    if settlement.outcome is not SettlementOutcome.COMPLETED:
        raise BenchmarkError(f"a plain turn settled {settlement.outcome.value}: {settlement.error_reason}")
    return took_s


def three_way_main(spec: ThreeWay, doc: str | None, argv: list[str] | None = None) -> int:
    """Run a three-way benchmark (`ThreeWay`) from its command line; return the exit status.

    One fresh namespace and worker (`worker_bench`); 3 warm-up rounds, then ``--rounds`` rounds (5 with ``--smoke``)
    of the three paths interleaved; the figures table, the ratios table and the JSON line (``json: {...}``).

    Args:
        spec: The benchmark.
        doc: Its module docstring (the first paragraph is the ``--help`` description).
        argv: The arguments (default: ``sys.argv[1:]``).

    Returns:
        0, or 1 when the measurement broke (a run not completed, the worker exiting).
    """
    from settled.client import Client

    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0] if doc else None)
    parser.add_argument("--rounds", type=int, default=40, help="measured runs of each path (after 3 warm-ups)")
    parser.add_argument("--smoke", action="store_true", help="a short run for CI: 5 rounds")
    parser.add_argument("--bootstrap", default=None, help="Kafka bootstrap (default: SETTLED_KAFKA_BOOTSTRAP)")
    parser.add_argument("--keep", action="store_true", help="keep the namespace's topics afterwards")
    args = parser.parse_args(argv)
    rounds = 5 if args.smoke else args.rounds
    with worker_bench(spec.prefix, spec.app, args.bootstrap, keep=args.keep) as bench:
        client = Client(bench.settings, default_timeout_s=60)
        try:
            _three_way(spec, bench, client, rounds)
        except BenchmarkError as exc:
            print(f"{spec.script}: {exc}", file=sys.stderr)
            return 1
        finally:
            client.close()
    return 0


def _three_way(spec: ThreeWay, bench: WorkerBench, client: Client, rounds: int) -> None:
    """Warm up, measure ``rounds`` of each path interleaved, print the tables and the JSON line."""
    timeout_s = 120.0

    def in_process(value: Any) -> float:
        t0 = time.perf_counter()
        spec.run_in_process(value)
        return time.perf_counter() - t0

    for i in range(3):  # warm-up: the worker holds its partition, every path ran once
        in_process(spec.warm_value(i))
        plain_turn(client, spec.warm_value(i), timeout_s)
        spec.durable(client, spec.warm_value(i), timeout_s)
    runs: dict[str, list[float]] = {"local": [], "plain": [], "durable": []}
    for i in range(rounds):
        bench.check()
        value = spec.value(i)
        runs["local"].append(in_process(value))
        runs["plain"].append(plain_turn(client, value, timeout_s))
        runs["durable"].append(spec.durable(client, value, timeout_s))
    bench.check()
    committed = bench.print_header(f"the plain turn and {spec.label} figures")
    p50 = {name: percentile(v, 50) for name, v in runs.items()}
    p99 = {name: percentile(v, 99) for name, v in runs.items()}
    n = {name: str(len(v)) for name, v in runs.items()}
    print(
        table(
            ["figure", "p50 ms", "p99 ms", "n", "class"],
            [
                [spec.in_process_row, f"{p50['local'] * 1e3:.3f}", f"{p99['local'] * 1e3:.3f}", n["local"],
                 "none (process memory)"],
                [spec.plain_row, f"{p50['plain'] * 1e3:.1f}", f"{p99['plain'] * 1e3:.1f}", n["plain"],
                 "committed (above)"],
                [spec.durable_row, f"{p50['durable'] * 1e3:.1f}", f"{p99['durable'] * 1e3:.1f}", n["durable"],
                 spec.durable_class],
            ],
        )
    )  # fmt: skip
    print(
        table(
            ["ratio", "value", "class"],
            [
                [f"{spec.label} p50 / plain turn p50", f"{p50['durable'] / p50['plain']:.2f}",
                 "committed (above), both sides"],
                [f"{spec.label} p50 / in-process p50", f"{p50['durable'] / p50['local']:,.0f}",
                 "committed vs none: the cost of durability"],
                [spec.difference_row,
                 f"{(p50['durable'] - p50['plain']) * 1e3 / spec.difference_units:.1f}", "committed (above)"],
            ],
        )
    )  # fmt: skip
    print(f"wall time {time.monotonic() - bench.started_s:.0f} s")
    figures: dict[str, Any] = {
        "durability_class": committed,
        "rounds": len(runs["durable"]),
        "in_process_p50_ms": p50["local"] * 1e3,
        "in_process_p99_ms": p99["local"] * 1e3,
        "plain_p50_ms": p50["plain"] * 1e3,
        "plain_p99_ms": p99["plain"] * 1e3,
        f"{spec.key}_p50_ms": p50["durable"] * 1e3,
        f"{spec.key}_p99_ms": p99["durable"] * 1e3,
        f"ratio_{spec.key}_plain_p50": p50["durable"] / p50["plain"],
        f"ratio_{spec.key}_in_process_p50": p50["durable"] / p50["local"],
    }
    print("json: " + json.dumps(figures, sort_keys=True))
