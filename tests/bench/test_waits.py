"""bench/waits.py (issue 16): its smoke run against the real broker prints every figure with its class and a baseline.

The smoke run (5 rounds, 200 suspended runs) measures the plain-turn baseline and the signal → resumed run →
settlement path in the same run, and the worker child's memory per suspended run; the test reads the figures from
its last line (``json: {...}``) and the tables above it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_waits_benchmark_smoke_prints_latency_ratios_against_its_baseline_and_memory_per_suspended_run() -> None:
    done = subprocess.run(
        [sys.executable, "bench/waits.py", "--smoke"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    figures = json.loads(lines[-1].removeprefix("json: "))
    assert figures["suspended"] == 200
    assert "committed Kafka transaction" in figures["durability_class"]
    for name in ("plain_p50_ms", "plain_p99_ms", "wait_p50_ms", "wait_p99_ms"):
        assert figures[name] > 0, name
    assert figures["ratio_p50"] == figures["wait_p50_ms"] / figures["plain_p50_ms"]
    assert figures["rss_after_bytes"] > 0 and figures["goal_bytes"] == 4096
    assert figures["bytes_per_suspended_run"] == (figures["rss_after_bytes"] - figures["rss_before_bytes"]) / 200
    text = done.stdout
    assert "durability class of the latency figures: committed Kafka transaction" in text
    assert "plain turn: submit -> settlement (baseline)" in text and "wait p50 / plain p50" in text
    assert "per suspended run" in text and "process memory (no durability)" in text
