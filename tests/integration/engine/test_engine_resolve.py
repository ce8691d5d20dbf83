"""The operator's way out of an Unknown: ``Client.resolve_unknown`` and ``settled unknown resolve`` (DUR-009).

docs/design.md §5.

A real ``settled worker`` child runs the engine test app (resolver key ``RESOLVER_PRIVATE_KEY`` under
``RESOLVER_KEY_ID``). A non-idempotent tool whose server refuses connections leaves its call Unknown; the run stops
and the conversation's next submission waits. Only a resolution signed with the configured key moves it on: a
forged key or an unknown key id is rejected (`ResolveRejectedError`), the resolver's is applied, a resend of the same
command id is answered as a duplicate.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat
from typer.testing import CliRunner

from settled import EXIT_CODES, ErrorCategory
from settled._settings import Settings
from settled.client import Client, ResolveRejectedError
from settled.schemas import (
    Receipt,
    ReceiptOutcome,
    RecoveryDecisionKind,
    RequestKind,
    SettlementOutcome,
    ToolCallUnknown,
    canonical_json,
)
from settled.services.cli import app
from tests._promise import promise
from tests.integration.engine._helpers import TIMEOUT_S, decisions, events_of, invocations, plan
from tests.integration.engine.conftest import SpawnWorker
from tests.integration.engine.engine_app import RESOLVER_KEY_ID, RESOLVER_PRIVATE_KEY, flag, world
from tests.integration.helpers import wait_for

pytestmark = [pytest.mark.integration]


@pytest.fixture
def client(topics: Settings) -> Iterator[Client]:
    with Client(topics, principal="ops", default_timeout_s=TIMEOUT_S) as c:
        yield c


def _server_down(world_db: Path, down: bool) -> None:
    with world(str(world_db)) as db:
        flag(db, "server_down", down)


def _unknown_call(s: Settings, submission_id: str) -> str:
    """Wait until the submission's call is Unknown; return its call id."""
    wait_for(lambda: bool(decisions(s, submission_id)), TIMEOUT_S, f"the Unknown decision of {submission_id}")
    assert decisions(s, submission_id) == [RecoveryDecisionKind.UNKNOWN]
    (unknown,) = [e for e in events_of(s, submission_id) if isinstance(e, ToolCallUnknown)]
    return unknown.call_id


def test_client_resolutions_are_verified_and_move_the_run_on(
    topics: Settings, spawn_worker: SpawnWorker, world_db: Path, client: Client
) -> None:
    s = topics
    _server_down(world_db, True)
    spawn_worker("w")
    stuck = client.submit("conv-r1", plan({"tool": "remote_once"}))
    queued = client.submit("conv-r1", plan())
    decided = client.submit("conv-r2", plan({"tool": "remote_once"}))
    call = _unknown_call(s, stuck.request_id)
    other = _unknown_call(s, decided.request_id)

    def resolve(**kw: Any) -> Receipt:
        args: dict[str, Any] = {
            "kind": "call_outcome",
            "signing_key": RESOLVER_PRIVATE_KEY,
            "key_id": RESOLVER_KEY_ID,
            "result": {"tool": "remote_once", "by": "ops"},
        }
        return client.resolve_unknown("conv-r1", stuck.request_id, call, **{**args, **kw})

    # A forged signature and a key id the workers do not know are rejected; the run stays stopped.
    with pytest.raises(ResolveRejectedError) as forged:
        resolve(signing_key=Ed25519PrivateKey.generate())
    assert forged.value.reason_code == "bad_signature", forged.value
    assert f"does not verify with resolver key {RESOLVER_KEY_ID!r}" in forged.value.detail
    with pytest.raises(ResolveRejectedError) as unknown_key:
        resolve(key_id="someone-else")
    assert unknown_key.value.reason_code == "unknown_key"
    assert "key id 'someone-else' is not a configured resolver key" in unknown_key.value.detail
    # A call that is not Unknown is rejected naming it.
    with pytest.raises(ResolveRejectedError) as wrong_call:
        client.resolve_unknown(
            "conv-r1", stuck.request_id, "no-such-call", kind="safe_to_retry",
            signing_key=RESOLVER_PRIVATE_KEY, key_id=RESOLVER_KEY_ID,
        )  # fmt: skip
    assert wrong_call.value.reason_code == "not_unknown", wrong_call.value
    promise(
        "DUR-009.unknown",
        decisions(s, stuck.request_id) == [RecoveryDecisionKind.UNKNOWN] and invocations(world_db, "remote_once") == 2,
        f"after rejected resolutions: {decisions(s, stuck.request_id)}, {invocations(world_db, 'remote_once')} calls",
    )

    # The resolver's signature supplies the call's result: the run continues with it and the lane moves on.
    applied = resolve()
    assert (applied.request_kind, applied.outcome) == (RequestKind.COMMAND, ReceiptOutcome.APPLIED), applied
    first = client.wait(stuck)
    assert first.outcome is SettlementOutcome.COMPLETED, first
    assert first.reply_json == canonical_json({"results": [{"by": "ops", "tool": "remote_once"}]})
    assert client.wait(queued).outcome is SettlementOutcome.COMPLETED
    assert invocations(world_db, "remote_once") == 2, "the resolved call ran again"
    # A resend of the same command (e.g. after ResolveOutcomeUnknownError) is answered as a duplicate.
    again = resolve(command_id=applied.request_id)
    assert again.outcome is ReceiptOutcome.DUPLICATE, again

    # outcome_for_submission settles the other submission: Unknown -> Terminalizing -> failed.
    receipt = client.resolve_unknown(
        "conv-r2", decided.request_id, other, kind="outcome_for_submission", outcome="failed",
        signing_key=RESOLVER_PRIVATE_KEY, key_id=RESOLVER_KEY_ID,
    )  # fmt: skip
    assert receipt.outcome is ReceiptOutcome.APPLIED, receipt
    result = client.wait(decided)
    assert result.outcome is SettlementOutcome.FAILED, result
    assert "resolved by ops" in (result.error_reason or ""), result


