"""The tools of MCP servers as durable-agent tools: ``tools_from_server``.

Needs the optional extra ``mcp`` (``pip install 'durable-agent[mcp]'``); nothing imports
this package unless a tools or agents module does, and the ``mcp`` SDK itself is imported
only when a server is listed or called.

Modules: ``servers`` (where a server is: command or URL), ``sessions`` (one session per
server per process, on a loop of its own; fork-safe), ``results`` (an MCP result as the
text the model reads; the listed JSON Schema as the arguments' check), ``server_tools``
(``tools_from_server``: listing, labels, names). See docs/how-to/mcp.md.
"""

from .server_tools import McpToolCall, McpToolError, tools_from_server
from .sessions import McpCallError, close_sessions

__all__ = ["McpCallError", "McpToolCall", "McpToolError", "close_sessions", "tools_from_server"]
