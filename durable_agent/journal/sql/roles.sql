-- The three roles of a durable-agent database and what each may do (`durable-agent roles`,
-- or `durable-agent roles --print` for a team that manages roles itself). {application},
-- {worker}, {operator} and {schema} are filled in with the names chosen (a prefix, by
-- default durable_agent_); each is created only if missing, so running it again, or for a
-- second database of the same cluster, is safe. Grants are of this database only, and
-- every grant of these roles on our tables is revoked first: the result is exactly this.
-- They are group roles (NOLOGIN); give a login role membership, or a password (LOGIN).
DO $roles$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{application}') THEN
        CREATE ROLE "{application}" NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{worker}') THEN
        CREATE ROLE "{worker}" NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{operator}') THEN
        CREATE ROLE "{operator}" NOLOGIN;
    END IF;
END
$roles$;

REVOKE ALL ON turns, journal, blobs, cancellations, approvals, resolutions, uncertain_notices,
              audit_log, schema_version, waits, events, child_turns
    FROM "{application}", "{worker}", "{operator}";
GRANT USAGE ON SCHEMA "{schema}" TO "{application}", "{worker}", "{operator}";
GRANT CONNECT ON DATABASE "{database}" TO "{application}", "{worker}", "{operator}";

-- the application: record turns and send them (enqueued_at, message_id), read turns,
-- replies, steps and streams, list approvals, what parked turns wait for and their events.
-- It cannot write the journal, claim a turn (status, lease), decide or change a decision,
-- cancel, prune, or touch the audit trail. It sends events through durable_agent_send_event
-- (SECURITY DEFINER: the event kept, the turn it satisfies woken, nothing else).
GRANT SELECT ON turns, journal, blobs, cancellations, approvals, resolutions, schema_version,
                waits, events, child_turns
    TO "{application}";
GRANT INSERT ON turns TO "{application}";
GRANT UPDATE (enqueued_at, message_id) ON turns TO "{application}";

-- the workers: claim, journal, park for approval, sweep, tell the uncertain-effects hooks,
-- and append to the audit trail (a turn resumed under a changed agent). They cannot
-- decide an approval, record a cancel or a verdict, delete anything, or change the trail.
GRANT SELECT ON turns, journal, blobs, cancellations, approvals, resolutions,
                uncertain_notices, schema_version, waits, events, child_turns
    TO "{worker}";
GRANT INSERT, UPDATE ON turns, journal, blobs, uncertain_notices TO "{worker}";
GRANT INSERT ON approvals, audit_log, child_turns TO "{worker}";
-- parks and wakes (waits), events consumed, child turns started
GRANT INSERT, UPDATE, DELETE ON waits TO "{worker}";
GRANT UPDATE (consumed_step, consumed_at) ON events TO "{worker}";

-- operators: everything the workers may, and decide approvals, cancel, resolve, prune,
-- rekey; read and append to the audit trail. Nobody updates or deletes an audit entry.
GRANT SELECT ON turns, journal, blobs, cancellations, approvals, resolutions,
                uncertain_notices, audit_log, schema_version, waits, events, child_turns
    TO "{operator}";
GRANT INSERT, UPDATE, DELETE ON turns, journal, blobs, cancellations, approvals, resolutions,
                                uncertain_notices, waits, events, child_turns
    TO "{operator}";
GRANT INSERT ON audit_log TO "{operator}";
