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

import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout: python bench/flows.py
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import BenchmarkError, ThreeWay, three_way_main
from flows_app import run_in_process

from settled.client import Client
from settled.protocol import flow_input
from settled.schemas import SettlementOutcome, canonical_json


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


BENCH = ThreeWay(
    script="bench/flows.py",
    prefix="bench-flows",
    app="bench.flows_app:app",
    key="flow",
    label="flow turn",
    in_process_row="3 nodes in-process",
    plain_row="plain turn calling their bodies: submit -> settlement (baseline)",
    durable_row="3-node flow turn: submit -> settlement",
    durable_class="committed (above), the step and model response",
    difference_row="flow turn - plain turn (p50 ms)",
    difference_units=1,
    run_in_process=run_in_process,
    durable=flow_turn,
    warm_value=lambda i: {"order": i, "amount": 1.5},
    value=lambda i: {"order": i, "amount": 12.5},
)


if __name__ == "__main__":
    sys.exit(three_way_main(BENCH, __doc__))
