-- Every query durable-agent sends, by name. `:name` is a parameter; a block runs from its
-- `-- name:` line to the next one. Times that leases, deferrals and grace periods are
-- measured by come from durable_agent_now() (tests move it), never from the client's clock.

-- ---------------------------------------------------------------------------------------
-- turns
-- ---------------------------------------------------------------------------------------

-- name: create_turn
-- Record a new turn at the end of its session.
INSERT INTO turns (turn_id, session_id, seq, message, created_at, updated_at)
SELECT :turn_id, :session_id, coalesce(max(seq) + 1, 0), :message,
       durable_agent_now(), durable_agent_now()
FROM turns WHERE session_id = :session_id
RETURNING turn_id, session_id, seq, status, message, reply, error, attempts, crashes,
          lease_owner, lease_epoch, lease_expires_at, not_before, enqueued_at,
          created_at, updated_at, finished_at;

-- name: find_turn
SELECT turn_id, session_id, seq, status, message, reply, error, attempts, crashes,
       lease_owner, lease_epoch, lease_expires_at, not_before, enqueued_at,
       created_at, updated_at, finished_at
FROM turns WHERE turn_id = :turn_id;

-- name: list_turns
-- The newest turns first.
SELECT turn_id, session_id, seq, status, message, reply, error, attempts, crashes,
       lease_owner, lease_epoch, lease_expires_at, not_before, enqueued_at,
       created_at, updated_at, finished_at
FROM turns ORDER BY created_at DESC, turn_id LIMIT :limit;

-- name: list_session_turns
-- One session's turns in order.
SELECT turn_id, session_id, seq, status, message, reply, error, attempts, crashes,
       lease_owner, lease_epoch, lease_expires_at, not_before, enqueued_at,
       created_at, updated_at, finished_at
FROM turns WHERE session_id = :session_id ORDER BY seq LIMIT :limit;

-- name: session_history
-- (user message, reply) of the session's earlier done turns, in order.
SELECT message, reply FROM turns
WHERE session_id = :session_id AND seq < :seq AND status = 'done'
ORDER BY seq;

-- name: next_turn_in_session
-- The next unfinished turn after this position.
SELECT session_id, turn_id FROM turns
WHERE session_id = :session_id AND seq > :seq AND status IN ('queued', 'running')
ORDER BY seq LIMIT 1;

-- name: mark_enqueued
UPDATE turns SET enqueued_at = durable_agent_now() WHERE turn_id = ANY(:turn_ids);

-- ---------------------------------------------------------------------------------------
-- the journal: every write is fenced by the writer's epoch. The share lock on the turn row
-- makes a concurrent claim either wait for the write or make it write nothing.
-- ---------------------------------------------------------------------------------------

-- name: load_journal
-- Every step of a turn in order, large outputs joined in from blobs.
SELECT j.turn_id, j.step, j.kind, j.name, j.input, j.replay, j.status,
       coalesce(j.output, b.data) AS output, j.epoch, j.created_at, j.finished_at,
       j.output_blob AS blob
FROM journal AS j LEFT JOIN blobs AS b ON b.sha256 = j.output_blob
WHERE j.turn_id = :turn_id
ORDER BY j.step;

-- name: insert_step
-- An intent (status 'intent') or a call that ran nothing (status 'done').
WITH fence AS (
    SELECT turn_id FROM turns
    WHERE turn_id = :turn_id AND lease_epoch = :epoch AND status = 'running'
    FOR SHARE
)
INSERT INTO journal (turn_id, step, kind, name, input, replay, status, output, output_blob,
                     epoch, created_at, finished_at)
SELECT fence.turn_id, :step, :kind, :name, CAST(:input AS jsonb), :replay, :status,
       CAST(:output AS jsonb), :blob, :epoch, durable_agent_now(),
       CASE WHEN :status = 'done' THEN durable_agent_now() END
FROM fence
RETURNING step;

