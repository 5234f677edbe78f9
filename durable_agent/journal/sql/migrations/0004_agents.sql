-- durable-agent schema, version 4: each turn belongs to an agent, and records the digest of
-- the agent it first ran with; a turn resumed under a changed agent says what changed.
ALTER TABLE turns
    ADD COLUMN agent         text NOT NULL DEFAULT 'default',
    ADD COLUMN agent_digest  text,
    ADD COLUMN agent_spec    jsonb,
    ADD COLUMN agent_changes text;

COMMENT ON COLUMN turns.agent IS 'the agent the turn belongs to (''default'': the one configured by the environment)';
COMMENT ON COLUMN turns.agent_digest IS 'sha256 of the agent''s spec when the turn first ran (model, instructions, parameters, step cap, loop, tools)';
COMMENT ON COLUMN turns.agent_spec IS 'that spec, to say what changed when the turn resumes under another one';
COMMENT ON COLUMN turns.agent_changes IS 'what differed from agent_spec the last time the turn was resumed (NULL: nothing)';
