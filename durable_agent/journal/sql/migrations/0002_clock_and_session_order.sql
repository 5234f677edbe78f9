-- durable-agent schema, version 2: a clock tests can move, and the session-order rule in one place.
-- Every time a query compares or sets a lease, a deferral or a grace period, it reads the clock
-- through this function, so tests can move the database's clock forward instead of waiting.
-- It is inlined by the planner: it costs what now() costs.
CREATE FUNCTION durable_agent_now() RETURNS timestamptz
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$ SELECT now() $$;

-- The earliest unfinished turn of a session before position `seq` (NULL when there is none):
-- a turn runs only after every earlier turn of its session has finished.
CREATE FUNCTION durable_agent_open_before(p_session_id text, p_seq integer) RETURNS text
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$
        SELECT turn_id FROM turns
        WHERE session_id = p_session_id AND seq < p_seq AND status IN ('queued', 'running')
        ORDER BY seq LIMIT 1
    $$;
