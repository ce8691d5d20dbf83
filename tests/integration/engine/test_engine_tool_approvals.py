"""Tools that need approval through real workers (issue 16 item 5): the pause before the tool, denials, batches.

Real ``settled worker`` children run `tests.integration.engine.tool_approval_app`; its tools count every invocation
in the world database, which outlives killed workers. Kills happen at the named failpoint
``engine.after_wait_commit`` (the approval request is canonical, the attempt not ended); the approvals are signed
`Client.approve` / `Client.deny` commands aimed at the approval id derived from the tool call and bound to the
digest of its canonical arguments. Each test's barrier is a canonical record it waits for (the approval request,
the decision's receipt, the settlement), never a sleep.
"""

from __future__ import annotations

import json
import logging
import os
import random
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from settled._settings import Settings
from settled.client import Client
from settled.protocol import approval_id_for, arguments_digest
from settled.runtime import denial_result
from settled.schemas import (
    ReceiptOutcome,
    ToolCallPrepared,
    ToolCallRefused,
    ToolCallSettled,
    WaitKind,
    WaitRequested,
    canonical_json,
)
from settled.testing import WorkerProcess
from tests.integration.engine._helpers import KILLED, TIMEOUT_S, events_of, invocations, plan
from tests.integration.engine.conftest import SpawnWorker
from tests.integration.engine.engine_app import APPROVER_KEY_ID, RESOLVER_PRIVATE_KEY
from tests.integration.engine.model_app import prompts
from tests.integration.helpers import wait_for

pytestmark = [pytest.mark.integration]

_log = logging.getLogger(__name__)

ACTION_APP = "tests.integration.engine.tool_approval_app:app"
MODEL_APP = "tests.integration.engine.tool_approval_app:model_app"


@pytest.fixture
def client(topics: Settings) -> Iterator[Client]:
    with Client(topics, principal="ops", default_timeout_s=TIMEOUT_S) as c:
        yield c


def _requests(s: Settings, sid: str) -> list[WaitRequested]:
    return [e for e in events_of(s, sid) if isinstance(e, WaitRequested) and e.kind is WaitKind.APPROVAL]


def _wait_requests(s: Settings, sid: str, n: int) -> list[WaitRequested]:
    wait_for(lambda: len(_requests(s, sid)) >= n, TIMEOUT_S, f"{n} approval request(s) of {sid}")
    return _requests(s, sid)


def _decide(
    client: Client, conversation_id: str, request: WaitRequested, *, approved: bool, reason: str
) -> ReceiptOutcome:
    details = json.loads(request.details_json or "null")
    decide = client.approve if approved else client.deny
    receipt = decide(
        conversation_id,
        request.submission_id,
        request.wait_id,
        args_digest=arguments_digest(details["args_json"]),
        signing_key=RESOLVER_PRIVATE_KEY,
        key_id=APPROVER_KEY_ID,
        reason=reason,
    )
    return receipt.outcome


def _decide_while_starting(
    client: Client,
    spawn_worker: SpawnWorker,
    name: str,
    app: str,
    conversation_id: str,
    request: WaitRequested,
    **kw: Any,
) -> WorkerProcess:
    """Send a decision while no worker runs, then start one: the decision waits in the inbox until it owns it."""
    with ThreadPoolExecutor(1) as pool:
        outcome = pool.submit(_decide, client, conversation_id, request, **kw)
        worker = spawn_worker(name, app=app)
        assert outcome.result(TIMEOUT_S) is ReceiptOutcome.APPLIED
    return worker


