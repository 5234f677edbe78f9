-- durable-agent schema, version 7: the open turns of a queue in the order they were sent,
-- so the sweeper's probe of an idle queue finds its oldest unreceived turn without reading
-- the queue's finished turns; and the next open turn of a session, in one place.
CREATE INDEX turns_open_by_queue_idx ON turns (queue, enqueued_at)
    WHERE status IN ('queued', 'running');

-- The next unfinished turn of a session after position `seq` (no row when there is none):
-- what the end of a turn sends next.
CREATE FUNCTION durable_agent_next_open(p_session_id text, p_seq integer)
    RETURNS TABLE (turn_id text, queue text)
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$
        SELECT t.turn_id, t.queue FROM turns AS t
        WHERE t.session_id = p_session_id AND t.seq > p_seq
          AND t.status IN ('queued', 'running')
        ORDER BY t.seq LIMIT 1
    $$;
