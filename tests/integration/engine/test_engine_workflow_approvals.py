"""Workflow steps that require approval, and pause/resume, through real workers (issue 17 item 2).

The seed's ``send-payment`` workflow (`tests/integration/engine/workflow_app.py`): ``send-money`` requires approval.
``on_approval_needed`` answers True (the step runs), False (``on_denial="fail"``: the run settles failed) or None (a
person decides with ``Client.approve|deny`` or ``settled approve``). A denial pauses the run; ``resume``
asks again under a new approval id and an approval completes it. Scenarios 2 and 9 of the failure scenarios with a
step that requires approval: a cold restart after the request is canonical, then the approval is consumed once; the
same approval sent twice with a worker restart between is one decision and a duplicate, and the step runs once.
``pause_run`` takes effect at the next step boundary and ``resume_run`` goes on from there.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from settled._settings import Settings
from settled.client import Client, SignalRejectedError
from settled.protocol import PAUSE_SIGNAL, RESUME_SIGNAL, is_retry_wait, pause_wait_id, step_approval_id
from settled.schemas import (
    ApprovalDecided,
    CommandRejectReason,
    LogEvent,
    ReceiptOutcome,
    SettlementOutcome,
    SignalReceived,
    StepRecorded,
    WaitKind,
    WaitRequested,
    WaitResolved,
    canonical_json,
)
from tests.integration.engine._helpers import TIMEOUT_S, events_of, killed, settled, settlements
from tests.integration.engine.conftest import ROOT, SpawnWorker
from tests.integration.engine.engine_app import APPROVER_KEY_ID, RESOLVER_PRIVATE_KEY
from tests.integration.engine.workflow_app import PAYMENT, runs
from tests.integration.helpers import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

APP = "tests.integration.engine.workflow_app:app"


@pytest.fixture
def client(topics: Settings) -> Iterator[Client]:
    with Client(topics, principal="ops", default_timeout_s=TIMEOUT_S) as c:
        yield c


def _steps(world_db: Path, task: str) -> list[str]:
    return [step for step, _ in runs(str(world_db), task)]


def _asks(world_db: Path) -> list[tuple[str, object]]:
    return [(step, seen["answer"]) for step, seen in runs(str(world_db), "ask")]


def _records(events: list[LogEvent]) -> list[str]:
    """The step records' names, log lines and the run's plan (``workflow``) left out."""
    return [
        e.name for e in events if isinstance(e, StepRecorded) and not e.name.startswith("log:") and e.name != "workflow"
    ]


def _request(s: Settings, sid: str, wait_id: str) -> WaitRequested:
    def found() -> WaitRequested | None:
        for e in events_of(s, sid):
            if isinstance(e, WaitRequested) and e.wait_id == wait_id:
                return e
        return None

    wait_for(lambda: found() is not None, TIMEOUT_S, f"the wait {wait_id}")
    request = found()
    assert request is not None
    return request


def _decide(client: Client, conversation: str, sid: str, request: WaitRequested, *, approved: bool, cid: str) -> None:
    digest = json.loads(request.details_json or "null")["args_digest"]
    decide = client.approve if approved else client.deny
    receipt = decide(
        conversation,
        sid,
        request.wait_id,
        args_digest=digest,
        signing_key=RESOLVER_PRIVATE_KEY,
        key_id=APPROVER_KEY_ID,
        reason="checked" if approved else "not this vendor",
        command_id=cid,
    )
    assert receipt.outcome is ReceiptOutcome.APPLIED, receipt


def _cli(s: Settings, *args: str) -> dict[str, object]:
    """Run ``settled <args>`` as a person would; return the receipt it prints (exit 0 required)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SETTLED_FAILPOINT")}
    env.update(SETTLED_NAMESPACE=s.namespace, SETTLED_KAFKA_BOOTSTRAP=s.kafka_bootstrap)
    done = subprocess.run([sys.executable, "-m", "settled.services", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    receipt: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return receipt


def _completed(s: Settings, sid: str) -> None:
    wait_for(lambda: settled(s, sid) is not None, TIMEOUT_S, "the run to settle")
    result = settled(s, sid)
    assert result is not None and result.outcome is SettlementOutcome.COMPLETED, result
    assert result.reply_json == canonical_json(PAYMENT)


def test_on_approval_needed_answering_true_runs_the_step_after_a_canonical_request_answered_once(
    topics: Settings, spawn_worker: SpawnWorker, world_db: Path, tmp_path: Path, client: Client
) -> None:
    s = topics
    # The 2nd step body to return is the callback's (the 1st is calculate's): killed before its answer commits.
    a = spawn_worker("a", app=APP, failpoints="engine.step_returned=2*kill")
    receipt = client.run_workflow("pay-yes", None, task_id="p-yes")
    killed(a, tmp_path / "a.log")
    assert _asks(world_db) == [("send-money", True)]
    spawn_worker("b", app=APP)
    _completed(s, receipt.request_id)
    # At least once: the callback ran again after the kill; its answer is recorded once and decided.
    assert _asks(world_db) == [("send-money", True), ("send-money", True)]
    assert _steps(world_db, "p-yes") == ["calculate", "send-money"]
    events = events_of(s, receipt.request_id)
    assert _records(events) == [
        "step:calculate",
        "approval-request:send-money#1",
        "approval:send-money#1",
        "step:send-money",
    ]
    (answer,) = [e for e in events if isinstance(e, StepRecorded) and e.name == "approval:send-money#1"]
    assert json.loads(answer.result_json) == {"approved": True}
    # No person was asked (a death's retry wait is the owner's, not the run's).
    assert not [e for e in events if isinstance(e, WaitRequested) and not is_retry_wait(e.wait_id)]


def test_on_approval_needed_answering_false_settles_the_run_failed_under_on_denial_fail(
    topics: Settings, spawn_worker: SpawnWorker, world_db: Path, client: Client
) -> None:
    s = topics
    spawn_worker("a", app=APP)
    receipt = client.run_workflow("pay-no", None, task_id="p-no")
    wait_for(lambda: settled(s, receipt.request_id) is not None, TIMEOUT_S, "the run to settle")
    result = settled(s, receipt.request_id)
    assert result is not None and result.outcome is SettlementOutcome.FAILED, result
    assert result.error_type == "approval_denied", result
    assert step_approval_id(receipt.request_id, "send-money", 1) in (result.error_reason or ""), result
    assert _asks(world_db) == [("send-money", False)]
    assert _steps(world_db, "p-no") == ["calculate"]  # the denied step never ran
    assert [r.submission_id for r in settlements(s)] == [receipt.request_id]


def test_no_answer_leaves_it_to_a_person_whose_denial_pauses_and_resume_asks_again_under_a_new_id(
    topics: Settings, spawn_worker: SpawnWorker, world_db: Path, client: Client
) -> None:
    s = topics
    spawn_worker("a", app=APP)
    receipt = client.run_workflow("pay-person", None, task_id="p-person")
    sid, conv = receipt.request_id, receipt.conversation_id
    first = _request(s, sid, step_approval_id(sid, "send-money", 1))
    assert first.kind is WaitKind.APPROVAL and first.name == "send-money"
    _decide(client, conv, sid, first, approved=False, cid="deny-1")
    # The denial pauses the run: a wait for settled.resume naming the denied ask.
    pause = _request(s, sid, pause_wait_id(sid, first.ordinal + 1))
    assert pause.kind is WaitKind.SIGNAL and pause.name == RESUME_SIGNAL
    details = json.loads(pause.details_json or "null")
    assert details["approval_id"] == first.wait_id and details["step"] == "send-money", details
    assert "not this vendor" in details["reason"], details
    resumed = client.resume_run(conv, sid, command_id="resume-1")
    assert resumed.outcome is ReceiptOutcome.APPLIED, resumed
    assert client.resume_run(conv, sid, command_id="resume-1").outcome is ReceiptOutcome.DUPLICATE
    second = _request(s, sid, step_approval_id(sid, "send-money", 2))
    assert second.wait_id != first.wait_id
    _decide(client, conv, sid, second, approved=True, cid="approve-2")
    _completed(s, sid)
    # The callback answered None for each ask; the step ran once, after the second ask's approval.
    assert _asks(world_db) == [("send-money", None), ("send-money", None)]
    assert _steps(world_db, "p-person") == ["calculate", "send-money"]
    decided = [(e.approval_id, e.approved) for e in events_of(s, sid) if isinstance(e, ApprovalDecided)]
    assert decided == [(first.wait_id, False), (second.wait_id, True)]
    # A settled run is neither paused nor resumed again.
    with pytest.raises(SignalRejectedError) as rejected:
        client.resume_run(conv, sid)
    assert rejected.value.reason_code == CommandRejectReason.ALREADY_TERMINAL.value


def test_scenario_2_cold_restart_after_the_request_then_the_approval_is_consumed_once(
    topics: Settings, spawn_worker: SpawnWorker, world_db: Path, tmp_path: Path, client: Client
) -> None:
    s = topics
    a = spawn_worker("a", app=APP, failpoints="engine.after_wait_commit=1*kill")  # the approval request committed
    receipt = client.run_workflow("pay-cli", None, task_id="p-s2")
    sid, conv = receipt.request_id, receipt.conversation_id
    killed(a, tmp_path / "a.log")
    request = _request(s, sid, step_approval_id(sid, "send-money", 1))
    spawn_worker("b", app=APP)  # a cold restart: the new worker rebuilds the run from the log; nothing re-sent
    key_file = tmp_path / "approver.key"
    key_file.write_text(base64.b64encode(bytes(range(32))).decode())  # engine_app's RESOLVER_PRIVATE_KEY
    digest = json.loads(request.details_json or "null")["args_digest"]
    approved = _cli(
        s, "approve", conv, sid, request.wait_id, "--args-digest", digest, "--key-file", str(key_file),
        "--key-id", APPROVER_KEY_ID, "--command-id", "s2-approve",
    )  # fmt: skip
    assert approved["outcome"] == "applied", approved
    _completed(s, sid)
    assert _steps(world_db, "p-s2") == ["calculate", "send-money"]
    events = events_of(s, sid)
    assert [e.wait_id for e in events if isinstance(e, WaitResolved) and not is_retry_wait(e.wait_id)] == [
        request.wait_id
    ]
    assert len([e for e in events if isinstance(e, ApprovalDecided)]) == 1


def test_scenario_9_the_same_approval_twice_across_a_restart_is_a_duplicate_and_the_step_runs_once(
    topics: Settings, spawn_worker: SpawnWorker, world_db: Path, tmp_path: Path, client: Client
) -> None:
    s = topics
    # Killed right after the approved step's result commits; the second approval reaches the next worker.
    a = spawn_worker("a", app=APP, failpoints="engine.after_step_commit=2*kill")
    receipt = client.run_workflow("pay-cli", None, task_id="p-s9")
    sid, conv = receipt.request_id, receipt.conversation_id
    request = _request(s, sid, step_approval_id(sid, "send-money", 1))
    _decide(client, conv, sid, request, approved=True, cid="s9-approve")
    killed(a, tmp_path / "a.log")
    spawn_worker("b", app=APP)
    digest = json.loads(request.details_json or "null")["args_digest"]
    again = client.approve(
        conv, sid, request.wait_id, args_digest=digest, signing_key=RESOLVER_PRIVATE_KEY, key_id=APPROVER_KEY_ID,
        reason="checked", command_id="s9-approve",
    )  # fmt: skip
    assert again.outcome is ReceiptOutcome.DUPLICATE, again
    _completed(s, sid)
    assert _steps(world_db, "p-s9") == ["calculate", "send-money"]  # the approved step ran once
    events = events_of(s, sid)
    assert _records(events).count("step:send-money") == 1
    assert [e.wait_id for e in events if isinstance(e, WaitResolved) and not is_retry_wait(e.wait_id)] == [
        request.wait_id
    ]


def test_pause_takes_effect_at_the_next_step_boundary_and_resume_goes_on_from_there(
    topics: Settings, spawn_worker: SpawnWorker, world_db: Path, client: Client
) -> None:
    s = topics
    spawn_worker("a", app=APP)
    receipt = client.run_workflow("paused", None, task_id="w-pause")
    sid, conv = receipt.request_id, receipt.conversation_id
    wait_for(lambda: _steps(world_db, "w-pause") == ["first"], TIMEOUT_S, "the first step to run")
    paused = _cli(
        s, "runs", "pause", sid, "--conversation", conv, "--reason", "month-end freeze", "--command-id", "pause-1"
    )
    assert paused["outcome"] == "applied", paused
    assert client.pause_run(conv, sid, reason="again", command_id="pause-1").outcome is ReceiptOutcome.DUPLICATE
    with pytest.raises(SignalRejectedError) as early:
        client.resume_run(conv, sid)  # not paused yet: the first step still runs
    assert early.value.reason_code == CommandRejectReason.STALE.value
    Path(f"{world_db}.go-w-pause").touch()
    # Barrier: the pause wait is the attempt's last record; nothing runs after it until the resume.
    wait_for(
        lambda: any(e.name == RESUME_SIGNAL for e in events_of(s, sid) if isinstance(e, WaitRequested)),
        TIMEOUT_S,
        "the pause",
    )
    (pause,) = [e for e in events_of(s, sid) if isinstance(e, WaitRequested)]
    assert json.loads(pause.details_json or "null") == {
        "approval_id": None,
        "reason": "month-end freeze",
        "source": "pause-1",
        "step": "second",
    }
    assert _steps(world_db, "w-pause") == ["first"]
    with pytest.raises(SignalRejectedError) as twice:
        client.pause_run(conv, sid)
    assert twice.value.reason_code == CommandRejectReason.STALE.value
    assert client.resume_run(conv, sid, command_id="resume-1").outcome is ReceiptOutcome.APPLIED
    wait_for(lambda: settled(s, sid) is not None, TIMEOUT_S, "the run to settle")
    result = settled(s, sid)
    assert result is not None and result.outcome is SettlementOutcome.COMPLETED, result
    assert result.reply_json == canonical_json({"first": 1, "second": "second", "third": "third"})
    assert _steps(world_db, "w-pause") == ["first", "second", "third"]
    received = [e.name for e in events_of(s, sid) if isinstance(e, SignalReceived)]
    assert received.count(PAUSE_SIGNAL) == 2 and received.count(RESUME_SIGNAL) == 1, received


def test_resume_of_a_run_not_paused_and_pause_of_an_unknown_run_are_refused_naming_them(
    topics: Settings, spawn_worker: SpawnWorker, client: Client
) -> None:
    spawn_worker("a", app=APP)
    receipt = client.run_workflow("pay-cli", None, task_id="p-refuse")
    sid, conv = receipt.request_id, receipt.conversation_id
    _request(topics, sid, step_approval_id(sid, "send-money", 1))  # the run waits for its approval
    with pytest.raises(SignalRejectedError) as not_paused:
        client.resume_run(conv, sid)
    assert not_paused.value.reason_code == CommandRejectReason.STALE.value
    assert sid in (not_paused.value.detail or "")
    with pytest.raises(SignalRejectedError) as unknown:
        client.pause_run(conv, "no-such-run")
    assert unknown.value.reason_code == CommandRejectReason.UNKNOWN_TARGET.value
