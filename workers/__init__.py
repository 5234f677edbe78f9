"""Example tool registries for durable-agent workers.

They install as ``durable_agent_examples`` (never as ``workers``): point a worker at them with
``DURABLE_AGENT_TOOLS=durable_agent_examples.email_tools`` (or ``...payments_tools``); your
own tools live in a module of yours named the same way.
"""
