-- Every query durable-agent sends, by name. `:name` is a parameter; a block runs from its
-- `-- name:` line to the next one. Times that leases, deferrals and grace periods are
-- measured by come from durable_agent_now() (tests move it), never from the client's clock.

-- ---------------------------------------------------------------------------------------
-- turns
-- ---------------------------------------------------------------------------------------

-- name: create_turn
-- Record a new turn at the end of its session.
INSERT INTO turns (turn_id, session_id, seq, message, queue, agent, trace_context,
                   created_at, updated_at, concurrency_key)
SELECT :turn_id, :session_id, coalesce(max(seq) + 1, 0), :message, :queue, :agent,
       :trace_context, durable_agent_now(), durable_agent_now(), CAST(:concurrency_key AS text)
FROM turns WHERE session_id = :session_id
RETURNING turn_id, session_id, seq, status, message, reply, error, attempts, crashes,
          lease_owner, lease_epoch, lease_expires_at, not_before, enqueued_at,
          created_at, updated_at, finished_at, queue, message_id, received_message_id,
          received_at, received_by, agent, agent_digest, agent_spec, agent_changes;

-- name: find_turn
SELECT turn_id, session_id, seq, status, message, reply, error, attempts, crashes,
       lease_owner, lease_epoch, lease_expires_at, not_before, enqueued_at,
       created_at, updated_at, finished_at, queue, message_id, received_message_id,
       received_at, received_by, agent, agent_digest, agent_spec, agent_changes
FROM turns WHERE turn_id = :turn_id;

-- name: list_turns
-- The newest turns first.
SELECT turn_id, session_id, seq, status, message, reply, error, attempts, crashes,
       lease_owner, lease_epoch, lease_expires_at, not_before, enqueued_at,
       created_at, updated_at, finished_at, queue, message_id, received_message_id,
       received_at, received_by, agent, agent_digest, agent_spec, agent_changes
FROM turns ORDER BY created_at DESC, turn_id LIMIT :limit;

-- name: list_session_turns
-- One session's turns in order.
SELECT turn_id, session_id, seq, status, message, reply, error, attempts, crashes,
       lease_owner, lease_epoch, lease_expires_at, not_before, enqueued_at,
       created_at, updated_at, finished_at, queue, message_id, received_message_id,
       received_at, received_by, agent, agent_digest, agent_spec, agent_changes
FROM turns WHERE session_id = :session_id ORDER BY seq LIMIT :limit;

-- name: session_history
-- (user message, reply) of the session's earlier done turns, in order.
SELECT turn_id, message, reply FROM turns
WHERE session_id = :session_id AND seq < :seq AND status = 'done'
ORDER BY seq;

-- name: record_turn_agent
-- The agent a claim runs the turn with: its digest and spec the first time (kept after),
-- and what differs from them when a later claim runs it under a changed agent. A report,
-- not a fence: committed without waiting for the WAL flush.
WITH quick AS (SELECT set_config('synchronous_commit', 'off', true))
UPDATE turns
SET agent_digest = coalesce(agent_digest, :digest),
    agent_spec = coalesce(agent_spec, CAST(:spec AS jsonb)),
    agent_changes = :changes
FROM quick
WHERE turn_id = :turn_id AND lease_epoch = :epoch AND status = 'running';

-- name: mark_sent
-- Before a message is published: which message is the turn's latest, and when it was sent.
-- Bookkeeping for the sweeper, committed without waiting for the WAL flush: lost in a
-- Postgres crash, the turn reads as never sent (or sent long ago) and the sweeper sends it
-- again; a second message of a turn is harmless (its claim decides who runs it, once).
WITH quick AS (SELECT set_config('synchronous_commit', 'off', true))
UPDATE turns AS t SET enqueued_at = durable_agent_now(), message_id = sent.message_id
FROM quick,
     unnest(CAST(:turn_ids AS text[]), CAST(:message_ids AS text[])) AS sent (turn_id, message_id)
WHERE t.turn_id = sent.turn_id;

-- name: unmark_sent
-- The publish failed: the turn has no message (unless another was sent since).
UPDATE turns SET enqueued_at = NULL, message_id = NULL
WHERE turn_id = :turn_id AND message_id = :message_id;

-- name: record_receipt
-- A worker received a message of the turn. A hint for the sweeper, not a record anyone
-- depends on: it is committed without waiting for the WAL flush.
WITH quick AS (SELECT set_config('synchronous_commit', 'off', true))
UPDATE turns
SET received_message_id = :message_id, received_at = durable_agent_now(),
    received_by = :receiver
FROM quick
WHERE turn_id = :turn_id AND status IN ('queued', 'running');

-- ---------------------------------------------------------------------------------------
-- the journal: every write is fenced by the writer's epoch. The share lock on the turn row
-- makes a concurrent claim either wait for the write or make it write nothing.
--
-- :durable says whether the write waits for the WAL flush. The intent of a `never` tool
-- does (before the tool runs); the other writes do not, its outcome included (lost in a
-- Postgres crash, the flushed intent reads as "may or may not have happened"). A worker
-- crash loses nothing of them: the commit happened, only its flush is late. A Postgres
-- crash can lose the last moments of the WAL, always a suffix of it, so what survives is
-- a prefix of the journal; any later durable commit (a `never` step, the end of the turn)
-- flushes everything before it; and a lost model or `safe` step is simply run again. A
-- writer that outlived such a crash cannot build on steps that are gone: a step is
-- inserted only after the one before it is done.
-- ---------------------------------------------------------------------------------------

-- name: load_journal
-- Every step of a turn in order, large outputs joined in from blobs. The columns are the
-- fields of records.Step, in its order: each row is built as Step(*columns).
SELECT j.turn_id, j.step, j.kind, j.name, j.input, j.replay, j.status,
       coalesce(j.output, b.data) AS output, j.epoch, j.created_at, j.finished_at,
       j.output_blob AS blob
FROM journal AS j LEFT JOIN blobs AS b ON b.sha256 = j.output_blob
WHERE j.turn_id = :turn_id
ORDER BY j.step;

-- name: load_journal_from
-- The steps of a turn from step :first on, in order (a watcher catching up).
SELECT j.turn_id, j.step, j.kind, j.name, j.input, j.replay, j.status,
       coalesce(j.output, b.data) AS output, j.epoch, j.created_at, j.finished_at,
       j.output_blob AS blob
FROM journal AS j LEFT JOIN blobs AS b ON b.sha256 = j.output_blob
WHERE j.turn_id = :turn_id AND j.step >= :first
ORDER BY j.step;

-- name: insert_step
-- An intent (status 'intent') or a call that ran nothing (status 'done'). A cancelled turn
-- takes no new step: this is the step boundary where a cancel stops it.
WITH flush AS (
    SELECT set_config('synchronous_commit',
                      CASE WHEN :durable THEN current_setting('synchronous_commit')
                           ELSE 'off' END, true)
),
fence AS (
    SELECT turn_id FROM turns, flush
    WHERE turn_id = :turn_id AND lease_epoch = :epoch AND status = 'running'
      AND NOT EXISTS (SELECT 1 FROM cancellations AS c WHERE c.turn_id = :turn_id)
      AND (:step = 0 OR EXISTS (SELECT 1 FROM journal AS before
                                WHERE before.turn_id = :turn_id AND before.step = :step - 1
                                  AND before.status = 'done'))
    FOR SHARE OF turns
)
INSERT INTO journal (turn_id, step, kind, name, input, replay, status, output, output_blob,
                     epoch, first_epoch, created_at, finished_at)
SELECT fence.turn_id, :step, :kind, :name, CAST(:input AS jsonb), :replay, :status,
       CAST(:output AS jsonb), :blob, :epoch, :epoch, durable_agent_now(),
       CASE WHEN :status = 'done' THEN durable_agent_now() END
FROM fence
RETURNING step;

