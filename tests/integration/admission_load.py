"""The admission load of issue 5's acceptance: a seeded mix of submissions, duplicates and conflicts, and its checks.

`make_load` builds, from a seed, proposals over many conversations: originals (one per distinct idempotency key),
duplicates (the same key and payload under a new submission id, as another producer retrying would send), exact
re-sends (the very same proposal again, as a client retrying after a lost answer would) and conflicts (the same key,
another payload). Duplicates and conflicts follow their original in the conversation's order; some follow it
immediately, so the two land in one poll batch and the second is answered from the pending overlay (docs/design.md §3).
Conversations are interleaved at random, each keeping its own order.

`check_load` reads ``settled.log``, ``settled.receipts`` and ``settled.settlements`` read_committed and asserts the
promises (`tests._promise.promise`, so a fault switch is caught by name):

* ``DUR-001.key-once`` — every distinct key admitted exactly once, with the sequence of its place in its
  conversation; every inbox input decided by exactly one canonical event;
* ``DUR-001.duplicate-receipt`` — every duplicate and re-send answered ``duplicate`` pointing at the original and its
  sequence, every original answered ``admitted``, exactly one receipt per input;
* ``DUR-001.conflict-rejected`` — every conflict rejected ``idempotency_conflict`` naming the key;
* ``DUR-002.one-settlement`` — exactly one settlement per admitted submission, none for anything else;
* ``DUR-004.fifo`` — per conversation, settlement order equals admitted order.
"""

from __future__ import annotations

import random
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition

from settled._settings import Settings
from settled.schemas import (
    InputRef,
    LogBatch,
    Receipt,
    ReceiptOutcome,
    SettlementOutcome,
    SettlementRecord,
    SubmissionAdmitted,
    SubmissionDuplicate,
    SubmissionProposed,
    SubmissionRejected,
    verify_chain,
)
from settled.testing import WorkerProcess
from tests._promise import promise
from tests.harness.factories import proposal
from tests.harness.workers import start_worker
from tests.integration.helpers import CODEC, produce_inbox, read_topic

PRINCIPAL = "load-tester"


def make_proposal(conversation: str, key: str, value: object, principal: str = PRINCIPAL) -> SubmissionProposed:
    """Return a proposal of ``value`` under ``key`` with a fresh submission id (the load's principal by default)."""
    return proposal(conversation, key, value, principal=principal)


@dataclass
class Item:
    """One proposal of the load and what its receipt must say.

    Attributes:
        proposal: What is produced.
        kind: ``original`` | ``duplicate`` | ``resend`` | ``conflict``.
        original: For the others, the original proposal they repeat or contradict.
        seq: For an original, its expected submission sequence (its place among its conversation's originals).
    """

    proposal: SubmissionProposed
    kind: str
    original: SubmissionProposed | None = None
    seq: int = 0


@dataclass
class Load:
    """A generated load: items in inbox order, and the originals per conversation in admitted order."""

    seed: int
    items: list[Item]
    originals: dict[str, list[SubmissionProposed]] = field(default_factory=dict)

    @property
    def count(self) -> Counter[str]:
        """How many items of each kind."""
        return Counter(i.kind for i in self.items)


