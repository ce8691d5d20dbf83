"""Benchmark: BFCL conversations through settled vs a plain in-process run of the same ground truth (issue 8).

    .venv/bin/python examples/bfcl/bench/bfcl.py [--conversations N] [--category base|miss_func] [--workers 2]
                                                 [--in-flight 32]
                                                 [--mode random_chunks] [--seed 1] [--bootstrap HOST:PORT] [--keep]

One command, one fresh namespace ``bench-bfcl-<hex>``, the corpus's replayable conversations (all 200 of base by
default). Measured in the same run, in this order, each timed from its first turn's start to its last turn's end:

* **in-process**: the oracle's in-memory execution (`World.execute`, what `run_oracle` does): each turn's
  ground-truth calls run directly on the backend objects, one conversation after another; no Kafka, no tool server,
  no model provider. Worlds are built before the clock starts.
* **tool server, 1 at a time** and **tool server, N in flight**: the same calls through the tool server's client
  (`ToolServerClient.call`, with an idempotency key and an owner epoch, as the BFCL app's tools send them) to a
  separate tool-server process (SQLite, one committed transaction per call), no Kafka: sequentially, then with N
  conversations at once (turns in order within a conversation, as settled runs them). Outputs are compared with the
  in-process ones and the ledger's execution count with the calls sent.
* **settled**: exactly what ``settled demo bfcl`` runs without ``--chaos`` (`run_demo`): the tool server, a projector
  and ``--workers`` worker processes running the BFCL app (replay model provider, BFCL's backends as tools), each
  conversation's turns submitted in order through `settled.client.Client` with N conversations in flight. A turn's
  latency = submission published (just before ``Client.submit``) → its settlement read by the client
  (``Client.wait`` returned); the span = first submission published → last settlement. Tool calls = executions the
  tool server's ledger recorded. The run is judged by the demo's verdict (BFCL's state checker on the final worlds,
  one execution per ground-truth call id, the recorded results equal the oracle's, one settlement per submission, the
  projection matches the log) and the verdict is printed with the numbers.

The ratios are figures, not gates. Exit status 0 unless the measurement itself broke: the settled run failed its
verdict (a fast wrong run is worthless), or the tool server's outputs differ from the in-process ones.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

# Run from a checkout: python examples/bfcl/bench/bfcl.py; the benchmarks' shared helpers are bench/_common.py.
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))

import psycopg
from _common import (
    client_versions,
    delete_namespace,
    describe_broker,
    fresh_namespace,
    load_average,
    percentile,
    resolve_bootstrap,
    table,
    use_dev_timeouts,
)
from confluent_kafka.admin import AdminClient
from rich.console import Console

from settled._settings import Settings
from settled.producers import admin_config, producer_config
from settled.projections import ProjectionNames, default_schema
from settled_bfcl import ReplayMode, load_corpus, replayable_entries
from settled_bfcl._backends import World
from settled_bfcl._client import ToolServerClient, ToolServerProcess
from settled_bfcl._corpus import Entry
from settled_bfcl._demo import DemoOptions, DemoResult, render_demo, run_demo

_EPOCH = 1  # the owner epoch the tool-server sides send (settled's workers send their real claim epochs)


class BenchmarkError(RuntimeError):
    """The measurement broke (not a slow figure): a side's outputs are wrong, or the settled run failed its verdict."""


@dataclass(frozen=True)
class SideResult:
    """One side's timings.

    Attributes:
        name: The row's label.
        turns: Turns run.
        calls: Tool calls executed (for settled: executions in the tool server's ledger).
        span_s: First turn's start to last turn's end, in seconds.
        turn_latencies_s: Per-turn latency, in seconds.
    """

    name: str
    turns: int
    calls: int
    span_s: float
    turn_latencies_s: tuple[float, ...]

    @property
    def turns_per_s(self) -> float:
        """Turns per second of span."""
        return self.turns / self.span_s if self.span_s > 0 else float("nan")

    @property
    def calls_per_s(self) -> float:
        """Tool calls per second of span."""
        return self.calls / self.span_s if self.span_s > 0 else float("nan")


def _side_from_times(name: str, times: Sequence[tuple[float, float]], calls: int) -> SideResult:
    if not times:
        raise BenchmarkError(f"{name}: no turn finished")
    span = max(end for _, end in times) - min(start for start, _ in times)
    return SideResult(name, len(times), calls, span, tuple(end - start for start, end in times))


# --- in-process -----------------------------------------------------------------------------------------------------


