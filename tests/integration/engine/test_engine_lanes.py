"""Lane policies through real workers (issue 22 item 1): a burst of 20 submissions and a kill, checked by the log.

For each policy, the conversation's opening submission (the holder, whose ``lane`` chooses the policy) runs in
worker ``a`` and stops at the barrier ``engine.after_step_commit``: the lane is held. Twenty more submissions are
produced to the conversation within 100 ms; the test waits until the owner has answered each of them (its receipt
is read) while the holder still holds the lane. Then a kill is armed at a failpoint chosen by a logged seed
(``appender.before_commit`` or ``appender.after_commit``, its next hit; ``SETTLED_TEST_SEED`` replays it) and the
holder is released: ``a`` dies at the next transaction (the holder's settlement), with the burst admitted, rejected
or aborted around it; worker ``b`` takes over and finishes. A barrier submission sent after every submission
settled (admitted under every lane: the lane is free) proves nothing else happened. Then the pure checker
`settled.protocol.check_lane_history` reads the conversation's events from the log: none lost or doubled, never
two active, and the policy's own invariants (queue: all complete in sequence order; reject: each completes or is
rejected busy; interrupt: each earlier one settles aborted before a later one starts; keep_newest: the last
completes and each superseded one settles aborted superseded). Each settlement is on the settlements topic once.

Under ``join`` (issue 22 item 2) the holder's plan makes a model call after its step (the engine app's scripted echo
model): at that boundary it takes in the whole burst, one `SubmissionsJoined` committed in the transaction after the
release (where the kill lands, before or after its commit), and each joined submission settles with the holder;
the checker adds joining's promises (`settled.protocol.check_joining`).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from settled._failpoints import FailpointControl, choose_schedule
from settled._settings import Settings
from settled.client import Client, LaneRejectedError, SubmissionRejectedError
from settled.producers import admin_config, read_partition
from settled.protocol import LANE_BUSY, check_lane_history
from settled.schemas import (
    LanePolicy,
    LaneSet,
    LogEvent,
    Receipt,
    ReceiptOutcome,
    SettlementOutcome,
    SubmissionAdmitted,
    SubmissionProposed,
    SubmissionsJoined,
    canonical_json,
)
from tests._promise import promise
from tests.harness.barriers import pass_barrier
from tests.integration.engine._helpers import TIMEOUT_S, killed, plan, send, settlements
from tests.integration.engine.conftest import ROOT, SpawnWorker
from tests.integration.engine.engine_app import world
from tests.integration.helpers import CODEC, proposal, read_topic, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

#: The policies under test; issue 22 item 2 adds LanePolicy.JOIN (and its checker in LANE_CHECKERS).
POLICIES = [LanePolicy.QUEUE, LanePolicy.REJECT, LanePolicy.INTERRUPT, LanePolicy.KEEP_NEWEST, LanePolicy.JOIN]
BURST = 20
#: Where worker a may die: the next transaction after the holder is released (its settlement's, at the latest).
KILL_POINTS = ("appender.before_commit", "appender.after_commit")
HOLD = "engine.after_step_commit"


def _conversation_events(s: Settings, conversation_id: str) -> list[LogEvent]:
    out: list[LogEvent] = []
    for r in read_topic(s, "log"):
        assert r.value is not None
        batch = CODEC.decode_batch(r.value, offset=r.offset).batch
        if batch.conversation_id == conversation_id:
            out.extend(batch.events)
    return out


def _inbox_span_ms(s: Settings, submission_ids: set[str]) -> int:
    """The milliseconds between the first and the last of these proposals' inbox records (their Kafka timestamps)."""
    stamps: list[int] = []
    topic = s.topic("inbox")
    partitions = AdminClient(admin_config(s)).list_topics(topic, timeout=TIMEOUT_S).topics[topic].partitions
    for partition in partitions:
        for m in read_partition(s, topic, partition, 0, TIMEOUT_S):
            record = CODEC.decode(m.value() or b"")
            if isinstance(record, SubmissionProposed) and record.submission_id in submission_ids:
                stamps.append(m.timestamp()[1])
    assert len(stamps) == len(submission_ids), f"{len(stamps)} of {len(submission_ids)} proposals in the inbox"
    return max(stamps) - min(stamps)


