-- durable-agent schema, version 14: a concurrency key per turn (e.g. the tenant). At most
-- N turns of one key run at once across the fleet (DURABLE_AGENT_CONCURRENCY_PER_KEY); a
-- claim over that, or one that would pass an older turn of the key still waiting, is refused
-- and the turn waits without a worker, in the order the turns were recorded.
ALTER TABLE turns ADD COLUMN concurrency_key text;
COMMENT ON COLUMN turns.concurrency_key IS 'the turns of one key run at most DURABLE_AGENT_CONCURRENCY_PER_KEY at once, oldest first (NULL: no limit)';
CREATE INDEX turns_open_by_key_idx ON turns (concurrency_key, created_at, turn_id)
    WHERE concurrency_key IS NOT NULL AND status IN ('queued', 'running');

-- Whether a turn of key p_key recorded at p_created must wait: p_limit turns of the key run
-- (a live lease), or an older turn of the key waits for a slot (the error wait_for_key
-- records), so the key's turns start in the order they were recorded. The advisory lock on
-- the key (held to the end of the claim's transaction) makes two claims of one key take
-- turns, so both cannot see room for one.
CREATE FUNCTION durable_agent_key_busy(
    p_key text, p_turn_id text, p_created timestamptz, p_limit integer
) RETURNS boolean
    LANGUAGE plpgsql VOLATILE
    AS $$
        BEGIN
            PERFORM pg_advisory_xact_lock(hashtextextended('durable-agent key ' || p_key, 0));
            RETURN (
                SELECT count(*) FROM turns
                WHERE concurrency_key = p_key AND turn_id <> p_turn_id
                  AND status = 'running' AND lease_expires_at > durable_agent_now()
            ) >= p_limit
            OR EXISTS (
                SELECT 1 FROM turns
                WHERE concurrency_key = p_key AND status = 'queued'
                  AND error = 'waits for a slot of its concurrency key'
                  AND (created_at, turn_id) < (p_created, p_turn_id)
            );
        END
    $$;

-- Whether a new turn of key p_key may be sent at once: fewer than p_limit other turns of the
-- key run or are sent and due (the others wait for a slot and are sent when one frees).
CREATE FUNCTION durable_agent_key_admits(p_key text, p_turn_id text, p_limit integer)
    RETURNS boolean
    LANGUAGE sql STABLE
    AS $$
        SELECT count(*) < p_limit FROM turns
        WHERE concurrency_key = p_key AND turn_id <> p_turn_id
          AND ((status = 'running' AND lease_expires_at > durable_agent_now())
               OR (status = 'queued'
                   AND error IS DISTINCT FROM 'waits for a slot of its concurrency key'
                   AND (not_before IS NULL OR not_before <= durable_agent_now())))
    $$;