def in_process(entries: Sequence[Entry]) -> tuple[SideResult, dict[str, str]]:
    """Run every turn's ground-truth calls directly on the backend objects (the oracle's execution), sequentially.

    Args:
        entries: The conversations.

    Returns:
        The side's timings and each call id's output.
    """
    worlds: dict[str, World] = {entry.id: entry.world() for entry in entries}  # built before the clock starts
    outputs: dict[str, str] = {}
    times: list[tuple[float, float]] = []
    calls = 0
    for entry in entries:
        world = worlds[entry.id]
        for turn in entry.turns:
            t0 = time.perf_counter()
            for call in turn.calls:
                outputs[call.call_id] = world.execute(call.method, call.arguments)
            times.append((t0, time.perf_counter()))
            calls += len(turn.calls)
    return _side_from_times("in-process (oracle)", times, calls), outputs


# --- tool server round trips ----------------------------------------------------------------------------------------


def _toolserver_conversation(
    client: ToolServerClient, prefix: str, entry: Entry, outputs: dict[str, str], times: list[tuple[float, float]]
) -> None:
    conversation_id = f"{prefix}-{entry.id}"
    for turn in entry.turns:
        t0 = time.perf_counter()
        for call in turn.calls:
            response = client.call(
                conversation_id,
                call.method,
                dict(call.arguments),
                idempotency_key=call.call_id,
                owner_epoch=_EPOCH,
                call_id=call.call_id,
            )
            if response.replayed:
                raise BenchmarkError(f"{conversation_id} {call.call_id}: the tool server replayed a first call")
            outputs[call.call_id] = response.output
        times.append((t0, time.perf_counter()))


def through_toolserver(
    server: ToolServerProcess, entries: Sequence[Entry], in_flight: int, expected: dict[str, str]
) -> SideResult:
    """Send the same calls through the tool server's client, ``in_flight`` conversations at once; check the outputs.

    Args:
        server: A running tool server.
        entries: The conversations.
        in_flight: Conversations at once (1: one call after another from one thread).
        expected: The in-process outputs by call id.

    Returns:
        The side's timings.

    Raises:
        BenchmarkError: An output differs from the in-process one, or the ledger's execution count from the calls.
    """
    prefix = f"ts{in_flight}"
    outputs: dict[str, str] = {}
    times: list[tuple[float, float]] = []
    with server.client(timeout_s=60.0) as client:
        for entry in entries:  # worlds built before the clock starts, as the demo does
            client.create_conversation_for_entry(f"{prefix}-{entry.id}", entry)
        if in_flight == 1:
            for entry in entries:
                _toolserver_conversation(client, prefix, entry, outputs, times)
        else:
            lock = threading.Lock()

            def run(entry: Entry) -> None:
                mine: dict[str, str] = {}
                mine_times: list[tuple[float, float]] = []
                _toolserver_conversation(client, prefix, entry, mine, mine_times)
                with lock:
                    outputs.update(mine)
                    times.extend(mine_times)

            with ThreadPoolExecutor(max_workers=in_flight, thread_name_prefix="bench-toolserver") as pool:
                list(pool.map(run, entries))
        executions = sum(client.conversation(f"{prefix}-{entry.id}").executions for entry in entries)
    wrong = sorted(cid for cid, out in expected.items() if outputs.get(cid) != out)
    if wrong or len(outputs) != len(expected):
        raise BenchmarkError(
            f"tool server, {in_flight} in flight: {len(wrong)} outputs differ from the in-process run "
            f"(first: {wrong[:3]}), {len(outputs)} of {len(expected)} calls answered"
        )
    if executions != len(expected):
        raise BenchmarkError(
            f"tool server, {in_flight} in flight: ledger has {executions} executions, sent {len(expected)}"
        )
    label = "tool server, 1 at a time" if in_flight == 1 else f"tool server, {in_flight} in flight"
    return _side_from_times(label, times, executions)


# --- settled --------------------------------------------------------------------------------------------------------


def settled_side(result: DemoResult, in_flight: int) -> SideResult:
    """The settled run's timings, from the demo's per-turn (published, settled) times and the ledger's executions.

    Args:
        result: The demo's result.
        in_flight: Conversations in flight (for the label).

    Returns:
        The side's timings.
    """
    executions = sum(v.executions for v in result.summary.verdicts)
    return _side_from_times(f"settled, {in_flight} in flight", result.turn_times, executions)


# --- clean-up -------------------------------------------------------------------------------------------------------


