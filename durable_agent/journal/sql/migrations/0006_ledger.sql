-- durable-agent schema, version 6: live turns. Postgres announces every finished step and
-- every change of a turn's status on the channel `durable_agent` (delivered when the write
-- commits), so watchers and waiters wake up instead of polling. The payload names what
-- changed; a watcher reads the rows itself.
--   step <n> <turn_id>      journal row n of the turn is done
--   turn <status> <turn_id> the turn's status changed (claimed, ended, given back)
CREATE FUNCTION durable_agent_notify_step() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
        BEGIN
            PERFORM pg_notify('durable_agent', 'step ' || NEW.step || ' ' || NEW.turn_id);
            RETURN NULL;
        END
    $$;

CREATE FUNCTION durable_agent_notify_turn() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
        BEGIN
            PERFORM pg_notify('durable_agent', 'turn ' || NEW.status || ' ' || NEW.turn_id);
            RETURN NULL;
        END
    $$;

-- an intent is not announced: a watcher is told of a step once, when its outcome is recorded
CREATE TRIGGER journal_step_done AFTER INSERT OR UPDATE OF status ON journal
    FOR EACH ROW WHEN (NEW.status = 'done') EXECUTE FUNCTION durable_agent_notify_step();

CREATE TRIGGER turns_status_changed AFTER UPDATE OF status ON turns
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION durable_agent_notify_turn();
