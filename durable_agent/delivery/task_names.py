"""The names of durable-agent's Celery tasks: what a message names, what a worker registers."""

RUN_TURN = "durable_agent.run_turn"
AGENT_TURN = "durable_agent.agent_turn"
SWEEP = "durable_agent.sweep"
SEND_EVENT = "durable_agent.send_event"