def _drop_namespace(settings: Settings) -> str:
    """Delete the namespace's topics, its consumer groups and its projection schemas; say what went."""
    admin = AdminClient(admin_config(settings))
    listing = admin.list_consumer_groups(request_timeout=30).result()
    groups = [g.group_id for g in listing.valid if g.group_id.startswith(f"{settings.namespace}.")]
    topics = delete_namespace(settings, groups)
    live = ProjectionNames(default_schema(settings.namespace)).live
    with psycopg.connect(settings.postgres_dsn, autocommit=True) as conn:
        for name in (live, f"{live}__next", f"{live}__retired"):
            conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
    return f"deleted {len(topics)} topics, {len(groups)} consumer groups, projection schema {live}"


# --- main -----------------------------------------------------------------------------------------------------------


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--conversations", type=int, default=None, help="the first N replayable conversations (all)")
    ap.add_argument("--category", choices=("base", "miss_func"), default="base")
    ap.add_argument("--workers", type=int, default=2, help="settled worker processes (the demo's default)")
    ap.add_argument("--in-flight", type=int, default=32, help="conversations at once (the demo's default)")
    ap.add_argument(
        "--mode",
        choices=[m.value for m in ReplayMode],
        default=ReplayMode.RANDOM_CHUNKS.value,
        help="how the replay model groups a turn's calls into responses (the demo's default)",
    )
    ap.add_argument("--seed", type=int, default=1, help="seed of the replay model's chunking")
    ap.add_argument("--bootstrap", default=None, help="Kafka (default: SETTLED_KAFKA_BOOTSTRAP, else the dev stack)")
    ap.add_argument("--keep", action="store_true", help="keep the namespace's topics, schemas and the work folder")
    args = ap.parse_args(argv)
    if args.conversations is not None and args.conversations < 1:
        ap.error(f"--conversations must be >= 1, got {args.conversations}")
    if args.in_flight < 1:
        ap.error(f"--in-flight must be >= 1, got {args.in_flight}")
    if args.workers < 1:
        ap.error(f"--workers must be >= 1, got {args.workers}")
    return args


def _settings(bootstrap_arg: str | None) -> tuple[Settings, str]:
    """Kafka and PostgreSQL to use: ``--bootstrap`` / the environment, else the dev stack (started if needed)."""
    bootstrap, where = resolve_bootstrap(bootstrap_arg)
    base = Settings()
    dsn = base.postgres_dsn
    if not dsn:
        from settled.services._cli_dev import stack_from_settings

        stack = stack_from_settings(base)
        pg = stack.postgres()
        pg.start()  # a no-op when it is running
        dsn = pg.dsn
    ns = fresh_namespace("bench-bfcl")
    return base.model_copy(update={"namespace": ns, "kafka_bootstrap": bootstrap, "postgres_dsn": dsn}), where


def _rows(sides: Sequence[SideResult], settled: SideResult) -> list[list[str]]:
    rows = []
    for side in sides:
        lat = side.turn_latencies_s
        rows.append(
            [
                side.name,
                f"{side.turns:,}",
                f"{side.calls:,}",
                f"{side.span_s:.2f}",
                f"{side.turns_per_s:,.1f}",
                f"{side.calls_per_s:,.1f}",
                f"{percentile(lat, 50) * 1e3:.3f}",
                f"{percentile(lat, 99) * 1e3:.3f}",
                f"{settled.turns_per_s / side.turns_per_s:.3g}",
                f"{(percentile(settled.turn_latencies_s, 50) - percentile(lat, 50)) * 1e3:,.1f}",
            ]
        )
    return rows


