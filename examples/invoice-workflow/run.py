"""Run the invoice workflow through a real worker on the local stack; optionally kill the worker at a failpoint.

    eval "$(settled dev up)"
    python examples/invoice-workflow/run.py                                   # runs it, prints the result
    python examples/invoice-workflow/run.py --kill-at engine.step_returned=3*kill

With ``--kill-at`` the first worker dies at that failpoint (here: the third step body, ``save``, returned and its
result is not committed yet); a second worker resumes the run at that step with ``previous`` and the checkpoint
rebuilt from the log; no step before it runs again. Exit 0 when the run completed, every step before the one
interrupted ran once and the database holds one invoice and one e-mail; 1 otherwise; 2 when no broker is configured.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

from invoice_app import DB_ENV, invoice, world

from settled._settings import Settings
from settled.client import Client, SettlementTimeoutError
from settled.producers import provision_topics
from settled.schemas import Codec, SettlementOutcome
from settled.testing import WorkerProcess

HERE = Path(__file__).resolve().parent
APP = "invoice_app:app"
DOCUMENT = {
    "vendor": "acme",
    "recipient": "vendor@acme.com",
    "lines": [{"item": "widgets", "cents": 7500}, {"item": "shipping", "cents": 2500}],
}


def main(argv: list[str] | None = None) -> int:
    """Run the example (module docstring).

    Args:
        argv: The arguments (default: the command line's).

    Returns:
        The exit code.
    """
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--kill-at", default="", help="failpoint spec for the first worker, e.g. engine.step_returned=3*kill"
    )
    parser.add_argument("--namespace", default="", help="topics namespace (default: a fresh invoice-<random>)")
    parser.add_argument("--state-dir", default="", help="where the database and worker logs go (default: a temp dir)")
    parser.add_argument("--task-id", default="inv-12345", help="the run's task id")
    parser.add_argument("--timeout-s", type=float, default=120.0, help="longest wait for the run, in seconds")
    args = parser.parse_args(argv)

    settings = Settings()
    if not settings.kafka_bootstrap:
        print('no broker: run `eval "$(settled dev up)"` first (SETTLED_KAFKA_BOOTSTRAP is empty)', file=sys.stderr)
        return 2
    settings = settings.model_copy(update={"namespace": args.namespace or f"invoice-{uuid.uuid4().hex[:8]}"})
    state = Path(args.state_dir or tempfile.mkdtemp(prefix="invoice-workflow-"))
    state.mkdir(parents=True, exist_ok=True)
    db = str(state / "world.db")
    world(db).close()
    provision_topics(settings, Codec(), datetime.now(UTC))
    print(f"namespace {settings.namespace}; state in {state}")

    env = {DB_ENV: db}
    workers = [WorkerProcess.start(settings, app=APP, log_path=state / "worker-1.log", failpoints=args.kill_at,
                                   env=env, cwd=HERE)]  # fmt: skip
    try:
        with Client(settings, principal="invoice-example") as client:
            receipt = client.run_workflow(invoice.name, DOCUMENT, task_id=args.task_id)
            print(f"run {receipt.request_id} in {receipt.conversation_id}: {receipt.outcome.value}")
            deadline = time.monotonic() + args.timeout_s
            while True:
                try:
                    result = client.wait(receipt, timeout_s=1.0)
                    break
                except SettlementTimeoutError:
                    if time.monotonic() > deadline:
                        print("the run did not settle in time", file=sys.stderr)
                        return 1
                if workers[-1].poll() is not None:  # killed at its failpoint: the next worker takes over
                    print(f"worker {len(workers)} exited with {workers[-1].returncode}; starting another")
                    log = state / f"worker-{len(workers) + 1}.log"
                    workers.append(WorkerProcess.start(settings, app=APP, log_path=log, env=env, cwd=HERE))
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.stop()
    print(f"settled {result.outcome.value} after {result.attempt_count} attempt(s)")
    reply = json.loads(result.reply_json) if result.reply_json else None
    print(json.dumps(reply, indent=2, sort_keys=True))
    with world(db) as conn:
        ran = [step for (step,) in conn.execute("SELECT step FROM step_runs ORDER BY rowid")]
        invoices = conn.execute("SELECT count(*) FROM invoices").fetchone()[0]
        emails = conn.execute("SELECT count(*) FROM emails").fetchone()[0]
    print(f"step bodies ran: {ran}; invoices saved: {invoices}; e-mails sent: {emails}")
    names = [step.name for step in invoice.steps]
    again = [n for n in names if ran.count(n) > 1]
    in_order = not again or ran == [*names[: names.index(again[0]) + 1], *names[names.index(again[0]) :]]
    ok = (
        result.outcome is SettlementOutcome.COMPLETED and invoices == 1 and emails == 1 and len(again) <= 1 and in_order
    )
    print("OK" if ok else "NOT OK: see above")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
