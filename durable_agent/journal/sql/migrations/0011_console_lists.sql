-- durable-agent schema, version 11: the console's turn list, newest first, paged by
-- (created_at, turn_id); and the same for one status (a few waiting turns among 100,000
-- finished ones are found without reading the finished ones).
CREATE INDEX turns_newest_idx ON turns (created_at, turn_id);
CREATE INDEX turns_status_newest_idx ON turns (status, created_at, turn_id);
