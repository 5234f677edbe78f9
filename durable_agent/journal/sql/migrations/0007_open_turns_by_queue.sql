-- durable-agent schema, version 7: the open turns of a queue in the order they were sent,
-- so the sweeper's probe of an idle queue finds its oldest unreceived turn without reading
-- the queue's finished turns.
CREATE INDEX turns_open_by_queue_idx ON turns (queue, enqueued_at)
    WHERE status IN ('queued', 'running');
