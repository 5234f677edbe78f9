-- The whole durable-agent schema at its latest version, in one place to read.
-- A new database gets it by applying migrations/ in order; a test checks that doing so
-- gives exactly this schema.

-- turns: one row per agent turn; the claim (lease_owner, lease_epoch, lease_expires_at)
-- fences writers.
CREATE TABLE turns (
    turn_id          text PRIMARY KEY,
    session_id       text NOT NULL,
    seq              integer NOT NULL,
    status           text NOT NULL DEFAULT 'queued'
                     CHECK (status IN ('queued', 'running', 'waiting', 'done', 'failed', 'cancelled')),
    message          text NOT NULL,
    reply            text,
    error            text,
    attempts         integer NOT NULL DEFAULT 0,
    crashes          integer NOT NULL DEFAULT 0,
    lease_owner      text,
    lease_epoch      integer NOT NULL DEFAULT 0,
    lease_expires_at timestamptz,
    not_before       timestamptz,
    enqueued_at      timestamptz,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    finished_at      timestamptz,
    queue               text NOT NULL DEFAULT '',
    message_id          text,
    received_message_id text,
    received_at         timestamptz,
    received_by         text,
    agent         text NOT NULL DEFAULT 'default',
    agent_digest  text,
    agent_spec    jsonb,
    agent_changes text,
    concurrency_key text,
    trace_context text,
    UNIQUE (session_id, seq)
);