def test_a_refund_the_model_asked_for_waits_with_every_worker_stopped_and_runs_once_after_approval(
    topics: Settings, spawn_worker: SpawnWorker, world_db: Path, client: Client
) -> None:
    w1 = spawn_worker("w1", app=MODEL_APP, failpoints="engine.after_wait_commit=1*kill")
    script = [[{"calls": [["c1", "refund", {"amount": 120}]]}], [{"answer": "refunded 120"}]]
    sub = client.submit("conv-ta1", {"script": script})
    sid = sub.request_id
    assert w1.wait(TIMEOUT_S) == KILLED  # the approval request committed, then every worker stopped
    [request] = _requests(topics, sid)
    assert request.wait_id == approval_id_for(sid, call_id=f"{sid}#1")  # the call after the model response
    details = json.loads(request.details_json or "null")
    assert (details["tool"], details["args_json"]) == ("refund", '{"amount":120}')
    assert invocations(world_db, "refund") == 0
    assert not [e for e in events_of(topics, sid) if isinstance(e, ToolCallPrepared)]
    _decide_while_starting(
        client, spawn_worker, "w2", MODEL_APP, "conv-ta1", request, approved=True, reason="within policy"
    )
    settled = client.wait(sub, TIMEOUT_S)
    assert settled.outcome.value == "completed", settled
    assert json.loads(settled.reply_json or "null") == "refunded 120"
    assert invocations(world_db, "refund") == 1
    last = prompts(str(world_db))[-1][2]
    assert [(m["role"], m.get("text")) for m in last if m["role"] == "tool"] == [("tool", '{"refunded":120}')]


def test_a_model_sees_structured_denials_a_deny_policy_never_pauses_and_a_threshold_asks_only_above_it(
    topics: Settings, spawn_worker: SpawnWorker, world_db: Path, client: Client
) -> None:
    spawn_worker("w1", app=MODEL_APP)
    script = [
        [
            {
                "calls": [
                    ["c1", "refund", {"amount": 500}],
                    ["c2", "close_account", {"customer": "k-1"}],
                    ["c3", "refund_capped", {"amount": 50}],
                ]
            }
        ],
        [{"calls": [["c4", "refund_capped", {"amount": 500}]]}],
        [{"answer": "told the customer"}],
    ]
    sub = client.submit("conv-ta2", {"script": script})
    sid = sub.request_id
    [first] = _wait_requests(topics, sid, 1)
    assert json.loads(first.details_json or "null")["tool"] == "refund"
    assert _decide(client, "conv-ta2", first, approved=False, reason="over the limit") is ReceiptOutcome.APPLIED
    requests = _wait_requests(topics, sid, 2)
    second = requests[1]
    assert json.loads(second.details_json or "null")["args_json"] == '{"amount":500}'
    assert _decide(client, "conv-ta2", second, approved=True, reason="checked") is ReceiptOutcome.APPLIED
    settled = client.wait(sub, TIMEOUT_S)
    assert settled.outcome.value == "completed", settled
    assert json.loads(settled.reply_json or "null") == "told the customer"
    # Only the refund and the capped refund above 100 paused; the policy's denial and the small refund did not.
    assert [json.loads(r.details_json or "null")["tool"] for r in _requests(topics, sid)] == ["refund", "refund_capped"]
    assert invocations(world_db, "refund") == 0
    assert invocations(world_db, "close_account") == 0
    assert invocations(world_db, "refund_capped") == 2
    [refused] = [e for e in events_of(topics, sid) if isinstance(e, ToolCallRefused)]
    assert refused.tool == "close_account" and refused.reason.startswith("approval_denied: ")
    shown = {pos: msgs for _, pos, msgs in prompts(str(world_db))}
    tool_results = [
        (m["call_id"], json.loads(m["text"]), m.get("is_error", False)) for m in shown[1] if m["role"] == "tool"
    ]
    assert tool_results == [
        ("c1", denial_result("refund", APPROVER_KEY_ID, "over the limit"), False),
        ("c2", denial_result("close_account", "policy", refused.reason), False),
        ("c3", {"refunded": 50}, False),
    ]


def test_an_uncaught_denial_in_action_code_fails_the_submission_at_once_with_approval_denied(
    topics: Settings, spawn_worker: SpawnWorker, world_db: Path, client: Client
) -> None:
    spawn_worker("w1", app=ACTION_APP)
    sub = client.submit("conv-ta3", plan({"tool": "refund", "args": {"amount": 7}, "uncaught": True}))
    [request] = _wait_requests(topics, sub.request_id, 1)
    assert _decide(client, "conv-ta3", request, approved=False, reason="no") is ReceiptOutcome.APPLIED
    settled = client.wait(sub, TIMEOUT_S)
    assert settled.outcome.value == "failed", settled
    assert settled.error_type == "approval_denied", settled
    assert invocations(world_db, "refund") == 0


