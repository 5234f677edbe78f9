-- The evals' own SQL, beside them: never sent by the library. Read with
-- durable_agent.journal.parse_queries, as sql/queries.sql is.

-- name: insert_step_unfenced
-- The two-workers eval only: a stale worker's intent without the epoch fence, to show that
-- the primary key (turn_id, step) rejects it too.
INSERT INTO journal (turn_id, step, kind, name, input, replay, status, epoch)
VALUES (:turn_id, :step, 'model', 'llm', '{}', 'safe', 'intent', :epoch);
