-- Layout 7 (issue 20 item 3): who may see and act on each conversation, for the HTTP API's reads.
--
-- One row per principal with access: the conversation's opener (the principal of its first admitted submission,
-- access 'opener'), and each principal granted access (AccessGranted: 'read' or 'act'); a revoked grant
-- (AccessRevoked) stays as 'revoked'. granted_by and command_id name the access command (NULL for the opener);
-- since is when the row's access began (the batch's recorded_at).
CREATE TABLE conversation_access (
    conversation_id text        NOT NULL,
    principal       text        NOT NULL,
    access          text        NOT NULL,   -- opener | read | act | revoked
    granted_by      text,
    command_id      text,
    since           timestamptz NOT NULL,
    updated_at      timestamptz NOT NULL,
    last_offset     bigint      NOT NULL,
    PRIMARY KEY (conversation_id, principal)
);
CREATE INDEX conversation_access_opener ON conversation_access (conversation_id) WHERE access = 'opener';

-- A schema migrated in place: its conversations' openers, from the submissions already projected (no earlier log
-- holds an access command, so nothing else is missing).
INSERT INTO conversation_access (conversation_id, principal, access, granted_by, command_id, since, updated_at,
                                 last_offset)
SELECT conversation_id, principal, 'opener', NULL, NULL, admitted_at, updated_at, admitted_offset
FROM submissions
WHERE submission_seq = 1;
