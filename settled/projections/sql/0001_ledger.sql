-- The ledger projection of settled.log, layout 1 (docs/design.md §6; issue 7 item 2).
--
-- Applied by settled.projections.migrate() into one schema per projection version, with search_path set to that
-- schema: names here are unqualified. Column lists and merge rules mirror settled/projections/_tables.py; the
-- projector refuses a schema whose columns differ (check_layout). Every row is derived from the protocol's fold
-- (settled.protocol.apply) of the log, so a rebuild from offset 0 yields the same rows.

-- What the projection holds: layout, generation (1 for the first build, +1 per rebuild), creation time.
CREATE TABLE meta (
    key   text PRIMARY KEY,
    value text NOT NULL
);

-- The next log offset to apply, per (projection, topic, partition): written in the same transaction as the rows
-- (DUR-015). Offsets have gaps (transaction markers), so a writer checks msg.offset >= next_offset.
CREATE TABLE offsets (
    projection  text        NOT NULL,
    topic       text        NOT NULL,
    partition   integer     NOT NULL,
    next_offset bigint      NOT NULL CHECK (next_offset >= 0),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (projection, topic, partition)
);

-- One row per log partition: its genesis partition count and its latest ownership claim (docs/design.md §3).
CREATE TABLE partitions (
    partition       integer PRIMARY KEY,
    partition_count integer,
    claim_epoch     bigint      NOT NULL,
    claimed_by      text,
    claimed_at      timestamptz,
    updated_at      timestamptz NOT NULL,
    last_offset     bigint      NOT NULL
);

-- Run state per conversation: the lane holder, the queue, whether an Unknown blocks it (DUR-004/005/009).
CREATE TABLE conversations (
    conversation_id      text PRIMARY KEY,
    partition            integer     NOT NULL,
    active_submission_id text,
    queue_depth          integer     NOT NULL,   -- admitted, unsettled submissions (the active one included)
    unknown_count        integer     NOT NULL,   -- of those, in state unknown
    blocked_by_unknown   boolean     NOT NULL,
    last_submission_seq  bigint      NOT NULL,
    last_event_seq       bigint      NOT NULL,
    owner_epoch          bigint      NOT NULL,
    created_at           timestamptz NOT NULL,
    updated_at           timestamptz NOT NULL,
    last_offset          bigint      NOT NULL
);

-- The ledger: every admitted submission and its docs/semantics.md §3 state (recovery and unknown included).
CREATE TABLE submissions (
    submission_id      text PRIMARY KEY,
    conversation_id    text        NOT NULL,
    partition          integer     NOT NULL,
    submission_seq     bigint      NOT NULL,
    principal          text        NOT NULL,
    idempotency_key    text        NOT NULL,
    payload_digest     text        NOT NULL,
    tools_offered      text[]      NOT NULL,
    state              text        NOT NULL,
    outcome            text,
    receipt_outcome    text        NOT NULL,   -- the receipt its own request got: admitted
    attempt_count      integer     NOT NULL,
    current_attempt_id text,
    input_applied      boolean     NOT NULL,
    abort_requested    boolean     NOT NULL,
    abort_reason       text,
    reserved_outcome   text,
    open_calls         integer     NOT NULL,
    unknown_calls      integer     NOT NULL,
    admitted_at        timestamptz NOT NULL,
    admitted_offset    bigint      NOT NULL,
    first_started_at   timestamptz,
    settled_at         timestamptz,
    updated_at         timestamptz NOT NULL,
    last_offset        bigint      NOT NULL,
    UNIQUE (conversation_id, submission_seq)
);
CREATE INDEX submissions_open ON submissions (conversation_id, submission_seq)
    WHERE state NOT IN ('completed', 'failed', 'aborted');
CREATE UNIQUE INDEX submissions_key ON submissions (conversation_id, principal, idempotency_key);

