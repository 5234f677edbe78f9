-- durable-agent schema, version 15: the W3C trace context of the request that started a
-- turn (tracing on), so that a message the sweeper sends again carries it too and every
-- delivery of the turn, on whichever worker, joins the application's trace.
ALTER TABLE turns ADD COLUMN trace_context text;
COMMENT ON COLUMN turns.trace_context IS 'the traceparent (and tracestate) of the request that started the turn, as W3C headers in JSON (NULL: not traced)';
