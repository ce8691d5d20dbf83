"""Property test of the pure core: random interleavings through the decisions and the fold (issue 5 acceptance).

A simulated owner of one partition consumes a random inbox (proposals with duplicate and conflicting keys, aborts,
repeated aborts, aborts of nothing, resolutions) and takes random worker steps (schedule/start, tool calls, tool
timeouts, finishes, graceful interrupts), group-committing several decisions per transaction through the pending
overlay (docs/design.md §3), with random transaction aborts and crashes (rewind the input, restore by fold, claim a new
epoch, classify recovery). Checked on what commits:

* every transition taken is an edge of `EDGES` whose cause is the event that took it, and each submission's
  transitions chain from Proposed;
* never two terminal outcomes for one submission; one settlements record per canonical settlement;
* at most one active submission per conversation at every fold (DUR-005), starts in FIFO order (DUR-004);
* every inbox input decided exactly once (one canonical event carrying its offset, one receipt), re-read inputs
  skipped; every key admitted once, duplicates answered with the original, conflicts rejected (DUR-001);
* an abort's reply names the outcome that won (DUR-012); an abort of a queued submission settles it in the same
  batch, without an attempt (docs/semantics.md §13);
* a stale attempt appends nothing after a claim (docs/semantics.md §6);
* after a final drain (every input decided, runs finished, Unknowns resolved) every admitted submission has exactly
  one settlement (DUR-002, DUR-014);
* restoring by `fold` from the committed batches equals the state built batch by batch.

The minimal recovery classifier here stands in for `settled.protocol.classify`; random operations are weighted op
codes (see ``WEIGHTS``) so that long runs stay productive and failures shrink well.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from settled.protocol import (
    EDGES,
    TERMINAL_STATES,
    Decision,
    PartitionState,
    SettleAborted,
    StartAttempt,
    SubmissionState,
    Transition,
    abort,
    admit,
    apply_traced,
    claim,
    fold,
    interrupt,
    resolve,
    schedule,
    start_attempt,
    terminalize,
)
from settled.schemas import (
    AbortRecorded,
    AbortRequested,
    AttemptStarted,
    CommandRejected,
    CommandRejectReason,
    InputRef,
    LogBatch,
    LogEvent,
    OwnershipClaimed,
    Receipt,
    ReceiptOutcome,
    RecoveryDecision,
    RecoveryDecisionKind,
    ResolutionKind,
    ResolveUnknown,
    Settlement,
    SettlementOutcome,
    SettlementRecord,
    SubmissionAdmitted,
    SubmissionDuplicate,
    SubmissionProposed,
    SubmissionRejected,
    SubmissionRejectReason,
    ToolCallPrepared,
    ToolCallSettled,
    ToolCallUnknown,
    json_digest,
)

from ._sim import INBOX, PARTITION_CID, T0, proposal

S = SubmissionState
CONVS = ("c0", "c1")
KEYS = ("k0", "k1", "k2", "k3")
VALUES = ("v0", "v1")
ACTIVE_STATES = frozenset({S.RUNNING, S.RECOVERY, S.UNKNOWN, S.TERMINALIZING})

# An operation is (code, arg): ``code`` picks the kind through the weights below (so long runs stay productive and
# shrink towards the first kinds), ``arg`` its parameters.
WEIGHTS = (
    ("work", 40),  # a worker step: one of the actions possible now (start, tool call, finish, classify, ...)
    ("commit", 12),
    ("consume", 14),
    ("propose", 16),
    ("abort", 6),
    ("abort_tx", 3),
    ("crash", 3),
)
KINDS = [name for name, weight in WEIGHTS for _ in range(weight)]
operations = st.lists(st.tuples(st.integers(0, len(KINDS) - 1), st.integers(0, 2**16 - 1)), min_size=40, max_size=200)

InboxRecord = SubmissionProposed | AbortRequested | ResolveUnknown


@dataclass
class Pending:
    batch: LogBatch
    trace: tuple[Transition, ...]
    receipt: Receipt | None
    settlement: SettlementRecord | None


@dataclass
class Owner:
    """One partition's log, its inbox and a simulated owner (committed state + pending overlay)."""

    inbox: list[tuple[str, InboxRecord]] = field(default_factory=list)
    position: int = 0
    committed_position: int = 0
    committed: PartitionState = field(default_factory=lambda: PartitionState(partition=0))
    scratch: PartitionState = field(default_factory=lambda: PartitionState(partition=0))
    epoch: int = 0
    pending: list[Pending] = field(default_factory=list)
    batches: list[LogBatch] = field(default_factory=list)
    trace: list[Transition] = field(default_factory=list)
    traces: list[tuple[Transition, ...]] = field(default_factory=list)  # per committed batch
    receipts: list[Receipt] = field(default_factory=list)
    settlements: list[SettlementRecord] = field(default_factory=list)
    proposed: dict[str, list[tuple[str, str]]] = field(default_factory=lambda: defaultdict(list))  # cid -> [(sid, key)]
    aborts: dict[str, list[AbortRequested]] = field(default_factory=lambda: defaultdict(list))
    counter: int = 0

    def new_id(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    # -- the log ---------------------------------------------------------------------------------------------

    def stage(self, cid: str, events: tuple[LogEvent, ...], decision: Decision | None = None) -> None:
        conv = self.scratch.conversation(cid)
        batch = LogBatch.seal(
            conversation_id=cid,
            batch_id=self.new_id("b"),
            first_event_seq=conv.last_event_seq + 1,
            owner_epoch=self.epoch,
            prev_batch_digest=conv.last_batch_digest,
            recorded_at=T0,
            events=events,
        )
        self.scratch, trace = apply_traced(self.scratch, batch)
        check_one_active(self.scratch)
        receipt = None if decision is None else decision.receipt
        settlement = None if decision is None else decision.settlement
        self.pending.append(Pending(batch, trace, receipt, settlement))

    def decided(self, cid: str, decision: Decision) -> None:
        self.stage(cid, decision.events, decision)

    def commit(self) -> None:
        for item in self.pending:
            self.batches.append(item.batch)
            self.trace.extend(item.trace)
            self.traces.append(item.trace)
            if item.receipt is not None:
                self.receipts.append(item.receipt)
            if item.settlement is not None:
                self.settlements.append(item.settlement)
        self.pending.clear()
        self.committed = self.scratch
        self.committed_position = max(self.committed_position, self.position)

    def abort_tx(self) -> None:
        self.pending.clear()
        self.scratch = self.committed
        self.position = self.committed_position  # rewind to the committed offset

    def crash(self, rewind: int) -> None:
        self.abort_tx()
        self.position = max(0, self.committed_position - rewind)  # the committed offset is a low watermark
        restored = fold(PartitionState(partition=0), self.batches)
        assert restored == self.committed, "restore by fold differs from the state built batch by batch"
        self.scratch = self.committed = restored
        event = claim(restored, f"w{self.epoch + 1}", T0)
        self.epoch = event.owner_epoch
        self.stage(PARTITION_CID, (event,))
        self.commit()

    # -- inputs ----------------------------------------------------------------------------------------------

    def consume(self, count: int) -> None:
        for _ in range(count):
            if self.position >= len(self.inbox):
                return
            offset = self.position
            self.position += 1
            cid, record = self.inbox[offset]
            ref = InputRef(topic=INBOX, partition=0, offset=offset)
            if self.scratch.is_decided(ref, cid):
                assert offset < self.committed_position or any(
                    _input_offset(e) == offset for p in self.pending for e in p.batch.events
                )
                continue
            assert offset >= self.committed_position, f"input {offset} below the committed offset was never decided"
            conv = self.scratch.conversation(cid)
            if isinstance(record, SubmissionProposed):
                decision = admit(conv, record, ref, T0)
            elif isinstance(record, AbortRequested):
                decision = abort(conv, record, ref, T0)
            else:
                decision = resolve(conv, record, ref, T0)
            self.decided(cid, decision)

    def propose(self, cid: str, key: str, value: str, retry: bool) -> None:
        earlier = [sid for sid, k in self.proposed[cid] if k == key]
        sid = earlier[-1] if retry and earlier else self.new_id("s")
        self.proposed[cid].append((sid, key))
        self.inbox.append((cid, proposal(sid, key, conversation_id=cid, value=value)))

    def request_abort(self, cid: str, index: int, repeat: bool) -> None:
        if repeat and self.aborts[cid]:
            command = self.aborts[cid][-1]
        else:
            sids = [sid for sid, _ in self.proposed[cid]]
            target = sids[index] if index < len(sids) else "ghost"
            command = AbortRequested(
                command_id=self.new_id("x"),
                principal="alice",
                conversation_id=cid,
                submission_id=target,
                reason="stop",
                requested_at=T0,
            )
            self.aborts[cid].append(command)
        self.inbox.append((cid, command))

    def request_resolution(self, cid: str, kind: ResolutionKind, completed: bool) -> None:
        conv = self.scratch.conversation(cid)
        active = conv.active()
        target, call = ("ghost", "call-x")
        if active is not None and active.unknown_calls:
            target, call = active.submission_id, sorted(active.unknown_calls)[0]
        outcome = None
        if kind is ResolutionKind.OUTCOME_FOR_SUBMISSION:
            outcome = SettlementOutcome.COMPLETED if completed else SettlementOutcome.FAILED
        command = ResolveUnknown(
            command_id=self.new_id("r"),
            principal="operator",
            conversation_id=cid,
            submission_id=target,
            call_id=call,
            kind=kind,
            outcome=outcome,
            result_json=None if kind is ResolutionKind.SAFE_TO_RETRY else '"result"',
            key_id="ops",
            signature=b"verified",
            requested_at=T0,
        )
        self.inbox.append((cid, command))

    # -- the worker ------------------------------------------------------------------------------------------

    def step(self, cid: str) -> None:
        conv = self.scratch.conversation(cid)
        active = conv.active()
        if active is not None and active.state is S.RECOVERY:
            self.classify(cid)
            return
        nxt = schedule(conv)
        if isinstance(nxt, SettleAborted):
            self.decided(cid, terminalize(conv, nxt.submission_id, SettlementOutcome.ABORTED, T0))
        elif isinstance(nxt, StartAttempt):
            self.decided(cid, start_attempt(conv, nxt.submission_id, self.new_id("a"), self.epoch))

    def classify(self, cid: str) -> None:
        """A minimal recovery classifier (the real one is issue 6's): in doubt → Unknown, else resume or abort."""
        sub = self.scratch.conversation(cid).active()
        assert sub is not None and sub.state is S.RECOVERY
        sid = sub.submission_id
        if sub.open_calls or sub.unknown_calls:
            marks = tuple(
                ToolCallUnknown(submission_id=sid, call_id=c, reason="in doubt") for c in sorted(sub.open_calls)
            )
            calls = tuple(sorted(sub.open_calls | sub.unknown_calls))
            decision = RecoveryDecision(
                submission_id=sid, decision=RecoveryDecisionKind.UNKNOWN, reason="in doubt", call_ids=calls
            )
            self.stage(cid, (*marks, decision))
        elif sub.abort_requested:
            decision = RecoveryDecision(
                submission_id=sid, decision=RecoveryDecisionKind.TERMINALIZE, reason="abort recorded", call_ids=()
            )
            self.stage(cid, (decision,))
            self.decided(cid, terminalize(self.scratch.conversation(cid), sid, SettlementOutcome.ABORTED, T0))
        else:
            decision = RecoveryDecision(
                submission_id=sid, decision=RecoveryDecisionKind.RESUME, reason="checkpoint", call_ids=()
            )
            self.stage(cid, (decision,))

    def running(self, cid: str) -> Any:
        active = self.scratch.conversation(cid).active()
        return active if active is not None and active.state is S.RUNNING else None

    def prepare(self, cid: str) -> None:
        sub = self.running(cid)
        if sub is None:
            return
        call_id = self.new_id("call")
        self.stage(
            cid,
            (
                ToolCallPrepared(
                    submission_id=sub.submission_id,
                    run_id=sub.submission_id,
                    attempt_id=sub.attempt_id,
                    call_id=call_id,
                    ordinal=0,
                    tool="t",
                    args_json="{}",
                    args_digest=json_digest("{}"),
                    idempotency_key=call_id,
                    owner_epoch=self.epoch,
                ),
            ),
        )

    def tool_done(self, cid: str) -> None:
        sub = self.running(cid)
        if sub is None or not sub.open_calls:
            return
        call = sorted(sub.open_calls)[0]
        settled = ToolCallSettled(
            submission_id=sub.submission_id,
            attempt_id=sub.attempt_id,
            call_id=call,
            result_json="1",
            result_digest=json_digest("1"),
        )
        self.stage(cid, (settled,))

    def tool_timeout(self, cid: str) -> None:
        sub = self.running(cid)
        if sub is None or not sub.open_calls:
            return
        call = sorted(sub.open_calls)[0]
        self.stage(cid, (ToolCallUnknown(submission_id=sub.submission_id, call_id=call, reason="timeout"),))
        self.classify(cid)

    def finish(self, cid: str, outcome: SettlementOutcome) -> None:
        sub = self.running(cid)
        if sub is None or sub.open_calls:
            return
        conv = self.scratch.conversation(cid)
        if outcome is SettlementOutcome.COMPLETED:
            decision = terminalize(conv, sub.submission_id, outcome, T0, reply_json='"done"')
        elif outcome is SettlementOutcome.FAILED:
            decision = terminalize(conv, sub.submission_id, outcome, T0, error_type="E", error_reason="boom")
        else:
            decision = terminalize(conv, sub.submission_id, outcome, T0, error_reason="gave up")
        self.decided(cid, decision)

    def interrupt(self, cid: str) -> None:
        sub = self.running(cid)
        if sub is not None:
            self.decided(cid, interrupt(self.scratch.conversation(cid), sub.submission_id, "graceful_revoke"))

    def work(self, cid: str, choice: int) -> None:
        """Take one of the worker actions possible now in ``cid``, picked by ``choice``."""
        actions: list[Any] = []
        conv = self.scratch.conversation(cid)
        active = conv.active()
        if active is not None and active.state is S.RECOVERY:
            actions.append(lambda: self.classify(cid))
        if schedule(conv) is not None:
            actions.append(lambda: self.step(cid))
        if active is not None and active.state is S.UNKNOWN:
            kinds = list(ResolutionKind)
            actions += [lambda: self.request_resolution(cid, kinds[choice % 3], choice % 2 == 0)] * 2
        sub = self.running(cid)
        if sub is not None:
            actions.append(lambda: self.prepare(cid))
            actions.append(lambda: self.interrupt(cid))
            if sub.open_calls:
                actions += [lambda: self.tool_done(cid), lambda: self.tool_timeout(cid)]
            else:
                actions += [lambda outcome=outcome: self.finish(cid, outcome) for outcome in SettlementOutcome]
        if actions:
            actions[choice % len(actions)]()

    def drain(self, max_rounds: int = 200) -> None:
        """Run every conversation to quiescence: decide all inputs, finish runs, resolve Unknowns (DUR-002/014)."""
        for _ in range(max_rounds):
            self.commit()
            before = (len(self.batches), len(self.inbox))
            self.consume(len(self.inbox))
            for cid in CONVS:
                conv = self.scratch.conversation(cid)
                active = conv.active()
                if active is not None and active.state is S.RECOVERY:
                    self.classify(cid)
                elif active is not None and active.state is S.UNKNOWN:
                    if not any(isinstance(r, ResolveUnknown) for _, r in self.inbox[self.position :]):
                        self.request_resolution(cid, ResolutionKind.SAFE_TO_RETRY, True)
                elif self.running(cid) is not None:
                    if self.running(cid).open_calls:
                        self.tool_done(cid)
                    else:
                        self.finish(cid, SettlementOutcome.COMPLETED)
                elif schedule(conv) is not None:
                    self.step(cid)
            self.commit()
            if (len(self.batches), len(self.inbox)) == before and self.position == len(self.inbox):
                return
        raise AssertionError("the conversations did not quiesce: work is stuck (DUR-014)")

    def run(self, op: tuple[int, int]) -> None:
        code, arg = op
        cid = CONVS[arg % len(CONVS)]
        match KINDS[code]:
            case "work":
                self.work(cid, arg // 2)
            case "commit":
                self.commit()
            case "consume":
                self.consume(1 + arg % 4)
            case "propose":
                self.propose(cid, KEYS[(arg // 2) % len(KEYS)], VALUES[(arg // 8) % len(VALUES)], (arg // 16) % 2 == 1)
            case "abort":
                self.request_abort(cid, (arg // 2) % 7, (arg // 14) % 3 == 0)
            case "abort_tx":
                self.abort_tx()
            case "crash":
                self.crash(arg % 7)
            case _:  # pragma: no cover
                raise AssertionError(op)


def _input_offset(event: LogEvent) -> int | None:
    ref = getattr(event, "input_ref", None)
    return None if ref is None else int(ref.offset)


def check_one_active(state: PartitionState) -> None:
    for conv in state.conversations.values():
        active = [s.submission_id for s in conv.submissions.values() if s.state in ACTIVE_STATES]
        assert len(active) <= 1, f"DUR-005: {conv.conversation_id} has active {active}"
        if active:
            assert conv.active_submission_id == active[0]


@given(operations)
def test_random_interleavings_keep_every_promise(ops: list[tuple[int, int]]) -> None:
    owner = Owner()
    owner.crash(0)  # the first owner claims epoch 1
    for op in ops:
        owner.run(op)
    owner.drain()
    check_log(owner)


def check_log(owner: Owner) -> None:
    events = [event for batch in owner.batches for event in batch.events]
    final = owner.committed

    # Every transition is a table edge caused by its event; each submission's path chains from Proposed.
    state_of: dict[str, SubmissionState] = {}
    conversation_of: dict[str, str] = {}
    seq_of: dict[str, int] = {}
    for t in owner.trace:
        assert any(t.edge is edge for edge in EDGES), f"not an edge of the table: {t.edge}"
        assert t.edge.admits(t.event), f"{type(t.event).__name__} does not cause {t.edge}"
        before = state_of.get(t.submission_id, S.PROPOSED)
        assert t.edge.source is before, f"{t.submission_id}: {before} then {t.edge}"
        assert before not in TERMINAL_STATES, f"{t.submission_id} moved after settling: {t.edge}"
        state_of[t.submission_id] = t.edge.target
        conversation_of[t.submission_id] = t.conversation_id
        if isinstance(t.event, SubmissionAdmitted):
            seq_of[t.submission_id] = t.event.submission_seq
        if t.edge.source is S.READY and t.edge.target is S.RUNNING:
            # DUR-004 / DUR-005: every earlier submission of the conversation is settled, none other is active.
            for other, other_state in state_of.items():
                if other == t.submission_id or conversation_of[other] != t.conversation_id:
                    continue
                if seq_of[other] < seq_of[t.submission_id]:
                    assert other_state in TERMINAL_STATES, f"{t.submission_id} started before earlier {other}"
                assert other_state not in ACTIVE_STATES, f"{t.submission_id} started while {other} is active"
    for conv in final.conversations.values():
        for sub in conv.submissions.values():
            assert state_of[sub.submission_id] is sub.state

    # Never two terminal outcomes; one settlements record per canonical settlement.
    settled = Counter(e.submission_id for e in events if isinstance(e, Settlement))
    assert all(count == 1 for count in settled.values()), settled
    assert Counter(r.submission_id for r in owner.settlements) == settled
    for event in events:
        if isinstance(event, Settlement) and event.attempt_count == 0:
            assert event.outcome is SettlementOutcome.ABORTED, "only an abort settles without an attempt"

    # First starts in FIFO order per conversation.
    first_starts: dict[str, list[int]] = defaultdict(list)
    for event in events:
        if isinstance(event, AttemptStarted) and event.attempt == 1:
            first_starts[conversation_of[event.submission_id]].append(seq_of[event.submission_id])
    for seqs in first_starts.values():
        assert seqs == sorted(seqs)

    # Every input decided exactly once, with exactly one receipt.
    decided = Counter(o for o in (_input_offset(e) for e in events) if o is not None)
    assert sorted(decided) == list(range(len(owner.inbox))), "an input was lost"
    assert set(decided.values()) == {1} or not decided, "an input was decided twice"
    assert len(owner.receipts) == len(owner.inbox)

    # Admission: each key admitted once; duplicates point at the original; conflicts rejected (DUR-001).
    decision_at = {_input_offset(e): e for e in events if _input_offset(e) is not None}
    admitted_as: dict[tuple[str, str], tuple[str, str]] = {}
    for offset, (cid, record) in enumerate(owner.inbox):
        if not isinstance(record, SubmissionProposed):
            continue
        decision = decision_at[offset]
        scope = (cid, record.idempotency_key)
        value = record.payload.input_json
        if isinstance(decision, SubmissionAdmitted):
            assert scope not in admitted_as, f"key {scope} admitted twice"
            admitted_as[scope] = (decision.submission_id, value)
        elif isinstance(decision, SubmissionDuplicate):
            assert admitted_as[scope] == (decision.original_submission_id, value)
        else:
            assert isinstance(decision, SubmissionRejected)
            assert decision.reason is SubmissionRejectReason.IDEMPOTENCY_CONFLICT
            assert admitted_as[scope][1] != value

    # Aborts: an applied abort ends aborted if it ends; a rejection names the outcome that won (DUR-012).
    outcome_of = {e.submission_id: e.outcome for e in events if isinstance(e, Settlement)}
    receipt_of = {r.request_id: r for r in owner.receipts if r.outcome is not ReceiptOutcome.DUPLICATE}
    for event in events:
        if isinstance(event, AbortRecorded) and event.submission_id in outcome_of:
            assert outcome_of[event.submission_id] is SettlementOutcome.ABORTED
            assert receipt_of[event.command_id].outcome is ReceiptOutcome.APPLIED
        if isinstance(event, CommandRejected) and event.reason is CommandRejectReason.ALREADY_TERMINAL:
            assert event.submission_id is not None
            assert event.winning_outcome is outcome_of[event.submission_id]

    # Liveness after the drain: every admitted submission settled exactly once (DUR-002, DUR-014).
    admitted_ids = {e.submission_id for e in events if isinstance(e, SubmissionAdmitted)}
    assert set(settled) == admitted_ids, f"never settled: {admitted_ids - set(settled)}"

    # A stale attempt appends nothing: attempt records and run settlements are written at the attempt's epoch.
    attempt_epoch: dict[str, int] = {}
    current_attempt: dict[str, str] = {}
    for batch, trace in zip(owner.batches, owner.traces, strict=True):
        for event in batch.events:
            if isinstance(event, AttemptStarted):
                attempt_epoch[event.attempt_id] = event.owner_epoch
                current_attempt[event.submission_id] = event.attempt_id
            attempt_id = getattr(event, "attempt_id", None)
            if attempt_id is not None and not isinstance(event, RecoveryDecision):
                assert attempt_epoch[attempt_id] == batch.owner_epoch, f"{type(event).__name__} of a stale attempt"
        for t in trace:
            if t.edge.source is S.RUNNING and not isinstance(t.event, OwnershipClaimed):
                attempt = current_attempt[t.submission_id]
                assert attempt_epoch[attempt] == batch.owner_epoch, f"{t.edge} by a stale attempt {attempt}"

    # An abort of a queued submission settles it in the same batch, without an attempt (docs/semantics.md §13).
    before_batch: dict[str, SubmissionState] = {}
    applied: set[str] = set()
    for batch, trace in zip(owner.batches, owner.traces, strict=True):
        for event in batch.events:
            if not isinstance(event, AbortRecorded) or event.command_id in applied:
                continue  # a repeated command's record changes nothing
            applied.add(event.command_id)
            if before_batch.get(event.submission_id) in (S.ADMITTED, S.READY):
                assert any(
                    isinstance(e, Settlement) and e.submission_id == event.submission_id for e in batch.events
                ), f"queued {event.submission_id} was not settled with its abort"
        for t in trace:
            before_batch[t.submission_id] = t.edge.target

    # Restore equals the incremental state.
    assert fold(PartitionState(partition=0), owner.batches) == final