def test_a_gathers_other_calls_settle_before_it_suspends_and_after_approval_none_runs_again(
    topics: Settings, spawn_worker: SpawnWorker, world_db: Path, client: Client
) -> None:
    w1 = spawn_worker("w1", app=ACTION_APP, failpoints="engine.after_wait_commit=1*kill")
    batch = {
        "gather": [
            {"tool": "lookup", "args": {"order": "slow", "sleep_s": 1.0}},
            {"tool": "refund", "args": {"amount": 30}},
            {"tool": "lookup", "args": {"order": "fast"}},
        ]
    }
    sub = client.submit("conv-ta4", plan(batch))
    sid = sub.request_id
    assert w1.wait(TIMEOUT_S) == KILLED
    events = events_of(topics, sid)
    kinds = [type(e).__name__ for e in events if isinstance(e, (ToolCallPrepared, ToolCallSettled, WaitRequested))]
    assert kinds[-1] == "WaitRequested" and kinds.count("ToolCallSettled") == 2, kinds  # both siblings settled first
    assert (invocations(world_db, "lookup"), invocations(world_db, "refund")) == (2, 0)
    [request] = _requests(topics, sid)
    _decide_while_starting(client, spawn_worker, "w2", ACTION_APP, "conv-ta4", request, approved=True, reason="ok")
    settled = client.wait(sub, TIMEOUT_S)
    assert settled.outcome.value == "completed", settled
    assert json.loads(settled.reply_json or "null") == {
        "results": [[{"order": "slow"}, {"refunded": 30}, {"order": "fast"}]]
    }
    assert (invocations(world_db, "lookup"), invocations(world_db, "refund")) == (2, 1)  # none ran again


def test_three_parallel_approvals_decided_in_seeded_order_across_restarts_each_apply_to_their_own_call(
    topics: Settings, spawn_worker: SpawnWorker, world_db: Path, client: Client
) -> None:
    seed = int(os.environ.get("SETTLED_TEST_SEED", random.randrange(1 << 32)))
    _log.warning("three parallel approvals: seed %d (SETTLED_TEST_SEED=%d replays it)", seed, seed)
    print(f"seed {seed}")
    rng = random.Random(seed)
    amounts = [101, 202, 303]
    verdicts = [True, False, rng.random() < 0.5]
    rng.shuffle(verdicts)
    order = list(range(3))
    rng.shuffle(order)
    w1 = spawn_worker("w1", app=ACTION_APP)
    sub = client.submit("conv-ta5", plan({"gather": [{"tool": "refund", "args": {"amount": a}} for a in amounts]}))
    sid = sub.request_id
    requests = _wait_requests(topics, sid, 3)
    by_amount = {json.loads(r.details_json or "null")["args_json"]: r for r in requests}
    assert set(by_amount) == {canonical_json({"amount": a}) for a in amounts}
    worker = w1
    for step, i in enumerate(order):
        worker.kill_and_wait()  # a worker restart between decisions: the next one is decided by a new worker
        request = by_amount[canonical_json({"amount": amounts[i]})]
        worker = _decide_while_starting(
            client,
            spawn_worker,
            f"w{step + 2}",
            ACTION_APP,
            "conv-ta5",
            request,
            approved=verdicts[i],
            reason=f"decision for {amounts[i]}",
        )
    settled = client.wait(sub, TIMEOUT_S)
    assert settled.outcome.value == "completed", settled
    expected = [
        {"refunded": a} if ok else {"denied": ["refund", APPROVER_KEY_ID, f"decision for {a}"]}
        for a, ok in zip(amounts, verdicts, strict=True)
    ]
    assert json.loads(settled.reply_json or "null") == {"results": [expected]}, f"seed {seed}"
    assert invocations(world_db, "refund") == sum(verdicts), f"seed {seed}"
