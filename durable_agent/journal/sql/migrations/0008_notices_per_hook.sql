-- durable-agent schema, version 8: each uncertain-effects hook is told of an effect on its
-- own (one that fails no longer makes the other tell it again), and a pass claims a notice
-- for a while (claimed_by, claimed_until) instead of holding a lock and a transaction open
-- across the hook's call. Notices recorded before hold hook 'all': told to every hook.
ALTER TABLE uncertain_notices ADD COLUMN hook text NOT NULL DEFAULT 'all';
ALTER TABLE uncertain_notices ADD COLUMN told_at timestamptz;
ALTER TABLE uncertain_notices ADD COLUMN claimed_by text;
ALTER TABLE uncertain_notices ADD COLUMN claimed_until timestamptz;
UPDATE uncertain_notices SET told_at = notified_at;
ALTER TABLE uncertain_notices DROP CONSTRAINT uncertain_notices_pkey;
ALTER TABLE uncertain_notices ADD CONSTRAINT uncertain_notices_pkey
    PRIMARY KEY (turn_id, step, hook);
