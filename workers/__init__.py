"""Example tool registries for durable-agent workers.

Point a worker at them with ``DURABLE_AGENT_TOOLS=workers.email_tools`` (or
``workers.payments_tools``); your own tools live in a module of yours named the same way.
"""