def make_load(
    seed: int, *, conversations: int, total: int, duplicates: int, resends: int, conflicts: int, adjacent: int
) -> Load:
    """Build a load of ``total`` proposals from ``seed``.

    Args:
        seed: Makes the load (conversation names excepted, they are random per call) replayable.
        conversations: How many conversations.
        total: Proposals in all.
        duplicates: Same key and payload, new submission id.
        resends: The very same proposal again.
        conflicts: Same key, another payload.
        adjacent: How many of the duplicates follow their original immediately (same poll batch).

    Returns:
        The load.
    """
    rng = random.Random(seed)
    tag = uuid.uuid4().hex[:6]
    convs = [f"conv-{tag}-{c:02d}" for c in range(conversations)]
    n_originals = total - duplicates - resends - conflicts
    streams: dict[str, list[Item]] = {c: [] for c in convs}
    originals: dict[str, list[SubmissionProposed]] = {c: [] for c in convs}
    for n in range(n_originals):
        conv = convs[n % conversations] if n < conversations else rng.choice(convs)
        key = f"k-{n}"
        p = make_proposal(conv, key, {"n": n, "key": key})
        originals[conv].append(p)
        streams[conv].append(Item(p, "original", seq=len(originals[conv])))
    repeats = ["duplicate"] * duplicates + ["resend"] * resends + ["conflict"] * conflicts
    rng.shuffle(repeats)
    next_to: list[tuple[str, SubmissionProposed]] = []
    for i, kind in enumerate(repeats):
        conv = rng.choice(convs)
        stream = streams[conv]
        at = rng.randrange(len(stream))
        while stream[at].kind != "original":
            at -= 1  # index 0 is always an original
        orig = stream[at].proposal
        if kind == "duplicate":
            p = orig.model_copy(update={"submission_id": str(uuid.uuid4()), "proposed_at": datetime.now(UTC)})
            if len(next_to) < adjacent:
                next_to.append((conv, p))
                continue
        elif kind == "resend":
            p = orig
        else:
            p = make_proposal(conv, orig.idempotency_key, {"other": i})
        stream.insert(rng.randint(at + 1, len(stream)), Item(p, kind, original=orig))
    # Last, so that nothing comes between: duplicates right after their original (one poll batch, docs/design.md §3).
    for conv, p in next_to:
        stream = streams[conv]
        at = next(
            n
            for n, it in enumerate(stream)
            if it.kind == "original" and it.proposal.idempotency_key == p.idempotency_key
        )
        orig = stream[at].proposal
        stream.insert(at + 1, Item(p, "duplicate", original=orig))
    # Interleave the conversations at random, each keeping its order.
    order = [c for c in convs for _ in streams[c]]
    rng.shuffle(order)
    cursors = dict.fromkeys(convs, 0)
    items: list[Item] = []
    for c in order:
        items.append(streams[c][cursors[c]])
        cursors[c] += 1
    return Load(seed=seed, items=items, originals=originals)


def produce_load(s: Settings, load: Load, **producer_conf: object) -> None:
    """Produce every item to the inbox with settled's murmur2 partitioner, in order."""
    produce_inbox(
        s, [(i.proposal.conversation_id.encode(), CODEC.encode(i.proposal)) for i in load.items], **producer_conf
    )


def log_batches(s: Settings) -> list[tuple[int, int, LogBatch]]:
    """Every committed ``settled.log`` batch as (partition, offset, batch)."""
    return [(r.partition, r.offset, CODEC.decode_batch(r.value, offset=r.offset).batch) for r in read_topic(s, "log")]


def receipts(s: Settings) -> list[Receipt]:
    """Every committed receipt, in partition and offset order."""
    out = []
    for r in read_topic(s, "receipts"):
        rec = CODEC.decode(r.value)
        assert isinstance(rec, Receipt), f"not a receipt on the receipts topic: {type(rec).__name__}"
        out.append(rec)
    return out


def settlements(s: Settings) -> list[SettlementRecord]:
    """Every committed settlement record, in partition and offset order."""
    out = []
    for r in read_topic(s, "settlements"):
        rec = CODEC.decode(r.value)
        assert isinstance(rec, SettlementRecord), f"not a settlement record: {type(rec).__name__}"
        out.append(rec)
    return out


def progress(s: Settings) -> tuple[int, int]:
    """(receipts, settlements) committed so far."""
    return len(read_topic(s, "receipts")), len(read_topic(s, "settlements"))


