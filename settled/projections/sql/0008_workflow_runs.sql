-- Layout 8 (issue 17 item 4): workflow runs with their workflow, task, progress and what they wait for.
--
-- A workflow run is a submission whose input is the envelope of settled/protocol/_workflows.py
-- ({"settled_workflow": {"name", "task_id"}, "input"}): the transcript's input row names it. Its plan (the step
-- record named 'workflow', {"steps": [...], "workflow"}) gives the total steps; its results (step records named
-- 'step:<name>') how many are done. step_number is the step it is at (done + 1, at most total_steps; NULL once
-- settled), step_name that step's name. waits_for says what a waiting run waits for: 'pause' (a pause wait, the
-- signal settled.resume), 'approval' (a step's approval), 'retry' (a retry's timed wait), 'next_attempt', or the
-- runs view's waiting_kind; waiting_name, waiting_since and waiting_deadline are the runs view's.

CREATE INDEX transcript_workflow ON transcript (conversation_id, submission_id)
    WHERE kind = 'input' OR (kind = 'step' AND (name = 'workflow' OR name LIKE 'step:%'));

CREATE VIEW workflow_runs AS
SELECT r.submission_id,
       r.conversation_id,
       w.workflow,
       w.task_id,
       r.status,
       r.state,
       r.outcome,
       r.attempt_count,
       CASE WHEN r.outcome IS NULL AND p.total_steps IS NOT NULL THEN LEAST(d.done + 1, p.total_steps) END
           AS step_number,
       p.total_steps,
       CASE WHEN r.outcome IS NULL THEN p.steps ->> LEAST(d.done, p.total_steps - 1) END AS step_name,
       d.done AS steps_done,
       CASE
           WHEN r.waiting_kind = 'signal' AND r.waiting_name = 'settled.resume' THEN 'pause'
           WHEN r.waiting_kind = 'signal' AND r.waiting_name LIKE 'retry:%' THEN 'retry'
           ELSE r.waiting_kind
       END AS waits_for,
       r.waiting_name,
       r.waiting_since,
       r.waiting_deadline,
       r.admitted_at,
       r.settled_at,
       r.updated_at
FROM runs r
JOIN LATERAL (
    SELECT t.content::jsonb -> 'settled_workflow' ->> 'name' AS workflow,
           t.content::jsonb -> 'settled_workflow' ->> 'task_id' AS task_id
    FROM transcript t
    WHERE t.conversation_id = r.conversation_id AND t.submission_id = r.submission_id AND t.kind = 'input'
    ORDER BY t.event_seq
    LIMIT 1
) w ON w.workflow IS NOT NULL
LEFT JOIN LATERAL (
    SELECT t.content::jsonb -> 'steps' AS steps, jsonb_array_length(t.content::jsonb -> 'steps') AS total_steps
    FROM transcript t
    WHERE t.conversation_id = r.conversation_id AND t.submission_id = r.submission_id AND t.kind = 'step'
      AND t.name = 'workflow'
    ORDER BY t.event_seq
    LIMIT 1
) p ON TRUE
CROSS JOIN LATERAL (
    SELECT count(DISTINCT t.name)::integer AS done
    FROM transcript t
    WHERE t.conversation_id = r.conversation_id AND t.submission_id = r.submission_id AND t.kind = 'step'
      AND t.name LIKE 'step:%'
) d;
