"""Agents and tools written for other frameworks, run as durable-agent agents.

Each integration lives in a module of its own and imports its framework only when it is
imported itself (each framework is an optional extra): ``openai_agents`` (the OpenAI Agents
SDK), ``pydantic_ai`` (Pydantic AI). MCP servers' tools are ``durable_agent.mcp``. What they
share, the replay label of a tool that was not declared with ``@tool``, is ``labels``.
"""