-- name: finish_step
-- The outcome of an intent.
WITH flush AS (
    SELECT set_config('synchronous_commit',
                      CASE WHEN :durable THEN current_setting('synchronous_commit')
                           ELSE 'off' END, true)
),
fence AS (
    SELECT turn_id FROM turns, flush
    WHERE turn_id = :turn_id AND lease_epoch = :epoch AND status = 'running'
    FOR SHARE OF turns
)
UPDATE journal AS j
SET status = 'done', output = CAST(:output AS jsonb), output_blob = :blob, epoch = :epoch,
    finished_at = durable_agent_now()
FROM fence
WHERE j.turn_id = :turn_id AND j.turn_id = fence.turn_id AND j.step = :step
  AND j.status = 'intent'
RETURNING j.step;

-- name: finish_and_insert_step
-- The outcome of step :step - 1 (a model call or a safe tool, held back by the writer) and
-- the next step in one round trip: insert_step's fence, and the step before it done here.
-- A cancel stops the new step, not the outcome of the call that already ran.
WITH flush AS (
    SELECT set_config('synchronous_commit',
                      CASE WHEN :durable THEN current_setting('synchronous_commit')
                           ELSE 'off' END, true)
),
fence AS (
    SELECT turn_id FROM turns, flush
    WHERE turn_id = :turn_id AND lease_epoch = :epoch AND status = 'running'
    FOR SHARE OF turns
),
finished AS (
    UPDATE journal AS j
    SET status = 'done', output = CAST(:before_output AS jsonb), output_blob = :before_blob,
        epoch = :epoch, finished_at = durable_agent_now()
    FROM fence
    WHERE j.turn_id = :turn_id AND j.turn_id = fence.turn_id AND j.step = :step - 1
      AND j.status = 'intent'
    RETURNING j.turn_id
)
INSERT INTO journal (turn_id, step, kind, name, input, replay, status, output, output_blob,
                     epoch, first_epoch, created_at, finished_at)
SELECT finished.turn_id, :step, :kind, :name, CAST(:input AS jsonb), :replay, :status,
       CAST(:output AS jsonb), :blob, :epoch, :epoch, durable_agent_now(),
       CASE WHEN :status = 'done' THEN durable_agent_now() END
FROM finished
WHERE NOT EXISTS (SELECT 1 FROM cancellations AS c WHERE c.turn_id = :turn_id)
RETURNING step;

-- name: note_failed_call
-- The model call in flight failed at the API (it kept answering 5xx or 429, or a 200 that
-- is no completion): not billed, so the next run of this step is no crash's waste.
UPDATE journal AS j SET failed_calls = j.failed_calls + 1
FROM turns AS t
WHERE t.turn_id = :turn_id AND t.lease_epoch = :epoch AND t.status = 'running'
  AND j.turn_id = t.turn_id AND j.kind = 'model' AND j.status = 'intent';

-- name: put_blob
-- Before the step that refers to it (WAL order keeps it there whenever the step survives).
-- A blob stored again is made young again, so prune (which spares young blobs) cannot
-- delete it between this write and the step that refers to it.
WITH flush AS (SELECT set_config('synchronous_commit', 'off', true))
INSERT INTO blobs (sha256, data, size_bytes)
SELECT :sha256, CAST(:data AS jsonb), :size FROM flush
ON CONFLICT (sha256) DO UPDATE SET created_at = durable_agent_now();

-- ---------------------------------------------------------------------------------------
-- claims
-- ---------------------------------------------------------------------------------------

