-- Layout 5 (issue 16 item 7): what a waiting run waits for, and the approvals a person must decide.
--
-- attempts.waiting_kind is one of approval, signal, unknown (a call in doubt; layouts 1-4 wrote it as
-- 'unknown_resolution'), or several of them comma-joined when a run waits for several at once; waiting_name the
-- signals' names, the approvals' titles or the tools in doubt, in callsite order; waiting_since when the run began to
-- wait; waiting_deadline the earliest deadline of its open waits (absolute, as the request stored it).

UPDATE attempts SET waiting_kind = 'unknown' WHERE waiting_kind = 'unknown_resolution';

-- One row per approval a run requested (ctx.approve, or a tool call that needs approval): pending until decided
-- (approved, denied), expired at its deadline, or cancelled when the run settled (an abort) while it was open.
-- call_id, tool and args_json describe the tool call it is bound to (NULL call_id and tool for ctx.approve, whose
-- arguments are its title and description); args_digest is what a decision must name.
CREATE TABLE approvals (
    conversation_id text        NOT NULL,
    approval_id     text        NOT NULL,
    submission_id   text        NOT NULL,
    attempt_id      text        NOT NULL,   -- the attempt that asked
    ordinal         integer     NOT NULL,   -- the callsite ordinal of the request in its run
    call_id         text,
    tool            text,
    title           text        NOT NULL,
    description     text,
    args_json       text,
    args_digest     text        NOT NULL,
    status          text        NOT NULL,   -- pending | approved | denied | expired | cancelled
    requested_at    timestamptz NOT NULL,
    deadline        timestamptz,
    decided_at      timestamptz,
    decided_by      text,                   -- the verified signing key id ("by")
    principal       text,                   -- who decided, as the decision says
    reason          text,
    command_id      text,                   -- the DecideApproval that decided it
    updated_at      timestamptz NOT NULL,
    last_offset     bigint      NOT NULL,
    PRIMARY KEY (conversation_id, approval_id)
);
CREATE INDEX approvals_pending ON approvals (requested_at, approval_id) WHERE status = 'pending';
CREATE INDEX approvals_submission ON approvals (conversation_id, submission_id);

-- The runs view gains waiting_since (columns are only appended: CREATE OR REPLACE VIEW keeps the earlier ones).
CREATE OR REPLACE VIEW runs AS
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
       s.updated_at,
       CASE WHEN s.state IN ('waiting', 'unknown') THEN a.waiting_since END AS waiting_since
FROM submissions s
LEFT JOIN attempts a ON a.conversation_id = s.conversation_id AND a.attempt_id = s.current_attempt_id;
