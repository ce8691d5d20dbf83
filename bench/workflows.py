"""Benchmark: a 5-step workflow's cost, durable vs the same functions called in-process (issue 17).

    .venv/bin/python bench/workflows.py [--rounds 40] [--smoke] [--bootstrap HOST:PORT] [--keep]

One fresh namespace (one partition per topic), one ``settled worker`` child running ``bench/workflows_app.py``.
Measured in the same run, interleaved:

* **in-process**: the five step functions called in order in this process (`run_in_process`), no durability;
* **plain turn** (the baseline of a durable turn): ``Client.submit`` → ``Client.wait`` of an agent that calls the
  same five functions in-process: one admission, one attempt, one settlement;
* **workflow**: ``Client.run_workflow`` → ``Client.wait`` of the workflow ``five-steps``: the same, plus each step's
  result committed to the log before the next step runs (five awaited commits).

p50/p99 of each, the ratios workflow / plain turn and workflow / in-process, each figure with its durability class.
``--smoke`` is a short run (5 rounds) for CI (``tests/bench/test_workflows.py``). The last line is the figures as
JSON (``json: {...}``). Exit 0 unless the measurement broke (a run not completed, the worker exiting): the ratios
are figures, not gates.
"""

from __future__ import annotations

import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout: python bench/workflows.py
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import BenchmarkError, ThreeWay, three_way_main
from workflows_app import run_in_process

from settled.client import Client
from settled.schemas import SettlementOutcome, canonical_json


def workflow_run(client: Client, value: Any, timeout_s: float) -> float:
    """A run of the 5-step workflow: run_workflow → settlement, in seconds; its reply checked."""
    t0 = time.perf_counter()
    receipt = client.run_workflow("five-steps", value, task_id=uuid.uuid4().hex)
    settlement = client.wait(receipt, timeout_s)
    took_s = time.perf_counter() - t0
    if settlement.outcome is not SettlementOutcome.COMPLETED:
        raise BenchmarkError(f"a workflow run settled {settlement.outcome.value}: {settlement.error_reason}")
    if settlement.reply_json != canonical_json(run_in_process(value)):
        raise BenchmarkError(f"a workflow run replied {settlement.reply_json!r}, not the in-process result")
    return took_s


BENCH = ThreeWay(
    script="bench/workflows.py",
    prefix="bench-workflows",
    app="bench.workflows_app:app",
    key="workflow",
    label="workflow",
    in_process_row="5 functions in-process",
    plain_row="plain turn calling them: submit -> settlement (baseline)",
    durable_row="5-step workflow: run_workflow -> settlement",
    durable_class="committed (above), each step's result",
    difference_row="per step, workflow - plain turn (p50 ms)",
    difference_units=5,
    run_in_process=run_in_process,
    durable=workflow_run,
    warm_value=lambda i: {"i": i},
    value=lambda i: {"invoice": i},
)


if __name__ == "__main__":
    sys.exit(three_way_main(BENCH, __doc__))
