"""Hostile inbox input against the real broker, a real worker and a live projector (issue 25 items 1 and 7).

1. The cases of issue 25's "Why" that the input contract covers, each once, interleaved with healthy submissions: a
   valid proposal with a 400 KB conversation id as the first input of the partition (its healthy neighbour behind it
   was lost); ids holding a NUL (conversation, submission, tool name; the projector died on each, on every restart);
   a 3 KB id (``index row size exceeds btree maximum``: the projector reconnected forever); an undecodable record
   with a 1.2 MB key (copied untruncated into the quarantine decision: the worker crash-looped). Each must be
   rejected naming its field (or quarantined), the worker and the projector stay up, every healthy submission
   settles once, and ``settled projections check`` is clean.
2. The acceptance fuzz run: 1,000 random inputs and 200 mutated proposals interleaved with 100 healthy submissions,
   seeded (``SETTLED_TEST_SEED`` replays it): zero lost, zero crashes, every inbox record decided exactly once with a
   reason, and the projection check clean.
"""

from __future__ import annotations

import os
import random
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource  # type: ignore[attr-defined]

from settled._settings import Settings
from settled.producers import provision_topics
from settled.projections import ProjectionNames
from settled.runtime import App
from settled.schemas import (
    CommandRejected,
    InputQuarantined,
    LogBatch,
    Receipt,
    SettlementOutcome,
    SettlementRecord,
    SubmissionAdmitted,
    SubmissionPayload,
    SubmissionProposed,
    SubmissionRejected,
    canonical_json,
    payload_digest,
)
from settled.services._worker_service import build_worker
from settled.testing.echo import EchoAgent
from tests._promise import promise
from tests.harness.factories import proposal
from tests.integration.admission_load import committed_input_offset
from tests.integration.helpers import (
    CODEC,
    LiveProjector,
    check_clean,
    fresh_projection,
    produce_inbox,
    projecting,
    read_topic,
    running,
    wait_projected,
)

pytestmark = pytest.mark.integration

#: The inbox takes records up to 4 MB, so a 1.2 MB key reaches the worker (zstd makes it a few KB on the wire).
INBOX_MAX_MESSAGE_BYTES = 4_000_000
#: What the decision about one bad input may take on the log (batch value and key), in bytes.
BOUND_BYTES = 16 * 1024


@dataclass(frozen=True)
class Sent:
    """One produced inbox record: what it was meant to be, and where it landed."""

    kind: str  # "healthy", or the hostile case / mutation
    conversation: str | None
    submission_id: str | None
    key: bytes | None
    value: bytes


def _topics(settings: Settings, partitions: int) -> Settings:
    s = settings.model_copy(update={"partitions": partitions})
    provision_topics(s, CODEC, datetime.now(UTC))
    admin = AdminClient({"bootstrap.servers": s.kafka_bootstrap})
    resource = ConfigResource(
        ConfigResource.Type.TOPIC,
        s.topic("inbox"),
        incremental_configs=[
            ConfigEntry("max.message.bytes", str(INBOX_MAX_MESSAGE_BYTES), incremental_operation=AlterConfigOpType.SET)
        ],
    )
    admin.incremental_alter_configs([resource])[resource].result(timeout=30)
    return s


def _produce(s: Settings, sent: list[Sent], partition: int | None = None) -> None:
    produce_inbox(
        s,
        [(x.key, x.value) for x in sent],  # type: ignore[misc]  # a None key is a record without one
        partition=partition,
        **{"compression.type": "zstd", "message.max.bytes": INBOX_MAX_MESSAGE_BYTES},
    )


def _healthy(conversation: str) -> Sent:
    p = proposal(conversation, value={"turn": uuid.uuid4().hex[:6]})
    return Sent("healthy", conversation, p.submission_id, conversation.encode(), CODEC.encode(p))


def _proposal_sent(kind: str, p: SubmissionProposed, key: bytes | None = None) -> Sent:
    return Sent(kind, p.conversation_id, p.submission_id, p.conversation_id.encode() if key is None else key,
                CODEC.encode(p))  # fmt: skip


