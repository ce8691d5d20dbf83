-- Layout 9 (issue 22 item 4): a submission admitted by `settled retry` names the dead letter it retries.
--
-- retry_of: the dead-lettered submission (settled failed, error type retry_budget_exhausted) whose payload this one
-- was admitted with (SubmissionAdmitted.retry_of); NULL for every other submission. The dead letter's own row and
-- settlement stand unchanged.
ALTER TABLE submissions ADD COLUMN retry_of text;
CREATE INDEX submissions_retry_of ON submissions (conversation_id, retry_of) WHERE retry_of IS NOT NULL;
