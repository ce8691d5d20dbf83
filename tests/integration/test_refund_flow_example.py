"""examples/refund-flow (issue 18 item 4): its README command runs offline against the real broker and PostgreSQL.

Two turns of one flow run: the first parks at the collect, the second (by the receipt's run id) is approved with the
script's own key and refunds once; the projection shows the run completed at ``confirmed``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.integration]


def test_the_refund_flow_example_runs_two_turns_to_one_refund() -> None:
    done = subprocess.run(
        [sys.executable, "examples/refund-flow/run.py"], cwd=ROOT, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads(done.stdout.splitlines()[-1].removeprefix("summary: "))
    assert summary["run_id"].startswith("fr-")
    assert (summary["turn1_status"], summary["turn2_outcome"]) == ("waiting", "refunded")
    assert summary["refund"]["refunded"] == 30
    assert (summary["final_status"], summary["final_node"]) == ("completed", "confirmed")
    assert "What amount should the refund be for?" in done.stdout