def _wait_all_decided(
    s: Settings,
    ends: dict[int, int],
    healthy: set[tuple[str, str]],
    timeout_s: float,
    live: LiveProjector,
    errors: list[Any],
) -> None:
    """Wait until the workers' committed inbox offsets reach ``ends`` and every ``healthy`` submission settled."""
    deadline = time.monotonic() + timeout_s
    settled: set[tuple[str, str]] = set()
    while time.monotonic() < deadline:
        assert live.alive(), f"the live projector died: {live.errors!r}"
        assert not errors, f"the worker died: {errors!r}"
        if all(committed_input_offset(s, p) >= end for p, end in ends.items() if end > 0):
            settled = {(r.conversation_id, r.submission_id) for r in _settlement_records(s)}
            if healthy <= settled:
                return
        time.sleep(0.5)
    have = {p: committed_input_offset(s, p) for p in ends}
    raise AssertionError(
        f"not every input decided and settled within {timeout_s} s: committed {have} of {ends}, "
        f"{len(healthy - settled)} of {len(healthy)} healthy submissions unsettled"
    )


def _settlement_records(s: Settings) -> list[SettlementRecord]:
    out = []
    for r in read_topic(s, "settlements"):
        rec = CODEC.decode(r.value)
        assert isinstance(rec, SettlementRecord)
        out.append(rec)
    return out


@dataclass
class Accounting:
    """What the log, the receipts and the settlements say about every inbox record."""

    decided: dict[tuple[int, int], list[Any]]  # (partition, offset) -> its deciding events
    receipts: dict[str, list[Receipt]]
    settlements: dict[tuple[str, str], list[SettlementRecord]]
    largest_bad_batch_bytes: int


def _account(s: Settings) -> Accounting:
    decided: dict[tuple[int, int], list[Any]] = {}
    largest = 0
    for r in read_topic(s, "log"):
        assert r.value is not None
        batch: LogBatch = CODEC.decode_batch(r.value, offset=r.offset).batch
        for e in batch.events:
            ref = getattr(e, "input_ref", None)
            if ref is not None and ref.topic == s.topic("inbox"):
                decided.setdefault((ref.partition, ref.offset), []).append(e)
                if isinstance(e, SubmissionRejected | InputQuarantined | CommandRejected):
                    largest = max(largest, len(r.value) + len(r.key or b""))
    receipts: dict[str, list[Receipt]] = {}
    for r in read_topic(s, "receipts"):
        rec = CODEC.decode(r.value)
        assert isinstance(rec, Receipt)
        receipts.setdefault(rec.request_id, []).append(rec)
    settlements: dict[tuple[str, str], list[SettlementRecord]] = {}
    for rec in _settlement_records(s):
        settlements.setdefault((rec.conversation_id, rec.submission_id), []).append(rec)
    return Accounting(decided, receipts, settlements, largest)


def _inbox(s: Settings) -> list[tuple[int, int]]:
    return [(r.partition, r.offset) for r in read_topic(s, "inbox")]


def _run(
    s: Settings, names: ProjectionNames, sent_count: int, healthy: list[Sent], timeout_s: float
) -> tuple[Accounting, list[tuple[int, int]]]:
    """Run one worker and a live projector until every input is decided; return the accounting and the inbox."""
    inbox = _inbox(s)
    assert len(inbox) == sent_count, f"{len(inbox)} inbox records for {sent_count} sent"
    ends = {p: 0 for p in range(s.partitions)}
    for p, o in inbox:
        ends[p] = max(ends[p], o + 1)
    worker = build_worker(s, App(agent=EchoAgent(delay_s=0.0)))
    errors: list[Any] = []
    with projecting(s, names) as live, running(worker) as thread:
        try:
            want = {(h.conversation or "", h.submission_id or "") for h in healthy}
            _wait_all_decided(s, ends, want, timeout_s, live, errors)
        finally:
            if not thread.is_alive():
                errors.append("the worker thread ended")
        wait_projected(s, names, 60, live)
        promise("DUR-015.rebuild", live.alive(), f"the live projector died: {live.errors!r}")
    return _account(s), inbox


def _check_every_input_decided_once(acct: Accounting, inbox: list[tuple[int, int]]) -> None:
    missing = [ref for ref in inbox if ref not in acct.decided]
    twice = {ref: [type(e).__name__ for e in es] for ref, es in acct.decided.items() if len(es) != 1}
    promise("DUR-002.no-lost-input", not missing, f"inputs never decided: {missing[:10]}")
    assert not twice, f"inputs decided more than once: {list(twice.items())[:10]}"


# -- 1. the cases of issue 25 ------------------------------------------------------------------------------------