def keys_admitted_once(s: Settings, load: Load) -> tuple[bool, str]:
    """Whether every distinct key of the load was admitted exactly once (and nothing else was), and what was seen.

    Args:
        s: The test's settings.
        load: What was produced.

    Returns:
        (holds, a description of the difference for the failure report).
    """
    admitted = [e for _, _, b in log_batches(s) for e in b.events if isinstance(e, SubmissionAdmitted)]
    got = Counter((e.conversation_id, e.principal, e.idempotency_key) for e in admitted)
    want = Counter((p.conversation_id, p.principal, p.idempotency_key) for ps in load.originals.values() for p in ps)
    detail = (
        f"(load seed {load.seed}) keys admitted other than once each: missing "
        f"{sorted(k[2] for k in want - got)[:10]}, extra {sorted((k[2], n) for k, n in (got - want).items())[:10]} "
        f"({len(admitted)} SubmissionAdmitted for {len(want)} keys)"
    )
    return got == want, detail


def check_load(s: Settings, load: Load, *, allow_failed: bool = False) -> None:
    """Assert the load's promises against the committed topics (module docstring).

    Args:
        s: The test's settings.
        load: What was produced.
        allow_failed: Accept a ``failed`` settlement whose error says the attempts ran out (a chaos run may kill
            the worker during one submission's attempts more than ``max_attempts`` times); exactly one settlement
            is still required.
    """
    where = f"(load seed {load.seed})"
    batches = log_batches(s)
    # Chain: each conversation's batches link up without gaps or repeats.
    by_conv: dict[str, list[tuple[int, LogBatch]]] = defaultdict(list)
    for _, offset, b in batches:
        by_conv[b.conversation_id].append((offset, b))
    for conv_batches in by_conv.values():
        verify_chain(conv_batches)
    events = [e for _, _, b in batches for e in b.events]
    admitted = [e for e in events if isinstance(e, SubmissionAdmitted)]
    ok, detail = keys_admitted_once(s, load)
    promise("DUR-001.key-once", ok, detail)
    seqs = {e.submission_id: e.submission_seq for e in admitted}
    want_seqs = {p.submission_id: n + 1 for ps in load.originals.values() for n, p in enumerate(ps)}
    promise("DUR-001.key-once", seqs == want_seqs, f"{where} admitted sequences differ from the inbox order")
    decided = Counter(
        (e.input_ref.partition, e.input_ref.offset)
        for e in events
        if isinstance(getattr(e, "input_ref", None), InputRef) and e.input_ref.topic == s.topic("inbox")
    )
    twice = {k: n for k, n in decided.items() if n > 1}
    promise("DUR-001.key-once", not twice, f"{where} inbox inputs decided more than once: {twice}")
    promise(
        "DUR-001.key-once",
        len(decided) == len(load.items),
        f"{where} {len(decided)} inbox inputs decided, {len(load.items)} produced",
    )
    dup_events = Counter(e.original_submission_id for e in events if isinstance(e, SubmissionDuplicate))
    want_dups = Counter(
        i.original.submission_id for i in load.items if i.kind in ("duplicate", "resend") and i.original
    )
    promise("DUR-001.duplicate-receipt", dup_events == want_dups, f"{where} SubmissionDuplicate events {dup_events}")

    got = receipts(s)
    by_request: dict[str, list[Receipt]] = defaultdict(list)
    for r in got:
        by_request[r.request_id].append(r)
    want_receipts: Counter[str] = Counter(i.proposal.submission_id for i in load.items)
    promise(
        "DUR-001.duplicate-receipt",
        Counter({k: len(v) for k, v in by_request.items()}) == want_receipts,
        f"{where} not exactly one receipt per input: {len(got)} receipts for {len(load.items)} inputs; missing "
        f"{sorted(set(want_receipts) - set(by_request))[:5]}",
    )
    for item in load.items:
        rs = by_request[item.proposal.submission_id]
        if item.kind == "original":
            ok = any(r.outcome is ReceiptOutcome.ADMITTED and r.submission_seq == item.seq for r in rs)
            promise("DUR-001.duplicate-receipt", ok, f"{where} original {item.proposal.idempotency_key}: {rs}")
        elif item.kind in ("duplicate", "resend"):
            assert item.original is not None
            orig_seq = want_seqs[item.original.submission_id]
            answers = [(r.outcome.value, r.original_submission_id, r.submission_seq) for r in rs]
            ok = any(
                r.outcome is ReceiptOutcome.DUPLICATE
                and r.original_submission_id == item.original.submission_id
                and r.submission_seq == orig_seq
                for r in rs
            )
            promise(
                "DUR-001.duplicate-receipt",
                ok,
                f"{where} {item.kind} of key {item.proposal.idempotency_key} (original "
                f"{item.original.submission_id}, seq {orig_seq}) got {answers}",
            )
        else:
            (r,) = rs
            ok = (
                r.outcome is ReceiptOutcome.REJECTED
                and (r.reason or "").startswith("idempotency_conflict")
                and repr(item.proposal.idempotency_key) in (r.reason or "")
            )
            promise("DUR-001.conflict-rejected", ok, f"{where} conflict {item.proposal.idempotency_key}: {r}")
    rejected = [e for e in events if isinstance(e, SubmissionRejected)]
    promise(
        "DUR-001.conflict-rejected",
        len(rejected) == load.count["conflict"],
        f"{where} {len(rejected)} SubmissionRejected for {load.count['conflict']} conflicts",
    )

    settled = settlements(s)
    counts = Counter(r.submission_id for r in settled)
    want = Counter(want_seqs.keys())
    promise(
        "DUR-002.one-settlement",
        counts == want,
        f"{where} settlements not one per admitted submission: missing {sorted(want - counts)[:5]}, extra "
        f"{sorted((counts - want).items())[:5]}",
    )
    bad = [r for r in settled if r.outcome is not SettlementOutcome.COMPLETED]
    if allow_failed:
        bad = [r for r in bad if r.outcome is not SettlementOutcome.FAILED]
    assert not bad, f"{where} settlements not completed: {bad[:3]}"
    order: dict[str, list[str]] = defaultdict(list)
    for r in settled:
        order[r.conversation_id].append(r.submission_id)
    admitted_order: dict[str, list[str]] = defaultdict(list)
    for e in sorted(admitted, key=lambda e: (e.conversation_id, e.submission_seq)):
        admitted_order[e.conversation_id].append(e.submission_id)
    wrong = {c: (order[c], admitted_order[c]) for c in admitted_order if order[c] != admitted_order[c]}
    promise("DUR-004.fifo", not wrong, f"{where} settlement order differs from admitted order in {sorted(wrong)[:3]}")


