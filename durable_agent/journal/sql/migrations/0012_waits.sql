-- durable-agent schema, version 12: turns that wait (for a decision, for time, for an event,
-- for a child agent) on one park mechanism. A parked turn is `waiting` with no claim, no
-- lease and no message; `waits` says why and until when; the write that satisfies the wait
-- (a decision, an event, the end of a child) or the sweeper (a due time) wakes it.
ALTER TABLE journal DROP CONSTRAINT journal_kind_check;
ALTER TABLE journal ADD CONSTRAINT journal_kind_check CHECK (kind IN ('model', 'tool', 'wait'));

-- waits: the one open wait of a parked turn (deleted when it wakes).
CREATE TABLE waits (
    turn_id   text PRIMARY KEY REFERENCES turns (turn_id) ON DELETE CASCADE,
    step      integer NOT NULL,
    kind      text NOT NULL CHECK (kind IN ('approval', 'sleep', 'event', 'child')),
    name      text NOT NULL,
    wake_at   timestamptz,
    parked_at timestamptz NOT NULL DEFAULT now()
);
COMMENT ON COLUMN waits.name IS 'what it waits for: the tool (approval), the event name, the child turn id ('''' for a sleep)';
COMMENT ON COLUMN waits.wake_at IS 'when the sweeper wakes it if nothing else did (NULL: never)';
CREATE INDEX waits_wake_idx ON waits (wake_at) WHERE wake_at IS NOT NULL;

-- events: sent to a turn by name, kept until a wait of that name consumes one (once).
CREATE TABLE events (
    turn_id       text NOT NULL REFERENCES turns (turn_id) ON DELETE CASCADE,
    event_id      text NOT NULL,
    name          text NOT NULL,
    payload       jsonb NOT NULL,
    sent_at       timestamptz NOT NULL DEFAULT now(),
    consumed_step integer,
    consumed_at   timestamptz,
    PRIMARY KEY (turn_id, event_id)
);
CREATE INDEX events_pending_idx ON events (turn_id, name, sent_at) WHERE consumed_step IS NULL;
CREATE UNIQUE INDEX events_consumed_idx ON events (turn_id, consumed_step)
    WHERE consumed_step IS NOT NULL;

-- child_turns: a turn started by a step of another turn (ctx.run_agent, an agent as a tool).
CREATE TABLE child_turns (
    turn_id        text PRIMARY KEY REFERENCES turns (turn_id) ON DELETE CASCADE,
    parent_turn_id text NOT NULL REFERENCES turns (turn_id) ON DELETE CASCADE,
    parent_step    integer NOT NULL,
    depth          integer NOT NULL CHECK (depth >= 1),
    CONSTRAINT child_turns_parent_step_key UNIQUE (parent_turn_id, parent_step)
);

-- Whether what a turn would wait for is there already (an unconsumed event of that name, a
-- child that ended). VOLATILE and PL/pgSQL: a park re-checked after a waker's update of the
-- turn row asks again with a fresh snapshot and sees what the waker committed.
CREATE FUNCTION durable_agent_wait_met(p_turn_id text, p_kind text, p_name text)
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE
    AS $$
        BEGIN
            IF p_kind = 'event' THEN
                RETURN EXISTS (SELECT 1 FROM events AS e
                               WHERE e.turn_id = p_turn_id AND e.name = p_name
                                 AND e.consumed_step IS NULL);
            ELSIF p_kind = 'child' THEN
                RETURN EXISTS (SELECT 1 FROM turns AS t
                               WHERE t.turn_id = p_name
                                 AND t.status IN ('done', 'failed', 'cancelled'));
            END IF;
            RETURN false;
        END
    $$;

-- Park a turn (every wait parks through here: approvals, sleeps, events, child agents): the
-- claim at p_epoch gives the turn up, status `waiting`, no claim, no lease, no message, and
-- its `waits` row says why and until when. Refused (false) when the claim moved on, the turn
-- was cancelled, its due time has passed, or what it waits for is there already (asked with
-- a fresh snapshot, also when a waker's update of the row made this wait for it).
CREATE FUNCTION durable_agent_park(p_turn_id text, p_epoch integer, p_step integer,
                                   p_kind text, p_name text, p_wake_at timestamptz)
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE
    AS $$
        BEGIN
            UPDATE turns
            SET status = 'waiting', lease_owner = NULL, lease_expires_at = NULL,
                enqueued_at = NULL, message_id = NULL, updated_at = durable_agent_now()
            WHERE turn_id = p_turn_id AND lease_epoch = p_epoch AND status = 'running'
              AND NOT EXISTS (SELECT 1 FROM cancellations AS c WHERE c.turn_id = p_turn_id)
              AND (p_wake_at IS NULL OR p_wake_at > durable_agent_now())
              AND NOT durable_agent_wait_met(p_turn_id, p_kind, p_name);
            IF NOT FOUND THEN
                RETURN false;
            END IF;
            INSERT INTO waits (turn_id, step, kind, name, wake_at, parked_at)
            VALUES (p_turn_id, p_step, p_kind, p_name, p_wake_at, durable_agent_now())
            ON CONFLICT (turn_id) DO UPDATE
                SET step = excluded.step, kind = excluded.kind, name = excluded.name,
                    wake_at = excluded.wake_at, parked_at = excluded.parked_at;
            RETURN true;
        END
    $$;

-- Wake a turn parked for (kind, name): its wait is deleted, it is queued with no message,
-- and `wake <turn_id>` goes to the channel durable_agent_wake (a worker's waker sends it).
-- The turn row is updated first whatever its state, so that a park running at the same time
-- either waits for this write and then sees what satisfies it (durable_agent_wait_met), or
-- committed first and is woken here. True when it woke the turn.
CREATE FUNCTION durable_agent_wake(p_turn_id text, p_kind text, p_name text) RETURNS boolean
    LANGUAGE plpgsql VOLATILE
    AS $$
        BEGIN
            UPDATE turns SET updated_at = updated_at WHERE turn_id = p_turn_id;
            DELETE FROM waits AS w
            WHERE w.turn_id = p_turn_id AND w.kind = p_kind AND w.name = p_name;
            IF NOT FOUND THEN
                RETURN false;
            END IF;
            UPDATE turns
            SET status = 'queued', enqueued_at = NULL, message_id = NULL,
                updated_at = durable_agent_now()
            WHERE turn_id = p_turn_id AND status = 'waiting';
            PERFORM pg_notify('durable_agent_wake', p_turn_id);
            RETURN true;
        END
    $$;

-- Send an event to a turn (send_event): keep it for an open turn (the same event_id again
-- changes nothing) and wake the turn if it is parked waiting for that name, in one
-- transaction; the turn row is updated (to itself) first (see durable_agent_wake). No row
-- when there is no such turn. SECURITY DEFINER: an application's role sends events and
-- wakes the turn they satisfy without any right to change turns itself.
CREATE FUNCTION durable_agent_send_event(p_turn_id text, p_event_id text, p_name text,
                                         p_payload jsonb)
    RETURNS TABLE (turn_status text, recorded boolean, recorded_name text, woke boolean)
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT
    AS $$
        #variable_conflict use_column
        DECLARE
            v_status text;
            v_new boolean := false;
        BEGIN
            UPDATE turns AS t SET updated_at = t.updated_at WHERE t.turn_id = p_turn_id
            RETURNING t.status INTO v_status;
            IF v_status IS NULL THEN
                RETURN;
            END IF;
            IF v_status IN ('queued', 'running', 'waiting') THEN
                INSERT INTO events (turn_id, event_id, name, payload, sent_at)
                VALUES (p_turn_id, p_event_id, p_name, p_payload, durable_agent_now())
                ON CONFLICT (turn_id, event_id) DO NOTHING;
                v_new := FOUND;
            END IF;
            RETURN QUERY
                SELECT v_status, v_new,
                       (SELECT e.name FROM events AS e
                        WHERE e.turn_id = p_turn_id AND e.event_id = p_event_id),
                       CASE WHEN v_new THEN durable_agent_wake(p_turn_id, 'event', p_name)
                            ELSE false END;
        END
    $$;

-- The end of a child turn wakes its parent (in the transaction that ends the child).
CREATE FUNCTION durable_agent_child_ended() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
        DECLARE
            parent text;
        BEGIN
            SELECT c.parent_turn_id INTO parent FROM child_turns AS c
            WHERE c.turn_id = NEW.turn_id;
            IF parent IS NOT NULL THEN
                PERFORM durable_agent_wake(parent, 'child', NEW.turn_id);
            END IF;
            RETURN NULL;
        END
    $$;

CREATE TRIGGER turns_child_ended AFTER UPDATE OF status ON turns
    FOR EACH ROW
    WHEN (NEW.status IN ('done', 'failed', 'cancelled') AND OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION durable_agent_child_ended();