def test_hostile_ids_are_rejected_or_quarantined_bounded_and_their_neighbours_settle(settings: Settings) -> None:
    s = _topics(settings, 1)
    ok = [f"ok-{uuid.uuid4().hex[:6]}-{i}" for i in range(3)]
    hostile: list[Sent] = [
        _proposal_sent("conversation 400 KB", proposal("c" * 400_000)),  # first input of the partition
        _healthy(ok[0]),
        _proposal_sent("conversation NUL", proposal("conv\x00nul")),
        _proposal_sent("submission NUL", proposal(ok[1]).model_copy(update={"submission_id": "sub\x00nul"})),
        _proposal_sent("tool NUL", proposal(ok[1], tools=("lookup", "to\x00ol"))),
        _healthy(ok[1]),
        _proposal_sent("conversation 3 KB", proposal("x" * 3000)),
        _proposal_sent("submission 3 KB", proposal(ok[2]).model_copy(update={"submission_id": "s" * 3000})),
        Sent("undecodable, 1.2 MB key", None, None, b"k" * 1_200_000, b"\x7f" + b"not avro" * 64),
        _healthy(ok[2]),
    ]
    _produce(s, hostile, partition=0)
    healthy = [x for x in hostile if x.kind == "healthy"]
    expected_field = {
        "conversation 400 KB": "conversation_id",
        "conversation NUL": "conversation_id",
        "submission NUL": "submission_id",
        "tool NUL": "payload.tools_offered",
        "conversation 3 KB": "conversation_id",
        "submission 3 KB": "submission_id",
    }
    with fresh_projection(s.postgres_dsn) as names:
        acct, inbox = _run(s, names, len(hostile), healthy, timeout_s=60)
        _check_every_input_decided_once(acct, inbox)
        for (_, offset), sent in zip(inbox, hostile, strict=True):
            (event,) = acct.decided[(0, offset)]
            if sent.kind == "healthy":
                assert isinstance(event, SubmissionAdmitted), (sent.kind, event)
                (settled,) = acct.settlements[(sent.conversation or "", sent.submission_id or "")]
                assert settled.outcome is SettlementOutcome.COMPLETED
            elif sent.kind.startswith("undecodable"):
                assert isinstance(event, InputQuarantined), (sent.kind, event)
            else:
                promise(
                    "DUR-001.input-contract",
                    isinstance(event, SubmissionRejected) and event.field == expected_field[sent.kind],
                    f"{sent.kind}: decided {type(event).__name__} {getattr(event, 'field', '')}, not rejected naming "
                    f"{expected_field[sent.kind]}",
                )
        assert acct.largest_bad_batch_bytes < BOUND_BYTES, acct.largest_bad_batch_bytes
        check_clean(s, names, "DUR-015.rebuild")


# -- 2. the acceptance fuzz run -----------------------------------------------------------------------------------


#: Mutations that break the input contract: each must be rejected ``invalid``.
CONTRACT_BREACHES = frozenset({"nul", "control", "long", "3kb", "empty", "reserved", "tools-repeat", "tools-empty"})


def _mutated(rng: random.Random, conversations: list[str], healthy: list[Sent]) -> Sent:
    """One structurally mutated proposal (a contract breach, a broken digest or framing, a duplicate, a conflict)."""
    cid = rng.choice(conversations)
    p = proposal(cid, value={"m": rng.randrange(1000)})
    kind = rng.choice(
        ["nul", "control", "long", "3kb", "empty", "reserved", "surrogate-bytes", "tools-repeat", "tools-empty",
         "digest", "flip", "cut", "misrouted", "duplicate", "conflict", "boundary-ok"]
    )  # fmt: skip
    field = rng.choice(["conversation_id", "submission_id", "idempotency_key", "principal"])
    breach: dict[str, Callable[[str], str]] = {
        "nul": lambda v: v[:3] + "\x00" + v[3:],
        "control": lambda v: v + rng.choice(["\n", "\x1b", "\x7f", "\x85"]),
        "long": lambda v: v + "y" * 257,
        "3kb": lambda v: "z" * 3000,
        "empty": lambda v: "",
        "reserved": lambda v: "~quarantine/0" if field == "conversation_id" else v + "\x01",
        "boundary-ok": lambda v: (v + "é" * 256)[:256],
    }
    if kind in breach:  # the key is the (possibly breached) conversation id, as a client would send it
        return _proposal_sent(f"{kind}:{field}", p.model_copy(update={field: breach[kind](getattr(p, field))}))
    if kind in ("tools-repeat", "tools-empty"):
        tools = ("a", "a") if kind == "tools-repeat" else ("a", "")
        payload = SubmissionPayload(input_json=p.payload.input_json, tools_offered=tools)
        return _proposal_sent(
            kind, p.model_copy(update={"payload": payload, "payload_digest": payload_digest(payload)})
        )
    if kind == "digest":
        return _proposal_sent(kind, p.model_copy(update={"payload_digest": "0" * 64}))
    if kind == "surrogate-bytes":  # a conversation id that is not UTF-8: undecodable
        value = CODEC.encode(p.model_copy(update={"conversation_id": cid[:-1] + "\u0100"}))
        return Sent(kind, None, None, cid.encode(), value.replace("\u0100".encode(), b"\xc4\x20", 1))
    if kind in ("flip", "cut"):
        broken = bytearray(CODEC.encode(p))
        at = rng.randrange(len(broken))
        if kind == "flip":
            broken[at] ^= rng.randrange(1, 256)
        else:
            del broken[at:]
        return Sent(kind, None, None, cid.encode(), bytes(broken))
    if kind == "misrouted":
        return _proposal_sent(kind, p, key=(cid + "-elsewhere").encode())
    original = rng.choice(healthy)
    decoded = CODEC.decode(original.value)
    assert isinstance(decoded, SubmissionProposed)
    if kind == "duplicate":  # the same key and payload: a duplicate receipt pointing at the original
        return _proposal_sent(kind, decoded.model_copy(update={"submission_id": str(uuid.uuid4())}))
    payload = SubmissionPayload(input_json=canonical_json({"other": 1}), tools_offered=())
    conflict = decoded.model_copy(
        update={"submission_id": str(uuid.uuid4()), "payload": payload, "payload_digest": payload_digest(payload)}
    )
    return _proposal_sent(kind, conflict)


