-- Layout 4 (issue 19 item 1): token usage of every completed model response, and its sum per run.

-- One row per ModelResponseCompleted and per ModelResponseInterrupted (a try cut mid-way, issue 19), in event
-- order; append-only. The tokens are NULL when the provider reported no usage: a cut try's usage chunk never
-- arrived, so its row says "unknown", never zero (request_id NULL; its transcript row says how much output came).
CREATE TABLE model_usage (
    conversation_id  text        NOT NULL,
    event_seq        bigint      NOT NULL,
    submission_id    text        NOT NULL,
    attempt_id       text        NOT NULL,
    response_ordinal integer     NOT NULL,
    provider         text        NOT NULL,
    model            text        NOT NULL,
    request_id       text,
    input_tokens     bigint,
    output_tokens    bigint,
    cached_input_tokens bigint,             -- part of input_tokens; NULL when the provider did not say
    reasoning_tokens bigint,                -- part of output_tokens; NULL when the provider did not say
    recorded_at      timestamptz NOT NULL,
    log_offset       bigint      NOT NULL,
    PRIMARY KEY (conversation_id, event_seq)
);

-- Per run (submission), over all its attempts: how many model responses completed, and their tokens summed
-- (a retried or recovered call counts every time it completed: the duplicate cost is visible).
CREATE VIEW run_usage AS
SELECT conversation_id,
       submission_id,
       count(*)                          AS model_calls,
       count(input_tokens)               AS calls_with_usage,
       coalesce(sum(input_tokens), 0)    AS input_tokens,
       coalesce(sum(output_tokens), 0)   AS output_tokens,
       coalesce(sum(cached_input_tokens), 0) AS cached_input_tokens,
       coalesce(sum(reasoning_tokens), 0) AS reasoning_tokens
FROM model_usage
GROUP BY conversation_id, submission_id;
