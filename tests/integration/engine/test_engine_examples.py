"""The seed's two workflow examples (issue 17 item 6), run by their README commands against the real stack.

``examples/invoice-workflow/run.py`` and ``examples/support-ticket/run.py`` each start a real ``settled worker``
for their app, run the workflow and check the outside world; here on the test's namespace, with the first worker
killed at a named failpoint: the invoice inside ``save`` (``engine.step_returned``: the body returned, its result not
committed), the support ticket after the ticket was created and the reply's approval request committed
(``workflow.after_approval_request_commit``), where the seed says "the ticket isn't created twice".
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from settled._settings import Settings
from tests.integration.engine.conftest import ROOT

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

#: The short client timeouts of `settled dev up`'s exports, so the second worker takes over in seconds.
_SHORT = {
    "SETTLED_SESSION_TIMEOUT_MS": "3000",
    "SETTLED_HEARTBEAT_INTERVAL_MS": "500",
    "SETTLED_TRANSACTION_TIMEOUT_MS": "2500",
}


def _run(s: Settings, tmp_path: Path, script: str, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SETTLED_FAILPOINT")}
    env.update(
        SETTLED_KAFKA_BOOTSTRAP=s.kafka_bootstrap,
        SETTLED_POSTGRES_DSN=s.postgres_dsn,
        SETTLED_PARTITIONS=str(s.partitions),
    )
    for key, value in _SHORT.items():
        env.setdefault(key, value)
    argv = [sys.executable, str(ROOT / "examples" / script), "--namespace", s.namespace, "--state-dir", str(tmp_path)]
    done = subprocess.run([*argv, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, f"{script} exited {done.returncode}:\n{done.stdout}\n{done.stderr[-3000:]}"
    return done.stdout


def test_the_invoice_example_killed_in_save_resumes_there_with_one_invoice(topics: Settings, tmp_path: Path) -> None:
    out = _run(topics, tmp_path, "invoice-workflow/run.py", "--kill-at", "engine.step_returned=3*kill")
    assert "worker 1 exited with -9; starting another" in out, out
    assert "step bodies ran: ['extract', 'validate', 'save', 'save', 'notify']" in out, out
    assert "invoices saved: 1; e-mails sent: 1" in out and out.rstrip().endswith("OK"), out


def test_the_support_example_killed_before_the_reply_creates_the_ticket_once(topics: Settings, tmp_path: Path) -> None:
    out = _run(topics, tmp_path, "support-ticket/run.py", "--kill-at", "workflow.after_approval_request_commit=1*kill")
    assert "worker 1 exited with -9; starting another" in out, out
    assert "step bodies ran: ['parse-email', 'classify', 'create-ticket', 'reply']" in out, out
    assert "OK: the ticket was created once" in out, out
    assert '"category": "billing"' in out, out  # the scripted model's answer, recorded as the step's result