COMMENT ON COLUMN turns.queue IS 'the Celery queue its messages go to ('''' for turns recorded before version 3: the sweeping worker''s own)';
COMMENT ON COLUMN turns.message_id IS 'the task id of the last message sent for the turn';
COMMENT ON COLUMN turns.received_message_id IS 'the task id of the last message a worker received for it';
COMMENT ON COLUMN turns.received_by IS 'the worker process that received it (host:pid:thread#token)';
COMMENT ON COLUMN turns.agent IS 'the agent the turn belongs to (''default'': the one configured by the environment)';
COMMENT ON COLUMN turns.agent_digest IS 'sha256 of the agent''s spec when the turn first ran (model, instructions, parameters, step cap, loop, tools)';
COMMENT ON COLUMN turns.agent_spec IS 'that spec, to say what changed when the turn resumes under another one';
COMMENT ON COLUMN turns.concurrency_key IS 'the turns of one key run at most DURABLE_AGENT_CONCURRENCY_PER_KEY at once, oldest first (NULL: no limit)';
COMMENT ON COLUMN turns.agent_changes IS 'what differed from agent_spec the last time the turn was resumed (NULL: nothing)';
COMMENT ON COLUMN turns.trace_context IS 'the traceparent (and tracestate) of the request that started the turn, as W3C headers in JSON (NULL: not traced)';

CREATE INDEX turns_open_idx ON turns (lease_expires_at) WHERE status IN ('queued', 'running');
CREATE INDEX turns_open_by_key_idx ON turns (concurrency_key, created_at, turn_id)
    WHERE concurrency_key IS NOT NULL AND status IN ('queued', 'running');
-- the newest send on a queue that some worker has received, and the newest reception
CREATE INDEX turns_received_sends_idx ON turns (queue, enqueued_at)
    WHERE received_message_id = message_id;
CREATE INDEX turns_receptions_idx ON turns (queue, received_at);
CREATE INDEX turns_sends_idx ON turns (queue, enqueued_at);
-- the open turns of a queue in the order they were sent (the sweeper's idle-queue probe)
CREATE INDEX turns_open_by_queue_idx ON turns (queue, enqueued_at)
    WHERE status IN ('queued', 'running');
-- prune finds finished turns by age
CREATE INDEX turns_finished_idx ON turns (finished_at)
    WHERE status IN ('done', 'failed', 'cancelled');
-- the console's turn list: newest first, paged by (created_at, turn_id), also of one status
CREATE INDEX turns_newest_idx ON turns (created_at, turn_id);
CREATE INDEX turns_status_newest_idx ON turns (status, created_at, turn_id);

-- blobs: large payloads stored once by content; journal rows keep the hash.
CREATE TABLE blobs (
    sha256     text PRIMARY KEY,
    data       jsonb NOT NULL,
    size_bytes integer NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- journal: the intent and outcome of every model and tool call, numbered within the turn.
CREATE TABLE journal (
    turn_id     text NOT NULL REFERENCES turns (turn_id) ON DELETE CASCADE,
    step        integer NOT NULL CHECK (step >= 0),
    kind        text NOT NULL CHECK (kind IN ('model', 'tool', 'wait')),
    name        text NOT NULL,
    input       jsonb NOT NULL,
    replay      text CHECK (replay IN ('safe', 'never')),
    status      text NOT NULL CHECK (status IN ('intent', 'done')),
    output      jsonb,
    output_blob text REFERENCES blobs (sha256),
    epoch       integer NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz,
    first_epoch  integer,
    failed_calls integer NOT NULL DEFAULT 0,
    PRIMARY KEY (turn_id, step)
);

-- the uncertain-effects inbox: never calls whose outcome is unknown
CREATE INDEX journal_uncertain_idx ON journal (created_at)
    WHERE replay = 'never' AND (status = 'intent' OR output @> '{"uncertain": true}');
-- prune asks whether a blob is still referenced
CREATE INDEX journal_output_blob_idx ON journal (output_blob) WHERE output_blob IS NOT NULL;

-- cancellations: who asked a turn to stop, and why; the turn ends 'cancelled' at its next
-- step boundary (at once when no worker holds it).
CREATE TABLE cancellations (
    turn_id      text PRIMARY KEY REFERENCES turns (turn_id) ON DELETE CASCADE,
    requested_by text NOT NULL,
    reason       text,
    requested_at timestamptz NOT NULL DEFAULT now()
);

-- approvals: a tool call that needs a person's yes before it runs; the turn waits
-- (status 'waiting', no claim) until the decision, which is taken once.
CREATE TABLE approvals (
    turn_id         text NOT NULL REFERENCES turns (turn_id) ON DELETE CASCADE,
    step            integer NOT NULL,
    tool            text NOT NULL,
    arguments       jsonb NOT NULL,
    idempotency_key text,
    requested_at    timestamptz NOT NULL DEFAULT now(),
    decision        text CHECK (decision IN ('approved', 'denied')),
    reason          text,
    decided_by      text,
    decided_at      timestamptz,
    PRIMARY KEY (turn_id, step)
);

-- Parked turns (version 12): a turn that waits for a decision, for time, for an event or
-- for a child agent is `waiting` with no claim, no lease and no message.
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

-- resolutions: an operator's verdict on an uncertain effect; the latest one counts. The
-- journal row it is about is never changed.
CREATE TABLE resolutions (
    resolution_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    turn_id       text NOT NULL,
    step          integer NOT NULL,
    verdict       text NOT NULL CHECK (verdict IN ('happened', 'not_happened', 'ignored')),
    note          text,
    resolved_by   text NOT NULL,
    resolved_at   timestamptz NOT NULL DEFAULT now(),
    FOREIGN KEY (turn_id, step) REFERENCES journal (turn_id, step) ON DELETE CASCADE
);
CREATE INDEX resolutions_step_idx ON resolutions (turn_id, step, resolution_id);

-- uncertain_notices: which hook ('task', 'callback'; 'all' before version 8) was told of
-- which uncertain effect (told_at), or is being told now by a pass that claimed it until
-- claimed_until (a claim that runs out is taken again: told at least once).
CREATE TABLE uncertain_notices (
    turn_id       text NOT NULL,
    step          integer NOT NULL,
    notified_at   timestamptz NOT NULL DEFAULT now(),
    hook          text NOT NULL DEFAULT 'all',
    told_at       timestamptz,
    claimed_by    text,
    claimed_until timestamptz,
    CONSTRAINT uncertain_notices_pkey PRIMARY KEY (turn_id, step, hook),
    FOREIGN KEY (turn_id, step) REFERENCES journal (turn_id, step) ON DELETE CASCADE
);

-- the spend ledger reads these: each claim from first_epoch up to the one that finished the
-- step ran its call again; failed_calls of those runs failed at the model API (not billed)
COMMENT ON COLUMN journal.first_epoch IS 'the epoch that wrote the intent (NULL for steps recorded before version 6: epoch)';
COMMENT ON COLUMN journal.failed_calls IS 'model calls of this step that failed at the API (not billed) before one succeeded';

-- The clock every lease, deferral and grace period is measured by (tests move it forward).
CREATE FUNCTION durable_agent_now() RETURNS timestamptz
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$ SELECT now() $$;

-- The earliest unfinished turn of a session before position `seq` (NULL when there is none):
-- a turn runs only after every earlier turn of its session has finished.
CREATE FUNCTION durable_agent_open_before(p_session_id text, p_seq integer) RETURNS text
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$
        SELECT turn_id FROM turns
        WHERE session_id = p_session_id AND seq < p_seq
          AND status IN ('queued', 'running', 'waiting')
        ORDER BY seq LIMIT 1
    $$;

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

-- Live turns: every finished step and every turn that ended is announced on the channel
-- `durable_agent` when its write commits; watchers read the rows themselves.
--   step <n> <turn_id>      journal row n of the turn is done
--   turn <status> <turn_id> the turn ended (done or failed)
-- Steps written without waiting for the WAL flush are announced by this trigger; durable
-- writes (a never tool's intent, the end of a turn) by their writer right after the commit
-- (query `announce`): a transaction that notifies holds a cluster-wide lock through its WAL
-- flush, which would make durable commits run one at a time.
CREATE FUNCTION durable_agent_notify_step() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
        BEGIN
            IF current_setting('synchronous_commit') = 'off' THEN
                PERFORM pg_notify('durable_agent', 'step ' || NEW.step || ' ' || NEW.turn_id);
            END IF;
            RETURN NULL;
        END
    $$;

-- an intent is not announced: a watcher is told of a step once, when its outcome is recorded
CREATE TRIGGER journal_step_done AFTER INSERT OR UPDATE OF status ON journal
    FOR EACH ROW WHEN (NEW.status = 'done') EXECUTE FUNCTION durable_agent_notify_step();

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

-- audit_log: every operator action (approve, deny, resolve, cancel, prune, rekey) and each
-- turn resumed under a changed agent, appended: who, when, what, through which interface
-- (cli, python, console; worker for what a worker notices), the state before and after.
-- Never updated: the roles of `durable-agent roles` may append and read, not change.
CREATE TABLE audit_log (
    audit_id  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at        timestamptz NOT NULL DEFAULT now(),
    actor     text NOT NULL,
    action    text NOT NULL
              CHECK (action IN ('approve', 'deny', 'resolve', 'cancel', 'prune', 'rekey',
                                'agent_changed')),
    interface text NOT NULL CHECK (interface IN ('cli', 'python', 'console', 'worker')),
    turn_id   text,
    step      integer,
    before    jsonb,
    after     jsonb
);
CREATE INDEX audit_log_at_idx ON audit_log (at);
CREATE INDEX audit_log_turn_idx ON audit_log (turn_id, audit_id) WHERE turn_id IS NOT NULL;

-- schema_version: the migrations a database has had (written by `durable-agent migrate`).
CREATE TABLE schema_version (
    version integer PRIMARY KEY,
    name text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);
