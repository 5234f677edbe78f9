-- durable-agent schema, version 10: a cancel recorded before the end of a turn commits ends
-- the turn `cancelled` (the end of a turn is a step boundary too).
--
-- Who cancelled a turn and why ('cancelled by WHO: WHY'; NULL when nobody asked). VOLATILE
-- and PL/pgSQL (never inlined): each call reads with a fresh snapshot, so the end of a turn
-- re-checked after a cancel's update of the turn row (request_cancel touches the row for
-- that) sees the cancel even when the cancel committed after the end's statement began.
CREATE FUNCTION durable_agent_cancel_note(p_turn_id text) RETURNS text
    LANGUAGE plpgsql VOLATILE
    AS $$
        BEGIN
            RETURN (SELECT 'cancelled by ' || c.requested_by || coalesce(': ' || c.reason, '')
                    FROM cancellations AS c WHERE c.turn_id = p_turn_id);
        END
    $$;
