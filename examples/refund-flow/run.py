"""Run the refund flow end to end on a local broker and PostgreSQL, offline (issue 18 item 4).

    .venv/bin/python examples/refund-flow/run.py

Uses ``SETTLED_KAFKA_BOOTSTRAP`` and ``SETTLED_POSTGRES_DSN`` (or starts the dev stack, like ``settled dev up``).
In a fresh namespace it starts one ``settled worker`` child running `refund_app.py` and an in-process projector,
then: turn 1 opens a flow run with "I want my money back" (the flow asks for the amount; the receipt carries the run
id), turn 2 resumes the run by that id with "Make it 30 please", the run waits for a supervisor's approval, the
script approves it with a key it generated (the worker trusts its public key), and the run refunds once and ends.
After each step it prints where the run is (`ProjectionReader.flow_run`). The last line is a JSON summary
(``summary: {...}``). Each run uses a namespace and a projection schema of its own (``refund-<hex>``,
``p_refund_<hex>``), left in place for a look afterwards.
"""

from __future__ import annotations

import base64
import json
import sys
import tempfile
import threading
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from settled._settings import Settings
from settled.client import Client
from settled.producers import provision_topics
from settled.projections import ProjectionNames, ProjectionReader, Projector, ProjectorConfig
from settled.schemas import Codec
from settled.testing import WorkerProcess

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
APPROVER_KEY_ID = "supervisor-1"  # refund_app.APPROVER_KEY_ID
TIMEOUT_S = 60.0


def _show(label: str, value: Any) -> None:
    print(f"{label}: {json.dumps(value, sort_keys=True, default=str)}", flush=True)


def _view(reader: ProjectionReader, run_id: str, conversation_id: str, receipt: Any) -> dict[str, Any]:
    view = reader.flow_run(run_id, conversation_id=conversation_id, after=receipt, timeout_s=TIMEOUT_S)
    if view is None:
        raise RuntimeError(f"run {run_id} is not in the projection")
    return {"status": view.status, "node": view.node, "waiting_for": view.waiting_for, "outcome": view.outcome}


def _wait_until(predicate: Any, what: str) -> Any:
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(0.2)
    raise RuntimeError(f"timed out after {TIMEOUT_S} s waiting for {what}")


def main() -> int:
    """Run the example; return the exit status."""
    base = Settings()
    if not base.kafka_bootstrap or not base.postgres_dsn:
        from settled.services._cli_dev import stack_from_settings  # the dev stack of `settled dev up`

        bootstrap, dsn = stack_from_settings(base).up()
        base = base.model_copy(update={"kafka_bootstrap": bootstrap, "postgres_dsn": dsn})
    settings = base.model_copy(update={"namespace": f"refund-{uuid.uuid4().hex[:8]}", "partitions": 1})
    provision_topics(settings, Codec(), datetime.now(UTC))
    key = Ed25519PrivateKey.generate()
    public_b64 = base64.b64encode(key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)).decode()
    log = Path(tempfile.mkdtemp(prefix="refund-flow-")) / "worker.log"
    worker = WorkerProcess.start(
        settings, app="refund_app:app", log_path=log, worker_id="refund-demo", log_level="WARNING", cwd=ROOT,
        env={"PYTHONPATH": f"{HERE}:{ROOT}", "REFUND_APPROVER_PUBLIC_KEY": public_b64, **settings.timeouts_env()},
        append_log=False,
    )  # fmt: skip
    names = ProjectionNames(f"p_refund_{uuid.uuid4().hex[:8]}")
    projector = Projector(settings, ProjectorConfig(names=names))
    thread = threading.Thread(target=projector.run, daemon=True, name="projector")
    thread.start()
    conversation = f"customer-{uuid.uuid4().hex[:6]}"
    try:
        with (
            Client(settings, principal="support", default_timeout_s=TIMEOUT_S) as client,
            ProjectionReader(settings.postgres_dsn, names) as reader,
        ):
            first = client.submit(conversation, "I want my money back", kind="flow", flow_name="refund")
            run_id = first.run_id
            assert run_id is not None
            _show("turn 1 receipt run_id", run_id)
            _show("turn 1 reply", json.loads(client.wait(first).reply_json or "null"))
            _show("run after turn 1", _view(reader, run_id, conversation, first))

            second = client.submit(conversation, "Make it 30 please", run_id=run_id)
            approval = _wait_until(
                lambda: reader.approvals(conversation_id=conversation, submission_id=second.request_id),
                "the supervisor's approval request",
            )[0]
            _show("run waiting", _view(reader, run_id, conversation, second))
            _show("approval asked", {"title": approval["title"], "approval_id": approval["approval_id"]})
            client.approve(
                conversation,
                second.request_id,
                approval["approval_id"],
                args_digest=approval["args_digest"],
                signing_key=key,
                key_id=APPROVER_KEY_ID,
                reason="within policy",
            )
            done = client.wait(second)
            reply = json.loads(done.reply_json or "null")
            _show("turn 2 reply", reply)
            final = _wait_until(
                lambda: (v := _view(reader, run_id, conversation, second))["status"] != "running" and v,
                "the projection to show the run's end",
            )
            _show("run after turn 2", final)
            summary = {
                "run_id": run_id,
                "turn1_status": "waiting",
                "turn2_outcome": reply.get("outcome") if isinstance(reply, dict) else None,
                "refund": reply.get("state", {}).get("receipt") if isinstance(reply, dict) else None,
                "final_status": final["status"],
                "final_node": final["node"],
            }
            print("summary: " + json.dumps(summary, sort_keys=True), flush=True)
    finally:
        projector.stop()
        thread.join(10)
        worker.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