def _receipts(s: Settings) -> dict[str, Receipt]:
    out: dict[str, Receipt] = {}
    for r in read_topic(s, "receipts"):
        assert r.value is not None
        rec = CODEC.decode(r.value)
        if isinstance(rec, Receipt):
            out.setdefault(rec.request_id, rec)
    return out


def _answered(s: Settings, proposals: list[SubmissionProposed]) -> bool:
    """Whether each proposal is rejected, or admitted and settled (a duplicate would be answered too)."""
    receipts = _receipts(s)
    done = {r.submission_id for r in settlements(s)}
    for p in proposals:
        got = receipts.get(p.submission_id)
        if got is None or (got.outcome is ReceiptOutcome.ADMITTED and p.submission_id not in done):
            return False
    return True


@pytest.mark.parametrize("lane", POLICIES, ids=str)
def test_a_burst_of_twenty_with_a_kill_keeps_the_lanes_promises(
    topics: Settings, spawn_worker: SpawnWorker, world_db: Path, tmp_path: Path, lane: LanePolicy
) -> None:
    s = topics
    seed = int(os.environ.get("SETTLED_TEST_SEED") or random.randrange(2**32))
    (kill,) = choose_schedule(seed, KILL_POINTS, 1, max_hit=1)
    print(f"lane {lane} seed {seed} (SETTLED_TEST_SEED={seed} replays it): worker a killed at {kill.spec}")
    conv = f"lanes-{lane}"
    control = FailpointControl(tmp_path / "fp")  # the folder spawn_worker's children use
    a = spawn_worker("a", failpoints=f"{HOLD}=1*pause(120s)")
    ops = [{"step": "hold"}, {"model": "holder"}] if lane is LanePolicy.JOIN else [{"step": "hold"}]
    holder = proposal(conv, value=plan(*ops)).model_copy(update={"lane": lane})
    send(s, holder)
    control.wait_reached(HOLD, TIMEOUT_S)  # the holder runs: the lane is held

    burst = [proposal(conv, value=plan()) for _ in range(BURST)]
    send(s, *burst)
    span_ms = _inbox_span_ms(s, {p.submission_id for p in burst})
    assert span_ms < 100, f"the burst's records span {span_ms} ms of inbox timestamps, not within 100 ms"
    receipts: dict[str, Receipt] = {}

    def burst_decided() -> bool:
        receipts.update(_receipts(s))
        return all(p.submission_id in receipts for p in burst)

    wait_for(burst_decided, TIMEOUT_S, "the owner's receipt of each submission of the burst")
    assert a.poll() is None, "worker a ended before its kill was armed"

    control.arm(kill.name, f"{kill.hit}*kill")
    assert control.release(HOLD) == 1
    killed(a, tmp_path / "a.log")
    control.disarm(kill.name)
    spawn_worker("b")
    everyone = [holder, *burst]
    wait_for(lambda: _answered(s, everyone), TIMEOUT_S, "each submission settled or rejected")
    barrier = pass_barrier(s, conv, plan(), timeout_s=TIMEOUT_S)

    events = _conversation_events(s, conv)
    violations = check_lane_history(events, [p.submission_id for p in [*everyone, barrier.proposal]])
    promise(
        "LANE-022.policy-kept",
        violations == [],
        f"lane {lane}, seed {seed}: {len(violations)} violations, the first: {violations[:5]}",
    )
    counts = Counter(r.submission_id for r in settlements(s))
    doubled = {sid: n for sid, n in counts.items() if n != 1}
    assert doubled == {}, f"settlements on the settlements topic more than once: {doubled}"

    final = _receipts(s)
    outcomes = Counter(r.outcome for r in settlements(s))
    rejected = [p for p in burst if final[p.submission_id].outcome is ReceiptOutcome.REJECTED]
    # What the held lane did to the burst (decided while the holder was held at the barrier, before the kill):
    if lane is LanePolicy.REJECT:
        assert len(rejected) == BURST and all(LANE_BUSY in (final[p.submission_id].reason or "") for p in rejected)
        assert outcomes == Counter({SettlementOutcome.COMPLETED: 2}), outcomes  # the holder and the barrier
    else:
        assert rejected == []
        aborted = {
            LanePolicy.QUEUE: 0,
            LanePolicy.INTERRUPT: BURST,
            LanePolicy.KEEP_NEWEST: BURST - 1,
            LanePolicy.JOIN: 0,
        }[lane]
        assert outcomes[SettlementOutcome.ABORTED] == aborted, outcomes
        assert outcomes[SettlementOutcome.COMPLETED] == BURST + 2 - aborted, outcomes
    if lane is LanePolicy.JOIN:  # the holder took the whole burst in at its model call, once, in sequence order
        joins = [(e.submission_id, e.joined_ids) for e in events if isinstance(e, SubmissionsJoined)]
        assert joins == [(holder.submission_id, tuple(p.submission_id for p in burst))], (seed, joins)
        with world(str(world_db)) as db:  # what the holder's model call was shown, by the attempt that completed
            (shown,) = db.execute(
                "SELECT value FROM observations WHERE submission = ? AND op = 1 ORDER BY rowid DESC LIMIT 1",
                (holder.submission_id,),
            ).fetchone()
        assert json.loads(shown) == ["holder", *[canonical_json(plan())] * BURST], (seed, shown)  # each input once


