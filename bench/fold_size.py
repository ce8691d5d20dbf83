"""Benchmark: the protocol fold's CPU per batch by the number of conversations its partition holds (issue 24).

    .venv/bin/python bench/fold_size.py [--sizes 1000,10000,100000] [--batches 2000]

A partition's state keeps every conversation it ever held, so whatever a fold does per batch in proportion to them
grows with a worker's history. Per size: a partition state with that many conversations (one admitted submission
each, folded once with `settled.protocol.fold`), then ``--batches`` single-conversation batches (a submission's
admission to a new conversation, as the throughput case's turns have, and its attempt start), each folded with
`settled.protocol.apply` as the worker's owner does when it stages a batch: CPU microseconds per batch (the median of
5 rounds). No Kafka. Results: docs/architecture.md, "Records per transaction (issue 24 item 3)".
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout: python bench/fold_size.py
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import load_average, table

from settled.protocol import PartitionState, admit, apply, claim, fold, start_attempt
from settled.schemas import InputRef, LogBatch, SubmissionPayload, SubmissionProposed, canonical_json, payload_digest

T0 = datetime(2026, 1, 1, tzinfo=UTC)
INBOX = "bench-fold.inbox"


def _batch(state: PartitionState, cid: str, events: Sequence[object], epoch: int) -> LogBatch:
    conv = state.conversation(cid)
    return LogBatch.seal(
        conversation_id=cid,
        batch_id=f"{cid}:{conv.last_event_seq + 1}",
        first_event_seq=conv.last_event_seq + 1,
        owner_epoch=epoch,
        prev_batch_digest=conv.last_batch_digest,
        recorded_at=T0,
        events=events,  # type: ignore[arg-type]
    )


def _turn_batches(base: PartitionState, i: int, epoch: int) -> list[LogBatch]:
    """The admission and attempt-start batches of submission ``i`` in a new conversation (made on ``base``, a claimed
    partition without conversations, so making them does not depend on the partition's size)."""
    cid, sid = f"conv-{i}", f"sub-{i}"
    body = SubmissionPayload(input_json=canonical_json({"k": 5}), tools_offered=())
    proposal = SubmissionProposed(
        submission_id=sid,
        principal="bench",
        conversation_id=cid,
        idempotency_key=f"key-{i}",
        payload=body,
        payload_digest=payload_digest(body),
        proposed_at=T0,
    )
    ref = InputRef(topic=INBOX, partition=0, offset=i)
    admitted = _batch(base, cid, admit(base.conversation(cid), proposal, ref, T0).events, epoch)
    after = apply(base, admitted)
    started = _batch(after, cid, start_attempt(after.conversation(cid), sid, f"att-{i}", epoch).events, epoch)
    return [admitted, started]


def measure(size: int, batches: int) -> float:
    """CPU microseconds per batch folded on a partition of ``size`` conversations (median of 5 rounds)."""
    state = PartitionState(partition=0)
    genesis_claim = claim(state, "bench", T0)
    state = apply(state, _batch(state, "~partition/0", [genesis_claim], genesis_claim.owner_epoch))
    epoch = genesis_claim.owner_epoch
    base = state
    # Folded in one go (a restore), so the setup stays linear in the size.
    state = fold(base, [_turn_batches(base, i, epoch)[0] for i in range(size)])
    rounds = []
    next_id = size
    for _ in range(5):
        made = []
        for _ in range(batches // 2):
            made.extend(_turn_batches(base, next_id, epoch))
            next_id += 1
        folded = state
        t0 = time.process_time()
        for batch in made:
            folded = apply(folded, batch)
        rounds.append((time.process_time() - t0) * 1e6 / len(made))
    return statistics.median(rounds)


def main(argv: Sequence[str] | None = None) -> int:
    """Print the table; return the exit status."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1000,10000,100000", help="conversations in the partition")
    ap.add_argument("--batches", type=int, default=2000, help="batches folded per round")
    args = ap.parse_args(argv)
    print(f"# fold CPU per batch by partition size; {load_average()}\n")
    rows = [[f"{size:,}", f"{measure(size, args.batches):.1f}"] for size in (int(s) for s in args.sizes.split(","))]
    print(table(["conversations in the partition", "CPU us per batch folded"], rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