def _timed(what: str, fn: Callable[[], SideResult]) -> SideResult:
    print(f"running {what} ...", file=sys.stderr, flush=True)
    return fn()


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its table; return the exit status."""
    args = _parse(argv)
    use_dev_timeouts()  # printed with the results; spawned children inherit them
    wall_start = time.monotonic()
    load_before = load_average()
    settings, where = _settings(args.bootstrap)
    work_dir = settings.state_dir / "bench-bfcl" / settings.namespace
    work_dir.mkdir(parents=True, exist_ok=True)
    entries = replayable_entries(load_corpus(args.category))
    if args.conversations is not None:
        entries = entries[: args.conversations]
    broke: list[str] = []
    try:
        print("running in-process (oracle) ...", file=sys.stderr, flush=True)
        inproc, outputs = in_process(entries)
        server = ToolServerProcess(work_dir / "toolserver-only" / "toolserver.sqlite")
        server.start()
        try:
            sequential = _timed("tool server, 1 at a time", lambda: through_toolserver(server, entries, 1, outputs))
            parallel = (
                _timed(
                    f"tool server, {args.in_flight} in flight",
                    lambda: through_toolserver(server, entries, args.in_flight, outputs),
                )
                if args.in_flight > 1
                else None  # the same as one at a time
            )
        finally:
            server.stop()
        options = DemoOptions(
            category=args.category,
            conversations=args.conversations,
            chaos=False,
            seed=args.seed,
            workers=args.workers,
            mode=ReplayMode(args.mode),
            in_flight=args.in_flight,
            work_dir=work_dir / "demo",
            warm_start=True,
        )
        print(f"running settled, {args.in_flight} in flight ...", file=sys.stderr, flush=True)
        console = Console(stderr=True)
        result = run_demo(options, settings, namespace=settings.namespace, console=console)
        render_demo(result, console)
        if not result.passed:
            broke.append("the settled run failed its verdict (above): its figures measure a wrong run")
        settled = settled_side(result, args.in_flight)
        info = describe_broker(settings.kafka_bootstrap, settings.topic("log"))
    except BenchmarkError as exc:
        print(f"measurement broke: {exc}; the tool servers' files and logs are kept in {work_dir}", file=sys.stderr)
        return 1
    finally:
        if not args.keep:
            print(_drop_namespace(settings), file=sys.stderr)
    sides = [inproc, sequential, *([parallel] if parallel is not None else []), settled]
    summary = result.summary
    verdicts = summary.verdicts
    turns = sum(len(entry.turns) for entry in entries)
    print(
        f"\nBFCL {args.category}: {len(entries)} conversations, {turns} turns, {len(outputs)} ground-truth tool calls; "
        f"namespace {settings.namespace}. Span = first turn started (settled: submission published) -> last turn "
        "done (settled: settlement read by the client); latency per turn.\n"
    )
    headers = [
        "side",
        "turns",
        "tool calls",
        "span s",
        "turns/s",
        "calls/s",
        "turn p50 ms",
        "turn p99 ms",
        "settled turns/s / this",
        "settled p50 - this p50 ms",
    ]
    print(table(headers, _rows(sides, settled)))
    print(
        f"\nsettled verdict: {'PASS' if result.passed else 'FAIL'}: {summary.passed}/{len(verdicts)} conversations "
        f"passed; {sum(v.settlements for v in verdicts)}/{sum(v.submissions for v in verdicts)} submissions settled; "
        f"{sum(v.executions for v in verdicts)} executions in the ledger (expected "
        f"{sum(v.tool_calls for v in verdicts)}), {sum(v.duplicate_executions for v in verdicts)} duplicate, "
        f"{sum(v.unexpected_executions for v in verdicts)} unexpected; lost {result.lost_submissions}, dead letters "
        f"{result.dead_letters}, projection {'matches' if not result.projection_mismatches else 'DIFFERS'}; "
        f"unexpected worker exits {result.unexpected_exits}; demo wall time {summary.elapsed_s:.0f} s"
    )
    print(
        f"tool-server sides: outputs equal the in-process run's ({len(outputs)}/{len(outputs)}); ledger executions = "
        "calls sent; every first call executed, none replayed"
    )
    print(
        f"settled: {args.workers} worker processes, {settings.partitions} partitions, {args.in_flight} conversations "
        f"in flight, replay mode {args.mode} (seed {args.seed}), no chaos, warm start (the first submission goes "
        "once the workers own every partition); tool server: SQLite WAL, synchronous=FULL, "
        "one transaction per call, answered after its commit"
    )
    print(f"durability class: {info.durability_class()}")
    print(f"client: {client_versions()}; broker: {info.version} ({settings.kafka_bootstrap}, {where})")
    print(f"Kafka timeouts: {Settings().timeouts_label()}")
    conf = producer_config(settings, transactional_id="x")
    keys = ("linger.ms", "retry.backoff.ms", "retry.backoff.max.ms", "acks", "enable.idempotence", "partitioner")
    print("client settings (settled.producers.producer_config): " + ", ".join(f"{k}={conf[k]}" for k in keys))
    print(
        f"machine: {load_before} before, {load_average()} after; wall time {time.monotonic() - wall_start:.0f} s; "
        f"python {sys.version.split()[0]}"
    )
    if broke:
        for line in broke:
            print(f"measurement broke: {line}", file=sys.stderr)
        print(f"logs and the tool servers' files are kept in {work_dir}", file=sys.stderr)
        return 1
    if args.keep:
        print(f"kept: namespace {settings.namespace}, work folder {work_dir}")
    else:
        shutil.rmtree(work_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
