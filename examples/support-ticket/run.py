"""Run the support-e-mail workflow through a real worker on the local stack; optionally kill it at a failpoint.

    eval "$(settled dev up)"
    python examples/support-ticket/run.py
    python examples/support-ticket/run.py --kill-at workflow.after_approval_request_commit=1*kill

With ``--kill-at`` the first worker dies at that failpoint (here: the ticket is created and recorded, the reply's
approval request has just committed, nothing is sent yet: the seed's "crash after creating the ticket but before
sending the reply"); a second worker resumes the run at the reply step. Exit 0 when the run completed with one
ticket created and one reply sent (the ticket isn't created twice); 1 otherwise; 2 when no broker is configured.
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

from support_app import DB_ENV, support_workflow, world

from settled._settings import Settings
from settled.client import Client, SettlementTimeoutError
from settled.producers import provision_topics
from settled.schemas import Codec, SettlementOutcome
from settled.testing import WorkerProcess

HERE = Path(__file__).resolve().parent
APP = "support_app:app"


def main(argv: list[str] | None = None) -> int:
    """Run the example (module docstring).

    Args:
        argv: The arguments (default: the command line's).

    Returns:
        The exit code.
    """
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kill-at", default="", help="failpoint spec for the first worker (module docstring)")
    parser.add_argument("--namespace", default="", help="topics namespace (default: a fresh support-<random>)")
    parser.add_argument("--state-dir", default="", help="where the database and worker logs go (default: a temp dir)")
    parser.add_argument("--email-id", default="e-1", help="the e-mail to process (support_app.MAILBOX)")
    parser.add_argument("--timeout-s", type=float, default=120.0, help="longest wait for the run, in seconds")
    args = parser.parse_args(argv)

    settings = Settings()
    if not settings.kafka_bootstrap:
        print('no broker: run `eval "$(settled dev up)"` first (SETTLED_KAFKA_BOOTSTRAP is empty)', file=sys.stderr)
        return 2
    settings = settings.model_copy(update={"namespace": args.namespace or f"support-{uuid.uuid4().hex[:8]}"})
    state = Path(args.state_dir or tempfile.mkdtemp(prefix="support-ticket-"))
    state.mkdir(parents=True, exist_ok=True)
    db = str(state / "world.db")
    world(db).close()
    provision_topics(settings, Codec(), datetime.now(UTC))
    print(f"namespace {settings.namespace}; state in {state}")

    env = {DB_ENV: db}
    first = WorkerProcess.start(
        settings, app=APP, log_path=state / "worker-1.log", failpoints=args.kill_at, env=env, cwd=HERE
    )
    workers = [first]
    try:
        with Client(settings, principal="support-example") as client:
            receipt = client.run_workflow(support_workflow.name, {"email_id": args.email_id}, task_id=args.email_id)
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
        tickets = conn.execute("SELECT ticket_id, category FROM tickets").fetchall()
        replies = conn.execute("SELECT recipient, body FROM replies").fetchall()
    print(f"step bodies ran: {ran}")
    print(f"tickets created: {tickets}; replies sent: {replies}")
    completed = result.outcome is SettlementOutcome.COMPLETED
    ok = completed and len(tickets) == 1 and len(replies) == 1 and ran.count("create-ticket") == 1
    print("OK: the ticket was created once" if ok else "NOT OK: see above")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
