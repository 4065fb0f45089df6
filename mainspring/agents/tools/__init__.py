"""Agent tools: the `Tool` interface, `@tool` for Python functions, MCP servers, and the built-in tools.

Built-ins (see `builtin_registry`): python, shell (sandboxed), search (attached documents), sql (attached database,
read-only), files (the run's workspace), http_fetch (off by default).
"""

from mainspring.agents.tools.base import (
    Artifact,
    Tool,
    ToolContext,
    ToolError,
    ToolResult,
    TransientToolError,
    openai_schema,
)
from mainspring.agents.tools.decorator import FunctionTool, function_tool, tool
from mainspring.agents.tools.mcp_tools import McpStdioServer, McpTool, close_mcp_tools, mcp_stdio_tools
from mainspring.agents.tools.registry import ToolRegistry, UnknownToolError, builtin_registry

__all__ = [
    "Artifact", "FunctionTool", "McpStdioServer", "McpTool", "Tool", "ToolContext", "ToolError", "ToolRegistry",
    "ToolResult", "TransientToolError", "UnknownToolError", "builtin_registry", "close_mcp_tools", "function_tool",
    "mcp_stdio_tools", "openai_schema", "tool",
]