-- name: finish_step
-- The outcome of an intent.
WITH fence AS (
    SELECT turn_id FROM turns
    WHERE turn_id = :turn_id AND lease_epoch = :epoch AND status = 'running'
    FOR SHARE
)
UPDATE journal AS j
SET status = 'done', output = CAST(:output AS jsonb), output_blob = :blob, epoch = :epoch,
    finished_at = durable_agent_now()
FROM fence
WHERE j.turn_id = fence.turn_id AND j.step = :step AND j.status = 'intent'
RETURNING j.step;

-- name: insert_step_unfenced
-- The two-workers eval only: a stale worker's intent without the epoch fence, to show that
-- the primary key (turn_id, step) rejects it too.
INSERT INTO journal (turn_id, step, kind, name, input, replay, status, epoch)
VALUES (:turn_id, :step, 'model', 'llm', '{}', 'safe', 'intent', :epoch);

-- name: put_blob
INSERT INTO blobs (sha256, data, size_bytes) VALUES (:sha256, CAST(:data AS jsonb), :size)
ON CONFLICT (sha256) DO NOTHING;

-- ---------------------------------------------------------------------------------------
-- claims
-- ---------------------------------------------------------------------------------------

-- name: claim_turn
-- Take the turn when its lease is free, expired or already ours, it is not deferred, and
-- every earlier turn of its session has finished. Moves the epoch on and counts the attempt
-- (and a crash, when it takes over another holder's claim).
UPDATE turns AS t SET
    status = 'running',
    lease_owner = :owner,
    lease_epoch = t.lease_epoch + 1,
    attempts = t.attempts + 1,
    crashes = t.crashes
        + CASE WHEN t.lease_owner IS NOT NULL AND t.lease_owner <> :owner THEN 1 ELSE 0 END,
    lease_expires_at = durable_agent_now() + make_interval(secs => :lease_seconds),
    not_before = NULL,
    updated_at = durable_agent_now()
WHERE t.turn_id = :turn_id
  AND t.status IN ('queued', 'running')
  AND (t.lease_owner IS NULL OR t.lease_owner = :owner
       OR t.lease_expires_at <= durable_agent_now())
  AND (t.not_before IS NULL OR t.not_before <= durable_agent_now())
  AND durable_agent_open_before(t.session_id, t.seq) IS NULL
RETURNING t.turn_id, t.session_id, t.seq, t.status, t.message, t.reply, t.error, t.attempts,
          t.crashes, t.lease_owner, t.lease_epoch, t.lease_expires_at, t.not_before,
          t.enqueued_at, t.created_at, t.updated_at, t.finished_at;

-- name: claim_refusal
-- Why a claim failed: the turn as it is now, the clock, and the earlier turn it waits for.
SELECT turn_id, session_id, seq, status, message, reply, error, attempts, crashes,
       lease_owner, lease_epoch, lease_expires_at, not_before, enqueued_at,
       created_at, updated_at, finished_at,
       durable_agent_now() AS now,
       durable_agent_open_before(session_id, seq) AS waits_for
FROM turns WHERE turn_id = :turn_id;

-- name: renew_lease
UPDATE turns
SET lease_expires_at = durable_agent_now() + make_interval(secs => :lease_seconds)
WHERE turn_id = :turn_id AND lease_epoch = :epoch AND status = 'running'
RETURNING lease_expires_at;

-- name: still_held
SELECT lease_epoch = :epoch AND status = 'running' AND lease_expires_at > durable_agent_now()
FROM turns WHERE turn_id = :turn_id;

-- name: end_turn
-- Finish the turn (done or failed) if this epoch still holds it.
UPDATE turns
SET status = :status, reply = :reply, error = :error, lease_owner = NULL,
    lease_expires_at = NULL, finished_at = durable_agent_now(), updated_at = durable_agent_now()
WHERE turn_id = :turn_id AND lease_epoch = :epoch AND status = 'running'
RETURNING session_id, seq;

-- name: release_turn
-- Give the turn back (queued, journal kept), to be claimed again after a delay.
UPDATE turns
SET status = 'queued', error = :error, lease_owner = NULL, lease_expires_at = NULL,
    not_before = durable_agent_now() + make_interval(secs => :delay),
    updated_at = durable_agent_now()
WHERE turn_id = :turn_id AND lease_epoch = :epoch AND status = 'running'
RETURNING turn_id;

-- name: end_dead_claim
-- End at once a live claim whose holder is known to be dead.
UPDATE turns SET lease_expires_at = durable_agent_now(), updated_at = durable_agent_now()
WHERE turn_id = :turn_id AND lease_epoch = :epoch AND lease_owner = :owner
  AND status = 'running' AND lease_expires_at > durable_agent_now()
RETURNING turn_id;

-- name: live_claims_of_host
-- Live claims whose owner ends with this machine's token.
SELECT turn_id, lease_owner, lease_epoch FROM turns
WHERE status = 'running' AND lease_expires_at > durable_agent_now()
  AND lease_owner LIKE :pattern;

-- ---------------------------------------------------------------------------------------
-- the sweeper
-- ---------------------------------------------------------------------------------------

-- name: try_sweep_lock
-- One sweeper pass at a time across the fleet (held until the transaction ends).
SELECT pg_try_advisory_xact_lock(:key);

-- name: due_turns
-- Open turns with no live message: never enqueued (after a grace period), claim expired
-- (once per expiry), deferral over (once), or last enqueued long ago and still not running.
SELECT t.session_id, t.turn_id,
       CASE WHEN t.enqueued_at IS NULL THEN 'never enqueued'
            WHEN t.lease_owner IS NOT NULL
                 AND t.lease_expires_at <= durable_agent_now() THEN 'claim expired'
            WHEN t.not_before IS NOT NULL AND t.enqueued_at < t.not_before THEN 'deferral due'
            ELSE 'message may be lost' END AS why
FROM turns AS t
WHERE t.status IN ('queued', 'running')
  AND (t.lease_owner IS NULL OR t.lease_expires_at <= durable_agent_now())
  AND (t.not_before IS NULL OR t.not_before <= durable_agent_now())
  AND (
        (t.enqueued_at IS NULL
         AND t.created_at <= durable_agent_now() - make_interval(secs => :grace))
     OR (:claims_expire AND t.lease_owner IS NOT NULL
         AND t.lease_expires_at <= durable_agent_now()
         AND (t.enqueued_at IS NULL OR t.enqueued_at <= t.lease_expires_at))
     OR (t.not_before IS NOT NULL AND t.enqueued_at < t.not_before)
     OR (t.enqueued_at <= durable_agent_now() - make_interval(secs => :requeue_after))
  )
  AND durable_agent_open_before(t.session_id, t.seq) IS NULL
ORDER BY t.created_at
LIMIT :batch;

-- ---------------------------------------------------------------------------------------
-- schema versions and health
-- ---------------------------------------------------------------------------------------

-- name: ping
-- Postgres answers; the server process of this connection.
SELECT pg_backend_pid() AS backend_pid;

-- name: database_exists
-- The embedded Postgres of the demo and the evals: is its database there yet?
SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = 'durable_agent');

-- name: create_embedded_database
CREATE DATABASE durable_agent;

-- name: lock_migrations
-- One schema change at a time (held until the transaction ends).
SELECT pg_advisory_xact_lock(:key);

-- name: create_schema_version
CREATE TABLE IF NOT EXISTS schema_version (
    version integer PRIMARY KEY,
    name text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- name: applied_versions
SELECT version FROM schema_version ORDER BY version;

-- name: record_version
INSERT INTO schema_version (version, name) VALUES (:version, :name);

-- name: schema_version_exists
SELECT to_regclass('schema_version') IS NOT NULL;

-- name: max_schema_version
SELECT max(version) FROM schema_version;
