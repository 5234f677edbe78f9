-- durable-agent schema, version 1.
-- turns: one row per agent turn; the claim (lease_owner, lease_epoch, lease_expires_at) fences writers.
CREATE TABLE turns (
    turn_id          text PRIMARY KEY,
    session_id       text NOT NULL,
    seq              integer NOT NULL,
    status           text NOT NULL DEFAULT 'queued'
                     CHECK (status IN ('queued', 'running', 'done', 'failed')),
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
    UNIQUE (session_id, seq)
);

CREATE INDEX turns_open_idx ON turns (lease_expires_at) WHERE status IN ('queued', 'running');

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
    kind        text NOT NULL CHECK (kind IN ('model', 'tool')),
    name        text NOT NULL,
    input       jsonb NOT NULL,
    replay      text CHECK (replay IN ('safe', 'never')),
    status      text NOT NULL CHECK (status IN ('intent', 'done')),
    output      jsonb,
    output_blob text REFERENCES blobs (sha256),
    epoch       integer NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz,
    PRIMARY KEY (turn_id, step)
);
