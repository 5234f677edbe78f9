-- durable-agent schema, version 5: operating it. A turn can be cancelled (it stops at its
-- next step boundary) or park while a tool call waits for a person's approval; uncertain
-- effects of `never` tools can be resolved by an operator (beside the journal, never in
-- it); finished turns can be pruned. Nothing here assumes the versions before it are
-- contiguous: it only needs the tables of version 1.
ALTER TABLE turns DROP CONSTRAINT turns_status_check;
ALTER TABLE turns ADD CONSTRAINT turns_status_check
    CHECK (status IN ('queued', 'running', 'waiting', 'done', 'failed', 'cancelled'));

-- a waiting turn (parked for an approval) still holds its place in the session
CREATE OR REPLACE FUNCTION durable_agent_open_before(p_session_id text, p_seq integer) RETURNS text
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$
        SELECT turn_id FROM turns
        WHERE session_id = p_session_id AND seq < p_seq
          AND status IN ('queued', 'running', 'waiting')
        ORDER BY seq LIMIT 1
    $$;

-- prune finds finished turns by age
CREATE INDEX turns_finished_idx ON turns (finished_at)
    WHERE status IN ('done', 'failed', 'cancelled');
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

-- uncertain_notices: the uncertain effects the notification hook was given (each once).
CREATE TABLE uncertain_notices (
    turn_id     text NOT NULL,
    step        integer NOT NULL,
    notified_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (turn_id, step),
    FOREIGN KEY (turn_id, step) REFERENCES journal (turn_id, step) ON DELETE CASCADE
);
