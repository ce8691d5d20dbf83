"""bench/records_per_txn.py (issue 24 item 3): a small run of both parts against the session's broker.

The cost part's table has a row per record count and spread; the worker part reads the worker's metrics
(``settled_transaction_records``, ``settled_transaction_call_seconds_total``) and writes its figures as JSON.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_records_per_transaction_benchmark_measures_both_parts(kafka_bootstrap: str, tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    argv = ["--bootstrap", kafka_bootstrap, "--transactions", "10", "--sizes", "1,5", "--spreads", "1,5"]
    argv += ["--warmup-s", "1", "--window-s", "3", "--in-flight", "10", "--partitions", "2", "--json", str(out)]
    done = subprocess.run(
        [sys.executable, "bench/records_per_txn.py", *argv], cwd=ROOT, capture_output=True, text=True, timeout=150
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = [line.split("|")[1:3] for line in done.stdout.splitlines() if line.startswith("|")]
    cells = {(int(r.strip()), int(p.strip())) for r, p in rows if r.strip().isdigit()}
    assert cells == {(1, 1), (5, 1), (5, 5)}, done.stdout
    figures = json.loads(out.read_text())
    assert figures["turns/s"] > 0 and figures["transactions/s"] > 0, figures
    assert figures["records/txn mean"] >= 1, figures  # every turn's records committed in some transaction
    assert figures["worker CPU ms/turn"] > 0, figures
    calls = {"begin_transaction", "produce", "flush", "send_offsets_to_transaction", "commit_transaction"}
    assert set(figures["call share"]) == calls, figures
    assert figures["Kafka calls share of window"] > 0, figures