def test_fuzz_random_and_mutated_inputs_among_healthy_submissions(settings: Settings) -> None:
    seed = int(os.environ.get("SETTLED_TEST_SEED", time.time_ns() % 1_000_000))
    print(f"fuzz seed {seed} (SETTLED_TEST_SEED={seed} replays it)")
    rng = random.Random(seed)
    s = _topics(settings, 3)
    conversations = [f"fz-{seed}-{i}" for i in range(25)]
    healthy = [_healthy(conversations[i % len(conversations)]) for i in range(100)]
    randoms = [
        Sent("random", None, None, rng.choice([None, b"", rng.randbytes(rng.randrange(1, 40))]),
             rng.randbytes(rng.randrange(0, 300)))
        for _ in range(1000)
    ]  # fmt: skip
    stream: list[Sent] = list(randoms)
    for h in healthy:  # healthy ones in order (a conversation's turns keep their order), at random places
        stream.insert(rng.randrange(len(stream) + 1), h)
    mutated: list[Sent] = []
    while len(mutated) < 200:
        at = rng.randrange(len(stream) + 1)
        before = [x for x in stream[:at] if x.kind == "healthy"]
        if not before:
            continue  # a duplicate or conflict needs an earlier original
        m = _mutated(rng, conversations, before)
        mutated.append(m)
        stream.insert(at, m)
    assert len(stream) == 1300
    _produce(s, stream)

    with fresh_projection(s.postgres_dsn) as names:
        acct, inbox = _run(s, names, len(stream), healthy, timeout_s=120)
        _check_every_input_decided_once(acct, inbox)
        outcomes: Counter[str] = Counter()
        for h in healthy:
            got = acct.settlements.get((h.conversation or "", h.submission_id or ""), [])
            promise("DUR-002.no-lost-input", len(got) == 1, f"healthy {h.submission_id}: {len(got)} settlements")
        for events in acct.decided.values():
            (event,) = events
            if isinstance(event, SubmissionRejected):
                assert event.reason and event.detail, event
                outcomes[f"rejected {event.reason.value}"] += 1
            elif isinstance(event, InputQuarantined):
                assert event.reason and event.detail, event
                outcomes[f"quarantined {event.reason.value}"] += 1
            else:
                outcomes[type(event).__name__] += 1
        breaches = [m for m in mutated if m.kind.split(":")[0] in CONTRACT_BREACHES]
        print(f"outcomes: {dict(outcomes)}; {len(breaches)} contract breaches among {len(mutated)} mutated")
        promise(
            "DUR-001.input-contract",
            outcomes["rejected invalid"] >= len(breaches),
            f"{len(breaches)} proposals break the input contract, {outcomes['rejected invalid']} rejected invalid",
        )
        if any(m.kind == "duplicate" for m in mutated):
            assert outcomes["SubmissionDuplicate"] >= 1, outcomes
        assert acct.largest_bad_batch_bytes < BOUND_BYTES, acct.largest_bad_batch_bytes
        check_clean(s, names, "DUR-015.rebuild")
