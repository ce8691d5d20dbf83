"""Benchmark: a 3-node flow turn's cost, durable vs the same nodes called in-process (issue 18).

    .venv/bin/python bench/flows.py [--rounds 40] [--smoke] [--bootstrap HOST:PORT] [--keep]

One fresh namespace (one partition per topic), one ``settled worker`` child running ``bench/flows_app.py``.
Measured in the same run, interleaved (the shape of ``bench/workflows.py``):

* **in-process**: the three nodes' bodies called in this process (`run_in_process`), no durability;
* **plain turn** (the baseline of a durable turn): ``Client.submit`` → ``Client.wait`` of an agent that calls the
  same bodies in-process: one admission, one attempt, one settlement;
* **flow turn**: ``Client.submit(conv, flow_input("three-nodes", ...))`` → ``Client.wait``: the same, plus the
  action's ``ctx.step`` result committed before the reply node runs and the reply's model response recorded.

p50/p99 of each, the ratios flow / plain turn and flow / in-process, each figure with its durability class.
``--smoke`` is a short run (5 rounds) for CI (``tests/bench/test_flows.py``). The last line is the figures as
JSON (``json: {...}``). Exit 0 unless the measurement broke (a run not completed, the worker exiting): the ratios
are figures, not gates.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout: python bench/flows.py
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import BenchmarkError, WorkerBench, percentile, table, worker_bench
from flows_app import run_in_process

from settled.client import Client
from settled.protocol import flow_input
from settled.schemas import SettlementOutcome, canonical_json

APP = "bench.flows_app:app"


def in_process(value: Any) -> float:
    """The three nodes' bodies in-process, in seconds."""
    t0 = time.perf_counter()
    run_in_process(value)
    return time.perf_counter() - t0


def plain_turn(client: Client, value: Any, timeout_s: float) -> float:
    """A plain turn calling the same bodies: submit → settlement, in seconds."""
    t0 = time.perf_counter()
    receipt = client.submit(f"plain-{uuid.uuid4().hex[:12]}", value)
    settlement = client.wait(receipt, timeout_s)
    took_s = time.perf_counter() - t0
    if settlement.outcome is not SettlementOutcome.COMPLETED:
        raise BenchmarkError(f"a plain turn settled {settlement.outcome.value}: {settlement.error_reason}")
    return took_s


def flow_turn(client: Client, value: Any, timeout_s: float) -> float:
    """A turn of the 3-node flow: submit → settlement, in seconds; its reply checked."""
    t0 = time.perf_counter()
    receipt = client.submit(f"flow-{uuid.uuid4().hex[:12]}", flow_input("three-nodes", value))
    settlement = client.wait(receipt, timeout_s)
    took_s = time.perf_counter() - t0
    if settlement.outcome is not SettlementOutcome.COMPLETED:
        raise BenchmarkError(f"a flow turn settled {settlement.outcome.value}: {settlement.error_reason}")
    expected = canonical_json({**run_in_process(value), "run_id": receipt.run_id})
    if settlement.reply_json != expected:
        raise BenchmarkError(f"a flow turn replied {settlement.reply_json!r}, not the in-process result")
    return took_s


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=40, help="measured runs of each path (after 3 warm-ups)")
    parser.add_argument("--smoke", action="store_true", help="a short run for CI: 5 rounds")
    parser.add_argument("--bootstrap", default=None, help="Kafka bootstrap (default: SETTLED_KAFKA_BOOTSTRAP)")
    parser.add_argument("--keep", action="store_true", help="keep the namespace's topics afterwards")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its tables; return the exit status."""
    args = _parse(argv)
    if args.smoke:
        args.rounds = 5
    with worker_bench("bench-flows", APP, args.bootstrap, keep=args.keep) as bench:
        client = Client(bench.settings, default_timeout_s=60)
        try:
            _measure(bench, client, args.rounds)
        except BenchmarkError as exc:
            print(f"bench/flows.py: {exc}", file=sys.stderr)
            return 1
        finally:
            client.close()
    return 0


def _measure(bench: WorkerBench, client: Client, rounds: int) -> None:
    """Warm up, measure ``rounds`` of each path interleaved, print the tables and the JSON line."""
    timeout_s = 120.0
    for i in range(3):  # warm-up: the worker holds its partition, every path ran once
        in_process({"order": i, "amount": 1.5})
        plain_turn(client, {"order": i, "amount": 1.5}, timeout_s)
        flow_turn(client, {"order": i, "amount": 1.5}, timeout_s)
    local: list[float] = []
    plain: list[float] = []
    durable: list[float] = []
    for i in range(rounds):
        bench.check()
        value = {"order": i, "amount": 12.5}
        local.append(in_process(value))
        plain.append(plain_turn(client, value, timeout_s))
        durable.append(flow_turn(client, value, timeout_s))
    bench.check()
    committed = bench.print_header("the plain turn and flow turn figures")
    p50 = {name: percentile(v, 50) for name, v in (("local", local), ("plain", plain), ("durable", durable))}
    p99 = {name: percentile(v, 99) for name, v in (("local", local), ("plain", plain), ("durable", durable))}
    print(
        table(
            ["figure", "p50 ms", "p99 ms", "n", "class"],
            [
                ["3 nodes in-process", f"{p50['local'] * 1e3:.3f}", f"{p99['local'] * 1e3:.3f}",
                 str(len(local)), "none (process memory)"],
                ["plain turn calling their bodies: submit -> settlement (baseline)", f"{p50['plain'] * 1e3:.1f}",
                 f"{p99['plain'] * 1e3:.1f}", str(len(plain)), "committed (above)"],
                ["3-node flow turn: submit -> settlement", f"{p50['durable'] * 1e3:.1f}",
                 f"{p99['durable'] * 1e3:.1f}", str(len(durable)),
                 "committed (above), the step and model response"],
            ],
        )
    )  # fmt: skip
    print(
        table(
            ["ratio", "value", "class"],
            [
                ["flow turn p50 / plain turn p50", f"{p50['durable'] / p50['plain']:.2f}",
                 "committed (above), both sides"],
                ["flow turn p50 / in-process p50", f"{p50['durable'] / p50['local']:,.0f}",
                 "committed vs none: the cost of durability"],
                ["flow turn - plain turn (p50 ms)",
                 f"{(p50['durable'] - p50['plain']) * 1e3:.1f}", "committed (above)"],
            ],
        )
    )  # fmt: skip
    print(f"wall time {time.monotonic() - bench.started_s:.0f} s")
    figures: dict[str, Any] = {
        "durability_class": committed,
        "rounds": len(durable),
        "in_process_p50_ms": p50["local"] * 1e3,
        "in_process_p99_ms": p99["local"] * 1e3,
        "plain_p50_ms": p50["plain"] * 1e3,
        "plain_p99_ms": p99["plain"] * 1e3,
        "flow_p50_ms": p50["durable"] * 1e3,
        "flow_p99_ms": p99["durable"] * 1e3,
        "ratio_flow_plain_p50": p50["durable"] / p50["plain"],
        "ratio_flow_in_process_p50": p50["durable"] / p50["local"],
    }
    print("json: " + json.dumps(figures, sort_keys=True))


if __name__ == "__main__":
    sys.exit(main())