-- name: claim_turn
-- :agents (JSON by agent name of {digest, spec}, NULL: none) are the claimer's agents: the
-- turn's first claim records its agent's digest and spec with it, no statement of its own.
-- Take the turn when its lease is free, expired or already ours, it is not deferred, it
-- belongs to one of the claimer's queues (NULL: any), every earlier turn of its session
-- has finished, and its concurrency key (if any) has room under :key_limit (NULL: none). Moves the epoch on and counts the attempt (and a crash, when it takes over
-- another holder's claim).
UPDATE turns AS t SET
    status = 'running',
    lease_owner = :owner,
    lease_epoch = t.lease_epoch + 1,
    attempts = t.attempts + 1,
    crashes = t.crashes
        + CASE WHEN t.lease_owner IS NOT NULL AND t.lease_owner <> :owner THEN 1 ELSE 0 END,
    lease_expires_at = durable_agent_now() + make_interval(secs => :lease_seconds),
    not_before = NULL,
    updated_at = durable_agent_now(),
    agent_digest = coalesce(t.agent_digest, CAST(:agents AS jsonb) -> t.agent ->> 'digest'),
    agent_spec = coalesce(t.agent_spec, CAST(:agents AS jsonb) -> t.agent -> 'spec')
WHERE t.turn_id = :turn_id
  AND t.status IN ('queued', 'running')
  AND (t.lease_owner IS NULL OR t.lease_owner = :owner
       OR t.lease_expires_at <= durable_agent_now())
  AND (t.not_before IS NULL OR t.not_before <= durable_agent_now())
  AND (CAST(:queues AS text[]) IS NULL OR t.queue = '' OR t.queue = ANY(:queues))
  AND durable_agent_open_before(t.session_id, t.seq) IS NULL
  AND (t.concurrency_key IS NULL OR CAST(:key_limit AS integer) IS NULL
       OR NOT durable_agent_key_busy(t.concurrency_key, t.turn_id, t.created_at,
                                     CAST(:key_limit AS integer)))
RETURNING t.turn_id, t.session_id, t.seq, t.status, t.message, t.reply, t.error, t.attempts,
          t.crashes, t.lease_owner, t.lease_epoch, t.lease_expires_at, t.not_before,
          t.enqueued_at, t.created_at, t.updated_at, t.finished_at, t.queue, t.message_id,
          t.received_message_id, t.received_at, t.received_by, t.agent, t.agent_digest,
          t.agent_spec, t.agent_changes;

-- name: claim_refusal
-- Why a claim failed: the turn as it is now, the clock, and the earlier turn it waits for.
SELECT turn_id, session_id, seq, status, message, reply, error, attempts, crashes,
       lease_owner, lease_epoch, lease_expires_at, not_before, enqueued_at,
       created_at, updated_at, finished_at, queue, message_id, received_message_id,
       received_at, received_by, agent, agent_digest, agent_spec, agent_changes,
       durable_agent_now() AS now,
       durable_agent_open_before(session_id, seq) AS waits_for,
       concurrency_key,
       concurrency_key IS NOT NULL AND CAST(:key_limit AS integer) IS NOT NULL
       AND durable_agent_key_busy(concurrency_key, turn_id, created_at,
                                  CAST(:key_limit AS integer)) AS key_busy
FROM turns WHERE turn_id = :turn_id;

-- name: wait_for_key
-- A turn refused for its concurrency key waits, queued, with no claim, until a turn of its
-- key ends and wakes it (wake_next_of_key), or :delay seconds (the sweeper sends it then).
UPDATE turns
SET not_before = durable_agent_now() + make_interval(secs => :delay),
    error = 'waits for a slot of its concurrency key', updated_at = durable_agent_now()
WHERE turn_id = :turn_id AND status = 'queued'
RETURNING turn_id;

-- name: key_admits
-- Whether a new turn of a concurrency key may be sent at once (fewer than :key_limit others
-- of its key run or are sent).
SELECT durable_agent_key_admits(concurrency_key, turn_id, CAST(:key_limit AS integer))
FROM turns WHERE turn_id = :turn_id;

-- name: unwait_key
-- A turn that waited for its key is sent: due at once.
UPDATE turns SET not_before = NULL, error = NULL, updated_at = durable_agent_now()
WHERE turn_id = :turn_id AND status = 'queued'
  AND error = 'waits for a slot of its concurrency key'
RETURNING turn_id;

-- name: wake_next_of_key
-- A turn of the key of :turn_id ended: the oldest turn of that key still queued (and not
-- deferred for another reason: a model outage, its budget) is due now.
UPDATE turns AS o
SET not_before = NULL, error = NULL, updated_at = durable_agent_now()
WHERE o.turn_id = (
    SELECT w.turn_id FROM turns AS w
    JOIN turns AS t ON t.turn_id = :turn_id AND w.concurrency_key = t.concurrency_key
    WHERE w.status = 'queued' AND w.turn_id <> t.turn_id
      AND (w.not_before IS NULL OR w.not_before <= durable_agent_now()
           OR w.error = 'waits for a slot of its concurrency key')
    ORDER BY w.created_at, w.turn_id
    LIMIT 1
)
RETURNING o.session_id, o.turn_id, o.queue;

-- name: renew_lease
-- Without a WAL wait: a renewal lost in a Postgres crash only lets the lease end sooner,
-- and a takeover then fences this claim's writes (the claim itself is durable).
WITH quick AS (SELECT set_config('synchronous_commit', 'off', true))
UPDATE turns
SET lease_expires_at = durable_agent_now() + make_interval(secs => :lease_seconds)
FROM quick
WHERE turn_id = :turn_id AND lease_epoch = :epoch AND status = 'running'
RETURNING lease_expires_at;

-- name: still_held
SELECT lease_epoch = :epoch AND status = 'running' AND lease_expires_at > durable_agent_now()
FROM turns WHERE turn_id = :turn_id;

-- name: end_turn
-- Finish the turn (done or failed) if this epoch still holds it; the next unfinished turn
-- of its session comes back with it (NULLs when there is none). Waits for the WAL flush,
-- which takes every earlier write of the turn with it: a reply someone may read is on disk.
-- :held_step (NULL: none) is a step whose outcome the writer held back (the model call
-- that gave the reply): it is written here too, and the turn ends only if it was.
-- A turn that would end done but was cancelled before this commits ends `cancelled`, its
-- reply kept in the journal (the held step): the end is a step boundary. The cancel updates
-- the turn row (request_cancel), so either it waits for this end and finds the turn ended,
-- or this end waits for it and, re-checked on the row the cancel wrote, asks
-- durable_agent_cancel_note() again with a fresh snapshot.
WITH held AS (
    UPDATE journal AS j
    SET status = 'done', output = CAST(:held_output AS jsonb), output_blob = :held_blob,
        epoch = :epoch, finished_at = durable_agent_now()
    FROM turns AS t
    WHERE j.turn_id = :turn_id AND j.step = CAST(:held_step AS integer) AND j.status = 'intent'
      AND t.turn_id = j.turn_id AND t.lease_epoch = :epoch AND t.status = 'running'
    RETURNING j.step
),
ended AS (
    UPDATE turns
    SET status = CASE WHEN :status = 'done' AND durable_agent_cancel_note(turn_id) IS NOT NULL
                      THEN 'cancelled' ELSE :status END,
        reply = CASE WHEN :status = 'done' AND durable_agent_cancel_note(turn_id) IS NOT NULL
                     THEN NULL ELSE :reply END,
        error = CASE WHEN :status = 'done'
                     THEN coalesce(durable_agent_cancel_note(turn_id), :error) ELSE :error END,
        lease_owner = NULL, lease_expires_at = NULL, finished_at = durable_agent_now(),
        updated_at = durable_agent_now()
    WHERE turn_id = :turn_id AND lease_epoch = :epoch AND status = 'running'
      AND (CAST(:held_step AS integer) IS NULL OR EXISTS (SELECT 1 FROM held))
    RETURNING session_id, seq, status
)
SELECT ended.session_id, ended.seq, ended.status, next.turn_id AS next_turn_id,
       next.queue AS next_queue
FROM ended
LEFT JOIN LATERAL durable_agent_next_open(ended.session_id, ended.seq) AS next ON true;

-- name: release_turn
-- Give the turn back (queued, journal kept), to be claimed again after a delay.
UPDATE turns
SET status = 'queued', error = :error, lease_owner = NULL, lease_expires_at = NULL,
    not_before = durable_agent_now() + make_interval(secs => :delay),
    updated_at = durable_agent_now()
WHERE turn_id = :turn_id AND lease_epoch = :epoch AND status = 'running'
RETURNING turn_id;

-- name: defer_unclaimed
-- A turn no live claim holds waits :delay seconds before the sweeper sends it again (a
-- turn handed back to its queue that came back to the same worker).
UPDATE turns
SET not_before = durable_agent_now() + make_interval(secs => :delay),
    updated_at = durable_agent_now()
WHERE turn_id = :turn_id AND status IN ('queued', 'running')
  AND (lease_owner IS NULL OR lease_expires_at <= durable_agent_now())
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

-- name: database_now
-- The clock every recorded time is taken by.
SELECT durable_agent_now() AS now;

-- name: try_sweep_lock
-- One sweeper pass at a time across the fleet (held until the transaction ends).
SELECT pg_try_advisory_xact_lock(:key);

-- name: due_turns
-- Open turns that have no live message, each once, with the reason:
--   woken                a parked turn woke and has not been sent since (a woken turn is
--                        sent at once by whoever woke it; this is the fallback)
--   never enqueued       recorded, never sent (after a grace period)
--   claim expired        its holder's lease ran out (once per expiry)
--   deferral due         given back after a model outage, and now due (once)
--   receiver died        a worker received its message and never claimed it: the worker is
--                        gone (:dead_receivers) or has not claimed it within a lease (also
--                        when the turn still shows the expired claim of an earlier holder)
--   message lost         a message sent later on the same queue has been received, but not
--                        this one (queues are FIFO)
--   queue idle           nothing was sent to or received from its queue for requeue_after:
--                        the oldest unreceived turn is sent again, as a probe (one per queue
--                        per requeue_after)
-- Only turns no live claim holds are looked at: an expired claim counts as none, so a turn
-- re-sent after its claim expired is sent again if that message is lost too.
-- A turn waiting for an earlier turn of its session is not due: that turn's end sends it.
-- A turn parked for an approval ('waiting') is never due: the decision sends it.
-- Cost: one pass over the open turns, the queue figures once per queue, and the session
-- order checked (an index probe) on the due turns in order only until a batch is found
-- (OFFSET 0 keeps the planner from checking all of them first, whatever its statistics):
-- a backlog of 10,000 open turns costs milliseconds, and finished turns cost nothing.
WITH queues AS MATERIALIZED (
    SELECT q.queue,
           (SELECT max(w.enqueued_at) FROM turns AS w
            WHERE w.queue = q.queue AND w.received_message_id = w.message_id) AS received_upto,
           (SELECT max(w.enqueued_at) FROM turns AS w WHERE w.queue = q.queue) AS last_sent,
           (SELECT max(w.received_at) FROM turns AS w WHERE w.queue = q.queue) AS last_received
    FROM (SELECT DISTINCT queue FROM turns WHERE status IN ('queued', 'running')) AS q
),
probes AS MATERIALIZED (
    -- the oldest unreceived turn that could run, of each queue idle for requeue_after
    SELECT p.turn_id
    FROM queues AS q CROSS JOIN LATERAL (
        SELECT w.turn_id FROM turns AS w
        WHERE w.queue = q.queue AND w.status IN ('queued', 'running')
          AND (w.lease_owner IS NULL OR w.lease_expires_at <= durable_agent_now())
          AND w.message_id IS NOT NULL
          AND w.received_message_id IS DISTINCT FROM w.message_id
          AND (w.not_before IS NULL OR w.not_before <= durable_agent_now())
          AND durable_agent_open_before(w.session_id, w.seq) IS NULL
        ORDER BY w.enqueued_at, w.turn_id
        LIMIT 1
    ) AS p
    WHERE q.last_sent <= durable_agent_now() - make_interval(secs => :requeue_after)
      AND (q.last_received IS NULL
           OR q.last_received <= durable_agent_now() - make_interval(secs => :requeue_after))
),
due AS (
    SELECT c.session_id, c.seq, c.turn_id, c.queue, c.created_at, c.trace_context,
           CASE
             WHEN c.enqueued_at IS NULL AND c.lease_owner IS NULL AND c.lease_epoch > 0
               THEN 'woken'
             WHEN c.enqueued_at IS NULL
                  AND c.created_at <= durable_agent_now() - make_interval(secs => :grace)
               THEN 'never enqueued'
             WHEN :claims_expire AND c.lease_owner IS NOT NULL
                  AND (c.enqueued_at IS NULL OR c.enqueued_at <= c.lease_expires_at)
               THEN 'claim expired'
             WHEN c.not_before IS NOT NULL AND c.enqueued_at < c.not_before
               THEN 'deferral due'
             WHEN c.received_message_id = c.message_id
                  AND (c.received_by = ANY(CAST(:dead_receivers AS text[]))
                       OR c.received_at <= durable_agent_now() - make_interval(secs => :lease))
                  AND c.received_at >= c.updated_at
               THEN 'receiver died'
             WHEN c.message_id IS NOT NULL
                  AND c.received_message_id IS DISTINCT FROM c.message_id
                  AND c.enqueued_at < q.received_upto - make_interval(secs => :lease)
               THEN 'message lost'
             WHEN c.turn_id IN (SELECT turn_id FROM probes)
               THEN 'queue idle'
           END AS why
    FROM turns AS c JOIN queues AS q ON q.queue = c.queue
    WHERE c.status IN ('queued', 'running')
      AND (c.not_before IS NULL OR c.not_before <= durable_agent_now())
      AND (c.lease_owner IS NULL OR c.lease_expires_at <= durable_agent_now())
)
SELECT d.session_id, d.turn_id, d.queue, d.why, d.trace_context
FROM (SELECT * FROM due WHERE why IS NOT NULL ORDER BY created_at OFFSET 0) AS d
WHERE NOT EXISTS (SELECT 1 FROM turns AS e
                  WHERE e.session_id = d.session_id AND e.seq < d.seq
                    AND e.status IN ('queued', 'running', 'waiting'))
ORDER BY d.created_at
LIMIT :batch;

-- name: unclaimed_receivers
-- The workers of this machine (owner ending with its token) that received a message of an
-- open turn and have not claimed it yet: the sweeper asks whether they still run.
SELECT DISTINCT received_by FROM turns
WHERE status IN ('queued', 'running') AND received_by LIKE :pattern
  AND (lease_owner IS NULL OR lease_expires_at <= durable_agent_now())
  AND received_message_id = message_id;

-- ---------------------------------------------------------------------------------------
-- operating it: cancel, prune, the uncertain-effects inbox, approvals (journal/operator_store.py)
-- ---------------------------------------------------------------------------------------

-- name: request_cancel
-- Ask an open turn to stop (once: a second request keeps the first one's who and why).
-- The turn row is updated (to itself) so that an end of the turn running at the same time
-- is ordered with this request on the row lock (see end_turn).
WITH open AS (
    UPDATE turns SET status = status
    WHERE turn_id = :turn_id AND status IN ('queued', 'running', 'waiting')
    RETURNING turn_id
)
INSERT INTO cancellations (turn_id, requested_by, reason, requested_at)
SELECT turn_id, :requested_by, :reason, durable_agent_now() FROM open
ON CONFLICT (turn_id) DO NOTHING
RETURNING turn_id;

-- name: find_cancellation
SELECT turn_id, requested_by, reason, requested_at FROM cancellations WHERE turn_id = :turn_id;

-- name: end_unheld_cancelled
-- End at once a cancelled turn that no worker holds (queued, waiting, or its claim ran
-- out); with the next unfinished turn of its session, which may run now.
WITH ended AS (
    UPDATE turns AS t
    SET status = 'cancelled',
        error = 'cancelled by ' || c.requested_by || coalesce(': ' || c.reason, ''),
        lease_owner = NULL, lease_expires_at = NULL, not_before = NULL,
        finished_at = durable_agent_now(), updated_at = durable_agent_now()
    FROM cancellations AS c
    WHERE t.turn_id = :turn_id AND c.turn_id = t.turn_id
      AND (t.status IN ('queued', 'waiting')
           OR (t.status = 'running' AND t.lease_expires_at <= durable_agent_now()))
    RETURNING t.session_id, t.seq, t.turn_id
),
unparked AS (  -- a parked turn waits for nothing any more
    DELETE FROM waits AS w USING ended WHERE w.turn_id = ended.turn_id
)
SELECT ended.session_id, ended.seq, next.turn_id AS next_turn_id, next.queue AS next_queue
FROM ended
LEFT JOIN LATERAL durable_agent_next_open(ended.session_id, ended.seq) AS next ON true;

-- name: end_claimed_cancelled
-- The worker holding a cancelled turn ends it at a step boundary (fenced by its epoch).
WITH ended AS (
    UPDATE turns AS t
    SET status = 'cancelled',
        error = 'cancelled by ' || c.requested_by || coalesce(': ' || c.reason, ''),
        lease_owner = NULL, lease_expires_at = NULL,
        finished_at = durable_agent_now(), updated_at = durable_agent_now()
    FROM cancellations AS c
    WHERE t.turn_id = :turn_id AND c.turn_id = t.turn_id AND t.lease_epoch = :epoch
      AND t.status = 'running'
    RETURNING t.session_id, t.seq
)
SELECT ended.session_id, ended.seq, next.turn_id AS next_turn_id, next.queue AS next_queue
FROM ended
LEFT JOIN LATERAL durable_agent_next_open(ended.session_id, ended.seq) AS next ON true;

-- name: prune_preview
-- What prune would delete: finished turns older than the cutoff whose session has no open
-- turn, that are no child of an open turn (its wait step reads the child's reply) and that
-- have no unresolved uncertain effect; and the old finished turns it keeps: those of a
-- session with an open turn or of an open parent (kept_open), the others for their unresolved
-- uncertain effects (kept).
WITH old AS (
    SELECT t.turn_id,
           EXISTS (SELECT 1 FROM journal AS j
                   WHERE j.turn_id = t.turn_id AND j.replay = 'never'
                     AND (j.status = 'intent' OR j.output @> '{"uncertain": true}')
                     AND NOT EXISTS (SELECT 1 FROM resolutions AS r
                                     WHERE r.turn_id = j.turn_id AND r.step = j.step))
             AS unresolved,
           EXISTS (SELECT 1 FROM turns AS o WHERE o.session_id = t.session_id
                   AND o.status IN ('queued', 'running', 'waiting'))
           OR EXISTS (SELECT 1 FROM child_turns AS c
                      JOIN turns AS p ON p.turn_id = c.parent_turn_id
                      WHERE c.turn_id = t.turn_id
                        AND p.status IN ('queued', 'running', 'waiting'))
             AS open_session
    FROM turns AS t
    WHERE t.status IN ('done', 'failed', 'cancelled')
      AND t.finished_at < durable_agent_now() - make_interval(secs => :older_than)
)
SELECT count(*) FILTER (WHERE NOT unresolved AND NOT open_session) AS turns,
       (SELECT count(*) FROM journal AS j
        WHERE j.turn_id IN (SELECT turn_id FROM old
                            WHERE NOT unresolved AND NOT open_session)) AS steps,
       count(*) FILTER (WHERE unresolved AND NOT open_session) AS kept,
       count(*) FILTER (WHERE open_session) AS kept_open
FROM old;

-- name: prune_turns
-- Delete one batch of what prune_preview counts (their journal, approvals, cancellations
-- and resolutions go with them). Rows another transaction holds are skipped, not waited for.
WITH doomed AS (
    SELECT t.turn_id FROM turns AS t
    WHERE t.status IN ('done', 'failed', 'cancelled')
      AND t.finished_at < durable_agent_now() - make_interval(secs => :older_than)
      AND NOT EXISTS (SELECT 1 FROM turns AS o WHERE o.session_id = t.session_id
                      AND o.status IN ('queued', 'running', 'waiting'))
      AND NOT EXISTS (SELECT 1 FROM child_turns AS c
                      JOIN turns AS p ON p.turn_id = c.parent_turn_id
                      WHERE c.turn_id = t.turn_id
                        AND p.status IN ('queued', 'running', 'waiting'))
      AND NOT EXISTS (SELECT 1 FROM journal AS j
                      WHERE j.turn_id = t.turn_id AND j.replay = 'never'
                        AND (j.status = 'intent' OR j.output @> '{"uncertain": true}')
                        AND NOT EXISTS (SELECT 1 FROM resolutions AS r
                                        WHERE r.turn_id = j.turn_id AND r.step = j.step))
    ORDER BY t.finished_at
    LIMIT :batch
    FOR UPDATE OF t SKIP LOCKED
),
steps AS (SELECT count(*) AS n FROM journal WHERE turn_id IN (SELECT turn_id FROM doomed)),
gone AS (DELETE FROM turns WHERE turn_id IN (SELECT turn_id FROM doomed) RETURNING turn_id)
SELECT (SELECT count(*) FROM gone) AS turns, (SELECT n FROM steps) AS steps;

-- name: prune_blobs
-- Delete one batch of blobs no journal row refers to, sparing those stored within :grace
-- seconds (their step may be about to be written).
DELETE FROM blobs WHERE sha256 IN (
    SELECT b.sha256 FROM blobs AS b
    WHERE b.created_at < durable_agent_now() - make_interval(secs => :grace)
      AND NOT EXISTS (SELECT 1 FROM journal AS j WHERE j.output_blob = b.sha256)
    LIMIT :batch
    FOR UPDATE SKIP LOCKED
)
RETURNING sha256;

-- name: uncertain_effects
-- never calls whose outcome is unknown: interrupted or raised (recorded "uncertain"), or an
-- intent left in a turn that ended; with the latest resolution, if any.
SELECT j.turn_id, j.step, j.name AS tool, j.input, j.status, j.output, j.created_at,
       t.session_id, t.status AS turn_status, t.agent,
       r.verdict, r.note, r.resolved_by, r.resolved_at
FROM journal AS j
JOIN turns AS t ON t.turn_id = j.turn_id
LEFT JOIN LATERAL (
    SELECT verdict, note, resolved_by, resolved_at FROM resolutions AS r
    WHERE r.turn_id = j.turn_id AND r.step = j.step
    ORDER BY r.resolution_id DESC LIMIT 1
) AS r ON true
WHERE j.replay = 'never'
  AND (j.output @> '{"uncertain": true}'
       OR (j.status = 'intent' AND t.status IN ('done', 'failed', 'cancelled')))
  AND j.created_at >= coalesce(CAST(:since AS timestamptz), '-infinity')
  AND (CAST(:turn_id AS text) IS NULL OR j.turn_id = :turn_id)
  AND (CAST(:step AS integer) IS NULL OR j.step = :step)
  AND (CAST(:agent AS text) IS NULL OR t.agent = :agent)
  AND (:include_resolved OR r.verdict IS NULL)
ORDER BY j.created_at, j.turn_id, j.step
LIMIT :limit;

-- name: record_resolution
-- An operator's verdict on an uncertain effect (the journal row is not touched); nothing
-- when the effect has a verdict already, unless :replace (the earlier ones stay on record).
INSERT INTO resolutions (turn_id, step, verdict, note, resolved_by, resolved_at)
SELECT :turn_id, :step, :verdict, :note, :resolved_by, durable_agent_now()
WHERE :replace OR NOT EXISTS (SELECT 1 FROM resolutions
                              WHERE turn_id = :turn_id AND step = :step)
RETURNING resolved_at;

-- name: claim_uncertain_notices
-- Uncertain effects some of :hooks was not told of yet, claimed for :hold seconds by
-- :owner, one row per (effect, hook), oldest first. A row another pass claimed and still
-- holds, or that was told, is not taken; one whose claim ran out is (at least once).
WITH effects AS (
    SELECT j.turn_id, j.step, j.created_at
    FROM journal AS j JOIN turns AS t ON t.turn_id = j.turn_id
    WHERE j.replay = 'never'
      AND (j.output @> '{"uncertain": true}'
           OR (j.status = 'intent' AND t.status IN ('done', 'failed', 'cancelled')))
),
wanted AS (
    SELECT e.turn_id, e.step, h.hook
    FROM effects AS e CROSS JOIN unnest(CAST(:hooks AS text[])) AS h (hook)
    WHERE NOT EXISTS (SELECT 1 FROM uncertain_notices AS n
                      WHERE n.turn_id = e.turn_id AND n.step = e.step
                        AND (n.hook = 'all'
                             OR (n.hook = h.hook
                                 AND (n.told_at IS NOT NULL
                                      OR n.claimed_until > durable_agent_now()))))
    ORDER BY e.created_at, e.turn_id, e.step, h.hook
    LIMIT :batch
)
INSERT INTO uncertain_notices AS n (turn_id, step, hook, notified_at, claimed_by, claimed_until)
SELECT turn_id, step, hook, durable_agent_now(), :owner,
       durable_agent_now() + make_interval(secs => :hold)
FROM wanted
ON CONFLICT (turn_id, step, hook) DO UPDATE
    SET claimed_by = excluded.claimed_by, claimed_until = excluded.claimed_until
    WHERE n.told_at IS NULL AND n.claimed_until <= durable_agent_now()
RETURNING n.turn_id, n.step, n.hook;

-- name: notice_told
-- The claimant told the hook: the notice is done, whoever holds the claim now.
UPDATE uncertain_notices SET told_at = durable_agent_now(), claimed_until = NULL
WHERE turn_id = :turn_id AND step = :step AND hook = :hook AND told_at IS NULL;

-- name: release_notice
-- The claimant could not tell the hook (it raised): the next pass tries again.
UPDATE uncertain_notices SET claimed_until = durable_agent_now()
WHERE turn_id = :turn_id AND step = :step AND hook = :hook AND claimed_by = :owner
  AND told_at IS NULL;

-- name: find_approval
SELECT turn_id, step, tool, arguments, idempotency_key, requested_at, decision, reason,
       decided_by, decided_at
FROM approvals WHERE turn_id = :turn_id AND step = :step;

-- name: list_approvals
-- Calls of waiting turns that wait for a decision (or all, with the turn's status), oldest
-- first. A call left pending by a turn that was cancelled meanwhile waits for nothing.
SELECT a.turn_id, a.step, a.tool, a.arguments, a.idempotency_key, a.requested_at,
       a.decision, a.reason, a.decided_by, a.decided_at, t.status AS turn_status
FROM approvals AS a JOIN turns AS t ON t.turn_id = a.turn_id
WHERE (:include_decided OR (a.decision IS NULL AND t.status = 'waiting'))
  AND (CAST(:turn_id AS text) IS NULL OR a.turn_id = :turn_id)
ORDER BY a.requested_at, a.turn_id, a.step
LIMIT :limit;

-- name: park_for_approval
-- The claim's holder parks the turn at a tool call that needs approval (durable_agent_park,
-- kind 'approval', no due time) and records the call as pending, in one statement: the turn
-- waits with no claim, no lease and no message until a decision sends it again. Fenced by
-- the epoch; a cancelled turn does not park.
WITH parked AS (
    SELECT durable_agent_park(:turn_id, :epoch, :step, 'approval', :tool, NULL) AS ok
),
asked AS (
    INSERT INTO approvals (turn_id, step, tool, arguments, idempotency_key, requested_at)
    SELECT :turn_id, :step, :tool, CAST(:arguments AS jsonb), :idempotency_key,
           durable_agent_now()
    FROM parked WHERE ok
    ON CONFLICT (turn_id, step) DO NOTHING
)
SELECT CAST(:turn_id AS text) AS turn_id FROM parked WHERE ok;

-- name: decide_approval
-- Approve or deny a pending call of a waiting turn, once; the turn wakes (queued, its wait
-- gone; the caller sends it). Nothing changes unless the call is pending and the turn waiting.
WITH decided AS (
    UPDATE approvals
    SET decision = :decision, reason = :reason, decided_by = :decided_by,
        decided_at = durable_agent_now()
    WHERE turn_id = :turn_id AND step = :step AND decision IS NULL
      AND EXISTS (SELECT 1 FROM turns WHERE turn_id = :turn_id AND status = 'waiting')
    RETURNING turn_id
),
unparked AS (
    DELETE FROM waits AS w USING decided WHERE w.turn_id = decided.turn_id
)
UPDATE turns AS t
SET status = 'queued', enqueued_at = NULL, message_id = NULL, updated_at = durable_agent_now()
FROM decided
WHERE t.turn_id = decided.turn_id AND t.status = 'waiting'
RETURNING t.session_id, t.turn_id, t.queue;

-- ---------------------------------------------------------------------------------------
-- parked turns: sleeps, events, child agents (journal/wait_store.py). A parked turn is
-- `waiting`, with no claim, no lease and no message; `waits` says why and until when.
-- ---------------------------------------------------------------------------------------

-- name: park_turn
-- The claim's holder parks the turn at a wait step (durable_agent_park): unless what it
-- waits for is there already or its due time has passed; fenced by the epoch; a cancelled
-- turn does not park. Waits for the WAL flush, which takes every earlier write of the turn
-- with it.
SELECT durable_agent_park(:turn_id, :epoch, :step, :kind, :name,
                          CAST(:wake_at AS timestamptz)) AS parked;

-- name: wake_due
-- The sweeper wakes parked turns whose due time passed, and (should a waker have died
-- between its write and the wake) those whose event or child is there: queued, no message.
WITH due AS (
    SELECT w.turn_id FROM waits AS w
    WHERE (w.wake_at <= durable_agent_now()
           OR (w.kind IN ('event', 'child') AND durable_agent_wait_met(w.turn_id, w.kind, w.name)))
    ORDER BY w.wake_at NULLS LAST
    LIMIT :batch
    FOR UPDATE SKIP LOCKED
),
gone AS (
    DELETE FROM waits AS w USING due WHERE w.turn_id = due.turn_id RETURNING w.turn_id
)
UPDATE turns AS t
SET status = 'queued', enqueued_at = NULL, message_id = NULL, updated_at = durable_agent_now()
FROM gone
WHERE t.turn_id = gone.turn_id AND t.status = 'waiting'
RETURNING t.turn_id;

-- name: next_wake
-- When the earliest due time of a parked turn comes (NULL: none): the sweeper's next pass.
SELECT min(wake_at) FROM waits WHERE wake_at IS NOT NULL;

-- name: claim_send
-- A woken turn not sent yet: this process sends it (the first to ask wins; the sweeper
-- sends it otherwise). Returns it when this caller is to publish.
UPDATE turns
SET enqueued_at = durable_agent_now(), message_id = :message_id
WHERE turn_id = :turn_id AND status = 'queued' AND enqueued_at IS NULL
RETURNING session_id, turn_id, queue;

-- name: announce_wake
-- A turn woken in an application's transaction (a decision taken there, see journal/lent.py):
-- `wake <turn_id>` is delivered to the wakers when that transaction commits, and dropped
-- with it (or with its savepoint) when it rolls back.
SELECT pg_notify('durable_agent_wake', CAST(:turn_id AS text));

-- name: record_event
-- An event for a turn (durable_agent_send_event): kept for an open turn, the turn woken if
-- it waits for that name. No row: no such turn.
SELECT turn_status AS status, recorded, recorded_name, woke
FROM durable_agent_send_event(:turn_id, :event_id, :name, CAST(:payload AS jsonb));

-- name: wake
-- Wake the turn if it is parked for (kind, name) (see durable_agent_wake).
SELECT durable_agent_wake(:turn_id, :kind, :name) AS woke;

-- name: consume_event
-- The event a wait at :step consumed: the one it took before (a redelivered turn), or the
-- oldest unconsumed one of that name, taken now, once. Fenced by the claim's epoch.
WITH fence AS (
    SELECT turn_id FROM turns
    WHERE turn_id = :turn_id AND lease_epoch = :epoch AND status = 'running'
    FOR SHARE
),
mine AS (
    SELECT e.turn_id, e.event_id, e.name, e.payload, e.sent_at FROM events AS e
    WHERE e.turn_id = :turn_id AND e.consumed_step = :step
),
oldest AS (
    SELECT e.event_id FROM events AS e, fence
    WHERE e.turn_id = fence.turn_id AND e.name = :name AND e.consumed_step IS NULL
      AND NOT EXISTS (SELECT 1 FROM mine)
    ORDER BY e.sent_at, e.event_id
    LIMIT 1
    FOR UPDATE OF e
),
taken AS (
    UPDATE events AS e SET consumed_step = :step, consumed_at = durable_agent_now()
    FROM oldest
    WHERE e.turn_id = :turn_id AND e.event_id = oldest.event_id
    RETURNING e.turn_id, e.event_id, e.name, e.payload, e.sent_at
)
SELECT turn_id, event_id, name, payload, sent_at FROM mine
UNION ALL
SELECT turn_id, event_id, name, payload, sent_at FROM taken;

-- name: list_events
-- The events sent to a turn, oldest first, with the step that consumed each (NULL: none
-- yet) and the turn's status (an unconsumed event of an ended turn was never read).
SELECT e.turn_id, e.event_id, e.name, e.payload, e.sent_at, e.consumed_step, e.consumed_at,
       t.status AS turn_status
FROM events AS e JOIN turns AS t ON t.turn_id = e.turn_id
WHERE e.turn_id = :turn_id
ORDER BY e.sent_at, e.event_id
LIMIT :limit;

-- name: list_waits
-- What the chosen parked turns wait for, and until when.
SELECT turn_id, step, kind, name, wake_at, parked_at FROM waits
WHERE turn_id = ANY(CAST(:turn_ids AS text[]));

-- name: turn_depth
-- How deep a turn is among child agents (0: started by an application).
SELECT coalesce((SELECT depth FROM child_turns WHERE turn_id = :turn_id), 0);

-- name: create_child
-- The child turn a wait step starts, under the id derived from the parent's (turn, step):
-- created once (a redelivered parent finds it), linked to the parent, fenced by the
-- parent's claim. Returns whether the parent's claim held, and the child's status.
WITH fence AS (
    SELECT turn_id FROM turns
    WHERE turn_id = :parent_turn_id AND lease_epoch = :epoch AND status = 'running'
      AND NOT EXISTS (SELECT 1 FROM cancellations AS c WHERE c.turn_id = :parent_turn_id)
    FOR SHARE
),
created AS (
    INSERT INTO turns (turn_id, session_id, seq, message, queue, agent, created_at, updated_at)
    SELECT :turn_id, :turn_id, 0, :message, :queue, :agent, durable_agent_now(),
           durable_agent_now()
    FROM fence
    ON CONFLICT DO NOTHING
    RETURNING turn_id
),
linked AS (
    INSERT INTO child_turns (turn_id, parent_turn_id, parent_step, depth)
    SELECT turn_id, :parent_turn_id, :parent_step, :depth FROM created
    RETURNING turn_id
)
SELECT EXISTS (SELECT 1 FROM fence) AS held, EXISTS (SELECT 1 FROM linked) AS created;

-- name: open_children
-- The open child turns of a turn (a cancel of the parent cancels them too).
SELECT c.turn_id FROM child_turns AS c JOIN turns AS t ON t.turn_id = c.turn_id
WHERE c.parent_turn_id = :turn_id AND t.status IN ('queued', 'running', 'waiting')
ORDER BY c.parent_step;

-- name: children_of
-- The child turns of the chosen turns, with the step that started each and their depth.
SELECT c.turn_id, c.parent_turn_id, c.parent_step, c.depth, t.agent, t.status
FROM child_turns AS c JOIN turns AS t ON t.turn_id = c.turn_id
WHERE c.parent_turn_id = ANY(CAST(:turn_ids AS text[]))
ORDER BY c.parent_turn_id, c.parent_step;

-- name: parent_of
-- The parent of a child turn (no row: none).
SELECT parent_turn_id, parent_step, depth FROM child_turns WHERE turn_id = :turn_id;

-- ---------------------------------------------------------------------------------------
-- the spend ledger
-- ---------------------------------------------------------------------------------------

-- name: spend
-- The finished model calls of the chosen turns (:turn_ids, NULL: all; created since :since,
-- NULL: ever), summed per :by ('turn', 'agent', 'day', the UTC day of the call, or
-- 'day_agent', the day and the agent: 'YYYY-MM-DD agent') and
-- model, newest first. For each call: its tokens (the recorded `usage`); how many times it ran before,
-- interrupted (the claims from the one that wrote its intent up to the one that finished
-- it, less the runs that failed at the API); how many later claims read it back instead of
-- calling the model (the turn's last epoch less the one that finished it).
WITH picked AS (
    SELECT turn_id, agent, lease_epoch, created_at FROM turns
    WHERE (CAST(:turn_ids AS text[]) IS NULL OR turn_id = ANY(CAST(:turn_ids AS text[])))
      AND (CAST(:since AS timestamptz) IS NULL OR created_at >= CAST(:since AS timestamptz))
),
calls AS (
    SELECT p.turn_id, p.agent, p.created_at AS turn_created_at, j.created_at,
           coalesce(j.input ->> 'model', '') AS model,
           u.usage IS NOT NULL AND jsonb_typeof(u.usage) = 'object' AS has_usage,
           CASE WHEN jsonb_typeof(u.usage -> 'prompt_tokens') = 'number'
                THEN (u.usage ->> 'prompt_tokens')::numeric::bigint ELSE 0 END AS prompt,
           CASE WHEN jsonb_typeof(u.usage -> 'completion_tokens') = 'number'
                THEN (u.usage ->> 'completion_tokens')::numeric::bigint ELSE 0 END AS completion,
           greatest(0, j.epoch - coalesce(j.first_epoch, j.epoch) - j.failed_calls)
               AS interrupted,
           j.failed_calls,
           greatest(0, p.lease_epoch - j.epoch) AS read_back
    FROM picked AS p
    JOIN journal AS j ON j.turn_id = p.turn_id AND j.kind = 'model' AND j.status = 'done'
    LEFT JOIN blobs AS b ON b.sha256 = j.output_blob
    CROSS JOIN LATERAL (SELECT coalesce(j.output, b.data) -> 'usage' AS usage) AS u
)
SELECT CASE :by WHEN 'turn' THEN turn_id
                WHEN 'agent' THEN agent
                WHEN 'day' THEN to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD')
                WHEN 'day_agent'
                    THEN to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD') || ' ' || agent
                END AS key,
       model,
       count(*) AS calls,
       count(*) FILTER (WHERE NOT has_usage) AS calls_without_usage,
       sum(prompt) AS prompt_tokens,
       sum(completion) AS completion_tokens,
       sum(interrupted) AS interrupted_calls,
       sum(interrupted * prompt) AS interrupted_prompt_tokens,
       sum(interrupted * completion) AS interrupted_completion_tokens,
       sum(failed_calls) AS failed_calls,
       sum(read_back) AS read_back_calls,
       sum(read_back * prompt) AS read_back_prompt_tokens,
       sum(read_back * completion) AS read_back_completion_tokens,
       max(turn_created_at) AS newest
FROM calls
GROUP BY 1, 2
ORDER BY max(turn_created_at) DESC, 1 DESC, 2;

-- ---------------------------------------------------------------------------------------
-- the console: turns filtered and paged, workers and agents as the turns table shows them
-- ---------------------------------------------------------------------------------------

-- name: find_turns
-- Turns newest first, each filter NULL when not asked for; a page goes on from the last
-- turn of the one before (:before_at, :before_id), so page 1,000 costs what page 1 does
-- (turns_newest_idx, turns_status_newest_idx).
SELECT turn_id, session_id, seq, status, message, reply, error, attempts, crashes,
       lease_owner, lease_epoch, lease_expires_at, not_before, enqueued_at,
       created_at, updated_at, finished_at, queue, message_id, received_message_id,
       received_at, received_by, agent, agent_digest, agent_spec, agent_changes
FROM turns
WHERE (CAST(:status AS text) IS NULL OR status = CAST(:status AS text))
  AND (CAST(:agent AS text) IS NULL OR agent = CAST(:agent AS text))
  AND (CAST(:session_id AS text) IS NULL OR session_id = CAST(:session_id AS text))
  AND (CAST(:queue AS text) IS NULL OR queue = CAST(:queue AS text))
  AND (CAST(:since AS timestamptz) IS NULL OR created_at >= CAST(:since AS timestamptz))
  AND (CAST(:until AS timestamptz) IS NULL OR created_at < CAST(:until AS timestamptz))
  AND (CAST(:before_at AS timestamptz) IS NULL
       OR (created_at, turn_id) < (CAST(:before_at AS timestamptz), CAST(:before_id AS text)))
ORDER BY created_at DESC, turn_id DESC
LIMIT :limit;

-- name: workers
-- The worker processes Postgres knows of (host:pid#token, the thread cut off): the claims
-- they hold (live, and expired ones nobody took over yet, a sign the holder died), when
-- their lease was last renewed to, and the messages they received within :window seconds.
WITH claims AS (
    SELECT regexp_replace(lease_owner, ':[^:#]*(#.*)?$', '\1') AS worker,
           count(*) FILTER (WHERE lease_expires_at > durable_agent_now()) AS claims_held,
           count(*) FILTER (WHERE lease_expires_at <= durable_agent_now()) AS claims_expired,
           max(lease_expires_at) AS lease_until
    FROM turns
    WHERE status IN ('queued', 'running') AND lease_owner IS NOT NULL
    GROUP BY 1
),
receipts AS (
    SELECT regexp_replace(received_by, ':[^:#]*(#.*)?$', '\1') AS worker,
           count(*) AS received, max(received_at) AS last_received
    FROM turns
    WHERE received_by IS NOT NULL
      AND received_at >= durable_agent_now() - make_interval(secs => :window)
    GROUP BY 1
)
SELECT coalesce(c.worker, r.worker) AS worker,
       coalesce(c.claims_held, 0) AS claims_held,
       coalesce(c.claims_expired, 0) AS claims_expired,
       c.lease_until, coalesce(r.received, 0) AS received, r.last_received,
       durable_agent_now() AS now
FROM claims AS c FULL JOIN receipts AS r ON r.worker = c.worker
ORDER BY coalesce(c.claims_held, 0) DESC, greatest(c.lease_until, r.last_received) DESC NULLS LAST;

-- name: agents_seen
-- Each agent and digest the turns were run with (NULL: not run yet), with how many turns
-- and the newest; latest first within an agent.
SELECT agent, agent_digest, count(*) AS turns, max(created_at) AS newest,
       count(*) FILTER (WHERE agent_changes IS NOT NULL) AS resumed_changed
FROM turns
GROUP BY agent, agent_digest
ORDER BY agent, max(created_at) DESC;

-- ---------------------------------------------------------------------------------------
-- live turns: finished steps and ended turns are announced on the channel durable_agent
-- ---------------------------------------------------------------------------------------

-- name: listen_turns
-- On a connection of its own, kept open: be told of every announcement.
LISTEN durable_agent;

-- name: listen_wakes
-- On a connection of its own, kept open: be told of every parked turn that woke
-- (`durable_agent_wake`, payload: the turn id), to send it at once.
LISTEN durable_agent_wake;

-- name: announce
-- Announce a durable write after it committed (`step <n> <turn_id>`, `turn <status>
-- <turn_id>`, one or more, in order), in a transaction of its own that does not wait for the
-- WAL flush: a NOTIFY inside the durable write would hold the cluster-wide notify lock
-- through its flush.
WITH quick AS (SELECT set_config('synchronous_commit', 'off', true))
SELECT pg_notify('durable_agent', p.payload)
FROM quick, unnest(CAST(:payloads AS text[])) WITH ORDINALITY AS p (payload, n)
ORDER BY p.n;

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

-- ---------------------------------------------------------------------------------------
-- the fleet's figures, for `durable-agent metrics` (Prometheus reads them at each scrape)
-- ---------------------------------------------------------------------------------------

-- name: trace_context
-- The trace context a traced start_turn stored with the turn (a delivery without one in its
-- message joins the trace through it).
SELECT trace_context FROM turns WHERE turn_id = :turn_id;

-- name: metric_turns
-- Turns by agent and status, and the claims taken over from a holder that died or whose
-- lease ran out (each such claim counts one crash of its turn).
SELECT agent, status, count(*) AS turns, coalesce(sum(crashes), 0) AS takeovers
FROM turns GROUP BY agent, status;

-- name: metric_steps
-- Recorded steps by kind, tool name and replay label, with how long the finished ones took
-- (intent to outcome), counted into the histogram's buckets: `bucket` i holds the steps of
-- bounds[i] <= seconds < bounds[i + 1] (width_bucket), 0 those under the first bound.
SELECT kind, name, coalesce(replay, '') AS replay,
       width_bucket(extract(epoch FROM finished_at - created_at), CAST(:bounds AS float8[]))
           AS bucket,
       count(*) AS steps,
       coalesce(sum(extract(epoch FROM finished_at - created_at)), 0) AS seconds
FROM journal WHERE status = 'done' AND finished_at IS NOT NULL
GROUP BY kind, name, replay, bucket;

-- name: metric_turn_latency
-- Finished turns by agent and status, from recorded to ended, in the histogram's buckets.
SELECT agent, status,
       width_bucket(extract(epoch FROM finished_at - created_at), CAST(:bounds AS float8[]))
           AS bucket,
       count(*) AS turns,
       coalesce(sum(extract(epoch FROM finished_at - created_at)), 0) AS seconds
FROM turns WHERE finished_at IS NOT NULL
GROUP BY agent, status, bucket;

-- name: metric_open_work
-- Uncertain effects no operator has resolved yet (as `durable-agent uncertain` lists them),
-- and tool calls waiting for a person's decision, by agent.
SELECT t.agent, 'uncertain' AS what, count(*) AS open
FROM journal AS j JOIN turns AS t ON t.turn_id = j.turn_id
WHERE j.replay = 'never'
  AND (j.output @> '{"uncertain": true}'
       OR (j.status = 'intent' AND t.status IN ('done', 'failed', 'cancelled')))
  AND NOT EXISTS (SELECT 1 FROM resolutions AS r WHERE r.turn_id = j.turn_id AND r.step = j.step)
GROUP BY t.agent
UNION ALL
SELECT t.agent, 'approval' AS what, count(*) AS open
FROM approvals AS a JOIN turns AS t ON t.turn_id = a.turn_id
WHERE a.decision IS NULL AND t.status = 'waiting'
GROUP BY t.agent;

-- name: metric_queues
-- The queues turns are sent to (their dead-letter queues are measured on the broker).
SELECT DISTINCT queue FROM turns WHERE queue <> '';

-- ---------------------------------------------------------------------------------------
-- the audit trail (appended, never changed) and rekey
-- ---------------------------------------------------------------------------------------

-- name: record_audit
-- One operator action (or a turn resumed under a changed agent), appended. No RETURNING:
-- a worker may append to the trail, not read it.
INSERT INTO audit_log (at, actor, action, interface, turn_id, step, before, after)
VALUES (durable_agent_now(), :actor, :action, :interface, :turn_id, :step,
        CAST(:before AS jsonb), CAST(:after AS jsonb));

-- name: audit_entries
-- The trail newest first, each filter NULL when not asked for.
SELECT audit_id, at, actor, action, interface, turn_id, step, before, after
FROM audit_log
WHERE (CAST(:turn_id AS text) IS NULL OR turn_id = CAST(:turn_id AS text))
  AND (CAST(:action AS text) IS NULL OR action = CAST(:action AS text))
  AND (CAST(:since AS timestamptz) IS NULL OR at >= CAST(:since AS timestamptz))
ORDER BY audit_id DESC
LIMIT :limit;

-- name: rekey_turns_page
-- Turns after :after in id order, their message and reply as stored (aliased: not opened).
SELECT turn_id, message AS stored_message, reply AS stored_reply FROM turns
WHERE turn_id > :after ORDER BY turn_id LIMIT :batch;

-- name: rekey_turns
-- Values sealed again, each replaced only while it is still the one read: a reply recorded
-- meanwhile (sealed with the newest key already) is left alone.
UPDATE turns AS t
SET message = CASE WHEN t.message = n.old_message THEN n.new_message ELSE t.message END,
    reply = CASE WHEN t.reply IS NOT DISTINCT FROM n.old_reply THEN n.new_reply
                 ELSE t.reply END
FROM unnest(CAST(:turn_ids AS text[]), CAST(:old_messages AS text[]),
            CAST(:new_messages AS text[]), CAST(:old_replies AS text[]),
            CAST(:new_replies AS text[]))
     AS n (turn_id, old_message, new_message, old_reply, new_reply)
WHERE t.turn_id = n.turn_id
RETURNING t.turn_id;

-- name: rekey_journal_page
-- Journal rows after (:after_turn, :after_step), their input and output as stored.
SELECT turn_id, step, input AS stored_input, output AS stored_output FROM journal
WHERE (turn_id, step) > (:after_turn, :after_step)
ORDER BY turn_id, step LIMIT :batch;

-- name: rekey_journal
-- As rekey_turns: an outcome written meanwhile (the intent read had none) is left alone.
-- The status is not touched: the trigger announces nothing.
UPDATE journal AS j
SET input = CASE WHEN j.input = CAST(n.old_input AS jsonb)
                 THEN CAST(n.new_input AS jsonb) ELSE j.input END,
    output = CASE WHEN j.output IS NOT DISTINCT FROM CAST(n.old_output AS jsonb)
                  THEN CAST(n.new_output AS jsonb) ELSE j.output END
FROM unnest(CAST(:turn_ids AS text[]), CAST(:steps AS integer[]),
            CAST(:old_inputs AS text[]), CAST(:new_inputs AS text[]),
            CAST(:old_outputs AS text[]), CAST(:new_outputs AS text[]))
     AS n (turn_id, step, old_input, new_input, old_output, new_output)
WHERE j.turn_id = n.turn_id AND j.step = n.step
RETURNING j.step;

-- name: rekey_approvals_page
SELECT turn_id, step, arguments AS stored_arguments FROM approvals
WHERE (turn_id, step) > (:after_turn, :after_step)
ORDER BY turn_id, step LIMIT :batch;

-- name: rekey_approvals
UPDATE approvals AS a SET arguments = CAST(n.new_arguments AS jsonb)
FROM unnest(CAST(:turn_ids AS text[]), CAST(:steps AS integer[]),
            CAST(:old_arguments AS text[]), CAST(:new_arguments AS text[]))
     AS n (turn_id, step, old_arguments, new_arguments)
WHERE a.turn_id = n.turn_id AND a.step = n.step AND a.arguments = CAST(n.old_arguments AS jsonb)
RETURNING a.step;

-- name: rekey_blobs_page
SELECT sha256, data AS stored_data FROM blobs
WHERE sha256 > :after ORDER BY sha256 LIMIT :batch;

-- name: rekey_blobs
UPDATE blobs AS b SET data = CAST(n.new_data AS jsonb)
FROM unnest(CAST(:ids AS text[]), CAST(:old_data AS text[]), CAST(:new_data AS text[]))
     AS n (sha256, old_data, new_data)
WHERE b.sha256 = n.sha256 AND b.data = CAST(n.old_data AS jsonb)
RETURNING b.sha256;
