-- Layout 2 (issue 25 item 4): submissions, attempts, tool calls, settlements and receipts keyed within their
-- conversation.
--
-- A partition's owner decides only its own conversations, so it cannot refuse a submission (or attempt, command)
-- id that a conversation of another partition already uses: ids are unique per conversation, not per namespace,
-- and every key below starts with the conversation. Column lists stay as they were (settled/projections/_tables.py).

ALTER TABLE submissions DROP CONSTRAINT submissions_pkey;
ALTER TABLE submissions ADD PRIMARY KEY (conversation_id, submission_id);

ALTER TABLE attempts DROP CONSTRAINT attempts_pkey;
ALTER TABLE attempts DROP CONSTRAINT attempts_submission_id_attempt_key;
ALTER TABLE attempts ADD PRIMARY KEY (conversation_id, attempt_id);
ALTER TABLE attempts ADD UNIQUE (conversation_id, submission_id, attempt);

ALTER TABLE tool_calls DROP CONSTRAINT tool_calls_pkey;
ALTER TABLE tool_calls ADD PRIMARY KEY (conversation_id, submission_id, call_id);

ALTER TABLE settlements DROP CONSTRAINT settlements_pkey;
ALTER TABLE settlements ADD PRIMARY KEY (conversation_id, submission_id);

ALTER TABLE receipts DROP CONSTRAINT receipts_pkey;
ALTER TABLE receipts ADD PRIMARY KEY (conversation_id, request_id);
CREATE INDEX receipts_request ON receipts (request_id);
CREATE INDEX submissions_id ON submissions (submission_id);

CREATE OR REPLACE VIEW unknown_obligations AS
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
JOIN submissions s USING (conversation_id, submission_id)
WHERE t.status = 'unknown';

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
       s.updated_at
FROM submissions s
LEFT JOIN attempts a ON a.conversation_id = s.conversation_id AND a.attempt_id = s.current_attempt_id;
