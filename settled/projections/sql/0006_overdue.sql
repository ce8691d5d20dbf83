-- Layout 6 (issue 22 item 5): what someone owes a run, and what of it is overdue.
--
-- obligations: every open Unknown tool call (an operator must resolve it), every pending approval (a person must
-- decide it) and every unsettled submission (the system owes it an outcome), with when it began and its age.
-- overdue: those older than their kind's threshold: an Unknown after 15 minutes, an approval after 24 hours, an
-- unsettled submission after 1 hour. `settled doctor` reads obligations with thresholds of its own (flags).
CREATE VIEW obligations AS
SELECT 'unknown'::text AS kind, t.conversation_id, t.submission_id, t.call_id AS item_id, t.tool AS name,
       t.unknown_since AS since, now() - t.unknown_since AS age
FROM tool_calls t
WHERE t.status = 'unknown'
UNION ALL
SELECT 'approval', a.conversation_id, a.submission_id, a.approval_id, a.title, a.requested_at,
       now() - a.requested_at
FROM approvals a
WHERE a.status = 'pending'
UNION ALL
SELECT 'submission', s.conversation_id, s.submission_id, s.submission_id, NULL, s.admitted_at,
       now() - s.admitted_at
FROM submissions s
WHERE s.state NOT IN ('completed', 'failed', 'aborted') AND s.admitted_at IS NOT NULL;

CREATE VIEW overdue AS
SELECT o.*
FROM obligations o
WHERE o.age > CASE o.kind
                  WHEN 'unknown' THEN interval '15 minutes'
                  WHEN 'approval' THEN interval '24 hours'
                  ELSE interval '1 hour'
              END;
