"""Steering through real workers (issue 22 item 3): messages sent to an active run reach its next model call.

A real ``settled worker`` child runs the model-driven test app (`tests/integration/engine/model_app.py`), whose
scripted provider writes every prompt it is shown to the world database. The run's first model call declares
``hold_until_flag``, which keeps the run active until the test sets the world flag: the test steers the run while
that tool is in flight, waits for both messages' applied receipts (the owner's decisions are canonical), then sets
the flag. The worker is killed at the named failpoint ``engine.after_delta_commit`` inside the second model call (its
prompt was shown, its response not canonical); the next worker makes that call again.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from settled._settings import Settings
from settled.client import Client, SteerRejectedError
from settled.protocol import steering_stream
from settled.schemas import (
    CommandKind,
    CommandRejected,
    CommandRejectReason,
    ModelResponseCompleted,
    ReceiptOutcome,
    SettlementOutcome,
    SteeringDelivered,
    SteeringReceived,
    canonical_json,
)
from tests.integration.engine._helpers import TIMEOUT_S, events_of, invocations, killed, log_events
from tests.integration.engine.conftest import ROOT, SpawnWorker
from tests.integration.engine.engine_app import flag, world
from tests.integration.engine.model_app import prompts
from tests.integration.helpers import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

MODEL_APP = "tests.integration.engine.model_app:app"


@pytest.fixture
def client(topics: Settings) -> Iterator[Client]:
    with Client(topics, principal="ops", default_timeout_s=TIMEOUT_S) as c:
        yield c


def _after_input(messages: list[dict[str, object]], value: dict[str, object]) -> list[object]:
    """The user texts of a prompt after the turn's input (the steering messages the runtime appended)."""
    texts = [m["text"] for m in messages if m["role"] == "user"]
    return texts[texts.index(canonical_json(value)) + 1 :]


def test_steering_reaches_the_next_model_call_in_order_once_each_across_a_kill(
    topics: Settings, spawn_worker: SpawnWorker, world_db: Path, tmp_path: Path, client: Client
) -> None:
    s = topics
    value = {
        "script": [
            [{"calls": [["c1", "hold_until_flag", {"flag": "steered"}]]}],
            [{"text": "d"}, {"answer": "done"}],
        ]
    }
    a = spawn_worker("a", app=MODEL_APP, failpoints="engine.after_delta_commit=1*kill")
    receipt = client.submit("conv-steer", value)
    run_id = receipt.request_id
    wait_for(lambda: invocations(world_db, "hold_until_flag") == 1, TIMEOUT_S, "the run's tool in flight")
    first = client.steer("conv-steer", run_id, "first: be brief", command_id="steer-1")
    second = client.steer("conv-steer", run_id, "second: answer in French", command_id="steer-2")
    assert (first.outcome, second.outcome) == (ReceiptOutcome.APPLIED, ReceiptOutcome.APPLIED)
    with world(str(world_db)) as db:
        flag(db, "steered", True)
    killed(a, tmp_path / "a.log")  # inside the second model call: shown the steering, its response not canonical
    spawn_worker("b", app=MODEL_APP)
    settlement = client.wait(receipt, TIMEOUT_S)
    assert settlement.outcome is SettlementOutcome.COMPLETED and settlement.reply_json == canonical_json("done")

    events = events_of(s, run_id)
    received = [e for e in events if isinstance(e, SteeringReceived)]
    assert [(e.command_id, e.text) for e in received] == [
        ("steer-1", "first: be brief"),
        ("steer-2", "second: answer in French"),
    ]
    # Once each: one delivery record names both, in log order, riding with the response that was made again.
    delivered = [e for e in events if isinstance(e, SteeringDelivered)]
    completed = [e for e in events if isinstance(e, ModelResponseCompleted)]
    assert len(delivered) == 1 and delivered[0].command_ids == ("steer-1", "steer-2"), delivered
    assert [c.text for c in completed] == ["", "done"]
    assert (delivered[0].response_ordinal, delivered[0].attempt_id) == (
        completed[1].response_ordinal,
        completed[1].attempt_id,
    )
    assert completed[0].attempt_id != completed[1].attempt_id, "the second call was made again by the next attempt"
    # The provider's captured prompts: the first call saw none; the second (the killed try and the one made again,
    # each under its own operation id) saw both, once each, in order, after the turn's input and the tool's result.
    seen = prompts(str(world_db))
    assert [pos for _, pos, _ in seen] == [0, 1, 1], seen
    assert _after_input(seen[0][2], value) == []
    assert seen[1][0] != seen[2][0]
    for _, _, messages in seen[1:]:
        assert _after_input(messages, value) == ["first: be brief", "second: answer in French"], messages
        assert [m["role"] for m in messages] == ["user", "assistant", "tool", "user", "user"], messages
    assert invocations(world_db, "hold_until_flag") == 1

    # After settlement: a new message is rejected with its reason and nothing else; a repeat is a duplicate.
    # Through the CLI as a person would: the rejected receipt is printed and the command exits 1.
    env = {k: v for k, v in os.environ.items() if not k.startswith("SETTLED_FAILPOINT")}
    env.update(SETTLED_NAMESPACE=s.namespace, SETTLED_KAFKA_BOOTSTRAP=s.kafka_bootstrap)
    args = ["steer", run_id, "--conversation", "conv-steer", "third: too late", "--command-id", "steer-3"]
    done = subprocess.run([sys.executable, "-m", "settled.services", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 1, (done.stdout, done.stderr)
    printed = json.loads(done.stdout.splitlines()[-1])
    assert printed["outcome"] == "rejected" and str(printed["reason"]).startswith("already_terminal"), printed
    with pytest.raises(SteerRejectedError) as nobody:
        client.steer("conv-steer", "no-such-run", "fourth: nobody")
    assert nobody.value.reason_code == "unknown_target"
    again = client.steer("conv-steer", run_id, "first: be brief", command_id="steer-1")
    assert again.outcome is ReceiptOutcome.DUPLICATE
    about_late = [e for e in log_events(s) if getattr(e, "command_id", None) == "steer-3"]
    assert len(about_late) == 1 and isinstance(about_late[0], CommandRejected), about_late
    rejected = about_late[0]
    assert (rejected.reason, rejected.command_kind) == (CommandRejectReason.ALREADY_TERMINAL, CommandKind.STEER)
    # The repeat's record only marks its input decided: the stream still holds each message once.
    repeats = [e.command_id for e in events_of(s, run_id) if isinstance(e, SteeringReceived)]
    assert repeats == ["steer-1", "steer-2", "steer-1"]
    assert [e.command_id for e in steering_stream(events_of(s, run_id), run_id)] == ["steer-1", "steer-2"]