# -- worker processes --------------------------------------------------------------------------------------------


def spawn_worker(
    s: Settings, log_path: Path, *, failpoint_env: dict[str, str] | None = None, worker_id: str = ""
) -> WorkerProcess:
    """Start a ``settled worker`` with the echo app (no delay) on the test's namespace (`WorkerProcess`).

    Args:
        s: The test's settings (namespace, bootstrap).
        log_path: Where the worker's JSON-line log goes (a file, never a pipe: a full pipe would block the worker).
        failpoint_env: ``FailpointControl.env(...)`` for a worker armed at failpoints.
        worker_id: The worker's id (default: random).

    Returns:
        The process.
    """
    env = {"SETTLED_ECHO_DELAY_S": "0", **(failpoint_env or {})}
    return start_worker(s, log_path, name=worker_id, env=env)


def stop_worker(proc: WorkerProcess, timeout_s: float = 30.0) -> int:
    """SIGTERM (a graceful revoke), then SIGKILL if it does not exit in time; return its exit code."""
    return proc.stop(timeout_s)


def log_tail(log_path: Path, lines: int = 30) -> str:
    """The last lines of a worker's log, for a failure message."""
    if not log_path.exists():
        return "(no log)"
    return "\n".join(log_path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])


def committed_input_offset(s: Settings, partition: int) -> int:
    """The workers' committed offset of ``settled.inbox[partition]`` (-1001 when none)."""
    c = Consumer({"bootstrap.servers": s.kafka_bootstrap, "group.id": f"{s.namespace}.{s.app_id}.workers"})
    try:
        (tp,) = c.committed([TopicPartition(s.topic("inbox"), partition)], timeout=s.kafka_call_timeout_s)
        return int(tp.offset)
    finally:
        c.close()
