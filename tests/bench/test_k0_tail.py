"""bench/k0_tail.py (issue 24, the K=0 turn's tail): a small run against the session's broker.

Every turn gets its worker stamps (the poll, both transactions, the launch, the run, the staging of its end), the
hops come out in the table and in the JSON, and the slowest turns are listed one by one.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench.k0_tail import HOPS

ROOT = Path(__file__).resolve().parents[2]


def test_the_k0_tail_benchmark_stamps_every_hop_of_every_turn(kafka_bootstrap: str, tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    argv = ["--bootstrap", kafka_bootstrap, "--turns", "20", "--warmup", "2", "--slowest-pct", "10", "--json", str(out)]
    done = subprocess.run(
        [sys.executable, "bench/k0_tail.py", *argv], cwd=ROOT, capture_output=True, text=True, timeout=150
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "turns with every worker stamp: 20 of 20" in done.stdout, done.stdout
    assert "the slowest 2 turns" in done.stdout, done.stdout
    figures = json.loads(out.read_text())
    assert figures["turn p50 ms"] > 0 and figures["turn p99 ms"] >= figures["turn p50 ms"], figures
    for hop in HOPS[:-1]:
        assert f"hop median ms: {hop}" in figures, (hop, figures)
    # The stamps line up in time: the run begins after its start committed, the settlement after the run ended.
    assert figures["hop median ms: txn1 commit -> launch"] >= 0, figures
    assert figures["hop median ms: launch -> run begins"] >= 0, figures
    assert figures["hop median ms: run end -> finish (staging begins)"] >= 0, figures
