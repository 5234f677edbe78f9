-- durable-agent schema, version 3: each turn belongs to a queue, and Postgres knows which
-- message of a turn was sent last and which one a worker received, so the sweeper re-sends
-- only what can really be lost.
ALTER TABLE turns
    ADD COLUMN queue               text NOT NULL DEFAULT '',
    ADD COLUMN message_id          text,
    ADD COLUMN received_message_id text,
    ADD COLUMN received_at         timestamptz,
    ADD COLUMN received_by         text;

COMMENT ON COLUMN turns.queue IS 'the Celery queue its messages go to ('''' for turns recorded before version 3: the sweeping worker''s own)';
COMMENT ON COLUMN turns.message_id IS 'the task id of the last message sent for the turn';
COMMENT ON COLUMN turns.received_message_id IS 'the task id of the last message a worker received for it';
COMMENT ON COLUMN turns.received_by IS 'the worker process that received it (host:pid:thread#token)';

-- the newest send on a queue that some worker has received, and the newest reception
CREATE INDEX turns_received_sends_idx ON turns (queue, enqueued_at)
    WHERE received_message_id = message_id;
CREATE INDEX turns_receptions_idx ON turns (queue, received_at);
CREATE INDEX turns_sends_idx ON turns (queue, enqueued_at);
