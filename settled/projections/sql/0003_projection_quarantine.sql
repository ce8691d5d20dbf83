-- Layout 3 (issue 25 item 3): the projection's quarantine table.

-- A log record the projector could not write (PostgreSQL refused its rows with a data error: SQLSTATE class 22
-- data exception, 23 integrity constraint violation, 54 program limit exceeded, or a value the driver cannot send,
-- such as a NUL character in text). Written in the transaction that moves the partition's offset past the record;
-- the record's fold is kept (the conversation's later batches still fold). Its rows are written per conversation
-- (an ownership claim's rows span the partition's conversations): those of the conversations PostgreSQL refused are
-- not, and are named in refused_groups; the others are. `settled projections check` leaves the refused rows out of
-- its comparison, lists these positions and exits non-zero while any exist.
CREATE TABLE projection_quarantine (
    partition   integer NOT NULL,
    log_offset  bigint  NOT NULL,
    event_types text    NOT NULL,   -- the batch's event types, in order, duplicates removed, comma-separated
    refused_groups text NOT NULL,   -- comma-separated: 'c:' + 32 hex digits of SHA-256(conversation id), or 'partition'
    sqlstate    text,               -- NULL when the driver refused the value before sending it
    error       text    NOT NULL,
    PRIMARY KEY (partition, log_offset)
);
