-- durable-agent schema, version 13: the audit trail. Every operator action (approve, deny,
-- resolve, cancel, prune, rekey) and a turn resumed under a changed agent is appended here:
-- who, when, what, through which interface, and the state before and after. The roles of
-- `durable-agent roles` let operators and workers append and nobody change a row.
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
