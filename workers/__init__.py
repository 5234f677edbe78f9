"""What a fleet of durable-agent workers runs: example tools, loops and hooks (see README.md).

The library is ``durable_agent``; this folder is the deployable side, installed as
``durable_agent_examples`` (never as ``workers``): point a worker at it with
``DURABLE_AGENT_TOOLS=durable_agent_examples.email_tools`` (or ``...payments_tools``),
``DURABLE_AGENT_AGENTS=durable_agent_examples.plan_act``; your own tools live in a module of
yours named the same way.
"""