-- One row per attempt (docs/design.md §5): running, waiting (for an Unknown's resolution), recovery, terminalizing,
-- interrupted (ended without a settlement; a later attempt continues), completed, failed, aborted.
CREATE TABLE attempts (
    attempt_id       text PRIMARY KEY,
    submission_id    text        NOT NULL,
    conversation_id  text        NOT NULL,
    attempt          integer     NOT NULL,
    owner_epoch      bigint,
    status           text        NOT NULL,
    waiting_kind     text,
    waiting_name     text,
    waiting_since    timestamptz,
    waiting_deadline timestamptz,
    current_step     text,
    end_reason       text,
    started_at       timestamptz NOT NULL,
    ended_at         timestamptz,
    updated_at       timestamptz NOT NULL,
    last_offset      bigint      NOT NULL,
    UNIQUE (submission_id, attempt)
);

-- Tool calls (DUR-008/009): prepared, settled, error, refused, unknown, resolved, abandoned.
CREATE TABLE tool_calls (
    submission_id      text        NOT NULL,
    call_id            text        NOT NULL,
    conversation_id    text        NOT NULL,
    attempt_id         text,
    run_id             text,
    ordinal            integer,
    tool               text        NOT NULL,
    args_digest        text,
    idempotency_key    text,
    owner_epoch        bigint,
    status             text        NOT NULL,
    result_digest      text,
    error_type         text,
    error_message      text,
    reason             text,
    resolution_kind    text,
    resolution_outcome text,
    prepared_at        timestamptz,
    ended_at           timestamptz,
    unknown_since      timestamptz,
    duration_ms        bigint,
    updated_at         timestamptz NOT NULL,
    last_offset        bigint      NOT NULL,
    PRIMARY KEY (submission_id, call_id)
);
CREATE INDEX tool_calls_unknown ON tool_calls (unknown_since) WHERE status = 'unknown';

-- One terminal outcome per admitted submission (DUR-002); append-only.
CREATE TABLE settlements (
    submission_id   text PRIMARY KEY,
    conversation_id text        NOT NULL,
    partition       integer     NOT NULL,
    submission_seq  bigint      NOT NULL,
    outcome         text        NOT NULL,
    reply_json      text,
    reply_digest    text,
    reply_ref       text,
    error_type      text,
    error_reason    text,
    attempt_count   integer     NOT NULL,
    settled_at      timestamptz NOT NULL,
    log_offset      bigint      NOT NULL
);

-- The decision of every request as its receipt reports it (docs/design.md §4): the first decision of a request id.
CREATE TABLE receipts (
    request_id      text PRIMARY KEY,
    request_kind    text        NOT NULL,   -- submission | command
    conversation_id text        NOT NULL,
    outcome         text        NOT NULL,   -- admitted | duplicate | rejected | applied
    reason          text,
    submission_id   text,                   -- the admitted original (duplicates) or the command's target
    submission_seq  bigint,
    decided_at      timestamptz NOT NULL,
    log_offset      bigint      NOT NULL
);

-- Per conversation, in event order: user inputs, model responses, tool calls and results, replies; append-only.
CREATE TABLE transcript (
    conversation_id text        NOT NULL,
    event_seq       bigint      NOT NULL,
    submission_id   text,
    attempt_id      text,
    kind            text        NOT NULL,
    role            text        NOT NULL,
    name            text,                   -- the tool's or the step's name
    call_id         text,
    content         text,
    recorded_at     timestamptz NOT NULL,
    log_offset      bigint      NOT NULL,
    PRIMARY KEY (conversation_id, event_seq)
);

-- What an operator must resolve (DUR-009): every call in doubt, with its age.
CREATE VIEW unknown_obligations AS
SELECT t.conversation_id,
       t.submission_id,
       t.call_id,
       t.tool,
       t.idempotency_key,
       t.owner_epoch,
       t.reason,
       s.state           AS submission_state,
       s.abort_requested,
       t.unknown_since,
       now() - t.unknown_since AS age
FROM tool_calls t
JOIN submissions s USING (submission_id)
WHERE t.status = 'unknown';

-- One run per submission: queued, running, waiting, recovery, terminalizing, or its outcome; its current attempt.
CREATE VIEW runs AS
SELECT s.submission_id,
       s.conversation_id,
       s.submission_seq,
       s.state,
       CASE
           WHEN s.state IN ('admitted', 'ready') AND s.attempt_count = 0 THEN 'queued'
           WHEN s.state = 'ready' THEN 'waiting'
           WHEN s.state = 'unknown' THEN 'waiting'
           ELSE s.state
       END AS status,
       CASE
           WHEN s.state = 'ready' AND s.attempt_count > 0 THEN 'next_attempt'
           ELSE a.waiting_kind
       END AS waiting_kind,
       a.waiting_name,
       a.waiting_deadline,
       s.attempt_count,
       a.attempt_id,
       a.status          AS attempt_status,
       a.current_step,
       s.admitted_at,
       s.first_started_at,
       s.settled_at,
       s.outcome,
       s.updated_at
FROM submissions s
LEFT JOIN attempts a ON a.attempt_id = s.current_attempt_id;