def test_cli_resolves_an_unknown_call_and_rejects_a_key_the_workers_do_not_know(
    topics: Settings, spawn_worker: SpawnWorker, world_db: Path, client: Client, tmp_path: Path
) -> None:
    s = topics
    env = {"SETTLED_NAMESPACE": s.namespace, "SETTLED_KAFKA_BOOTSTRAP": s.kafka_bootstrap}
    _server_down(world_db, True)
    spawn_worker("w")
    sub = client.submit("conv-c1", plan({"tool": "remote_once"}))
    call = _unknown_call(s, sub.request_id)
    runner = CliRunner()
    args = ["unknown", "resolve", sub.request_id, call, "--conversation", "conv-c1", "--kind", "safe_to_retry",
            "--key-id", RESOLVER_KEY_ID, "--timeout-s", "60"]  # fmt: skip

    # A key made by `settled unknown keygen`, not the one configured under that key id: rejected, exit 1.
    new_key = tmp_path / "new.pem"
    made = runner.invoke(app, ["unknown", "keygen", "--out", str(new_key)])
    assert made.exit_code == 0, made.output
    base64.b64decode(made.stdout.strip(), validate=True)
    rejected = runner.invoke(app, [*args, "--key-file", str(new_key)], env=env)
    assert rejected.exit_code == EXIT_CODES[ErrorCategory.REJECTED] == 1, rejected.output
    refusal = Receipt.model_validate_json(rejected.stdout.strip())
    assert refusal.outcome is ReceiptOutcome.REJECTED and (refusal.reason or "").startswith("bad_signature"), refusal

    # The resolver's key (base64 of the raw 32 bytes): the call never took effect, so it runs again under its key.
    key_file = tmp_path / "resolver.key"
    raw = RESOLVER_PRIVATE_KEY.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
    key_file.write_text(base64.b64encode(raw).decode())
    _server_down(world_db, False)
    done = runner.invoke(app, [*args, "--key-file", str(key_file)], env=env)
    assert done.exit_code == 0, done.output
    line = json.loads(done.stdout.strip())
    assert (line["request_kind"], line["outcome"]) == ("command", "applied"), line
    result = client.wait(sub)
    assert result.outcome is SettlementOutcome.COMPLETED, result
    assert result.reply_json == canonical_json({"results": [{"tool": "remote_once"}]})