def test_set_lane_through_the_cli_and_the_client_changes_what_the_next_submission_does(
    topics: Settings, spawn_worker: SpawnWorker, tmp_path: Path
) -> None:
    """``settled lane set`` and `Client.set_lane` on a real worker: applied once (a repeat is a duplicate), refused
    for a stranger and for an unknown policy, and from then on a submission to the busy conversation is rejected
    busy; a submission opened with ``lane=`` keeps that lane."""
    s = topics
    conv = "lanes-set"
    control = FailpointControl(tmp_path / "fp")
    a = spawn_worker("a", failpoints=f"{HOLD}=1*pause(120s)")
    with Client(s, principal="alice", default_timeout_s=TIMEOUT_S) as client:
        holder = client.submit(conv, plan({"step": "hold"}))  # opened under the app's default lane: queue
        control.wait_reached(HOLD, TIMEOUT_S)

        env = {k: v for k, v in os.environ.items() if not k.startswith("SETTLED_FAILPOINT")}
        env.update(SETTLED_NAMESPACE=s.namespace, SETTLED_KAFKA_BOOTSTRAP=s.kafka_bootstrap)

        def cli(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([sys.executable, "-m", "settled.services", "lane", "set", *args], cwd=ROOT,
                                  env=env, capture_output=True, text=True, timeout=120)  # fmt: skip

        bogus = cli(conv, "newest")
        assert bogus.returncode == 2 and "lane must be one of" in bogus.stderr + bogus.stdout, bogus
        done = cli(conv, "reject", "--principal", "alice", "--command-id", "lane-1")
        assert done.returncode == 0, (done.stdout, done.stderr)
        assert json.loads(done.stdout.splitlines()[-1])["outcome"] == "applied"
        again = client.set_lane(conv, LanePolicy.REJECT, command_id="lane-1")
        assert again.outcome is ReceiptOutcome.DUPLICATE
        with pytest.raises(LaneRejectedError) as stranger:
            client.set_lane(conv, "interrupt", principal="mallory")
        assert stranger.value.reason_code == "unauthorized"

        with pytest.raises(SubmissionRejectedError) as busy:
            client.submit(conv, plan())
        assert busy.value.reason_code == LANE_BUSY, busy.value
        assert control.release(HOLD) == 1
        assert client.wait(holder, TIMEOUT_S).outcome is SettlementOutcome.COMPLETED
        after = client.submit(conv, plan())  # the lane is free: admitted under reject
        assert client.wait(after, TIMEOUT_S).outcome is SettlementOutcome.COMPLETED

        opened = client.submit("lanes-opened", plan(), lane="keep_newest")
        assert client.wait(opened, TIMEOUT_S).outcome is SettlementOutcome.COMPLETED
    sets = [e for e in _conversation_events(s, conv) if isinstance(e, LaneSet)]
    assert [(e.command_id, e.lane) for e in sets] == [("lane-1", LanePolicy.REJECT)] * 2  # applied, then the duplicate
    (first,) = [e for e in _conversation_events(s, "lanes-opened") if isinstance(e, SubmissionAdmitted)]
    assert first.lane is LanePolicy.KEEP_NEWEST
    assert a.poll() is None
