"""bench/flows.py (issue 18): its smoke run against the real broker prints every figure with its class.

The smoke run (5 rounds) measures the three nodes' bodies in-process, a plain turn calling them (the baseline) and
the durable 3-node flow turn in the same run; the test reads the figures from its last line (``json: {...}``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_flows_benchmark_smoke_prints_the_durable_cost_against_in_process_and_a_plain_turn() -> None:
    done = subprocess.run(
        [sys.executable, "bench/flows.py", "--smoke"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    figures = json.loads(done.stdout.splitlines()[-1].removeprefix("json: "))
    assert figures["rounds"] == 5
    assert "committed Kafka transaction" in figures["durability_class"]
    for name in ("in_process_p50_ms", "plain_p50_ms", "plain_p99_ms", "flow_p50_ms", "flow_p99_ms"):
        assert figures[name] > 0, name
    assert figures["ratio_flow_plain_p50"] == figures["flow_p50_ms"] / figures["plain_p50_ms"]
    assert figures["ratio_flow_in_process_p50"] == figures["flow_p50_ms"] / figures["in_process_p50_ms"]
    text = done.stdout
    assert "3 nodes in-process" in text and "plain turn calling their bodies" in text and "3-node flow turn" in text
    assert "flow turn p50 / in-process p50" in text
